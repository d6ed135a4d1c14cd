"""What a sandbox runs as its entrypoint, by OpenSandbox's rule, and what it need not run.

The create's `entrypoint` replaces the image's Entrypoint and Cmd; a create without one (a
snapshot's restore may leave it out) runs the image's Entrypoint + Cmd (`ImageConfig.
effective_entrypoint`). As OpenSandbox's bootstrap does, execd starts first, then the
entrypoint (`execd/main.py`, told on the claim line: a warm spare starts it at its claim, so
spares and pools serve every entrypoint), and a one-string entrypoint with spaces is split as
a shell would (`shlex`). The sandbox's container ends with it (`liveness.py`).

Two entrypoints start no process, in any sandbox: the code-interpreter image's script (the
client's default, `/opt/code-interpreter/code-interpreter.sh`, and its older path), which
starts execd and Jupyter, the job our execd already does here; and the idle `tail -f /dev/null`
(the server's default), which only waits, as execd does. So the default create costs nothing
extra, and an image without that script still runs with the client's default (on the real
server it would fail: it needs the script in the image; and an image without `tail` would fail
there too). Any other entrypoint runs.
"""

from __future__ import annotations

import shlex
from typing import Any

from .rootview import RootView

IDLE = ("tail", "-f", "/dev/null")
# What our execd already does in their place (see the module docstring).
BUILT_IN = (
    IDLE,
    ("/opt/code-interpreter/code-interpreter.sh",),
    ("/opt/opensandbox/code-interpreter.sh",),
)


def command(body: dict[str, Any], view: RootView | None) -> list[str] | None:
    """The argv the sandbox's execd starts after itself, or None for no process.

    Args:
        body: the checked create request (its `entrypoint`, a non-empty list of strings, or
            none).
        view: the create's root view (an image's adds its Entrypoint and Cmd; None: the host's
            view).
    """
    given = [str(a) for a in body.get("entrypoint") or ()]
    if len(given) == 1 and " " in given[0]:
        given = shlex.split(given[0])
    if view is not None:
        given = view.entrypoint(given)
    return None if not given or tuple(given) in BUILT_IN else given
