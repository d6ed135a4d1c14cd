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
import socket
import sys
import tempfile
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from . import proxy
from ._http import Exchange, HttpError, error
from .lifecycle import EXECD_PORT, Config, Lifecycle, not_found
from .runner import NetnsMode, PortSink, probe_netns

logger = logging.getLogger("osb_sync.local")

PROXY_PATH = re.compile(r"^(?:/v1)?/sandboxes/(?P<id>[^/]+)/proxy/(?P<port>\d+)(?P<rest>/.*)?$")
REAP_INTERVAL = 0.2
UNREAD_BODY_LIMIT = 1024 * 1024
POLICY_CHOICES = ("refuse", "accept")
MISSING_KEY = (
    "Authentication credentials are missing. Provide API key via OPEN-SANDBOX-API-KEY header."
)
INVALID_KEY = "Authentication credentials are invalid. Check your API key and try again."
BAD_TOKEN = {"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default 5 makes connection bursts wait for SYN retries

    def __init__(self, address: tuple[str, int], app: LocalServer) -> None:
        self.app = app
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client resetting an idle keep-alive connection is routine, not an error."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        # Events are small writes: without this, each waits for the peer's delayed ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)

    def _dispatch(self) -> None:
        ex = Exchange(self, self.headers.get("X-Request-ID") or uuid.uuid4().hex)
        try:
            self.server.app.route(ex)
        except HttpError as exc:
            if ex.responded:
                self.close_connection = True
            else:
                ex.send_json(exc.status, exc.body, exc.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away
        except Exception as exc:
            logger.exception("local server: %s %s failed", ex.method, ex.path)
            if ex.responded:
                self.close_connection = True
            else:
                # execd answers RUNTIME_ERROR (e.g. a file operation the OS refused).
                code = "RUNTIME_ERROR" if PROXY_PATH.match(ex.path) else "GENERAL::UNKNOWN_ERROR"
                ex.send_json(500, {"code": code, "message": f"{type(exc).__name__}: {exc}"})
        if not ex.body.finished:
            # The rest of an unread body would be taken for the next request: read it away
            # (a small one), so the client's kept-alive connection stays usable.
            try:
                ex.body.read(UNREAD_BODY_LIMIT)
            except (OSError, HttpError):
                pass  # a broken body: the connection is closed below
            if not ex.body.finished:
                self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _dispatch


class LocalServer:
    """A local OpenSandbox-compatible server: lifecycle API plus execd, on one port.

    Args:
        host: address to bind; keep the loopback default (this is not a security boundary).
        port: port to bind, 0 for a free one.
        api_key: when set, lifecycle calls need it in `OPEN-SANDBOX-API-KEY`.
        min_timeout: smallest accepted sandbox `timeout` in seconds (the real server: 60).
        pending_seconds: how long a new sandbox reports `Pending` before `Running`.
        ping_interval: seconds between execd heartbeat events.
        unenforced_network_policy: "refuse" (400, like a server without egress support) or
            "accept" (create anyway; the status message says the policy is not enforced).
        root_dir: where sandbox directories go; default a fresh temporary directory, removed
            on stop.
        command_grace: seconds /command keeps its stream open after the terminal event.
        netns: None to probe for network namespaces, True/False to force the answer.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        api_key: str | None = None,
        min_timeout: int = 60,
        pending_seconds: float = 0.0,
        ping_interval: float = 3.0,
        unenforced_network_policy: str = "refuse",
        root_dir: str | Path | None = None,
        command_grace: float = 1.0,
        netns: bool | None = None,
    ) -> None:
        if unenforced_network_policy not in POLICY_CHOICES:
            raise ValueError(f"unenforced_network_policy must be one of {POLICY_CHOICES}")
        self.host = host
        self.port = port
        self.api_key = api_key
        self.min_timeout = min_timeout
        self.pending_seconds = pending_seconds
        self.ping_interval = ping_interval
        self.unenforced_network_policy = unenforced_network_policy
        self.command_grace = command_grace
        self.network_policy_enforced = False
        self._netns_choice = netns
        self._root_dir = Path(root_dir) if root_dir is not None else None
        self.root_dir: Path | None = None
        self._state_lock = threading.Lock()
        self._started = False
        self._stopped = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._lifecycle: Lifecycle | None = None
        self._sink: PortSink | None = None
        self._threads: list[threading.Thread] = []

    @property
    def base_url(self) -> str:
        """`http://host:port`, without `/v1`."""
        return f"http://{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        """`http://host:port/v1`, the lifecycle API base URL."""
        return f"{self.base_url}/v1"

    def _netns_mode(self) -> NetnsMode | None:
        if self._netns_choice is None:
            return probe_netns()
        return NetnsMode(user_namespace=os.geteuid() != 0) if self._netns_choice else None

    def start(self) -> LocalServer:
        """Bind and serve in background threads; returns self. Idempotent."""
        with self._state_lock:
            if self._started:
                return self
            netns = self._netns_mode()
            self.network_policy_enforced = netns is not None
            if self._root_dir is None:
                self.root_dir = Path(tempfile.mkdtemp(prefix="osb-local-"))
            else:
                self.root_dir = self._root_dir
                self.root_dir.mkdir(parents=True, exist_ok=True)
            self._sink = PortSink()
            self._httpd = _HTTPServer((self.host, self.port), self)
            self.port = self._httpd.server_address[1]
            self._lifecycle = Lifecycle(
                Config(
                    root=self.root_dir,
                    min_timeout=self.min_timeout,
                    pending_seconds=self.pending_seconds,
                    ping_interval=self.ping_interval,
                    command_grace=self.command_grace,
                    unenforced_network_policy=self.unenforced_network_policy,
                    netns=netns,
                    jupyter_port=self._sink.port,
                    address=f"{self.host}:{self.port}",
                )
            )
            self._threads = [
                threading.Thread(
                    target=self._httpd.serve_forever,
                    kwargs={"poll_interval": 0.1},
                    name="osb-local-http",
                    daemon=True,
                ),
                threading.Thread(target=self._reap, name="osb-local-reaper", daemon=True),
            ]
            for thread in self._threads:
                thread.start()
            self._started = True
            atexit.register(self.stop)
        logger.info("local OpenSandbox server on %s", self.api_base)
        return self

    def _reap(self) -> None:
        while not self._stopped.wait(REAP_INTERVAL):
            assert self._lifecycle is not None
            try:
                self._lifecycle.reap_expired()
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
        assert self._httpd is not None and self._lifecycle is not None and self._sink is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        for thread in self._threads:
            thread.join()
        self._lifecycle.close_all()
        self._sink.close()
        with self._httpd.connections_lock:
            connections = list(self._httpd.connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._root_dir is None and self.root_dir is not None:
            shutil.rmtree(self.root_dir, ignore_errors=True)

    def serve_forever(self) -> None:
        """Serve in the foreground until Ctrl-C, SIGTERM or `stop()`, then shut down cleanly."""
        self.start()
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            while not self._stopped.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
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
        assert self._lifecycle is not None
        found = PROXY_PATH.match(ex.path)
        if found:
            self._proxy(ex, found["id"], int(found["port"]), found["rest"] or "/")
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
        matched = self._lifecycle.router.match(ex.method, path)
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
        assert self._lifecycle is not None
        sandbox = self._lifecycle.find(sandbox_id)
        if sandbox is None:
            raise not_found(sandbox_id)
        token = ex.headers.get("X-EXECD-ACCESS-TOKEN") or ""
        if not hmac.compare_digest(token.encode(), sandbox.token.encode()):
            raise HttpError(401, BAD_TOKEN)
        if sandbox.state != "Running":
            # What the real proxy answers while the container is starting or frozen.
            raise proxy.unreachable(sandbox_id, f"sandbox is {sandbox.state}")
        if port == EXECD_PORT:
            sandbox.execd.handle(ex, rest)
        else:
            proxy.forward(ex, sandbox.runtime, sandbox_id, port, rest)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
