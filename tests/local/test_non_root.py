"""The local server run by an ordinary user (issue 42): a user with a subordinate id range, in
the system's own Python, runs code in a sandbox whose root is an id of that range outside, with
Docker's capabilities and seccomp, never the user itself nor host root.

The tests make the user (`useradd -m`, which gives it a range on Debian) and run the server as
it with `runuser`: they need root, and skip otherwise.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from osb_sync import Client
from osb_sync.local.host import identity
from tests.local.serverproc import CHECKOUT, ServerProcess, descendants
from tests.local.test_confinement import DOCKER_CAPS

PYTHON = "/usr/bin/python3"  # what a user's venv is made from (the system's is PEP 668's)


def _as(user: str, path: str, *command: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [shutil.which("runuser") or "runuser", "-u", user, "--", *command],
        capture_output=True,
        timeout=60,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": path},
    )


@pytest.fixture(scope="module")
def package_copy() -> Iterator[str]:
    """This checkout's package, copied where any user can read it: the checkout itself may be
    under a directory only root enters (a CI clone under /root, say)."""
    where = Path(tempfile.mkdtemp(prefix="osb-non-root-"))  # in /tmp, which every user enters
    try:
        shutil.copytree(Path(CHECKOUT) / "osb_sync", where / "osb_sync",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        for item in (where, *where.rglob("*")):
            item.chmod(0o755 if item.is_dir() else 0o644)
        yield str(where)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _shadow(*command: str) -> subprocess.CompletedProcess[bytes]:
    """useradd or userdel under the server's own lock (`identity.RESERVE_LOCK`): parallel
    suites and servers making their user must not race on /etc/passwd."""
    with open(identity.RESERVE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run(command, capture_output=True, timeout=60)


def _owner(pid: int) -> int | None:
    try:
        return Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return None  # gone


def _live(pid: int, uids: set[int]) -> bool:
    """Whether `pid` is a process (not a zombie) of one of `uids`."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z" and _owner(pid) in uids


@pytest.fixture(scope="module")
def ranged_user(package_copy: str) -> Iterator[str]:
    """A new user with a subordinate id range, removed (with its home) after the module."""
    if os.geteuid() != 0:
        pytest.skip("makes a user (useradd) and runs a server as it (runuser): needs root")
    missing = [t for t in ("useradd", "userdel", "runuser", "newuidmap") if not shutil.which(t)]
    if missing or not os.path.exists(PYTHON):
        pytest.skip(f"needs {', '.join(missing) or PYTHON}")
    name = f"osbt{os.getpid()}"
    made = _shadow("useradd", "-m", name)
    assert made.returncode == 0, made.stderr
    try:
        if not identity.pick(identity.SUBUID.read_text(), (name,), -1):
            pytest.skip(f"useradd gave {name} no range of subordinate ids in /etc/subuid")
        imported = _as(name, package_copy, PYTHON, "-c", "import osb_sync.local")
        assert imported.returncode == 0, imported.stderr  # the package's copy, as the user
        yield name
    finally:
        _shadow("userdel", "-r", name)


def test_a_user_with_a_range_runs_code_as_an_id_of_its_range(
    ranged_user: str, package_copy: str
) -> None:
    user = pwd.getpwnam(ranged_user)
    start = identity.pick(identity.SUBUID.read_text(), (ranged_user,), user.pw_uid)
    assert start is not None
    ids = {user.pw_uid, *range(start, start + identity.COUNT)}
    server = ServerProcess(user=ranged_user, python=PYTHON, path=package_copy)
    try:
        with Client(server.api_base) as client, client.create_sandbox() as sandbox:
            assert sandbox.run_code("print(6*7)").stdout == "42\n"
            status = sandbox.commands.run("id -u; id -G; cat /proc/self/status").stdout
            uid, gid, fields = status.split("\n", 2)  # id -G: no group of the user's
            found = dict(line.split(":\t", 1) for line in fields.splitlines() if ":\t" in line)
            assert (uid, gid) == ("0", "0"), status
            assert int(found["CapEff"], 16) == DOCKER_CAPS, found["CapEff"]
            assert found["Seccomp"].strip() == "2", found["Seccomp"]
            owners = {_owner(pid) for pid in descendants(server.pid)} - {None}
            # The server and bwrap's monitor are the user's; the sandbox's are the range's.
            assert start in owners, owners
            assert owners <= ids, owners
    finally:
        assert server.stop() == 0
    left = {pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if _live(pid, ids)}
    assert not left, left  # nothing of the user's nor its sandboxes' outlives the server
