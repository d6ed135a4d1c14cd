"""LocalServer: the HTTP server, top-level routing, authentication and the expiry reaper.

One port serves the lifecycle API (under `/v1` and `/`), `/health`, and every sandbox's execd
and ports through the server-proxy route `/sandboxes/{id}/proxy/{port}/...` (also under `/v1`).
"""

from __future__ import annotations

import atexit
import hmac
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from types import FrameType, TracebackType

from ..http.exchange import Exchange, HttpError, error
from ..http.httpd import HTTPServer, Limits, host_names
from . import limits as resource_limits
from . import proxy
from .bwrap import FIX, Support, compile_package, probe, refusal
from .execd_binary import ExecdBinary
from .registry import EXECD_PORT, Config, Registry, not_found

logger = logging.getLogger("osb_sync.local")

PROXY_PATH = re.compile(r"^(?:/v1)?/sandboxes/(?P<id>[^/]+)/proxy/(?P<port>[^/]+)(?P<rest>/.*)?$")
REAP_INTERVAL = 0.2
MAX_SANDBOX_TIMEOUT = 86400  # the real server's example `max_sandbox_timeout_seconds`
POLICY_CHOICES = ("refuse", "accept")
MISSING_KEY = (
    "Authentication credentials are missing. Provide API key via OPEN-SANDBOX-API-KEY header."
)
INVALID_KEY = "Authentication credentials are invalid. Check your API key and try again."
BAD_TOKEN = {"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}


class LocalServer:
    """A local OpenSandbox-compatible server: lifecycle API plus execd, on one port.

    While it runs in the main thread of a process whose SIGTERM does the default (kill), a
    SIGTERM raises KeyboardInterrupt instead, like Ctrl-C, so the process unwinds and stops
    the server: its sandboxes, their processes and its temporary directory go away.

    Args:
        host: address to bind; keep the loopback default (anyone who reaches the port can
            run code in sandboxes).
        port: port to bind, 0 for a free one.
        api_key: when set, lifecycle calls need it in `OPEN-SANDBOX-API-KEY`.
        min_timeout: smallest accepted sandbox `timeout` in seconds (the real server: 60).
        max_timeout: largest accepted sandbox `timeout`, and renewal ahead, in seconds.
        pending_seconds: how long a new sandbox reports `Pending` before `Running`.
        ping_interval: seconds between execd heartbeat events.
        unenforced_network_policy: "refuse" (400, like a server without egress support) or
            "accept" (create anyway; the status message says the policy is not enforced).
        root_dir: where sandbox directories go; default a fresh temporary directory, removed
            on stop.
        command_grace: seconds /command keeps its stream open after the terminal event.
        isolation: None (fail closed) to isolate sandboxes, and where this host cannot (no
            bubblewrap, no user namespaces) to start anyway but answer every create 503 with
            what to install or allow; True to refuse to start there; False to run sandboxes
            NOT isolated (every create's status message says so).
        allowed_hosts: more names requests may give in `Host` (besides loopback and `host`).
        limits: connection timeouts and cap (see `httpd.Limits`).
        allowed_host_paths: host directories whose trees `host` volumes may mount (none by
            default: every `host` volume answers 400).
        volume_root: where `pvc` volumes live, one directory per claimName (default:
            `volumes/` in the root directory).
        execd: an execd binary (OpenSandbox's) to run in every sandbox instead of ours; needs
            isolated sandboxes (see `execd_binary.py`).
        jupyter: with `execd`, the `jupyter` executable of a venv (notebook, ipykernel and a
            kernelspec named `python`) whose Jupyter server each sandbox's execd runs code in.
        spare_containers: containers kept started ahead for creates to claim (see
            `spares.py`; 0 turns them off); each costs the memory of an idle sandbox.

    Raises:
        ValueError: a bad option, or `execd`/`jupyter` is not an executable (of a venv).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        api_key: str | None = None,
        min_timeout: int = 60,
        max_timeout: int = MAX_SANDBOX_TIMEOUT,
        pending_seconds: float = 0.0,
        ping_interval: float = 3.0,
        unenforced_network_policy: str = "refuse",
        root_dir: str | Path | None = None,
        command_grace: float = 1.0,
        isolation: bool | None = None,
        allowed_hosts: Iterable[str] = (),
        limits: Limits | None = None,
        allowed_host_paths: Iterable[str | Path] = (),
        volume_root: str | Path | None = None,
        execd: str | os.PathLike[str] | None = None,
        jupyter: str | os.PathLike[str] | None = None,
        spare_containers: int = 1,
    ) -> None:
        if unenforced_network_policy not in POLICY_CHOICES:
            raise ValueError(f"unenforced_network_policy must be one of {POLICY_CHOICES}")
        if jupyter is not None and execd is None:
            raise ValueError("jupyter is for an execd binary: pass execd too")
        self.execd_binary = ExecdBinary.checked(execd, jupyter) if execd is not None else None
        self.host = host
        self.port = port
        self.api_key = api_key
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
        if spare_containers < 0:
            raise ValueError("spare_containers must be 0 or more")
        self.spare_containers = spare_containers
        self.network_policy_enforced = False
        self.isolated = False
        self.isolation_problem = ""
        self.refusal = ""  # why every create answers 503 (isolation impossible, not turned off)
        self._isolation = isolation
        self._root_dir = Path(root_dir) if root_dir is not None else None
        self.root_dir: Path | None = None
        self._state_lock = threading.Lock()
        self._started = False
        self._stopped = threading.Event()
        self._httpd: HTTPServer | None = None
        self._registry: Registry | None = None
        self._threads: list[threading.Thread] = []
        self._catches_sigterm = False

    @property
    def base_url(self) -> str:
        """``http://host:port``, without ``/v1``."""
        return f"http://{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        """``http://host:port/v1``, the lifecycle API base URL."""
        return f"{self.base_url}/v1"

    def _support(self) -> Support:
        if self._isolation is False:
            support = Support(None, "turned off by isolation=False", None, False)
        else:
            support = probe()
        if self.execd_binary is not None and support.bwrap is None:
            raise RuntimeError(
                "an execd binary needs isolated sandboxes (it listens on every interface of"
                f" its fixed port) but they cannot be isolated here ({support.problem}); to"
                f" fix it, {FIX}"
            )
        if self._isolation and support.bwrap is None:
            raise RuntimeError(
                f"sandboxes cannot be isolated here ({support.problem}); to fix it, {FIX}"
            )
        return support

    def start(self) -> LocalServer:
        """Bind and serve in background threads; returns self. Idempotent.

        Raises:
            OSError: the address cannot be bound (nothing is left behind).
            RuntimeError: `isolation=True`, or `execd`, where sandboxes cannot be isolated.
            (With the default `isolation=None` it starts, and `refusal` says why every create
            answers 503.)
        """
        with self._state_lock:
            if self._started:
                return self
            support = self._support()
            if support.bwrap is not None:
                compile_package()
            self.isolated = self.network_policy_enforced = support.bwrap is not None
            self.isolation_problem = support.problem
            if not self.isolated and self._isolation is None:
                self.refusal = refusal(support.problem)
            hosts = host_names(self.host, self.allowed_hosts)
            self._httpd = HTTPServer((self.host, self.port), self.route, self.limits, hosts)
            self.port = self._httpd.server_address[1]
            self.root_dir = self._make_root()
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
                    address=f"{self.host}:{self.port}",
                    limit_controllers=resource_limits.writable_controllers()
                    if self.isolated
                    else frozenset(),
                    volume_places=(
                        self.allowed_host_paths,
                        self.volume_root or self.root_dir / "volumes",
                    ),
                    binary=self.execd_binary,
                    spare_containers=self.spare_containers,
                    refusal=self.refusal,
                )
            )
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
        if self.isolated:
            logger.info("local OpenSandbox server on %s (sandboxes isolated)", self.api_base)
        elif self.refusal:
            logger.error(
                "local OpenSandbox server on %s refuses to create sandboxes (503): %s",
                self.api_base,
                self.refusal,
            )
        else:
            logger.warning(
                "local OpenSandbox server on %s: sandboxes are NOT isolated (%s); to fix it, %s",
                self.api_base,
                self.isolation_problem,
                FIX,
            )
        return self

    def _make_root(self) -> Path:
        if self._root_dir is None:
            return Path(tempfile.mkdtemp(prefix="osb-local-"))
        self._root_dir.mkdir(parents=True, exist_ok=True)
        return self._root_dir

    def _reap(self) -> None:
        while not self._stopped.wait(REAP_INTERVAL):
            assert self._registry is not None
            try:
                self._registry.reap_expired()
                self._registry.spares.replace_dead()
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
        self._httpd.close_connections()
        if self._root_dir is None and self.root_dir is not None:
            shutil.rmtree(self.root_dir, ignore_errors=True)

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

    def route(self, ex: Exchange) -> None:
        """Answer one request (called by the handler threads)."""
        assert self._registry is not None
        found = PROXY_PATH.match(ex.path)
        if found:
            self._proxy(ex, found["id"], proxy.port_number(found["port"]), found["rest"] or "/")
            return
        path = ex.path[3:] if ex.path == "/v1" or ex.path.startswith("/v1/") else ex.path
        if path == "/health" and ex.method == "GET":
            ex.send_json(200, {"status": "healthy"})
            return
        if path == "/metrics/events" and ex.method == "POST":
            ex.read_body()  # SDK telemetry: accepted and dropped
            ex.send_json(200, {})
            return
        self._authenticate(ex)
        matched = self._registry.router.match(ex.method, path)
        if isinstance(matched, int):
            raise HttpError(
                matched, {"detail": "Not Found" if matched == 404 else "Method Not Allowed"}
            )
        route, ex.params = matched
        route(ex)

    def _authenticate(self, ex: Exchange) -> None:
        if self.api_key is None:
            return
        given = ex.headers.get("OPEN-SANDBOX-API-KEY")
        if not given:
            raise error(401, "MISSING_API_KEY", MISSING_KEY)
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise error(401, "INVALID_API_KEY", INVALID_KEY)

    def _proxy(self, ex: Exchange, sandbox_id: str, port: int, rest: str) -> None:
        assert self._registry is not None
        sandbox = self._registry.find(sandbox_id)
        if sandbox is None:
            raise not_found(sandbox_id)
        token = ex.headers.get("X-EXECD-ACCESS-TOKEN") or ""
        if not hmac.compare_digest(token.encode(), sandbox.token.encode()):
            raise HttpError(401, BAD_TOKEN)
        if sandbox.state != "Running":
            # What the real proxy answers while the container is starting or frozen.
            raise proxy.unreachable(sandbox_id, f"sandbox is {sandbox.state}")
        # execd checks the token too: the proxy passes it on to execd's port, and only there.
        extra = {"X-EXECD-ACCESS-TOKEN": sandbox.token} if port == EXECD_PORT else {}
        proxy.forward(ex, sandbox.container, sandbox_id, port, rest, extra)


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
