"""The volume mounter of a server whose sandboxes' root is an id of its range
(`volumes.mount_inside`), attacked: an image's tree never runs in it, and a volume with mounts
below it is mounted whole, as bwrap's `--bind` mounts it.
"""

from __future__ import annotations

import glob
import os
import platform
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from osb_sync import Client
from osb_sync.local.host import volumes
from tests.local.serverproc import ServerProcess
from tests.local.test_non_root import PYTHON, package_copy, ranged_user  # noqa: F401

pytestmark = pytest.mark.local

UNSHARE = ("unshare", "-U", "--map-root-user", "-m", "--propagation", "private")
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

# Holds a user and mount namespace whose root is ROOT (an image's tree, as bwrap leaves a
# sandbox's: pivoted, the old root detached), until killed.
HOLDER = """
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
root, number = sys.argv[1], int(sys.argv[2])
assert libc.mount(root.encode(), root.encode(), None, 4096 | 16384, None) == 0  # MS_BIND|REC
os.chdir(root)
assert libc.syscall(number, b".", b"old") == 0, ctypes.get_errno()
os.chdir("/")
assert libc.umount2(b"/old", 2) == 0  # MNT_DETACH
print("held", flush=True)
signal.pause()
"""

# What a hostile image puts where Python 3.13 imports `traceback` from to report an uncaught
# exception (the mounter's root is the image's once in its mount namespace).
PAYLOAD = 'import os\nopen("/payload-ran", "w").write(str(os.getuid()))\n'


def python_313() -> str | None:
    """A Python 3.13 that runs (on PATH, or pyenv's: its shim fails outside a version)."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = [shutil.which("python3.13"), *glob.glob(f"{pyenv}/versions/3.13*/bin/python3.13")]
    for python in filter(None, found):
        ran = subprocess.run([python, "-I", "-S", "-c", ""], capture_output=True, check=False)
        if ran.returncode == 0:
            return python
    return None


def test_the_mounter_runs_nothing_of_an_image_s_tree_when_its_target_vanishes(
    tmp_path: Path,
) -> None:
    """An image's link `/s -> d/e/f/../..` makes mountPath `/s/e` the directory `/d/e`; once the
    empty volume covers it, `/s/e` no longer resolves. On Python 3.13 an uncaught error there
    imported the image's `traceback.py` (it ran as the server's user, holding the volume's host
    descriptor); now the mounter only writes its reason and exits."""
    python = python_313()
    if python is None:
        pytest.skip("needs Python 3.13 (whose uncaught-exception report imports traceback)")
    number = PIVOT_ROOT.get(platform.machine())
    assert number is not None, f"no pivot_root number for {platform.machine()}"
    stdlib = subprocess.run(
        [python, "-I", "-S", "-c", "import os; print(os.path.dirname(os.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    image = tmp_path / "image"
    (image / "d/e/f").mkdir(parents=True)
    (image / "old").mkdir()
    (image / "s").symlink_to("d/e/f/../..")
    planted = image / stdlib.lstrip("/") / "traceback.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(PAYLOAD)
    image.chmod(0o755)
    volume = tmp_path / "volume"
    volume.mkdir()
    holder = subprocess.Popen(
        [*UNSHARE, sys.executable, "-I", "-S", "-c", HOLDER, str(image), str(number)],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        userns = os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY)
        mntns = os.open(f"/proc/{holder.pid}/ns/mnt", os.O_RDONLY)
        fd = os.open(volume, os.O_PATH | os.O_DIRECTORY)
        passed = (userns, mntns, fd)
        try:
            done = subprocess.run(
                [python, "-I", "-S", "-c", volumes.MOUNT_INSIDE, *map(str, passed), "0", "/s/e"],
                pass_fds=passed,
                capture_output=True,
                text=True,
                cwd="/",
                env={},
                timeout=60,
                check=False,
            )
        finally:
            for each in passed:
                os.close(each)
    finally:
        holder.kill()
        holder.wait()
    assert not (image / "payload-ran").exists(), done
    assert done.returncode == 1, done
    assert "FileNotFoundError" in done.stderr and "Traceback" not in done.stderr, done


def test_a_volume_with_a_mount_below_it_is_mounted_whole(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """`open_tree` without AT_RECURSIVE refused it (`open_tree: Invalid argument`); read-only
    and nosuid,nodev hold below it too."""
    name: str = request.getfixturevalue("ranged_user")
    package: str = request.getfixturevalue("package_copy")
    user = pwd.getpwnam(name)
    base = Path("/srv") / f"osb-submount-{user.pw_uid}-{os.getpid()}"
    (base / "sub").mkdir(parents=True)
    base.chmod(0o755)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(base / "sub")], check=True
    )
    (base / "sub/inner.txt").write_text("below")
    Path(user.pw_dir).chmod(0o700)
    try:
        server = ServerProcess(
            log=tmp_path / "server.log",
            user=name,
            python=PYTHON,
            path=package,
            root_dir=str(Path(user.pw_dir) / "state"),
            allowed_host_paths=[str(base)],
        )
        try:
            for read_only in (True, False):
                volume = {"name": "h", "host": {"path": str(base)}, "mountPath": "/hv"}
                with Client(server.api_base) as client:
                    with client.create_sandbox(volumes=[{**volume, "readOnly": read_only}]) as box:
                        ran = box.commands.run("cat /hv/sub/inner.txt; touch /hv/sub/new")
                        assert ran.stdout == "below", ran
                        if read_only:
                            assert "Read-only file system" in ran.stderr, ran
                        lines = box.commands.run("grep ' /hv/sub ' /proc/self/mountinfo").stdout
                        options = set(lines.split()[5].split(","))
                        assert {"nosuid", "nodev"} <= options, lines
                        assert ("ro" in options) == read_only, lines
        finally:
            assert server.stop() == 0
    finally:
        deadline = time.monotonic() + 10
        while subprocess.run(["umount", str(base / "sub")], check=False).returncode != 0:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        shutil.rmtree(base)
