"""The bare-JSON fast path of ``iter_events`` against sseclient-py, on the same byte streams.

The reference is the pipeline every stream took before the fast path: each line framed as
``data: ...`` (``frame_lines``) and parsed by sseclient-py. Both must give the same events and
the same error (type, message, and the events delivered before it), however the bytes are
framed (bare lines, ``data:`` SSE, a mix, garbage) and chunked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sseclient
from hypothesis import example, given
from hypothesis import strategies as st

from osb_sync import OpenSandboxError, StreamError
from osb_sync._stream import decode_event, frame_lines, guard_lines, iter_events
from tests import properties
from tests.conformance.execds import real_execd_dir
from tests.properties import bounded, decoded, split

SSECLIENT = sseclient.SSEClient  # the reference, kept before any test counts its uses

Outcome = tuple[list[tuple[str, str | None, int | None, str]], tuple[str, str] | None]


def outcome(events: Any) -> Outcome:
    """The events an iterator yields, and the error that ended it (type and message)."""
    seen: list[Any] = []
    try:
        for event in events:
            seen.append(event)
    except OpenSandboxError as exc:
        return decoded(seen), (type(exc).__name__, str(exc))
    return decoded(seen), None


def via_sseclient(chunks: Any) -> Any:
    """Every line through sseclient-py, as ``data:`` frames (the pipeline before the fast path)."""
    try:
        for sse in SSECLIENT(frame_lines(chunks)).events():
            event = decode_event(sse.data)
            if event is not None:
                yield event
    except UnicodeDecodeError as exc:
        raise StreamError(f"the event stream is not valid UTF-8 ({exc.reason})") from None


def assert_same(chunks: list[bytes], cap: int | None = None) -> Outcome:
    """Both parsers on ``chunks`` (lines guarded at ``cap``): equal outcomes; the fast one's."""
    fast = outcome(iter_events(chunks if cap is None else guard_lines(chunks, cap)))
    reference = outcome(via_sseclient(chunks if cap is None else guard_lines(chunks, cap)))
    assert fast == reference
    return fast


event_objects = properties.event_objects(
    ("init", "ping", "stdout", "stderr", "result", "error", "execution_complete")
) | st.builds(lambda m: {"code": "RUNTIME_ERROR", "message": m}, st.text(max_size=20))
NOISE = [b": comment\n", b"event: message\n", b"id: 7\n", b"retry: 3000\n", b"\n", b"\r\n", b" \n"]


@st.composite
def framed_streams(draw: st.DrawFn) -> bytes:
    """Events framed as bare lines, as ``data:`` SSE, or a mix; sometimes a cut or bare tail."""
    framing = draw(st.sampled_from(["bare", "sse", "mixed"]))
    parts: list[bytes] = []
    for obj in draw(st.lists(event_objects, max_size=8)):
        if framing != "bare":
            parts += draw(st.lists(st.sampled_from(NOISE), max_size=2))
        payload = json.dumps(obj, ensure_ascii=draw(st.booleans())).encode()
        prefixes = {"bare": [b""], "sse": [b"data: ", b"data:"], "mixed": [b"", b"data: "]}
        prefix = draw(st.sampled_from(prefixes[framing]))
        parts.append(prefix + payload + draw(st.sampled_from([b"\n\n", b"\r\n\r\n", b"\n"])))
    tail = draw(st.sampled_from(["", "error", "cut"]))
    if tail == "error":  # execd's failure: a bare error object, no newline, at EOF
        parts.append(b'{"code":"RUNTIME_ERROR","message":"session is busy"}')
    elif tail == "cut":
        parts.append(b'{"type":"stdout","te')
    return b"".join(parts)


@bounded(100)
@given(framed_streams(), st.lists(st.integers(min_value=0, max_value=2048), max_size=10))
def test_framed_events_are_the_same_through_both_parsers(data: bytes, cuts: list[int]) -> None:
    assert_same(split(data, cuts))
    assert_same([data[i : i + 1] for i in range(len(data))])


line_noise = st.sampled_from(
    [b"{", b"}", b"data:", b"data: {", b"\r", b"\r\r", b"\n", b" ", b"\x0b", b"\xff", b"\xc3"]
)


@bounded(100)
@given(
    st.lists(st.binary(max_size=60) | line_noise | framed_streams(), max_size=12),
    st.lists(st.integers(min_value=0, max_value=600), max_size=8),
    st.none() | st.integers(min_value=0, max_value=800),
)
@example([b'{"type":\r"stdout","text":"a"}\n\n'], [], None)  # SSE ends a line at a bare \r
@example([b'{"type":"stdout"\rdata:,"text":"a"}\n\n'], [], None)
@example([b'{"type":"stdout","text":"a"}\n\n{"x":1}\r\rdata: {"type":"b"}\n\n'], [], None)
@example([b'{"type":"init","text":"a"}\n\ndata: {"type":"stdout"}\n\n'], [3], None)
@example([b'{"type":"stdout","text":"\xff"}\n\n'], [], None)
@example([b'{"type":"stdout","text":"a"}\x0b\n\n'], [], None)
@example([b'{"type":"init","text":"a"}\n\n{"type":"stdout","text":"bb"}\n\n'], [], 40)
@example([b'{"type":"a"}}\n\n{"type":"b"} }\n\n'], [], None)  # not one object before \n\n
@example([b"\xef\xbb\xbf{}"], [], None)  # a final line json.loads(bytes) takes but SSE does not
def test_any_bytes_give_the_same_events_and_errors(
    parts: list[bytes], cuts: list[int], cap: int | None
) -> None:
    data = b"".join(parts)
    assert_same(split(data, cuts), cap)
    assert_same(split(b'{"type":"init","text":"x"}\n\n' + data, cuts), cap)  # a bare stream


def transcripts() -> list[Path]:
    folder = real_execd_dir()
    if folder is None or not (folder / "transcripts").is_dir():
        return []
    names = ("code_*.raw", "code_*.wire", "command_*.raw", "command_*.wire", "session_*.raw")
    return sorted(p for name in names for p in (folder / "transcripts").glob(name))


def http_chunks(path: Path) -> list[bytes]:
    """The body of a curl transcript: its HTTP chunks (``.wire``) or the whole body (``.raw``)."""
    data = path.read_bytes()
    if data.startswith(b"HTTP/"):
        data = data.split(b"\r\n\r\n", 1)[1]
    if path.suffix == ".raw":
        return [data]
    chunks, at = [], 0
    while (size := int(data[at : data.index(b"\r\n", at)], 16)) != 0:
        start = data.index(b"\r\n", at) + 2
        chunks.append(data[start : start + size])
        at = start + size + 2
    return chunks


@pytest.mark.parametrize("path", transcripts() or [None], ids=lambda p: p.name if p else "none")
def test_real_execd_transcripts_give_the_same_events(path: Path | None) -> None:
    if path is None:
        pytest.skip("shared/opensandbox-execd/transcripts not found (set OSB_REAL_EXECD_DIR)")
    chunks = http_chunks(path)
    events, error = assert_same(chunks)
    assert error is None and events[0][0] == "init"
    assert {"ping", "stdout"} <= {kind for kind, *_ in events}
    data = b"".join(chunks)
    for cut in range(len(data) + 1):
        assert assert_same([data[:cut], data[cut:]]) == (events, error), cut
    sse = data.replace(b"{", b"data: {", 1).replace(b"\n\n{", b"\n\ndata: {")
    assert outcome(iter_events([sse])) == (events, error)  # the same events, SSE-framed


class CountingSSEClient(SSECLIENT):  # type: ignore[misc]
    made = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        CountingSSEClient.made += 1
        super().__init__(*args, **kwargs)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> type[CountingSSEClient]:
    CountingSSEClient.made = 0
    monkeypatch.setattr(sseclient, "SSEClient", CountingSSEClient)
    return CountingSSEClient


BARE = b"".join(
    json.dumps(obj).encode() + b"\n\n"
    for obj in [
        {"type": "init", "text": "ctx"},
        {"type": "ping", "text": "pong"},
        {"type": "stdout", "text": "hi\n"},
        {"type": "execution_complete"},
    ]
)


def test_bare_json_streams_do_not_go_through_sseclient(counted: type[CountingSSEClient]) -> None:
    events = list(iter_events([BARE[:7], BARE[7:]]))
    events += list(iter_events([BARE + b'{"code":"E","message":"m"}']))
    assert [e.type for e in events][-2:] == ["execution_complete", "error"]
    assert counted.made == 0


def test_sse_streams_go_through_sseclient(counted: type[CountingSSEClient]) -> None:
    sse = BARE.replace(b"{", b"data: {")
    assert [e.type for e in iter_events([sse])] == ["init", "ping", "stdout", "execution_complete"]
    assert counted.made == 1


def test_sse_lines_inside_a_bare_stream_are_read_as_sseclient_reads_them(
    counted: type[CountingSSEClient],
) -> None:
    """A ``data:`` line's payload is decoded without sseclient-py (its event would carry exactly
    that payload; the property test above compares the two on any bytes)."""
    mixed = BARE + b'data: {"type":"stdout","text":"a"}\n\n{"type":"stdout",\r"text":"b"}\n\n'
    stdout = [e.text for e in iter_events([mixed]) if e.type == "stdout"]
    assert stdout == ["hi\n", "a"]  # the \r ends the last line for SSE: no JSON, no event
    assert counted.made == 0
