"""Lifecycle API of the local server: the sandbox registry, its route handlers and states.

States follow the Docker runtime of the real server: `Pending` (only with `pending_seconds`),
`Running`, `Paused`, and `Failed` (`CONTAINER_EXITED_ERROR`, with what ended it: an exit code,
a signal, the OOM killer) once its container's main process (execd, or the entrypoint it
started) is seen dead, `Terminated` when that process exited 0; a deleted or expired sandbox is
gone (404).

Besides sandboxes, the handlers of the released server's other routes: snapshots
(`snapshots.py`), diagnostics (`diagnostics.py`, whose journal every transition writes to),
network policy at run time (`network.py`), named pools (`pools.py`), and the templates a
server without their runtime refuses (501).
"""

from __future__ import annotations

import builtins
import math
import secrets
import threading
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qsl, unquote

from ..http.bodies import rfc3339
from ..http.exchange import Exchange, HttpError, error
from . import diagnostics, disk, limits, liveness, logs, network, volumes
from .bwrap import Support, network_plan
from .capacity import Capacity
from .container import OOM_CONTROL, Launch, SandboxContainer
from .execd_binary import IMAGE_EXECD_PATH, ExecdBinary
from .images.config import CONFIG_INVALID, ConfigError
from .images.service import ImageService, failed
from .pools import (
    PoolStore,
    check_capacity,
    check_name,
    check_template,
    pooled_body,
    template_body,
)
from .proxy import endpoint_port
from .snapshots import SnapshotStore
from .spares import ContainerSource
from .validation import (
    check_create,
    check_labels,
    check_local_fields,
    check_network_policy,
    check_patch,
    check_renewal,
    check_rules,
    check_targets,
    policy_needs,
    query_int,
    read_json,
    unprocessable_body,
)

EXECD_PORT = 44772
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
    volume_places: tuple[tuple[Path, ...], Path] = ((), Path())  # host trees allowed, pvc root
    binary: ExecdBinary | None = None  # an execd binary to run instead of ours
    spare_containers: int = 0
    log_budget: logs.LogBudget = field(default_factory=logs.LogBudget)  # of containers' logs
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


def templates_not_supported(ex: Exchange) -> None:
    """/templates: the released server's answer without its Kubernetes fsb runtime."""
    if ex.method in ("POST", "PUT", "PATCH"):
        ex.read_body()
    raise error(
        501,
        "SANDBOX::API_NOT_SUPPORTED",
        "Template management is not supported in this runtime: templates need OpenSandbox's "
        "Kubernetes runtime (fsb templates); the local server has none.",
    )


def send_text(ex: Exchange, text: str) -> None:
    """A plain-text answer (the diagnostics routes without a scope)."""
    ex.send(200, text.encode(), {"Content-Type": diagnostics.TEXT})


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
            config.root,
            config.support,
            timing,
            config.spare_containers,
            spare_settings,
            config.log_budget,
        )
        self.spares = self.containers.pool
        self.capacity = Capacity(lambda: len(self._sandboxes) + self.spares.count)
        self.journal = diagnostics.Journal()
        self._policy_lock = threading.Lock()  # network policy changes, one at a time
        self.snapshots = SnapshotStore(config.root)
        self.pools = PoolStore(self.containers.new_pool)

    def find(self, sandbox_id: str) -> LocalSandbox | None:
        """The live sandbox `sandbox_id` with its state brought up to date, or None."""
        with self._lock:
            sandbox = self._sandboxes.get(sandbox_id)
            if sandbox is not None:
                self._refresh(sandbox, datetime.now(timezone.utc))
            return sandbox

    def _refresh(self, sandbox: LocalSandbox, now: datetime) -> None:
        if (event := sandbox.refresh(now)) is not None:
            self.journal.record(sandbox.id, event)

    def _get(self, ex: Exchange) -> LocalSandbox:
        if (sandbox := self.find(ex.params["id"])) is None:
            raise not_found(ex.params["id"])
        return sandbox

    def create(self, ex: Exchange) -> None:
        """POST /sandboxes: validate, make the directory and runtime, answer 202.

        A `snapshotId` is restored (its copy fills the new sandbox's directories before the
        answer); an `extensions.poolRef` takes the pool's template and one of its spares.
        Fails closed: where sandboxes cannot be isolated and the server was not told to run
        them unisolated, 503 with what to install or allow.
        """
        body = read_json(ex)
        if self.config.refusal:
            raise error(503, "SANDBOX::ISOLATION_UNAVAILABLE", self.config.refusal)
        pool = None
        if isinstance(body, dict):
            check_local_fields(body)
            pool_ref = (body.get("extensions") or {}).get("poolRef")
            if isinstance(body.get("extensions"), dict) and pool_ref is not None:
                pool = self.pools.reserve(str(pool_ref))
                body = pooled_body(pool, body)
        snapshot = None
        if (
            isinstance(body, dict)
            and isinstance(body.get("snapshotId"), str)
            and body.get("image") is None
        ):
            snapshot = self.snapshots.ready(body["snapshotId"])
            for name, value in snapshot.source.items():
                if name != "image":
                    body.setdefault(name, value)
        check_create(body, self.config.min_timeout, self.config.max_timeout)
        check_labels(body.get("metadata") or {})
        internet, network_note = network_plan(
            policy_needs(body.get("networkPolicy")),
            self.config.support,
            self.config.unenforced_network_policy == "accept",
        )
        requested = limits.parse(body["resourceLimits"])
        isolated = self.config.support.bwrap is not None
        binary = self.config.binary  # its paths, and the OOM counter's, are ours: no volume's
        own = (OOM_CONTROL, IMAGE_EXECD_PATH, *(binary.read_only_paths() if binary else ()))
        mounts = volumes.mounts(body.get("volumes"), *self.config.volume_places, isolated, own)
        env = {k: str(v) for k, v in (body.get("env") or {}).items() if v is not None}
        token = secrets.token_urlsafe(24)
        config: dict[str, Any] = {"env": env, "token": token}
        try:  # the volumes' descriptors are closed below, however the create ends
            image = self.config.images.launch(body) if self.config.images is not None else None
            disk_mode = disk.mode(self.config.support, bool(image and image.image))
            plan = limits.plan(requested, self.config.limit_controllers, disk_mode)
            config["limits"] = plan
            spares = pool.spares if pool is not None else None
            with self.capacity.admit():
                container = self.containers.claimed(body, config, internet, mounts, spares, image)
            if snapshot is not None:
                try:
                    self.snapshots.restore(snapshot, container.snapshot_dirs())
                except BaseException:
                    container.close()
                    raise
        except ConfigError as exc:  # a path of the image's root that cannot be (`rootfs.py`)
            raise failed(str(body["image"].get("uri")), CONFIG_INVALID, str(exc)) from None
        except (OSError, RuntimeError) as exc:
            raise error(
                500, "DOCKER::SANDBOX_START_FAILED", f"Failed to start sandbox: {exc}"
            ) from None
        finally:
            volumes.close(mounts)
        sandbox_id = container.home.name
        try:
            binary = image.binary if image is not None else self.config.binary
            execd_note = binary.status_note() if binary else ""
            note = container.status_note(internet) + network_note + plan.message() + execd_note
            sandbox = self._register(sandbox_id, body, token, container, note)
            if image is not None and image.image is not None:
                sandbox.image_uri = image.image.pinned
        except BaseException:
            container.close()  # a refused create leaves no folder and no process
            raise
        sandbox.policy = network.normal(body.get("networkPolicy"))
        source = (
            f"snapshot {snapshot.id}"
            if snapshot is not None
            else f"image {body['image']['uri']}"
            if body.get("image")
            else "its request"
        )
        if pool is not None:
            self.pools.allocate(pool, sandbox_id)
            source += f" (a spare of pool {pool.name})"
        self.journal.record(sandbox_id, f"created from {source}")
        if sandbox.state == "Running":
            self.journal.record(sandbox_id, "started: Running")
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
                self._refresh(sandbox, now)
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

    def remove(self, sandbox_id: str, why: str = "deleted") -> bool:
        """Kill everything a sandbox runs, delete its files, then forget it (404 from then on).

        Its journal (with `why`, e.g. "expired") and the tail of its log are kept.
        Returns False if it was unknown or already being removed.
        """
        with self._lock:
            sandbox = self._sandboxes.get(sandbox_id)
            if sandbox is None or sandbox.removing:
                return False
            sandbox.removing = True
        self.journal.record(sandbox_id, why)
        self.journal.close(sandbox_id, sandbox.container.log_tail(diagnostics.LOG_TAIL_BYTES))
        self.pools.release(sandbox_id)
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
        sandbox = self._get(ex)
        host = ex.headers.get("Host") or self.config.address
        headers = (
            {network.EGRESS_HEADER: sandbox.egress_token}
            if port == network.EGRESS_PORT
            else {"X-EXECD-ACCESS-TOKEN": sandbox.token}
        )
        ex.send_json(
            200, {"endpoint": f"{host}/sandboxes/{sandbox.id}/proxy/{port}", "headers": headers}
        )

    def reap_expired(self) -> None:
        """Remove every sandbox whose expiry has passed (and mark the dead ones Failed);
        journal OOM kills; replace the pools' dead spares."""
        now = datetime.now(timezone.utc)
        with self._lock:
            for sandbox in self._sandboxes.values():
                self._refresh(sandbox, now)
            live = [s for s in self._sandboxes.values() if not s.removing]
            doomed = [s.id for s in live if s.expires_at is not None and s.expires_at <= now]
        for sandbox in live:
            kills = liveness.oom_kills(sandbox.container.group("memory"))
            self.journal.note_oom_kills(sandbox.id, kills)
        for sandbox_id in doomed:
            self.remove(sandbox_id, "expired: its timeout passed")
        self.pools.replace_dead()

    def close_all(self) -> None:
        """Remove every sandbox, spare container and snapshot (server stop)."""
        self.spares.close()
        self.pools.close()
        with self._lock:
            ids = list(self._sandboxes)
        for sandbox_id in ids:
            self.remove(sandbox_id, "deleted: the server stopped")
        self.snapshots.close()

    # -- snapshots -------------------------------------------------------------------------

    def create_snapshot(self, ex: Exchange) -> None:
        """POST /sandboxes/{id}/snapshots: copy its writable directories (frozen); 202."""
        body = read_json(ex) if ex.declared_length or ex.headers.get("Transfer-Encoding") else None
        name = body.get("name") if isinstance(body, dict) else None
        if body is not None and not isinstance(body, dict):
            raise unprocessable_body("a CreateSnapshotRequest object or nothing", body)
        if name is not None and (not isinstance(name, str) or not name):
            raise unprocessable_body("name: a non-empty string", name)
        sandbox = self._get(ex)
        if sandbox.state != "Running":
            raise error(
                409,
                "DOCKER::SANDBOX_NOT_RUNNING",
                f"Sandbox {sandbox.id} is {sandbox.state}: only a Running sandbox is snapshotted.",
            )

        def frozen(copy: Callable[[], None]) -> None:
            # one moment, as docker commit pauses the container (unless it is paused already)
            with self._lock:
                freeze = sandbox.state == "Running" and not sandbox.removing
                if freeze:
                    sandbox.container.pause()
            try:
                copy()
            finally:
                # thawed unless paused by its owner meanwhile (then it stays paused)
                with self._lock, suppress(OSError):
                    if freeze and sandbox.state == "Running" and not sandbox.removing:
                        sandbox.container.resume()

        snapshot = self.snapshots.take(
            sandbox.id, name, sandbox.body, sandbox.container.snapshot_dirs(), frozen
        )
        self.journal.record(sandbox.id, f"snapshot {snapshot.id} started")
        ex.send_json(202, snapshot.view(), {"Location": f"/v1/snapshots/{snapshot.id}"})

    def list_snapshots(self, ex: Exchange) -> None:
        """GET /snapshots: `sandboxId`, `name` and `state` filters, pagination, newest first."""
        states = {s.lower() for s in ex.query.get("state", []) if s}
        chosen = self.snapshots.matching(ex.arg("sandboxId"), ex.arg("name"), states)
        page = query_int(ex.arg("page"), "page", 1, 1, None)
        size = query_int(ex.arg("pageSize"), "pageSize", 20, 1, 200)
        ex.send_json(200, paginated(chosen, page, size))

    def get_snapshot(self, ex: Exchange) -> None:
        """GET /snapshots/{id}."""
        ex.send_json(200, self.snapshots.get(ex.params["id"]).view())

    def delete_snapshot(self, ex: Exchange) -> None:
        """DELETE /snapshots/{id}: 204; 409 while it is still Creating."""
        self.snapshots.delete(ex.params["id"])
        ex.send(204)

    # -- diagnostics -----------------------------------------------------------------------

    def _events_of(self, sandbox_id: str) -> builtins.list[str]:
        sandbox = self.find(sandbox_id)  # brings a Pending sandbox's start into the journal
        if sandbox is not None:
            kills = liveness.oom_kills(sandbox.container.group("memory"))
            self.journal.note_oom_kills(sandbox_id, kills)
        events = self.journal.events(sandbox_id)
        if events is None:
            raise not_found(sandbox_id)
        return events

    def _log_of(self, sandbox_id: str) -> str:
        sandbox = self.find(sandbox_id)
        if sandbox is not None:
            return sandbox.container.log_tail(diagnostics.LOG_TAIL_BYTES)
        kept = self.journal.log_of_gone(sandbox_id)
        if kept is None:
            raise not_found(sandbox_id)
        return kept

    def diagnostics_logs(self, ex: Exchange) -> None:
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
            send_text(ex, diagnostics.last_lines(self._log_of(sandbox_id), tail))
            return
        diagnostics.check_scope("logs", scope)
        parts = []
        if scope in ("container", "all"):
            parts.append(self._log_of(sandbox_id))
        if scope in ("lifecycle", "all"):
            parts.append("".join(line + "\n" for line in self._events_of(sandbox_id)))
        ex.send_json(200, diagnostics.descriptor(sandbox_id, "logs", scope, "".join(parts)))

    def diagnostics_events(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}/diagnostics/events: its events (`limit` last), or with a
        `scope` the Diagnostics descriptor."""
        sandbox_id, scope = ex.params["id"], ex.arg("scope")
        if scope is None:
            limit = query_int(ex.arg("limit"), "limit", 50, 1, 500)
            lines = self._events_of(sandbox_id)[-limit:]
            send_text(ex, "".join(line + "\n" for line in lines))
            return
        diagnostics.check_scope("events", scope)
        text = "".join(line + "\n" for line in self._events_of(sandbox_id))
        ex.send_json(200, diagnostics.descriptor(sandbox_id, "events", scope, text))

    def diagnostics_inspect(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}/diagnostics/inspect: the container, as plain text."""
        send_text(ex, self._inspection(self._get(ex)))

    def _inspection(self, sandbox: LocalSandbox) -> str:
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

    def diagnostics_summary(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}/diagnostics/summary: inspection, last events and log lines."""
        tail = query_int(ex.arg("tail"), "tail", 50, 1, 10000)
        event_limit = query_int(ex.arg("event_limit"), "event_limit", 20, 1, 500)
        sandbox = self._get(ex)
        events = self._events_of(sandbox.id)[-event_limit:]
        log = diagnostics.last_lines(self._log_of(sandbox.id), tail)
        text = (
            "== inspect ==\n"
            + self._inspection(sandbox)
            + f"== events (last {len(events)}) ==\n"
            + "".join(line + "\n" for line in events)
            + f"== container log (last {tail} lines) ==\n"
            + log
        )
        send_text(ex, text)

    # -- pools -----------------------------------------------------------------------------

    def create_pool(self, ex: Exchange) -> None:
        """POST /pools: a named pool of warm spares with its capacitySpec; 201."""
        body = read_json(ex)
        if not isinstance(body, dict):
            raise unprocessable_body("a CreatePoolRequest object", body)
        name = check_name(body.get("name"))
        template = check_template(body.get("template"))
        capacity = check_capacity(body.get("capacitySpec"))
        check_create(template_body(template), self.config.min_timeout, self.config.max_timeout)
        network_plan(
            policy_needs(template.get("networkPolicy")),
            self.config.support,
            self.config.unenforced_network_policy == "accept",
        )
        ex.send_json(201, self.pools.create(name, template, capacity).view())

    def list_pools(self, ex: Exchange) -> None:
        """GET /pools."""
        ex.send_json(200, {"items": [pool.view() for pool in self.pools.all()]})

    def get_pool(self, ex: Exchange) -> None:
        """GET /pools/{name}."""
        ex.send_json(200, self.pools.get(ex.params["name"]).view())

    def update_pool(self, ex: Exchange) -> None:
        """PUT /pools/{name}: a new capacitySpec."""
        body = read_json(ex)
        if not isinstance(body, dict):
            raise unprocessable_body("an UpdatePoolRequest object", body)
        capacity = check_capacity(body.get("capacitySpec"))
        ex.send_json(200, self.pools.update(ex.params["name"], capacity).view())

    def delete_pool(self, ex: Exchange) -> None:
        """DELETE /pools/{name}: 204 (its sandboxes keep running)."""
        self.pools.delete(ex.params["name"])
        ex.send(204)

    # -- network policy --------------------------------------------------------------------

    def _apply_policy(
        self, sandbox: LocalSandbox, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Enforce `change(current policy)` on a running sandbox; the create's 400 for what
        cannot be. One change at a time: two PATCHes never lose one another's rules."""
        with self._policy_lock:
            policy = network.normal(change(sandbox.policy))
            internet, note = network_plan(
                policy_needs(policy),
                self.config.support,
                self.config.unenforced_network_policy == "accept",
            )
            try:
                sandbox.container.set_internet(internet)
            except ProcessLookupError as exc:
                message = f"Sandbox {sandbox.id}'s network cannot change: {exc}."
                raise error(409, "DOCKER::SANDBOX_NOT_RUNNING", message) from None
            except (OSError, RuntimeError) as exc:
                raise error(
                    500, "DOCKER::NETWORK_POLICY_FAILED", f"The network could not change: {exc}"
                ) from None
            sandbox.policy = policy
        answer = network.status(policy)
        self.journal.record(sandbox.id, f"network policy changed: {answer['mode']}{note}")
        return answer

    def network_policy_get(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}/networkpolicy: the policy it runs under (PolicyStatusResponse)."""
        ex.send_json(200, network.status(self._get(ex).policy))

    def network_policy_put(self, ex: Exchange) -> None:
        """PUT /sandboxes/{id}/networkpolicy: replace the policy of the running sandbox."""
        policy = check_network_policy(read_json(ex))
        ex.send_json(200, self._apply_policy(self._get(ex), lambda _: policy))

    def network_policy_patch(self, ex: Exchange) -> None:
        """PATCH /sandboxes/{id}/networkpolicy: merge rules by target."""
        rules = check_rules(read_json(ex))
        sandbox = self._get(ex)
        ex.send_json(200, self._apply_policy(sandbox, lambda now: network.patched(now, rules)))

    def network_policy_delete(self, ex: Exchange) -> None:
        """DELETE /sandboxes/{id}/networkpolicy: remove the rules of these targets."""
        targets = check_targets(read_json(ex))
        sandbox = self._get(ex)
        ex.send_json(200, self._apply_policy(sandbox, lambda now: network.without(now, targets)))

    def egress_policy(self, ex: Exchange, sandbox: LocalSandbox, rest: str) -> None:
        """The egress sidecar's `/policy` for the proxy route of port 18080 (already checked
        to carry the sandbox's egress token): GET, PATCH (merge rules), DELETE (targets)."""
        if rest.rstrip("/") != "/policy":
            raise error(404, "EGRESS::NOT_FOUND", f"The egress API has no {rest[:100]!r}.")
        if ex.method == "GET":
            ex.send_json(200, network.status(sandbox.policy))
        elif ex.method == "PATCH":
            rules = check_rules(read_json(ex))
            ex.send_json(200, self._apply_policy(sandbox, lambda now: network.patched(now, rules)))
        elif ex.method == "DELETE":
            targets = check_targets(read_json(ex))
            answer = self._apply_policy(sandbox, lambda now: network.without(now, targets))
            ex.send_json(200, answer)
        else:
            raise HttpError(405, {"detail": "Method Not Allowed"})


def paginated(items: list[dict[str, Any]], page: int, size: int) -> dict[str, Any]:
    """One page of `items` with the released server's `pagination`."""
    pages = math.ceil(len(items) / size)
    return {
        "items": items[(page - 1) * size : page * size],
        "pagination": {
            "page": page,
            "pageSize": size,
            "totalItems": len(items),
            "totalPages": pages,
            "hasNextPage": page < pages,
        },
    }
