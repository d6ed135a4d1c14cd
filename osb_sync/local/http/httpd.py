"""The local server's HTTP connections: one thread each, with timeouts, a cap and a Host check.

A connection must send its request line and headers within `header_timeout` of its first byte
(and its first byte within `header_timeout` of connecting), may stay idle between requests for
`idle_timeout`, and may stall a body read or an answer write for `io_timeout`. At
`max_connections` (at most half the open-file limit) a new connection closes the one that has
waited longest for a request, or gets a 503 when every connection is busy: a flood of slow
clients exhausts neither threads nor descriptors, and cannot keep a prompt client out.
Requests must name the server in `Host` (DNS rebinding).
"""

from __future__ import annotations

import logging
import os
import re
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .exchange import Exchange, HttpError, error

logger = logging.getLogger("osb_sync.local")

UNREAD_BODY_LIMIT = 64 * 1024
WATCH_INTERVAL = 0.25
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
REQUEST_ID = re.compile(r"[\w.:-]{1,128}")
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: 72\r\n\r\n"
    b'{"code":"SERVER_BUSY","message":"too many connections, try again later"}'
)


@dataclass(frozen=True)
class Limits:
    """Connection limits (seconds and a count); see the module docstring."""

    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    io_timeout: float = 60.0
    max_connections: int = 512


def host_names(bound: str, extra: Iterable[str]) -> frozenset[str]:
    """The names a `Host` header may use: loopback, the bound address and `extra`."""
    bound_name = f"[{bound}]" if ":" in bound and not bound.startswith("[") else bound
    return frozenset(name.lower() for name in (*LOOPBACK_NAMES, bound_name, *extra))


def host_name(header: str) -> str:
    """The host part of a `Host` header value, lower-cased (`[::1]:80` -> `[::1]`)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header.partition("]")[0] + "]"
    name, _, port = header.partition(":")
    return name if port.isdigit() or not port else header


class HTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that counts its connections and enforces header deadlines."""

    daemon_threads = True
    request_queue_size = 128  # the default 5 makes connection bursts wait for SYN retries

    def __init__(
        self,
        address: tuple[str, int],
        route: Callable[[Exchange], None],
        limits: Limits,
        hosts: frozenset[str],
    ) -> None:
        self.route = route
        self.limits = limits
        self.hosts = hosts
        soft_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        # Each connection holds a descriptor; keep half of them for sandboxes and files.
        self.max_connections = limits.max_connections
        if soft_files != resource.RLIM_INFINITY:
            self.max_connections = max(1, min(limits.max_connections, soft_files // 2))
        self.connections: set[socket.socket] = set()
        self._deadlines: dict[socket.socket, float] = {}
        self._waiting: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection in a thread; at the cap, make room or answer 503 at once.

        Room is made by closing the connection that has waited longest for a request (slow
        or idle clients), so a flood of them cannot keep a prompt client out.
        """
        with self._lock:
            evicted = None
            if len(self.connections) >= self.max_connections and self._waiting:
                evicted = min(self._waiting, key=self._waiting.__getitem__)
                del self._waiting[evicted]
            full = len(self.connections) >= self.max_connections and evicted is None
            if not full:
                self.connections.add(request)
                self._waiting[request] = time.monotonic()
        if evicted is not None:
            close_quietly(evicted)
        if full:
            try:
                request.setblocking(False)
                request.send(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        """Forget the connection, then close it."""
        with self._lock:
            self.connections.discard(request)
            self._deadlines.pop(request, None)
            self._waiting.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client resetting an idle keep-alive connection is routine, not an error."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def waiting(self, conn: socket.socket) -> None:
        """`conn` waits for a request: it may be closed to make room (see process_request)."""
        with self._lock:
            self._waiting[conn] = time.monotonic()

    def watch(self, conn: socket.socket, seconds: float) -> None:
        """Cut `conn` if `unwatch` is not called within `seconds`."""
        with self._lock:
            self._deadlines[conn] = time.monotonic() + seconds

    def unwatch(self, conn: socket.socket) -> None:
        """A request arrived on `conn`: cancel `watch`, and `waiting` until the next one."""
        with self._lock:
            self._deadlines.pop(conn, None)
            self._waiting.pop(conn, None)

    def watch_deadlines(self, stopped: threading.Event) -> None:
        """Shut down connections whose headers did not arrive in time, until `stopped`."""
        while not stopped.wait(WATCH_INTERVAL):
            now = time.monotonic()
            with self._lock:
                late = [conn for conn, deadline in self._deadlines.items() if deadline <= now]
                for conn in late:
                    del self._deadlines[conn]
            for conn in late:
                close_quietly(conn)

    def close_connections(self) -> None:
        """Shut down every open connection (server stop)."""
        with self._lock:
            connections = list(self.connections)
        for conn in connections:
            close_quietly(conn)


def close_quietly(conn: socket.socket) -> None:
    """Shut a socket down both ways, ignoring one that is already gone."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class Handler(BaseHTTPRequestHandler):
    """One connection: waits for requests under the limits and dispatches them."""

    protocol_version = "HTTP/1.1"
    server: HTTPServer
    _requests_served = 0

    def setup(self) -> None:
        """Disable Nagle: events are small writes that would wait for the peer's delayed ACK."""
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle_one_request(self) -> None:
        """Wait (bounded) for the next request, then read its head under a deadline."""
        limits = self.server.limits
        first = self._requests_served == 0
        if not first:
            self.server.waiting(self.connection)
        self.connection.settimeout(limits.header_timeout if first else limits.idle_timeout)
        try:
            waiting = self.rfile.peek(1)  # type: ignore[attr-defined]
        except OSError:
            waiting = b""
        if not waiting:
            self.close_connection = True
            return
        self._requests_served += 1
        self.connection.settimeout(limits.io_timeout)
        self.server.watch(self.connection, limits.header_timeout)
        try:
            super().handle_one_request()
        finally:
            self.server.unwatch(self.connection)

    def finish(self) -> None:
        """Flush what is left; a peer that went away is not an error."""
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        """Log at debug level through `osb_sync.local`."""
        logger.debug("%s " + format, self.address_string(), *args)

    def _request_id(self) -> str:
        given = self.headers.get("X-Request-ID") or ""
        return given if REQUEST_ID.fullmatch(given) else os.urandom(16).hex()

    def _check_host(self) -> None:
        hosts = self.headers.get_all("Host") or []
        if len(hosts) != 1 or not hosts[0].strip():
            raise error(400, "INVALID_HOST", "a request needs exactly one Host header")
        if host_name(hosts[0]) not in self.server.hosts:
            raise error(
                421,
                "MISDIRECTED_REQUEST",
                f"Host {hosts[0][:100]!r} is not a name of this server (start it with "
                "--allowed-host NAME to serve it under another name)",
            )

    def _dispatch(self) -> None:
        self.server.unwatch(self.connection)
        ex = Exchange(self, self._request_id())
        try:
            try:
                ex.check_framing()
            except HttpError:
                self.close_connection = True  # where this request ends is unknown
                raise
            self._check_host()
            self.server.route(ex)
        except HttpError as exc:
            self._fail(ex, exc.status, exc.body, exc.headers)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True  # the client went away or stalled
        except OSError as exc:  # what the OS refused (a file operation), as execd reports it
            where = f" ({exc.filename})" if exc.filename else ""
            message = f"{exc.strerror or 'operating system error'}{where}"
            self._fail(ex, 500, {"code": "RUNTIME_ERROR", "message": message}, {})
        except Exception:
            logger.exception("local server: %s %s failed", ex.method, ex.path)
            # execd's code for a failure; the details go to the log, not to the client.
            code = "RUNTIME_ERROR" if "/proxy/" in ex.path else "GENERAL::UNKNOWN_ERROR"
            message = "internal error (see the server log)"
            self._fail(ex, 500, {"code": code, "message": message}, {})
        self._discard_unread_body(ex)

    def _fail(self, ex: Exchange, status: int, body: Any, headers: dict[str, str]) -> None:
        if ex.responded:
            self.close_connection = True
            return
        if not ex.body.finished and (ex.declared_length or 0) > UNREAD_BODY_LIMIT:
            self.close_connection = True  # too much to read away: the answer comes first
        try:
            ex.send_json(status, body, headers)
        except OSError:
            self.close_connection = True

    def _discard_unread_body(self, ex: Exchange) -> None:
        """Read a small unread body away, so the kept-alive connection stays usable."""
        if not ex.body.finished and not self.close_connection:
            try:
                ex.body.read(UNREAD_BODY_LIMIT)
            except (OSError, HttpError):
                pass  # a broken body: the connection is closed below
            if not ex.body.finished:
                self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _dispatch
