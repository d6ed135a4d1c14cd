"""The disk: a sandbox's own limited filesystem (issue 22, item 7) and a full one (issue 24,
item 3): ENOSPC inside, other sandboxes and the server unharmed, uploads that fail clearly.

A root server gives each sandbox one tmpfs for all it writes (`disk.py`), its size and inodes
from `resourceLimits` (`ephemeral-storage`, `inodes`): "the disk is full" is a sandbox's own
few MiB, never the machine's. Where the server cannot mount one, these tests skip (fail under
OSB_REQUIRE_ISOLATION=1).
"""

from __future__ import annotations

import errno
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from osb_sync import Client
from osb_sync.local import LocalServer
from osb_sync.local.host import container, disk, recovery
from osb_sync.local.host.bwrap import probe
from tests.local.support import (
    CREATE_BODY,
    REQUIRE_ISOLATION,
    Box,
    local_server,
    registry_of,
    require_isolation,
    texts,
    wait_for,
)

SIZE = 8 << 20
SMALL = {**CREATE_BODY["resourceLimits"], "ephemeral-storage": "8Mi"}


def require_disk() -> None:
    """Skip where sandboxes get no tmpfs of their own (fail under OSB_REQUIRE_ISOLATION=1)."""
    require_isolation()
    if disk.mode(probe(), False) != "tmpfs":
        if REQUIRE_ISOLATION:
            pytest.fail("OSB_REQUIRE_ISOLATION=1 but this server cannot mount a sandbox tmpfs")
        pytest.skip("this server cannot mount a tmpfs per sandbox (it is not root)")


@pytest.fixture(scope="module")
def disk_server() -> Iterator[LocalServer]:
    require_disk()
    with local_server(command_grace=0, spare_containers=0) as server:
        yield server


@pytest.fixture
def small_disk(disk_server: LocalServer) -> LocalServer:
    return disk_server


def small_box(server: LocalServer, make_box: Any, **limits: str) -> Box:
    box: Box = make_box(server, resourceLimits={**SMALL, **limits})
    return box


def free(box: Box) -> int:
    stat = os.statvfs(box.dir)  # the home's link, to the sandbox's tmpfs
    return stat.f_bavail * stat.f_frsize


def staging_files(server: LocalServer) -> list[str]:
    assert server.root_dir is not None
    # a live sandbox's disk is reached through the home's link only (`_detach_disk`)
    disks = [
        Path(os.readlink(link)).parent for link in server.root_dir.iterdir() if link.is_symlink()
    ]
    return [
        str(path)
        for tree in (server.root_dir, *disks)
        for path in tree.rglob("*")
        if path.name.startswith((".osb-upload-", "upload-"))
    ]


def upload(box: Box, path: str, data: bytes) -> requests.Response:
    files = {
        "metadata": ("metadata", b'{"path": "%s"}' % path.encode(), "application/json"),
        "file": ("file", data, "application/octet-stream"),
    }
    return box.call("POST", "/files/upload", files=files, timeout=60)


def mounts_of(sandbox_id: str) -> list[str]:
    return [point for point in recovery.mount_points() if sandbox_id in point]


def still_serving(server: LocalServer, make_box: Any) -> None:
    """Another sandbox starts and runs, and the server answers."""
    other: Box = make_box(server)
    assert texts(other.command("echo fine > f && cat f")) == ["fine"]
    assert requests.get(f"{server.api_base}/sandboxes", timeout=10).status_code == 200


def test_a_write_past_the_disk_limit_gets_enospc_and_others_keep_working(
    disk_server: LocalServer, make_box: Any
) -> None:
    box = small_box(disk_server, make_box, **{"ephemeral-storage": "16Mi"})
    # one filesystem for all it writes: /tmp, /var and the home add up
    events = box.command(
        "head -c 6M /dev/zero > /tmp/a && head -c 6M /dev/zero > /var/b"
        " && head -c 6M /dev/zero > ~/c; echo exit=$?; df -k --output=size ~ | tail -1"
    )
    out, err = texts(events), "".join(texts(events, "stderr"))
    assert "No space left on device" in err, events
    assert out[0] == "exit=1" and 15 << 10 <= int(out[1]) <= 17 << 10, out
    assert free(box) < 1 << 20
    still_serving(disk_server, make_box)
    assert texts(box.command("rm /tmp/a && echo again > /tmp/d && cat /tmp/d")) == ["again"]


def test_a_file_past_the_inode_limit_gets_enospc_and_others_keep_working(
    disk_server: LocalServer, make_box: Any
) -> None:
    box = small_box(disk_server, make_box, inodes="2000")
    events = box.command(
        "mkdir many && cd many && i=0; while [ $i -lt 3000 ]; do : > f$i || break;"
        " i=$((i+1)); done; echo made=$i; df --output=itotal ~ | tail -1"
    )
    made, total = texts(events)
    assert "No space left on device" in "".join(texts(events, "stderr")), events
    assert 1500 <= int(made.removeprefix("made=")) < 2000 and int(total) == 2000, events
    still_serving(disk_server, make_box)


def test_the_default_disk_is_1gib_and_100000_inodes_and_the_status_says_so(
    disk_server: LocalServer, make_box: Any
) -> None:
    box: Box = make_box(disk_server)
    events = box.command("df -k --output=size,itotal /tmp | tail -1")
    size, inodes = texts(events)[0].split()
    assert int(size) == 1 << 20 and int(inodes) == 100_000
    message = box.created["status"]["message"]
    enforced = message.split("Limits enforced: ")[1].split("; not enforced")[0]
    assert "ephemeral-storage=1Gi (tmpfs" in enforced and "inodes=100000 (tmpfs)" in enforced


def test_a_spare_gets_the_disk_its_create_asks_for(make_box: Any) -> None:
    require_disk()
    with local_server(command_grace=0, spare_containers=1) as server:
        assert wait_for(lambda: registry_of(server).spares.ready(), 60)
        box = small_box(server, make_box, **{"ephemeral-storage": "24Mi"}, inodes="3000")
        assert registry_of(server).spares.claimed == 1
        events = box.command("df -k --output=size,itotal ~ | tail -1")
        assert texts(events)[0].split() == [str(24 << 10), "3000"]


def test_delete_leaves_no_mount_and_no_link(disk_server: LocalServer, make_box: Any) -> None:
    box = small_box(disk_server, make_box)
    assert os.path.islink(box.dir)
    assert os.statvfs(box.dir).f_blocks * os.statvfs(box.dir).f_frsize == SIZE  # its own
    assert box.http.delete(f"{disk_server.api_base}/sandboxes/{box.id}").status_code == 204
    assert mounts_of(box.id) == []
    assert not os.path.lexists(box.dir) and not os.path.lexists(f"{box.dir}.run")


def test_a_container_that_cannot_be_made_leaves_no_mount_and_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A descriptor refused after the disk is mounted (EMFILE at the server's limit): the
    tmpfs is unmounted and the directories removed (a mount left there outlived the server,
    which could then remove neither it nor, for want of its lock file, reap it later)."""
    require_disk()

    class NoSockets:
        AF_UNIX, SOCK_STREAM = socket.AF_UNIX, socket.SOCK_STREAM

        @staticmethod
        def socket(*_: object) -> socket.socket:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(container, "socket", NoSockets)
    sandbox_id = str(uuid.uuid4())
    with pytest.raises(OSError, match="Too many open files"):
        container.SandboxContainer(sandbox_id, tmp_path, probe())
    assert mounts_of(sandbox_id) == []
    assert os.listdir(tmp_path) == []


def test_a_stopping_server_detaches_a_mount_left_below_its_directory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whatever leaves one (a container that lost track of its disk): the server's stop
    detaches it before it removes its directory, and says so."""
    require_disk()
    server = local_server(spare_containers=0).start()
    assert server.root_dir is not None
    left = server.root_dir / f"{uuid.uuid4()}.run" / disk.MOUNT_DIR
    left.mkdir(parents=True)
    disk.mount(left, 1 << 20, 64, 0)
    server.stop()
    assert [p for p in recovery.mount_points() if p.startswith(str(server.root_dir))] == []
    assert not server.root_dir.exists()
    assert "1 mounts were left below" in caplog.text


def test_commands_still_report_their_output_on_a_full_disk(
    small_disk: LocalServer, make_box: object
) -> None:
    box = small_box(small_disk, make_box)
    filled = box.command("head -c 20M /dev/zero > fill")
    assert [e for e in filled if e["type"] == "error"], filled  # the disk is full now
    assert free(box) < 64 << 10
    events = box.command("echo hello; echo oops >&2")
    assert texts(events) == ["hello"] and texts(events, "stderr") == ["oops"]
    assert not [e for e in events if e["type"] == "error"]
    failing = box.command("echo more > other.txt")
    (error,) = [e for e in events + failing if e["type"] == "error"]
    assert "No space left on device" in "".join(texts(failing, "stderr"))
    assert error["error"]["evalue"] == "1"


def test_background_commands_keep_their_output_on_a_full_disk(small_disk: LocalServer) -> None:
    with (
        Client(api_base=small_disk.api_base) as client,
        client.create_sandbox(resource_limits=SMALL) as sandbox,
    ):
        filled = sandbox.commands.run("head -c 20M /dev/zero > fill")
        assert filled.exit_code != 0, filled  # the disk is full now
        assert small_disk.root_dir is not None
        stat = os.statvfs(small_disk.root_dir / sandbox.id)
        assert stat.f_bavail * stat.f_frsize < 64 << 10
        command = sandbox.commands.start("echo hello; echo oops >&2; seq 1 3000")
        status = command.wait(timeout=30, poll_interval=0.05)
        text, cursor = command.logs()
        expected = "hello\noops\n" + "".join(f"{n}\n" for n in range(1, 3001))
        assert (status.exit_code, text) == (0, expected)
        assert cursor == len(expected)
        assert command.logs(cursor) == ("", cursor)


def test_an_upload_that_does_not_fit_fails_clearly_and_leaves_no_staging_file(
    small_disk: LocalServer, make_box: object
) -> None:
    box = small_box(small_disk, make_box)
    before = free(box)
    answer = upload(box, "big.bin", os.urandom(12 << 20))
    assert answer.status_code == 500
    assert "No space left on device" in answer.json()["message"]
    assert "disk is full" in answer.json()["message"]
    assert staging_files(small_disk) == []
    assert free(box) >= before - (256 << 10)  # the room is back
    still_serving(small_disk, make_box)


def test_an_upload_is_renamed_into_place_not_copied(
    small_disk: LocalServer, make_box: object
) -> None:
    # 5 MiB on an 8 MiB disk: a copy from a staging area would need 10.
    box = small_box(small_disk, make_box)
    data = os.urandom(5 << 20)
    answer = upload(box, "dir/five.bin", data)
    assert answer.status_code == 200, answer.text
    got = box.call("GET", "/files/download", params={"path": "dir/five.bin"}, timeout=60)
    assert got.content == data
    assert staging_files(small_disk) == []


def test_an_upload_whose_body_breaks_leaves_no_staging_file(
    small_disk: LocalServer, make_box: object
) -> None:
    box = small_box(small_disk, make_box)
    boundary = "osbboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="metadata"; filename="m"\r\n\r\n'
        f'{{"path": "cut.bin"}}\r\n--{boundary}\r\n'
        'Content-Disposition: form-data; name="file"; filename="f"\r\n\r\n'
    ).encode()
    endpoint = box.base.removeprefix("http://")
    host, _, rest = endpoint.partition("/")
    address, port = host.rsplit(":", 1)
    length = len(head) + (4 << 20)
    request = (
        f"POST /{rest}/files/upload HTTP/1.1\r\nHost: {host}\r\n"
        f"X-EXECD-ACCESS-TOKEN: {box.headers['X-EXECD-ACCESS-TOKEN']}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()
    with socket.create_connection((address, int(port))) as sock:
        sock.sendall(request + head + b"x" * (2 << 20))
        time.sleep(0.5)
        assert staging_files(small_disk), "the part was not being staged"
    assert wait_for(lambda: staging_files(small_disk) == [], 15), staging_files(small_disk)


def test_live_sandboxes_leave_no_mount_in_the_server_namespace(
    disk_server: LocalServer, make_box: Any
) -> None:
    """Every bwrap copies the mount table it starts from (bwrap 0.8 reads it again after each
    bind): a sandbox's disk kept mounted there made each start slower by every live sandbox
    (issue 50). Once up, its disk is the sandbox's namespace's only; the server still reaches
    it (the home's link), and the disk keeps its limit."""
    assert disk_server.root_dir is not None
    root = str(disk_server.root_dir)
    boxes = [small_box(disk_server, make_box) for _ in range(4)]
    assert [point for point in recovery.mount_points() if point.startswith(root)] == []
    for box in boxes:
        assert mounts_of(box.id) == []
        assert texts(
            box.command("echo x > ~/f && df -k --output=size ~ | tail -1 | tr -d ' '")
        ) == [str(SIZE >> 10)]
        assert Path(box.dir, "f").read_text() == "x\n"  # the host's way in
        assert free(box) <= SIZE


def test_delete_frees_the_disk(disk_server: LocalServer, make_box: Any) -> None:
    """The server's descriptor of a sandbox's detached disk closes with its delete: nothing
    of the server still holds that filesystem (its memory is freed with the namespace)."""
    box = small_box(disk_server, make_box)
    device = os.stat(box.dir).st_dev

    def held() -> list[str]:
        found = []
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.stat(f"/proc/self/fd/{name}").st_dev == device:
                    found.append(name)
            except OSError:
                continue
        return found

    assert box.http.delete(f"{disk_server.api_base}/sandboxes/{box.id}").status_code == 204
    assert wait_for(lambda: held() == [], 10), held()
