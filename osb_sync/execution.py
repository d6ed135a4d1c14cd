"""ExecutionStream: one live execd event stream, owned from first byte to close."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Generic, Iterable, Iterator, Protocol, TypeVar

import requests
import urllib3

from .errors import OutputLimitExceeded, SandboxTimeoutError, StreamError
from .models import Event
from .stream import ExecutionFolder, capped, iter_events

if TYPE_CHECKING:
    from types import TracebackType

logger = logging.getLogger("osb_sync")

CHUNK_SIZE = 64 * 1024

R = TypeVar("R", covariant=True)


class Folder(Protocol[R]):
    """Folds a run's events into its result (``ExecutionFolder`` for code, one for commands)."""

    execution_id: str | None
    completed: bool  # a terminal event arrived: the run needs no interrupt

    def add(self, event: Event) -> None: ...

    def result(self) -> R: ...


class ExecutionStream(Generic[R]):
    """The events of one run, read live from execd; an iterator and a context manager.

    Iterating yields :class:`Event` objects and calls ``on_event`` for each, on the reading
    thread. Once exhausted, :meth:`result` returns the result (an :class:`ExecutionResult` for
    code). Leaving a ``with`` block early, or calling :meth:`close` (from any thread), closes
    the connection and interrupts the run on the server, so the context is free for the next
    run. With ``stop_at_terminal`` the stream ends at the terminal event (``/command`` keeps
    its connection open about a second longer).

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
        folder: Folder[R] | None = None,
        stop_at_terminal: bool = False,
    ):
        self._response = response
        self._stop_at_terminal = stop_at_terminal
        self._on_event = on_event
        self._interrupt = interrupt
        self._timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._folder: Folder[R] = folder if folder is not None else ExecutionFolder()  # type: ignore[assignment]
        self._state = "open"  # open -> done | closed | failed
        self._lock = threading.Lock()
        self._expired = False
        self._interrupt_sent = False
        chunks: Iterable[bytes] = response.iter_content(CHUNK_SIZE)
        if self._deadline is not None:
            chunks = self._within_deadline(chunks)
        chunks = capped(chunks, max_output_bytes)
        self._events = iter_events(chunks)
        self._watchdog: threading.Timer | None = None
        if timeout is not None and hasattr(response.raw, "shutdown"):
            self._watchdog = threading.Timer(timeout, self._expire)
            self._watchdog.daemon = True
            self._watchdog.start()

    def __iter__(self) -> ExecutionStream[R]:
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
        if self._stop_at_terminal and self._folder.completed:
            self._end_of_stream()
        if self._on_event is not None:
            try:
                self._on_event(event)
            except BaseException:
                self._fail()
                raise
        return event

    def __enter__(self) -> ExecutionStream[R]:
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

    def partial(self) -> R:
        """The result of the events received so far."""
        return self._folder.result()

    def result(self) -> R:
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
