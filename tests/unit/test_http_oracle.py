"""The local server's request parsing against an oracle: h11, fed the same bytes.

A differential fuzz (hypothesis, derandomized, a fixed number of examples): each input is a
request, near-valid by construction and then mutated. Both sides say whether they accept it
and, if so, how they frame it (method, target, version, headers, body, the bytes left for the
next request, keep-alive). Where they differ, the difference must be one of `DIVERGENCES`,
each in the stricter direction (we refuse what h11 takes), never the reverse:

- an HTTP version other than 1.0 and 1.1: h11 parses any `d.d`; we answer 505 (RFC 9110 6.2:
  a server may refuse a major version it does not serve);
- HTTP/1.0 without `Host`: h11 takes it (Host is mandatory in 1.1 only); we need a Host on
  every request (the DNS-rebinding check);
- obs-fold: h11 unfolds; we refuse, as RFC 9112 5.2 allows;
- a control character (other than NUL, CR, LF, HTAB, VT, FF) or DEL in a header value: h11's
  `[^\\x00\\s]` takes it; RFC 9110 5.5 does not, nor do we (values are forwarded upstream);
- `Content-Length: 5, 5`, or over 18 digits: h11 folds equal lists and takes 20 digits; we
  refuse a list (RFC 9110 8.6 allows either) and lengths past 10^18 bytes;
- `Transfer-Encoding` with `Content-Length`: h11 lets TE win; we refuse the pair (RFC 9112
  6.1 allows it; it is the request-smuggling shape);
- a chunk size over 15 hex digits, or a CR in a chunk extension: h11 takes 20 digits and
  any byte but LF; we refuse both;
- more than 100 header lines: h11 has no count limit (only a size); we answer 431;
- HTTP/1.0 with `Connection: keep-alive`: h11 never keeps a 1.0 connection; we keep it, as
  `http.server` does (only keep-alive differs; the framing is the same).

Runs in its own tox env (`tox -e httpfuzz`, marker `httpfuzz`; plain pytest skips it).
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from osb_sync.local.http.exchange import BodyReader, HttpError, body_framing
from osb_sync.local.http.head import HeadError, is_complete, parse_head, read_head
from osb_sync.local.http.httpd import message

h11 = pytest.importorskip("h11")

pytestmark = pytest.mark.httpfuzz

MAX_HEAD = 64 * 1024
EXAMPLES = 3000


@dataclass(frozen=True)
class Framed:
    """What a parser made of an accepted request."""

    method: bytes
    target: bytes
    version: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    rest: bytes
    keep_alive: bool


FRAMING = (b"content-length", b"transfer-encoding")


def comparable(headers: Iterable[tuple[bytes, bytes]]) -> tuple[tuple[bytes, bytes], ...]:
    """The headers, but those of the framing with one entry each, as h11 normalises them.

    (Their effect is compared through the body and the bytes left over.)
    """
    pairs = list(headers)
    kept = [(k, v) for k, v in pairs if k not in FRAMING]
    framing = {(k, v.lower()) for k, v in pairs if k in FRAMING}
    return (*kept, *sorted(framing))


def ours(data: bytes) -> Framed | None:
    """Our verdict: the framed request, or None when the server refuses it."""
    stream = io.BytesIO(data)
    try:
        block = read_head(stream, MAX_HEAD)
        if not is_complete(block):
            return None
        head = parse_head(block)
        if len(head.values("Host")) != 1:
            return None
        length, chunked = body_framing(message(head))
        body = BodyReader(stream, length, chunked).read()  # type: ignore[arg-type]
    except (HeadError, HttpError):
        return None
    return Framed(
        head.method.encode(),
        head.target.encode(),
        head.version.encode(),
        comparable((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in head.fields),
        body,
        stream.read(),
        head.keep_alive,
    )


def theirs(data: bytes) -> Framed | None:
    """h11's verdict on the same bytes (then end of input)."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    conn.receive_data(data)
    conn.receive_data(b"")
    try:
        request = conn.next_event()
        if not isinstance(request, h11.Request):
            return None
        body = b""
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                return None
    except h11.RemoteProtocolError:
        return None
    return Framed(
        bytes(request.method),
        bytes(request.target),
        bytes(request.http_version),
        comparable((bytes(k), bytes(v)) for k, v in request.headers),
        body,
        bytes(conn.trailing_data[0]),
        conn.their_state is not h11.MUST_CLOSE,
    )


CTL_IN_VALUE = re.compile(rb"[\x01-\x08\x0e-\x1f\x7f]")


def divergence(data: bytes, framed: Framed) -> str | None:
    """Which listed divergence explains our refusing what h11 accepted as `framed`."""
    head = data.split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]
    names = [name for name, _ in framed.headers]
    if framed.version not in (b"1.0", b"1.1"):
        return "version"
    if framed.version == b"1.0" and b"host" not in names:
        return "HTTP/1.0 without Host"
    if re.search(rb"\n[ \t]", head):
        return "obs-fold"
    if any(CTL_IN_VALUE.search(value) for _, value in framed.headers):
        return "control character in a value"
    lengths = [value for name, value in framed.headers if name == b"content-length"]
    if re.search(rb"(?im)^content-length:[^\n]*,", head) or any(len(v) > 18 for v in lengths):
        return "Content-Length list or size"
    if lengths and b"transfer-encoding" in names:
        return "Transfer-Encoding with Content-Length"
    if b"transfer-encoding" in names and re.search(
        rb"(?:^|\n)(?:[0-9A-Fa-f]{16,}|[0-9A-Fa-f]+;[^\n]*\r[^\n])", data[len(head) :]
    ):
        return "chunk size or extension"
    if len(framed.headers) > 100:
        return "header count"
    return None


def compare(data: bytes) -> None:
    """Assert that we and h11 agree on `data`, or differ only as listed (we are stricter)."""
    mine, oracle = ours(data), theirs(data)
    if mine == oracle:
        return
    assert mine is not None or oracle is not None
    assert oracle is not None, f"we accept what h11 refuses: {data[:300]!r} -> {mine}"
    if mine is None:
        assert divergence(data, oracle) is not None, f"unlisted refusal: {data[:300]!r}"
        return
    # Both accept: only HTTP/1.0 keep-alive may differ.
    assert mine == Framed(**{**oracle.__dict__, "keep_alive": mine.keep_alive}), data[:300]
    assert oracle.version == b"1.0" and mine.keep_alive, data[:300]


# -- the inputs: near-valid requests, then mutations ---------------------------------------


def mostly(
    common: st.SearchStrategy[bytes], rare: st.SearchStrategy[bytes]
) -> st.SearchStrategy[bytes]:
    """`common` 29 times in 30, else `rare` (so many inputs are valid, and most near-valid)."""
    return st.integers(0, 29).flatmap(lambda n: rare if n == 29 else common)


VCHAR = st.binary(max_size=6).map(lambda b: bytes(0x21 + x % 94 for x in b))
EOL = mostly(st.just(b"\r\n"), st.sampled_from([b"\n", b"\r", b"\r\r\n", b"\n\r"]))
METHOD = mostly(
    st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"OPTIONS", b"PATCH"]),
    st.binary(max_size=6),
)
TARGET = mostly(
    st.sampled_from([b"/", b"/health", b"/v1/sandboxes?x=1", b"//a", b"*"])
    | VCHAR.map(lambda tail: b"/" + tail),
    st.binary(max_size=8).map(lambda tail: b"/" + tail),
)
VERSION = mostly(
    st.sampled_from([b"HTTP/1.1"] * 3 + [b"HTTP/1.0"]),
    st.sampled_from([b"HTTP/2.0", b"HTTP/1.10", b"http/1.1", b"HTTP/1", b"", b"HTTP/0.9"]),
)
NAME = mostly(
    st.sampled_from([b"Content-Length", b"Transfer-Encoding", b"Connection", b"X-A", b"host"]),
    st.binary(max_size=5) | VCHAR,
)
VALUE = mostly(
    st.sampled_from([b"0", b"5", b"3", b"chunked", b"Chunked", b"close", b"keep-alive", b""])
    | VCHAR
    | st.sampled_from([b"a b", b"\xe9t\xe9", b"5, 5", b"3 ", b"a\tb"]),
    st.binary(max_size=6),
)
SEP = mostly(st.sampled_from([b": ", b":", b":\t", b":  "]), st.sampled_from([b" : ", b" "]))
SPACE = mostly(st.just(b" "), st.sampled_from([b"  ", b"\t", b""]))


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A Content-Length body or a chunked one (sizes right or wrong), or any bytes."""
    kind = draw(st.sampled_from(["plain", "plain", "chunked", "chunked", "raw"]))
    if kind == "plain":
        return draw(st.binary(max_size=12))
    if kind == "raw":
        return draw(st.binary(max_size=20))
    out = b""
    for chunk in draw(st.lists(st.binary(min_size=1, max_size=6), max_size=3)):
        size = draw(mostly(st.just(len(chunk)), st.sampled_from([len(chunk) + 1, 0])))
        ext = draw(mostly(st.sampled_from([b"", b"", b";a=b", b"; x"]), st.just(b";\r")))
        pad = draw(mostly(st.just(b""), st.sampled_from([b"0" * 16, b" ", b"0"])))
        out += pad + b"%x" % size + ext + draw(EOL) + chunk + draw(EOL)
    trailer = draw(
        mostly(st.sampled_from([b"", b"X-T: 1\r\n"]), st.sampled_from([b" fold\r\n", b"bad\r\n"]))
    )
    return out + b"0" + draw(EOL) + trailer + draw(EOL) + draw(st.binary(max_size=4))


@st.composite
def requests_(draw: st.DrawFn) -> bytes:
    """A request: request line, 0-6 header lines, blank line, body; perhaps mutated."""
    eol = draw(EOL)
    line = draw(METHOD) + draw(SPACE) + draw(TARGET) + draw(SPACE) + draw(VERSION)
    fields = [] if draw(st.integers(0, 9)) == 9 else [b"Host: 127.0.0.1"]
    for _ in range(draw(st.integers(0, 4))):
        fields.append(draw(NAME) + draw(SEP) + draw(VALUE))
    if draw(st.integers(0, 19)) == 19:
        fields.append(b" folded")
    draw(st.randoms()).shuffle(fields)
    lead = draw(mostly(st.just(b""), st.sampled_from([b"\r\n", b"\n"])))
    raw = lead + line + eol + b"".join(f + draw(EOL) for f in fields) + draw(EOL) + draw(bodies())
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):  # a byte flipped, added or dropped
        if not raw:
            break
        at = draw(st.integers(0, len(raw) - 1))
        byte = bytes([draw(st.integers(0, 255))])
        how = draw(st.sampled_from(["flip", "insert", "drop"]))
        raw = raw[:at] + (b"" if how == "drop" else byte) + raw[at + (how != "insert") :]
    return raw


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(requests_())
def test_requests_are_framed_as_h11_frames_them(data: bytes) -> None:
    compare(data)


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        b"POST / HTTP/1.1\nHost: a\nContent-Length: 3\n\nabcGET",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n0\r\n\r\n",
        b"GET / HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n",
        b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n",
    ],
)
def test_known_shapes(data: bytes) -> None:
    compare(data)
