"""One shared thread that fires callbacks at deadlines (run timeouts), instead of a thread per run.

A ``threading.Timer`` per run costs a thread start (about 0.2 ms) even when the run ends long
before its deadline, as nearly every run does. Here a single daemon thread sleeps until the
earliest deadline; a callback that fires runs on a thread of its own, as a Timer's would, so a
slow one (an interrupt sent over HTTP) never delays another deadline.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable

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
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Scheduled]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._cancelled = 0  # cancelled entries still in the heap

    def schedule(self, delay: float, callback: Callable[[], object]) -> Scheduled:
        """Call ``callback()`` ``delay`` seconds from now unless the result is cancelled first.

        Returns:
            The handle whose ``cancel()`` stops it.
        """
        entry = Scheduled(time.monotonic() + delay, callback, self)
        with self._cond:
            self._drop_cancelled()
            earliest = self._heap[0][0] if self._heap else None
            heapq.heappush(self._heap, (entry.when, next(self._order), entry))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            elif earliest is None or entry.when < earliest:
                self._cond.notify()
        return entry

    def pending(self) -> int:
        """Callbacks neither fired nor cancelled (for tests)."""
        with self._cond:
            return sum(1 for _, _, entry in self._heap if not entry.cancelled)

    def _cancel(self, entry: Scheduled) -> None:
        with self._cond:
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
                threading.Thread(target=entry.callback, name=self._name, daemon=True).start()

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
            self._cond.wait(self._heap[0][0] - now if self._heap else None)


def _nothing() -> None:
    return None


WATCHDOG = Watchdog()
