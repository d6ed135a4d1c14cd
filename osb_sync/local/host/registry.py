"""The registry of the local server: its resources, composed, and the create that takes from all.

As docker-py keeps one module per resource, each resource's routes live beside its store:
the sandboxes (`sandboxes.py`: their table, lifecycle routes and journal), snapshots
(`snapshots.py`), diagnostics (`diagnostics.py`), the network policy (`network.py`) and pools
(`pools.py`); each holds the sandboxes' table by composition where it needs one. The registry
holds them all, the containers they run on (`spares.ContainerSource`: warm spares or cold
starts) and the capacity check; `LocalServer.routes` is the one table of their routes.

A create (POST /sandboxes) takes two steps. `plan` checks it whole into a frozen `CreatePlan`:
the request with its pool's template and its snapshot's fields joined in, checked once
(`validation.check_sandbox`), its limits, network, volumes (their sources too, before any
pull; nothing opened), environment, entrypoint and image, and the pool and snapshot it takes
from. Planning changes two things only: an image it pulls stays in the image store (a cache,
whatever becomes of the create), and a sandbox of its pool is reserved (`poolMax` counts it),
which a failed create gives back.
`create` then carries the plan out: opens the volumes, passes the capacity check, claims a
container (a warm spare where one fits, else a cold start), restores the snapshot, registers
the sandbox, and answers 202. Nothing of a create that fails is left: no folder, no process.
It fails closed: where sandboxes cannot be isolated and the server was not told to run them
unisolated, every create is refused, naming what to install or allow.
"""

from __future__ import annotations

import errno
import logging
import os
import platform
import secrets
from dataclasses import dataclass, field, replace
from typing import Any

from ..http.exchange import Exchange, error
from . import disk, entrypoint, identity, limits, network, package, volumes
from .capacity import Capacity
from .container import OOM_CONTROL, Assignment, Launch
from .diagnostics import Diagnostics
from .egress import Rules
from .errors import ImageError, IsolationError, UnenforcedLimitError
from .execd_binary import IMAGE_EXECD_PATH
from .images.config import CONFIG_INVALID, ConfigError
from .images.service import ImageRun
from .network import NetworkPolicy
from .pools import LocalPool, Pools, pooled_body
from .sandboxes import Config, LocalSandbox, Sandboxes
from .snapshots import Snapshot, Snapshots
from .spares import ContainerSource
from .validation import bad_parameter, check_sandbox, invalid_json

# Machine names of `platform.machine()` by the released server's `arch` values.
ARCHES = {"amd64": ("x86_64", "amd64"), "arm64": ("aarch64", "arm64")}
# Create fields the local server cannot honour: each is refused by name, never silently accepted.
REFUSED_FIELDS = {
    "secureAccess": "secured endpoint access needs an ingress gateway (Kubernetes)",
    "credentialProxy": "the Credential Vault proxy needs the egress sidecar",
    "lifecycle": "lifecycle hooks are run by the real execd, not the local server's",
    "templateId": "templates need OpenSandbox's Kubernetes runtime (fsb templates)",
}
logger = logging.getLogger("osb_sync.local")


@dataclass(frozen=True)
class CreatePlan:
    """A create, checked whole; nothing of it started yet (see the module docstring)."""

    # the request, with its pool's template and its snapshot's fields (not in its repr: its
    # env and its image's registry credentials)
    body: dict[str, Any] = field(repr=False)
    limits: limits.Plan
    internet: bool  # outbound access (slirp4netns) instead of loopback only
    network_note: str  # what the status says of its network policy
    volumes: tuple[volumes.Volume, ...]
    env: dict[str, str] = field(repr=False)  # the sandbox's variables (its secrets, too)
    entrypoint: tuple[str, ...] | None
    image: ImageRun | None  # None: the host's view
    pool: LocalPool | None  # the pool it takes a sandbox from, one reserved
    snapshot: Snapshot | None  # the snapshot it restores
    rules: Rules | None = None  # outbound access by name only (`egress.py`)

    @property
    def source(self) -> str:
        """What it is made from, for its journal."""
        if self.snapshot is not None:
            made = f"snapshot {self.snapshot.id}"
        elif self.body.get("image"):
            made = f"image {self.body['image']['uri']}"
        else:
            made = "its request"
        return made + (f" (a spare of pool {self.pool.name})" if self.pool is not None else "")


def check_local_fields(body: dict[str, Any]) -> None:
    """400 naming each create field the local server cannot honour (`REFUSED_FIELDS`), and a
    `platform` other than this host's."""
    for name, why in REFUSED_FIELDS.items():
        value = body.get(name)
        if name == "credentialProxy" and isinstance(value, dict):
            value = value.get("enabled")
        if value:
            raise bad_parameter(f"{name} is not supported by the local server: {why}")
    wanted = body.get("platform")
    if wanted is None:
        return
    machine = platform.machine().lower()
    if (
        not isinstance(wanted, dict)
        or wanted.get("os") != "linux"
        or machine not in ARCHES.get(str(wanted.get("arch")), ())
    ):
        raise bad_parameter(
            f"platform {wanted!r} cannot be satisfied here: the local server runs linux on "
            f"{machine} (pass platform={{'os': 'linux', 'arch': ...}} of this host, or none)"
        )


class Registry:
    """The local server's resources, composed (see the module docstring), and the create."""

    def __init__(self, config: Config) -> None:
        self.config = config
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
        self.pools = Pools(config, self.containers.new_pool)
        self.sandboxes = Sandboxes(config, self.pools.store.release)
        self.snapshots = Snapshots(self.sandboxes, config.root)
        self.diagnostics = Diagnostics(self.sandboxes)
        self.network = NetworkPolicy(self.sandboxes)
        self.capacity = Capacity(lambda: self.sandboxes.count() + self.spares.count)

    def create(self, ex: Exchange) -> None:
        """POST /sandboxes: `plan` it, carry it out, answer 202 (see the module docstring)."""
        package.warn_if_changed()
        plan = self.plan(ex)
        try:
            sandbox = self._start(plan)
        except BaseException:
            if plan.pool is not None:
                self.pools.store.cancel(plan.pool)
            raise
        if plan.limits.dropped:  # one line per such sandbox, as rootless Podman on cgroup v1
            logger.warning(
                "local server: sandbox %s runs WITHOUT the limits it asked for: %s",
                sandbox.id,
                self._dropped(plan.limits),
            )
        if plan.pool is not None:
            self.pools.store.allocate(plan.pool, sandbox.id)
        self.sandboxes.journal.record(sandbox.id, f"created from {plan.source}")
        if sandbox.state == "Running":
            self.sandboxes.journal.record(sandbox.id, "started: Running")
        ex.send_json(202, sandbox.view(created=True))

    def plan(self, ex: Exchange) -> CreatePlan:
        """The create request of `ex`, checked whole (a reservation in its pool, if any, which
        the caller gives back if the create fails).

        Raises:
            HttpError: the released server's 4xx for a malformed or refused request; 503 where
                sandboxes cannot be isolated (`Config.refusal`).
            LocalError: what the mechanics refuse (limits, network, volumes, the image).
        """
        try:
            body = ex.json_body()
        except ValueError as exc:
            raise invalid_json(str(exc)) from None
        if self.config.refusal:
            raise IsolationError(self.config.refusal)
        pool = None
        if isinstance(body, dict):
            check_local_fields(body)
            extensions = body.get("extensions")
            pool_ref = extensions.get("poolRef") if isinstance(extensions, dict) else None
            if pool_ref is not None:
                pool = self.pools.store.reserve(str(pool_ref))
        try:
            return self._checked(body, pool)
        except BaseException:
            if pool is not None:
                self.pools.store.cancel(pool)
            raise

    def _checked(self, body: Any, pool: LocalPool | None) -> CreatePlan:
        config = self.config
        if pool is not None:
            body = pooled_body(pool, body)
        snapshot = None
        if (
            isinstance(body, dict)
            and isinstance(body.get("snapshotId"), str)
            and body.get("image") is None
        ):
            snapshot = self.snapshots.store.ready(body["snapshotId"])
            for name, value in snapshot.source.items():
                if name != "image":
                    body.setdefault(name, value)
        body = check_sandbox(body, config.min_timeout, config.max_timeout)
        internet, network_note = network.plan(body.get("networkPolicy"), config)
        rules = network.rules(body.get("networkPolicy")) if internet else None
        requested = limits.parse(body["resourceLimits"])
        binary = config.binary  # its paths, and the OOM counter's, are ours: no volume's
        own = (OOM_CONTROL, IMAGE_EXECD_PATH, *(binary.read_only_paths() if binary else ()))
        isolated = config.support.bwrap is not None
        checked = volumes.checked(body.get("volumes"), isolated, own)
        volumes.sources_checked(checked, *config.volume_places)  # before an image's pull
        env = {k: str(v) for k, v in (body.get("env") or {}).items() if v is not None}
        image = config.images.launch(body) if config.images is not None else None
        disk_mode = disk.mode(config.support, image is not None)
        ids = config.support.ids if isolated else None
        per_namespace = ids is not None and limits.nproc_per_namespace()
        counted = "" if ids is None or not per_namespace else "one" if ids.own else "range"
        plan = limits.plan(requested, config.limit_controllers, disk_mode, counted)
        if plan.dropped and config.require_limits:
            raise UnenforcedLimitError(
                f"this server requires limits (require_limits) and cannot enforce what the"
                f" create asked for: {self._dropped(plan)}"
            )
        argv = entrypoint.command(body, image.view if image is not None else None)
        return CreatePlan(
            body=body,
            limits=plan,
            internet=internet,
            rules=rules,
            network_note=network_note,
            volumes=checked,
            env=env,
            entrypoint=tuple(argv) if argv is not None else None,
            image=image,
            pool=pool,
            snapshot=snapshot,
        )

    def _out_of_processes(self, failure: str) -> str:
        """The cause of a start `failure` that ran out of processes on a server that is not
        root (EAGAIN: its sandboxes share the user's RLIMIT_NPROC less a reserve), else ""."""
        ids = self.config.support.ids
        cap = identity.sandboxes_nproc() if ids is not None and not ids.by_root else None
        signs = (os.strerror(errno.EAGAIN), "can't start new thread")  # bwrap's, execd's
        if cap is None or not any(sign in failure for sign in signs):
            return ""
        return (
            f". This user's sandboxes share at most {cap} processes (its RLIMIT_NPROC less a"
            " reserve for its own), and they have them: delete a sandbox, give them lower"
            " pids, or raise the user's limit (ulimit -u)"
        )

    def _dropped(self, plan: limits.Plan) -> str:
        """The limits `plan` drops that the create asked for, and how each could be had."""
        said = [t for t in plan.unenforced if t.split("=")[0] in plan.dropped]
        fixes = []
        grouped = [key for key in limits.CONTROLLERS if key in plan.dropped]
        if grouped and self.config.limits_fix:
            fixes.append(f"for {' and '.join(grouped)}, {self.config.limits_fix}")
        disk_keys = [key for key in limits.DISK_KEYS if key in plan.dropped]
        if disk_keys:
            fixes.append(
                f"for {' and '.join(disk_keys)}, run the server as root (it mounts one tmpfs"
                " per sandbox, with both caps)"
            )
        if set(plan.dropped) - {*limits.CONTROLLERS, *limits.DISK_KEYS}:
            fixes.append("leave out the keys not supported locally")
        return "; ".join(said) + ". To enforce them: " + "; ".join(fixes or ["ask for none"])

    def _start(self, plan: CreatePlan) -> LocalSandbox:
        """Carry `plan` out: a container serving the sandbox, registered."""
        token = secrets.token_urlsafe(24)
        image = plan.image
        binary = image.binary if image is not None else self.config.binary
        config = self.config
        binds = volumes.opened(plan.volumes, *config.volume_places, config.volume_root_is_host_root)
        try:  # the volumes' descriptors are closed below, however the create ends
            launch = replace(self.containers.spare_settings, mounts=tuple(binds), plan=plan.limits)
            if image is not None:
                launch = replace(launch, binary=image.binary, view=image.view)
            assignment = Assignment(
                token, plan.env, plan.entrypoint, plan.limits, plan.internet, plan.rules
            )
            spares = plan.pool.spares if plan.pool is not None else None
            fill = None
            if plan.snapshot is not None:
                # before its claim: a restore (cp -a, as the server) into a sandbox whose code
                # runs could follow links it planted at the snapshot's names, onto the host
                snapshot = plan.snapshot
                fill = lambda c: self.snapshots.store.restore(snapshot, c.snapshot_dirs())  # noqa: E731
            with self.capacity.admit():
                container = self.containers.claimed(plan.body, assignment, launch, spares, fill)
        except ConfigError as exc:  # a path of the image's root that cannot be (`rootfs.py`)
            raise ImageError(str(plan.body["image"].get("uri")), CONFIG_INVALID, str(exc)) from None
        except (OSError, RuntimeError) as exc:
            said = f"Failed to start sandbox: {exc}{self._out_of_processes(str(exc))}"
            raise error(500, "DOCKER::SANDBOX_START_FAILED", said) from None
        finally:
            volumes.close(binds)
        try:
            execd_note = binary.status_note() if binary else ""
            note = (
                container.status_note(plan.internet)
                + plan.network_note
                + plan.limits.message()
                + execd_note
            )
            sandbox = self.sandboxes.add(container.home.name, plan.body, token, container, note)
            journal, sandbox_id = self.sandboxes.journal, sandbox.id
            container.on_event = lambda line: journal.record(sandbox_id, line)
            if image is not None:
                sandbox.image_uri = image.view.image.pinned
        except BaseException:
            container.close()  # a refused create leaves no folder and no process
            raise
        sandbox.policy = network.normal(plan.body.get("networkPolicy"))
        return sandbox

    def reap(self) -> None:
        """Remove every sandbox whose expiry has passed (and mark the dead ones Failed);
        journal OOM kills; replace the dead spares, the server's and the pools'."""
        self.sandboxes.reap_expired()
        self.pools.store.replace_dead()
        self.spares.replace_dead()

    def close_all(self) -> None:
        """Remove every sandbox, spare container and snapshot (server stop)."""
        self.spares.close()
        self.pools.store.close()
        self.sandboxes.close_all()
        self.snapshots.store.close()
