"""Fuzzing the live server with request lines, headers and JSON bodies (bounded, derandomized).

Whatever arrives, the server answers with a complete, well-framed response that is not a 500,
and its memory stays bounded. Only routes that cannot touch the host are fuzzed: no command,
code run, or file write (absolute paths reach the host's file system).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from osb_sync.local import LocalServer
from tests.local.rawhttp import read_answer
from tests.local.support import CREATE_BODY, local_server

PAGE = os.sysconf("SC_PAGE_SIZE")
TOKEN_CHARS = st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":")
HEADER_VALUE = st.text(
    st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"), max_size=40
)
NUMBERS = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "9" * 5000]),
)
JSON_LEAVES = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=20))
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
PATHS = [
    "/health",
    "/v1/sandboxes",
    "/sandboxes",
    "/v1/sandboxes/{id}",
    "/v1/sandboxes/{other}",
    "/v1/sandboxes/{id}/renew-expiration",
    "/v1/sandboxes/{id}/metadata",
    "/v1/sandboxes/{id}/endpoints/{port}",
    "/v1/sandboxes/{id}/proxy/{port}/ping",
    "/sandboxes/{id}/proxy/44772/code/context",
    "/sandboxes/{id}/proxy/44772/code/contexts",
    "/sandboxes/{id}/proxy/44772/files/info",
    "/sandboxes/{id}/proxy/44772/command/status/{other}",
    "/metrics/events",
]


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def encode(value: Any) -> bytes:
    """JSON text, with the special number strings written bare (NaN, 1e400, ...)."""
    text = json.dumps(value)
    for bare in ("NaN", "Infinity", "-Infinity", "1e400", "9" * 5000):
        text = text.replace(f'"{bare}"', bare)
    return text.encode()


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["none", "json", "create", "raw"]))
    if kind == "none":
        return b""
    if kind == "raw":
        return draw(st.binary(max_size=64))
    if kind == "json":
        return encode(draw(JSON_VALUES))
    fields = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "timeout": NUMBERS,
                "env": st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
                "metadata": st.dictionaries(st.text(max_size=4), JSON_LEAVES, max_size=2),
                "entrypoint": JSON_VALUES,
                "image": JSON_VALUES,
                "expiresAt": JSON_VALUES,
            },
        )
    )
    return encode({**CREATE_BODY, **fields})


@st.composite
def requests_bytes(draw: st.DrawFn, sandbox_id: str, token: str, port: int) -> bytes:
    method = draw(
        st.one_of(
            st.sampled_from(["GET", "POST", "POST", "POST", "PATCH", "PUT", "HEAD", "OPTIONS"]),
            st.text(TOKEN_CHARS, min_size=1, max_size=8),
        )
    )
    template = draw(st.sampled_from(PATHS))
    path = template.format(
        id=sandbox_id,
        other=draw(st.text(TOKEN_CHARS.filter(lambda c: c not in "/?#%"), min_size=1)),
        port=draw(st.sampled_from(["44772", "0", "65536", "83746", "9" * 300, "-1", "x"])),
    )
    query = draw(st.sampled_from(["", "?path=.", "?path=%00", "?page=" + "9" * 5000, "?x"]))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/9.9", "JUNK"]))
    body = draw(bodies())
    headers = {
        "Host": draw(st.sampled_from([f"127.0.0.1:{port}", "localhost", "evil.example"])),
        "X-EXECD-ACCESS-TOKEN": token,
        "Content-Type": draw(
            st.sampled_from(["application/json", "text/plain", "application/json; x=y"])
        ),
        "Content-Length": str(len(body)),
    }
    extra = draw(st.dictionaries(st.text(TOKEN_CHARS, min_size=1, max_size=12), HEADER_VALUE))
    framing = draw(st.sampled_from(["plain", "plain", "negative", "chunked", "junk"]))
    if framing == "negative":
        headers["Content-Length"] = "-1"
    elif framing == "junk":
        headers["Content-Length"] = draw(HEADER_VALUE)
    elif framing == "chunked":
        del headers["Content-Length"]
        headers["Transfer-Encoding"] = "chunked"
        size = draw(st.sampled_from([f"{len(body):x}", "-1", "zz", "f" * 20]))
        body = f"{size}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    lines = [f"{method} {path}{query} {version}"]
    lines += [f"{k}: {v}" for k, v in {**extra, **headers}.items()]
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[tuple[LocalServer, str, str]]:
    with local_server(command_grace=0, unenforced_network_policy="accept") as server:
        created = requests.post(f"{server.api_base}/sandboxes", json=CREATE_BODY, timeout=30)
        sandbox_id = created.json()["id"]
        endpoint = requests.get(
            f"{server.api_base}/sandboxes/{sandbox_id}/endpoints/44772", timeout=30
        ).json()
        yield server, sandbox_id, endpoint["headers"]["X-EXECD-ACCESS-TOKEN"]


def test_fuzzed_requests_never_get_a_500(fuzzed: tuple[LocalServer, str, str]) -> None:
    server, sandbox_id, token = fuzzed
    before = rss()
    statuses: set[int] = set()

    @settings(
        max_examples=400,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(requests_bytes(sandbox_id, token, server.port))
    def one(raw: bytes) -> None:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(raw)
            try:
                answer = read_answer(sock, head=raw.startswith(b"HEAD "))
            except AssertionError:
                if b" HTTP/1." in raw.split(b"\r\n", 1)[0]:
                    raise  # a well-formed request line must get a complete answer
                return  # http.server answers other versions the HTTP/0.9 way, or closes
        statuses.add(answer.status)
        assert answer.status < 500 or answer.status in (501, 502, 505), (answer, raw[:300])

    one()
    assert statuses & {200, 202} and statuses & {400, 421, 422}  # the fuzz reached both
    assert rss() - before < 64 << 20
    assert requests.get(f"{server.base_url}/health", timeout=10).status_code == 200
