"""The sandboxes of the local server: its table (one lock) and the routes of `/sandboxes`.

States follow the Docker runtime of the real server: `Pending` (only with `pending_seconds`),
`Running`, `Paused`, and `Failed` (`CONTAINER_EXITED_ERROR`, with what ended it: an exit code,
a signal, the OOM killer) once its container's main process (execd, or the entrypoint it
started) is seen dead, `Terminated` when that process exited 0; a deleted or expired sandbox is
gone (404). Every transition is written to the journal (`journal.py`).

The routes of the sandboxes themselves are here: list, get, delete, pause, resume, renew,
metadata and endpoints. The create is the registry's (`registry.py`): it takes from every
resource (pools, snapshots, images, volumes). The other resources hold this table by
composition: snapshots, diagnostics and the network policy (`snapshots.py`,
`diagnostics.py`, `network.py`).
"""

from __future__ import annotations

import builtins
import math
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

from ..http.bodies import rfc3339
from ..http.exchange import Exchange, HttpError, error
from . import cgroup, liveness, logs
from .bwrap import Support
from .container import SandboxContainer
from .execd_binary import ExecdBinary
from .images.service import ImageService
from .journal import LOG_TAIL_BYTES, Journal
from .proxy import EGRESS_HEADER, EGRESS_PORT, endpoint_port
from .validation import check_labels, check_patch, check_renewal, query_int, read_json

REASONS = {
    "Pending": ("CONTAINER_STARTING", "Sandbox container is starting."),
    "Running": ("CONTAINER_RUNNING", "Sandbox container started successfully."),
    "Paused": ("CONTAINER_PAUSED", "Sandbox container is paused."),
    "Failed": (liveness.REASON, "Sandbox container exited."),
    "Terminated": (liveness.EXITED, "Sandbox container exited."),
}


@dataclass
class Config:
    """The LocalServer settings the lifecycle routes need."""

    root: Path
    min_timeout: int
    max_timeout: int
    pending_seconds: float
    ping_interval: float
    command_grace: float
    unenforced_network_policy: str
    support: Support
    address: str  # host:port of the server, when a request has no Host header
    limit_controllers: frozenset[str] = frozenset()  # cgroup controllers for resourceLimits
    require_limits: bool = False  # refuse a create asking for a limit not enforced here
    limits_fix: str = ""  # how an operator lets this server enforce them (`cgroup.py`)
    volume_places: tuple[tuple[Path, ...], Path] = ((), Path())  # host trees allowed, pvc root
    volume_root_is_host_root: bool = False  # map host root's volumes (`volumes.ownership`)
    binary: ExecdBinary | None = None  # an execd binary to run instead of ours
    spare_containers: int = 0
    log_budget: logs.LogBudget = field(default_factory=logs.LogBudget)  # of containers' logs
    refusal: str = ""  # non-empty: every create answers 503 with it (fail closed)
    images: ImageService | None = None  # what a create's image becomes (None: the host's view)

    @property
    def accept_unenforced(self) -> bool:
        """Whether a network policy the server cannot enforce is accepted (and said so)."""
        return self.unenforced_network_policy == "accept"


@dataclass
class LocalSandbox:
    """One sandbox: its API data plus the container that runs its execd."""

    id: str
    body: dict[str, Any]
    token: str
    container: SandboxContainer
    created_at: datetime
    expires_at: datetime | None
    ready_at: datetime
    note: str = ""
    failure: str = ""  # why the container ended (state Failed or Terminated)
    image_uri: str = ""  # the image really run, with its digest ("": the uri asked for)
    removing: bool = False
    state: str = "Pending"
    transition_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    egress_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    policy: dict[str, Any] = field(default_factory=dict)  # the network policy it runs under

    def refresh(self, now: datetime) -> str | None:
        """Move Pending to Running once the pending time is over, and to Failed once dead;
        the event of the move (for the journal), or None."""
        event = None
        if self.state == "Pending" and now >= self.ready_at:
            self.state, self.transition_at = "Running", self.ready_at
            event = "started: Running"
        if self.state not in liveness.ENDED and not self.removing:
            why = liveness.death(self.container)
            if why is not None:
                self.state, self.failure = liveness.ended_state(self.container), why
                self.transition_at, event = now, f"{self.state.lower()}: {why}"
        return event

    def view(self, created: bool = False) -> dict[str, Any]:
        """The Sandbox (or, with `created`, CreateSandboxResponse) object; nulls omitted."""
        reason, message = REASONS[self.state]
        status = {
            "state": self.state,
            "reason": reason,
            "message": (self.failure or message) + self.note,
            "lastTransitionAt": rfc3339(self.transition_at),
        }
        data: dict[str, Any] = {
            "id": self.id,
            "status": status,
            "metadata": self.body.get("metadata") or {},
            "entrypoint": self.body.get("entrypoint") or ["tail", "-f", "/dev/null"],
            "createdAt": rfc3339(self.created_at),
        }
        if self.expires_at is not None:
            data["expiresAt"] = rfc3339(self.expires_at)
        if self.body.get("platform"):
            data["platform"] = self.body["platform"]
        if not created:
            if self.body.get("image"):
                data["image"] = {"uri": self.image_uri or self.body["image"]["uri"]}
            else:
                data["snapshotId"] = self.body["snapshotId"]
        return data


def not_found(sandbox_id: str) -> HttpError:
    """The Docker runtime's 404."""
    return error(404, "DOCKER::SANDBOX_NOT_FOUND", f"Sandbox {sandbox_id} not found.")


class Sandboxes:
    """The live sandboxes (one lock), their journal, and the handlers of their routes.

    Args:
        config: the server's settings.
        released: told a sandbox's id once it is removed (its pool counts it no more).
    """

    def __init__(self, config: Config, released: Callable[[str], None]) -> None:
        self.config = config
        self.lock = threading.Lock()  # the table's, and each sandbox's state
        self.journal = Journal()
        self._released = released
        self._sandboxes: dict[str, LocalSandbox] = {}

    def count(self) -> int:
        """How many sandboxes there are (those being removed included)."""
        return len(self._sandboxes)

    def find(self, sandbox_id: str) -> LocalSandbox | None:
        """The live sandbox `sandbox_id` with its state brought up to date, or None."""
        with self.lock:
            sandbox = self._sandboxes.get(sandbox_id)
            if sandbox is not None:
                self._refresh(sandbox, datetime.now(timezone.utc))
            return sandbox

    def get(self, sandbox_id: str) -> LocalSandbox:
        """The live sandbox `sandbox_id` (as `find`); the Docker runtime's 404 if unknown."""
        if (sandbox := self.find(sandbox_id)) is None:
            raise not_found(sandbox_id)
        return sandbox

    def _refresh(self, sandbox: LocalSandbox, now: datetime) -> None:
        if (event := sandbox.refresh(now)) is not None:
            self.journal.record(sandbox.id, event)

    def add(
        self,
        sandbox_id: str,
        body: dict[str, Any],
        token: str,
        container: SandboxContainer,
        note: str,
    ) -> LocalSandbox:
        """Register a new sandbox of `container` (Running, or Pending for `pending_seconds`)."""
        now = datetime.now(timezone.utc)
        timeout = body.get("timeout")
        sandbox = LocalSandbox(
            id=sandbox_id,
            body=body,
            token=token,
            container=container,
            created_at=now,
            expires_at=now + timedelta(seconds=timeout) if timeout else None,
            ready_at=now + timedelta(seconds=self.config.pending_seconds),
            note=note,
            transition_at=now,
        )
        sandbox.refresh(now)
        with self.lock:
            self._sandboxes[sandbox_id] = sandbox
        return sandbox

    def show(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}: the Sandbox."""
        ex.send_json(200, self.get(ex.params["id"]).view())

    def stats(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}/stats, ours (the local server guide's "Stats"): its usage
        against its limits as its cgroups say (`cgroup.usage`), with the create's
        `resourceLimits`; `source` null where it has no group to read."""
        sandbox = self.get(ex.params["id"])
        groups = {c: p for c in cgroup.CONTROLLERS if (p := sandbox.container.group(c))}
        given = sandbox.body.get("resourceLimits")
        figures = cgroup.usage(groups)
        readable = any(value is not None for value in figures.values())
        ex.send_json(
            200,
            {
                "id": sandbox.id,
                "resourceLimits": given if isinstance(given, dict) else {},
                "source": "cgroup" if readable else None,
                **figures,
            },
        )

    def list(self, ex: Exchange) -> None:
        """GET /sandboxes: state and metadata filters, pagination, newest first."""
        states = {s.lower() for s in ex.query.get("state", []) if s}
        wanted: builtins.list[tuple[str, str]] = []
        raw = ex.arg("metadata")
        if raw:
            try:
                wanted = parse_qsl(unquote(raw), keep_blank_values=True, strict_parsing=True)
            except ValueError:
                raise error(
                    400,
                    "INVALID_METADATA_FORMAT",
                    f"Invalid metadata filter {raw!r}: expected k1=v1&k2=v2",
                ) from None
        page = query_int(ex.arg("page"), "page", 1, 1, None)
        size = query_int(ex.arg("pageSize"), "pageSize", 20, 1, 200)
        now = datetime.now(timezone.utc)
        with self.lock:
            for sandbox in self._sandboxes.values():
                self._refresh(sandbox, now)
            chosen = [
                s
                for s in self._sandboxes.values()
                if (not states or s.state.lower() in states)
                and all((s.body.get("metadata") or {}).get(k) == v for k, v in wanted)
            ]
            chosen.sort(key=lambda s: s.created_at, reverse=True)
            items = [s.view() for s in chosen[(page - 1) * size : page * size]]
        ex.send_json(200, paginated(items, len(chosen), page, size))

    def remove(self, sandbox_id: str, why: str = "deleted") -> bool:
        """Kill everything a sandbox runs, delete its files, then forget it (404 from then on).

        Its journal (with `why`, e.g. "expired") and the tail of its log are kept.
        Returns False if it was unknown or already being removed.
        """
        with self.lock:
            sandbox = self._sandboxes.get(sandbox_id)
            if sandbox is None or sandbox.removing:
                return False
            sandbox.removing = True
        self.journal.record(sandbox_id, why)
        self.journal.close(sandbox_id, sandbox.container.log_tail(LOG_TAIL_BYTES))
        self._released(sandbox_id)
        sandbox.container.close()
        with self.lock:
            del self._sandboxes[sandbox_id]
        return True

    def delete(self, ex: Exchange) -> None:
        """DELETE /sandboxes/{id}: 204."""
        if not self.remove(ex.params["id"]):
            raise not_found(ex.params["id"])
        ex.send(204)

    def _transition(self, ex: Exchange, before: str, after: str, code: str) -> None:
        with self.lock:
            sandbox = self._sandboxes.get(ex.params["id"])
            if sandbox is None:
                raise not_found(ex.params["id"])
            self._refresh(sandbox, datetime.now(timezone.utc))
            if sandbox.state != before:
                raise error(409, code, f"Sandbox {sandbox.id} is {sandbox.state}, not {before}.")
            try:
                if after == "Paused":
                    sandbox.container.pause()
                else:
                    sandbox.container.resume()
            except OSError as exc:
                raise error(500, "DOCKER::SANDBOX_PAUSE_FAILED", f"{exc}") from None
            sandbox.state, sandbox.transition_at = after, datetime.now(timezone.utc)
        self.journal.record(sandbox.id, f"{'paused' if after == 'Paused' else 'resumed'}: {after}")
        ex.send(202)

    def pause(self, ex: Exchange) -> None:
        """POST /sandboxes/{id}/pause: freeze every process of the sandbox."""
        self._transition(ex, "Running", "Paused", "DOCKER::SANDBOX_NOT_RUNNING")

    def resume(self, ex: Exchange) -> None:
        """POST /sandboxes/{id}/resume: let them run again."""
        self._transition(ex, "Paused", "Running", "DOCKER::SANDBOX_NOT_PAUSED")

    def renew(self, ex: Exchange) -> None:
        """POST /sandboxes/{id}/renew-expiration."""
        body = read_json(ex)
        moment = check_renewal(body)
        sandbox = self.get(ex.params["id"])
        with self.lock:
            if sandbox.expires_at is None:
                raise error(
                    409,
                    "DOCKER::INVALID_EXPIRATION",
                    f"Sandbox {sandbox.id} has no "
                    "expiration (created without timeout); it cannot be renewed.",
                )
            now = datetime.now(timezone.utc)
            if moment <= now:
                raise error(
                    400, "DOCKER::INVALID_EXPIRATION", "New expiration time must be in the future."
                )
            if (moment - now).total_seconds() > self.config.max_timeout:
                raise error(
                    400,
                    "DOCKER::INVALID_EXPIRATION",
                    f"New expiration time is more than {self.config.max_timeout} seconds away.",
                )
            sandbox.expires_at = moment
        ex.send_json(200, {"expiresAt": rfc3339(moment)})

    def patch_metadata(self, ex: Exchange) -> None:
        """PATCH /sandboxes/{id}/metadata: JSON merge patch, answers the full Sandbox."""
        patch = read_json(ex)
        check_patch(patch)
        check_labels(patch)
        sandbox = self.get(ex.params["id"])
        with self.lock:
            metadata = dict(sandbox.body.get("metadata") or {})
            for key, value in patch.items():
                if value is None:
                    metadata.pop(key, None)
                else:
                    metadata[key] = value
            sandbox.body["metadata"] = metadata
            view = sandbox.view()
        ex.send_json(200, view)

    def endpoint(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}/endpoints/{port}: always the server-proxy form.

        Port 18080 is the egress sidecar's API, served by the server itself: its header is
        the sandbox's egress token, which never enters the sandbox.
        """
        port = endpoint_port(ex.params["port"])
        if ex.arg("expires"):
            raise error(
                400,
                "SANDBOX::API_NOT_SUPPORTED",
                "Signed endpoints (expires) are not supported by the local server.",
            )
        sandbox = self.get(ex.params["id"])
        host = ex.headers.get("Host") or self.config.address
        headers = (
            {EGRESS_HEADER: sandbox.egress_token}
            if port == EGRESS_PORT
            else {"X-EXECD-ACCESS-TOKEN": sandbox.token}
        )
        ex.send_json(
            200, {"endpoint": f"{host}/sandboxes/{sandbox.id}/proxy/{port}", "headers": headers}
        )

    def reap_expired(self) -> None:
        """Remove every sandbox whose expiry has passed (and mark the dead ones Failed);
        journal OOM kills."""
        now = datetime.now(timezone.utc)
        with self.lock:
            for sandbox in self._sandboxes.values():
                self._refresh(sandbox, now)
            live = [s for s in self._sandboxes.values() if not s.removing]
            doomed = [s.id for s in live if s.expires_at is not None and s.expires_at <= now]
        for sandbox in live:
            kills = liveness.oom_kills(sandbox.container.group("memory"))
            self.journal.note_oom_kills(sandbox.id, kills)
        for sandbox_id in doomed:
            self.remove(sandbox_id, "expired: its timeout passed")

    def close_all(self) -> None:
        """Remove every sandbox (server stop)."""
        with self.lock:
            ids = builtins.list(self._sandboxes)
        for sandbox_id in ids:
            self.remove(sandbox_id, "deleted: the server stopped")


def paginated(items: list[dict[str, Any]], total: int, page: int, size: int) -> dict[str, Any]:
    """`items`, page `page` of `total` items, with the released server's `pagination`."""
    pages = math.ceil(total / size)
    return {
        "items": items,
        "pagination": {
            "page": page,
            "pageSize": size,
            "totalItems": total,
            "totalPages": pages,
            "hasNextPage": page < pages,
        },
    }
