"""One shared thread that fires callbacks at deadlines (run timeouts, whole-call bounds),
instead of a thread per run or call.

A ``threading.Timer`` per run costs a thread start (about 0.2 ms) even when the run ends long
before its deadline, as nearly every run does. Here a single daemon thread sleeps until the
earliest deadline; a callback that fires runs on a thread of its own, as a Timer's would, so a
slow one (an interrupt sent over HTTP) never delays another deadline. The thread is woken only
by a deadline earlier than the one it sleeps toward: a call that schedules its bound and
cancels it a millisecond later, as nearly every call does, costs it nothing.

:class:`Cutoff` is one call's whole-call bound, fired by the same thread.
"""

from __future__ import annotations

import heapq
import itertools
import math
import socket
import sys
import threading
import time
from typing import Any, Callable

from ._hooks import in_forked_child


class Scheduled:
    """A callback waiting for its deadline; :meth:`cancel` stops it if it has not fired."""

    __slots__ = ("_watchdog", "callback", "cancelled", "fired", "when")

    def __init__(self, when: float, callback: Callable[[], object], watchdog: Watchdog):
        self.when = when
        self.callback = callback
        self.cancelled = False
        self.fired = False
        self._watchdog = watchdog

    def cancel(self) -> None:
        """Do not fire (no effect once fired)."""
        self._watchdog._cancel(self)


class Watchdog:
    """Fires each scheduled callback at its deadline, on a new daemon thread."""

    def __init__(self, name: str = "osb-sync-watchdog"):
        self._name = name
        self._reset()
        in_forked_child(self._reset)  # the thread does not survive a fork

    def _reset(self) -> None:
        # Held (``with self._lock``: a C call, where the Condition's is a Python one) to change
        # the heap; the loop waits on the Condition over the same lock.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, Scheduled]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._cancelled = 0  # cancelled entries still in the heap
        self._wakes_at = math.inf  # when the thread wakes on its own (inf: only if notified)

    def schedule(self, delay: float, callback: Callable[[], object]) -> Scheduled:
        """Call ``callback()`` ``delay`` seconds from now unless the result is cancelled first.

        Returns:
            The handle whose ``cancel()`` stops it.
        """
        entry = Scheduled(time.monotonic() + delay, callback, self)
        with self._lock:
            self._drop_cancelled()
            heapq.heappush(self._heap, (entry.when, next(self._order), entry))
            if self._thread is None:
                thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                if _started(thread):
                    self._thread = thread
                # else the interpreter is exiting: the entry waits, never fired, and the call
                # is bounded by its read timeout alone
            elif entry.when < self._wakes_at:
                self._cond.notify()
        return entry

    def pending(self) -> int:
        """Callbacks neither fired nor cancelled (for tests)."""
        with self._lock:
            return sum(1 for _, _, entry in self._heap if not entry.cancelled)

    def _cancel(self, entry: Scheduled) -> None:
        with self._lock:
            if not (entry.cancelled or entry.fired):
                entry.cancelled = True
                entry.callback = _nothing  # let go of what it would have stopped
                self._cancelled += 1

    def _drop_cancelled(self) -> None:
        """Pop cancelled entries off the top; rebuild when most of the heap is cancelled."""
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
            self._cancelled -= 1
        if len(heap) > 64 and self._cancelled > len(heap) // 2:
            heap[:] = [item for item in heap if not item[2].cancelled]
            heapq.heapify(heap)
            self._cancelled = 0

    def _loop(self) -> None:
        while True:
            with self._cond:
                due = self._take_due()
            for entry in due:
                thread = threading.Thread(target=entry.callback, name=self._name, daemon=True)
                if not _started(thread):
                    entry.callback()  # the interpreter is exiting: fired here, late or not

    def _take_due(self) -> list[Scheduled]:
        """Wait (holding the condition) until something is due; return it, cancelled dropped."""
        while True:
            self._drop_cancelled()
            now = time.monotonic()
            due = []
            while self._heap and self._heap[0][0] <= now:
                entry = heapq.heappop(self._heap)[2]
                if entry.cancelled:
                    self._cancelled -= 1
                else:
                    entry.fired = True  # a cancel() from now on changes nothing
                    due.append(entry)
            if due:
                return due
            self._wakes_at = self._heap[0][0] if self._heap else math.inf
            self._cond.wait(self._wakes_at - now if self._heap else None)


def _nothing() -> None:
    return None


def _started(thread: threading.Thread) -> bool:
    """Start ``thread``; False when the interpreter is exiting and Python 3.12 refuses a new
    thread ("can't create new thread at interpreter shutdown"): the last lookup at exit for a
    failed create's sandbox is made then, and must not die of it."""
    try:
        thread.start()
    except RuntimeError:
        if not sys.is_finalizing() and threading.main_thread().is_alive():
            raise
        return False
    return True


WATCHDOG = Watchdog()


class Cutoff:
    """The instant one call must be over by: then the socket its answer comes on is shut down,
    which ends a read that bytes trickling in under the read timeout would keep alive for good.

    The instant is ``until`` (a ``time.monotonic()`` instant: a wait's deadline) or ``seconds``
    after :meth:`start`, whichever comes first. :meth:`start` once the request is sent, with
    its socket; :meth:`finish` once the answer is read or abandoned, and before its connection
    can serve another request (a cut after that would break the other request): it says
    whether the cut was made, or is being made (the connection is then of no further use).
    Both on the calling thread; the cut, on a thread of the watchdog's, needs no lock of its
    own: once ``finish`` has cancelled the timer (under the watchdog's lock), the timer's
    ``fired`` says for good whether the cut runs.
    """

    __slots__ = ("_finished", "_sock", "_timer", "by_deadline", "seconds", "until")

    def __init__(self, until: float | None, seconds: float | None):
        self.until = until
        self.seconds = seconds
        self.by_deadline = seconds is None
        self._sock: Any = None
        self._timer: Scheduled | None = None
        self._finished = False

    def start(self, sock: Any) -> None:
        """Arm (once) for the answer on ``sock`` (a socket, or None when it cannot be told)."""
        if self._timer is not None or self._finished:
            return
        self._sock = sock
        now = time.monotonic()
        when = math.inf if self.seconds is None else now + self.seconds
        if self.until is not None and self.until <= when:
            when, self.by_deadline = self.until, True
        self._timer = WATCHDOG.schedule(max(0.0, when - now), self._cut)

    def finish(self) -> bool:
        """Disarm (again: no effect); whether the cut was made."""
        timer = self._timer
        if not self._finished:
            self._finished = True
            if timer is not None:
                timer.cancel()
        return timer is not None and timer.fired

    def describe(self) -> str:
        """What the bound was, for an error message."""
        if self.by_deadline:
            return "the time left of its wait"
        return f"call_timeout ({self.seconds:g} s)"

    def _cut(self) -> None:
        sock = self._sock
        if isinstance(sock, socket.socket):  # not a TLS-in-TLS transport: its read times out
            try:
                # socket.socket's own shutdown: an SSLSocket's would tear down its TLS state
                # under the reader.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass  # closed meanwhile: its reader has ended
