"""Stream framing, guarding and event folding for execd's event streams (pure, no I/O).

Pipeline, one stage per function::

    raw chunks -> guard_lines() -> iter_events() -> decode_event() -> ExecutionFolder

One cap, on every byte the client holds of a run (``max_output_bytes``). Decoded output counts
by its size: the UTF-8 bytes of the stdout and stderr text a folder keeps and of each result's
payload (the folder counts, ``output_bytes``; the stream compares). Bytes not yet decoded count
by their size on the wire, as they arrive: the line being read (a partial frame) may hold at
most what the output left of the cap plus ``FRAME_ALLOWANCE`` (64 KiB, one event's framing;
``guard_lines``), and a whole line that is not an event (``iter_events``'s ``skipped``) at most
what the output left of the cap, with or without its final newline. A line that is not an event
is dropped once read: it counts while held, never after. Framing that is decoded is not output
(execd sends each line of a command as one event of about 55 bytes, so ``"y\n"`` costs 28
times its size on the wire), so what the client holds of one run is bounded by the cap plus
one frame's allowance and a chunk; a stream of events that carry no output (pings, empty text)
costs time, not memory, and its bound is the run's ``timeout``. Not bounded by the cap: the
moment ``json`` decodes one line into objects, which can take some 26 times the line's size (a
hostile line of empty objects; freed once decoded). A heuristic refusing such lines could refuse
an honest result, so none is applied: a small cap is the bound for untrusted sandboxes.

Like the official SDKs, every line is one event. ``iter_events`` picks the parser per stream
from its first non-blank byte: real execd's bare ``{...}`` lines are decoded directly (one
``json`` call per event, nothing else per byte); a stream that starts any other way (``data:``,
``event:``, a comment) is SSE and goes through sseclient-py, one whole ``data:`` frame per line
(``frame_lines``), so its buffer never grows chunk by chunk. A line of a bare stream that is not
a plain JSON object line (a ``data:`` line, or a bare ``\r`` inside the line, where SSE ends a
line) is handed to sseclient-py on its own, so both parsers give the same events for any bytes.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, Callable, Iterable, Iterator

import sseclient

from ._errors import OutputLimitExceeded, StreamError
from ._json import check_depth, loads
from ._models import Event, ExecutionError, ExecutionResult

_SKIPPED_PREFIXES = (b":", b"event:", b"id:", b"retry:")


def _require_sseclient_py() -> None:
    """Fail early when the unrelated ``sseclient`` package owns the ``sseclient`` module."""
    client = getattr(sseclient, "SSEClient", None)
    init = getattr(client, "__init__", None)
    params = getattr(getattr(init, "__code__", None), "co_varnames", ())[:2]
    if not hasattr(client, "events") or params != ("self", "event_source"):
        raise ImportError(
            "osb_sync needs the 'sseclient-py' package, but the module 'sseclient' was installed "
            "by the unrelated 'sseclient' package (both use the same import name). Fix: "
            "pip uninstall -y sseclient sseclient-py && pip install sseclient-py"
        )


_require_sseclient_py()


# What the line being read may hold past the room the output left under the cap: one event's
# framing (an event's JSON around its text), so that a run at its cap still reads its pings.
FRAME_ALLOWANCE = 64 * 1024


def guard_lines(
    chunks: Iterable[bytes],
    limit: int | Callable[[], int],
    too_long: Callable[[int], OutputLimitExceeded] | None = None,
) -> Iterator[bytes]:
    """Yield the chunks; raise OutputLimitExceeded once one line passes ``limit`` bytes.

    ``limit`` is a number, or a function asked before each chunk (the room the output left,
    which shrinks as the run's output grows). A line is counted without its newline, across
    chunks, as it arrives. Every whole line before the one that passed is yielded first, so
    that the events they complete (``init`` above all, which names the run to interrupt) are
    not lost. execd's usual chunk (whole lines, shorter than the limit) costs three checks:
    only a line that crosses a chunk's edge can be longer than its chunk, so only such chunks
    (and any chunk longer than ``limit``) are measured.

    Raises:
        OutputLimitExceeded: a line passed the limit: ``too_long(limit)``, by default an
            error whose ``limit`` is ``limit``.
    """
    room = limit if callable(limit) else (lambda: limit)
    error = too_long or _line_too_long
    open_line = 0  # bytes of the line the last chunk left unfinished
    for chunk in chunks:
        now = room()
        if open_line or chunk[-1:] != b"\n" or len(chunk) > now:
            open_line, whole = _measure(chunk, open_line, now)
            if whole is not None:
                if whole:
                    yield whole
                raise error(now)
        yield chunk


def _measure(chunk: bytes, open_line: int, limit: int) -> tuple[int, bytes | None]:
    """The line left open after ``chunk`` (which continues one of ``open_line`` bytes), and,
    if a line passed ``limit``, the whole lines of ``chunk`` before it (else None)."""
    last = chunk.rfind(b"\n")
    if last < 0:
        open_line += len(chunk)
        return open_line, b"" if open_line > limit else None
    if open_line or len(chunk) > limit:
        start = 0
        for line in chunk[:last].split(b"\n"):
            if open_line + len(line) > limit:
                return 0, chunk[:start]
            start += len(line) + 1
            open_line = 0
    open_line = len(chunk) - last - 1
    return open_line, chunk[: last + 1] if open_line > limit else None


def _line_too_long(limit: int) -> OutputLimitExceeded:
    return OutputLimitExceeded(
        f"a line of the event stream exceeded {limit} bytes; the stream was closed "
        "(raise max_output_bytes to allow more)",
        limit=limit,
    )


def held_exceeded(limit: int, output_bytes: int) -> OutputLimitExceeded:
    """The error for a run whose line being read (not yet an event), with the output kept,
    passed ``limit`` bytes (the cap) plus one frame's allowance."""
    return OutputLimitExceeded(
        f"the run's output exceeded {limit} bytes: past the {output_bytes} bytes of output "
        f"kept, one line of the event stream passed the rest of the cap (plus "
        f"{FRAME_ALLOWANCE} bytes for its framing) before it ended (bytes not yet decoded "
        "count by their size on the wire); the stream was closed (raise max_output_bytes to "
        "allow more)",
        limit=limit,
    )


def not_an_event_exceeded(limit: int, size: int, output_bytes: int) -> OutputLimitExceeded:
    """The error for a line that is not an event and would pass ``limit`` (the cap)."""
    return OutputLimitExceeded(
        f"the run's output exceeded {limit} bytes: a line of the event stream that is not an "
        f"event ({size} bytes on the wire, counted by that size) came after {output_bytes} "
        "bytes of output; the stream was closed (raise max_output_bytes to allow more)",
        limit=limit,
    )


def output_exceeded(limit: int) -> OutputLimitExceeded:
    """The error for a run whose output (as a user reads it) passed ``limit`` bytes."""
    return OutputLimitExceeded(
        f"the run's output exceeded {limit} bytes (stdout, stderr and results as read); the "
        "stream was closed (raise max_output_bytes to allow more)",
        limit=limit,
    )


def utf8_len(text: str) -> int:
    """The bytes of ``text`` in UTF-8 (O(1) for ASCII text, the usual case)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def utf8_prefix(text: str, size: int) -> str:
    """The longest start of ``text`` that is at most ``size`` bytes in UTF-8."""
    if text.isascii():
        return text[: max(size, 0)]
    return text.encode("utf-8", "surrogatepass")[: max(size, 0)].decode("utf-8", "ignore")


def payload_bytes(result: dict[str, Any]) -> int:
    """What a result's payload counts: its string values in UTF-8, other values as JSON."""
    return sum(
        utf8_len(value if isinstance(value, str) else json.dumps(value, default=str))
        for value in result.values()
    )


def cut_output(pieces: list[str], output_bytes: int, limit: int) -> int:
    """Shorten the last of ``pieces`` so that the output is ``limit`` bytes; the new count."""
    if pieces and output_bytes > limit:
        last = pieces[-1]
        kept = utf8_prefix(last, utf8_len(last) - (output_bytes - limit))
        output_bytes -= utf8_len(last) - utf8_len(kept)
        pieces[-1] = kept
    return output_bytes


def _payload(line: bytes) -> bytes | None:
    """Return the JSON text a line carries, or None for lines that carry no event."""
    line = line.strip()
    if line.startswith(b"{"):
        return line
    if line.startswith(b"data:"):
        return line[5:].strip() or None
    return None


def _frame(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


Skipped = Callable[[int], None]  # told the size of each line that is not an event


def frame_lines(chunks: Iterable[bytes], skipped: Skipped | None = None) -> Iterator[bytes]:
    """Turn arbitrary byte chunks into whole ``data:`` frames, one per event line.

    ``skipped`` is told the size (stripped, as read) of each non-blank line that carries no
    event; it may raise.

    Raises:
        StreamError: the stream ended in the middle of a line that is not a JSON object.
    """
    pending: list[bytes] = []
    for chunk in chunks:
        if (
            not pending
            and chunk[:1] == b"{"
            and chunk.count(b"\n") == 2
            and chunk[-3:] == b"}\n\n"
            and b"\r" not in chunk
        ):
            yield b"data: " + chunk  # execd's usual chunk: exactly one bare event, nothing to strip
            continue
        frames = _frames_of(_whole_lines(chunk, pending), skipped)
        if frames:
            yield b"".join(frames)
    if pending:
        head, _, tail = b"".join(pending).rpartition(b"\r")
        frames = _frames_of([head], skipped)
        if frames:
            yield b"".join(frames)
        yield _final_frame(tail, skipped)


def _frames_of(lines: Iterable[bytes], skipped: Skipped | None) -> list[bytes]:
    """The ``data:`` frames of whole ``lines`` (a lone CR ends a line too, as in SSE)."""
    frames = []
    for line in lines:
        if not line:
            continue
        for part in _cr_parts(line):
            payload = _payload(part)
            if payload is not None:
                frames.append(_frame(payload))
            elif skipped is not None and part.strip():
                skipped(len(part.strip()))
    return frames


_NOT_CR = re.compile(rb"[^\r]+")


def _cr_parts(line: bytes) -> Iterator[bytes]:
    """The lines of ``line`` as SSE reads them (a lone CR ends one), the empty ones left out,
    one at a time: sseclient-py never sees a CR inside a line, which it would join line by
    line (quadratic time: a line of ``"a\\r"`` pairs at the cap took hours), and a flood of
    CRs costs neither time nor memory."""
    if b"\r" not in line:
        yield line
    else:
        for part in _NOT_CR.finditer(line):
            yield part.group()


def _whole_lines(chunk: bytes, pending: list[bytes]) -> list[bytes]:
    """The lines `chunk` completes (the first joined to what `pending` held); the unfinished
    tail stays in `pending`, changed in place."""
    if b"\n" not in chunk:
        if chunk:
            pending.append(chunk)
        return []
    lines = chunk.split(b"\n")
    if pending:
        pending.append(lines[0])
        lines[0] = b"".join(pending)
        pending.clear()
    tail = lines.pop()
    if tail:
        pending.append(tail)
    return lines


def _final_frame(tail: bytes, skipped: Skipped | None) -> bytes:
    payload = _final_payload(tail, skipped)
    return b"" if payload is None else _frame(payload)


def _final_payload(tail: bytes, skipped: Skipped | None) -> bytes | None:
    """A last line without a newline is an event only if it is a whole JSON object (else
    ``skipped`` is told its size, then the stream is truncated)."""
    if not tail.strip():
        return None
    payload = _payload(tail)
    if payload is not None:
        try:
            if isinstance(loads(payload), dict):
                return payload
        except ValueError:
            pass
    if skipped is not None:
        skipped(len(tail.strip()))
    raise StreamError(f"the event stream ended in the middle of an event ({len(tail)} bytes cut)")


_DECODER = json.JSONDecoder()
_decode_json = _DECODER.decode
_raw_decode = _DECODER.raw_decode


def decode_event(data: str) -> Event | None:
    """Decode one event's JSON text; None for anything that is not an event object."""
    try:
        check_depth(data)
        obj = _decode_json(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    return event_from_object(obj)


def _single_event(chunk: bytes) -> Event | None:
    """The event of a ``{...}\\n\\n`` chunk: like ``decode_event`` of its line, one call less."""
    text = chunk.decode("utf-8")
    try:
        check_depth(text)
        obj, end = _raw_decode(text)
    except (ValueError, RecursionError):
        return None
    # Anything between the object and the newlines ends in "}": not whitespace, so no event.
    if end != len(text) - 2 or not isinstance(obj, dict):
        return None
    return event_from_object(obj)


def event_from_object(obj: dict[str, Any]) -> Event | None:
    """Build an Event; a type-less ``{"code", "message"}`` object is an ``error`` event."""
    kind = obj.get("type")
    if kind is None:
        if "code" in obj and "message" in obj:
            kind = "error"
        else:
            return None
    text = obj.get("text")
    timestamp = obj.get("timestamp")
    return Event(
        kind if type(kind) is str else str(kind),
        text if isinstance(text, str) else None,
        timestamp if type(timestamp) is int else None,  # json makes int or bool, never subclasses
        obj,
    )


def iter_events(chunks: Iterable[bytes], skipped: Skipped | None = None) -> Iterator[Event]:
    """Decode the events of a byte stream.

    ``skipped`` is told the size of each non-blank line that is not an event (as read, without
    its line break and surrounding whitespace; a final line without a newline too), before
    the next event is decoded; it may raise, to end the stream.

    Raises:
        StreamError: truncated stream or bytes that are not UTF-8.
    """
    try:
        seen, bare = _sniff(iter(chunks))
        if bare:
            yield from _bare_events(seen, skipped)
        else:
            yield from _sse_events(seen, skipped)
    except UnicodeDecodeError as exc:
        raise StreamError(f"the event stream is not valid UTF-8 ({exc.reason})") from None


def _sniff(chunks: Iterator[bytes]) -> tuple[Iterator[bytes], bool]:
    """The same chunks, and whether the stream starts with ``{`` (real execd's bare lines)."""
    head: list[bytes] = []  # the blank start of the line still open (guard_lines bounds it)
    for chunk in chunks:
        start = chunk.lstrip()
        if start:
            head.append(chunk)
            return itertools.chain(head, chunks), start[:1] == b"{"
        # Blank lines carry nothing: a stream of them held every chunk (memory without bound).
        end = chunk.rfind(b"\n")
        if end >= 0:
            head.clear()
        if chunk[end + 1 :]:
            head.append(chunk[end + 1 :])
    return iter(head), False


def _sse_events(chunks: Iterable[bytes], skipped: Skipped | None) -> Iterator[Event]:
    """sseclient-py's events of ``data:`` frames, one per line (see ``frame_lines``)."""
    frames = frame_lines(chunks, skipped)
    for sse in sseclient.SSEClient(frames).events():  # type: ignore[arg-type]
        event = decode_event(sse.data)
        if event is not None:
            yield event
        elif skipped is not None:
            skipped(utf8_len(sse.data))


def _bare_events(chunks: Iterable[bytes], skipped: Skipped | None) -> Iterator[Event]:
    """The events of bare JSON lines, decoded directly; other lines go through sseclient-py."""
    pending: list[bytes] = []
    for chunk in chunks:
        if (
            not pending
            and chunk[:1] == b"{"
            and chunk[-3:] == b"}\n\n"
            and chunk.count(b"\n") == 2
            and b"\r" not in chunk
        ):
            event = _single_event(chunk)  # execd's usual chunk: exactly one event line
            if event is not None:
                yield event
            elif skipped is not None:
                skipped(len(chunk) - 2)
            continue
        for line in _whole_lines(chunk, pending):
            if line:
                yield from _line_events(line, skipped)
    if pending:
        head, _, tail = b"".join(pending).rpartition(b"\r")
        yield from _line_events(head, skipped)
        payload = _final_payload(tail, skipped)
        if payload is not None:
            yield from _line_events(payload, skipped)


def _line_events(line: bytes, skipped: Skipped | None) -> Iterator[Event]:
    """The event of one line of a bare stream (none for blank and SSE field lines); a line
    with a lone CR is the lines SSE reads in it. A ``data:`` line's payload is what
    sseclient-py's event would carry (``frame_lines`` frames it alone), so it is decoded here."""
    line = line.strip()
    if b"\r" in line:
        for part in _cr_parts(line):
            yield from _line_events(part, skipped)
        return
    payload = _payload(line)
    if payload is not None:
        event = decode_event(payload.decode("utf-8"))
        if event is not None:
            yield event
        elif skipped is not None:
            skipped(len(payload))
    elif line and skipped is not None:
        skipped(len(line))


def _first_not_none(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _as_traceback(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(line) for line in value]
    if isinstance(value, str):
        return [value]
    return []


def error_of(data: dict[str, Any]) -> ExecutionError:
    """The ExecutionError an error event describes (first non-None fields, defaults "" and [])."""
    if "type" not in data:  # execd's bare mid-stream failure
        name, value, traceback = data.get("code"), data.get("message"), None
    elif isinstance(data.get("error"), dict):
        err = data["error"]
        name = _first_not_none(err.get("ename"), err.get("name"))
        value = _first_not_none(err.get("evalue"), err.get("value"))
        traceback = err.get("traceback")
    else:
        name = data.get("name")
        value = _first_not_none(data.get("value"), data.get("text"))
        traceback = data.get("traceback")
    return ExecutionError(
        name="" if name is None else str(name),
        value="" if value is None else str(value),
        traceback=_as_traceback(traceback),
    )


def _result_of(data: dict[str, Any]) -> dict[str, Any]:
    results = data.get("results")
    if isinstance(results, dict):
        return results
    return {k: v for k, v in data.items() if k not in ("type", "timestamp", "execution_count")}


class ExecutionFolder:
    """Folds events, in order, into an ExecutionResult; counts the output it keeps."""

    def __init__(self) -> None:
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._results: list[dict[str, Any]] = []
        self._error: ExecutionError | None = None
        self._count: int | None = None
        self.execution_id: str | None = None
        # Never set: on /code, execution_complete may come first, while the code still runs;
        # only the end of the stream ends the run.
        self.completed = False
        # UTF-8 bytes of the stdout and stderr text and the result payloads kept so far.
        self.output_bytes = 0

    def add(self, event: Event) -> None:
        """Take one event into account."""
        kind = event.type
        text = event.text
        if kind == "stdout" and text:
            self._stdout.append(text)
            self.output_bytes += len(text) if text.isascii() else utf8_len(text)
        elif kind == "stderr" and text:
            self._stderr.append(text)
            self.output_bytes += len(text) if text.isascii() else utf8_len(text)
        elif kind == "result":
            result = _result_of(event.data)
            self._results.append(result)
            self.output_bytes += payload_bytes(result)
        elif kind == "execution_count" and self._count is None:
            self._count = _as_int(event.data.get("execution_count"))
        elif kind == "error" and self._error is None:
            self._error = error_of(event.data)
        elif kind == "init" and self.execution_id is None and text:
            self.execution_id = text

    def cut(self, last: Event, limit: int) -> None:
        """Keep ``limit`` bytes of output: ``last`` (the event added last) is shortened or,
        for a result, dropped."""
        if last.type == "result" and self._results and self.output_bytes > limit:
            self.output_bytes -= payload_bytes(self._results.pop())
        pieces = self._stderr if last.type == "stderr" else self._stdout
        self.output_bytes = cut_output(pieces, self.output_bytes, limit)

    def result(self) -> ExecutionResult:
        """The result of everything added so far."""
        return ExecutionResult(
            stdout="".join(self._stdout),
            stderr="".join(self._stderr),
            results=list(self._results),
            error=self._error,
            execution_count=self._count,
            execution_id=self.execution_id,
        )


def parse_execution(lines: Iterable[str | bytes]) -> ExecutionResult:
    """Fold already-received stream lines into an ExecutionResult (a pure function).

    Each item is one line (``data: {...}`` or a bare ``{...}``); other lines are skipped.
    """
    folder = ExecutionFolder()
    for item in lines:
        raw = item if isinstance(item, bytes) else item.encode("utf-8", "surrogatepass")
        for line in raw.splitlines():
            payload = _payload(line)
            if payload is None:
                continue
            event = decode_event(payload.decode("utf-8", "replace"))
            if event is not None:
                folder.add(event)
    return folder.result()
