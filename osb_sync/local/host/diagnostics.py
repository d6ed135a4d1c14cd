"""Diagnostics of the local server: each sandbox's events and container log, as text.

The events are the sandboxes' journal (`journal.py`, which every resource writes and which
outlives its sandbox), the log its container's standard error (`logs.py`), both read through
the sandboxes' table (`Diagnostics` holds it). The routes answer as the released server does:
without `scope`, plain text (`tail`, `limit`); with one, the stable Diagnostics descriptor of
`diagnostic-api.yml`, inline, with the scopes `SCOPES` names (400 for another).
"""

from __future__ import annotations

from typing import Any

from ..http.bodies import rfc3339
from ..http.exchange import Exchange, error
from . import liveness, network
from .journal import LOG_TAIL_BYTES
from .sandboxes import LocalSandbox, Sandboxes, not_found
from .validation import query_int

TEXT = "text/plain; charset=utf-8"
# kind -> the scopes served (each answers the same text: one runtime, one container)
SCOPES = {
    "logs": ("container", "lifecycle", "all"),
    "events": ("lifecycle", "runtime", "all"),
}


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


def send_text(ex: Exchange, text: str) -> None:
    """A plain-text answer (the routes without a scope)."""
    ex.send(200, text.encode(), {"Content-Type": TEXT})


class Diagnostics:
    """The handlers of the diagnostics routes, over the sandboxes' table and journal."""

    def __init__(self, sandboxes: Sandboxes) -> None:
        self.sandboxes = sandboxes

    def _events_of(self, sandbox_id: str) -> list[str]:
        sandbox = self.sandboxes.find(sandbox_id)  # brings a Pending sandbox's start in
        journal = self.sandboxes.journal
        if sandbox is not None:
            kills = liveness.oom_kills(sandbox.container.group("memory"))
            journal.note_oom_kills(sandbox_id, kills)
        events = journal.events(sandbox_id)
        if events is None:
            raise not_found(sandbox_id)
        return events

    def _log_of(self, sandbox_id: str) -> str:
        sandbox = self.sandboxes.find(sandbox_id)
        if sandbox is not None:
            return sandbox.container.log_tail(LOG_TAIL_BYTES)
        kept = self.sandboxes.journal.log_of_gone(sandbox_id)
        if kept is None:
            raise not_found(sandbox_id)
        return kept

    def logs(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}/diagnostics/logs: its container log (`tail` lines), or with a
        `scope` the Diagnostics descriptor (`lifecycle`: its events; `all`: both)."""
        sandbox_id, scope = ex.params["id"], ex.arg("scope")
        if scope is None:
            if ex.arg("since") is not None:
                raise error(
                    400,
                    "DIAGNOSTICS::UNSUPPORTED_PARAMETER",
                    "since is not supported by the local server: its container log has no "
                    "timestamps (use tail)",
                )
            tail = query_int(ex.arg("tail"), "tail", 100, 1, 10000)
            send_text(ex, last_lines(self._log_of(sandbox_id), tail))
            return
        check_scope("logs", scope)
        parts = []
        if scope in ("container", "all"):
            parts.append(self._log_of(sandbox_id))
        if scope in ("lifecycle", "all"):
            parts.append("".join(line + "\n" for line in self._events_of(sandbox_id)))
        ex.send_json(200, descriptor(sandbox_id, "logs", scope, "".join(parts)))

    def events(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}/diagnostics/events: its events (`limit` last), or with a
        `scope` the Diagnostics descriptor."""
        sandbox_id, scope = ex.params["id"], ex.arg("scope")
        if scope is None:
            limit = query_int(ex.arg("limit"), "limit", 50, 1, 500)
            lines = self._events_of(sandbox_id)[-limit:]
            send_text(ex, "".join(line + "\n" for line in lines))
            return
        check_scope("events", scope)
        text = "".join(line + "\n" for line in self._events_of(sandbox_id))
        ex.send_json(200, descriptor(sandbox_id, "events", scope, text))

    def inspect(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}/diagnostics/inspect: the container, as plain text."""
        send_text(ex, inspection(self.sandboxes.get(ex.params["id"])))

    def summary(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}/diagnostics/summary: inspection, last events and log lines."""
        tail = query_int(ex.arg("tail"), "tail", 50, 1, 10000)
        event_limit = query_int(ex.arg("event_limit"), "event_limit", 20, 1, 500)
        sandbox = self.sandboxes.get(ex.params["id"])
        events = self._events_of(sandbox.id)[-event_limit:]
        log = last_lines(self._log_of(sandbox.id), tail)
        text = (
            "== inspect ==\n"
            + inspection(sandbox)
            + f"== events (last {len(events)}) ==\n"
            + "".join(line + "\n" for line in events)
            + f"== container log (last {tail} lines) ==\n"
            + log
        )
        send_text(ex, text)


def inspection(sandbox: LocalSandbox) -> str:
    """The container of `sandbox`, as plain text (`inspect`)."""
    container = sandbox.container
    policy = network.status(sandbox.policy)
    lines = [
        f"Sandbox: {sandbox.id}",
        f"State: {sandbox.state} (since {rfc3339(sandbox.transition_at)})",
        f"Created: {rfc3339(sandbox.created_at)}",
        f"Expires: {rfc3339(sandbox.expires_at) if sandbox.expires_at else 'never'}",
        f"Image: {(sandbox.body.get('image') or {}).get('uri') or '-'}",
        f"Snapshot: {sandbox.body.get('snapshotId') or '-'}",
        f"Entrypoint: {sandbox.body.get('entrypoint') or '-'}",
        f"Isolated: {'yes (bubblewrap)' if container.isolated else 'NO'}",
        f"Network: {container.network} (policy {policy['mode']})",
        f"Main process alive: {'yes' if container.alive() else 'no'}",
        f"Processes: {len(container.members())}",
        f"OOM kills: {liveness.oom_kills(container.group('memory'))}",
        f"Status: {sandbox.note.strip()}",
    ]
    return "".join(line + "\n" for line in lines)
