"""Why a sandbox's container ended: its main process's exit, and its memory group's OOM count.

The registry asks on every look-up of a sandbox and from the server's reaper (a child's exit is
seen with `waitpid`, without blocking), so a sandbox whose container or execd died reads
`Failed`, with the reason, at once, and calls to it fail with that reason instead of waiting
for a relay that nobody serves.

The main process is execd, or the entrypoint's end ends it (`execd/main.py` exits with the
entrypoint's code): as the Docker runtime reports a container, one that exited 0 reads
`Terminated`, any other end `Failed`, and so does an execd the template forked that ended
after the template did (nobody told bwrap's placeholder its status: `execd_template.Forked.lost`).
A program that could not be run (126, 127) is named with the reason execd logged (the last
line of the container log, `osb-sync:` or the shell's).
"""

from __future__ import annotations

import signal
from pathlib import Path

from .container import SandboxContainer

REASON = "CONTAINER_EXITED_ERROR"  # the Docker runtime's reason for a container that exited
EXITED = "CONTAINER_EXITED"  # ours for one that exited 0 (the state is the runtime's)
ENDED = ("Failed", "Terminated")
NOT_RUN = {126: "cannot be run", 127: "not found"}


def oom_kills(group: Path | None) -> int:
    """How many processes the OOM killer ended in the memory group `group` (0 if unknown)."""
    if group is None:
        return 0
    try:
        for line in (group / "memory.oom_control").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def death(container: SandboxContainer) -> str | None:
    """What ended the container, as a sentence ("...exited with code 3."), or None if it runs."""
    code = container.exit_code()
    oom = (
        "Sandbox container was killed by the out-of-memory killer (SIGKILL): it reached its"
        " memory limit."
    )
    if code is None:
        if not container.execd_lost():
            return None
        if oom_kills(container.group("memory")):
            return oom
        return (
            "Sandbox container's execd exited after the execd template, which reports its"
            " exit, had ended: its exit status is unknown (see the server's log)."
        )
    if code > 128 and code - 128 in signal.valid_signals():
        name = signal.Signals(code - 128).name
        if code - 128 == signal.SIGKILL and oom_kills(container.group("memory")):
            return oom
        return f"Sandbox container was killed by {name} (exit code {code})."
    if code < 0:
        return f"Sandbox container was killed by {signal.Signals(-code).name}."
    if code in NOT_RUN:
        lines = container.log_tail(4096).strip().splitlines()
        said = f" ({lines[-1].strip()[:300]})" if lines else ""
        return (
            f"Sandbox container exited with code {code}: its entrypoint's program"
            f" {NOT_RUN[code]}{said}."
        )
    return f"Sandbox container exited with code {code}."


def ended_state(container: SandboxContainer) -> str:
    """`Terminated` for a container that exited 0, else `Failed`."""
    return "Terminated" if container.exit_code() == 0 else "Failed"
