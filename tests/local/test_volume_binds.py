"""Volumes bound by descriptor (issue 22 item 6, review row 4), no descriptor left open, and
volumes mounted `nosuid,nodev`.

Row 4: sandbox A mounts a pvc claim and swaps, in a loop, a directory of it with a symlink to
a host directory (`renameat2(RENAME_EXCHANGE)`) while sandbox B is created on that claim with
that directory as its `subPath`. A server that checks a path and binds it later by name mounts
the host directory into B now and then; ours opens what it checked and mounts the descriptor,
so B gets the claim's directory or a 400, never the host's.

The mount tests need bubblewrap: they skip where sandboxes cannot be isolated, and fail instead
under OSB_REQUIRE_ISOLATION=1.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from osb_sync.local import LocalServer
from osb_sync.local.host import bwrap, identity, staging, volumes
from osb_sync.local.host.errors import VolumeError
from osb_sync.local.host.server import answer
from tests.local.support import (
    CREATE_BODY,
    Box,
    CommandEvents,
    parse_events,
    require_isolation,
    texts,
    volume_server,
    wait_for,
)

pytestmark = pytest.mark.local

# Sandbox A's swapper: `sub` (a directory) and `alt` (a symlink to the host's directory
# TARGET) trade places, as fast as Python can call renameat2, until the sandbox ends.
SWAPPER = """python3 - <<'EOF'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("/data/sub", exist_ok=True)
open("/data/sub/inside.txt", "w").write("inside\\n")
os.symlink(TARGET, "/data/alt")
open("/data/started", "w").close()
while True:  # AT_FDCWD = -100, RENAME_EXCHANGE = 2
    if libc.renameat2(-100, b"/data/sub", -100, b"/data/alt", 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
EOF"""
B_TRIES = 200  # creates of B, unless B_SECONDS run out first (a create starts a container)
B_MADE = 10  # ... and go on past B_TRIES (within B_SECONDS) until this many were made
B_SECONDS = 90.0
OPEN_TRIES = 3000  # the server's check and bind alone, without a container: fast


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """outside/secret.txt (a host directory outside every volume), volumes/ (the pvc root)."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret\n")
    os.chmod(tmp_path / "outside", 0o777)  # were it mounted, B could write it
    (tmp_path / "allowed" / "data").mkdir(parents=True)
    ids = bwrap.probe().ids
    if ids is not None:
        os.chown(tmp_path / "allowed" / "data", ids.uid, ids.gid)
    return tmp_path


@pytest.fixture
def server(tree: Path) -> Iterator[LocalServer]:
    """An isolated server: pvcs under `volumes/`, host paths under `allowed/`."""
    with volume_server(tree) as srv:
        yield srv


def pvc(claim: str, mount: str = "/data", **extra: Any) -> dict[str, Any]:
    return {"name": "work", "pvc": {"claimName": claim}, "mountPath": mount, **extra}


def swapping(server: LocalServer, http: requests.Session, tree: Path) -> Box:
    """Sandbox A, swapping `race/sub` with a symlink to `outside` (seen doing it)."""
    a = Box(server, http, {**CREATE_BODY, "volumes": [pvc("race")]})
    script = SWAPPER.replace("TARGET", repr(str(tree / "outside")))
    started = a.call("POST", "/command", json={"command": script, "background": True})
    assert started.status_code == 200, started.text
    claim = tree / "volumes" / "race"
    assert wait_for(lambda: (claim / "started").exists(), 20), "A's swapper did not start"
    kinds: set[int] = set()
    deadline = time.monotonic() + 10
    while len(kinds) < 2 and time.monotonic() < deadline:
        try:
            kinds.add(stat.S_IFMT(os.lstat(claim / "sub").st_mode))
        except FileNotFoundError:
            pass
    assert kinds == {stat.S_IFDIR, stat.S_IFLNK}, "A does not swap: the test would prove nothing"
    return a


def test_row4_a_swapped_sub_path_never_mounts_the_host_directory_into_b(
    server: LocalServer, http: requests.Session, tree: Path
) -> None:
    swapping(server, http, tree)
    made = refused = 0
    deadline = time.monotonic() + B_SECONDS
    # Most creates are refused (the swap seen): count the made ones too, so that a loaded
    # machine's few creates still prove something.
    while (made + refused < B_TRIES or made < B_MADE) and time.monotonic() < deadline:
        body = {**CREATE_BODY, "volumes": [pvc("race", subPath="sub")]}
        answer = http.post(f"{server.api_base}/sandboxes", json=body)
        if answer.status_code == 400:  # the swap seen: refused, as it should be
            assert answer.json()["code"] == "VOLUME::INVALID_SUB_PATH", answer.text
            refused += 1
            continue
        assert answer.status_code == 202, answer.text
        made += 1
        sandbox_id = answer.json()["id"]
        endpoint = http.get(f"{server.api_base}/sandboxes/{sandbox_id}/endpoints/44772").json()
        ran = http.post(
            f"http://{endpoint['endpoint']}/command",
            headers=endpoint["headers"],
            json={"command": f"ls /data; echo {made} > /data/from-b-{made}"},
        )
        seen = texts(CommandEvents(parse_events(ran.content)))  # line by line
        assert http.delete(f"{server.api_base}/sandboxes/{sandbox_id}").status_code == 204
        assert "secret.txt" not in seen, f"B mounted the host directory (create {made})"
        assert "inside.txt" in seen, seen
        assert sorted(os.listdir(tree / "outside")) == ["secret.txt"], f"B wrote outside ({made})"
    print(f"row 4: {made} B created, {refused} refused (a swap seen)")
    assert made >= 5, f"only {made} B created in {B_SECONDS} s: the test proves too little"
    assert sorted(os.listdir(tree / "outside")) == ["secret.txt"]


def test_row4_the_checked_directory_is_the_one_bound(
    server: LocalServer, http: requests.Session, tree: Path
) -> None:
    """The server's check and bind alone (what a create runs before bwrap), many times."""
    swapping(server, http, tree)
    claim = tree / "volumes" / "race"
    inside = None
    while inside is None:  # A's directory, under whichever name it has at the moment
        for name in ("sub", "alt"):
            found = os.lstat(claim / name)
            inside = found if stat.S_ISDIR(found.st_mode) else inside
    outside = os.stat(tree / "outside")
    ids = bwrap.probe().ids
    staged = staging.Staging(ids)
    userns = -1  # every other bind ID-mapped (issue 43): `open_tree` of the descriptor
    if staging.available() and ids is not None:
        userns = identity.mount_namespace(
            identity.mount_map(4242, ids.uid), identity.mount_map(4242, ids.gid)
        )
    bound = refused = 0
    for attempt in range(OPEN_TRIES):
        try:
            binds = volumes.mounts([pvc("race", subPath="sub")], (), tree / "volumes", True)
        except VolumeError as exc:
            assert answer(exc).body["code"] == "VOLUME::INVALID_SUB_PATH", exc
            refused += 1
            continue
        try:
            held = os.fstat(binds[0].fd)
            assert (held.st_dev, held.st_ino) == (inside.st_dev, inside.st_ino)
            if staging.available():
                mapped = userns if attempt % 2 else -1
                target = staged.add_fd(binds[0].fd, True, False, volume=True, userns=mapped)
                mounted = os.stat(target)
                assert (mounted.st_dev, mounted.st_ino) != (outside.st_dev, outside.st_ino)
                assert mounted.st_ino == inside.st_ino
                assert not os.path.exists(os.path.join(target, "secret.txt"))
        finally:
            volumes.close(binds)
            staged.release()
        bound += 1
    if userns >= 0:
        os.close(userns)
    print(f"row 4, check and bind: {bound} bound, {refused} refused")
    assert bound >= 10 and refused >= 1, (bound, refused)  # both outcomes seen


def open_fds(under: Path | None = None) -> int:
    """This process's descriptors (all, or those of files and directories under `under`)."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own, closed since
        found += under is None or target.startswith(f"{under}/")
    return found


def test_no_descriptor_is_left_open_by_creates_and_deletes(
    server: LocalServer, http: requests.Session, tree: Path
) -> None:
    """The server (this process) holds no volume's descriptor once a create is answered, and
    as many descriptors in all after creates and deletes as before."""
    host = {"name": "h", "host": {"path": str(tree / "allowed")}, "mountPath": "/mnt/h"}
    both = [pvc("kept", subPath="a/b"), {**host, "subPath": "data", "readOnly": True}]
    missing = [pvc("kept"), {**host, "subPath": "nope"}]  # the second refused, the first opened
    first = http.post(f"{server.api_base}/sandboxes", json={**CREATE_BODY, "volumes": both})
    assert first.status_code == 202, first.text  # warm: threads, pools and caches made
    assert open_fds(tree) == 0
    assert http.delete(f"{server.api_base}/sandboxes/{first.json()['id']}").status_code == 204
    (tree / "volumes" / "kept" / "file").write_text("not a directory\n")
    baseline = open_fds()
    for _ in range(4):
        made = http.post(f"{server.api_base}/sandboxes", json={**CREATE_BODY, "volumes": both})
        assert made.status_code == 202, made.text
        assert open_fds(tree) == 0, "a create left a volume's descriptor open"
        assert http.delete(f"{server.api_base}/sandboxes/{made.json()['id']}").status_code == 204
    after_creates = open_fds()
    for bad in (missing, [pvc("kept"), pvc("kept", "/other", name="w2", subPath="file")]):
        for _ in range(10):
            answer = http.post(f"{server.api_base}/sandboxes", json={**CREATE_BODY, "volumes": bad})
            assert answer.status_code == 400, answer.text
    assert open_fds(tree) == 0, "a refused create left a volume's descriptor open"
    # in all: a pooled HTTP connection or a deleted sandbox's pipe may still come or go
    assert open_fds() - baseline <= 3, (baseline, after_creates, open_fds())


def test_volumes_are_mounted_nosuid_nodev(
    server: LocalServer, http: requests.Session, tree: Path
) -> None:
    host = {"name": "h", "host": {"path": str(tree / "allowed" / "data")}, "mountPath": "/mnt/h"}
    box = Box(server, http, {**CREATE_BODY, "volumes": [host, pvc("flags", subPath="x")]})
    mountinfo = "\n".join(texts(box.command("cat /proc/self/mountinfo")))
    options = {
        line.split()[4]: set(line.split()[5].split(","))
        for line in mountinfo.splitlines()
        if len(line.split()) > 5
    }
    for place in ("/mnt/h", "/data"):
        assert place in options, mountinfo
        assert {"nosuid", "nodev"} <= options[place], (place, options[place])


def test_bwrap_bind_fd_never_mounts_another_directory_than_the_descriptors(
    tmp_path: Path,
) -> None:
    """What a server that cannot mount (not root) relies on: `--bind-fd` (`Bind.bwrap_args`)
    mounts the descriptor's directory, or bwrap dies, while a swapper races it."""
    require_isolation()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inside.txt").write_text("inside\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret\n")
    (tmp_path / "alt").symlink_to(tmp_path / "outside")
    swapper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import ctypes, sys\n"
            "libc = ctypes.CDLL(None)\n"
            "a, b = sys.argv[1].encode(), sys.argv[2].encode()\n"
            "while True:\n"
            "    libc.renameat2(-100, a, -100, b, 2)\n",
            str(tmp_path / "sub"),
            str(tmp_path / "alt"),
        ]
    )
    outcomes: dict[str, int] = {}
    try:
        for _ in range(60):
            fd = None
            while fd is None:  # the directory, under whichever name it has now
                fd = _open_dir(tmp_path, ("sub", "alt"))
            try:
                bind = volumes.Bind(fd, False, "/mnt/v")
                user = [] if os.geteuid() == 0 else ["--unshare-user"]
                view = [*user, *bwrap.root_view(), "--tmpfs", "/mnt", *bind.bwrap_args()]
                ran = subprocess.run(
                    [bwrap.probe().bwrap or "bwrap", *view, "ls", "/mnt/v"],
                    pass_fds=(fd,),
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
            finally:
                os.close(fd)
            assert "secret.txt" not in ran.stdout, "bwrap mounted the symlink's target"
            if ran.returncode == 0:
                assert ran.stdout.split() == ["inside.txt"], ran.stdout
            said = "inside" if ran.returncode == 0 else "bwrap refused"
            outcomes[said] = outcomes.get(said, 0) + 1
    finally:
        swapper.kill()
        swapper.wait()
    print(f"bwrap --bind-fd under a swap: {outcomes}")
    assert outcomes.get("inside", 0) >= 1, outcomes  # and the others failed closed


def _open_dir(parent: Path, names: tuple[str, ...]) -> int | None:
    """A descriptor of whichever of `names` is a directory now, never through a symlink."""
    for name in names:
        try:
            return os.open(parent / name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
        except OSError:
            continue
    return None
