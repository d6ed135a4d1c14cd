"""Properties of the pure stream pipeline (``osb_sync._stream``), checked with hypothesis
(bounded and derandomized: see tests/properties.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from osb_sync import ExecutionResult, OutputLimitExceeded, StreamError, parse_execution
from osb_sync._stream import guard_lines, iter_events
from tests import properties
from tests.properties import bounded, decoded, json_values, split

EVENT_TYPES = (
    "init",
    "ping",
    "stdout",
    "stderr",
    "result",
    "execution_count",
    "status",
    "error",
    "execution_complete",
)
NOISE = (b": comment\n", b"event: message\n", b"id: 7\n", b"retry: 3000\n", b"\n", b"\r\n")
DEEP = b'{"type": "result", "results": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"

event_objects = properties.event_objects(EVENT_TYPES)


@st.composite
def wire_streams(draw: st.DrawFn) -> tuple[bytes, list[dict[str, Any]]]:
    """An execd stream in either framing, with noise lines, and the objects it carries."""
    objects = draw(st.lists(event_objects, max_size=6))
    parts: list[bytes] = []
    for obj in objects:
        parts += draw(st.lists(st.sampled_from(NOISE), max_size=2))
        payload = json.dumps(obj, ensure_ascii=draw(st.booleans())).encode()
        prefix = draw(st.sampled_from([b"", b"data: ", b"data:"]))
        newline = draw(st.sampled_from([b"\n\n", b"\r\n\r\n", b"\n"]))
        parts.append(prefix + payload + newline)
    if draw(st.booleans()):  # execd's failure: a bare error object, no newline, at EOF
        error = {"code": "RUNTIME_ERROR", "message": draw(st.text(max_size=20))}
        parts.append(json.dumps(error).encode())
        objects = [*objects, error]
    return b"".join(parts), objects


@bounded(60)
@given(wire_streams(), st.lists(st.integers(min_value=0, max_value=4096), max_size=12))
def test_events_do_not_depend_on_chunk_boundaries(
    stream: tuple[bytes, list[dict[str, Any]]], cuts: list[int]
) -> None:
    data, objects = stream
    whole = decoded(list(iter_events([data])))
    assert decoded(list(iter_events(split(data, cuts)))) == whole
    assert decoded(list(iter_events(data[i : i + 1] for i in range(len(data))))) == whole
    assert [json.loads(payload) for *_, payload in whole] == [
        json.loads(json.dumps(obj)) for obj in objects
    ]


@bounded(120)
@given(st.lists(st.binary(max_size=300), max_size=10), st.integers(min_value=1, max_value=4000))
@example([b'{"type": "stdout", "text": "\xff"}\n\n'], 10**6)
@example([b'{"type": "stdout", "te'], 10**6)
def test_arbitrary_bytes_raise_only_stream_errors(chunks: list[bytes], cap: int) -> None:
    try:
        for event in iter_events(guard_lines(chunks, cap)):
            assert isinstance(event.type, str)
    except (StreamError, OutputLimitExceeded):
        pass


@bounded(120)
@given(st.lists(st.binary(max_size=200), max_size=12), st.integers(min_value=0, max_value=1500))
def test_the_line_guard_is_exact(chunks: list[bytes], cap: int) -> None:
    data = b"".join(chunks)
    passed: list[bytes] = []
    try:
        for chunk in guard_lines(chunks, cap):
            passed.append(chunk)
    except OutputLimitExceeded as exc:
        lines = data.split(b"\n")
        bad = next(i for i, line in enumerate(lines) if len(line) > cap)
        start = sum(len(line) + 1 for line in lines[:bad])  # where the long line starts
        out = b"".join(passed)
        assert exc.limit == cap and data.startswith(out)
        # Every line before the long one is delivered, and at most `cap` bytes of it.
        assert start <= len(out) <= start + cap
    else:
        assert max(map(len, data.split(b"\n"))) <= cap and b"".join(passed) == data


line_items = st.one_of(
    event_objects.map(json.dumps),
    json_values.map(json.dumps),
    st.text(max_size=80),
    st.binary(max_size=80),
)
prefixed = st.tuples(st.sampled_from(["", "data: ", "data:", ": ", "event: "]), line_items).map(
    lambda pair: pair[0] + pair[1] if isinstance(pair[1], str) else pair[0].encode() + pair[1]
)


@bounded(80)
@given(st.lists(prefixed | st.binary(max_size=40), max_size=20))
def test_parse_execution_never_raises(lines: list[str | bytes]) -> None:
    assert isinstance(parse_execution(lines), ExecutionResult)


@pytest.mark.parametrize(
    "parse",
    [
        lambda: list(iter_events([DEEP + b"\n\n"])),
        lambda: parse_execution([DEEP]),
        lambda: parse_execution([DEEP.decode()]),
    ],
    ids=["iter_events", "parse_execution-bytes", "parse_execution-str"],
)
def test_deeply_nested_json_is_never_an_untyped_error(parse: Any) -> None:
    """Valid JSON nested deeper than the recursion limit (40 KB, far under any cap)."""
    try:
        parse()
    except (StreamError, OutputLimitExceeded):
        pass
    except RecursionError as exc:
        raise AssertionError(f"untyped {type(exc).__name__} from a 40 KB event") from None
