"""A small stdlib HTTP/1.1 server on 127.0.0.1:0 with byte-level control, for socket tests.

Routes map ``(method, path)`` to a function ``handler(req) -> None`` that writes the whole
response through ``req`` (JSON, chunked event streams, resets, stalls...). Every request is
recorded, and every accepted TCP connection is counted.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit


@dataclass
class Seen:
    """One request as the server received it (a handler object serves a whole connection)."""

    command: str
    route_path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


class Request(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def _dispatch(self) -> None:
        parts = urlsplit(self.path)
        self.route_path = parts.path
        self.query = parse_qs(parts.query)
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        with self.server.lock:
            self.server.requests.append(
                Seen(self.command, parts.path, self.query, dict(self.headers), self.body)
            )
        handler = self.server.routes.get((self.command, parts.path))
        if handler is None:
            handler = self.server.routes.get((self.command, "*"))
        if handler is None:
            self.send_json(404, {"code": "NOT_FOUND", "message": f"no route {parts.path}"})
            return
        handler(self)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _dispatch

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_raw(status, data, {"Content-Type": "application/json", **(headers or {})})

    def send_raw(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def start_stream(self, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def event(self, **fields: Any) -> None:
        fields.setdefault("timestamp", int(time.time() * 1000))
        self.chunk(json.dumps(fields).encode() + b"\n\n")

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def reset(self) -> None:
        """Abort the connection with a TCP RST."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def fin(self) -> None:
        """Close the connection cleanly (FIN) in the middle of whatever was being sent."""
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Request)
        self.routes: dict[tuple[str, str], Callable[[Request], None]] = {}
        self.requests: list[Seen] = []
        self.connections = 0
        self.lock = threading.Lock()
        # Set by an interrupt route; a run that honours interrupts (as execd's do) ends on it.
        self.interrupted = threading.Event()
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # faults are the point of these tests; the client side asserts on them

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def api_base(self) -> str:
        return self.url + "/v1"

    def route(self, method: str, path: str) -> Callable[[Callable[[Request], None]], Any]:
        def register(fn: Callable[[Request], None]) -> Callable[[Request], None]:
            self.routes[(method, path)] = fn
            return fn

        return register

    def seen(self, method: str, path: str) -> list[Seen]:
        with self.lock:
            return [r for r in self.requests if r.command == method and r.route_path == path]

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
