"""Properties of the pure stream pipeline (``osb_sync._stream``), checked with hypothesis.

Bounded for CI: a few hundred examples in all, derandomized (the same ones every run), no
deadline, and no example database written into the repository.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from osb_sync import ExecutionResult, OutputLimitExceeded, StreamError, parse_execution
from osb_sync._stream import capped, iter_events

# Hypothesis keeps caches even without a database: keep them out of the working tree.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "osb-sync-hypothesis")

BOUNDED = settings(
    max_examples=120,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples on every run: CI stays deterministic
    suppress_health_check=[HealthCheck.too_slow],
)

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

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)
event_objects = st.builds(
    lambda kind, text, extra: {"type": kind, "text": text, **extra},
    st.sampled_from(EVENT_TYPES),
    st.text(max_size=60),
    st.dictionaries(st.sampled_from(["timestamp", "results", "error", "x"]), json_values),
)


def decoded(events: list[Any]) -> list[tuple[str, str | None, int | None, str]]:
    """Everything an Event carries, comparable (``data`` as canonical JSON)."""
    return [(e.type, e.text, e.timestamp, json.dumps(e.data, sort_keys=True)) for e in events]


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (any order, repeats allowed: empty chunks)."""
    points = sorted(min(c, len(data)) for c in cuts)
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


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


@settings(BOUNDED, max_examples=60)
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


@BOUNDED
@given(st.lists(st.binary(max_size=300), max_size=10), st.integers(min_value=1, max_value=4000))
@example([b'{"type": "stdout", "text": "\xff"}\n\n'], 10**6)
@example([b'{"type": "stdout", "te'], 10**6)
def test_arbitrary_bytes_raise_only_stream_errors(chunks: list[bytes], cap: int) -> None:
    try:
        for event in iter_events(capped(chunks, cap)):
            assert isinstance(event.type, str)
    except (StreamError, OutputLimitExceeded):
        pass


@BOUNDED
@given(st.lists(st.binary(max_size=200), max_size=12), st.integers(min_value=0, max_value=1500))
def test_the_cap_is_exact(chunks: list[bytes], cap: int) -> None:
    data = b"".join(chunks)
    passed: list[bytes] = []
    try:
        for chunk in capped(chunks, cap):
            passed.append(chunk)
    except OutputLimitExceeded as exc:
        assert len(data) > cap and exc.limit == cap
        assert b"".join(passed) == data[:cap]  # what fits is delivered, not one byte more
    else:
        assert len(data) <= cap and b"".join(passed) == data


line_items = st.one_of(
    event_objects.map(json.dumps),
    json_values.map(json.dumps),
    st.text(max_size=80),
    st.binary(max_size=80),
)
prefixed = st.tuples(st.sampled_from(["", "data: ", "data:", ": ", "event: "]), line_items).map(
    lambda pair: pair[0] + pair[1] if isinstance(pair[1], str) else pair[0].encode() + pair[1]
)


@settings(BOUNDED, max_examples=80)
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
