"""What a local server can leave behind: temporary directories and sandbox processes."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path


def processes_under(root: Path, spares: bool = False) -> list[int]:
    """Pids of live processes whose working directory is inside `root` (sandbox processes).

    The server's warm spare containers (under `root/.spares`) count only with `spares`.
    """
    found = []
    prefix = str(root.resolve())
    skipped = () if spares else (os.path.join(prefix, ".spares") + os.sep,)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            with open(f"/proc/{entry}/stat") as stat:
                zombie = stat.read().rpartition(")")[2].split()[0] == "Z"
        except OSError:
            continue
        if cwd.startswith(skipped):
            continue
        if not zombie and (cwd == prefix or cwd.startswith(prefix + os.sep)):
            found.append(int(entry))
    return found


def local_dirs(root: Path) -> list[str]:
    """The `osb-local-*` directories a server made in `root` (its TMPDIR)."""
    return sorted(name for name in os.listdir(root) if name.startswith("osb-local-"))


def wait_until(predicate: object, timeout: float = 20.0) -> bool:
    """Poll `predicate()` until true or `timeout` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()) and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)
    return bool(result)


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
