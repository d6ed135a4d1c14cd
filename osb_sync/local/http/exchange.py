"""HTTP plumbing shared by every route: request bodies, JSON answers, routing and event streams.

http.server leaves three things to us that the real server gets from its framework: decoding
chunked request bodies, writing chunked responses, and knowing whether a request body was fully
read (an unread body makes the keep-alive connection unusable, so we close it instead).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from io import BufferedIOBase
from typing import Any
from urllib.parse import parse_qs, urlsplit

JSON_BODY_LIMIT = 1024 * 1024
BODY_PIECE = 1 << 16
# Parsed JSON can take twenty times the memory of its text ("[[],[],...]"): the number of
# values a body may hold bounds that, whatever the number of requests at once.
MAX_JSON_VALUES = 20_000
SMALL_JSON = 64 * 1024  # below this, values are not counted: the worst case is small anyway
MAX_LENGTH_DIGITS = 18
CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")
JSON_TYPE = re.compile(r"application/(?:[\w.+-]+\+)?json", re.IGNORECASE)


class HttpError(Exception):
    """An error answer: raised by a route, written by the dispatcher as JSON."""

    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{status} {body}")
        self.status = status
        self.body = body
        self.headers = headers or {}


def error(status: int, code: str, message: str) -> HttpError:
    """Build the `{"code","message"}` error shared by the lifecycle API and execd."""
    return HttpError(status, {"code": code, "message": message})


def bad_body(message: str) -> HttpError:
    """400 for a request body whose framing or encoding is broken."""
    return error(400, "INVALID_REQUEST_BODY", message)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def parse_json(data: bytes) -> Any:
    """Strict JSON: no NaN or Infinity, no overflowing floats; ValueError when malformed.

    Too deep a nesting is a ValueError too (the C parser raises RecursionError); more than
    MAX_JSON_VALUES values is a 413.
    """
    if len(data) > SMALL_JSON and _json_values(data) > MAX_JSON_VALUES:
        message = f"JSON body with more than {MAX_JSON_VALUES} values"
        raise error(413, "INVALID_REQUEST_BODY", message)
    try:
        return _loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _json_values(data: bytes) -> int:
    """About how many values JSON text holds: its commas and brackets outside strings."""
    count = 0
    inside = False
    pieces = data.split(b'"')  # a string toggles at each quote not escaped by a backslash
    for index, piece in enumerate(pieces):
        if not inside:
            count += piece.count(b",") + piece.count(b"[") + piece.count(b"{")
        escaped = inside and (len(piece) - len(piece.rstrip(b"\\"))) % 2 == 1
        if index < len(pieces) - 1 and not escaped:
            inside = not inside
    return count


def _loads(data: bytes) -> Any:
    return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)


def content_length(value: str | None) -> int | None:
    """The Content-Length header as a number; 400 unless it is plain decimal digits."""
    if value is None:
        return None
    value = value.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > MAX_LENGTH_DIGITS:
        raise bad_body(f"invalid Content-Length {value[:40]!r}")
    return int(value)


def now_ms() -> int:
    """Unix time in milliseconds, the `timestamp` of every execd event."""
    return int(time.time() * 1000)


class BodyReader:
    """A file-like reader over a request body sent with Content-Length or chunked encoding."""

    def __init__(self, rfile: BufferedIOBase, length: int | None, chunked: bool) -> None:
        self._rfile = rfile
        self._chunked = chunked
        self._left = 0 if chunked else (length or 0)
        self.finished = not chunked and self._left == 0

    def read(self, size: int = -1) -> bytes:
        """Read `size` bytes, fewer only at the end (all when negative); b"" once at the end."""
        parts: list[bytes] = []
        want = size if size >= 0 else 1 << 62
        while want > 0 and not self.finished:
            if self._left == 0 and self._chunked:
                self._next_chunk()
                continue
            data = self._rfile.read(min(want, self._left, BODY_PIECE))
            if not data:
                raise bad_body("truncated body")
            parts.append(data)
            want -= len(data)
            self._left -= len(data)
            if self._left == 0:
                if self._chunked:
                    if self._rfile.readline(3) not in (b"\r\n", b"\n"):
                        raise bad_body("malformed chunk")
                else:
                    self.finished = True
        return b"".join(parts)

    def _next_chunk(self) -> None:
        line = self._rfile.readline(1024)
        size = line.split(b";", 1)[0].strip()
        if not line.endswith(b"\n") or not CHUNK_SIZE.fullmatch(size):
            raise bad_body("malformed chunk size")
        self._left = int(size, 16)
        if self._left == 0:
            for _ in range(100):
                if self._rfile.readline(8192) in (b"\r\n", b"\n", b""):
                    break  # trailers are ignored
            else:
                raise bad_body("too many trailers")
            self.finished = True


class ChunkedWriter:
    """Writes a chunked response body, one flushed HTTP chunk per call; thread-safe.

    A client that went away must not stop the run that feeds this writer (real execd keeps
    running too), so write errors are remembered and later writes become no-ops.
    """

    def __init__(self, wfile: BufferedIOBase) -> None:
        self._wfile = wfile
        self._lock = threading.Lock()
        self.broken = False

    def write(self, data: bytes) -> None:
        """Send `data` as one chunk and flush it."""
        if data:
            self._send(b"%x\r\n%s\r\n" % (len(data), data))

    def end(self) -> None:
        """Send the terminating zero-length chunk."""
        self._send(b"0\r\n\r\n")

    def _send(self, raw: bytes) -> None:
        with self._lock:
            if self.broken:
                return
            try:
                self._wfile.write(raw)
                self._wfile.flush()
            except OSError:
                self.broken = True


class Exchange:
    """One request and its answer, wrapping the BaseHTTPRequestHandler that received it."""

    def __init__(self, handler: BaseHTTPRequestHandler, request_id: str) -> None:
        self.handler = handler
        self.request_id = request_id
        self.method = handler.command
        parts = urlsplit(handler.path)
        self.path = parts.path
        self.raw_query = parts.query
        self.query = parse_qs(parts.query, keep_blank_values=True)
        self.headers = handler.headers
        self.params: dict[str, str] = {}
        self.responded = False
        self.body = BodyReader(handler.rfile, 0, False)
        self.declared_length: int | None = None

    def check_framing(self) -> None:
        """Set up the body reader; 400 (connection closed) when the framing is invalid."""
        encodings = self.headers.get_all("Transfer-Encoding") or []
        lengths = self.headers.get_all("Content-Length") or []
        coding = ",".join(encodings).strip().lower()
        if coding and coding != "chunked":
            raise bad_body(f"unsupported Transfer-Encoding {coding[:40]!r}")
        if (coding and lengths) or len(set(lengths)) > 1:
            raise bad_body("conflicting Content-Length and Transfer-Encoding headers")
        self.declared_length = content_length(lengths[0]) if lengths else None
        self.body = BodyReader(self.handler.rfile, self.declared_length, bool(coding))

    def arg(self, name: str, default: str | None = None) -> str | None:
        """The first value of query parameter `name`."""
        values = self.query.get(name)
        return values[0] if values else default

    def read_body(self, limit: int = JSON_BODY_LIMIT) -> bytes:
        """The whole request body; 413 when larger than `limit` (before reading, if declared)."""
        too_large = error(413, "INVALID_REQUEST_BODY", f"request body larger than {limit} bytes")
        if self.declared_length is not None and self.declared_length > limit:
            raise too_large
        data = self.body.read(limit + 1)
        if len(data) > limit:
            raise too_large
        return data

    def json_body(self, empty: Any = None) -> Any:
        """The body parsed as JSON (`empty` for an empty body); ValueError when malformed.

        A body needs `Content-Type: application/json` (415 otherwise), so a page in a browser
        cannot send one with a form or a "simple" cross-site request.
        """
        data = self.read_body()
        if not data.strip():
            return empty
        media_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip()
        if not JSON_TYPE.fullmatch(media_type):
            raise error(
                415, "UNSUPPORTED_MEDIA_TYPE", "a JSON body needs Content-Type: application/json"
            )
        return parse_json(data)

    def send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        """Send a complete answer with a Content-Length."""
        self.start(status, {"Content-Length": str(len(body)), **(headers or {})})
        if body and self.method != "HEAD":
            self.handler.wfile.write(body)
        self.handler.wfile.flush()

    def send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        """Send `obj` as a JSON answer."""
        body = json.dumps(obj, separators=(",", ":")).encode()
        self.send(status, body, {"Content-Type": "application/json", **(headers or {})})

    def start(self, status: int, headers: dict[str, str] | list[tuple[str, str]]) -> None:
        """Send the status line and headers (plus X-Request-ID, and `Connection: close` when
        the connection ends after this answer, so no client sends another request on it)."""
        self.responded = True
        self.handler.send_response(status)
        self.handler.send_header("X-Request-ID", self.request_id)
        for name, value in headers.items() if isinstance(headers, dict) else headers:
            self.handler.send_header(name, value)
        if self.handler.close_connection:
            self.handler.send_header("Connection", "close")
        self.handler.end_headers()

    def start_chunked(
        self, status: int, headers: dict[str, str] | list[tuple[str, str]]
    ) -> ChunkedWriter:
        """Start a chunked answer and return its writer; call `end()` on it when done."""
        pairs = list(headers.items()) if isinstance(headers, dict) else headers
        self.start(status, [*pairs, ("Transfer-Encoding", "chunked")])
        return ChunkedWriter(self.handler.wfile)


class EventStream:
    """An execd event stream: bare JSON objects followed by a blank line, plus heartbeats."""

    def __init__(self, ex: Exchange, ping_interval: float) -> None:
        self._writer = ex.start_chunked(
            200,
            {
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            },
        )
        self._ping_interval = ping_interval
        self._stop = threading.Event()
        self._pinger: threading.Thread | None = None

    def event(self, event: dict[str, Any]) -> None:
        """Send one event, stamping it with the current Unix time in ms."""
        frame = {**event, "timestamp": now_ms()}
        self._writer.write(json.dumps(frame, separators=(",", ":")).encode() + b"\n\n")

    def start_pings(self) -> None:
        """Send a ping now and then every ping interval until `close()`."""
        self._pinger = threading.Thread(target=self._ping_loop, name="osb-local-ping", daemon=True)
        self._pinger.start()

    def _ping_loop(self) -> None:
        while True:
            self.event({"type": "ping", "text": "pong"})
            if self._stop.wait(self._ping_interval):
                return

    def bare_error(self, code: str, message: str) -> None:
        """Send a type-less error object without a trailing newline, as execd does mid-stream.

        It ends the stream, so the heartbeat stops first: a ping after it would run into it.
        """
        self._stop_pings()
        self._writer.write(
            json.dumps({"code": code, "message": message}, separators=(",", ":")).encode()
        )

    def close(self) -> None:
        """Stop the heartbeat and end the chunked body."""
        self._stop_pings()
        self._writer.end()

    def _stop_pings(self) -> None:
        self._stop.set()
        if self._pinger is not None and self._pinger is not threading.current_thread():
            self._pinger.join()


Route = Callable[[Exchange], None]


class Router:
    """Maps (method, path pattern) to a route, the first that matches in the order added.

    `{name}` in a pattern captures one segment; `{name:path}` the rest of the path, slashes
    included (the proxy's path inside the sandbox).
    """

    def __init__(self) -> None:
        self._routes: list[tuple[str, re.Pattern[str], Route]] = []

    def add(self, method: str, pattern: str, route: Route) -> None:
        """Register `route` for `method` and `pattern`."""
        regex = re.sub(r"\{(\w+):path\}", r"(?P<\1>.*)", pattern)
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", regex)
        self._routes.append((method, re.compile(f"^{regex}/?$"), route))

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | int:
        """The route and its captures, else 405 (path known, method not) or 404."""
        status = 404
        for route_method, regex, route in self._routes:
            found = regex.match(path)
            if found:
                if route_method == method:
                    return route, found.groupdict()
                status = 405
        return status
