"""Each sandbox's journal: what happened to it, one timestamped line an event.

Every resource writes to it (the registry: created, started, paused, resumed, expired,
deleted; snapshots: taken; the network policy: changed; the reaper: OOM-killed); the
diagnostics routes read it (`diagnostics.py`). A sandbox's journal, and the tail of its
container log, outlive it (the last `KEPT_GONE` sandboxes), so "why is my sandbox gone?" has an
answer after it is.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..http.bodies import rfc3339

MAX_EVENTS = 500  # per sandbox, the oldest dropped first
KEPT_GONE = 256  # journals of removed sandboxes kept
LOG_TAIL_BYTES = 256 * 1024  # of a container log kept once its sandbox is gone


@dataclass
class Record:
    """One sandbox's diagnostics: its events, and its log once it is gone."""

    events: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    log_tail: str | None = None  # set when the sandbox is removed
    oom_kills: int = 0


class Journal:
    """The events of every sandbox (one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, Record] = {}
        self._gone: OrderedDict[str, Record] = OrderedDict()

    def record(self, sandbox_id: str, text: str) -> None:
        """Add one event line to a live sandbox's journal (a closed one's stays as it was:
        a late event of a removed sandbox, racing its removal, is dropped)."""
        line = f"{rfc3339(datetime.now(timezone.utc))} {text}"
        with self._lock:
            if sandbox_id not in self._gone:
                self._live.setdefault(sandbox_id, Record()).events.append(line)

    def note_oom_kills(self, sandbox_id: str, count: int) -> None:
        """Record an OOM kill for each one the sandbox's memory group counted since last time."""
        with self._lock:
            record = self._live.get(sandbox_id)
            if record is None:
                return  # removed meanwhile, or not journaled yet
            new, record.oom_kills = count - record.oom_kills, max(count, record.oom_kills)
        for _ in range(max(0, new)):
            self.record(sandbox_id, "OOM-killed: a process went over the memory limit")

    def close(self, sandbox_id: str, tail: str) -> None:
        """Keep a removed sandbox's journal and `tail`, the end of its container log."""
        with self._lock:
            record = self._live.pop(sandbox_id, None) or Record()
            record.log_tail = tail
            self._gone[sandbox_id] = record
            while len(self._gone) > KEPT_GONE:
                self._gone.popitem(last=False)

    def events(self, sandbox_id: str) -> list[str] | None:
        """A sandbox's events, oldest first; None when it never existed (or is long gone)."""
        with self._lock:
            record = self._live.get(sandbox_id) or self._gone.get(sandbox_id)
            return list(record.events) if record is not None else None

    def log_of_gone(self, sandbox_id: str) -> str | None:
        """The kept container log of a removed sandbox, or None."""
        with self._lock:
            record = self._gone.get(sandbox_id)
            return record.log_tail if record is not None else None
