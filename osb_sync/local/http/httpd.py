"""The local server's HTTP connections: one thread each, with deadlines, a cap and a Host check.

As production servers bound hostile clients (Go's `ReadHeaderTimeout` and `MaxHeaderBytes`,
nginx's `client_header_timeout` and `client_body_timeout`), each connection is in one phase,
and a watcher thread enforces that phase's rule (`Limits` holds the numbers):

- `HEAD`: the whole request head must arrive within `header_timeout` (of connecting, or of
  the first byte of a later request) and fit in `max_head_bytes`; else 408 or 431, closed;
- `REQUEST`: answering; a body that, after the first `body_grace` seconds spent waiting for
  it, averaged under `min_body_rate` bytes/s is cut off with a 408 (only time the server
  spends waiting on the client counts, see `exchange.BodyMeter`); an answer write may stall
  `io_timeout`;
- `IDLE`: a kept-alive connection between requests closes after `idle_timeout`.

At `max_connections` (at most half the open-file limit) a new connection makes room by closing
first the slowest body (under `min_body_rate`), then the oldest connection still sending its
head, then the longest idle one; only when every connection is a prompt request being
answered does it get a 503. So a
flood of slow clients exhausts neither threads nor descriptors, and cannot keep a prompt
client out. Requests must name the server in `Host` (DNS rebinding): an RFC 3986 host (a
bracketed IPv6 literal, an IPv4 address or a name) and an optional port, nothing else.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import logging
import os
import re
import resource
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.client import HTTPMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .exchange import BodyMeter, Exchange, HttpError, check_field, error
from .head import Head, HeadError, is_complete, parse_head, read_head

logger = logging.getLogger("osb_sync.local")

UNREAD_BODY_LIMIT = 64 * 1024
WATCH_INTERVAL = 0.25
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
REQUEST_ID = re.compile(r"[\w.:-]{1,128}")
# RFC 3986 3.2.2/3.2.3: IP-literal, or IPv4address / reg-name (unreserved, pct-encoded,
# sub-delims); then an optional port. No userinfo, path or anything after the port.
HOST_HEADER = re.compile(
    r"(?:\[(?P<literal>[0-9A-Fa-f:.]+)\]|(?P<name>(?:[A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f]{2})+))"
    r"(?::(?P<port>[0-9]{0,5}))?"
)
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: 72\r\n\r\n"
    b'{"code":"SERVER_BUSY","message":"too many connections, try again later"}'
)


@dataclass(frozen=True)
class Limits:
    """Connection limits (seconds, bytes and a count); see the module docstring.

    Attributes:
        header_timeout: seconds for a whole request head to arrive.
        max_head_bytes: the largest request head (request line and headers), 431 past it.
        idle_timeout: seconds a kept-alive connection may wait for its next request.
        io_timeout: seconds one read or write may stall.
        body_grace: seconds of waiting for a body before its rate is judged.
        min_body_rate: bytes/s a body must average after `body_grace`, else 408.
        max_connections: open connections at most (see the module docstring).
    """

    header_timeout: float = 10.0
    max_head_bytes: int = 64 * 1024
    idle_timeout: float = 30.0
    io_timeout: float = 60.0
    body_grace: float = 10.0
    min_body_rate: float = 1024.0
    max_connections: int = 512

    def __post_init__(self) -> None:
        numbers = {name: getattr(self, name) for name in self.__dataclass_fields__}
        for name, value in numbers.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive number, not {value!r}")


class Phase(enum.Enum):
    """Where a connection is (see the module docstring)."""

    HEAD = "head"
    REQUEST = "request"
    IDLE = "idle"


@dataclass
class Connection:
    """What the watcher knows about one connection (guarded by the server's lock)."""

    phase: Phase
    since: float
    meter: BodyMeter | None = None
    cut: bool = field(default=False)


def host_names(bound: str, extra: Iterable[str]) -> frozenset[str]:
    """The hosts a `Host` header may name: loopback, the bound address and `extra`.

    Each is normalised as `host_name` does (lower case, IPv6 literals compressed), so
    `[0:0::1]` counts as `[::1]`.
    """
    bound_name = f"[{bound}]" if ":" in bound and not bound.startswith("[") else bound
    names = set()
    for name in (*LOOPBACK_NAMES, bound_name, *extra):
        parsed = host_name(name)
        names.add(parsed if parsed is not None else name.lower())
    return frozenset(names)


def host_name(header: str) -> str | None:
    """The host of a `Host` header value, normalised (`[0::1]:80` -> `[::1]`); None if invalid.

    The value must be an RFC 3986 host and optional port (`host[:port]`) and nothing else,
    so `[::1].evil.example` or `[::1]@evil.example` are invalid, not loopback.
    """
    found = HOST_HEADER.fullmatch(header.strip())
    if found is None:
        return None
    port = found["port"]
    if port and int(port) > 65535:
        return None
    if found["literal"] is not None:
        try:
            return f"[{ipaddress.IPv6Address(found['literal']).compressed}]"
        except ValueError:
            return None
    return found["name"].lower()


class HTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that tracks each connection's phase and enforces its limits."""

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
        self._connections: dict[socket.socket, Connection] = {}
        self._lock = threading.Lock()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def server_bind(self) -> None:
        """Bind; an IPv6 socket takes IPv4 too (`::` is every address of both families,
        whatever the host's `net.ipv6.bindv6only`). No name lookup of the address (which
        `http.server` does for `server_name`, nothing here reads)."""
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection in a thread; at the cap, make room or answer 503 at once."""
        now = time.monotonic()
        with self._lock:
            evicted = None
            if len(self._connections) >= self.max_connections:
                evicted = self._evictable(now)
                if evicted is not None:
                    del self._connections[evicted]
            full = len(self._connections) >= self.max_connections
            if not full:
                self._connections[request] = Connection(Phase.HEAD, now)
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

    def _evictable(self, now: float) -> socket.socket | None:
        """The connection to close for a new one: a slow body, a head, else an idle one.

        Idle comes last: a prompt client's pooled connection is idle between its requests,
        and closing it races with its next request.
        """
        best: tuple[int, float] | None = None
        chosen = None
        for conn, state in self._connections.items():
            if state.phase is Phase.IDLE:
                rank = (2, state.since)
            elif state.phase is Phase.HEAD:
                rank = (1, state.since)
            elif state.meter is not None:
                received, waited = state.meter.progress(now)
                if waited < 1.0 or received / waited >= self.limits.min_body_rate:
                    continue
                rank = (0, received / waited)
            else:
                continue
            if best is None or rank < best:
                best, chosen = rank, conn
        return chosen

    @property
    def open_connections(self) -> int:
        """How many connections are open."""
        with self._lock:
            return len(self._connections)

    def shutdown_request(self, request: Any) -> None:
        """Forget the connection, then close it."""
        with self._lock:
            self._connections.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client resetting an idle keep-alive connection is routine, not an error."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def enter(self, conn: socket.socket, phase: Phase, meter: BodyMeter | None = None) -> None:
        """`conn` is now in `phase` (its clock starts now); `meter` times its body."""
        with self._lock:
            state = self._connections.get(conn)
            if state is not None:
                state.phase, state.since, state.meter = phase, time.monotonic(), meter

    def was_cut(self, conn: socket.socket) -> bool:
        """Whether the watcher cut `conn`'s head or body short."""
        with self._lock:
            state = self._connections.get(conn)
            return state is not None and state.cut

    def watch_deadlines(self, stopped: threading.Event) -> None:
        """Enforce each connection's phase (see the module docstring), until `stopped`."""
        while not stopped.wait(WATCH_INTERVAL):
            closing, cutting = self._overdue(time.monotonic())
            for conn in closing:
                close_quietly(conn)
            for conn in cutting:
                # Reads end (EOF) but the answer can still be written: a 408, then close.
                try:
                    conn.shutdown(socket.SHUT_RD)
                except OSError:
                    pass

    def _overdue(self, now: float) -> tuple[list[socket.socket], list[socket.socket]]:
        limits = self.limits
        closing, cutting = [], []
        with self._lock:
            for conn, state in self._connections.items():
                if state.cut:
                    continue
                if state.phase is Phase.IDLE and now - state.since > limits.idle_timeout:
                    state.cut = True
                    closing.append(conn)
                elif state.phase is Phase.HEAD and now - state.since > limits.header_timeout:
                    state.cut = True
                    cutting.append(conn)
                elif state.phase is Phase.REQUEST and state.meter is not None:
                    received, waited = state.meter.progress(now)
                    if waited > limits.body_grace and received < limits.min_body_rate * waited:
                        state.meter.cut(
                            f"the request body came at {received / waited:.0f} bytes/s; it "
                            f"must average {limits.min_body_rate:.0f} bytes/s after its first "
                            f"{limits.body_grace:g} s"
                        )
                        state.cut = True
                        cutting.append(conn)
        return closing, cutting

    def close_connections(self) -> None:
        """Shut down every open connection (server stop)."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            close_quietly(conn)


def close_quietly(conn: socket.socket) -> None:
    """Shut a socket down both ways, ignoring one that is already gone."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def refusal(status: int, code: str, message: str) -> bytes:
    """A whole JSON error answer that closes the connection (for a head that was refused)."""
    body = json.dumps({"code": code, "message": message}, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def message(head: Head) -> HTTPMessage:
    """The headers of `head` as `http.server` gives them to handlers."""
    headers = HTTPMessage()
    for name, value in head.fields:
        headers[name] = value  # appends: repeated headers stay separate
    return headers


class Handler(BaseHTTPRequestHandler):
    """One connection: reads each request head under the limits and dispatches it."""

    protocol_version = "HTTP/1.1"
    server: HTTPServer
    _requests_served = 0

    def setup(self) -> None:
        """Disable Nagle: events are small writes that would wait for the peer's delayed ACK.

        The socket timeout is only the backstop for one stalled read or write; the phases'
        deadlines are the watcher's (see the module docstring).
        """
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connection.settimeout(self.server.limits.io_timeout)

    def handle_one_request(self) -> None:
        """Wait for the next request, read and parse its head, then dispatch it."""
        server, conn = self.server, self.connection
        self.close_connection = True  # until a whole head says otherwise
        if self._requests_served:
            server.enter(conn, Phase.IDLE)
        try:
            if not self.rfile.peek(1):  # type: ignore[attr-defined]
                return
            if self._requests_served:
                server.enter(conn, Phase.HEAD)
            self._requests_served += 1
            block = read_head(self.rfile, server.limits.max_head_bytes)  # type: ignore[arg-type]
            if not is_complete(block):
                if server.was_cut(conn) and block.strip():
                    limit = server.limits.header_timeout
                    message = f"the request head did not arrive within {limit:g} s"
                    self._refuse(HeadError(408, message))
                return
            head = parse_head(block)
        except HeadError as exc:
            self._refuse(exc)
            return
        except OSError:
            return
        self._accept(head, block)
        if head.method not in METHODS:
            self._refuse(HeadError(501, f"method {head.method[:20]!r} is not implemented"))
            return
        self._dispatch()

    def _accept(self, head: Head, block: bytes) -> None:
        """Set what `BaseHTTPRequestHandler` would have set from the head."""
        self.raw_requestline = block.split(b"\n", 1)[0] + b"\n"
        self.requestline = self.raw_requestline.decode("latin-1").rstrip("\r\n")
        self.command = head.method
        # "//x" would read as a host name to urlsplit: one leading slash is the path.
        self.path = "/" + head.target.lstrip("/") if head.target.startswith("//") else head.target
        self.request_version = f"HTTP/{head.version}"
        self.headers = message(head)
        self.close_connection = not head.keep_alive

    def _refuse(self, exc: HeadError) -> None:
        self.close_connection = True
        code = {408: "REQUEST_TIMEOUT", 431: "HEADERS_TOO_LARGE"}.get(exc.status, "BAD_REQUEST")
        try:
            self.wfile.write(refusal(exc.status, code, exc.message))
            self.wfile.flush()
        except OSError:
            pass

    def send_header(self, keyword: str, value: str) -> None:
        """Buffer one header line, refusing one that could split the head (`check_field`):
        what was buffered of this answer is dropped, never sent (the route's failure is then
        answered with a 500, and the connection closed)."""
        try:
            check_field(keyword, value)
        except ValueError:
            self._headers_buffer: list[bytes] = []
            self.close_connection = True
            raise
        super().send_header(keyword, value)

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
        name = host_name(hosts[0])
        if name is None:
            raise error(
                400,
                "INVALID_HOST",
                f"Host {hosts[0][:100]!r} is not a host name or address with an optional port",
            )
        if name not in self.server.hosts:
            raise error(
                421,
                "MISDIRECTED_REQUEST",
                f"Host {hosts[0][:100]!r} is not a name of this server (start it with "
                "--allowed-host NAME to serve it under another name)",
            )

    def _dispatch(self) -> None:
        meter = BodyMeter()
        self.server.enter(self.connection, Phase.REQUEST, meter)
        ex = Exchange(self, self._request_id())
        try:
            try:
                ex.check_framing(meter)
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
        if status == 408:
            self.close_connection = True  # the rest of the body is not coming
        if not ex.body.finished and (ex.declared_length or 0) > UNREAD_BODY_LIMIT:
            self.close_connection = True  # too much to read away: the answer comes first
        try:
            ex.send_json(status, body, headers)
        except OSError:
            self.close_connection = True

    def _discard_unread_body(self, ex: Exchange) -> None:
        """Read a small unread body away, so the kept-alive connection stays usable.

        A client waiting for a 100 Continue it never got may or may not send its body: the
        connection closes instead.
        """
        if ex.expects_continue and not ex.body.started and not ex.body.finished:
            self.close_connection = True
        if not ex.body.finished and not self.close_connection:
            try:
                ex.body.read(UNREAD_BODY_LIMIT)
            except (OSError, HttpError):
                pass  # a broken body: the connection is closed below
            if not ex.body.finished:
                self.close_connection = True
