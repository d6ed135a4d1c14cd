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
