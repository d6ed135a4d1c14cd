"""The disk (issue 24, item 3): a full disk, broken uploads, and uploads renamed, not copied.

The server's state directory is a small tmpfs mounted for the test, so "the disk is full" is
this test's own 8 MiB, never the machine's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from conftest import Box, require_isolation, texts, wait_for

from osb_sync import Client
from osb_sync.local import LocalServer

SIZE = 8 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[LocalServer]:
    require_isolation()
    state = tmp_path / "state"
    state.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "osb-disk-test", str(state)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        with LocalServer(root_dir=state, command_grace=0, spare_containers=0) as server:
            yield server
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def free(server: LocalServer) -> int:
    assert server.root_dir is not None
    stat = os.statvfs(server.root_dir)
    return stat.f_bavail * stat.f_frsize


def staging_files(server: LocalServer) -> list[str]:
    assert server.root_dir is not None
    return [
        str(path)
        for path in server.root_dir.rglob("*")
        if path.name.startswith((".osb-upload-", "upload-"))
    ]


def upload(box: Box, path: str, data: bytes) -> requests.Response:
    files = {
        "metadata": ("metadata", b'{"path": "%s"}' % path.encode(), "application/json"),
        "file": ("file", data, "application/octet-stream"),
    }
    return box.call("POST", "/files/upload", files=files, timeout=60)


def test_commands_still_report_their_output_on_a_full_disk(
    small_disk: LocalServer, make_box: object
) -> None:
    box: Box = make_box(small_disk)  # type: ignore[operator]
    filled = box.command("head -c 20M /dev/zero > fill")
    assert [e for e in filled if e["type"] == "error"], filled  # the disk is full now
    assert free(small_disk) < 64 << 10
    events = box.command("echo hello; echo oops >&2")
    assert texts(events) == ["hello"] and texts(events, "stderr") == ["oops"]
    assert not [e for e in events if e["type"] == "error"]
    failing = box.command("echo more > other.txt")
    (error,) = [e for e in events + failing if e["type"] == "error"]
    assert "No space left on device" in "".join(texts(failing, "stderr"))
    assert error["error"]["evalue"] == "1"


def test_background_commands_keep_their_output_on_a_full_disk(small_disk: LocalServer) -> None:
    with Client(api_base=small_disk.api_base) as client, client.create_sandbox() as sandbox:
        filled = sandbox.commands.run("head -c 20M /dev/zero > fill")
        assert filled.exit_code != 0, filled  # the disk is full now
        assert free(small_disk) < 64 << 10
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
    box: Box = make_box(small_disk)  # type: ignore[operator]
    before = free(small_disk)
    answer = upload(box, "big.bin", os.urandom(12 << 20))
    assert answer.status_code == 500
    assert "disk is full" in answer.json()["message"]
    assert staging_files(small_disk) == []
    assert free(small_disk) >= before - (256 << 10)  # the room is back


def test_an_upload_is_renamed_into_place_not_copied(
    small_disk: LocalServer, make_box: object
) -> None:
    # 5 MiB on an 8 MiB disk: a copy from a staging area would need 10.
    box: Box = make_box(small_disk)  # type: ignore[operator]
    data = os.urandom(5 << 20)
    answer = upload(box, "dir/five.bin", data)
    assert answer.status_code == 200, answer.text
    got = box.call("GET", "/files/download", params={"path": "dir/five.bin"}, timeout=60)
    assert got.content == data
    assert staging_files(small_disk) == []


def test_an_upload_whose_body_breaks_leaves_no_staging_file(
    small_disk: LocalServer, make_box: object
) -> None:
    box: Box = make_box(small_disk)  # type: ignore[operator]
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
