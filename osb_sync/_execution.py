"""ExecutionStream: one live execd event stream, owned from first byte to close.

A stream's state is one machine, after h11's ``_state.py``: :class:`State` names where a
stream can be, :data:`TRANSITIONS` lists every legal move, and :func:`process_event` makes one
(raising :class:`IllegalTransition` for any other). What became of a run the client stopped
reading is the state its moves came to rest in (:data:`OUTCOMES`), never a flag set on the
side. Three threads move a stream: its reader, the watchdog at the run's deadline, and a
thread that closes it; every move is made under the stream's one lock.

The moves (``DEADLINE`` and ``GIVE_UP`` come from timers, which may fire just as the stream
moves on: where they have no move of their own, they change nothing)::

    OPEN ──END──▶ ENDED                         read to its end (OPEN, EXPIRED and CUT alike)
    OPEN ──DEADLINE──▶ EXPIRED ──GIVE_UP──▶ CUT  the watchdog interrupts; later cuts the read
    OPEN ──CLOSE_ELSEWHERE──▶ CLOSING            another thread closes it under its reader
    OPEN, EXPIRED, CUT, CLOSING ──STOP──▶ STOPPING   the client stops reading before the end
    STOPPING ──NOTHING_TO_INTERRUPT──▶ LEFT      the run had completed (or no interrupt given)
             ──UNNAMED──▶ NOT_STARTED            execd had not named the run
             ──STALLED──▶ IN_BACKGROUND          the read timed out: interrupt in background
             ──INTERRUPT──▶ INTERRUPTING ──REFUSED──▶ INTERRUPT_FAILED
                                         ──RUN_ENDED──▶ INTERRUPTED   (a command)
                                         ──ACCEPTED──▶ DRAINING       (code)
    DRAINING ──RUN_ENDED──▶ INTERRUPTED | ──GIVE_UP──▶ NOT_ENDED | ──BROKE──▶ END_UNSEEN
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Callable, Generic, Iterable, Iterator, Mapping, Protocol, TypeVar

import requests
import urllib3

from ._constants import CHUNK_SIZE, INTERRUPT_WAIT
from ._errors import (
    OpenSandboxError,
    OutputLimitExceeded,
    SandboxTimeoutError,
    StreamError,
    redact,
)
from ._models import Event
from ._stream import (
    FRAME_ALLOWANCE,
    ExecutionFolder,
    guard_lines,
    held_exceeded,
    iter_events,
    not_an_event_exceeded,
    output_exceeded,
)
from ._watchdog import WATCHDOG, Scheduled

if TYPE_CHECKING:
    from types import TracebackType

logger = logging.getLogger("osb_sync")

R = TypeVar("R", covariant=True)


class Folder(Protocol[R]):
    """Folds a run's events into its result (``ExecutionFolder`` for code, one for commands)."""

    execution_id: str | None
    completed: bool  # a terminal event ended the run (commands); /code runs end at EOF only
    output_bytes: int  # the output kept so far, as a user reads it (UTF-8 bytes)

    def add(self, event: Event) -> None: ...

    def cut(self, last: Event, limit: int) -> None: ...  # keep ``limit`` bytes of output

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


class State(enum.Enum):
    """Where a stream is; a stopped stream's last state says what became of its run."""

    OPEN = "open"  # reading; the run goes on
    EXPIRED = "expired"  # reading past the deadline: the watchdog is interrupting the run
    CUT = "cut"  # ... and the run had not ended INTERRUPT_WAIT later: the read was cut
    CLOSING = "closing"  # another thread closed the stream: its blocked reader is being woken
    ENDED = "ended"  # read to its end (EOF, or a command's terminal event): the result is whole
    STOPPING = "stopping"  # the client stopped reading before the run's end
    INTERRUPTING = "interrupting"  # ... and is sending the interrupt
    DRAINING = "draining"  # execd accepted it: the rest is discarded until execd ends the run
    # At rest after a stop:
    LEFT = "left"  # nothing to interrupt: the run had completed, or there is no interrupt
    NOT_STARTED = "not started"
    IN_BACKGROUND = "in background"
    INTERRUPT_FAILED = "interrupt failed"
    INTERRUPTED = "interrupted"
    NOT_ENDED = "not ended"
    END_UNSEEN = "end unseen"


class Trigger(enum.Enum):
    """What happens to a stream; each moves it from one :class:`State` to the next."""

    END = "the stream reached its end"
    DEADLINE = "the run's deadline passed"
    GIVE_UP = "the run had not ended INTERRUPT_WAIT seconds after its interrupt"
    CLOSE_ELSEWHERE = "another thread closed the stream while a reader was in it"
    STOP = "the client stops reading before the run's end"
    NOTHING_TO_INTERRUPT = "the run had completed, or the stream has no interrupt"
    UNNAMED = "execd had not named the run: it cannot be interrupted"
    STALLED = "the read timed out: the interrupt is sent in the background"
    INTERRUPT = "the client sends the interrupt"
    REFUSED = "the interrupt failed"
    ACCEPTED = "execd accepted the interrupt of a code run"
    RUN_ENDED = "the interrupted run ended (its stream's end, or a command's interrupt answered)"
    BROKE = "the rest of the stream could not be read"


S, T = State, Trigger
# Timers fire while the stream moves on: where these have no move, they change nothing.
_LATE = (T.DEADLINE, T.GIVE_UP)
_MOVES: dict[State, dict[Trigger, State]] = {
    S.OPEN: {
        T.END: S.ENDED,
        T.DEADLINE: S.EXPIRED,
        T.CLOSE_ELSEWHERE: S.CLOSING,
        T.STOP: S.STOPPING,
    },
    # The deadline outranks a close from elsewhere: the reader's error is still a timeout.
    S.EXPIRED: {T.END: S.ENDED, T.GIVE_UP: S.CUT, T.CLOSE_ELSEWHERE: S.EXPIRED, T.STOP: S.STOPPING},
    S.CUT: {T.END: S.ENDED, T.CLOSE_ELSEWHERE: S.CUT, T.STOP: S.STOPPING},
    S.CLOSING: {T.STOP: S.STOPPING},
    S.ENDED: {},
    S.STOPPING: {
        T.NOTHING_TO_INTERRUPT: S.LEFT,
        T.UNNAMED: S.NOT_STARTED,
        T.STALLED: S.IN_BACKGROUND,
        T.INTERRUPT: S.INTERRUPTING,
    },
    S.INTERRUPTING: {
        T.REFUSED: S.INTERRUPT_FAILED,
        T.ACCEPTED: S.DRAINING,
        T.RUN_ENDED: S.INTERRUPTED,
    },
    S.DRAINING: {T.RUN_ENDED: S.INTERRUPTED, T.GIVE_UP: S.NOT_ENDED, T.BROKE: S.END_UNSEEN},
    S.LEFT: {},
    S.NOT_STARTED: {},
    S.IN_BACKGROUND: {},
    S.INTERRUPT_FAILED: {},
    S.INTERRUPTED: {},
    # The drain's own end, after its timer gave up first, changes nothing.
    S.NOT_ENDED: {T.RUN_ENDED: S.NOT_ENDED, T.BROKE: S.NOT_ENDED},
    S.END_UNSEEN: {},
}
TRANSITIONS: Mapping[State, Mapping[Trigger, State]] = {
    state: {**{late: state for late in _LATE}, **moves} for state, moves in _MOVES.items()
}
del S, T

READING = frozenset({State.OPEN, State.EXPIRED, State.CUT})  # __next__ reads, close() acts
STOPPABLE = READING | {State.CLOSING}
PAST_DEADLINE = frozenset({State.EXPIRED, State.CUT})
# The sentence each resting state adds to an error message.
OUTCOMES: Mapping[State, str] = {
    State.NOT_STARTED: NOT_STARTED,
    State.IN_BACKGROUND: IN_BACKGROUND,
    State.INTERRUPT_FAILED: INTERRUPT_FAILED,
    State.INTERRUPTED: INTERRUPTED,
    State.NOT_ENDED: NOT_ENDED,
    State.END_UNSEEN: END_UNSEEN,
}


class IllegalTransition(RuntimeError):
    """A move :data:`TRANSITIONS` does not list: a bug in osb_sync, never the caller's doing."""


def process_event(state: State, trigger: Trigger) -> State:
    """The state ``trigger`` moves a stream in ``state`` to.

    Raises:
        IllegalTransition: ``trigger`` has no move from ``state``.
    """
    try:
        return TRANSITIONS[state][trigger]
    except KeyError:
        raise IllegalTransition(f"{trigger.name} is not a move from {state.name}") from None


class _Body:
    """The response body's chunks, and whether they were read to the end.

    A fact of the connection, not of the run: once the body is read to its end urllib3 may
    hand the connection to another request, so its socket must not be shut down then.
    """

    def __init__(self, chunks: Iterable[bytes]):
        self.at_end = False
        self.chunks = self._read(chunks)

    def _read(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        yield from chunks
        self.at_end = True  # not reached when the read fails


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

    ``max_output_bytes`` caps every byte the client holds of the run: the output as a user
    reads it (the folder's ``output_bytes``: stdout and stderr text, result payloads), and
    what is not decoded yet by its size on the wire, as it arrives: the line being read may
    hold the room the output left plus ``FRAME_ALLOWANCE`` (its framing), and a line that is
    not an event (with or without its newline) the room the output left. Past the cap the
    output is cut to exactly the cap (``partial``) and the run stopped as above. Decoded
    framing is not counted; memory stays bounded by the cap, however long a line.

    ``timeout`` is an overall deadline, checked on every chunk (execd pings every 3 s); it
    runs from ``deadline`` minus ``timeout`` (the instant the run's request was sent, given by
    the caller), else from the stream's construction. Where
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
        deadline: float | None = None,
        secrets: Iterable[str] = (),
    ):
        self._response = response
        self._secrets = tuple(secrets)  # what the peer may echo, never shown (the token)
        self._stop_at_terminal = stop_at_terminal
        self._on_event = on_event
        self._interrupt = interrupt
        self._timeout = timeout
        # The run's deadline starts when its call starts (``deadline``, a monotonic instant,
        # set before the request was sent), not when the answer's headers arrive.
        if deadline is None and timeout is not None:
            deadline = time.monotonic() + timeout
        self._deadline = deadline
        self._folder: Folder[R] = folder if folder is not None else ExecutionFolder()  # type: ignore[assignment]
        self._max_output = max_output_bytes
        self._state = State.OPEN
        self._changed = threading.Condition(threading.Lock())  # guards and announces _state
        self._reader: int | None = None  # the thread blocked in __next__, if any
        self._interrupt_answer: Future[bool] | None = None  # the one interrupt, once sent
        # Kept apart from the pipeline: after an interrupt, the rest is read from here.
        self._body = _Body(response.iter_content(CHUNK_SIZE))
        chunks: Iterable[bytes] = self._body.chunks
        if self._deadline is not None:
            chunks = self._within_deadline(chunks)
        chunks = guard_lines(chunks, self._line_room, self._held_too_much)
        self._events = iter_events(chunks, self._skipped_line)
        self._watchdog: Scheduled | None = None
        if deadline is not None and hasattr(response.raw, "shutdown"):
            self._watchdog = WATCHDOG.schedule(max(0.0, deadline - time.monotonic()), self._expire)

    def __iter__(self) -> ExecutionStream[R]:
        return self

    def __next__(self) -> Event:
        state = self._state
        if state not in READING:
            if state is State.ENDED:
                raise StopIteration
            raise StreamError(self._with_outcome("the stream is closed"), partial=self.partial())
        self._reader = threading.get_ident()
        try:
            event = self._next_event()
        finally:
            self._reader = None
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
        """The next event, added to the folder; the output cap is checked here."""
        try:
            event = next(self._events)
            self._folder.add(event)
            if self._folder.output_bytes > self._max_output:
                self._folder.cut(event, self._max_output)
                raise output_exceeded(self._max_output)
            return event
        except StopIteration:
            if self._state in PAST_DEADLINE:  # the run ended because the watchdog interrupted it
                self._stop(readable=True)
                raise self._timeout_error() from None
            self._end_of_stream()
            raise
        except SandboxTimeoutError:
            self._stop(readable=True)
            raise self._timeout_error() from None
        except (OutputLimitExceeded, StreamError) as exc:
            if self._stop(readable=True) in PAST_DEADLINE:
                raise self._timeout_error() from exc
            exc.args = (self._with_outcome(str(exc)),)
            if isinstance(exc, OutputLimitExceeded):
                exc.partial_from(self._folder.result)  # joined only if read: no 2x peak
            else:
                exc.partial = self.partial()
            raise
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            stopped_from = self._stop(readable=False, stalled=_is_read_timeout(exc))
            error = self._broken(exc, stopped_from)
            if redact(_describe(exc), self._secrets) == _describe(exc):
                raise error from exc
        # Outside the except: chained, the wire's error would show the secret the peer sent
        # (urllib3 quotes a bad chunk-size line).
        raise error

    def _line_room(self) -> int:
        """What the line being read may hold: the room the output left, and its framing."""
        return max(0, self._max_output - self._folder.output_bytes) + FRAME_ALLOWANCE

    def _held_too_much(self, limit: int) -> OutputLimitExceeded:
        return held_exceeded(self._max_output, self._folder.output_bytes)

    def _skipped_line(self, size: int) -> None:
        """A line that is not an event counts by its size on the wire while it is held."""
        if self._folder.output_bytes + size > self._max_output:
            raise not_an_event_exceeded(self._max_output, size, self._folder.output_bytes)

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

    @property
    def response(self) -> requests.Response:
        """The HTTP response the events are read from (its status, headers and request; its
        body is the stream's)."""
        return self._response

    def partial(self) -> R:
        """The result of the events received so far."""
        return self._folder.result()

    def result(self) -> R:
        """Read what is left of the stream and return the result.

        Raises:
            StreamError: the stream was closed or failed before its end.
        """
        if self._state in READING:
            for _ in self:
                pass
        if self._state is not State.ENDED:
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
        with self._changed:
            if self._state not in READING:
                return
            elsewhere = self._reader not in (None, threading.get_ident())
            stopped_from = self._move_locked(Trigger.CLOSE_ELSEWHERE if elsewhere else Trigger.STOP)
        if not elsewhere:
            if self._interrupt is not None and self._folder.execution_id is None:
                self._read_until_init()
            self._finish_stop(stopped_from, readable=True)
            outcome = OUTCOMES.get(self._state, "")
            if outcome not in ("", INTERRUPTED):
                run = redact(self.execution_id or "", self._secrets)
                logger.warning("closing run %s early: %s", run, outcome)
            return
        self._cancel_watchdog()
        if self._needs_interrupt():
            self._send_interrupt()
        self._shutdown_socket()
        self._response.close()

    # -- the state machine ----------------------------------------------------------------------

    def _move(self, trigger: Trigger) -> State:
        """Make the move ``trigger`` makes from the current state; return the state it left."""
        with self._changed:
            return self._move_locked(trigger)

    def _move_locked(self, trigger: Trigger) -> State:
        before = self._state
        self._state = process_event(before, trigger)
        if self._state is not before:
            self._changed.notify_all()
        return before

    def _stop(self, *, readable: bool, stalled: bool = False) -> State:
        """The client stops reading before the run's end; returns the state it stopped from."""
        with self._changed:
            before = self._state
            if before in STOPPABLE:
                self._move_locked(Trigger.STOP)
        self._finish_stop(before, readable=readable, stalled=stalled)
        return before

    def _finish_stop(self, stopped_from: State, *, readable: bool, stalled: bool = False) -> None:
        """Interrupt the run if it goes on, wait for that to take effect, and let go."""
        self._cancel_watchdog()
        if stopped_from in STOPPABLE:  # otherwise ended, or stopped already (by another reader)
            self._settle(readable=readable, stalled=stalled, cut=stopped_from is State.CUT)
        if not self._body.at_end:
            self._shutdown_socket()
        self._release()

    def _settle(self, *, readable: bool, stalled: bool, cut: bool) -> None:
        """From STOPPING to a resting state, which says what became of the run."""
        if not self._needs_interrupt():
            unnamed = self._folder.execution_id is None and self._interrupt is not None
            self._move(Trigger.UNNAMED if unnamed else Trigger.NOTHING_TO_INTERRUPT)
            return
        if stalled:
            threading.Thread(
                target=self._send_interrupt, name="osb-sync-interrupt", daemon=True
            ).start()
            self._move(Trigger.STALLED)
            return
        self._move(Trigger.INTERRUPT)
        if not self._send_interrupt():
            self._move(Trigger.REFUSED)
        elif self._stop_at_terminal:
            self._move(Trigger.RUN_ENDED)  # execd answers a command's interrupt once it is gone
        else:
            self._move(Trigger.ACCEPTED)
            if cut:  # the watchdog waited for the run's end already, and cut the read
                self._move(Trigger.GIVE_UP)
            elif readable:
                self._drain()
            else:
                self._move(Trigger.BROKE)

    def _drain(self) -> None:
        """Discard the rest of the stream, waiting at most ``INTERRUPT_WAIT`` for its end."""
        give_up_at = time.monotonic() + INTERRUPT_WAIT
        timer = WATCHDOG.schedule(INTERRUPT_WAIT, self._give_up)
        try:
            for _ in self._body.chunks:
                if time.monotonic() >= give_up_at:
                    self._move(Trigger.GIVE_UP)
                    return
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
            self._move(Trigger.BROKE)
            return
        finally:
            timer.cancel()
        self._move(Trigger.RUN_ENDED if self._body.at_end else Trigger.BROKE)

    def _expire(self) -> None:
        """The watchdog, at the deadline: interrupt, then cut the read if the run goes on."""
        if self._move(Trigger.DEADLINE) is not State.OPEN:
            return  # the reader met the deadline or stopped first, or another thread closed it
        if not (self._needs_interrupt() and self._send_interrupt()):
            self._shutdown_socket()
            return
        with self._changed:
            taken_over = self._changed.wait_for(
                lambda: self._state is not State.EXPIRED, INTERRUPT_WAIT
            )
        if not taken_over:
            self._give_up()

    def _give_up(self) -> None:
        """The run had not ended ``INTERRUPT_WAIT`` after its interrupt: cut the read."""
        if self._move(Trigger.GIVE_UP) in (State.EXPIRED, State.DRAINING):
            self._shutdown_socket()

    def _end_of_stream(self) -> None:
        with self._changed:
            closed_meanwhile = self._state not in READING
            if not closed_meanwhile:
                self._move_locked(Trigger.END)
        if closed_meanwhile:
            raise StreamError("the stream was closed while reading", partial=self.partial())
        self._release()

    # -- reading --------------------------------------------------------------------------------

    def _read_until_init(self) -> None:
        """Learn which run to interrupt: execd sends ``init`` with the headers, so it is near."""
        timer = WATCHDOG.schedule(INTERRUPT_WAIT, self._shutdown_socket)
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
                self._move(Trigger.DEADLINE)
                raise self._timeout_error()
            yield chunk

    def _timeout_error(self) -> SandboxTimeoutError:
        message = f"the run did not finish within {self._timeout} seconds"
        return SandboxTimeoutError(self._with_outcome(message))

    def _with_outcome(self, message: str) -> str:
        outcome = OUTCOMES.get(self._state)
        return f"{message}; {outcome}" if outcome else message

    def _broken(self, exc: BaseException, stopped_from: State) -> SandboxTimeoutError | StreamError:
        if stopped_from in PAST_DEADLINE:
            return self._timeout_error()
        if stopped_from is State.CLOSING:
            return StreamError("the event stream broke: it was closed by another thread")
        broke = redact(_describe(exc), self._secrets)
        return StreamError(
            self._with_outcome(f"the event stream broke: {broke}"), partial=self.partial()
        )

    # -- the interrupt and the connection -------------------------------------------------------

    def _needs_interrupt(self) -> bool:
        return (
            self._interrupt is not None
            and self._folder.execution_id is not None
            and not self._folder.completed
        )

    def _send_interrupt(self) -> bool:
        """Interrupt the run once, whichever thread asks first; True if execd accepted it."""
        with self._changed:
            answer, first = self._interrupt_answer, self._interrupt_answer is None
            if answer is None:
                answer = self._interrupt_answer = Future()
        if not first:
            try:
                return answer.result(INTERRUPT_WAIT)
            except FutureTimeout:
                return False
        run_id, interrupt = self._folder.execution_id, self._interrupt
        accepted = False
        try:
            accepted = run_id is not None and interrupt is not None and interrupt(run_id)
        finally:
            answer.set_result(accepted)
        return accepted

    def _cancel_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()

    def _release(self) -> None:
        self._cancel_watchdog()
        self._response.close()

    def _shutdown_socket(self) -> None:
        shutdown = getattr(self._response.raw, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except (OSError, ValueError, RuntimeError) as exc:  # urllib3: no socket, or released
                # Often while a broken stream is handled: no traceback, whose chain would quote
                # the wire (a secret the peer sent among it).
                logger.debug("socket shutdown failed: %r", exc)


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
