"""The store's work in a user namespace of a non-root server's id range
(`osb_sync/local/host/images/inside.py`) against what a sandbox or a killed server leaves: a
copy `cp` gave up on, a tree nested deeper than Python's recursion, a worker whose server is
gone. Each runs as a new user with a range (`test_non_root`'s fixtures): they need root, and
skip otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.local.serverproc import descendants
from tests.local.support import wait_for
from tests.local.test_non_root import (  # noqa: F401 (fixtures)
    PYTHON,
    _as,
    _owner,
    package_copy,
    range_of,
    ranged_user,
)

FAILED_COPY = """
import sys, types
from pathlib import Path
from osb_sync.local.host import identity
from osb_sync.local.host.images.inside import RangeWork
from osb_sync.local.host.images.rootfs import Layer
image, run_dir = types.SimpleNamespace(rootfs=Path(sys.argv[1])), Path(sys.argv[2])
try:
    Layer(image, run_dir, RangeWork(identity.host_range()))  # type: ignore[arg-type]
except OSError as exc:
    print("refused:", exc)
"""


def test_a_failed_copy_in_the_range_leaves_nothing_the_user_cannot_remove(
    ranged_user: str,  # noqa: F811 (the fixture)
    package_copy: str,  # noqa: F811
) -> None:
    """An image's writable copy that `cp` gives up on halfway (here a file no id of the
    namespace may read) is removed in the range: its files are the range's, which the user
    cannot remove by itself (it was left, a copy of the image's files in the run directory)."""
    user, start, gid = range_of(ranged_user)
    work = Path(tempfile.mkdtemp(prefix="osb-range-copy-"))
    try:
        rootfs, run_dir = work / "rootfs", work / "server" / "run"
        (rootfs / "etc").mkdir(parents=True)
        (rootfs / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
        (rootfs / "secret").write_text("no one's\n")
        for path in (rootfs, rootfs / "etc", rootfs / "etc" / "passwd"):
            os.chown(path, start, gid)  # the image's root's, as a pull stores it
            path.chmod(0o755 if path.is_dir() else 0o644)
        os.chown(rootfs / "secret", 4321, 4321)  # mapped in no namespace of the user's
        (rootfs / "secret").chmod(0o600)
        work.chmod(0o755)
        for path in (run_dir.parent, run_dir):  # the server's
            path.mkdir(mode=0o700)
            os.chown(path, user.pw_uid, user.pw_gid)
        done = _as(ranged_user, package_copy, PYTHON, "-c", FAILED_COPY, str(rootfs), str(run_dir))
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert done.stdout.startswith(b"refused: the image could not be copied"), done.stdout
        assert list(run_dir.iterdir()) == [], sorted(str(p) for p in run_dir.rglob("*"))
    finally:
        shutil.rmtree(work, ignore_errors=True)


HANGING_UNPACK = """
import sys
from pathlib import Path
from osb_sync.local.host import identity
from osb_sync.local.host.images.inside import RangeWork
from osb_sync.local.host.images.unpack import SizeLimit
RangeWork(identity.host_range()).unpack(Path(sys.argv[1]), Path(sys.argv[2]), SizeLimit(1 << 20))
"""


def _of_uid(uid: int) -> set[int]:
    """Live processes whose real uid is `uid`."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{entry}/status").read_text()
            if re.search(rf"^Uid:\t{uid}\t", status, re.M) and "State:\tZ" not in status:
                found.add(int(entry))
    return found


def test_the_range_s_worker_dies_with_a_killed_server(
    ranged_user: str,  # noqa: F811 (the fixture)
    package_copy: str,  # noqa: F811
) -> None:
    """The store's worker in the range (`images/inside.py`, the range's root) dies with the
    server that started it: killed mid-unpack (here an unpack that never ends, its layer a
    FIFO no one writes), the server left it running on, as the range's root, for good."""
    from tests.imagekit import Entry, Image, layer_bytes, write_dir_layout

    user, start, _ = range_of(ranged_user)
    work = Path(tempfile.mkdtemp(prefix="osb-range-kill-"))
    try:
        layout = work / "layout"
        write_dir_layout(layout, Image([layer_bytes([Entry("f", data=b"x")])]))
        manifest = json.loads((layout / "manifest.json").read_text())
        blob = layout / manifest["layers"][0]["digest"].split(":")[1]
        blob.unlink()
        os.mkfifo(blob)  # its open waits for a writer
        (work / "out").mkdir()
        for item in (work, *work.rglob("*")):
            item.chmod(0o755 if item.is_dir() else 0o644)
        os.chown(work / "out", user.pw_uid, user.pw_gid)
        before = _of_uid(start)
        server = subprocess.Popen(
            [shutil.which("runuser") or "runuser", "-u", ranged_user, "--", PYTHON, "-c",
             HANGING_UNPACK, str(layout), str(work / "out" / "rootfs")],
            cwd="/", env={"PATH": "/usr/bin:/bin", "PYTHONPATH": package_copy},
        )  # fmt: skip
        try:
            assert wait_for(lambda: _of_uid(start) - before, timeout=30)
            python = [pid for pid in descendants(server.pid) if _owner(pid) == user.pw_uid]
            os.kill(min(python), signal.SIGKILL)
            server.wait(timeout=30)
            time.sleep(1)
            assert _of_uid(start) - before == set()
        finally:
            server.kill()
            for pid in _of_uid(start) - before:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    finally:
        shutil.rmtree(work, ignore_errors=True)


DEEP_REMOVE = """
import sys
from pathlib import Path
from osb_sync.local.host import identity, recovery
from osb_sync.local.host.images.inside import RangeWork
try:
    if sys.argv[2] == "recovery":
        recovery._remove_tree(Path(sys.argv[1]))
    else:
        RangeWork(identity.host_range()).remove(Path(sys.argv[1]))
except OSError as exc:
    print("failed:", str(exc)[-300:])
"""


@pytest.mark.parametrize("by", ["store", "recovery"])
def test_the_range_removes_a_copy_its_sandbox_nested_deep(
    by: str,
    ranged_user: str,  # noqa: F811 (the fixture)
    package_copy: str,  # noqa: F811
) -> None:
    """A sandbox's root (the range's) nests directories in its writable copy as deep as it
    likes; the copy's removal in the range (`images/inside.py`), and the next server's of a
    killed one's (`recovery`), take it all the same (the first ran out of recursion and the
    range's tree stayed, which the user cannot remove; the second raised RecursionError, from
    the user's own removal before the range's, out of the recovery a server's start runs)."""
    user, start, gid = range_of(ranged_user)
    work = Path(tempfile.mkdtemp(prefix="osb-range-deep-"))
    try:
        work.chmod(0o755)
        os.chown(work, user.pw_uid, user.pw_gid)
        copy = work / "root"
        copy.mkdir()
        fd = os.open(copy, os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(3000):  # as `mkdir d; cd d` in a loop
            os.fchown(fd, start, gid)
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(fd)
        done = _as(ranged_user, package_copy, PYTHON, "-c", DEEP_REMOVE, str(copy), by)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert done.stdout == b"" and not copy.exists(), done.stdout
    finally:
        subprocess.run(["rm", "-rf", "--", str(work)], check=False)
