"""Stream framing, capping and event folding for execd's event streams.

Pipeline, one stage per function::

    raw chunks -> capped() -> frame_lines() -> sseclient-py -> decode_event() -> ExecutionFolder

``frame_lines`` accepts both framings seen on the wire (``data: {...}`` lines, and real execd's
bare ``{...}`` lines) and hands sseclient-py one whole ``data:`` frame per event, so sseclient-py
never grows a buffer chunk by chunk: cost stays linear in the event size. Like the official SDKs,
every line is one event. ``ExecutionStream`` owns one HTTP response and turns faults into typed
errors.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import requests
import sseclient
import urllib3

from .errors import OutputLimitExceeded, SandboxTimeoutError, StreamError
from .models import Event, ExecutionError, ExecutionResult

if TYPE_CHECKING:
    from types import TracebackType

logger = logging.getLogger("osb_sync")

CHUNK_SIZE = 64 * 1024
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


def capped(chunks: Iterable[bytes], limit: int) -> Iterator[bytes]:
    """Yield chunks up to exactly ``limit`` bytes; raise OutputLimitExceeded past it.

    The part of the last chunk that still fits is yielded first, so that the events it
    completes (``init`` above all, which names the run to interrupt) are not lost.
    """
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            fits = len(chunk) - (total - limit)
            if fits > 0:
                yield chunk[:fits]
            raise OutputLimitExceeded(
                f"sandbox output exceeded {limit} bytes; the stream was closed "
                "(raise max_output_bytes to allow more)",
                limit=limit,
            )
        yield chunk


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


def frame_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Turn arbitrary byte chunks into whole ``data:`` frames, one per event line.

    Raises:
        StreamError: the stream ended in the middle of a line that is not a JSON object.
    """
    pending: list[bytes] = []
    for chunk in chunks:
        if b"\n" not in chunk:
            if chunk:
                pending.append(chunk)
            continue
        lines = chunk.split(b"\n")
        if pending:
            pending.append(lines[0])
            lines[0] = b"".join(pending)
            pending = []
        tail = lines.pop()
        if tail:
            pending.append(tail)
        frames = [_frame(p) for p in map(_payload, lines) if p is not None]
        if frames:
            yield b"".join(frames)
    if pending:
        yield _final_frame(b"".join(pending))


def _final_frame(tail: bytes) -> bytes:
    """A last line without a newline is an event only if it is a whole JSON object."""
    if not tail.strip():
        return b""
    payload = _payload(tail)
    if payload is not None:
        try:
            if isinstance(json.loads(payload), dict):
                return _frame(payload)
        except ValueError:
            pass
    raise StreamError(f"the event stream ended in the middle of an event ({len(tail)} bytes cut)")


def decode_event(data: str | bytes) -> Event | None:
    """Decode one event's JSON text; None for anything that is not an event object."""
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    if not isinstance(obj, dict):
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
        type=str(kind),
        text=text if isinstance(text, str) else None,
        timestamp=timestamp
        if isinstance(timestamp, int) and not isinstance(timestamp, bool)
        else None,
        data=obj,
    )


def iter_events(chunks: Iterable[bytes]) -> Iterator[Event]:
    """Decode the events of a byte stream.

    Raises:
        StreamError: truncated stream or bytes that are not UTF-8.
    """
    events = sseclient.SSEClient(frame_lines(chunks)).events()  # type: ignore[arg-type]
    while True:
        try:
            sse = next(events)
        except StopIteration:
            return
        except UnicodeDecodeError as exc:
            raise StreamError(f"the event stream is not valid UTF-8 ({exc.reason})") from None
        event = decode_event(sse.data)
        if event is not None:
            yield event


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


def _error_of(data: dict[str, Any]) -> ExecutionError:
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
    """Folds events, in order, into an ExecutionResult."""

    def __init__(self) -> None:
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._results: list[dict[str, Any]] = []
        self._error: ExecutionError | None = None
        self._count: int | None = None
        self.execution_id: str | None = None
        self.completed = False

    def add(self, event: Event) -> None:
        """Take one event into account."""
        kind = event.type
        if kind == "stdout" and event.text:
            self._stdout.append(event.text)
        elif kind == "stderr" and event.text:
            self._stderr.append(event.text)
        elif kind == "result":
            self._results.append(_result_of(event.data))
        elif kind == "execution_count" and self._count is None:
            self._count = _as_int(event.data.get("execution_count"))
        elif kind == "error" and self._error is None:
            self._error = _error_of(event.data)
        elif kind == "init" and self.execution_id is None and event.text:
            self.execution_id = event.text
        elif kind == "execution_complete":
            self.completed = True

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


class ExecutionStream:
    """The events of one run, read live from execd; an iterator and a context manager.

    Iterating yields :class:`Event` objects and calls ``on_event`` for each, on the reading
    thread. Once exhausted, :meth:`result` returns the :class:`ExecutionResult`. Leaving a
    ``with`` block early, or calling :meth:`close` (from any thread), closes the connection and
    interrupts the run on the server, so the context is free for the next run.

    ``timeout`` is an overall deadline, checked on every chunk (execd pings every 3 s). Where
    urllib3 offers ``HTTPResponse.shutdown()`` (2.3+), a watchdog cuts a blocked read at the
    deadline and :meth:`close` wakes a blocked reader at once; with older urllib3 both wait at
    most for the read timeout.
    """

    def __init__(
        self,
        response: requests.Response,
        *,
        max_output_bytes: int,
        timeout: float | None = None,
        on_event: Callable[[Event], object] | None = None,
        interrupt: Callable[[str], None] | None = None,
    ):
        self._response = response
        self._on_event = on_event
        self._interrupt = interrupt
        self._timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._folder = ExecutionFolder()
        self._state = "open"  # open -> done | closed | failed
        self._lock = threading.Lock()
        self._expired = False
        self._interrupt_sent = False
        chunks = capped(self._within_deadline(response.iter_content(CHUNK_SIZE)), max_output_bytes)
        self._events = iter_events(chunks)
        self._watchdog: threading.Timer | None = None
        if timeout is not None and hasattr(response.raw, "shutdown"):
            self._watchdog = threading.Timer(timeout, self._expire)
            self._watchdog.daemon = True
            self._watchdog.start()

    def __iter__(self) -> ExecutionStream:
        return self

    def __next__(self) -> Event:
        if self._state != "open":
            if self._state == "done":
                raise StopIteration
            raise StreamError("the stream is closed", partial=self._folder.result())
        try:
            event = next(self._events)
        except StopIteration:
            self._end_of_stream()
            raise
        except (OutputLimitExceeded, StreamError) as exc:
            self._fail()
            if self._expired:
                raise self._timeout_error() from exc
            exc.partial = self._folder.result()
            raise
        except SandboxTimeoutError:
            self._fail()
            raise
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            self._fail()
            raise self._broken(exc) from exc
        self._folder.add(event)
        if self._on_event is not None:
            try:
                self._on_event(event)
            except BaseException:
                self._fail()
                raise
        return event

    def __enter__(self) -> ExecutionStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def execution_id(self) -> str | None:
        """The ``init`` event's text once it has arrived (for ``/code``, the context id)."""
        return self._folder.execution_id

    def result(self) -> ExecutionResult:
        """Read what is left of the stream and return the result.

        Raises:
            StreamError: the stream was closed or failed before its end.
        """
        if self._state == "open":
            for _ in self:
                pass
        if self._state != "done":
            raise StreamError(
                "the stream was closed before its end; no complete result",
                partial=self._folder.result(),
            )
        return self._folder.result()

    def close(self) -> None:
        """Close the connection; interrupt the run if it had not finished. Safe from any thread."""
        with self._lock:
            if self._state != "open":
                return
            self._state = "closed"
        self._release(interrupt=True)

    def _within_deadline(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self._expired = True
                raise self._timeout_error()
            yield chunk

    def _expire(self) -> None:
        self._expired = True
        self._shutdown_socket()

    def _timeout_error(self) -> SandboxTimeoutError:
        return SandboxTimeoutError(
            f"the run did not finish within {self._timeout} seconds; it was interrupted"
        )

    def _broken(self, exc: BaseException) -> SandboxTimeoutError | StreamError:
        if self._expired:
            return self._timeout_error()
        reason = "it was closed by another thread" if self._state == "closed" else _describe(exc)
        return StreamError(f"the event stream broke: {reason}", partial=self._folder.result())

    def _end_of_stream(self) -> None:
        with self._lock:
            closed_meanwhile = self._state == "closed"
            if not closed_meanwhile:
                self._state = "done"
        if closed_meanwhile:
            raise StreamError("the stream was closed while reading", partial=self._folder.result())
        self._release(interrupt=False)

    def _fail(self) -> None:
        with self._lock:
            if self._state == "open":
                self._state = "failed"
        self._release(interrupt=True)

    def _release(self, *, interrupt: bool) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        if interrupt:
            self._shutdown_socket()
        self._response.close()
        if interrupt and not self._folder.completed:
            self._interrupt_run()

    def _shutdown_socket(self) -> None:
        shutdown = getattr(self._response.raw, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:
                logger.debug("socket shutdown failed", exc_info=True)

    def _interrupt_run(self) -> None:
        run_id = self._folder.execution_id
        with self._lock:
            if self._interrupt_sent or run_id is None or self._interrupt is None:
                return
            self._interrupt_sent = True
        self._interrupt(run_id)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"
