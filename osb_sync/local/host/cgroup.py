"""Control groups (v1) of a sandbox: one directory per controller, made before the sandbox starts.

The freezer pauses and resumes a sandbox; memory, cpu and pids enforce its limits (`limits.py`).
Each controller's groups live in `osb-sync/` under the server's own group of that controller
(`/proc/self/cgroup`), so a server confined by its parent stays confined with its sandboxes;
or, with `--cgroup-parent PATH` (`Place`), under PATH in each controller's hierarchy (from its
root where PATH starts with "/", else from the server's own group), as Docker's flag: the way
for a server that is not root, once an operator made PATH in the memory, pids, cpu and freezer
hierarchies and gave it to the server's user (`chown -R USER`). A group made there is the
user's too (the kernel gives a new group its creator's fsuid and fsgid).

A root server writes bwrap's pids into every controller's `cgroup.procs` (`join`) while bwrap
waits for its user namespace's id maps, before any code of the sandbox runs, so no process of
the sandbox is ever outside its group. A server that is not root may move only processes of its
own uid (v1's rule), and bwrap's child is already the sandbox's root when it waits: bwrap
starts through `JOIN_SCRIPT`, which writes its own pid into every group and then execs bwrap,
so bwrap and all it makes start inside. A sandbox never sees these files (its `/sys` has no
cgroup tree); where its root is the server's own uid it could write them if it did, which is
why `tests/local/test_limits_non_root.py` looks for them from inside.

cgroup v2 (one tree, a delegated subtree) is `cgroup2.py`.
"""

from __future__ import annotations

import functools
import os
import pwd
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "osb-sync"
FREEZE_TIMEOUT = 5.0
STALE_AFTER = 60.0
KILL_TIMEOUT = 10.0
# Every controller a sandbox may have a group of (the freezer, and the limits' controllers).
CONTROLLERS = ("freezer", "memory", "cpu", "pids")
# v1's memory.limit_in_bytes without a limit is the largest page multiple of an int64: read
# from this on as no limit (no machine has that much memory to limit)
UNLIMITED_MEMORY = 1 << 62


# Run as `sh -c JOIN_SCRIPT sh PROCS... -- ARGV...`: into every group, then exec ARGV.
JOIN_SCRIPT = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


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


@dataclass(frozen=True)
class Place:
    """Where a server makes its sandboxes' groups: `osb-sync/` in each controller's `parent`
    (`--cgroup-parent`), or in the server's own group (None); on a v2 host (`version` 2),
    `subtree`, made ready by `cgroup2.arrange` (None: unusable, `problem` says why)."""

    parent: str | None = None
    version: int = 1
    subtree: Path | None = None
    problem: str = ""

    def base(self, controller: str) -> Path:
        """The directory of `controller`'s hierarchy that holds `osb-sync/`."""
        own = own_group(controller).lstrip("/")
        if self.parent is None:
            return CGROUP_ROOT / controller / own
        if self.parent.startswith("/"):
            return CGROUP_ROOT / controller / self.parent.lstrip("/")
        return CGROUP_ROOT / controller / own / self.parent


OWN = Place()


def parent_dir(controller: str, place: Place = OWN) -> Path:
    """Where the sandboxes' groups of `controller` go: `osb-sync/` in `place` (v2: one for all)."""
    if place.version == 2:
        return place.subtree or Path("/nonexistent")
    return place.base(controller) / PARENT


def usable(controller: str, place: Place = OWN) -> bool:
    """True when this process may make groups under `controller` (v1, writable, e.g. root, or
    a user the operator gave `place`).

    Also removes the empty groups that servers killed without a chance to clean up left.
    """
    parent = parent_dir(controller, place)
    if place.version != 1 or not (parent.parent / "cgroup.procs").is_file():
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


def delegation_fix(user: str | None = None, version: int = 1) -> str:
    """The operator's line that gives this server's user (`user`) cgroups of its own (v1),
    and the option that uses them; on v2, the delegated group to start the server in."""
    if user is None:
        try:
            user = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:
            user = str(os.geteuid())
    name = f"osb-{user}"
    if version == 2:
        return (
            "start the server in a cgroup v2 group delegated to it: systemd-run --user --scope"
            " -p Delegate=yes osb-sync serve ..."
        )
    return (
        f"have root run `for c in {' '.join(CONTROLLERS[1:] + CONTROLLERS[:1])}; do mkdir -p"
        f" /sys/fs/cgroup/$c/{name} && chown -R {user} /sys/fs/cgroup/$c/{name}; done` and"
        f" start the server with --cgroup-parent /{name} (LocalServer(cgroup_parent='/{name}'))"
    )


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

    def __init__(self, name: str, controllers: tuple[str, ...], place: Place = OWN) -> None:
        self.dirs: dict[str, Path] = {}
        try:
            for controller in controllers:
                path = parent_dir(controller, place) / name
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

    def joining(self, argv: list[str]) -> list[str]:
        """`argv` run by a shell that first moves itself into every group (`JOIN_SCRIPT`)."""
        procs = [str(path / "cgroup.procs") for path in self.dirs.values()]
        return ["/bin/sh", "-c", JOIN_SCRIPT, "sh", *procs, "--", *argv]

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


def leftover_groups(name: str, place: Place = OWN) -> list[Path]:
    """The groups of the sandbox `name` that exist, in every controller (any age)."""
    found = {parent_dir(controller, place) / name for controller in CONTROLLERS}
    return sorted(path for path in found if path.is_dir())


def _number(path: Path) -> int | None:
    """The whole number in the file `path` (None: no such file, `max`, or garbage)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _memory_used(group: Path) -> int | None:
    """What a memory group uses as `docker stats` counts it: its usage less the inactive page
    cache (`memory.stat`'s `total_inactive_file`), which the kernel reclaims first."""
    used = _number(group / "memory.usage_in_bytes")  # v1
    if used is None:
        used = _number(group / "memory.current")  # v2
    if used is None:
        return None
    try:
        lines = (group / "memory.stat").read_text().splitlines()
    except OSError:
        return used
    stat = dict(line.split(" ", 1) for line in lines if " " in line)
    inactive = stat.get("total_inactive_file", stat.get("inactive_file", "0")).strip()
    return max(used - int(inactive), 0) if inactive.isdigit() else used


def _cpu_seconds(pids: Iterable[int]) -> float | None:
    """The CPU time of the processes `pids` and of their children they waited for (seconds)."""
    ticks, seen = 0, False
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            ticks += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
            seen = True
        except (OSError, ValueError, IndexError):
            continue  # gone since the listing
    return ticks / os.sysconf("SC_CLK_TCK") if seen else None


def usage(groups: Mapping[str, Path]) -> dict[str, int | float | None]:
    """A sandbox's usage and limits as its `groups` (by controller; v1's, or v2's one group
    under every name) say; None for what no group of it tells (and a limit that is the
    kernel's "unlimited").

    `cpuSeconds` is the CPU time of its live processes and of their children they waited
    for: v1's cpu controller counts no time (cpuacct does, which the sandboxes have no group
    of), and time of a process whose parent ended before it was waited for is not counted.
    """
    memory, cpu, pids = (groups.get(c) for c in ("memory", "cpu", "pids"))
    limit = quota = period = None
    if memory is not None:  # v1's file, else v2's (`max`: none)
        limit = _number(memory / "memory.limit_in_bytes") or _number(memory / "memory.max")
    if cpu is not None and (cpu / "cpu.max").is_file():  # v2: "QUOTA PERIOD", "max PERIOD"
        words = (cpu / "cpu.max").read_text().split()
        if len(words) == 2 and all(word.isdigit() for word in words):
            quota, period = int(words[0]), int(words[1])
    elif cpu is not None:
        quota = _number(cpu / "cpu.cfs_quota_us")
        period = _number(cpu / "cpu.cfs_period_us")
    listed = next((path for path in groups.values() if (path / "cgroup.procs").is_file()), None)
    return {
        "memoryUsedBytes": _memory_used(memory) if memory else None,
        "memoryLimitBytes": limit if limit is not None and limit < UNLIMITED_MEMORY else None,
        "cpuLimit": quota / period if quota and quota > 0 and period else None,
        "cpuSeconds": _cpu_seconds(members(listed)) if listed else None,
        "pids": _number(pids / "pids.current") if pids else None,
        "pidsLimit": _number(pids / "pids.max") if pids else None,
    }
