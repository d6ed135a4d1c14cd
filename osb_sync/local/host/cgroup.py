"""Control groups (v1) of a sandbox: one directory per controller, made before the sandbox starts.

The freezer pauses and resumes a sandbox; memory, cpu and pids enforce its limits (`limits.py`).
Each controller's groups live in `osb-sync/` under the server's own group of that controller
(`/proc/self/cgroup`), so a server confined by its parent stays confined with its sandboxes.
The server writes bwrap's pids into every controller's `cgroup.procs` (`join`) while bwrap
waits for its user namespace's id maps, before any code of the sandbox runs, so no process of
the sandbox is ever outside its group.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "osb-sync"
FREEZE_TIMEOUT = 5.0
STALE_AFTER = 60.0
KILL_TIMEOUT = 10.0
# Every controller a sandbox may have a group of (the freezer, and the limits' controllers).
CONTROLLERS = ("freezer", "memory", "cpu", "pids")


@functools.cache
def own_group(controller: str) -> str:
    """This process's group of a v1 `controller` ("/" when not listed), from /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path or "/"
    return "/"


def parent_dir(controller: str) -> Path:
    """Where the sandboxes' groups of `controller` go: `osb-sync/` in the server's own group."""
    return CGROUP_ROOT / controller / own_group(controller).lstrip("/") / PARENT


def usable(controller: str) -> bool:
    """True when this process may make groups under `controller` (v1, writable, e.g. root).

    Also removes the empty groups that servers killed without a chance to clean up left.
    """
    parent = parent_dir(controller)
    if not (parent.parent / "cgroup.procs").is_file():
        return False
    try:
        parent.mkdir(exist_ok=True)
        probe = parent / f"probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError:
        return False
    _sweep(parent)
    return True


def _sweep(parent: Path) -> None:
    # A live sandbox always has processes in its group (rmdir fails: EBUSY); a group younger
    # than STALE_AFTER may be one another server made and is about to join.
    for group in parent.iterdir():
        try:
            if group.is_dir() and time.time() - group.stat().st_mtime > STALE_AFTER:
                group.rmdir()
        except OSError:
            pass


class Cgroup:
    """The groups of one sandbox, one per controller."""

    def __init__(self, name: str, controllers: tuple[str, ...]) -> None:
        self.dirs: dict[str, Path] = {}
        try:
            for controller in controllers:
                path = parent_dir(controller) / name
                path.mkdir()
                self.dirs[controller] = path
        except OSError:
            self.remove()
            raise

    def configure(self, settings: dict[str, dict[str, str]]) -> None:
        """Write each controller's files (`{"memory": {"memory.limit_in_bytes": "..."}}`).

        A memory limit also caps memory plus swap where swap is accounted, so that swapping
        does not lift it.
        """
        for controller, files in settings.items():
            for name, value in files.items():
                (self.dirs[controller] / name).write_text(value)
                swap = self.dirs[controller] / "memory.memsw.limit_in_bytes"
                if name == "memory.limit_in_bytes" and swap.is_file():
                    swap.write_text(value)

    def join(self, pid: int) -> None:
        """Move process `pid` (its threads; not its existing children) into every group."""
        for path in self.dirs.values():
            (path / "cgroup.procs").write_text(str(pid))

    def freeze(self, frozen: bool) -> None:
        """Freeze (or thaw) every process of the group; OSError if it does not settle."""
        state = self.dirs["freezer"] / "freezer.state"
        wanted = "FROZEN" if frozen else "THAWED"
        state.write_text(wanted)
        deadline = time.monotonic() + FREEZE_TIMEOUT
        while state.read_text().strip() != wanted:
            if time.monotonic() > deadline:
                raise OSError(f"the freezer did not reach {wanted}")
            time.sleep(0.01)

    def kill(self) -> int:
        """SIGKILL every process in the groups, whatever state it is in; how many were killed."""
        return kill_members(self.dirs.values())

    def remove(self) -> None:
        """Remove the groups once their processes are gone (waits a little for them)."""
        remove_groups(self.dirs.values())


def remove_groups(paths: Iterable[Path]) -> None:
    """Remove the groups `paths` once their processes are gone (waits a little for them)."""
    deadline = time.monotonic() + FREEZE_TIMEOUT
    for path in paths:
        while True:
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)


def members(path: Path) -> list[int]:
    """The pids in the group `path` (none once it is gone)."""
    try:
        return [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def kill_members(dirs: Iterable[Path], timeout: float = KILL_TIMEOUT) -> int:
    """SIGKILL every process in the groups `dirs` until they are empty; how many were killed.

    A freezer group among them is frozen first, so nothing forks while the others are being
    killed, then thawed (a frozen process cannot die). Whatever bwrap is doing (still setting
    up the namespaces, or waiting for a parent that died), its processes are in the groups:
    the launcher joined them before it started bwrap.
    """
    groups = [path for path in dirs if path.is_dir()]
    freezers = [path for path in groups if (path / "freezer.state").is_file()]
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        for path in freezers:
            _write_quietly(path / "freezer.state", "FROZEN")
        pids = {pid for path in groups for pid in members(path)}
        for pid in pids - killed:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        for path in freezers:
            _write_quietly(path / "freezer.state", "THAWED")
        if not pids or time.monotonic() > deadline:
            return len(killed)
        time.sleep(0.01)


def _write_quietly(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass


def leftover_groups(name: str) -> list[Path]:
    """The groups of the sandbox `name` that exist, in every controller (any age)."""
    return [
        parent_dir(controller) / name
        for controller in CONTROLLERS
        if (parent_dir(controller) / name).is_dir()
    ]
