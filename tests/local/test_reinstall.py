"""Sandboxes that survive a reinstall (issue 49, row 3): `pip install --force-reinstall` into
the environment of a running server replaces the package's files under it; sandboxes keep the
private copy their server started with (`host/package.py`), and the server says a restart is
due."""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from osb_sync import Client, SandboxPool
from osb_sync.local.host import bwrap, package, recovery
from tests.local.serverproc import CHECKOUT, ServerProcess
from tests.local.support import require_isolation

RUNS = 5


def _install(site: Path, marker: str) -> None:
    """What pip's reinstall does to the package: every file removed, then written anew."""
    shutil.rmtree(site / "osb_sync", ignore_errors=True)
    shutil.copytree(Path(CHECKOUT) / "osb_sync", site / "osb_sync",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    worker = site / "osb_sync" / "local" / "execd" / "_worker.py"
    worker.write_text(worker.read_text() + f"# {marker}\n")


def test_a_reinstall_during_a_pools_life_breaks_no_run(tmp_path: Path) -> None:
    require_isolation()
    site, log = tmp_path / "site", tmp_path / "server.log"
    _install(site, "installed first")
    server = ServerProcess(log=log, path=str(site), spare_containers=3)
    try:
        with Client(server.api_base) as client, SandboxPool(client, size=3) as pool:
            with pool.sandbox() as sandbox:  # the pool and the server's spares are warm
                assert sandbox.run_code("print(1)").stdout == "1\n"
            _install(site, "installed again")
            outputs = []
            for run in range(RUNS):
                with pool.sandbox() as sandbox:
                    result = sandbox.run_code(f"print({run} * 2)")
                    outputs.append((result.stdout, result.error))
            assert outputs == [(f"{run * 2}\n", None) for run in range(RUNS)]
    finally:
        assert server.stop() == 0
    said = log.read_text()
    assert "changed" in said and "restart" in said, said[-3000:]


@pytest.fixture
def copy(tmp_path: Path) -> package.Snapshot:
    """A copy of this checkout's package, taken as a server's first start takes it."""
    site = tmp_path / "site"
    _install(site, "installed first")
    return package.take(site / "osb_sync", tmp_path)


def test_the_copy_is_the_package_compiled_for_containers_that_cannot_write_bytecode(
    copy: package.Snapshot,
) -> None:
    # Containers see it read-only: they could not cache what they compile.
    router = copy.path / "local" / "execd" / "router.py"
    assert router.read_bytes() == (copy.installed / "local/execd/router.py").read_bytes()
    assert Path(importlib.util.cache_from_source(str(router))).is_file()
    assert copy.digest == package.content_hash(copy.installed)
    assert copy.path.parent.name.startswith(f"{recovery.STRAY_PREFIX}package-{copy.digest[:16]}")
    assert not [p for p in copy.path.rglob("*") if p.stat().st_mode & 0o022]  # only ours write
    assert copy.pinned(str(copy.installed / "local/execd/main.py")) == str(
        copy.path / "local/execd/main.py"
    )
    assert copy.pinned("/elsewhere/main.py") == "/elsewhere/main.py"


def test_a_changed_package_is_said_once_and_the_same_files_again_never(
    copy: package.Snapshot,
) -> None:
    assert copy.changed() is None
    site = copy.installed.parent
    _install(site, "installed first")  # the same files, written again
    assert copy.changed() is None
    _install(site, "installed again")
    now = package.content_hash(copy.installed)
    assert copy.changed() == now != copy.digest
    assert copy.changed() is None  # said once
    _install(site, "installed a third time")
    assert copy.changed() is None  # a restart is due already
    assert (copy.path / "local/execd/_worker.py").read_text().endswith("# installed first\n")


def _settle(copy: package.Snapshot, monkeypatch: pytest.MonkeyPatch) -> float:
    """Let the package's directories settle (as installed long ago: `RACY_SECONDS` made
    short), then have `copy` stat its files once; when it did."""
    monkeypatch.setattr(package, "RACY_SECONDS", 0.2)
    time.sleep(0.3)
    assert copy.changed(copy.files_checked) is None
    assert copy.dirs == package.dir_marks(copy.installed)
    return copy.files_checked


def test_a_file_rewritten_in_place_is_seen_once_the_interval_passed(
    copy: package.Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = _settle(copy, monkeypatch)
    with open(copy.installed / "local/execd/_worker.py", "r+b") as out:  # no directory changes
        out.seek(0, os.SEEK_END)
        out.write(b"# edited\n")
    with monkeypatch.context() as patched:  # a create within the interval stats no file
        patched.setattr(package, "marks", lambda _: pytest.fail("every file stat'ed"))
        assert copy.changed(start + package.FILES_INTERVAL / 2) is None
    assert copy.changed(start + package.FILES_INTERVAL) == package.content_hash(copy.installed)
    assert copy.changed(start + 3 * package.FILES_INTERVAL) is None  # said once


def test_a_reinstall_is_seen_at_the_next_create_whatever_the_interval(
    copy: package.Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = _settle(copy, monkeypatch)
    (copy.installed / "local/execd/added.py").write_text("")  # what a newer version adds
    assert copy.changed(start) == package.content_hash(copy.installed)


def test_a_directory_changed_as_it_was_stat_ed_is_not_trusted(
    copy: package.Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Changed again in the same tick, an inode reused: its stat may not change.
    start = _settle(copy, monkeypatch)
    assert package.settled(copy.dirs or (), time.time_ns()) == copy.dirs
    monkeypatch.setattr(package, "RACY_SECONDS", 60.0)  # however slow the machine
    os.utime(copy.installed / "local")  # now
    assert copy.changed(start) is None  # the same files
    assert copy.dirs is None  # every file is stat'ed at each create until it is older
    assert package.settled(package.dir_marks(copy.installed), time.time_ns()) is None


def test_a_killed_servers_copy_is_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install(site, "installed first")
    # A server process that takes its copy and dies without its exit handlers.
    script = (
        "import os, sys; from pathlib import Path; from osb_sync.local.host import package\n"
        "package.take(Path(sys.argv[1]), Path(sys.argv[2])); os._exit(0)"
    )
    killed = [sys.executable, "-c", script, str(site / "osb_sync"), str(tmp_path)]
    subprocess.run(killed, check=True, cwd=CHECKOUT, timeout=60)
    live = package.take(site / "osb_sync", tmp_path)
    assert recovery.sweep_strays(tmp_path) != []
    assert [p for p in tmp_path.iterdir() if p.name != "site"] == [live.path.parent]


@pytest.mark.parametrize("mask", [0o000, 0o077])
def test_the_copy_is_readable_by_all_and_writable_by_none_whatever_the_umask(
    tmp_path: Path, mask: int
) -> None:
    """Under umask 000 its parents and `__pycache__` were world-writable (another local user
    could plant bytecode the sandboxes' execd imports); under 077 its directories were the
    server's only, and no sandbox of a root server could read its execd."""
    site = tmp_path / "site"
    _install(site, "installed first")
    old = os.umask(mask)
    try:
        taken = package.take(site / "osb_sync", tmp_path)
    finally:
        os.umask(old)
    made = [taken.path.parent, *taken.path.parent.rglob("*")]
    wrong = {
        str(path): oct(stat.S_IMODE(path.lstat().st_mode))
        for path in made
        if not path.name.startswith(recovery.LOCK_NAME)
        and stat.S_IMODE(path.lstat().st_mode) != (0o755 if path.is_dir() else 0o644)
    }
    assert wrong == {}


def test_a_name_another_user_took_first_does_not_stop_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy's final name (the content hash, which anyone who can read the package knows,
    and mkdtemp's suffix, which anyone who can list TMPDIR sees) taken by another local user
    while the copy is made: the server did not start (rename: directory not empty)."""
    site = tmp_path / "site"
    _install(site, "installed first")
    digest = package.content_hash(site / "osb_sync")
    made = tempfile.mkdtemp
    squats: list[Path] = []

    def squatting(prefix: str, dir: Path) -> str:
        where = made(prefix=prefix, dir=dir)
        suffix = Path(where).name[len(package.PREFIX) :]
        squat = Path(dir) / f"{package.PREFIX}{digest[:16]}-{suffix}"
        (squat / "osb_sync").mkdir(parents=True)
        (squat / "osb_sync" / "planted.py").write_text("print('planted')\n")
        squats.append(squat)
        return where

    monkeypatch.setattr(package.tempfile, "mkdtemp", squatting)
    taken = package.take(site / "osb_sync", tmp_path)
    assert squats and (squats[0] / "osb_sync" / "planted.py").is_file()
    assert taken.path.parent != squats[0] and taken.path.is_dir()
    assert not (taken.path / "planted.py").exists()
    assert (taken.path / "local" / "execd" / "main.py").is_file()


def test_a_sweep_leaves_other_users_directories_and_links_alone(tmp_path: Path) -> None:
    """TMPDIR is shared (`/tmp`): another user's `osb-local-*` directory with an unheld lock,
    or a link of that name to elsewhere, is not a server's of this user to reap (a root sweep
    removed the one, and through the other what a sandbox-named directory there held)."""
    sandbox = "12345678-1234-4123-8123-123456789abc"
    theirs = tmp_path / f"{recovery.STRAY_PREFIX}theirs"
    elsewhere = tmp_path / "elsewhere"
    for root in (theirs, elsewhere):
        (root / sandbox).mkdir(parents=True)
        (root / recovery.LOCK_NAME).write_text("")
        (root / sandbox / "kept").write_text("kept")
    os.chown(theirs, 1002, 1002)
    (tmp_path / f"{recovery.STRAY_PREFIX}link").symlink_to(elsewhere)
    recovery.sweep_strays(tmp_path)
    assert (theirs / sandbox / "kept").is_file()
    assert (elsewhere / sandbox / "kept").is_file()


def test_the_copy_goes_where_the_sandboxes_can_reach_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TMPDIR only its user may search (mode 0700, as `$XDG_RUNTIME_DIR`): bwrap, as the
    range's root, could not bind the copy from there, and no sandbox of a non-root server
    started ("Can't find source path ...: Permission denied")."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", None)
    parent = package.parent_dir()
    assert bwrap.reachable(str(parent / "x")), parent
    assert recovery.stray_parents()[0] == private and parent in recovery.stray_parents()
