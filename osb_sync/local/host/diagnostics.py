"""Diagnostics of the local server: each sandbox's events and container log, as text.

The journal records what happened to each sandbox (created, started, paused, resumed,
network policy changed, snapshot taken, OOM-killed, expired, deleted), one timestamped line
each. A sandbox's journal, and the tail of its container log, outlive it (the last
`KEPT_GONE` sandboxes), so "why is my sandbox gone?" has an answer after it is.

The routes answer as the released server does: without `scope`, plain text (`tail`, `limit`);
with one, the stable Diagnostics descriptor of `diagnostic-api.yml`, inline, with the scopes
`SCOPES` names (400 for another).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..http.bodies import rfc3339
from ..http.exchange import error

MAX_EVENTS = 500  # per sandbox, the oldest dropped first
KEPT_GONE = 256  # journals of removed sandboxes kept
LOG_TAIL_BYTES = 256 * 1024  # of a container log kept once its sandbox is gone
TEXT = "text/plain; charset=utf-8"
# kind -> the scopes served (each answers the same text: one runtime, one container)
SCOPES = {
    "logs": ("container", "lifecycle", "all"),
    "events": ("lifecycle", "runtime", "all"),
}


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


def last_lines(text: str, count: int | None) -> str:
    """The last `count` lines of `text` (all of them for None), each ending with a newline."""
    lines = text.splitlines()
    if count is not None:
        lines = lines[-count:] if count else []
    return "".join(line + "\n" for line in lines)


def check_scope(kind: str, scope: str) -> None:
    """400 for a scope the local server does not serve."""
    if scope not in SCOPES[kind]:
        raise error(
            400,
            "DIAGNOSTICS::UNSUPPORTED_SCOPE",
            f"Unsupported diagnostics scope {scope!r} for {kind}: the local server serves "
            f"{', '.join(SCOPES[kind])}.",
        )


def descriptor(sandbox_id: str, kind: str, scope: str, text: str) -> dict[str, Any]:
    """The stable Diagnostics descriptor (`DiagnosticContentResponse`), inline."""
    return {
        "sandboxId": sandbox_id,
        "kind": kind,
        "scope": scope,
        "delivery": "inline",
        "contentType": TEXT,
        "content": text,
        "contentLength": len(text.encode()),
        "truncated": False,
    }
