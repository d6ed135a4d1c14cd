"""A local OpenSandbox-compatible development server, standard library only.

`LocalServer` speaks the lifecycle API of the OpenSandbox server and runs each sandbox's execd
(code contexts, commands, bash sessions, files, metrics) plus the server proxy to ports inside a
sandbox, all on one port::

    with LocalServer() as srv:
        print(srv.api_base)  # http://127.0.0.1:<port>/v1

Each sandbox is a bubblewrap container (`host/bwrap.py`, `host/container.py`) with our execd
inside it. Enforced there: private user, PID, mount, network, IPC and UTS namespaces; the user
namespace maps ids 0-65535 to one unprivileged host range shared by every sandbox
(`host/identity.py`: `/etc/subuid`'s range of the `osb-sync` user for a root server, made if
absent, else the server's own subordinate ids), never host root nor the server's user, so root
inside is nobody outside; Docker's default 14 capabilities, in that namespace only; a seccomp
filter (`host/seccomp.py`: a deny-list refusing io_uring, userfaultfd, perf_event_open, bpf,
keyrings, kexec, modules and new user namespaces, not Docker's allow-list); a read-only root
view of /usr, chosen /etc files (never shadow, ssh or private keys) and the server's Python;
/proc masked as Docker's default does (/proc/sys, sysrq-trigger, irq, bus, fs read-only; keys,
kcore, timer_list and the like hidden), no /sys; bwrap (PID 1 in the sandbox) and every process
start from a minimal environment, never the server's, and no command line or descriptor in the
sandbox names the server's directories; a private writable /tmp, /var, /srv, /mnt, /opt, /home,
home and execd state (host directories of the sandbox owned by the range, or tmpfs where the
server is not root); a per-file size limit (no total disk cap); deletion kills every process of
the sandbox (its PID namespace ends); pause freezes them all (freezer cgroup, else SIGSTOP); a
deny-all network policy leaves loopback only, no policy gives outbound access through
slirp4netns without host loopback (no network where it is missing); memory, CPU and
process-count limits by cgroups where the server can write them (`host/limits.py` says which).
Not enforced: per-host egress rules (refused with 400), the image (recorded, never pulled: code
runs on the host's /usr with the server's interpreter), and kernel holes (namespaces, not a
virtual machine). Where bubblewrap, user namespaces or an id range are missing the server fails
closed: every create answers 503 naming what to install or allow (`osb-sync run` exits with it),
unless started with `isolation=False` (`--no-isolation`): then sandboxes are plain processes of
the server's user, NOT isolated, and the start-up log line, every create's status message and
`osb-sync run` say so. The server binds 127.0.0.1 by default; the proxy and execd need the
per-sandbox token returned by the endpoint route, and lifecycle routes the API key when one is
set. Do not expose it to other users or networks.

Its folders follow the process boundary (each `__init__` lists its modules): `http/` (the HTTP
layer both sides use), `host/` (the server process) and `execd/` (what runs inside each
sandbox's container). `host/` and `execd/` never import each other: the security line, as a
test (`tests/unit/test_layers.py`).
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
