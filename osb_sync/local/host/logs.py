"""A container's log: its processes' standard error, kept by the server up to a size.

Every process of the container (bwrap, execd, the entrypoint, what they start with their
standard error) writes into one pipe; one thread of the server (`READER`, running while a
server holds it) drains every container's pipe as it fills, into that container's
`ContainerLog`: at most `LogBudget.per_log` bytes (`container_log_size`, 16 MiB by default),
and all of a server's logs together at most `LogBudget.total` (`container_logs_total`, 256
MiB): once more logs would pass it, each keeps an even share of it (`FLOOR` at least, so the
total is at most the larger of it and `FLOOR` per container), the oldest bytes dropped first
and the drop noted in the log's first line (`tail`). So the logs are bounded whatever the
sandboxes write, with a memory group or without: they live in the server's memory and are
charged to the server (its memory cgroup), never to a sandbox.

The reader drains each ready log once a round, one read (a pipe-ful, 64 KiB, or one write
where the sandbox put its pipe in packet mode with O_DIRECT), and its rounds are `ROUND`
apart at the least, longer where more logs are ready: a sandbox's log costs the server at
most 1,000 reads a second (64 MB/s), all of them together at most `READS_PER_SECOND`,
whatever their writes' sizes and however many sandboxes write, and every log gets its turn;
one that writes faster waits on its own full pipe (64 KiB), its time charged to it, as
Docker's blocking log mode makes a container wait. A pipe's buffers are charged to the
writer's memory group.

A reader of the log (`tail`) drains what is in the pipe first, so a failed start's message
shows what its processes wrote last.
"""

from __future__ import annotations

import collections
import os
import selectors
import threading
import time
from collections.abc import Callable

from .spawn import HeldThread

DEFAULT_LIMIT = 16 << 20
DEFAULT_TOTAL = 256 << 20
FLOOR = 64 << 10  # what a log keeps however many share the total
READ_SIZE = 1 << 16
ROUND = 0.001  # seconds between two drains of one log, at the least
READS_PER_SECOND = 4000  # of every log together


def _note(dropped: int, limit: int) -> str:
    return f"osb-sync: {dropped} bytes of this log dropped (it keeps its last {limit} bytes)\n"


class LogBudget:
    """What one server's container logs keep: `per_log` bytes each at most, `total` together
    (see the module docstring)."""

    def __init__(self, per_log: int = DEFAULT_LIMIT, total: int = DEFAULT_TOTAL) -> None:
        self.per_log, self.total = per_log, total
        self._lock = threading.Lock()
        self._logs: set[ContainerLog] = set()

    def limit(self) -> int:
        """The bytes each log keeps now."""
        with self._lock:
            share = self.total // max(1, len(self._logs))
        return min(self.per_log, max(FLOOR, share))

    def join(self, log: ContainerLog) -> None:
        """Count `log` in; the others give up what their share no longer holds."""
        with self._lock:
            self._logs.add(log)
            others = [other for other in self._logs if other is not log]
        for other in others:
            other.trim()

    def leave(self, log: ContainerLog) -> None:
        """Count `log` out (its container is gone)."""
        with self._lock:
            self._logs.discard(log)


class ContainerLog:
    """One container's log (see the module docstring); `writer` goes to its processes.

    Args:
        budget: what it keeps (its server's, shared with its other logs; its own if None).
    """

    def __init__(self, budget: LogBudget | None = None) -> None:
        self.budget = budget or LogBudget()
        self._read, self.writer = os.pipe()
        os.set_blocking(self._read, False)
        # Its processes may open it again by `/proc/1/fd/2` (images link logs there), as they
        # could the memfd it replaced: for writing only, as their ids are not the server's.
        os.fchmod(self.writer, 0o622)
        self._chunks: collections.deque[bytes] = collections.deque()
        self._open_chunk = bytearray()
        self._size = 0
        self._dropped = 0
        self._lock = threading.Lock()
        self._open = True  # the read end, until EOF or `close`
        self.budget.join(self)
        READER.watch(self)

    def release_writer(self) -> None:
        """Close the server's copy of the write end (the container's processes hold theirs)."""
        if self.writer >= 0:
            os.close(self.writer)
            self.writer = -1

    def drain(self, reads: int = 16) -> None:
        """Keep what the pipe holds now, `reads` pipe-fuls at most (the reader thread's, which
        reads one for each log ready in turn, so a flooding sandbox does not starve the
        others; and `tail`'s first step)."""
        with self._lock:
            for _ in range(reads):
                if not self._open:
                    return
                try:
                    piece = os.read(self._read, READ_SIZE)
                except BlockingIOError:
                    return
                if not piece:  # every writer is gone
                    self._stop()
                    return
                self._keep(piece)

    def _keep(self, piece: bytes) -> None:
        # Small writes gather in one open chunk (a line per chunk would cost more in objects
        # than in text), whole chunks of READ_SIZE before it.
        self._open_chunk += piece
        if len(self._open_chunk) >= READ_SIZE:
            self._chunks.append(bytes(self._open_chunk))
            self._open_chunk.clear()
        self._size += len(piece)
        self._drop_to(self.budget.limit())

    def trim(self) -> None:
        """Drop the oldest bytes past what the budget gives it now."""
        with self._lock:
            self._drop_to(self.budget.limit())

    def _drop_to(self, limit: int) -> None:
        while self._size > limit:
            excess = self._size - limit
            if not self._chunks:
                del self._open_chunk[:excess]
                cut = excess
            elif len(self._chunks[0]) <= excess:
                cut = len(self._chunks.popleft())
            else:
                self._chunks[0] = self._chunks[0][excess:]
                cut = excess
            self._size -= cut
            self._dropped += cut

    def tail(self, limit: int) -> str:
        """The log's text from the first whole line of its last `limit` bytes; all of it (and
        the line that notes a drop) when it holds no more than `limit`."""
        self.drain()
        with self._lock:
            whole, dropped = self._size <= limit, self._dropped
            parts, taken = [bytes(self._open_chunk[-limit:])], len(self._open_chunk)
            for chunk in reversed(self._chunks):
                if taken >= limit:
                    break
                parts.append(chunk[-(limit - taken) :])
                taken += len(chunk)
        raw = b"".join(reversed(parts))
        if (not whole or dropped) and b"\n" in raw:
            raw = raw[raw.index(b"\n") + 1 :]
        note = _note(dropped, self.budget.limit()) if whole and dropped else ""
        return note + raw.decode(errors="replace")

    def close(self) -> None:
        """Stop keeping it (its container is gone); idempotent."""
        self.release_writer()
        with self._lock:
            if self._open:
                self._stop()

    def _stop(self) -> None:
        self._open = False
        READER.forget(self)
        self.budget.leave(self)
        os.close(self._read)

    def fileno(self) -> int:
        """The read end (what the reader thread waits on)."""
        return self._read


class LogReader:
    """The thread that drains every container's log as its pipe fills, while a server holds it
    (`hold` / `release`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._selector: selectors.BaseSelector | None = None  # while the thread runs
        self._thread = HeldThread("osb-local-logs", self._open)

    def hold(self) -> None:
        """Count one more server; the first starts the thread."""
        self._thread.hold()

    def release(self) -> None:
        """Count one server fewer; the last one's release stops the thread."""
        self._thread.release()

    def watch(self, log: ContainerLog) -> None:
        """Drain `log` from now on (where no server holds the reader, only `tail` drains it)."""
        with self._lock:
            if self._selector is not None:
                self._selector.register(log, selectors.EVENT_READ, log)

    def forget(self, log: ContainerLog) -> None:
        """Stop draining `log` (before its read end closes)."""
        with self._lock:
            if self._selector is not None:
                try:
                    self._selector.unregister(log)
                except (KeyError, ValueError):
                    pass

    def _open(self) -> Callable[[int], None]:
        selector = selectors.DefaultSelector()
        with self._lock:
            self._selector = selector
        return lambda stop: self._serve(selector, stop)

    def _serve(self, selector: selectors.BaseSelector, stop: int) -> None:
        selector.register(stop, selectors.EVENT_READ)
        try:
            while True:
                ready = selector.select()
                began = time.monotonic()
                for key, _ in ready:
                    if key.fd == stop:
                        return
                    key.data.drain(1)
                least = max(ROUND, len(ready) / READS_PER_SECOND)  # till the next round
                time.sleep(max(0.0, least - (time.monotonic() - began)))
        finally:
            with self._lock:
                self._selector = None
            selector.close()


READER = LogReader()
