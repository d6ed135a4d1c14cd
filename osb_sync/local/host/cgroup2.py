"""Control groups v2 of a sandbox: one group per sandbox in a subtree delegated to the server.

Written against the kernel's documented interface (Documentation/admin-guide/cgroup-v2.rst)
and tested on a fake cgroupfs tree (`tests/unit/test_cgroup2.py`): it has NOT run on a real
cgroup v2 host (the machines this project runs on are v1 hybrids, where `cgroup.py` is used).

Where: the delegated group `base` is `--cgroup-parent` (from the root of the one tree where it
starts with "/", else from the server's own group, `0::PATH` of /proc/self/cgroup), or the
server's own group (systemd delegates a user's `user@UID.service` subtree, and
`systemd-run --user --scope -p Delegate=yes osb-sync serve` starts a server in a delegated
group of its own). A group is the server's to use when its `cgroup.procs` and
`cgroup.subtree_control` are writable by it (delegation, "Delegation Containment": moving a
process needs write access to `cgroup.procs` of the common ancestor of both groups, which
`base` is).

The "no internal processes" rule: a non-root group that enables controllers for its children
holds no process itself. So the server moves itself (its one process; every thread follows)
into `base/osb-sync.server/` when `base` holds its own pid, and only then; any other process in
`base` leaves it unusable (named in `Delegation.problem`). Then `+memory +pids +cpu` (those
`base/cgroup.controllers` lists) go into `base/cgroup.subtree_control` and into
`osb-sync/cgroup.subtree_control`, one by one (a controller the kernel refuses is left out,
not the rest), and every sandbox gets `base/osb-sync/<id>/`.

A sandbox's group: `memory.max` (and `memory.swap.max` 0, so swapping does not lift it, as v1's
`memory.memsw.limit_in_bytes` does), `cpu.max` ("QUOTA PERIOD"), `pids.max`; pause through
`cgroup.freeze` ("1", settled once `cgroup.events` says `frozen 1`); delete through
`cgroup.kill` (Linux 5.14+; else each process is killed, frozen first); the OOM counter is the
`oom_kill` line of `memory.events`, the format execd reads from v1's `memory.oom_control`.
Processes join through `cgroup.JOIN_SCRIPT` as on v1 (bwrap starts inside).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .cgroup import (
    CGROUP_ROOT,
    FREEZE_TIMEOUT,
    JOIN_SCRIPT,
    KILL_TIMEOUT,
    PARENT,
    Cgroup,
    Place,
    members,
    usable,
)

SERVER_LEAF = f"{PARENT}.server"  # where the server moves itself (the rule above)
CONTROLLERS = ("memory", "pids", "cpu")
# v1 files of a plan (`limits.plan`) and what they are on v2
V1_FILES = ("memory.limit_in_bytes", "pids.max", "cpu.cfs_quota_us", "cpu.cfs_period_us")


def unified(root: Path = CGROUP_ROOT) -> bool:
    """Whether `root` is a cgroup v2 tree (a pure v2 host; a v1 hybrid has v1 there)."""
    return (root / "cgroup.controllers").is_file()


def own_group(text: str) -> str:
    """This process's v2 group from /proc/self/cgroup's `text` (its `0::PATH` line; "/")."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return "/"


def base(place: Place, own: str, root: Path = CGROUP_ROOT) -> Path:
    """The delegated group of `place` for a server in the v2 group `own`."""
    own = own.lstrip("/")
    if place.parent is None:
        return root / own
    if place.parent.startswith("/"):
        return root / place.parent.lstrip("/")
    return root / own / place.parent


@dataclass(frozen=True)
class Delegation:
    """What a server may use of its delegated group: the sandboxes' parent (`subtree`), the
    controllers enabled there, or why nothing (`problem`)."""

    subtree: Path | None
    controllers: frozenset[str] = frozenset()
    problem: str = ""


def _writable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.W_OK)


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def delegate(group: Path, pid: int, own: Path, root: Path = CGROUP_ROOT) -> Delegation:
    """Make `group` (delegated to this server, process `pid` in the group `own`) hold the
    sandboxes' groups.

    `group` must be `own` or one of its ancestors (v2 moves a process only within a group
    delegated to the mover: bwrap starts in `own`). Moves `pid` into `group/osb-sync.server/`
    where `group` holds it (and nothing else), then enables the limit controllers for `group`'s
    children and `osb-sync/`'s (see the module docstring). Only the hierarchy's real root is
    exempt from the rule, not the root a cgroup namespace shows (a server in a container): a
    `root` group holding others' processes too is tried as it is (the kernel refuses each
    controller there but on the real root). Never raises: a refusal is `Delegation.problem`.
    """
    fix = (
        "start the server in a delegated group of its own (systemd-run --user --scope -p"
        " Delegate=yes osb-sync serve ...), or pass --cgroup-parent a delegated group it runs in"
    )
    if own != group and group not in own.parents:
        return Delegation(None, problem=f"the server does not run inside the cgroup {group}; {fix}")
    if not all(_writable(group / name) for name in ("cgroup.procs", "cgroup.subtree_control")):
        return Delegation(None, problem=f"the cgroup {group} is not delegated to this user; {fix}")
    inside = {int(word) for word in _words(group / "cgroup.procs") if word.isdigit()}
    if inside - {pid} and group != root:
        return Delegation(
            None,
            problem=f"the cgroup {group} holds other processes ({len(inside - {pid})}), and v2"
            f" lets no group with children's controllers hold any; {fix}",
        )
    try:
        if pid in inside and not inside - {pid}:  # at a cgroup namespace's root too
            leaf = group / SERVER_LEAF
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(pid))
        subtree = group / PARENT
        subtree.mkdir(exist_ok=True)
    except OSError as exc:
        return Delegation(None, problem=f"the cgroup {group} refused ({exc.strerror}); {fix}")
    enabled = []
    for controller in CONTROLLERS:
        if controller not in _words(group / "cgroup.controllers"):
            continue
        try:
            for where in (group, subtree):
                (where / "cgroup.subtree_control").write_text(f"+{controller}")
        except OSError:
            continue
        enabled.append(controller)
    return Delegation(subtree, frozenset(enabled))


def _write(path: Path, value: str) -> bool:
    """Write `value` to the existing file `path`; whether it took."""
    if not path.is_file():
        return False
    try:
        path.write_text(value)
    except OSError:
        return False
    return True


def arrange(
    parent: str | None, root: Path = CGROUP_ROOT, own: str | None = None
) -> tuple[Place, frozenset[str], bool]:
    """Where this server's sandboxes' groups go (`--cgroup-parent` `parent`), which limit
    controllers they have, and whether they have a freezer: v2's delegated subtree on a v2
    host (made ready here: `delegate`; `own` is the server's v2 group, default from
    /proc/self/cgroup), else v1's hierarchies (`cgroup.usable`)."""
    if not unified(root):
        place = Place(parent)
        controllers = frozenset(c for c in CONTROLLERS if usable(c, place))
        return place, controllers, usable("freezer", place)
    if own is None:
        try:
            own = own_group(Path("/proc/self/cgroup").read_text())
        except OSError:
            own = "/"
    where = base(Place(parent), own, root)
    found = delegate(where, os.getpid(), root / own.lstrip("/"), root)
    return (
        Place(parent, 2, found.subtree, found.problem),
        found.controllers,
        found.subtree is not None,
    )


def groups(name: str, controllers: tuple[str, ...], place: Place) -> Cgroup | Group:
    """The groups of the sandbox `name` for `controllers` (the freezer among them) at `place`."""
    if place.version == 2:
        assert place.subtree is not None
        return Group(name, [c for c in controllers if c != "freezer"], place.subtree)
    return Cgroup(name, controllers, place)


def v2_files(settings: dict[str, dict[str, str]]) -> dict[str, str]:
    """A plan's v1 files (`limits.plan`, by controller) as v2's, in one group."""
    files = {name: value for group in settings.values() for name, value in group.items()}
    out: dict[str, str] = {}
    if "memory.limit_in_bytes" in files:
        out["memory.max"] = files["memory.limit_in_bytes"]
        out["memory.swap.max"] = "0"
    if "pids.max" in files:
        out["pids.max"] = files["pids.max"]
    if "cpu.cfs_quota_us" in files:
        out["cpu.max"] = f"{files['cpu.cfs_quota_us']} {files.get('cpu.cfs_period_us', 100000)}"
    unknown = set(files) - set(V1_FILES)
    if unknown:
        raise ValueError(f"no v2 file for {sorted(unknown)}")
    return out


class Group:
    """The v2 group of one sandbox, with `cgroup.Cgroup`'s interface (`dirs` names it once per
    controller it has, the freezer included, so the container asks it as it asks v1's)."""

    def __init__(self, name: str, controllers: Iterable[str], subtree: Path) -> None:
        self.path = subtree / name
        self.path.mkdir()
        self.dirs = {c: self.path for c in ("freezer", *controllers)}

    def configure(self, settings: dict[str, dict[str, str]]) -> None:
        """Write a plan's limits (v1 names, `limits.plan`) as v2's files; OSError if refused.

        `memory.swap.max` is absent where swap is not accounted: skipped there.
        """
        for name, value in v2_files(settings).items():
            if name == "memory.swap.max" and not (self.path / name).is_file():
                continue
            (self.path / name).write_text(value)

    def join(self, pid: int) -> None:
        """Move process `pid` into the group."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def joining(self, argv: list[str]) -> list[str]:
        """`argv` run by a shell that first moves itself into the group (`JOIN_SCRIPT`)."""
        return ["/bin/sh", "-c", JOIN_SCRIPT, "sh", str(self.path / "cgroup.procs"), "--", *argv]

    def freeze(self, frozen: bool) -> None:
        """Freeze (or thaw) the group; OSError if `cgroup.events` does not say so in time."""
        (self.path / "cgroup.freeze").write_text("1" if frozen else "0")
        wanted = f"frozen {int(frozen)}"
        deadline = time.monotonic() + FREEZE_TIMEOUT
        while wanted not in (self.path / "cgroup.events").read_text().splitlines():
            if time.monotonic() > deadline:
                raise OSError(f"the group did not report {wanted!r}")
            time.sleep(0.01)

    def kill(self, timeout: float = KILL_TIMEOUT) -> int:
        """SIGKILL every process of the group until it is empty (`cgroup.kill`, else one by
        one while frozen: v2 lets a fatal signal through the freezer); how many it held."""
        held = members(self.path)
        deadline = time.monotonic() + timeout
        while True:
            left = members(self.path)
            if not left or time.monotonic() > deadline:
                return len(held)
            if not _write(self.path / "cgroup.kill", "1"):
                _write(self.path / "cgroup.freeze", "1")
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                _write(self.path / "cgroup.freeze", "0")
            time.sleep(0.01)

    def remove(self) -> None:
        """Remove the group once its processes are gone (waits a little for them)."""
        deadline = time.monotonic() + FREEZE_TIMEOUT
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)
