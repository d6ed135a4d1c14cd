"""ExecutionStream: one live execd event stream, owned from first byte to close."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Generic, Iterable, Iterator, Protocol, TypeVar

import requests
import urllib3

from ._constants import CHUNK_SIZE, INTERRUPT_WAIT
from ._errors import OpenSandboxError, OutputLimitExceeded, SandboxTimeoutError, StreamError
from ._models import Event
from ._stream import ExecutionFolder, capped, iter_events
from ._watchdog import WATCHDOG, Scheduled

if TYPE_CHECKING:
    from types import TracebackType

logger = logging.getLogger("osb_sync")

R = TypeVar("R", covariant=True)


class Folder(Protocol[R]):
    """Folds a run's events into its result (``ExecutionFolder`` for code, one for commands)."""

    execution_id: str | None
    completed: bool  # a terminal event ended the run (commands); /code runs end at EOF only

    def add(self, event: Event) -> None: ...

    def result(self) -> R: ...


# What became of a run the client stopped reading, for error messages.
INTERRUPTED = "it was interrupted and has ended"
NOT_STARTED = "no interrupt was sent (execd had not named the run yet)"
INTERRUPT_FAILED = "interrupting it failed: its context may still be busy"
NOT_ENDED = (
    f"an interrupt was sent, but the run had not ended {INTERRUPT_WAIT:g} seconds later: "
    "its context may still be busy"
)
END_UNSEEN = (
    "an interrupt was sent, but the stream broke before the run's end could be seen: "
    "its context may still be busy"
)
IN_BACKGROUND = "an interrupt is being sent in the background: its context may still be busy"


class ExecutionStream(Generic[R]):
    """The events of one run, read live from execd; an iterator and a context manager.

    Iterating yields :class:`Event` objects and calls ``on_event`` for each, on the reading
    thread. Once exhausted, :meth:`result` returns the result (an :class:`ExecutionResult` for
    code). A ``/code`` run ends at the end of its stream only (execd may send
    ``execution_complete`` first, while the code still runs); with ``stop_at_terminal``
    (commands) the stream ends at the terminal event instead (``/command`` keeps its
    connection open about a second longer).

    When the client stops reading before the run's end (the deadline, the output cap,
    :meth:`close` or a ``with`` block left early, an exception in ``on_event``, a broken
    stream), it interrupts the run on execd and then waits, for at most ``INTERRUPT_WAIT``
    seconds, until the interrupt took effect: for code, until execd ends the run's stream (the
    rest is discarded), after which the context accepts runs again; for a command, until execd
    answers the interrupt (it kills the process group before answering). The error raised says
    which happened. A stream that stalled past the read timeout is not waited for again: its
    interrupt goes in the background.

    ``timeout`` is an overall deadline, checked on every chunk (execd pings every 3 s). Where
    urllib3 offers ``HTTPResponse.shutdown()`` (2.3+), a watchdog interrupts the run at the
    deadline and cuts a blocked read if the run has not ended ``INTERRUPT_WAIT`` seconds later,
    and :meth:`close` from another thread wakes a blocked reader at once; with older urllib3
    both wait at most for the read timeout.
    """

    def __init__(
        self,
        response: requests.Response,
        *,
        max_output_bytes: int,
        timeout: float | None = None,
        on_event: Callable[[Event], object] | None = None,
        interrupt: Callable[[str], bool] | None = None,
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
        self._reader: int | None = None  # the thread blocked in __next__, if any
        self._released = threading.Event()
        self._expired = False
        self._gave_up = False  # the run had not ended INTERRUPT_WAIT seconds after its interrupt
        self._interrupt_started = False
        self._interrupt_answered = threading.Event()
        self._interrupt_ok = False
        self._outcome = ""
        self._at_eof = False
        # Kept apart from the pipeline: after an interrupt, the rest is read from here.
        self._chunks = self._until_eof(response.iter_content(CHUNK_SIZE))
        chunks: Iterable[bytes] = self._chunks
        if self._deadline is not None:
            chunks = self._within_deadline(chunks)
        chunks = capped(chunks, max_output_bytes)
        self._events = iter_events(chunks)
        self._watchdog: Scheduled | None = None
        if timeout is not None and hasattr(response.raw, "shutdown"):
            self._watchdog = WATCHDOG.schedule(timeout, self._expire)

    def __iter__(self) -> ExecutionStream[R]:
        return self

    def __next__(self) -> Event:
        if self._state != "open":
            if self._state == "done":
                raise StopIteration
            raise StreamError(self._with_outcome("the stream is closed"), partial=self.partial())
        self._reader = threading.get_ident()
        try:
            event = self._next_event()
        finally:
            self._reader = None
        self._folder.add(event)
        if self._stop_at_terminal and self._folder.completed:
            self._end_of_stream()
        if self._on_event is not None:
            try:
                self._on_event(event)
            except BaseException:
                self._stop(readable=True)
                raise
        return event

    def _next_event(self) -> Event:
        try:
            return next(self._events)
        except StopIteration:
            if self._expired:  # the run ended because the watchdog interrupted it
                self._stop(readable=True)
                raise self._timeout_error() from None
            self._end_of_stream()
            raise
        except SandboxTimeoutError:
            self._stop(readable=True)
            raise self._timeout_error() from None
        except (OutputLimitExceeded, StreamError) as exc:
            self._stop(readable=True)
            if self._expired:
                raise self._timeout_error() from exc
            exc.args = (self._with_outcome(str(exc)),)
            exc.partial = self.partial()
            raise
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            self._stop(readable=False, stalled=_is_read_timeout(exc))
            raise self._broken(exc) from exc

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
                self._with_outcome("the stream was closed before its end; no complete result"),
                partial=self.partial(),
            )
        return self._folder.result()

    def close(self) -> None:
        """Close the connection; interrupt the run if it had not ended. Safe from any thread.

        On the reading thread (or with no reader), waits until the interrupt took effect, for
        at most ``INTERRUPT_WAIT`` seconds. From another thread, sends the interrupt and wakes
        the blocked reader at once, without waiting for the run's end.
        """
        with self._lock:
            if self._state != "open":
                return
            self._state = "closed"
            elsewhere = self._reader not in (None, threading.get_ident())
        if not elsewhere:
            if self._interrupt is not None and self._folder.execution_id is None:
                self._read_until_init()
            self._stop(readable=True)
            if self._outcome not in ("", INTERRUPTED):
                logger.warning("closing run %s early: %s", self.execution_id, self._outcome)
            return
        self._cancel_watchdog()
        if self._needs_interrupt():
            self._send_interrupt()
        self._shutdown_socket()
        self._response.close()

    def _until_eof(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        yield from chunks
        self._at_eof = True  # not reached when the read fails

    def _read_until_init(self) -> None:
        """Learn which run to interrupt: execd sends ``init`` with the headers, so it is near."""
        timer = threading.Timer(INTERRUPT_WAIT, self._shutdown_socket)
        timer.daemon = True
        timer.start()
        try:
            while self._folder.execution_id is None:
                self._folder.add(next(self._events))
        except (
            StopIteration,
            OpenSandboxError,
            requests.RequestException,
            urllib3.exceptions.HTTPError,
            OSError,
        ):
            pass
        finally:
            timer.cancel()

    def _within_deadline(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self._expired = True
                raise self._timeout_error()
            yield chunk

    def _expire(self) -> None:
        """The watchdog, at the deadline: interrupt, then cut the read if the run goes on."""
        self._expired = True
        if not (self._needs_interrupt() and self._send_interrupt()):
            self._shutdown_socket()
        elif not self._released.wait(INTERRUPT_WAIT):
            self._give_up()

    def _timeout_error(self) -> SandboxTimeoutError:
        message = f"the run did not finish within {self._timeout} seconds"
        return SandboxTimeoutError(self._with_outcome(message))

    def _with_outcome(self, message: str) -> str:
        return f"{message}; {self._outcome}" if self._outcome else message

    def _broken(self, exc: BaseException) -> SandboxTimeoutError | StreamError:
        if self._expired:
            return self._timeout_error()
        if self._state == "closed":
            return StreamError("the event stream broke: it was closed by another thread")
        message = self._with_outcome(f"the event stream broke: {_describe(exc)}")
        return StreamError(message, partial=self.partial())

    def _end_of_stream(self) -> None:
        with self._lock:
            closed_meanwhile = self._state == "closed"
            if not closed_meanwhile:
                self._state = "done"
        if closed_meanwhile:
            raise StreamError("the stream was closed while reading", partial=self.partial())
        self._release()

    def _stop(self, *, readable: bool, stalled: bool = False) -> None:
        """The client stops reading before the run's end: interrupt it and say what became of it."""
        with self._lock:
            if self._state == "open":
                self._state = "failed"
        self._cancel_watchdog()
        if not self._needs_interrupt():
            if self._folder.execution_id is None and self._interrupt is not None:
                self._outcome = NOT_STARTED
        elif stalled:
            threading.Thread(
                target=self._send_interrupt, name="osb-sync-interrupt", daemon=True
            ).start()
            self._outcome = IN_BACKGROUND
        else:
            self._outcome = self._interrupt_and_wait(readable)
        if not self._at_eof:
            self._shutdown_socket()
        self._release()

    def _interrupt_and_wait(self, readable: bool) -> str:
        if not self._send_interrupt():
            return INTERRUPT_FAILED
        if self._stop_at_terminal:
            return INTERRUPTED  # execd answers a command's interrupt once the command is gone
        if readable and self._read_to_end():
            return INTERRUPTED
        return NOT_ENDED if self._gave_up else END_UNSEEN

    def _read_to_end(self) -> bool:
        """Discard the rest of the stream; True if it reached its end within ``INTERRUPT_WAIT``."""
        give_up_at = time.monotonic() + INTERRUPT_WAIT
        timer = threading.Timer(INTERRUPT_WAIT, self._give_up)
        timer.daemon = True
        timer.start()
        try:
            for _ in self._chunks:
                if time.monotonic() >= give_up_at:
                    self._gave_up = True
                    return False
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
            return False
        finally:
            timer.cancel()
        return self._at_eof and not self._gave_up

    def _give_up(self) -> None:
        self._gave_up = True
        self._shutdown_socket()

    def _needs_interrupt(self) -> bool:
        return (
            self._interrupt is not None
            and self._folder.execution_id is not None
            and not self._folder.completed
        )

    def _send_interrupt(self) -> bool:
        """Interrupt the run once, whichever thread asks first; True if execd accepted it."""
        with self._lock:
            first = not self._interrupt_started
            self._interrupt_started = True
        if not first:
            self._interrupt_answered.wait(INTERRUPT_WAIT)
            return self._interrupt_ok
        run_id, interrupt = self._folder.execution_id, self._interrupt
        try:
            self._interrupt_ok = run_id is not None and interrupt is not None and interrupt(run_id)
        finally:
            self._interrupt_answered.set()
        return self._interrupt_ok

    def _cancel_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()

    def _release(self) -> None:
        self._cancel_watchdog()
        self._response.close()
        self._released.set()

    def _shutdown_socket(self) -> None:
        shutdown = getattr(self._response.raw, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:
                logger.debug("socket shutdown failed", exc_info=True)


def _is_read_timeout(exc: BaseException) -> bool:
    """Whether a transport error is a read that timed out (a stalled stream)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return False
        if isinstance(seen, (urllib3.exceptions.ReadTimeoutError, TimeoutError)):
            return True
        inner = seen.args[0] if seen.args and isinstance(seen.args[0], BaseException) else None
        seen = inner or seen.__cause__ or seen.__context__
    return False


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"
