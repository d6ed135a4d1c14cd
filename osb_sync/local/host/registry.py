"""Lifecycle API of the local server: the sandbox registry, its route handlers and states.

States follow the Docker runtime of the real server: `Pending` (only with `pending_seconds`),
`Running`, `Paused`; a deleted or expired sandbox is gone (404), never `Terminated`.
"""

from __future__ import annotations

import math
import secrets
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

from ..http.bodies import rfc3339
from ..http.exchange import Exchange, HttpError, error
from . import limits, volumes
from .bwrap import Support, network_plan
from .container import Launch, SandboxContainer
from .execd_binary import ExecdBinary
from .images.service import ImageService
from .proxy import endpoint_port
from .spares import ContainerSource
from .validation import (
    check_create,
    check_labels,
    check_patch,
    check_renewal,
    policy_needs,
    query_int,
    read_json,
)

EXECD_PORT = 44772
REASONS = {
    "Pending": ("CONTAINER_STARTING", "Sandbox container is starting."),
    "Running": ("CONTAINER_RUNNING", "Sandbox container started successfully."),
    "Paused": ("CONTAINER_PAUSED", "Sandbox container is paused."),
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
    volume_places: tuple[tuple[Path, ...], Path] = ((), Path())  # host trees allowed, pvc root
    binary: ExecdBinary | None = None  # an execd binary to run instead of ours
    spare_containers: int = 0
    refusal: str = ""  # non-empty: every create answers 503 with it (fail closed)
    images: ImageService | None = None  # what a create's image becomes (None: the host's view)


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
    image_uri: str = ""  # the image really run, with its digest ("": the uri asked for)
    removing: bool = False
    state: str = "Pending"
    transition_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    def refresh(self, now: datetime) -> None:
        """Move Pending to Running once the pending time is over."""
        if self.state == "Pending" and now >= self.ready_at:
            self.state, self.transition_at = "Running", self.ready_at

    def view(self, created: bool = False) -> dict[str, Any]:
        """The Sandbox (or, with `created`, CreateSandboxResponse) object; nulls omitted."""
        reason, message = REASONS[self.state]
        status = {
            "state": self.state,
            "reason": reason,
            "message": message + self.note,
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


class Registry:
    """The sandbox registry (one lock) and the handlers of the `/sandboxes` routes.

    The routes themselves are in the server's one table, `LocalServer.routes`.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._sandboxes: dict[str, LocalSandbox] = {}
        timing = (config.ping_interval, config.command_grace)
        spare_settings = Launch(binary=config.binary, controllers=config.limit_controllers)
        self.containers = ContainerSource(
            config.root, config.support, timing, config.spare_containers, spare_settings
        )
        self.spares = self.containers.pool

    def find(self, sandbox_id: str) -> LocalSandbox | None:
        """The live sandbox `sandbox_id` with its state brought up to date, or None."""
        with self._lock:
            sandbox = self._sandboxes.get(sandbox_id)
            if sandbox is not None:
                sandbox.refresh(datetime.now(timezone.utc))
            return sandbox

    def _get(self, ex: Exchange) -> LocalSandbox:
        sandbox = self.find(ex.params["id"])
        if sandbox is None:
            raise not_found(ex.params["id"])
        return sandbox

    def create(self, ex: Exchange) -> None:
        """POST /sandboxes: validate, make the directory and runtime, answer 202.

        Fails closed: where sandboxes cannot be isolated and the server was not told to run
        them unisolated, 503 with what to install or allow.
        """
        body = read_json(ex)
        if self.config.refusal:
            raise error(503, "SANDBOX::ISOLATION_UNAVAILABLE", self.config.refusal)
        check_create(body, self.config.min_timeout, self.config.max_timeout)
        check_labels(body.get("metadata") or {})
        internet, network_note = network_plan(
            policy_needs(body.get("networkPolicy")),
            self.config.support,
            self.config.unenforced_network_policy == "accept",
        )
        plan = limits.plan(limits.parse(body["resourceLimits"]), self.config.limit_controllers)
        isolated = self.config.support.bwrap is not None
        mounts = volumes.mounts(body.get("volumes"), *self.config.volume_places, isolated)
        env = {k: str(v) for k, v in (body.get("env") or {}).items() if v is not None}
        token = secrets.token_urlsafe(24)
        config = {"env": env, "token": token, "limits": plan}
        image = self.config.images.launch(body) if self.config.images is not None else None
        try:
            container = self.containers.claimed(body, config, internet, mounts, image)
        except (OSError, RuntimeError) as exc:
            raise error(
                500, "DOCKER::SANDBOX_START_FAILED", f"Failed to start sandbox: {exc}"
            ) from None
        sandbox_id = container.home.name
        try:
            binary = self.config.binary
            execd_note = binary.status_note() if binary else ""
            note = container.status_note(internet) + network_note + plan.message() + execd_note
            sandbox = self._register(sandbox_id, body, token, container, note)
            if image is not None and image.image is not None:
                sandbox.image_uri = image.image.pinned
        except BaseException:
            container.close()  # a refused create leaves no folder and no process
            raise
        ex.send_json(202, sandbox.view(created=True))

    def _register(
        self,
        sandbox_id: str,
        body: dict[str, Any],
        token: str,
        container: SandboxContainer,
        note: str,
    ) -> LocalSandbox:
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
        with self._lock:
            self._sandboxes[sandbox_id] = sandbox
        return sandbox

    def show(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}: the Sandbox."""
        ex.send_json(200, self._get(ex).view())

    def list(self, ex: Exchange) -> None:
        """GET /sandboxes: state and metadata filters, pagination, newest first."""
        states = {s.lower() for s in ex.query.get("state", []) if s}
        wanted: list[tuple[str, str]] = []
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
        with self._lock:
            for sandbox in self._sandboxes.values():
                sandbox.refresh(now)
            chosen = [
                s
                for s in self._sandboxes.values()
                if (not states or s.state.lower() in states)
                and all((s.body.get("metadata") or {}).get(k) == v for k, v in wanted)
            ]
            chosen.sort(key=lambda s: s.created_at, reverse=True)
            items = [s.view() for s in chosen[(page - 1) * size : page * size]]
        pages = math.ceil(len(chosen) / size)
        ex.send_json(
            200,
            {
                "items": items,
                "pagination": {
                    "page": page,
                    "pageSize": size,
                    "totalItems": len(chosen),
                    "totalPages": pages,
                    "hasNextPage": page < pages,
                },
            },
        )

    def remove(self, sandbox_id: str) -> bool:
        """Kill everything a sandbox runs, delete its files, then forget it (404 from then on).

        Returns False if it was unknown or already being removed.
        """
        with self._lock:
            sandbox = self._sandboxes.get(sandbox_id)
            if sandbox is None or sandbox.removing:
                return False
            sandbox.removing = True
        sandbox.container.close()
        with self._lock:
            del self._sandboxes[sandbox_id]
        return True

    def delete(self, ex: Exchange) -> None:
        """DELETE /sandboxes/{id}: 204."""
        if not self.remove(ex.params["id"]):
            raise not_found(ex.params["id"])
        ex.send(204)

    def _transition(self, ex: Exchange, before: str, after: str, code: str) -> None:
        with self._lock:
            sandbox = self._sandboxes.get(ex.params["id"])
            if sandbox is None:
                raise not_found(ex.params["id"])
            sandbox.refresh(datetime.now(timezone.utc))
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
        sandbox = self._get(ex)
        with self._lock:
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
        sandbox = self._get(ex)
        with self._lock:
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
        """GET /sandboxes/{id}/endpoints/{port}: always the server-proxy form."""
        port = endpoint_port(ex.params["port"])
        if ex.arg("expires"):
            raise error(
                400,
                "SANDBOX::API_NOT_SUPPORTED",
                "Signed endpoints (expires) are not supported by the local server.",
            )
        sandbox = self._get(ex)
        host = ex.headers.get("Host") or self.config.address
        ex.send_json(
            200,
            {
                "endpoint": f"{host}/sandboxes/{sandbox.id}/proxy/{port}",
                "headers": {"X-EXECD-ACCESS-TOKEN": sandbox.token},
            },
        )

    def reap_expired(self) -> None:
        """Remove every sandbox whose expiry has passed."""
        now = datetime.now(timezone.utc)
        with self._lock:
            doomed = [
                s.id
                for s in self._sandboxes.values()
                if s.expires_at is not None and s.expires_at <= now and not s.removing
            ]
        for sandbox_id in doomed:
            self.remove(sandbox_id)

    def close_all(self) -> None:
        """Remove every sandbox and every spare container (server stop)."""
        self.spares.close()
        with self._lock:
            ids = list(self._sandboxes)
        for sandbox_id in ids:
            self.remove(sandbox_id)
