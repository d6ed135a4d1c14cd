"""Header values of the local server's answers (issue 49): a file's name in
`Content-Disposition` as RFC 6266/8187 says, and no header that could split an answer's head.

A name is whatever bytes a file system allows (everything but `/` and NUL): it reaches the head
only percent-encoded, or as an ASCII fallback of visible characters. And the HTTP layer itself
refuses to send a header whose value holds CR, LF, NUL or another control character (or whose
name is not a token), whoever set it: the answer is a 500, its head never split.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from urllib.parse import unquote_to_bytes

import pytest

from osb_sync.local.execd.filesystem import attachment
from osb_sync.local.http.exchange import Exchange
from osb_sync.local.http.httpd import HTTPServer, Limits, host_names

NAMES = [
    "файл.txt".encode(),
    "文件 名.txt".encode(),
    b'q"uote',
    b"back\\slash",
    b"semi;colon=1; filename=evil",
    b"new\nline\r\nSet-Cookie: x=1",
    b"tab\there",
    b"\xff\xfeinvalid utf-8",
    b"100%.txt",
    b"comma,name",
]
VISIBLE = set(range(0x20, 0x7F))


def test_a_plain_name_keeps_execds_header() -> None:
    for plain in ("report-2024.tar.gz", "a b.txt", "it's (1).txt"):
        assert attachment(plain.encode()) == f'attachment; filename="{plain}"'


@pytest.mark.parametrize("name", NAMES, ids=repr)
def test_any_name_is_carried_whole_in_visible_ascii(name: bytes) -> None:
    value = attachment(name)
    assert set(value.encode("ascii")) <= VISIBLE  # no CR, LF, NUL, tab or other control
    kind, fallback, extended = (part.strip() for part in value.split(";"))
    assert kind == "attachment"
    # The fallback is a quoted-string of plain characters: nothing inside needs unquoting.
    assert fallback.startswith('filename="') and fallback.endswith('"')
    inner = fallback[len('filename="') : -1]
    assert not set(inner) & set('"\\%;,')
    assert len(inner) == len(name.decode("utf-8", "replace"))
    # RFC 8187 ext-value: exactly the name's bytes, percent-encoded.
    assert extended.startswith("filename*=UTF-8''")
    encoded = extended[len("filename*=UTF-8''") :]
    assert not set(encoded) & set(" ;\"'\\,")
    assert unquote_to_bytes(encoded) == name


def serve(route: Callable[[Exchange], None]) -> Iterator[int]:
    server = HTTPServer(("127.0.0.1", 0), route, Limits(), host_names("127.0.0.1", ()))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def raw_answer(port: int) -> bytes:
    request = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


HOSTILE = [
    ("X-Name", "a\r\nSet-Cookie: evil=1"),
    ("X-Name", "a\nSet-Cookie: evil=1"),
    ("X-Name", "a\rSet-Cookie: evil=1"),
    ("X-Name", "a\0b"),
    ("X-Name", "a\x1bb"),
    ("X-Name", "файл"),  # not Latin-1: http.server would raise half-way through the head
    ("X-Name\r\nSet-Cookie", "evil=1"),
    ("X Name", "a"),
]


@pytest.mark.parametrize(("name", "value"), HOSTILE, ids=repr)
@pytest.mark.parametrize("how", ["exchange", "handler"])
def test_a_header_that_could_split_the_head_fails_closed(name: str, value: str, how: str) -> None:
    def route(ex: Exchange) -> None:
        if how == "exchange":
            ex.send(200, b"ok", {name: value})
        else:  # past Exchange: the handler itself refuses
            ex.handler.send_response(200)
            ex.handler.send_header(name, value)
            ex.handler.send_header("Content-Length", "2")
            ex.handler.end_headers()
            ex.handler.wfile.write(b"ok")

    for port in serve(route):
        data = raw_answer(port)
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"evil" not in data and b"\r\n\r\nok" not in data
    for line in head.split(b"\r\n"):
        assert b"\n" not in line and b"\r" not in line and b"\0" not in line
    if how == "exchange":  # refused before the status line: a clean 500
        assert head.startswith(b"HTTP/1.1 500 ") and b"internal error" in body
    else:  # the status line was buffered, never sent with a bad header: nothing, or a 500
        assert data == b"" or head.startswith(b"HTTP/1.1 500 ")
