"""Background command output, kept in memory: the newest bytes of each command, bounded.

A background command writes stdout and stderr to one pipe (`command.py`), which the execd
reads into the command's `OutputLog`, so its output needs no free disk: a sandbox whose disk
is full (or whose disk another sandbox filled) still has its logs. Real execd writes the
output to a file and keeps all of it; we keep, per command, the newest `LOG_LIMIT` bytes
(4 MiB), and per sandbox at most `SANDBOX_LOG_LIMIT` bytes (32 MiB) across all its
background commands' logs (`LogBudget`): past it, bytes are dropped from the oldest ended
command's log first, then from the oldest running one's.

Offsets are absolute: byte N of the output stays byte N whatever was dropped, so the logs
route's cursor (a byte offset, as in real execd) keeps its meaning. A read from a cursor that
points into dropped output starts with the marker `[N bytes dropped]` and a newline (N: the
bytes between the cursor and the oldest kept byte), then resumes at the oldest kept byte; the
next cursor is always the end of the output so far.
"""

from __future__ import annotations

import collections
import threading

LOG_LIMIT = 4 << 20
SANDBOX_LOG_LIMIT = 32 << 20
CHUNK = 1 << 16  # small writes are gathered into pieces this big (a 1-byte bytes costs 34)


def dropped_marker(count: int) -> bytes:
    """What a read shows in place of `count` bytes that were dropped."""
    return b"[%d bytes dropped]\n" % count


class OutputLog:
    """The newest `limit` bytes of one command's output, read by absolute byte offset.

    Thread-safe: one thread writes, any number read. Part of `budget` when given one.
    """

    def __init__(self, limit: int = LOG_LIMIT, budget: LogBudget | None = None) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        self.limit = limit
        self._budget = budget
        self._lock = budget.lock if budget is not None else threading.Lock()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._skip = 0  # bytes of the first chunk already dropped
        self._tail = bytearray()  # the newest bytes, not yet a whole chunk
        self.total = 0  # bytes ever written
        self.kept = 0  # bytes held
        self.closed = False

    def write(self, data: bytes) -> None:
        """Append `data`, dropping the oldest bytes past the limits."""
        if not data:
            return
        with self._lock:
            if not self._tail and len(data) >= CHUNK:
                self._chunks.append(bytes(data))
            else:
                self._tail += data
                if len(self._tail) >= CHUNK:
                    self._chunks.append(bytes(self._tail))
                    self._tail = bytearray()
            self.total += len(data)
            self._grow(len(data))
            self._trim(self.limit)
            if self._budget is not None:
                self._budget.settle()

    def close(self) -> None:
        """The writer is done (the pipe reached EOF): this log may give way first."""
        with self._lock:
            self.closed = True
            if self._budget is not None:
                self._budget.settle()

    def read(self, cursor: int) -> tuple[list[memoryview], int]:
        """The output from byte `cursor` on, in pieces, and the cursor to read from next.

        A cursor into dropped output gives the `dropped_marker` first, then the kept bytes;
        a cursor at or past the end gives nothing and is returned as it is.
        """
        if cursor < 0:
            raise ValueError("cursor must be >= 0")
        with self._lock:
            if cursor >= self.total:
                return [], cursor
            start = self.total - self.kept
            pieces = []
            if cursor < start:
                pieces.append(memoryview(dropped_marker(start - cursor)))
            skip = max(0, cursor - start) + self._skip
            for chunk in self._chunks:
                if skip < len(chunk):
                    pieces.append(memoryview(chunk)[skip:])
                    skip = 0
                else:
                    skip -= len(chunk)
            if skip < len(self._tail):
                pieces.append(memoryview(bytes(self._tail[skip:])))
            return pieces, self.total

    def _grow(self, count: int) -> None:
        self.kept += count
        if self._budget is not None:
            self._budget.kept += count

    def _trim(self, limit: int) -> None:
        """Drop the oldest bytes until at most `limit` are kept (the lock is held)."""
        while self.kept > limit:
            excess = self.kept - limit
            if self._chunks:
                left = len(self._chunks[0]) - self._skip
                if left <= excess:
                    self._chunks.popleft()
                    self._skip = 0
                    self._grow(-left)
                    continue
                self._skip += excess
            else:
                del self._tail[:excess]
            self._grow(-excess)


class LogBudget:
    """The output logs of one sandbox's background commands, at most `limit` bytes in all."""

    def __init__(self, limit: int = SANDBOX_LOG_LIMIT) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        self.kept = 0
        self._logs: list[OutputLog] = []

    def new_log(self, limit: int = LOG_LIMIT) -> OutputLog:
        """A new log under this budget."""
        log = OutputLog(limit, self)
        with self.lock:
            self._logs.append(log)
        return log

    def settle(self) -> None:
        """Drop the oldest bytes of the oldest logs, ended ones first, until under the limit.

        Called by the logs with the shared lock held.
        """
        if self.kept <= self.limit:
            return
        for ended in (True, False):
            for log in self._logs:
                if log.closed == ended and log.kept and self.kept > self.limit:
                    log._trim(max(0, log.kept - (self.kept - self.limit)))
        # A log that ended and holds nothing is read as a marker: no need to track it.
        self._logs = [log for log in self._logs if log.kept or not log.closed]
