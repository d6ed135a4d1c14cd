"""cgroup v2 (`cgroup2.py`) on a fake cgroupfs tree: these machines are cgroup v1 hybrids, so
this logic has not run on a real v2 host. `FakeKernel` stands in for the kernel's side of the
files the code writes (documented in Documentation/admin-guide/cgroup-v2.rst): a write to
`cgroup.subtree_control` adds a controller, one to `cgroup.procs` moves a process out of its
group, and a controller the "no internal processes" rule refuses raises EBUSY.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from osb_sync.local.host import cgroup, cgroup2

SERVER = 4242
REAL_WRITE = Path.write_text


class FakeKernel:
    """The kernel's answers to writes under `root` (other paths are written as they are)."""

    def __init__(
        self, root: Path, refuse: frozenset[str] = frozenset(), real_root: bool = True
    ) -> None:
        self.root, self.refuse = root, refuse
        self.real_root = real_root  # False: `root` is a cgroup namespace's (not exempt)
        self.real = REAL_WRITE  # not another FakeKernel's

    def _mixable(self, group: Path) -> bool:
        """Only the hierarchy's real root may hold processes and enable controllers at once."""
        return group == self.root and self.real_root

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Answer every `Path.write_text` (until `monkeypatch` undoes it)."""
        monkeypatch.setattr(Path, "write_text", lambda path, data, *a, **k: self.write(path, data))

    def write(self, path: Path, data: str, *args: object, **kwargs: object) -> int:
        if self.root not in path.parents:
            return self.real(path, data)
        if path.name == "cgroup.subtree_control":
            name = data.strip().lstrip("+")
            procs = path.parent / "cgroup.procs"
            holds = procs.read_text().split() if procs.exists() else []
            if name in self.refuse or (holds and not self._mixable(path.parent)):
                raise OSError(errno.EBUSY, "Device or resource busy")  # no internal processes
            enabled = path.read_text().split() if path.exists() else []
            return self.real(path, " ".join([*enabled, name]))
        if path.name == "cgroup.procs":
            control = path.parent / "cgroup.subtree_control"
            if control.exists() and control.read_text().split() and not self._mixable(path.parent):
                raise OSError(errno.EBUSY, "Device or resource busy")  # no internal processes
            for other in self.root.rglob("cgroup.procs"):  # a process is in one group
                kept = [p for p in other.read_text().split() if p != data.strip()]
                self.real(other, "\n".join(kept))
            held = path.read_text().split() if path.exists() else []
            return self.real(path, "\n".join([*held, data.strip()]))
        return self.real(path, data)


def group(path: Path, procs: str = "", controllers: str = "cpu io memory pids") -> Path:
    """A fake delegated group: its interface files, `procs` in it."""
    path.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("cgroup.procs", procs),
        ("cgroup.subtree_control", ""),
        ("cgroup.controllers", controllers),
    ):
        with open(path / name, "w") as made:  # as the kernel makes them, not as a write
            made.write(text)
    return path


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = group(tmp_path / "cgroup", "1 2 3")
    kernel = FakeKernel(root, frozenset({"io"}))
    kernel.install(monkeypatch)
    yield root


def test_a_v2_tree_and_the_server_s_group_are_found() -> None:
    hybrid = "4:memory:/x\n1:cpu:/\n0::/\n"
    assert cgroup2.own_group("0::/user.slice/user@1000.service/app.slice/a.scope\n") == (
        "/user.slice/user@1000.service/app.slice/a.scope"
    )
    assert cgroup2.own_group(hybrid) == "/" and cgroup2.own_group("") == "/"
    own = "/user.slice/u.service/a.scope"
    root = Path("/sys/fs/cgroup")
    assert cgroup2.base(cgroup.Place(), own, root) == root / own[1:]
    assert cgroup2.base(cgroup.Place("/osb"), own, root) == root / "osb"
    assert cgroup2.base(cgroup.Place("osb"), own, root) == root / own[1:] / "osb"


def test_unified_is_a_v2_root_only(tree: Path, tmp_path: Path) -> None:
    assert cgroup2.unified(tree)
    assert not cgroup2.unified(tmp_path)  # v1 hybrid: no cgroup.controllers at the root


def test_the_server_moves_itself_out_of_its_delegated_group_then_enables_controllers(
    tree: Path,
) -> None:
    scope = group(tree / "user.slice" / "a.scope", str(SERVER))
    found = cgroup2.delegate(scope, SERVER, scope, tree)
    assert found.problem == "" and found.subtree == scope / "osb-sync"
    assert (scope / "cgroup.procs").read_text().split() == []  # no internal process
    assert (scope / "osb-sync.server" / "cgroup.procs").read_text().split() == [str(SERVER)]
    assert (scope / "cgroup.subtree_control").read_text().split() == ["memory", "pids", "cpu"]
    assert (scope / "osb-sync" / "cgroup.subtree_control").read_text().split() == [
        "memory",
        "pids",
        "cpu",
    ]
    assert found.controllers == {"memory", "pids", "cpu"}


def test_a_controller_the_group_lacks_or_the_kernel_refuses_is_left_out(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = group(tree / "a.scope", str(SERVER), controllers="memory pids")
    assert cgroup2.delegate(scope, SERVER, scope, tree).controllers == {"memory", "pids"}
    kernel = FakeKernel(tree, frozenset({"pids"}))
    kernel.install(monkeypatch)
    other = group(tree / "b.scope", str(SERVER))
    assert cgroup2.delegate(other, SERVER, other, tree).controllers == {"memory", "cpu"}


def test_a_group_that_is_not_the_server_s_to_use_is_refused_naming_why(tree: Path) -> None:
    shared = group(tree / "session.scope", f"{SERVER} 77")
    refused = cgroup2.delegate(shared, SERVER, shared, tree)
    assert refused.subtree is None and "holds other processes (1)" in refused.problem
    assert "Delegate=yes" in refused.problem
    assert (shared / "cgroup.procs").read_text().split() == [str(SERVER), "77"]  # untouched
    elsewhere = group(tree / "osb-alice")
    outside = cgroup2.delegate(elsewhere, SERVER, tree / "a.scope", tree)
    assert "does not run inside the cgroup" in outside.problem  # v2's containment rule
    closed = group(tree / "root-owned.scope", str(SERVER))
    (closed / "cgroup.subtree_control").unlink()  # as a group not delegated has none of ours
    assert "is not delegated to this user" in cgroup2.delegate(closed, SERVER, closed).problem


def test_the_root_group_needs_no_move_and_a_server_below_its_parent_stays_put(
    tree: Path,
) -> None:
    at_root = cgroup2.delegate(tree, SERVER, tree, tree)
    assert at_root.problem == "" and (tree / "cgroup.procs").read_text().split() == ["1", "2", "3"]
    service = group(tree / "user@1000.service")
    group(service / "app.slice" / "a.scope", str(SERVER))
    below = cgroup2.delegate(service, SERVER, service / "app.slice" / "a.scope", tree)
    assert below.subtree == service / "osb-sync" and not (service / "osb-sync.server").exists()


def test_at_a_cgroup_namespace_s_root_the_server_moves_into_a_leaf_as_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = group(tmp_path / "ns-root", str(SERVER))  # a container's view: `0::/`
    FakeKernel(root, real_root=False).install(monkeypatch)
    found = cgroup2.delegate(root, SERVER, root, root)
    assert found.controllers == {"memory", "pids", "cpu"}, found
    assert (root / "osb-sync.server" / "cgroup.procs").read_text().split() == [str(SERVER)]
    shared = group(tmp_path / "ns-root2", f"{SERVER} 7")  # and with another process there:
    FakeKernel(shared, real_root=False).install(monkeypatch)
    stuck = cgroup2.delegate(shared, SERVER, shared, shared)
    assert stuck.controllers == frozenset()  # the kernel refuses each: reported, never claimed


def test_arrange_gives_a_v2_place_its_groups_and_oom_counter(tree: Path) -> None:
    group(tree / "a.scope", str(os.getpid()))  # this process as the server
    place, controllers, freezer = cgroup2.arrange(None, tree, own="/a.scope")
    assert (place.version, place.subtree, freezer) == (2, tree / "a.scope" / "osb-sync", True)
    assert controllers == {"memory", "pids", "cpu"}
    made = cgroup2.groups("sbx", ("freezer", "memory", "pids"), place)
    assert isinstance(made, cgroup2.Group) and made.path == tree / "a.scope/osb-sync/sbx"
    assert made.dirs == {"freezer": made.path, "memory": made.path, "pids": made.path}
    assert cgroup.parent_dir("memory", place) / "sbx" == made.path
    assert cgroup.leftover_groups("sbx", place) == [made.path]
    assert not cgroup.usable("memory", place)  # v1's test never passes for a v2 place
    unusable, none, no_freezer = cgroup2.arrange("/elsewhere", tree, own="/a.scope")
    assert unusable.subtree is None and none == frozenset() and not no_freezer
    assert "does not run inside" in unusable.problem
    assert "systemd-run --user --scope -p Delegate=yes" in cgroup.delegation_fix("u", 2)


def test_a_plan_s_v1_files_become_v2_s() -> None:
    plan = {
        "memory": {"memory.limit_in_bytes": "134217728"},
        "cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "50000"},
        "pids": {"pids.max": "64"},
    }
    assert cgroup2.v2_files(plan) == {
        "memory.max": "134217728",
        "memory.swap.max": "0",
        "pids.max": "64",
        "cpu.max": "50000 100000",
    }
    with pytest.raises(ValueError, match="no v2 file"):
        cgroup2.v2_files({"memory": {"memory.soft_limit_in_bytes": "1"}})


def test_a_sandbox_s_group_is_limited_joined_frozen_and_emptied(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    subtree = group(tree / "a.scope" / "osb-sync")
    made = cgroup2.Group("sbx", ["memory", "pids", "cpu"], subtree)
    for name in ("memory.max", "memory.swap.max", "pids.max", "cpu.max", "cgroup.freeze"):
        (made.path / name).write_text("max")
    made.configure(
        {"memory": {"memory.limit_in_bytes": str(128 << 20)}, "pids": {"pids.max": "64"}}
    )
    assert (made.path / "memory.max").read_text() == str(128 << 20)
    assert (made.path / "memory.swap.max").read_text() == "0"
    assert (made.path / "pids.max").read_text() == "64"
    assert made.joining(["bwrap", "x"])[-3:] == ["--", "bwrap", "x"]
    assert str(made.path / "cgroup.procs") in made.joining(["bwrap"])
    made.join(SERVER + 1)
    assert (made.path / "cgroup.procs").read_text().split() == [str(SERVER + 1)]
    (made.path / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    made.freeze(True)
    assert (made.path / "cgroup.freeze").read_text() == "1"
    monkeypatch.setattr(cgroup2, "FREEZE_TIMEOUT", 0.05)
    with pytest.raises(OSError, match="did not report 'frozen 0'"):
        made.freeze(False)  # the events file still says frozen


def test_kill_uses_cgroup_kill_else_kills_each_process_frozen(tree: Path) -> None:
    subtree = group(tree / "osb-sync")
    made = cgroup2.Group("sbx", ["pids"], subtree)
    child = subprocess.Popen(["sleep", "60"])
    try:
        (made.path / "cgroup.procs").write_text(str(child.pid))
        (made.path / "cgroup.freeze").write_text("0")
        assert made.kill(timeout=0.3) == 1  # no cgroup.kill (before 5.14): one by one
        assert child.wait(5) == -9
        assert (made.path / "cgroup.freeze").read_text() == "0"  # thawed after
        survivor = subprocess.Popen(["sleep", "60"])
        (made.path / "cgroup.procs").write_text(str(survivor.pid))
        (made.path / "cgroup.kill").write_text("0")
        made.kill(timeout=0.1)
        assert (made.path / "cgroup.kill").read_text() == "1"  # the kernel's job, not ours
        assert survivor.poll() is None
        survivor.kill()
        survivor.wait()
    finally:
        child.kill()
        child.wait()
    for name in os.listdir(made.path):
        (made.path / name).unlink()
    made.remove()
    assert not made.path.exists()


def test_stats_read_a_v2_group_s_files(tree: Path) -> None:
    made = cgroup2.Group("sbx", ["memory", "pids", "cpu"], group(tree / "osb-sync"))
    files = {
        "memory.current": "50000000",
        "memory.stat": "anon 1\ninactive_file 10000000\n",
        "memory.max": "134217728",
        "cpu.max": "50000 100000",
        "pids.current": "7",
        "pids.max": "64",
        "cgroup.procs": "",
    }
    for name, text in files.items():
        (made.path / name).write_text(text)
    figures = cgroup.usage(made.dirs)
    assert figures["memoryUsedBytes"] == 40_000_000  # less the inactive page cache
    assert (figures["memoryLimitBytes"], figures["cpuLimit"]) == (128 << 20, 0.5)
    assert (figures["pids"], figures["pidsLimit"]) == (7, 64)
    (made.path / "memory.max").write_text("max\n")
    (made.path / "cpu.max").write_text("max 100000\n")
    (made.path / "pids.max").write_text("max\n")
    unlimited = cgroup.usage(made.dirs)
    assert unlimited["memoryLimitBytes"] is unlimited["cpuLimit"] is unlimited["pidsLimit"] is None
