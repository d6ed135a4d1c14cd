"""LocalServer: the HTTP server, its one route table, authentication and the expiry reaper.

One port serves the lifecycle API, `/health`, and every sandbox's execd and ports through the
server-proxy route `/sandboxes/{id}/proxy/{port}/...`, each route both under `/v1` and without
it, as the released server does. `LocalServer.routes` is the table, in the order of the
released server's spec; `tests/unit/test_route_tables.py` checks it against that spec and
lists what is not served yet.
"""

from __future__ import annotations

import atexit
import dataclasses
import hmac
import logging
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from ..http.exchange import Exchange, HttpError, Route, Router, error
from ..http.httpd import HTTPServer, Limits, host_names
from . import (
    capacity,
    cgroup,
    cgroup2,
    firewall,
    identity,
    logs,
    options,
    package,
    proxy,
    recovery,
    staging,
)
from .bwrap import Support, probe, refusal
from .errors import (
    CapacityError,
    FieldError,
    ImageError,
    InternetError,
    IsolationError,
    LimitError,
    LocalError,
    PolicyError,
    UnenforcedLimitError,
    VolumeError,
)
from .execd_binary import ExecdBinary, checked_jupyter
from .images.inside import for_ids
from .images.pull import TOO_LARGE
from .images.service import ImageService, ImageSettings
from .proxy import EGRESS_HEADER, EGRESS_PORT, EXECD_PORT
from .registry import Registry
from .sandboxes import Config, not_found
from .validation import bad_parameter, issue, unprocessable

logger = logging.getLogger("osb_sync.local")

# Every method the HTTP layer accepts; the released server's spec lists the first five.
PROXY_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")
REAP_INTERVAL = 0.2
# /metrics/events takes no key (SDK telemetry, dropped): its body is small and capped, so a
# client without the key cannot hold the server reading a large one.
METRICS_BODY_LIMIT = 16 * 1024
MISSING_KEY = (
    "Authentication credentials are missing. Provide API key via OPEN-SANDBOX-API-KEY header."
)
INVALID_KEY = "Authentication credentials are invalid. Check your API key and try again."
BAD_TOKEN = {"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}
BAD_EGRESS_TOKEN = {
    "code": "UNAUTHORIZED",
    "message": "invalid or missing header OPENSANDBOX-EGRESS-AUTH (the endpoint of port 18080 "
    "gives it)",
}


class LocalServer:
    """A local OpenSandbox-compatible server: lifecycle API plus execd, on one port.

    While it runs in the main thread of a process whose SIGTERM does the default (kill), a
    SIGTERM raises KeyboardInterrupt instead, like Ctrl-C, so the process unwinds and stops
    the server: its sandboxes, their processes and its temporary directory go away.

    Args:
        (one line per option, written from the declarations in `options.py`)

    Raises:
        ValueError: a bad option, or `execd`/`jupyter` is not an executable (of a venv).
    """

    def __init__(
        self,
        host: str = options.HOST.default,
        port: int = options.PORT.default,
        *,
        api_key: str | None = options.API_KEY.default,
        allow_no_api_key: bool = options.ALLOW_NO_API_KEY.default,
        min_timeout: int = options.MIN_TIMEOUT.default,
        max_timeout: int = options.MAX_TIMEOUT.default,
        pending_seconds: float = options.PENDING_SECONDS.default,
        ping_interval: float = options.PING_INTERVAL.default,
        unenforced_network_policy: str = options.UNENFORCED_NETWORK_POLICY.default,
        root_dir: str | Path | None = options.ROOT_DIR.default,
        command_grace: float = options.COMMAND_GRACE.default,
        isolation: bool | None = options.ISOLATION.default,
        require_id_range: bool = options.REQUIRE_ID_RANGE.default,
        cgroup_parent: str | None = options.CGROUP_PARENT.default,
        require_limits: bool = options.REQUIRE_LIMITS.default,
        allowed_hosts: Iterable[str] = options.ALLOWED_HOSTS.default,
        limits: Limits | None = options.LIMITS.default,
        allowed_host_paths: Iterable[str | Path] = options.ALLOWED_HOST_PATHS.default,
        volume_root: str | Path | None = options.VOLUME_ROOT.default,
        volume_root_is_host_root: bool = options.VOLUME_ROOT_IS_HOST_ROOT.default,
        execd: str | os.PathLike[str] | None = options.EXECD.default,
        jupyter: str | os.PathLike[str] | None = options.JUPYTER.default,
        execd_image: str | None = options.EXECD_IMAGE.default,
        spare_containers: int = options.SPARE_CONTAINERS.default,
        container_log_size: int = options.CONTAINER_LOG_SIZE.default,
        container_logs_total: int = options.CONTAINER_LOGS_TOTAL.default,
        image_store: str | Path | None = options.IMAGE_STORE.default,
        image_store_size: int = options.IMAGE_STORE_SIZE.default,
        image_size_limit: int | None = options.IMAGE_SIZE_LIMIT.default,
        insecure_registries: Iterable[str] = options.INSECURE_REGISTRIES.default,
        registry_auth_file: str | Path | None = options.REGISTRY_AUTH_FILE.default,
        local_image_paths: Iterable[str | Path] = options.LOCAL_IMAGE_PATHS.default,
        host_images: Iterable[str] = options.HOST_IMAGES.default,
    ) -> None:
        # First, while the locals are exactly the keywords (the test of options.py holds
        # this signature and `options.OPTIONS` to each other).
        options.check({name: value for name, value in locals().items() if name != "self"})
        self.execd_binary = ExecdBinary.checked(execd, jupyter) if execd is not None else None
        self.execd_image = execd_image
        # with execd_image, the binary comes at start: the jupyter venv is checked now
        self._jupyter = checked_jupyter(jupyter) if jupyter is not None else None
        self.host = host
        self.port = port
        self.api_key = api_key
        self.allow_no_api_key = allow_no_api_key
        self.min_timeout = min_timeout
        self.max_timeout = max_timeout
        self.pending_seconds = pending_seconds
        self.ping_interval = ping_interval
        self.unenforced_network_policy = unenforced_network_policy
        self.command_grace = command_grace
        self.allowed_hosts = tuple(allowed_hosts)
        self.limits = limits or Limits()
        self.allowed_host_paths = tuple(Path(p).resolve() for p in allowed_host_paths)
        self.volume_root = Path(volume_root) if volume_root is not None else None
        self.volume_root_is_host_root = volume_root_is_host_root
        self.spare_containers = spare_containers
        self.container_log_size = container_log_size
        self.container_logs_total = container_logs_total
        self.image_settings = ImageSettings(
            store=Path(image_store) if image_store is not None else None,
            cap=image_store_size,
            limit=image_size_limit,
            insecure_registries=tuple(insecure_registries),
            auth_file=Path(registry_auth_file) if registry_auth_file is not None else None,
            local_paths=tuple(Path(p).resolve() for p in local_image_paths),
            host_images=tuple(host_images),
        )
        self.network_policy_enforced = False
        self.isolated = False
        self.isolation_problem = ""
        self.isolation_fix = ""  # the fix of `isolation_problem`
        self.refusal = ""  # why every create answers 503 (isolation impossible, not turned off)
        self._isolation = isolation
        self._require_id_range = require_id_range
        self._cgroup_parent = cgroup_parent
        self._require_limits = require_limits
        self._limit_controllers: frozenset[str] = frozenset()  # `cgroup2.arrange` finds them
        self._own_peers = False  # only the server's user and root are answered (`start`)
        self._root_dir = Path(root_dir) if root_dir is not None else None
        self.root_dir: Path | None = None
        self._state_lock = threading.Lock()
        self._started = False
        self._stopped = threading.Event()
        self._httpd: HTTPServer | None = None
        self._registry: Registry | None = None
        self._router: Router | None = None
        self._threads: list[threading.Thread] = []
        self._catches_sigterm = False
        self._lock_fd = -1  # held for the server's life: the state directory is its (recovery.py)
        self._watching = False  # holds firewall.WATCH

    @property
    def base_url(self) -> str:
        """``http://host:port`` (an IPv6 address in brackets), without ``/v1``."""
        return f"http://{self._netloc}"

    @property
    def _netloc(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        """``http://host:port/v1``, the lifecycle API base URL."""
        return f"{self.base_url}/v1"

    def _support(self) -> Support:
        if self._isolation is False:
            support = Support(None, "turned off by isolation=False", None, False)
        else:
            support = probe()
        ids = support.ids
        if self._require_id_range and support.bwrap is not None and ids is not None and ids.own:
            problem = f"{ids.no_range}, and the server requires one (require_id_range)"
            support = Support(None, problem, None, False, fix=ids.range_fix)
        if support.bwrap is not None:
            place, self._limit_controllers, freezer = cgroup2.arrange(self._cgroup_parent)
            support = dataclasses.replace(support, freezer=freezer, cgroups=place)
            if self._cgroup_parent is not None:  # asked for: not used is no quiet fallback
                self._check_cgroup_parent(place, freezer)
        if (self.execd_binary is not None or self.execd_image) and support.bwrap is None:
            raise RuntimeError(
                "an execd binary needs isolated sandboxes (it listens on every interface of"
                f" its fixed port) but they cannot be isolated here ({support.problem}); to"
                f" fix it, {support.fix}"
            )
        if self._isolation and support.bwrap is None:
            raise RuntimeError(
                f"sandboxes cannot be isolated here ({support.problem}); to fix it, {support.fix}"
            )
        return support

    def _check_cgroup_parent(self, place: cgroup.Place, freezer: bool) -> None:
        """Refuse a `cgroup_parent` where the server can use none of it (RuntimeError naming
        the fix); warn naming the controllers it cannot use where it can use some."""
        usable = {*self._limit_controllers, *(("freezer",) if freezer else ())}
        missing = sorted({*cgroup.CONTROLLERS} - usable)
        if not missing:
            return
        fix = place.problem or cgroup.delegation_fix(version=place.version)
        where = f"cgroup_parent {self._cgroup_parent!r}"
        if not usable:
            raise RuntimeError(
                f"{where} is not this server's to use (missing, or not writable by it); {fix}"
            )
        logger.warning("local server: %s lacks %s; %s", where, ", ".join(missing), fix)

    def start(self) -> LocalServer:
        """Bind and serve in background threads; returns self. Idempotent.

        With the default `isolation=None` it starts where sandboxes cannot be isolated, and
        `refusal` says why every create answers 503.

        Raises:
            OSError: the address cannot be bound (nothing is left behind).
            ValueError: `host` is a name bound to an address other machines reach, and the
                server has no `api_key` (nor `allow_no_api_key`); it serves nothing.
            RuntimeError: `isolation=True`, or `execd`, where sandboxes cannot be isolated;
                or (an ``ExecdImageError``) `execd_image` cannot be pulled or holds no execd
                binary.
        """
        with self._state_lock:
            if self._started:
                return self
            support = self._support()
            capacity.raise_descriptor_limit()
            package.snapshot()  # what every sandbox of this process runs
            self.isolated = self.network_policy_enforced = support.bwrap is not None
            self.isolation_problem, self.isolation_fix = support.problem, support.fix
            own = support.ids if support.ids is not None and support.ids.own else None
            if not self.isolated and self._isolation is None:
                self.refusal = refusal(support.problem, support.fix)
            hosts = host_names(self.host, self.allowed_hosts)
            self._httpd = HTTPServer((self.host, self.port), self.route, self.limits, hosts)
            self.port = self._httpd.server_address[1]
            bound = str(self._httpd.server_address[0])
            exposed = self.api_key is None and not options.loopback(bound)
            # No key on loopback: the port is open to every local user, and a server that is
            # not root runs its sandboxes as its own user (or its range): only that user and
            # root are answered.
            self._own_peers = self.api_key is None and os.geteuid() != 0 and not exposed
            if exposed and not self.allow_no_api_key:  # a name, judged by where it bound
                self._httpd.server_close()
                raise ValueError(options.needs_a_key(self.host, bound))
            try:
                self.root_dir = self._make_root()
            except BaseException:
                self._httpd.server_close()
                raise
            self._lock_fd = recovery.claim(self.root_dir)
            recovery.reap(self.root_dir, support.cgroups)
            for parent in recovery.stray_parents():
                recovery.sweep_strays(parent, support.cgroups)
            if support.ids is not None and self.isolated:
                identity.admit(self.root_dir, support.ids)  # bwrap runs as the range's root
                staging.sweep()  # what a killed server left
            owner, inside = for_ids(support.ids if self.isolated else None)
            images = ImageService(
                self.image_settings, self.isolated, self.execd_binary, owner, inside
            )
            if self.execd_image:
                try:
                    self._binary_from_image(images)
                except BaseException:
                    self._httpd.server_close()
                    self._release_root()
                    raise
            support = self._watch_addresses(support)
            logs.READER.hold()
            self._registry = Registry(
                Config(
                    root=self.root_dir,
                    min_timeout=self.min_timeout,
                    max_timeout=self.max_timeout,
                    pending_seconds=self.pending_seconds,
                    ping_interval=self.ping_interval,
                    command_grace=self.command_grace,
                    unenforced_network_policy=self.unenforced_network_policy,
                    support=support,
                    address=self._netloc,
                    limit_controllers=self._limit_controllers if self.isolated else frozenset(),
                    require_limits=self._require_limits,
                    limits_fix=cgroup.delegation_fix(version=support.cgroups.version)
                    if self.isolated
                    else "",
                    volume_places=(
                        self.allowed_host_paths,
                        self.volume_root or self.root_dir / "volumes",
                    ),
                    volume_root_is_host_root=self.volume_root_is_host_root,
                    binary=self.execd_binary,
                    spare_containers=self.spare_containers,
                    log_budget=logs.LogBudget(self.container_log_size, self.container_logs_total),
                    refusal=self.refusal,
                    images=images,
                )
            )
            self._router = Router()
            for method, pattern, route in self.routes(self._registry):
                self._router.add(method, pattern, route)
            self._registry.spares.fill()
            self._threads = [
                threading.Thread(
                    target=self._httpd.serve_forever,
                    kwargs={"poll_interval": 0.1},
                    name="osb-local-http",
                    daemon=True,
                ),
                threading.Thread(
                    target=self._httpd.watch_deadlines,
                    args=(self._stopped,),
                    name="osb-local-deadlines",
                    daemon=True,
                ),
                threading.Thread(target=self._reap, name="osb-local-reaper", daemon=True),
            ]
            for thread in self._threads:
                thread.start()
            self._started = True
            atexit.register(self.stop)
            self._catches_sigterm = _catch_sigterm()
            if exposed:
                logger.warning(
                    "local OpenSandbox server on %s has no API key (allow_no_api_key=True):"
                    " anyone who reaches port %d can create sandboxes and run code in them",
                    self.api_base,
                    self.port,
                )
        if self.isolated and own is not None:
            logger.warning(
                "local OpenSandbox server on %s: sandboxes isolated, but root inside is your"
                " user outside (%s); for a root that is not you: %s",
                self.api_base,
                own.no_range,
                own.range_fix,
            )
        elif self.isolated:
            logger.info("local OpenSandbox server on %s (sandboxes isolated)", self.api_base)
        elif self.refusal:
            logger.error(
                "local OpenSandbox server on %s refuses to create sandboxes (503): %s",
                self.api_base,
                self.refusal,
            )
        else:  # no fix to offer for isolation turned off on purpose
            fix = "" if self._isolation is False else f"; to fix it, {self.isolation_fix}"
            logger.warning(
                "local OpenSandbox server on %s: sandboxes are NOT isolated (%s)%s",
                self.api_base,
                self.isolation_problem,
                fix,
            )
        return self

    def _watch_addresses(self, support: Support) -> Support:
        """Follow the host's addresses for the sandboxes' firewalls (`firewall.py`); where
        they cannot be read, `support` without the firewall: internet access is refused."""
        if support.bwrap is None or support.slirp is None or support.firewall is None:
            return support
        try:
            firewall.WATCH.hold()
        except OSError as exc:
            logger.error(
                "local server: the host's addresses cannot be read (%s): sandboxes with"
                " internet access are refused",
                exc,
            )
            return dataclasses.replace(support, firewall=None)
        self._watching = True
        return support

    def _make_root(self) -> Path:
        if self._root_dir is None:
            return Path(tempfile.mkdtemp(prefix=recovery.STRAY_PREFIX))
        self._root_dir.mkdir(0o755, parents=True, exist_ok=True)  # whatever the umask
        recovery.check_owner(self._root_dir)
        return self._root_dir

    def _binary_from_image(self, images: ImageService) -> None:
        """Take `execd_image`'s binary (pulled now) into the state directory, for every sandbox."""
        assert self.execd_image and self.root_dir is not None
        path, source = images.execd_binary(self.execd_image, self.root_dir / "execd")
        self.execd_binary = ExecdBinary(str(path), self._jupyter, source=f"image {source}")
        images.binary = self.execd_binary
        logger.info("local server: execd binary of %s", source)

    def _release_root(self) -> None:
        """Undo `start`'s claim of the state directory (a start that failed after it)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        if self._root_dir is None and self.root_dir is not None:
            recovery.unmount_below(self.root_dir)
            shutil.rmtree(self.root_dir, ignore_errors=True)

    def _reap(self) -> None:
        while not self._stopped.wait(REAP_INTERVAL):
            assert self._registry is not None
            try:
                self._registry.reap()
            except Exception:
                logger.exception("local server: reaping expired sandboxes failed")

    def stop(self) -> None:
        """Stop serving, kill every sandbox process and remove the sandboxes. Idempotent."""
        with self._state_lock:
            if not self._started or self._stopped.is_set():
                self._stopped.set()
                return
            self._stopped.set()
        atexit.unregister(self.stop)
        assert self._httpd is not None and self._registry is not None
        if self._catches_sigterm:
            _release_sigterm()
        self._httpd.shutdown()
        self._httpd.server_close()
        for thread in self._threads:
            thread.join()
        self._registry.close_all()
        logs.READER.release()
        if self._watching:
            firewall.WATCH.release()
        self._httpd.close_connections()
        if self._root_dir is None and self.root_dir is not None:
            recovery.unmount_below(self.root_dir)
            shutil.rmtree(self.root_dir, ignore_errors=True)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def serve_forever(self) -> None:
        """Serve in the foreground until Ctrl-C, SIGTERM or `stop()`, then shut down cleanly."""
        self.start()
        try:
            while not self._stopped.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def routes(self, registry: Registry) -> list[tuple[str, str, Route]]:
        """(method, path pattern, route) of every route, in the released server's spec order.

        Each is served under `/v1` too. Lifecycle routes need the API key (when one is set);
        `/health`, the SDK's telemetry and the proxy (which checks the sandbox's token) do not.
        """
        keyed = self._keyed
        proxy_root = "/sandboxes/{id}/proxy/{port}"
        diagnostics = "/sandboxes/{id}/diagnostics"
        policy = "/sandboxes/{id}/networkpolicy"
        no_templates = keyed(templates_not_supported)
        sandboxes, snapshots, pools = registry.sandboxes, registry.snapshots, registry.pools
        return [
            ("POST", "/sandboxes", keyed(registry.create)),
            ("GET", "/sandboxes", keyed(sandboxes.list)),
            ("GET", "/sandboxes/{id}", keyed(sandboxes.show)),
            ("DELETE", "/sandboxes/{id}", keyed(sandboxes.delete)),
            ("PATCH", "/sandboxes/{id}/metadata", keyed(sandboxes.patch_metadata)),
            ("POST", "/sandboxes/{id}/pause", keyed(sandboxes.pause)),
            ("POST", "/sandboxes/{id}/resume", keyed(sandboxes.resume)),
            ("POST", "/sandboxes/{id}/renew-expiration", keyed(sandboxes.renew)),
            ("POST", "/sandboxes/{id}/snapshots", keyed(snapshots.create)),
            ("GET", "/snapshots", keyed(snapshots.list)),
            ("GET", "/snapshots/{id}", keyed(snapshots.show)),
            ("DELETE", "/snapshots/{id}", keyed(snapshots.delete)),
            ("GET", "/sandboxes/{id}/endpoints/{port}", keyed(sandboxes.endpoint)),
            ("GET", diagnostics + "/logs", keyed(registry.diagnostics.logs)),
            ("GET", diagnostics + "/inspect", keyed(registry.diagnostics.inspect)),
            ("GET", diagnostics + "/events", keyed(registry.diagnostics.events)),
            ("GET", diagnostics + "/summary", keyed(registry.diagnostics.summary)),
            ("GET", "/sandboxes/{id}/stats", keyed(sandboxes.stats)),  # ours
            ("POST", "/pools", keyed(pools.create)),
            ("GET", "/pools", keyed(pools.list)),
            ("GET", "/pools/{name}", keyed(pools.show)),
            ("PUT", "/pools/{name}", keyed(pools.update)),
            ("DELETE", "/pools/{name}", keyed(pools.delete)),
            ("POST", "/templates", no_templates),
            ("GET", "/templates", no_templates),
            ("GET", "/templates/{id}", no_templates),
            ("DELETE", "/templates/{id}", no_templates),
            *[(method, proxy_root, self._proxy) for method in PROXY_METHODS],
            *[(method, proxy_root + "/{rest:path}", self._proxy) for method in PROXY_METHODS],
            ("GET", policy, keyed(registry.network.get)),
            ("PUT", policy, keyed(registry.network.put)),
            ("PATCH", policy, keyed(registry.network.patch)),
            ("DELETE", policy, keyed(registry.network.delete)),
            ("POST", "/metrics/events", report_metrics_event),
            ("GET", "/health", health),
            ("GET", "/version", version),
        ]

    def route(self, ex: Exchange) -> None:
        """Answer one request (called by the handler threads)."""
        assert self._router is not None
        path = ex.path[3:] if ex.path == "/v1" or ex.path.startswith("/v1/") else ex.path
        matched = self._router.match(ex.method, path)
        if isinstance(matched, int):
            self._authenticate(ex)  # a caller without the key learns nothing of the paths
            raise HttpError(
                matched, {"detail": "Not Found" if matched == 404 else "Method Not Allowed"}
            )
        route, ex.params = matched
        try:
            route(ex)
        except LocalError as exc:
            raise answer(exc) from None

    def _keyed(self, route: Route) -> Route:
        """`route`, behind the API key."""

        def keyed(ex: Exchange) -> None:
            self._authenticate(ex)
            route(ex)

        return keyed

    def _authenticate(self, ex: Exchange) -> None:
        if self.api_key is None:
            if self._own_peers:
                self._check_peer(ex)
            return
        given = ex.headers.get("OPEN-SANDBOX-API-KEY")
        if not given:
            raise error(401, "MISSING_API_KEY", MISSING_KEY)
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise error(401, "INVALID_API_KEY", INVALID_KEY)

    def _check_peer(self, ex: Exchange) -> None:
        """403 unless the connection is this server's user's or root's (`_own_peers`)."""
        handler: Any = ex.handler
        uid = getattr(handler, "osb_peer_uid", -1)  # looked up once per connection
        if uid == -1:
            peer, here = handler.client_address, handler.connection.getsockname()
            uid = handler.osb_peer_uid = identity.peer_uid((peer[0], peer[1]), here[:2])
        if uid not in (os.geteuid(), 0):
            whose = "of an unknown user" if uid is None else f"uid {uid}'s"
            raise error(
                403,
                "FORBIDDEN",
                f"this server has no API key and runs as uid {os.geteuid()}: it answers only"
                f" that user and root, and this connection is {whose} (/proc/net/tcp); to let"
                " others in, start it with an API key (api_key=, or OPEN_SANDBOX_API_KEY /"
                " --api-key-file) and give them the key",
            )

    def _proxy(self, ex: Exchange) -> None:
        port = proxy.port_number(ex.params["port"])
        sandbox_id = ex.params["id"]
        rest = "/" + ex.params.get("rest", "")
        assert self._registry is not None
        sandbox = self._registry.sandboxes.find(sandbox_id)
        if sandbox is None:
            raise not_found(sandbox_id)
        if port == EGRESS_PORT:
            # the egress sidecar's API, answered here on the host: nothing in the sandbox
            # listens on this port, and its token never enters the sandbox
            token = ex.headers.get(EGRESS_HEADER) or ""
            if not hmac.compare_digest(token.encode(), sandbox.egress_token.encode()):
                raise HttpError(401, BAD_EGRESS_TOKEN)
            self._registry.network.egress(ex, sandbox, rest)
            return
        token = ex.headers.get("X-EXECD-ACCESS-TOKEN") or ""
        if not hmac.compare_digest(token.encode(), sandbox.token.encode()):
            raise HttpError(401, BAD_TOKEN)
        if sandbox.state != "Running":
            # What the real proxy answers while the container is starting or frozen.
            detail = f"sandbox is {sandbox.state}"
            raise proxy.unreachable(
                sandbox_id, f"{detail}: {sandbox.failure}" if sandbox.failure else detail
            )
        # execd checks the token too: the proxy passes it on to execd's port, and only there.
        extra = {"X-EXECD-ACCESS-TOKEN": sandbox.token} if port == EXECD_PORT else {}
        proxy.forward(ex, sandbox.container, sandbox_id, port, rest, extra)


def _with_args(doc: str) -> str:
    """`doc` with its Args placeholder written out, at the placeholder's own indentation
    (Python 3.13 strips a docstring's common indentation when it compiles it; 3.12 keeps it)."""
    for line in doc.splitlines():
        if options.ARGS_PLACEHOLDER in line:
            indent = line[: len(line) - len(line.lstrip())]
            return doc.replace(options.ARGS_PLACEHOLDER, options.args_section(indent))
    return doc


LocalServer.__doc__ = _with_args(LocalServer.__doc__ or "")


def answer(exc: LocalError) -> HttpError:
    """The released server's answer to what a mechanic refused (`errors.py`): the one place
    where the local server's own errors become HTTP."""
    if isinstance(exc, (LimitError, PolicyError)):
        return bad_parameter(str(exc))
    if isinstance(exc, FieldError):
        return unprocessable([issue(exc.kind, exc.loc, exc.msg, exc.value)])
    if isinstance(exc, VolumeError):
        status = 500 if exc.code == "CREATE_FAILED" else 400  # the server's disk, not the input
        return error(status, f"VOLUME::{exc.code}", exc.message)
    if isinstance(exc, ImageError):
        status = 413 if exc.reason == TOO_LARGE else 500  # only another image or limit helps
        message = f"{exc.reason}: Failed to pull image {exc.uri}: {exc.message}"
        return error(status, "DOCKER::SANDBOX_IMAGE_PULL_FAILED", message)
    unavailable = {
        CapacityError: "SANDBOX::CAPACITY_EXCEEDED",
        InternetError: "SANDBOX::INTERNET_UNAVAILABLE",
        IsolationError: "SANDBOX::ISOLATION_UNAVAILABLE",
        UnenforcedLimitError: "SANDBOX::LIMITS_UNENFORCEABLE",
    }
    return error(503, unavailable[type(exc)], str(exc))


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


def health(ex: Exchange) -> None:
    """GET /health."""
    ex.send_json(200, {"status": "healthy"})


def version(ex: Exchange) -> None:
    """GET /version: this server's package version (the released server's answer)."""
    try:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as package_version

        found = package_version("osb-sync")
    except PackageNotFoundError:
        found = "unknown"
    ex.send_json(200, {"version": found, "server": "osb-sync local server"})


def report_metrics_event(ex: Exchange) -> None:
    """POST /metrics/events: the SDK's telemetry, accepted and dropped."""
    ex.read_body(METRICS_BODY_LIMIT)
    ex.send_json(200, {})


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


_sigterm_lock = threading.Lock()
_sigterm_users = 0


def _catch_sigterm() -> bool:
    """Make SIGTERM raise KeyboardInterrupt while a server runs; True if this one counts."""
    global _sigterm_users
    if threading.current_thread() is not threading.main_thread():
        return False
    with _sigterm_lock:
        if _sigterm_users == 0:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
                return False  # the program handles SIGTERM itself
            signal.signal(signal.SIGTERM, _raise_interrupt)
        _sigterm_users += 1
    return True


def _release_sigterm() -> None:
    """Undo `_catch_sigterm` when the last server that caught SIGTERM stops."""
    global _sigterm_users
    with _sigterm_lock:
        _sigterm_users -= 1
        if _sigterm_users == 0 and signal.getsignal(signal.SIGTERM) is _raise_interrupt:
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            except ValueError:
                pass  # stopped from another thread: the handler stays, harmlessly
