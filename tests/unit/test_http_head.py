"""The local server's request-head parser and Host check, on bytes (no sockets)."""

from __future__ import annotations

import io

import pytest

from osb_sync.local.http.head import HeadError, parse_head, read_head
from osb_sync.local.http.httpd import host_name, host_names


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("127.0.0.1:8080", "127.0.0.1"),
        ("LocalHost", "localhost"),
        ("[0:0::1]:1", "[::1]"),
        ("sandbox.internal:", "sandbox.internal"),
        ("[::1].evil.example", None),
        ("[::1]@evil.example", None),
        ("a@b", None),
        ("host:65536", None),
        ("host:1:2", None),
        ("[::1", None),
        ("", None),
    ],
)
def test_host_is_rfc_3986_host_and_port(value: str, name: str | None) -> None:
    assert host_name(value) == name


def test_host_names_normalise_the_bound_address() -> None:
    assert "[::1]" in host_names("0:0::1", ())


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET / HTTP/1.1\r\nX:  a b \r\n\r\n", None),
        (b"GET  / HTTP/1.1\r\n\r\n", 400),
        (b"GET /\x7f HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\nX : a\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX: a\x00\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n" + b"X: 1\r\n" * 101 + b"\r\n", 431),
        (b"\r\n", 400),
    ],
)
def test_parse_head(raw: bytes, status: int | None) -> None:
    if status is None:
        head = parse_head(raw)
        assert (head.method, head.target, head.fields) == ("GET", "/", (("X", "a b"),))
        return
    with pytest.raises(HeadError) as caught:
        parse_head(raw)
    assert caught.value.status == status


def test_read_head_stops_at_the_cap() -> None:
    raw = b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 100 + b"\r\n\r\n"
    assert read_head(io.BytesIO(raw + b"body"), 200) == raw
    with pytest.raises(HeadError) as caught:
        read_head(io.BytesIO(raw), 100)
    assert caught.value.status == 431


class OneByteAtATime(io.BytesIO):
    """A reader whose every readline returns at most one byte, as a trickling client's would."""

    def readline(self, size: int | None = -1, /) -> bytes:
        return super().readline(1)


def test_read_head_refuses_at_once_what_cannot_start_a_request_line() -> None:
    tls_hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"  # no newline follows
    with pytest.raises(HeadError) as caught:
        read_head(OneByteAtATime(tls_hello), 65536)  # one byte read: refused before more
    assert caught.value.status == 400
    assert read_head(io.BytesIO(b""), 100) == b""
    assert read_head(io.BytesIO(b"\r\nGET"), 100) == b"\r\n"
    assert read_head(io.BytesIO(b"\nGET"), 100) == b"\n"


@pytest.mark.parametrize("cap", [1, 15, 16, 17, 18, 19])
def test_read_head_cap_is_exact_around_the_first_line(cap: int) -> None:
    raw = b"GET / HTTP/1.1\r\n\r\n"  # 18 bytes
    if cap >= len(raw):
        assert read_head(io.BytesIO(raw), cap) == raw
        return
    with pytest.raises(HeadError) as caught:
        read_head(io.BytesIO(raw), cap)
    assert caught.value.status == 431
