"""execd file routes of the local server: multipart upload, ranged download, file operations."""

from __future__ import annotations

import http.client
import json
import os
import uuid
from pathlib import Path
from urllib.parse import unquote_to_bytes

from tests.local.support import Box


def upload(box: Box, path: str, data: bytes, mode: int | None = None) -> int:
    meta = {"path": path, **({"mode": mode} if mode else {})}
    files = [
        ("metadata", ("metadata", json.dumps(meta), "application/json")),
        ("file", ("blob", data, "application/octet-stream")),
    ]
    status: int = box.call("POST", "/files/upload", files=files).status_code
    return status


def test_upload_download_round_trip(box: Box) -> None:
    data = os.urandom(300_000) + b"\r\n--not-a-boundary\r\n"
    assert upload(box, "dir/a.bin", data, mode=600) == 200
    assert Path(f"{box.dir}/dir/a.bin").read_bytes() == data
    whole = box.call("GET", "/files/download", params={"path": "dir/a.bin"})
    assert (whole.status_code, whole.content) == (200, data)
    assert whole.headers["Content-Type"] == "application/octet-stream"
    part = box.call(
        "GET", "/files/download", params={"path": "dir/a.bin"}, headers={"Range": "bytes=10-19"}
    )
    assert (part.status_code, part.content) == (206, data[10:20])
    assert part.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
    suffix = box.call(
        "GET", "/files/download", params={"path": "dir/a.bin"}, headers={"Range": "bytes=-5"}
    )
    assert suffix.content == data[-5:]
    bad = box.call(
        "GET", "/files/download", params={"path": "dir/a.bin"}, headers={"Range": "bytes=999999-"}
    )
    assert bad.status_code == 416
    # Real execd answers as Go's net/http does: plain text, not a JSON error.
    assert (bad.text, bad.headers["Content-Range"]) == (
        "invalid range: failed to overlap\n",
        f"bytes */{len(data)}",
    )
    # (For a malformed range real execd sends a 416 whose promised body never comes.)
    reversed_range = box.call(
        "GET", "/files/download", params={"path": "dir/a.bin"}, headers={"Range": "bytes=9-3"}
    )
    assert (reversed_range.status_code, reversed_range.text) == (416, "invalid range\n")
    missing = box.call("GET", "/files/download", params={"path": "nope"})
    assert (missing.status_code, missing.json()["code"]) == (404, "FILE_NOT_FOUND")
    info = box.call("GET", "/files/info", params={"path": "dir/a.bin"}).json()["dir/a.bin"]
    assert info["mode"] == 600 and info["type"] == "file" and info["size"] == len(data)
    assert info["path"] == f"{box.home}/dir/a.bin"
    assert info["modified_at"].endswith("Z") and info["owner"]


def test_download_of_any_name_carries_it_in_filename_star(box: Box) -> None:
    """Issue 49: a name that is not plain ASCII was a 502 (UnicodeEncodeError in the head),
    and one with a newline split the answer's head."""
    for name in ["файл.txt", "文件.txt", 'a"b\\c;d', "new\nline\r\nX-Evil: 1"]:
        Path(box.dir, name).write_bytes(name.encode())
        got = box.call("GET", "/files/download", params={"path": name})
        assert (got.status_code, got.content) == (200, name.encode())
        assert "x-evil" not in got.headers
        disposition = got.headers["Content-Disposition"]
        assert disposition.isascii() and "\n" not in disposition
        encoded = disposition.split("filename*=UTF-8''", 1)[1]
        assert unquote_to_bytes(encoded) == name.encode()
    Path(box.dir, "plain.txt").write_bytes(b"p")
    plain = box.call("GET", "/files/download", params={"path": "plain.txt"})
    assert plain.headers["Content-Disposition"] == 'attachment; filename="plain.txt"'


def test_upload_several_files_absolute_path(box: Box) -> None:
    target = f"{box.home}/abs/b.txt"
    files = [
        ("metadata", ("metadata", json.dumps({"path": "one.txt"}), "application/json")),
        ("file", ("one", b"1", "text/plain")),
        ("metadata", ("metadata", json.dumps({"path": target}), "application/json")),
        ("file", ("two", b"2", "text/plain")),
    ]
    assert box.call("POST", "/files/upload", files=files).status_code == 200
    assert Path(f"{box.dir}/one.txt").read_text() == "1"
    assert Path(f"{box.dir}/abs/b.txt").read_text() == "2"


def test_upload_validation(box: Box) -> None:
    plain_field = box.call(
        "POST",
        "/files/upload",
        data={"metadata": json.dumps({"path": "x"})},
        files={"file": ("f", b"x")},
    )
    assert (plain_field.status_code, plain_field.json()["code"]) == (400, "INVALID_FILE_METADATA")
    unpaired = box.call(
        "POST",
        "/files/upload",
        files=[
            ("metadata", ("m", json.dumps({"path": "x"}))),
            ("metadata", ("m", json.dumps({"path": "y"}))),
        ],
    )
    assert (unpaired.status_code, unpaired.json()["code"]) == (400, "INVALID_FILE")
    empty_path = box.call(
        "POST",
        "/files/upload",
        files=[("metadata", ("m", json.dumps({"path": ""}))), ("file", ("f", b"x"))],
    )
    assert empty_path.json()["code"] == "INVALID_FILE_METADATA"
    assert box.call("POST", "/files/upload", data=b"x").status_code == 400


def test_chunked_upload(box: Box) -> None:
    boundary = uuid.uuid4().hex
    disposition = "Content-Disposition: form-data; name="
    body = (
        f'--{boundary}\r\n{disposition}"metadata"; filename="metadata"\r\n\r\n'
        f'{{"path": "chunked.txt"}}\r\n--{boundary}\r\n'
        f'{disposition}"file"; filename="f"\r\n\r\nhello chunks\r\n--{boundary}--\r\n'
    ).encode()
    host, _, rest = box.base.removeprefix("http://").partition("/")
    conn = http.client.HTTPConnection(host, timeout=10)
    conn.request(
        "POST",
        f"/{rest}/files/upload",
        body=iter([body[:50], body[50:90], body[90:]]),
        headers={**box.headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
        encode_chunked=True,
    )
    assert conn.getresponse().status == 200
    conn.close()
    assert Path(f"{box.dir}/chunked.txt").read_text() == "hello chunks"


def test_file_operations(box: Box) -> None:
    assert box.call("POST", "/directories", json={"d/e": {"mode": 700}}).status_code == 200
    assert oct(os.stat(f"{box.dir}/d/e").st_mode & 0o777) == "0o700"
    for name in ("d/x.py", "d/e/y.py", "d/z.txt"):
        upload(box, name, b"print('old old')")
    listed = box.call("GET", "/directories/list", params={"path": "d", "depth": 1}).json()
    assert [os.path.basename(f["path"]) for f in listed] == ["e", "x.py", "z.txt"]
    deep = box.call("GET", "/directories/list", params={"path": "d", "depth": 2}).json()
    assert len(deep) == 4
    found = box.call("GET", "/files/search", params={"path": "d", "pattern": "*.py"}).json()
    assert sorted(os.path.basename(f["path"]) for f in found) == ["x.py", "y.py"]
    assert box.call("GET", "/files/search", params={"path": "missing"}).status_code == 404
    info = box.call("GET", "/files/info", params=[("path", "d/x.py"), ("path", "d/e")]).json()
    assert info["d/e"]["type"] == "directory" and info["d/e"]["mode"] == 700
    assert (
        box.call("GET", "/files/info", params={"path": "nope"}).json()["code"] == "FILE_NOT_FOUND"
    )
    moved = box.call("POST", "/files/mv", json=[{"src": "d/x.py", "dest": "d/new/x2.py"}])
    assert moved.status_code == 200 and os.path.exists(f"{box.dir}/d/new/x2.py")
    replaced = box.call(
        "POST",
        "/files/replace",
        params={"verbose": "true"},
        json={"d/z.txt": {"old": "old", "new": "new"}},
    )
    assert replaced.json() == {"d/z.txt": {"replacedCount": 2}}
    assert Path(f"{box.dir}/d/z.txt").read_text() == "print('new new')"
    assert (
        box.call("POST", "/files/replace", json={"d/z.txt": {"old": "", "new": "x"}}).status_code
        == 400
    )
    assert (
        box.call("POST", "/files/permissions", json={"d/z.txt": {"mode": 640}}).status_code == 200
    )
    assert oct(os.stat(f"{box.dir}/d/z.txt").st_mode & 0o777) == "0o640"
    assert (
        box.call("DELETE", "/files", params=[("path", "d/z.txt"), ("path", "never")]).status_code
        == 200
    )
    assert not os.path.exists(f"{box.dir}/d/z.txt")
    assert box.call("DELETE", "/files", params={"path": "d/e"}).status_code == 500
    assert box.call("DELETE", "/directories", params={"path": "d"}).status_code == 200
    assert not os.path.exists(f"{box.dir}/d")


def test_os_errors_become_runtime_errors(box: Box) -> None:
    upload(box, "plain.txt", b"x")
    answer = box.call("POST", "/directories", json={"plain.txt/sub": {}})
    assert (answer.status_code, answer.json()["code"]) == (500, "RUNTIME_ERROR")
    assert box.call("GET", "/ping").status_code == 200  # the connection is still usable


def test_line_download_as_execd_1_1_1(box: Box) -> None:
    """Issue 45 (#1030): offset/limit pick lines, ends stripped, joined by LF; hostile values
    are 400s naming the parameter; a line longer than a read is never held whole."""
    assert upload(box, "lines.txt", b"original\r\nsecond line\n\nfourth\nlast") == 200
    long_line = b"y" * 300_000 + b"\r" + b"z" * 70_000 + b"\r\n"
    assert upload(box, "long.txt", long_line + b"after\n") == 200

    def lines(path: str, **query: object) -> tuple[int, str]:
        answer = box.call("GET", "/files/download", params={"path": path, **query})
        return answer.status_code, answer.text

    assert lines("lines.txt", offset=2, limit=1) == (200, "second line")
    assert lines("lines.txt", offset=1) == (200, "original\nsecond line\n\nfourth\nlast")
    assert lines("lines.txt", limit=1) == (200, "original")
    assert lines("lines.txt", offset=99) == (200, "")
    assert lines("long.txt", limit=1) == (200, long_line[:-2].decode())
    assert lines("long.txt", offset=2) == (200, "after")
    typed = box.call("GET", "/files/download", params={"path": "lines.txt", "offset": 1})
    assert typed.headers["Content-Type"] == "text/plain; charset=utf-8"
    for name, value in (("offset", "0"), ("limit", "-1"), ("offset", "x"), ("limit", "9" * 30)):
        status, text = lines("lines.txt", **{name: value})
        assert status == 400 and f"invalid query parameter '{name}'" in text, text
    ranged = box.call(
        "GET",
        "/files/download",
        params={"path": "lines.txt", "offset": 1},
        headers={"Range": "bytes=0-1"},
    )
    assert ranged.status_code == 400 and "mutually exclusive" in ranged.text
