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
from email.message import Message
from http.server import BaseHTTPRequestHandler
from io import BufferedIOBase
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ... import _websocket as websocket
from ..._json import check_depth
from .head import FIELD_LINE

JSON_BODY_LIMIT = 1024 * 1024
BODY_PIECE = 1 << 16
# Parsed JSON can take twenty times the memory of its text ("[[],[],...]"): the number of
# values a body may hold bounds that, whatever the number of requests at once.
MAX_JSON_VALUES = 20_000
SMALL_JSON = 64 * 1024  # below this, values are not counted: the worst case is small anyway
MAX_LENGTH_DIGITS = 18
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
JSON_TYPE = re.compile(r"application/(?:[\w.+-]+\+)?json", re.IGNORECASE)


class HttpError(Exception):
    """An error answer: raised by a route, written by the dispatcher as JSON."""

    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{status} {body}")
        self.status = status
        self.body = body
        self.headers = headers or {}


class UnsafeField(ValueError):
    """A header an answer must not carry: its name is not a token, or its value holds a
    control character (CR, LF or NUL would split or end the head) or is not Latin-1."""


def check_field(name: str, value: str) -> None:
    """Refuse a header line an answer cannot send as it is (an answer's head is never split).

    Raises:
        UnsafeField: `name: value` is not a header line as `head.FIELD_LINE` reads one.
    """
    try:
        found = FIELD_LINE.fullmatch(f"{name}: {value}".encode("latin-1"))
    except UnicodeEncodeError:
        found = None
    if found is None or found["name"] != name.encode("latin-1"):
        raise UnsafeField(f"refused to send header {name[:40]!r}: {value[:40]!r}")


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
        value = _loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if SURROGATE_ESCAPE.search(data):
        where = _lone_surrogate(value, "")
        if where is not None:
            raise ValueError(
                f"{where or 'the body'}: a lone surrogate (\\ud800-\\udfff) is not text; "
                "send valid Unicode"
            )
    return value


def _lone_surrogate(value: Any, where: str) -> str | None:
    """Where (`envs.A`, `paths[2]`) in parsed JSON a string holds a lone surrogate, if anywhere.

    Such a string cannot be encoded (for a path, a variable, a command line), so it is
    refused here with its field's name instead of failing later.
    """
    if isinstance(value, str):
        return where if LONE_SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if LONE_SURROGATE.search(key):
                return f"a key of {where or 'the body'}"
            inner = f"{where}.{key}" if where else str(key)
            found = _lone_surrogate(item, inner)
            if found is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _lone_surrogate(item, f"{where}[{index}]")
            if found is not None:
                return found
    return None


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
    check_depth(data)
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


class BodyMeter:
    """How fast a request body arrives: bytes read and the seconds spent waiting for them.

    Only time spent inside reads counts, so a route that consumes slowly (a proxy whose
    upstream reads slowly, a full disk) is not taken for a slow client. Thread-safe: the
    connection's thread reads, the server's watcher judges and may `cut` the body.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received = 0
        self._waited = 0.0
        self._since: float | None = None
        self.cut_reason: str | None = None

    def reading(self) -> None:
        """A read of the body starts (and may block)."""
        with self._lock:
            self._since = time.monotonic()

    def read(self, count: int) -> None:
        """The read that `reading` announced returned `count` bytes."""
        with self._lock:
            if self._since is not None:
                self._waited += time.monotonic() - self._since
            self._since = None
            self._received += count

    def progress(self, now: float) -> tuple[int, float]:
        """Bytes received so far and the seconds waited for them, as of `now`."""
        with self._lock:
            waiting = now - self._since if self._since is not None else 0.0
            return self._received, self._waited + waiting

    def cut(self, reason: str) -> None:
        """Mark the body as cut off (the watcher then stops the connection's reads)."""
        self.cut_reason = reason


CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,15})(?:;[^\r\n]*)?[ \t]*\r\n")
MAX_TRAILERS = 100


class BodyReader:
    """A file-like reader over a request body sent with Content-Length or chunked encoding.

    Chunked framing is RFC 9112 7.1 with CRLF line ends (a bare LF in it is a 400); trailer
    lines must be header lines and are dropped. Reads return what has arrived (`read1`), so
    `meter` sees progress as it comes; a body the meter cut off is a 408.
    """

    def __init__(
        self,
        rfile: BufferedIOBase,
        length: int | None,
        chunked: bool,
        meter: BodyMeter | None = None,
        on_first_read: Callable[[], None] | None = None,
    ) -> None:
        self._rfile = rfile
        self._chunked = chunked
        self._left = 0 if chunked else (length or 0)
        self._meter = meter
        self._on_first_read = on_first_read
        self.finished = not chunked and self._left == 0
        self.started = False

    def read(self, size: int = -1) -> bytes:
        """Read `size` bytes, fewer only at the end (all when negative); b"" once at the end."""
        parts: list[bytes] = []
        want = size if size >= 0 else 1 << 62
        while want > 0 and not self.finished:
            if self._left == 0 and self._chunked:
                self._next_chunk()
                continue
            data = self._io(self._rfile.read1, min(want, self._left, BODY_PIECE))
            if not data:
                raise self._cut_short("truncated body")
            parts.append(data)
            want -= len(data)
            self._left -= len(data)
            if self._left == 0:
                if self._chunked:
                    if self._io(self._rfile.read, 2) != b"\r\n":
                        raise self._cut_short("malformed chunk: its data must end with CRLF")
                else:
                    self.finished = True
        return b"".join(parts)

    def _io(self, action: Callable[[int], bytes], size: int) -> bytes:
        if not self.started:
            self.started = True
            if self._on_first_read is not None:
                self._on_first_read()
        if self._meter is None:
            return action(size)
        self._meter.reading()
        data = b""
        try:
            data = action(size)
        finally:
            self._meter.read(len(data))
        return data

    def _cut_short(self, message: str) -> HttpError:
        if self._meter is not None and self._meter.cut_reason is not None:
            return error(408, "REQUEST_TIMEOUT", self._meter.cut_reason)
        return bad_body(message)

    def _next_chunk(self) -> None:
        line = self._io(self._rfile.readline, 1024)
        found = CHUNK_LINE.fullmatch(line)
        if found is None:
            raise self._cut_short("malformed chunk size line: HEX [;extension] CRLF")
        self._left = int(found[1], 16)
        if self._left == 0:
            for _ in range(MAX_TRAILERS):
                trailer = self._io(self._rfile.readline, 8192)
                if trailer in (b"\r\n", b"\n"):
                    break  # trailers are dropped
                if not FIELD_LINE.fullmatch(trailer.rstrip(b"\n").removesuffix(b"\r")):
                    raise self._cut_short("malformed trailer line")
            else:
                raise bad_body("too many trailers")
            self.finished = True


def body_framing(headers: Message) -> tuple[int | None, bool]:
    """The body framing of a request: its Content-Length (None without) and whether chunked.

    Raises:
        HttpError: 400 for an unsupported or ambiguous framing (the end of the request is
            unknown, so the connection closes after the answer).
    """
    encodings = headers.get_all("Transfer-Encoding")
    lengths = headers.get_all("Content-Length") or []
    coding = None if encodings is None else ",".join(encodings).strip().lower()
    if coding is not None and coding != "chunked":
        raise bad_body(f"unsupported Transfer-Encoding {coding[:40]!r}")
    if (coding is not None and lengths) or len(set(lengths)) > 1:
        raise bad_body("conflicting Content-Length and Transfer-Encoding headers")
    return (content_length(lengths[0]) if lengths else None), coding is not None


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
        self.expects_continue = False

    def check_framing(self, meter: BodyMeter | None = None) -> None:
        """Set up the body reader (timed by `meter`); 400 when the framing is invalid.

        With `Expect: 100-continue`, the interim 100 goes out when a route first reads the
        body, so an answer that needs no body (a 401) comes before the client sends it.
        """
        self.declared_length, chunked = body_framing(self.headers)
        expects = (self.headers.get("Expect") or "").strip().lower() == "100-continue"
        self.expects_continue = expects and self.handler.request_version == "HTTP/1.1"
        self.body = BodyReader(
            self.handler.rfile,
            self.declared_length,
            chunked,
            meter,
            self._send_continue if self.expects_continue else None,
        )

    def _send_continue(self) -> None:
        self.handler.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.handler.wfile.flush()

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
        the connection ends after this answer, so no client sends another request on it).

        Raises:
            UnsafeField: a header could split the head (checked before anything is sent, so
                the route's failure is answered with a clean 500).
        """
        pairs = list(headers.items()) if isinstance(headers, dict) else headers
        for name, value in pairs:
            check_field(name, value)
        self.responded = True
        self.handler.send_response(status)
        self.handler.send_header("X-Request-ID", self.request_id)
        for name, value in pairs:
            self.handler.send_header(name, value)
        if self.handler.close_connection:
            self.handler.send_header("Connection", "close")
        self.handler.end_headers()

    def upgrade(self, max_message: int, timeout: float) -> websocket.WebSocket:
        """Accept a WebSocket opening handshake (RFC 6455 4.2) and return the connection.

        The connection then belongs to the WebSocket: it closes when the route returns.
        `timeout` bounds each read and write on it from now on.

        Raises:
            HttpError: 400 unless the request is a WebSocket handshake; 426 for a version
                other than 13 (naming the one served).
        """
        tokens = [
            item.strip().lower()
            for value in self.headers.get_all("Connection") or []
            for item in value.split(",")
        ]
        upgrade = (self.headers.get("Upgrade") or "").strip().lower()
        if self.method != "GET" or upgrade != "websocket" or "upgrade" not in tokens:
            raise error(
                400,
                "INVALID_REQUEST",
                "a WebSocket route needs GET with Upgrade: websocket and Connection: Upgrade",
            )
        if (self.headers.get("Sec-WebSocket-Version") or "").strip() != "13":
            raise HttpError(
                426,
                {"code": "INVALID_REQUEST", "message": "Sec-WebSocket-Version must be 13"},
                {"Sec-WebSocket-Version": "13"},
            )
        key = self.headers.get("Sec-WebSocket-Key") or ""
        if not websocket.valid_key(key):
            raise error(400, "INVALID_REQUEST", "Sec-WebSocket-Key must be 16 bytes in base64")
        self.handler.close_connection = False  # no "Connection: close" on a 101
        self.start(
            101,
            {
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Accept": websocket.accept_key(key),
            },
        )
        self.handler.wfile.flush()
        self.handler.close_connection = True
        sock = self.handler.connection
        sock.settimeout(timeout)
        rfile = self.handler.rfile
        return websocket.WebSocket(
            sock,
            rfile.read1,
            client=False,
            max_message=max_message,  # type: ignore[attr-defined]
        )

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
