"""Issue 45: every byte the client holds of a run counts against ``max_output_bytes``.

Decoded output counts by its size; what is not decoded (a line that is not an event, a partial
frame) by its size on the wire, as it arrives. LiteLLM's provider test (peers.md 1.6) feeds one
line of ``"x" * (MAX_OUTPUT_BYTES + 1)`` that is not an event and expects a ``ValueError``
matching "exceeded", with and without a newline.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator

import pytest

from osb_sync import MAX_OUTPUT_BYTES, OutputLimitExceeded, StreamError
from osb_sync._command_stream import CommandFolder
from osb_sync._execution import ExecutionStream
from osb_sync._stream import FRAME_ALLOWANCE, iter_events

INIT = b'{"type":"init","text":"run-1"}\n\n'


class _Chunks:
    """A stand-in response: ``iter_content`` yields the given chunks (no socket, no watchdog)."""

    raw = object()

    def __init__(self, chunks: object):
        self.chunks = chunks

    def iter_content(self, size: int) -> object:
        return iter(self.chunks)  # type: ignore[call-overload]

    def close(self) -> None:
        pass


def ev(**fields: object) -> bytes:
    return json.dumps(fields).encode() + b"\n\n"


def run(chunks: object, cap: int = MAX_OUTPUT_BYTES, command: bool = False) -> object:
    folder = CommandFolder() if command else None
    with ExecutionStream(_Chunks(chunks), max_output_bytes=cap, folder=folder) as stream:  # type: ignore[arg-type]
        return stream.result()


@pytest.mark.parametrize("newline", [b"\n", b""], ids=["with newline", "without newline"])
@pytest.mark.parametrize("command", [False, True], ids=["code", "command"])
def test_litellm_line_over_the_cap_that_is_not_an_event(newline: bytes, command: bool) -> None:
    line = b"x" * (MAX_OUTPUT_BYTES + 1) + newline
    with pytest.raises(OutputLimitExceeded, match="exceeded") as info:
        run([INIT, line], command=command)
    assert isinstance(info.value, ValueError)
    assert info.value.limit == MAX_OUTPUT_BYTES


@pytest.mark.parametrize("newline", [b"\n", b""], ids=["with newline", "without newline"])
def test_a_line_at_the_cap_that_is_not_an_event_is_dropped_or_truncated(newline: bytes) -> None:
    """The cap is not passed: a line that is not an event is skipped (or, last and without a
    newline, a truncated stream), as before."""
    line = b"x" * MAX_OUTPUT_BYTES + newline
    if newline:
        assert run([INIT, line, ev(type="stdout", text="ok\n")]).stdout == "ok\n"  # type: ignore[attr-defined]
    else:
        with pytest.raises(StreamError, match="ended in the middle of an event"):
            run([INIT, line])


def test_the_room_a_non_event_line_has_is_what_the_output_left() -> None:
    out = ev(type="stdout", text="y" * 600)
    with pytest.raises(OutputLimitExceeded, match="not an event") as info:
        run([INIT, out, b"z" * 401 + b"\n"], cap=1000)
    assert info.value.partial.stdout == "y" * 600
    assert run([INIT, out, b"z" * 400 + b"\n"], cap=1000).stdout == "y" * 600  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "line",
    [
        b"{" + b"x" * 2000,  # looks like JSON, is not
        b'{"no_type": "' + b"x" * 2000 + b'"}',  # JSON, not an event
        b"data: " + b"x" * 2000,  # an SSE frame that is not JSON
        b": " + b"x" * 2000,  # an SSE comment
    ],
    ids=["broken json", "json not an event", "sse data", "sse comment"],
)
@pytest.mark.parametrize("newline", [b"\n\n", b""], ids=["with newline", "without newline"])
def test_every_kind_of_line_that_is_not_an_event_counts(line: bytes, newline: bytes) -> None:
    with pytest.raises(OutputLimitExceeded, match="exceeded 1000 bytes"):
        run([INIT, line + newline], cap=1000)


def test_an_sse_stream_counts_its_lines_that_are_not_events_too() -> None:
    chunks = [b"data: " + INIT, b"data: " + b"x" * 2000 + b"\n\n"]
    with pytest.raises(OutputLimitExceeded, match="not an event"):
        run(chunks, cap=1000)


def test_a_partial_frame_counts_as_it_arrives() -> None:
    """A frame that never ends fails once it holds the room plus one frame's allowance,
    before any newline."""
    pieces = [INIT, b'{"type":"stdout","text":"'] + [b"x" * 1000] * 1000
    seen: list[int] = []

    def chunks() -> Iterator[bytes]:
        for number, piece in enumerate(pieces):
            seen.append(number)
            yield piece

    with pytest.raises(OutputLimitExceeded, match="before it ended"):
        run(chunks(), cap=1000)
    assert len(seen) < 2 + (1000 + FRAME_ALLOWANCE) // 1000 + 2


def test_a_run_at_its_cap_still_reads_its_pings_and_end() -> None:
    """The frame allowance: output exactly at the cap, then events that carry none."""
    chunks = [INIT, ev(type="stdout", text="y" * 1000), ev(type="ping", text="pong")]
    chunks += [ev(type="execution_complete")]
    assert run(chunks, cap=1000).stdout == "y" * 1000  # type: ignore[attr-defined]


def test_lines_that_are_not_events_cost_time_not_the_cap() -> None:
    """Dropped once read: many short ones do not add up."""
    chunks = [INIT] + [b"noise " * 100 + b"\n"] * 1000 + [ev(type="stdout", text="ok")]
    assert run(chunks, cap=1000).stdout == "ok"  # type: ignore[attr-defined]


def test_iter_events_tells_skipped_sizes() -> None:
    sizes: list[int] = []
    data = INIT + b"garbage\n" + b'{"x":1}\n\n' + b"data: nope\n\n" + b"tail"
    with pytest.raises(StreamError):
        list(iter_events([data], sizes.append))
    assert sizes == [7, 7, 4, 4]  # the data: frame counts by its data


def test_a_hundred_mebibyte_line_is_held_up_to_the_cap_only() -> None:
    """Memory is bounded by the cap, not by the line (RSS: benchmarks/bench_long_line.py)."""
    cap = 1 << 20
    block = b"x" * (64 << 10)

    def hundred_mib() -> Iterator[bytes]:
        yield INIT
        for _ in range((100 << 20) // len(block)):
            yield block[:-1] + b"y"  # a new object each time, as a socket's reads are

    tracemalloc.start()
    try:
        with pytest.raises(OutputLimitExceeded, match="exceeded"):
            run(hundred_mib(), cap=cap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * cap + FRAME_ALLOWANCE, f"peak {peak / cap:.2f}x the cap"


@pytest.mark.parametrize("start", [INIT, b"data: " + INIT], ids=["bare", "sse"])
@pytest.mark.parametrize("tail", [b"}\n\n", b""], ids=["line", "last line"])
def test_a_flood_of_lone_crs_never_reaches_sseclient_in_a_line(
    monkeypatch: pytest.MonkeyPatch, start: bytes, tail: bytes
) -> None:
    """sseclient-py joins a line's CR-ended lines one by one (``data += line``: quadratic):
    a hostile line of ``"a\\r"`` pairs at the 10 MiB cap held the client's thread for hours,
    past any timeout (the deadline is checked per chunk). A lone CR ends a line, as in SSE,
    before sseclient-py sees it."""
    import sseclient

    frames: list[bytes] = []
    real = sseclient.SSEClient

    def recording(source: Iterator[bytes]) -> object:
        def tee() -> Iterator[bytes]:
            for frame in source:
                frames.append(frame)
                yield frame

        return real(tee())

    monkeypatch.setattr(sseclient, "SSEClient", recording)
    flood = b'{"type":"ping"' + b"a\r" * 200_000 + tail
    end = ev(type="stdout", text="ok\n") if tail else b""
    result = run([start, flood, end], cap=1 << 20)
    assert result.stdout == ("ok\n" if tail else "")  # type: ignore[attr-defined]
    assert not any(b"\r" in frame for frame in frames)


@pytest.mark.parametrize(("offset", "limit"), [(1, 1), (500_000, 2), (2, None)])
def test_lines_picked_from_a_june_execds_whole_file_cost_about_the_file(
    offset: int, limit: int | None
) -> None:
    """June's execd answers a line download with the whole file (up to the cap): picking the
    lines must not hold a list of them (a file of 3-byte lines cost 20 times its size)."""
    from osb_sync._files import pick_lines

    text = "ab\r\n" * 1_000_000
    tracemalloc.start()
    try:
        picked = pick_lines(text, offset, limit)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert picked == "\n".join(["ab"] * (limit or 999_999))
    assert peak < 3 * len(text)


def test_blank_lines_before_the_first_event_are_not_held() -> None:
    """The parser is chosen by the stream's first non-blank byte: the blank chunks before it
    were all held (a hostile execd's endless blank lines grew memory without bound)."""

    def blanks() -> Iterator[bytes]:
        for _ in range(256):  # 16 MiB of blank lines, a cap of 1 MiB
            yield b"\n" * 65536
        yield b"  "  # the start of the line the event ends
        yield INIT + ev(type="stdout", text="ok\n")

    tracemalloc.start()
    try:
        result = run(blanks(), cap=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.stdout == "ok\n"  # type: ignore[attr-defined]
    assert peak < 4 << 20
