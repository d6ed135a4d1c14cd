"""A local OpenSandbox-compatible development server, standard library only.

`LocalServer` speaks the lifecycle API of the OpenSandbox server and runs each sandbox's execd
(code contexts, commands, bash sessions, files, metrics) plus the server proxy to ports inside a
sandbox, all on one port::

    with LocalServer() as srv:
        print(srv.api_base)  # http://127.0.0.1:<port>/v1

Each sandbox is a bubblewrap container: private user, PID, mount, network, IPC and UTS
namespaces, its ids mapped to an unprivileged host range (root inside is nobody outside),
Docker's default capabilities in its own user namespace only, a seccomp filter, /proc masked,
no network beyond loopback unless its policy allows the internet (never this host's
addresses). A create's image is pulled and runs on a root of its own; the client's default
template gets the host's read-only view. Where bubblewrap, user namespaces or an id range are
missing the server fails closed (every create answers 503 naming what to install or allow),
unless started with `isolation=False`: then sandboxes are plain processes of the server's user,
NOT isolated, and every create's status says so. Every create's status message says what is
enforced for that sandbox; the local-server guide (:doc:`guides/local-server`) says what is
isolated and what is not, and its threat model. The server binds 127.0.0.1 by default: do not
expose it to other users or networks.

Its folders follow the process boundary; `host/` and `execd/` never import each other, the
security line, as a test (`tests/unit/test_layers.py`, which also keeps each folder's list of
its modules, here and in each `__init__`, to the files):

- `http/`: the HTTP layer both sides use.
- `host/`: the server process, the trusted side.
- `execd/`: what runs inside each sandbox's container, the untrusted side.
- `protocol`: the messages between the server and execd, which both sides import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .host.server import LocalServer

__all__ = ["LocalServer"]


def __getattr__(name: str) -> Any:
    # Loaded on first use, so the command line can read `host/options.py` (its serve flags)
    # without importing the whole server for every command.
    if name == "LocalServer":
        from .host.server import LocalServer

        return LocalServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
