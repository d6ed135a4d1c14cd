"""A container's log: its processes' standard error, kept by the server up to a size.

Every process of the container (bwrap, execd, the entrypoint, what they start with their
standard error) writes into one pipe; one thread of the server (`READER`, running while a
server holds it) drains every container's pipe as it fills, into that container's
`ContainerLog`: at most `limit` bytes (`container_log_size`, 16 MiB by default), the oldest
dropped first and the drop noted in the log's first line (`tail`). So the log is bounded
whatever the sandbox writes, with a memory group or without: it lives in the server's memory
and is charged to the server (its memory cgroup), `limit` per container at most, never to the
sandbox. A sandbox that writes faster than the server drains waits on its own full pipe (64
KiB), as Docker's blocking log mode makes a container wait; the draining costs the server
about the CPU the writing costs the sandbox.

A reader of the log (`tail`) drains what is in the pipe first, so a failed start's message
shows what its processes wrote last.
"""

from __future__ import annotations

import collections
import os
import selectors
import threading
from collections.abc import Callable

from .spawn import HeldThread

DEFAULT_LIMIT = 16 << 20
READ_SIZE = 1 << 16


def _note(dropped: int, limit: int) -> str:
    return f"osb-sync: {dropped} bytes of this log dropped (it keeps its last {limit} bytes)\n"


class ContainerLog:
    """One container's log (see the module docstring); `writer` goes to its processes.

    Args:
        limit: the bytes kept at most.
    """

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
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
        while self._size > self.limit:
            excess = self._size - self.limit
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
        note = _note(dropped, self.limit) if whole and dropped else ""
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
                for key, _ in selector.select():
                    if key.fd == stop:
                        return
                    key.data.drain(1)
        finally:
            with self._lock:
                self._selector = None
            selector.close()


READER = LogReader()
