"""Stream framing, the line guard, output counting and folding, tested on byte strings."""

from __future__ import annotations

import json

import pytest

from osb_sync import Event, ExecutionError, OutputLimitExceeded, StreamError, parse_execution
from osb_sync._command_stream import CommandFolder
from osb_sync._stream import (
    ExecutionFolder,
    frame_lines,
    guard_lines,
    iter_events,
    payload_bytes,
    utf8_prefix,
)


def ev(**fields: object) -> bytes:
    return json.dumps(fields).encode()


# A /code run as real execd frames it: bare JSON objects, each followed by a blank line.
EXECD_RUN = b"".join(
    line + b"\n\n"
    for line in [
        ev(type="init", text="ctx-1", timestamp=1),
        ev(type="ping", text="pong", timestamp=2),
        ev(type="stdout", text="hi\n", timestamp=3),
        ev(type="stdout", text="caf\u00e9 \u2603\n", timestamp=4),
        ev(type="stderr", text="warn\n", timestamp=5),
        ev(type="execution_count", execution_count=1, timestamp=6),
        ev(type="result", results={"text": "4"}, timestamp=7),
        ev(type="execution_complete", execution_time=35, timestamp=8),
    ]
)


def fold(chunks: list[bytes]) -> tuple[list[Event], ExecutionFolder]:
    folder = ExecutionFolder()
    events = list(iter_events(chunks))
    for e in events:
        folder.add(e)
    return events, folder


def test_bare_json_framing_gives_every_event() -> None:
    events, folder = fold([EXECD_RUN])
    assert [e.type for e in events] == [
        "init",
        "ping",
        "stdout",
        "stdout",
        "stderr",
        "execution_count",
        "result",
        "execution_complete",
    ]
    assert events[0] == Event(type="init", text="ctx-1", timestamp=1)
    result = folder.result()
    assert result.stdout == "hi\ncaf\u00e9 \u2603\n"
    assert result.stderr == "warn\n"
    assert result.results == [{"text": "4"}]
    assert result.execution_count == 1
    assert result.execution_id == "ctx-1"
    assert result.error is None


def test_data_prefixed_framing_and_sse_noise_give_the_same_events() -> None:
    lines = [line for line in EXECD_RUN.split(b"\n\n") if line]
    sse = b": comment\nretry: 100\n" + b"".join(
        b"event: message\nid: 7\ndata: " + line + b"\r\n\r\n" for line in lines
    )
    assert list(iter_events([sse])) == list(iter_events([EXECD_RUN]))


@pytest.mark.parametrize("stream", [EXECD_RUN, EXECD_RUN.replace(b"\n\n", b"\r\n\r\n")])
def test_every_two_way_split_gives_the_same_events(stream: bytes) -> None:
    expected = list(iter_events([stream]))
    for cut in range(len(stream) + 1):
        assert list(iter_events([stream[:cut], stream[cut:]])) == expected, cut


def test_one_byte_at_a_time_gives_the_same_events() -> None:
    chunks = [EXECD_RUN[i : i + 1] for i in range(len(EXECD_RUN))]
    assert list(iter_events(chunks)) == list(iter_events([EXECD_RUN]))


def test_frame_lines_hands_sseclient_whole_frames() -> None:
    frames = list(frame_lines([b'{"type":"a"}\n\n{"ty', b'pe":"b"}\n\n']))
    assert frames == [b'data: {"type":"a"}\n\n', b'data: {"type":"b"}\n\n']


def test_bare_error_object_at_eof_without_newline_is_an_error_event() -> None:
    stream = EXECD_RUN[:60].rsplit(b"\n\n", 1)[0] + b"\n\n"
    stream += b'{"code":"RUNTIME_ERROR","message":"error running codes session is busy"}'
    events, folder = fold([stream])
    assert events[-1].type == "error"
    assert folder.result().error == ExecutionError(
        name="RUNTIME_ERROR", value="error running codes session is busy", traceback=[]
    )


def test_stream_cut_mid_event_raises_stream_error() -> None:
    with pytest.raises(StreamError, match="middle of an event"):
        list(iter_events([EXECD_RUN[:-20]]))


def test_invalid_utf8_raises_stream_error() -> None:
    with pytest.raises(StreamError, match="UTF-8"):
        list(iter_events([b'{"type":"stdout","text":"\xff\xfe"}\n\n']))


def test_non_object_and_invalid_json_lines_are_skipped() -> None:
    stream = b'[1,2]\n\n{not json}\n\ndata: "str"\n\ndata: 5\n\n{"type":"stdout","text":"ok"}\n\n'
    assert [e.text for e in iter_events([stream])] == ["ok"]


def test_type_less_object_without_code_is_not_an_event() -> None:
    assert list(iter_events([b'{"text":"x"}\n\n'])) == []


def test_large_event_arriving_in_small_chunks_parses_whole() -> None:
    text = "x" * (8 * 1024 * 1024)
    line = ev(type="stdout", text=text) + b"\n\n"
    chunks = [line[i : i + 65536] for i in range(0, len(line), 65536)]
    (event,) = iter_events(chunks)
    assert event.text == text


@pytest.mark.parametrize("size", [0, 1, 99, 100])
def test_line_guard_passes_a_line_of_at_most_the_limit(size: int) -> None:
    data = b"a" * size + b"\n" + b"b" * size
    assert b"".join(guard_lines([data[:50], data[50:]], 100)) == data


def test_line_guard_passes_any_total_of_short_lines() -> None:
    """The guard is on one line, not the total: framing is never counted against the cap."""
    lines = [b'{"type":"stdout","text":"y"}\n\n'] * 10_000
    assert b"".join(guard_lines(lines, 100)) == b"".join(lines)


def test_line_guard_fails_one_line_without_a_newline() -> None:
    seen: list[bytes] = []
    with pytest.raises(OutputLimitExceeded, match="line of the event stream exceeded 100") as info:
        for chunk in guard_lines([b"ok\n" + b"a" * 57, b"b" * 41, b"c" * 3], 100):
            seen.append(chunk)
    assert seen == [b"ok\n" + b"a" * 57, b"b" * 41]  # 98 bytes of the line; the next: 101
    assert info.value.limit == 100
    assert "raise max_output_bytes" in str(info.value)


def test_line_guard_delivers_the_whole_lines_before_the_long_one() -> None:
    chunk = b'{"type":"init","text":"r"}\n\n' + b"x" * 200 + b"\nrest\n"
    with pytest.raises(OutputLimitExceeded):
        seen = []
        for part in guard_lines([chunk], 100):
            seen.append(part)
    assert seen == [b'{"type":"init","text":"r"}\n\n']


def test_line_guard_asks_a_changing_limit_before_each_chunk() -> None:
    rooms = iter([100, 100, 10])
    seen: list[bytes] = []
    with pytest.raises(OutputLimitExceeded, match="exceeded 10 bytes"):
        for chunk in guard_lines([b"a" * 50, b"b" * 5, b"c"], lambda: next(rooms)):
            seen.append(chunk)
    assert seen == [b"a" * 50, b"b" * 5]


def test_folders_count_the_output_as_read_not_the_framing() -> None:
    code = ExecutionFolder()
    for event in iter_events([EXECD_RUN]):
        code.add(event)
    result = code.result()
    as_read = (result.stdout + result.stderr).encode() + b"4"
    assert code.output_bytes == len(as_read)  # UTF-8 bytes: "caf\u00e9 \u2603" counts 9
    command = CommandFolder()
    for line in ["y", "\n", "\u00e9"]:
        command.add(Event("stdout", line, None, {}))
    assert command.result().stdout == "y\n\n\u00e9\n"
    assert command.output_bytes == len("y\n\n\u00e9\n".encode())


def test_result_payloads_count_their_values() -> None:
    assert payload_bytes({"text/plain": "42", "image/png": "QUJD"}) == 6
    assert payload_bytes({"data": [1, 2]}) == len("[1, 2]")
    folder = ExecutionFolder()
    folder.add(Event("result", None, None, {"type": "result", "results": {"text/plain": "x" * 9}}))
    assert folder.output_bytes == 9


def test_cut_keeps_exactly_the_cap_of_output() -> None:
    folder = ExecutionFolder()
    for text in ["abc", "\u00e9\u00e9\u00e9"]:  # 3 + 6 bytes
        event = Event("stdout", text, None, {})
        folder.add(event)
    folder.cut(event, 6)  # 3 bytes of "\u00e9\u00e9\u00e9" fit: one whole character
    assert (folder.result().stdout, folder.output_bytes) == ("abc\u00e9", 5)
    result = Event("result", None, None, {"results": {"text/plain": "zz"}})
    folder.add(result)
    folder.cut(result, 6)  # a result does not fit in part: it is dropped
    assert (folder.result().results, folder.output_bytes) == ([], 5)
    command = CommandFolder()
    line = Event("stderr", "abcdef", None, {})
    command.add(line)
    command.cut(line, 4)
    assert (command.result().stderr, command.output_bytes) == ("abcd", 4)


def test_utf8_prefix_never_splits_a_character() -> None:
    assert utf8_prefix("a\u2603b", 3) == "a"
    assert utf8_prefix("a\u2603b", 4) == "a\u2603"
    assert utf8_prefix("abc", -1) == ""


# -- parse_execution: the reference provider's parsing rules --------------------------------


def test_parse_execution_accepts_str_bytes_and_both_framings() -> None:
    result = parse_execution(
        [
            'data: {"type":"stdout","text":"a"}',
            b'{"type":"stdout","text":"b"}',
            "",
            ": keepalive",
            "event: message",
            "id: 1",
            "retry: 10",
            "data: not json",
            "data: [1]",
            '{"type":"stderr","text":"e"}',
        ]
    )
    assert (result.stdout, result.stderr) == ("ab", "e")


def test_parse_execution_results_keep_dicts_or_strip_envelope() -> None:
    result = parse_execution(
        [
            '{"type":"result","results":{"text":"4","text/html":"<b>4</b>"}}',
            '{"type":"result","text":"5","timestamp":1,"execution_count":2,"extra":true}',
        ]
    )
    assert result.results == [{"text": "4", "text/html": "<b>4</b>"}, {"text": "5", "extra": True}]


def test_parse_execution_count_is_the_first_int_like_value() -> None:
    result = parse_execution(
        [
            '{"type":"execution_count","execution_count":"x"}',
            '{"type":"execution_count","execution_count":true}',
            '{"type":"execution_count","execution_count":"8"}',
            '{"type":"execution_count","execution_count":9}',
        ]
    )
    assert result.execution_count == 8


def test_parse_execution_error_prefers_error_object_first_non_none() -> None:
    result = parse_execution(
        [
            '{"type":"error","error":{"ename":"","name":"N","evalue":null,"value":"v",'
            '"traceback":["t1","t2"]}}',
            '{"type":"error","error":{"ename":"Second"}}',
        ]
    )
    assert result.error == ExecutionError(name="", value="v", traceback=["t1", "t2"])


def test_parse_execution_error_without_error_object_uses_event_fields() -> None:
    result = parse_execution(['{"type":"error","name":"E","text":"from text","traceback":"tb"}'])
    assert result.error == ExecutionError(name="E", value="from text", traceback=["tb"])
    bare = parse_execution(['{"type":"error"}'])
    assert bare.error == ExecutionError(name="", value="", traceback=[])


def test_parse_execution_type_less_code_message_is_error() -> None:
    result = parse_execution(['data: {"code":"RUNTIME_ERROR","message":"busy"}'])
    assert result.error == ExecutionError(name="RUNTIME_ERROR", value="busy", traceback=[])


def test_control_events_do_not_change_output() -> None:
    result = parse_execution(
        [
            '{"type":"init","text":"ctx"}',
            '{"type":"ping","text":"pong"}',
            '{"type":"status","text":"error"}',
            '{"type":"execution_complete","execution_time":3}',
        ]
    )
    assert (result.stdout, result.stderr, result.results, result.error) == ("", "", [], None)
    assert result.execution_id == "ctx"


def test_to_dict_is_litellm_shape() -> None:
    result = parse_execution(
        [
            '{"type":"stdout","text":"1"}',
            '{"type":"error","error":{"ename":"ZeroDivisionError","evalue":"division by zero",'
            '"traceback":["tb"]}}',
            '{"type":"execution_count","execution_count":3}',
        ]
    )
    assert result.to_dict() == {
        "stdout": "1",
        "stderr": "",
        "results": [],
        "error": {"name": "ZeroDivisionError", "value": "division by zero", "traceback": ["tb"]},
        "execution_count": 3,
    }


class _Chunks:
    """A stand-in response: ``iter_content`` yields the given chunks (no socket, no watchdog)."""

    raw = object()

    def __init__(self, chunks: list[bytes]):
        self.chunks = chunks

    def iter_content(self, size: int) -> object:
        return iter(self.chunks)

    def close(self) -> None:
        pass


def test_a_capped_run_does_not_hold_its_output_twice_until_the_partial_is_read() -> None:
    """Issue 29: the kept output is joined into ``partial`` when it is read, not at the raise,
    so the run itself peaks near the cap (not twice it); reading ``partial`` gives it all."""
    import tracemalloc

    from osb_sync._execution import ExecutionStream

    cap = 2 << 20
    piece = "x" * 8191 + "\n"
    chunks = [ev(type="init", text="run-1") + b"\n\n"]
    chunks += [ev(type="stdout", text=piece) + b"\n\n"] * (cap // len(piece) + 10)
    tracemalloc.start()
    try:
        with pytest.raises(OutputLimitExceeded) as info:
            with ExecutionStream(_Chunks(chunks), max_output_bytes=cap) as stream:  # type: ignore[arg-type]
                for _ in stream:
                    pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * cap, f"peak {peak / cap:.2f}x the cap before partial was read"
    partial = info.value.partial
    assert partial.stdout == (piece * (cap // len(piece) + 1))[:cap]
    assert info.value.partial is partial  # built once
