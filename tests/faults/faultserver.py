"""A fault-injecting OpenSandbox on loopback: the lifecycle API and execd, broken byte by byte.

Three stdlib HTTP/1.1 keep-alive servers share one :class:`World`:

- ``api``: the lifecycle API under ``/v1`` (routes ``create``, ``get``, ``list``, ``endpoint``,
  ``delete``);
- ``execd``: the execd of every sandbox under ``/<sandbox id>``, which is where the endpoint
  route points: every execd route the client calls (``EXECD_ROUTES``), over a small file tree
  (``World.files``: ``/dir/a.txt``, ``/dir/sub/b.txt``);
- ``other``: another origin, the target of refused redirects; nothing should ever reach it.

With ``World.proxied`` the endpoints are in the server-proxy form (``/sandboxes/<id>/proxy/
44772`` on the API's origin, as the local server's and the real server's ``use_server_proxy``
ones): execd's origin is then the lifecycle API's, and ``api`` hands those paths to execd.

Healthy answers follow the wire protocol (bare JSON event frames, ``init`` first, ``{code,
message}`` errors). ``World.inject(route, fault)`` makes a route misbehave instead: ``FAULTS``
names every misbehaviour of the wire (any route), ``LIES`` every well-framed lie a hostile
execd tells on the routes it names (traversal names, absolute paths, absurd sizes, wrong JSON
types, ids that would climb out of their URL or hold the token, answers that drip a byte at a
time, a compressed bomb, a redirect to its own origin, terminal escapes, the token where an
error would quote it). "Connection refused" is not an answer: a server
``go_down()`` (stops listening and drops its connections) and ``go_up()`` on the same port
again.
"""

from __future__ import annotations

import email.utils
import functools
import itertools
import json
import re
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, parse_qsl, urlsplit

KEY = "osb-api-key-SECRET-2f8e1c"
TOKEN = "execd-token-SECRET-9d41b7"
API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"
CREATE_ID_KEY = "osb-sync/create-id"
FILE_BYTES = bytes(range(256)) * 64
SMUGGLED = b"HTTP/1.1 500 Smuggled\r\nContent-Length: 0\r\n\r\n"
STALL_MAX = 15.0  # a stalled handler gives up on its own after this long
DRIP_INTERVAL = 0.05
BIG_EVENT = 256 * 1024
SMUGGLE_DELAY = 0.03
DEEP = 20_000
# Routes the client follows at once with another request on the same connection: the excess
# must go with the answer, or it would race that request.
SMUGGLE_AT_ONCE = ("create", "get")

JSON = "application/json"
EVENTS = "text/event-stream"
OCTETS = "application/octet-stream"

# An execd route behind the server proxy (``World.proxied``).
PROXIED = re.compile(r"^/sandboxes/(?P<id>[^/]+)/proxy/44772(?P<rest>/.*)?$")
API_ROUTES = (
    ("POST", re.compile(r"^/v1/sandboxes$"), "create"),
    ("GET", re.compile(r"^/v1/sandboxes$"), "list"),
    ("GET", re.compile(r"^/v1/sandboxes/(?P<id>[^/]+)$"), "get"),
    ("DELETE", re.compile(r"^/v1/sandboxes/(?P<id>[^/]+)$"), "delete"),
    ("GET", re.compile(r"^/v1/sandboxes/(?P<id>[^/]+)/endpoints/(?P<port>\d+)$"), "endpoint"),
)
# (method, path after ``/<sandbox id>``, route): every execd route the client calls.
EXECD_ROUTES = tuple(
    (method, re.compile(rf"^/(?P<id>[^/]+){tail}$"), route)
    for method, tail, route in (
        ("GET", "/ping", "ping"),
        ("POST", "/code", "code"),
        ("DELETE", "/(code|command)", "interrupt"),
        ("POST", "/code/context", "context_create"),
        ("GET", "/code/contexts", "contexts_list"),
        ("DELETE", "/code/contexts", "contexts_delete"),
        ("GET", "/code/contexts/(?P<item>[^/]+)", "context_get"),
        ("DELETE", "/code/contexts/(?P<item>[^/]+)", "context_delete"),
        ("POST", "/command", "command"),
        ("GET", "/command/status/(?P<item>[^/]+)", "command_status"),
        ("GET", "/command/(?P<item>[^/]+)/logs", "command_logs"),
        ("POST", "/session", "session_create"),
        ("POST", "/session/(?P<item>[^/]+)/run", "session_run"),
        ("DELETE", "/session/(?P<item>[^/]+)", "session_delete"),
        ("GET", "/files/info", "info"),
        ("GET", "/files/download", "download"),
        ("POST", "/files/upload", "upload"),
        ("GET", "/files/search", "search"),
        ("DELETE", "/files", "remove"),
        ("POST", "/files/mv", "move"),
        ("POST", "/files/permissions", "chmod"),
        ("POST", "/files/replace", "replace"),
        ("GET", "/directories/list", "list"),
        ("POST", "/directories", "mkdir"),
        ("DELETE", "/directories", "rmtree"),
        ("GET", "/metrics", "metrics"),
        ("POST", "/pty", "pty_create"),
        ("GET", "/pty/(?P<item>[^/]+)", "pty_status"),
        ("DELETE", "/pty/(?P<item>[^/]+)", "pty_delete"),
    )
)
# The healthy sandbox's files: bytes, or a size whose bytes are generated as they are sent
# (``PATTERN`` over and over: a large file costs the server no memory).
TREE: dict[str, bytes | int] = {"/dir/a.txt": b"alpha\n", "/dir/sub/b.txt": b"beta\n"}
PATTERN = bytes(range(256)) * 256
LOGS_CURSOR_HEADER = "EXECD-COMMANDS-TAIL-CURSOR"
METRICS = {
    "cpu_count": 2,
    "cpu_used_pct": 12.5,
    "mem_total_mib": 2048.0,
    "mem_used_mib": 100.5,
    "timestamp": 1718000000000,
}


def frame(**fields: Any) -> bytes:
    """One execd event as real execd writes it: bare JSON and a blank line."""
    fields.setdefault("timestamp", 1718000000000)
    return json.dumps(fields).encode() + b"\n\n"


# -- wire ---------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    """Reads one request and hands it to the World; offers byte-level writing helpers."""

    protocol_version = "HTTP/1.1"
    server: FaultServer

    def setup(self) -> None:
        super().setup()
        # Like Go's net/http: no Nagle, so headers and body written apart are not held back.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.connection, opened=True)

    def finish(self) -> None:
        self.server.track(self.connection, opened=False)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Only reached for a malformed request: a client that reused a broken connection."""
        self.server.world.note_bad_request(f"{code} {message}")
        super().send_error(code, message, explain)

    def _dispatch(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            self.server.world.handle(self.server.name, self, body)
        except OSError:
            self.close_connection = True  # the client went away in the middle of a fault

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _dispatch

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def chunk(self, data: bytes) -> None:
        self.write(b"%x\r\n%s\r\n" % (len(data), data))

    def send_bytes(self, status: int, data: bytes, content_type: str, **headers: str) -> None:
        extra = {k.replace("_", "-"): v for k, v in headers.items()}
        fields = {"Content-Type": content_type, **extra}
        if status != 204:
            fields["Content-Length"] = str(len(data))
        self.head(status, fields)
        if status != 204:
            self.write(data)

    def reset(self) -> None:
        """Abort the connection with a TCP RST."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def fin(self) -> None:
        """Close the connection cleanly (FIN) wherever the answer is."""
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close_connection = True

    def carried_secrets(self) -> str:
        """The credentials this request carried, echoed back the way careless servers do."""
        seen = [self.headers.get(API_KEY_HEADER), self.headers.get(TOKEN_HEADER)]
        return " ".join(value for value in seen if value) or "none"


class FaultServer(ThreadingHTTPServer):
    """A keep-alive server on 127.0.0.1 that can stop listening and listen again (same port)."""

    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(self, name: str, world: World):
        super().__init__(("127.0.0.1", 0), Handler)
        self.name = name
        self.world = world
        self.up = False
        self.accepted = 0
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def track(self, conn: socket.socket, *, opened: bool) -> None:
        with self._lock:
            if opened:
                self.accepted += 1
                self._open.add(conn)
            else:
                self._open.discard(conn)

    def start(self) -> None:
        thread = threading.Thread(target=self.serve_forever, args=(0.01,), daemon=True)
        thread.start()
        self.up = True

    def go_down(self) -> None:
        """Stop listening and drop every open connection: the next connect is refused."""
        if not self.up:
            return
        self.up = False
        self.shutdown()
        self.socket.close()
        with self._lock:
            conns = list(self._open)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def go_up(self) -> None:
        """Listen again on the same port."""
        if self.up:
            return
        self.socket = socket.socket(self.address_family, self.socket_type)
        self.server_bind()
        self.server_activate()
        self.start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # faults break connections on purpose


# -- the fake OpenSandbox ---------------------------------------------------------------------


@dataclass
class Box:
    """A fake sandbox."""

    id: str
    metadata: dict[str, str]
    state: str = "Running"
    deleted: bool = False


@dataclass
class Seen:
    """One request as a server received it."""

    server: str
    method: str
    path: str
    route: str | None
    headers: dict[str, str]
    at: float = field(default_factory=time.monotonic)


@dataclass
class Reply:
    """A route's healthy answer, which a fault may send broken instead."""

    route: str
    kind: str  # json | empty | stream | bytes
    status: int = 200
    body: bytes = b""  # json, bytes; for ``empty``: what a fault that needs a body sends
    events: list[bytes] = field(default_factory=list)  # stream frames
    content_type: str = JSON
    box_id: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    length: int | None = None  # ``bytes``: this many bytes of PATTERN instead of ``body``
    chunk_size: int | None = None  # ``bytes``: sent chunked, this many bytes a chunk
    drip: str | None = None  # "head" or "body": that part dripped, a byte every DRIP_INTERVAL
    raw: bytes | None = None  # the whole answer as sent, head included (then FIN)

    def payload(self) -> bytes:
        return b"".join(self.events) if self.kind == "stream" else self.body


@dataclass
class Injected:
    fault: str
    times: int | None  # None: every request until cleared


class World:
    """State shared by the three servers: sandboxes, injected faults and what was received."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self.release = threading.Event()
        self.boxes: dict[str, Box] = {}
        self.seen: list[Seen] = []
        self.faults: dict[str, Injected] = {}
        self.bad_requests: list[str] = []
        self.pending = False
        self.down_after: str | None = None
        self.smuggled = threading.Event()
        # Set by a healthy interrupt: a dripping or flooding run ends then, as execd's runs do.
        # Per sandbox: a late interrupt of the previous cell's sandbox (its client closing
        # under load) must not end the next cell's run.
        self.interrupted: set[str] = set()
        self.files: dict[str, bytes | int] = dict(TREE)
        # What ``/command`` prints, a line an event (None: ``command_events``' "ok").
        self.command_stdout: list[str] | None = None
        self.proxied = False
        self.api = FaultServer("api", self)
        self.execd = FaultServer("execd", self)
        self.other = FaultServer("other", self)

    def __enter__(self) -> World:
        for server in (self.api, self.execd, self.other):
            server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        for server in (self.api, self.execd, self.other):
            server.go_down()
            server.server_close()

    @property
    def api_base(self) -> str:
        return self.api.url + "/v1"

    # -- test-side controls ------------------------------------------------------------------

    def reset(self) -> None:
        """Forget everything; end whatever a previous fault is still doing."""
        with self.lock:
            self.release.set()
            self.release = threading.Event()
            self.boxes.clear()
            self.seen.clear()
            self.faults.clear()
            self.bad_requests.clear()
            self.pending = False
            self.down_after = None
            self.smuggled = threading.Event()
            self.interrupted = set()
            self.files = dict(TREE)
            self.proxied = False
        self.api.go_up()
        self.execd.go_up()

    def inject(self, route: str, fault: str, times: int | None = None) -> None:
        """Answer ``route`` with ``fault`` (``times`` requests, or until cleared): one of
        ``FAULTS``, or one of ``LIES`` that names ``route``."""
        if fault not in FAULTS and route not in LIES[fault].routes:
            raise KeyError(f"{fault} tells no lie on {route}")
        with self.lock:
            self.faults[route] = Injected(fault, times)

    def heal(self) -> None:
        """Stop every fault: release stalled answers, clear injections, listen again."""
        with self.lock:
            self.release.set()
            self.faults.clear()
            self.down_after = None
        self.api.go_up()
        self.execd.go_up()

    def live(self) -> list[str]:
        with self.lock:
            return [b.id for b in self.boxes.values() if not b.deleted]

    def forget(self, box_id: str) -> None:
        with self.lock:
            self.boxes[box_id].deleted = True

    def requests(self, server: str | None = None, route: str | None = None) -> list[Seen]:
        with self.lock:
            return [
                s
                for s in self.seen
                if (server is None or s.server == server) and (route is None or s.route == route)
            ]

    def note_bad_request(self, text: str) -> None:
        with self.lock:
            self.bad_requests.append(text)

    # -- serving -----------------------------------------------------------------------------

    def handle(self, server: str, h: Handler, body: bytes) -> None:
        parts = urlsplit(h.path)
        path = parts.path
        proxied = PROXIED.match(path) if server == "api" and self.proxied else None
        if proxied:  # the server proxy: execd's routes under the API's origin
            server, path = "execd", f"/{proxied['id']}{proxied['rest'] or ''}"
        route, params = _match(server, h.command, path)
        with self.lock:
            self.seen.append(Seen(server, h.command, path, route, dict(h.headers)))
            fault = self._take_fault(route)
            release = self.release
            if route == "interrupt" and fault is None:
                self.interrupted.add(params["id"])
        if route is None:
            h.send_bytes(200 if server == "other" else 404, b"{}", JSON)
            return
        if server == "execd":
            reply = self._execd_answer(route, params, parse_qs(parts.query), body, h.headers)
            if fault in LIES:
                reply = LIES[fault].tell(reply)
        else:
            processed = fault is None or FAULTS[fault].processed
            if route == "delete" and fault is not None and FAULTS[fault].status_fault:
                processed = False  # an error status means the delete did not happen
            reply = self._answer(route, params, parts.query, body, processed, fault)
        if fault is None or fault in LIES:
            write_good(h, reply, release)
        else:
            FAULTS[fault].write(h, reply, Scene(self, release, params.get("id", "")))
        if server == "api" and self.down_after == route:
            self.down_after = None
            self.api.go_down()

    def _take_fault(self, route: str | None) -> str | None:
        injected = self.faults.get(route or "")
        if injected is None:
            return None
        if injected.times is not None:
            injected.times -= 1
            if injected.times <= 0:
                del self.faults[route or ""]
        return injected.fault

    def _answer(
        self,
        route: str,
        params: dict[str, str],
        query: str,
        body: bytes,
        processed: bool,
        fault: str | None,
    ) -> Reply:
        if route == "create":
            return self._create(body, processed, fault)
        if route == "list":
            return self._list(query)
        box_id = params.get("id", "")
        if route in ("get", "delete") and not self._exists(box_id):
            return Reply(route, "json", 404, json.dumps(_not_found(box_id)).encode(), box_id=box_id)
        if route == "get":
            return self._get(box_id)
        if route == "delete":
            if processed:
                self.forget(box_id)
            data = json.dumps({"id": box_id, "deleted": True}).encode()
            return Reply(route, "empty", 204, data, box_id=box_id)
        assert route == "endpoint", route
        endpoint = {"endpoint": f"127.0.0.1:{self.execd.server_address[1]}/{box_id}"}
        if self.proxied:
            port = self.api.server_address[1]
            endpoint = {"endpoint": f"127.0.0.1:{port}/sandboxes/{box_id}/proxy/44772"}
        data = json.dumps({**endpoint, "headers": {TOKEN_HEADER: TOKEN}}).encode()
        return Reply(route, "json", 200, data, box_id=box_id)

    def _execd_answer(
        self,
        route: str,
        params: dict[str, str],
        asked: dict[str, list[str]],
        body: bytes,
        headers: Any,
    ) -> Reply:
        """A healthy execd's answer on ``route``, over the sandbox's files ``self.files``."""
        box_id, item = params.get("id", ""), params.get("item", "")

        def answer(data: Any) -> Reply:
            return Reply(route, "json", 200, json.dumps(data).encode(), box_id=box_id)

        path = _resolve((asked.get("path") or [""])[0])
        with self.lock:
            files = dict(self.files)
        if route == "code":
            return Reply(route, "stream", events=code_events(), content_type=EVENTS, box_id=box_id)
        if route == "command" and self.command_stdout is not None:
            lines = [frame(type="stdout", text=line) for line in self.command_stdout]
            events = [frame(type="init", text="cmd-1"), *lines, command_events()[-1]]
            return Reply(route, "stream", events=events, content_type=EVENTS, box_id=box_id)
        if route in ("command", "session_run"):
            events = command_events() if route == "command" else command_events(item)
            return Reply(route, "stream", events=events, content_type=EVENTS, box_id=box_id)
        if route == "download":
            return _download(files.get(path, FILE_BYTES), headers.get("Range"), box_id)
        if route == "info":
            found = {p: _info(_resolve(p), files) for p in asked.get("path", [])}
            if not all(found.values()):
                missing = {"code": "FILE_NOT_FOUND", "message": "file not found"}
                return Reply(route, "json", 404, json.dumps(missing).encode(), box_id=box_id)
            return answer(found)
        if route in ("search", "list"):
            under = [p for p in _entries(files) if p.startswith(path.rstrip("/") + "/")]
            if route == "search":
                under = [p for p in under if p in files]
            else:
                under = [p for p in under if "/" not in p[len(path.rstrip("/")) + 1 :]]
            return answer([_info(p, files) for p in under])
        if route == "replace":
            return answer({p: {"replacedCount": 1} for p in json.loads(body or b"{}")})
        if route == "metrics":
            return answer(METRICS)
        if route in ("context_create", "context_get"):
            return answer({"id": item or "ctx-1", "language": "python"})
        if route == "contexts_list":
            return answer([{"id": "ctx-1", "language": "python"}])
        if route == "command_status":
            return answer({"id": item, "running": False, "exit_code": 0, "content": "echo ok"})
        if route == "command_logs":
            cursor = int((asked.get("cursor") or ["0"])[0])
            text = b"ok\n"[cursor:]
            cursor_header = {LOGS_CURSOR_HEADER: str(cursor + len(text))}
            return Reply(
                route,
                "bytes",
                body=text,
                content_type="text/plain",
                box_id=box_id,
                headers=cursor_header,
            )
        if route == "session_create":
            return answer({"session_id": "sess-1"})
        if route == "pty_create":
            return answer({"session_id": "pty-1"})
        if route == "pty_status":
            return answer({"session_id": item, "running": True, "output_offset": 12})
        # ping, interrupt, upload, remove, move, chmod, mkdir, rmtree and the deletes: no body
        return Reply(route, "empty", 200, b"", box_id=box_id)

    def _exists(self, box_id: str) -> bool:
        with self.lock:
            box = self.boxes.get(box_id)
            return box is not None and not box.deleted

    def _create(self, body: bytes, processed: bool, fault: str | None) -> Reply:
        request = json.loads(body or b"{}")
        metadata = request.get("metadata") or {}
        number = next(self._ids)
        box_id = str(9000 + number) if fault == "wrong_types" else f"sbx-{number}"
        state = "Pending" if self.pending else "Running"
        if processed:
            with self.lock:  # Pending in this answer only: the first poll finds it Running
                self.boxes[box_id] = Box(box_id, dict(metadata))
        data = {"id": box_id, "status": {"state": state}, "metadata": metadata}
        return Reply("create", "json", 202, json.dumps(data).encode(), box_id=box_id)

    def _get(self, box_id: str) -> Reply:
        with self.lock:
            state = self.boxes[box_id].state
        data = {"id": box_id, "status": {"state": state, "reason": "FAKE"}}
        return Reply("get", "json", 200, json.dumps(data).encode(), box_id=box_id)

    def _list(self, query: str) -> Reply:
        wanted = dict(parse_qsl(parse_qs(query).get("metadata", [""])[0]))
        with self.lock:
            items = [
                {"id": b.id, "status": {"state": b.state}, "metadata": b.metadata}
                for b in self.boxes.values()
                if not b.deleted and all(b.metadata.get(k) == v for k, v in wanted.items())
            ]
        pagination = {
            "page": 1,
            "pageSize": 200,
            "totalItems": len(items),
            "totalPages": 1,
            "hasNextPage": False,
        }
        data = json.dumps({"items": items, "pagination": pagination}).encode()
        return Reply("list", "json", 200, data)


def _match(server: str, method: str, path: str) -> tuple[str | None, dict[str, str]]:
    routes = {"api": API_ROUTES, "execd": EXECD_ROUTES}.get(server, ())
    for route_method, pattern, route in routes:
        found = pattern.match(path)
        if found and method == route_method:
            return route, found.groupdict()
    return None, {}


def _not_found(box_id: str) -> dict[str, str]:
    return {"code": "DOCKER::SANDBOX_NOT_FOUND", "message": f"Sandbox {box_id} not found."}


def code_events() -> list[bytes]:
    """A healthy ``/code`` run of ``print('ok'); 1 + 1``."""
    return [
        frame(type="init", text="ctx-1"),
        frame(type="ping", text="pong"),
        frame(type="stdout", text="ok\n"),
        frame(type="execution_count", execution_count=1),
        frame(type="result", results={"text": "2"}),
        frame(type="execution_complete", execution_time=3),
    ]


def command_events(run_id: str = "cmd-1") -> list[bytes]:
    """A healthy ``/command`` run of ``echo ok`` (one line per event, no terminator)."""
    return [
        frame(type="init", text=run_id),
        frame(type="stdout", text="ok"),
        frame(type="execution_complete", execution_time=2),
    ]


def _resolve(path: str) -> str:
    """A path as execd takes it: a relative one from its working directory, ``/``."""
    return path if path.startswith("/") else "/" + path


def _entries(files: dict[str, bytes | int]) -> list[str]:
    """Every file of ``files`` and every directory above one, sorted."""
    found = set(files)
    for path in files:
        parts = path.split("/")
        found.update("/".join(parts[:i]) for i in range(2, len(parts)))
    return sorted(found)


def _info(path: str, files: dict[str, bytes | int]) -> dict[str, Any] | None:
    """execd's FileInfo of ``path`` in ``files`` (None when there is no such entry)."""
    path = path.rstrip("/") or "/"
    if path in files:
        content = files[path]
        kind, size, mode = "file", content if isinstance(content, int) else len(content), 644
    elif path in _entries(files):
        kind, size, mode = "directory", 4096, 755
    else:
        return None
    when = "2024-06-10T06:13:20Z"
    return {
        "path": path,
        "type": kind,
        "size": size,
        "modified_at": when,
        "created_at": when,
        "owner": "root",
        "group": "root",
        "mode": mode,
    }


def _download(content: bytes | int, range_header: str | None, box_id: str) -> Reply:
    """A file, whole or from the first byte of ``Range: bytes=N-`` (206, as real execd)."""
    size = content if isinstance(content, int) else len(content)
    start = int(range_header[6:-1]) if range_header and isinstance(content, bytes) else 0
    reply = Reply("download", "bytes", content_type=OCTETS, box_id=box_id)
    if isinstance(content, int):
        return replace(reply, length=content)
    if start:
        headers = {"Content-Range": f"bytes {start}-{size - 1}/{size}"}
        return replace(reply, status=206, body=content[start:], headers=headers)
    return replace(reply, body=content)


def generated(length: int) -> bytes:
    """The first ``length`` bytes of a file generated from ``PATTERN``."""
    return (PATTERN * (length // len(PATTERN) + 1))[:length]


def write_good(h: Handler, reply: Reply, release: threading.Event | None = None) -> None:
    """Send a reply the way a healthy server does (streams chunked, the rest with a length);
    one that drips until ``release``."""
    if reply.drip is not None:
        _drip_reply(h, reply, release or threading.Event())
        return
    if reply.raw is not None:
        h.write(reply.raw)
        h.fin()
        return
    if reply.kind == "stream" and reply.status == 200:
        h.head(200, {"Content-Type": EVENTS, "Transfer-Encoding": "chunked"})
        for event in reply.events:
            h.chunk(event)
        h.write(b"0\r\n\r\n")
        return
    if reply.chunk_size is not None:
        h.head(reply.status, {"Content-Type": reply.content_type, "Transfer-Encoding": "chunked"})
        data = reply.body if reply.length is None else generated(reply.length)
        for start in range(0, len(data), reply.chunk_size):
            h.chunk(data[start : start + reply.chunk_size])
        h.write(b"0\r\n\r\n")
        return
    if reply.length is not None:
        h.head(
            reply.status, {"Content-Type": reply.content_type, "Content-Length": str(reply.length)}
        )
        left = reply.length
        while left > 0:
            h.write(PATTERN[: min(left, len(PATTERN))])
            left -= len(PATTERN)
        return
    h.send_bytes(reply.status, reply.body, reply.content_type, **reply.headers)


# -- faults -----------------------------------------------------------------------------------


@dataclass
class Scene:
    """What a fault writer may use besides the request: the world and this request's release."""

    world: World
    release: threading.Event
    box_id: str  # the sandbox the request names ("" for none)

    @property
    def interrupted(self) -> bool:
        """True once a healthy interrupt named this request's sandbox."""
        with self.world.lock:
            return self.box_id in self.world.interrupted


Writer = Callable[[Handler, Reply, Scene], None]


@dataclass(frozen=True)
class Fault:
    """A misbehaviour. ``processed``: create/delete take effect before the answer goes wrong."""

    name: str
    description: str
    write: Writer
    processed: bool = True
    status_fault: bool = False


def _start(h: Handler, r: Reply) -> None:
    """Headers of a healthy-looking answer: streams chunked, the rest with the true length."""
    if r.kind == "stream":
        h.head(200, {"Content-Type": EVENTS, "Transfer-Encoding": "chunked"})
    else:
        h.head(_ok_status(r), {"Content-Type": r.content_type, "Content-Length": str(len(r.body))})


def _ok_status(r: Reply) -> int:
    return 200 if r.status in (204, 404) else r.status


def _send_half(h: Handler, r: Reply) -> None:
    """The first event and half of the next (streams), or half the body."""
    if r.kind == "stream":
        h.chunk(r.events[0])
        h.chunk(r.events[1][: len(r.events[1]) // 2])
    else:
        h.write(r.body[: len(r.body) // 2])


def _reset_before_response(h: Handler, r: Reply, s: Scene) -> None:
    h.reset()


def _reset_mid_body(h: Handler, r: Reply, s: Scene) -> None:
    _start(h, r)
    _send_half(h, r)
    s.release.wait(0.02)  # let the bytes arrive before the RST
    h.reset()


def _fin_mid_event(h: Handler, r: Reply, s: Scene) -> None:
    h.head(_ok_status(r), {"Content-Type": r.content_type, "Connection": "close"})
    if r.kind == "stream":
        h.write(r.events[0] + r.events[1][: len(r.events[1]) // 2])
    else:
        h.write(r.body[: len(r.body) // 2])
    h.fin()


def _stall_before_headers(h: Handler, r: Reply, s: Scene) -> None:
    s.release.wait(STALL_MAX)
    h.fin()


def _stall_mid_body(h: Handler, r: Reply, s: Scene) -> None:
    _start(h, r)
    _send_half(h, r)
    s.release.wait(STALL_MAX)
    h.fin()


def _end_interrupted_run(h: Handler) -> None:
    """End the stream as execd ends an interrupted run, keeping the connection alive: closing
    it right after a complete answer would race the client's reuse of the pooled connection."""
    h.write(b"0\r\n\r\n")


def _drip(h: Handler, r: Reply, s: Scene) -> None:
    _start(h, r)
    h.chunk(r.events[0])
    slow = frame(type="stdout", text="drip " * 200)
    for i in itertools.count():
        if s.release.wait(DRIP_INTERVAL):
            break
        if s.interrupted:
            _end_interrupted_run(h)
            return
        h.chunk(slow[i % len(slow) : i % len(slow) + 1])
    h.fin()


def _drip_reply(h: Handler, r: Reply, release: threading.Event) -> None:
    """The status line and a header that never ends, or whole headers and a body that never
    does: a byte every DRIP_INTERVAL, well under any read timeout, until ``release``."""
    if r.drip == "head":
        h.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
    else:
        h.head(200, {"Content-Type": r.content_type, "Content-Length": str(1 << 20)})
    while not release.wait(DRIP_INTERVAL):
        h.write(b"d" if r.drip == "head" else b" ")
    h.fin()


def _truncated_chunked(h: Handler, r: Reply, s: Scene) -> None:
    h.head(_ok_status(r), {"Content-Type": r.content_type, "Transfer-Encoding": "chunked"})
    rest = r.body
    if r.kind == "stream":
        h.chunk(r.events[0])
        rest = b"".join(r.events[1:])
    h.write(b"%x\r\n" % (len(rest) + 64) + rest)  # the chunk claims 64 bytes it never sends
    h.fin()


def _lying_cl_long(h: Handler, r: Reply, s: Scene) -> None:
    data = r.payload()
    h.head(_ok_status(r), {"Content-Type": r.content_type, "Content-Length": str(len(data) + 100)})
    h.write(data)
    h.fin()


def _lying_cl_short(h: Handler, r: Reply, s: Scene) -> None:
    data = r.payload()
    h.head(_ok_status(r), {"Content-Type": r.content_type, "Content-Length": str(len(data))})
    try:
        if r.route in SMUGGLE_AT_ONCE:
            h.write(data + SMUGGLED)  # ends in the client's read buffer, with the response
        else:
            h.write(data)
            s.release.wait(SMUGGLE_DELAY)  # lands on the idle socket: reusing it reads a fake 500
            h.write(SMUGGLED)
    finally:
        s.world.smuggled.set()


def _status(code: int, with_body: bool) -> Writer:
    def write(h: Handler, r: Reply, s: Scene) -> None:
        data = b""
        if with_body:
            message = f"upstream failed (request carried {h.carried_secrets()})"
            data = json.dumps({"code": "GENERAL::UNKNOWN_ERROR", "message": message}).encode()
        h.send_bytes(code, data, JSON)

    return write


def _too_many(retry_after: Callable[[], str]) -> Writer:
    def write(h: Handler, r: Reply, s: Scene) -> None:
        data = json.dumps({"code": "RATE_LIMITED", "message": "slow down"}).encode()
        h.send_bytes(429, data, JSON, Retry_After=retry_after())

    return write


def _http_date_in(seconds: float) -> str:
    return email.utils.formatdate(time.time() + seconds, usegmt=True)


HTML_PAGE = (
    "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway"
    "</h1></center><hr><center>nginx</center><!-- {} --></body></html>"
)


def _html_error(h: Handler, r: Reply, s: Scene) -> None:
    h.send_bytes(502, HTML_PAGE.format(h.carried_secrets()).encode(), "text/html")


def _html_200(h: Handler, r: Reply, s: Scene) -> None:
    page = b"<html><body>\n<h1>Welcome</h1>\n<p>Please sign in to continue.</p>\n</body></html>\n"
    h.send_bytes(200, page, "text/html; charset=utf-8")


def _bad_status_line(h: Handler, r: Reply, s: Scene) -> None:
    h.write(b"HTTP/1.1 OK-ish\r\nContent-Length: 0\r\n\r\n")
    h.fin()


def _header_flood(h: Handler, r: Reply, s: Scene) -> None:
    h.write(b"HTTP/1.1 200 OK\r\n")
    for i in range(10_000):  # http.client gives up after 100
        if s.release.is_set():
            break
        h.write(b"X-Filler-%d: %s\r\n" % (i, b"x" * 16))
    h.fin()


def _redirect(h: Handler, r: Reply, s: Scene) -> None:
    status = 302 if h.command == "GET" else 307
    target = f"{s.world.other.url}/stolen?token={TOKEN}"
    h.send_bytes(status, b"", JSON, Location=target)


def _flood(h: Handler, r: Reply, s: Scene) -> None:
    if r.kind == "stream":
        _start(h, r)
        h.chunk(r.events[0])
        piece = frame(type="stdout", text="x" * 4000)
    else:
        h.head(_ok_status(r), {"Content-Type": r.content_type, "Transfer-Encoding": "chunked"})
        if r.kind != "bytes":
            h.chunk(b'{"id": "')
        piece = b"x" * 65536
    for i in itertools.count():
        if i % 16 == 0 and s.release.wait(0.002):  # at most ~0.5 GB/s, until the client quits
            break
        if r.kind == "stream" and s.interrupted:
            _end_interrupted_run(h)
            return
        h.chunk(piece)
    h.fin()


def _oversized_event(h: Handler, r: Reply, s: Scene) -> None:
    if r.kind == "bytes":
        h.send_bytes(200, b"\0" * BIG_EVENT, OCTETS)
        return
    _start(h, r)
    h.chunk(r.events[0])
    big = frame(type="stdout", text="x" * BIG_EVENT)
    for i in range(0, len(big), 16384):
        h.chunk(big[i : i + 16384])
    h.chunk(r.events[-1])
    h.write(b"0\r\n\r\n")


def _shaped(fault: str) -> Writer:
    def write(h: Handler, r: Reply, s: Scene) -> None:
        write_good(h, reshape(fault, r))

    return write


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        Fault("refused", "nothing listens: connect() is refused", _reset_before_response, False),
        Fault(
            "reset_before_response",
            "request read, then TCP RST before any answer byte",
            _reset_before_response,
            False,
        ),
        Fault("reset_mid_body", "headers and part of the body, then TCP RST", _reset_mid_body),
        Fault(
            "fin_mid_event",
            "close-delimited body cut by a clean FIN in the middle of an event/object",
            _fin_mid_event,
        ),
        Fault("stall_before_headers", "request read, then silence", _stall_before_headers),
        Fault("stall_mid_body", "part of the body, then silence", _stall_mid_body),
        Fault(
            "drip",
            f"after init, one byte every {DRIP_INTERVAL} s: under read_timeout, forever",
            _drip,
        ),
        Fault(
            "truncated_chunked",
            "a chunk announces 64 bytes more than it sends, then FIN",
            _truncated_chunked,
        ),
        Fault("lying_cl_long", "Content-Length 100 bytes too large, then FIN", _lying_cl_long),
        Fault(
            "lying_cl_short",
            "more bytes than Content-Length: a smuggled `HTTP/1.1 500` follows the answer "
            f"({SMUGGLE_DELAY} s later, on the idle kept-alive socket, except for create/get)",
            _lying_cl_short,
        ),
        *(
            Fault(
                f"{code}{suffix}",
                f"{code} with {'a JSON error body echoing the credentials' if body else 'no body'}",
                _status(code, body),
                status_fault=True,
            )
            for code in (500, 502, 503, 504)
            for suffix, body in (("", True), ("_empty", False))
        ),
        Fault(
            "429_seconds",
            "429 with `Retry-After: 1`",
            _too_many(lambda: "1"),
            False,
            status_fault=True,
        ),
        Fault(
            "429_date",
            "429 with `Retry-After: <HTTP-date 2 s ahead>`",
            _too_many(lambda: _http_date_in(2)),
            False,
            status_fault=True,
        ),
        Fault(
            "html_error",
            "502 with an nginx HTML page",
            _html_error,
            status_fault=True,
        ),
        Fault(
            "html_200",
            "200 with an HTML page (a captive portal or proxy login page)",
            _html_200,
        ),
        Fault("bad_status_line", "garbage where the status line belongs", _bad_status_line, False),
        Fault("header_flood", "response headers that never end", _header_flood, False),
        Fault(
            "non_json", "200 with a text/plain body, or garbage event lines", _shaped("non_json")
        ),
        Fault("json_list", "a JSON list where an object belongs", _shaped("json_list")),
        Fault(
            "missing_id",
            "object without `id` (events: no init text, no type)",
            _shaped("missing_id"),
        ),
        Fault("missing_status", "sandbox object without `status`", _shaped("missing_status")),
        Fault(
            "wrong_types",
            "fields of the wrong type (numeric id, `endpoint` a number, event fields)",
            _shaped("wrong_types"),
        ),
        Fault("redirect_cross_origin", "302/307 to another origin", _redirect, False),
        Fault("flood", "an endless body / event stream", _flood),
        Fault(
            "oversized_event",
            f"one event (or file) of {BIG_EVENT // 1024} KiB, past the cap",
            _oversized_event,
        ),
        Fault(
            "invalid_utf8",
            "bytes that are not UTF-8 inside an event/object",
            _shaped("invalid_utf8"),
        ),
        Fault(
            "deep_json",
            f"a well-formed object nested {DEEP} levels deep (within every cap)",
            _shaped("deep_json"),
        ),
        Fault(
            "bare_error_eof",
            "a bare `{code, message}` without newline at EOF (200 for JSON routes)",
            _shaped("bare_error_eof"),
        ),
        Fault(
            "events_after_complete",
            "stdout and result events after `execution_complete`",
            _shaped("events_after_complete"),
        ),
    )
}


# -- shapes: well-framed answers with the wrong content -----------------------------------------

BAD_UTF8 = b"\xff\xfe\xc3"
NESTED = b"[" * DEEP + b"]" * DEEP
BARE_ERROR = b'{"code":"RUNTIME_ERROR","message":"error running codes session is busy"}'


def reshape(fault: str, r: Reply) -> Reply:
    """``r`` with the content ``fault`` describes, framed correctly."""
    if r.kind == "stream":
        return replace(r, events=_stream_shape(fault, r.events))
    if r.kind == "bytes":
        return r  # file content is opaque: these faults do not apply
    status = _ok_status(r)
    if fault == "non_json":
        return replace(r, status=status, body=b"OK, done.\n", content_type="text/plain")
    body = _json_shape(fault, r)
    return replace(r, status=status, body=body)


def _json_shape(fault: str, r: Reply) -> bytes:
    original: Any = json.loads(r.body)
    if fault == "json_list":
        return json.dumps([original]).encode()
    if fault == "bare_error_eof":
        return json.dumps({"code": "GENERAL::UNKNOWN_ERROR", "message": "half done"}).encode()
    if fault == "invalid_utf8":
        marked = {**original, "note": "@@BAD@@"}
        return json.dumps(marked).encode().replace(b"@@BAD@@", BAD_UTF8)
    if fault == "deep_json":
        return json.dumps({**original, "note": "@@DEEP@@"}).encode().replace(b'"@@DEEP@@"', NESTED)
    if fault == "missing_id":
        return json.dumps({k: v for k, v in original.items() if k != "id"}).encode()
    if fault == "missing_status":
        return json.dumps({k: v for k, v in original.items() if k != "status"}).encode()
    if fault == "wrong_types":
        if r.route == "endpoint":
            return json.dumps({"endpoint": 44772, "headers": [TOKEN_HEADER]}).encode()
        if r.route == "create":
            return json.dumps({"id": int(r.box_id), "status": "Running"}).encode()
        return json.dumps({"id": r.box_id, "status": {"state": ["Running"]}}).encode()
    raise KeyError(fault)


def _stream_shape(fault: str, events: list[bytes]) -> list[bytes]:
    init, rest = events[0], events[1:]
    if fault == "non_json":
        return [init, b"garbage line\n\n", b"{not json}\n\n", b"data: nope\n\n", *rest]
    if fault == "json_list":
        return [init, b"[1, 2, 3]\n\n", b'data: ["x"]\n\n', b"null\n\n", *rest]
    if fault == "missing_id":
        return [frame(type="init"), b'{"text": "no type"}\n\n', *rest]
    if fault == "wrong_types":
        odd = [
            frame(type="stdout", text=5),
            frame(type=["stdout"], text="x"),
            frame(type="result", results=[1, 2]),
            frame(type="execution_count", execution_count="NaN"),
            frame(type="stderr", text={"a": 1}, timestamp="yesterday"),
            frame(type=None, text="no type"),
        ]
        return [init, *odd, *rest]
    if fault == "invalid_utf8":
        return [init, b'{"type": "stdout", "text": "bad ' + BAD_UTF8 + b'"}\n\n', *rest]
    if fault == "deep_json":
        return [init, b'{"type": "result", "results": ' + NESTED + b"}\n\n", *rest]
    if fault == "bare_error_eof":
        return [init, BARE_ERROR]
    if fault == "events_after_complete":
        late = [frame(type="stdout", text="late\n"), frame(type="result", results={"text": "3"})]
        return [*events, *late]
    raise KeyError(fault)


# -- lies: what an execd replaced by code in its sandbox says, framed correctly -------------------


@dataclass(frozen=True)
class Lie:
    """A well-framed answer that lies, on the routes it names (``World.inject(route, name)``)."""

    name: str
    description: str
    routes: tuple[str, ...]
    tell: Callable[[Reply], Reply]  # the healthy reply -> the lie


def _json_lie(change: Callable[[Any, str], Any]) -> Callable[[Reply], Reply]:
    """A lie told by changing the healthy answer's JSON (``change(data, route)``)."""

    def tell(r: Reply) -> Reply:
        return replace(r, body=json.dumps(change(json.loads(r.body), r.route)).encode())

    return tell


def _first_entry(field_name: str, value: Any) -> Callable[[Reply], Reply]:
    """The first FileInfo of a search, listing or info answer with ``field_name`` = ``value``."""

    def change(data: Any, route: str) -> Any:
        first = data[0] if isinstance(data, list) else next(iter(data.values()))
        first[field_name] = value
        return data

    return _json_lie(change)


# The token rides in the names: an error that names the entry must not show it.
CLIMBING = f"/dir/../../../tmp/{TOKEN}"
ROOTED = f"/dir//etc/{TOKEN}"
HOSTILE_ID = f"../../../v1/sandboxes/sbx-1?{TOKEN}"
CREDENTIAL_ID = f"cmd-{TOKEN}"
CUT_TOKEN = "x" * (121 - 2 - len(TOKEN)) + TOKEN  # repr: its last character the 121st
ID_ROUTES = (
    "context_create", "contexts_list", "context_get", "session_create", "command", "pty_create",
)  # fmt: skip
WRONG_TYPES: dict[str, Any] = {
    "info": {"/dir": ["not", "an", "object"]},
    "search": [{"path": 5, "type": "file", "size": "12"}],
    "list": {"path": "/dir/a.txt"},
    "replace": {"/dir/a.txt": {"replacedCount": "3"}},
    "metrics": {"cpu_count": "2", "cpu_used_pct": [1], "mem_used_mib": True},
    "context_create": {"id": 7, "language": ["python"]},
    "context_get": {"id": None},
    "contexts_list": {"id": "ctx-1", "language": "python"},
    "command_status": {"id": "cmd-1", "running": "false", "exit_code": "0"},
    "session_create": {"session_id": ["sess-1"]},
    "pty_create": {"session_id": 7},
    "pty_status": {"running": "yes", "output_offset": "12"},
}
ABSURD_NUMBERS: dict[str, Any] = {
    "pty_status": {"running": True, "output_offset": -12},
    "metrics": {**METRICS, "cpu_count": -2, "mem_used_mib": float("nan")},
    "replace": {"/dir/a.txt": {"replacedCount": -3}},
}


def _redirect_same_origin(r: Reply) -> Reply:
    """307 (302 to a GET) to the lifecycle route that deletes the sandbox, on execd's origin:
    behind a server proxy (``World.proxied``), the lifecycle API's."""
    status = 302 if r.route in GETS else 307
    location = {"Location": f"/v1/sandboxes/{r.box_id}"}
    return Reply(r.route, "json", status, b"", box_id=r.box_id, headers=location)


@functools.cache
def deflate_bomb() -> bytes:
    """32 MiB of zeros deflated twice: 193 bytes, for ``Content-Encoding: deflate, deflate``."""
    return zlib.compress(zlib.compress(bytes(32 << 20), 9), 9)


def _compressed(r: Reply) -> Reply:
    return Reply(
        r.route,
        "json",
        200,
        deflate_bomb(),
        content_type=r.content_type,
        box_id=r.box_id,
        headers={"Content-Encoding": "deflate, deflate"},
    )


def _wrong_types(r: Reply) -> Reply:
    if r.kind == "stream":
        return replace(r, events=_stream_shape("wrong_types", r.events))
    if r.route == "command_logs":
        return replace(r, headers={LOGS_CURSOR_HEADER: "soon"})
    return replace(r, body=json.dumps(WRONG_TYPES[r.route]).encode())


def _endless_digits(r: Reply) -> Reply:
    return replace(r, headers={LOGS_CURSOR_HEADER: "9" * 5000})


def _absurd_numbers(r: Reply) -> Reply:
    if r.route == "command_logs":
        return replace(r, headers={LOGS_CURSOR_HEADER: "-5"})
    return replace(r, body=json.dumps(ABSURD_NUMBERS[r.route]).encode())


def _with_id(value: str) -> Callable[[Reply], Reply]:
    """The id an answer names (a context's, a session's, a command's init text) is ``value``."""

    def tell(r: Reply) -> Reply:
        if r.kind == "stream":
            return replace(r, events=[frame(type="init", text=value), *r.events[1:]])
        key = "session_id" if r.route in ("session_create", "pty_create") else "id"

        def change(data: Any, route: str) -> Any:
            (data[0] if isinstance(data, list) else data)[key] = value
            return data

        return _json_lie(change)(r)

    return tell


ESCAPES = "\x1b]0;PWNED\x07\x1b[2J\x1b[31m"  # a new window title, a cleared screen, red
RIGHT_TO_LEFT = "\u202e"  # a bidi override (not latin-1: a body's, not a header's)


def _escapes(r: Reply) -> Reply:
    """Terminal escapes (and the token) in a request id, and in an error's message (info) or a
    refused entry (search)."""
    headers = {"X-Request-ID": f"{ESCAPES}{TOKEN}"}
    if r.route == "info":
        message = f"{ESCAPES}{RIGHT_TO_LEFT}{TOKEN}"
        body = json.dumps({"code": f"X{ESCAPES}", "message": message}).encode()
        return replace(r, status=500, body=body, headers=headers)
    return replace(r, body=json.dumps([f"{ESCAPES}{RIGHT_TO_LEFT}bad"]).encode(), headers=headers)


def _token_chunk(r: Reply) -> Reply:
    """A chunked answer whose second chunk-size line is the token (urllib3 quotes it)."""
    head = f"HTTP/1.1 200 OK\r\nContent-Type: {r.content_type}\r\n"
    first = r.events[0] if r.kind == "stream" else b"abc"
    chunk = b"%x\r\n%s\r\n" % (len(first), first)
    raw = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunk + TOKEN.encode()
    return replace(r, raw=raw + b"\r\n")


# A path asked for is answered with another name: the directory /dir as .ssh in a home; asked
# by themselves, its a.txt as .bashrc and its sub/b.txt as "/" (a file with no name).
RENAMED_DIRECTORY = "/home/u/.ssh"
RENAMED_FILES = {"/dir/a.txt": "/home/u/.bashrc", "/dir/sub/b.txt": "/"}


def _renamed(r: Reply) -> Reply:
    def rename(path: str) -> str:
        if r.route == "info" and path in RENAMED_FILES:
            return RENAMED_FILES[path]
        return RENAMED_DIRECTORY + path[4:] if path == "/dir" or path.startswith("/dir/") else path

    def change(data: Any, route: str) -> Any:
        for entry in data if isinstance(data, list) else data.values():
            entry["path"] = rename(entry["path"])
        return data

    return _json_lie(change)(r)


FILE_ROUTES = ("info", "search", "list")
EVERY_EXECD_ROUTE = tuple(route for _, _, route in EXECD_ROUTES)
GETS = tuple(route for method, _, route in EXECD_ROUTES if method == "GET")
# One route of each way the client reads an answer: empty, JSON, a download, an event stream
# (whose body, dripping, is its run's timeout's: FAULTS' drip).
DRIP_BODY_ROUTES = ("ping", "remove", "info", "download")
DRIP_HEAD_ROUTES = (*DRIP_BODY_ROUTES, "code")
PAST_PATH_MAX = "/dir/" + "d/" * 2100 + "f"  # a path of PATH_MAX (4096 bytes) or more names no file
ODD_CHUNK = 10_000
PADDING = 2 << 20  # not a multiple of tarfile's 16 KiB reads
LIES: dict[str, Lie] = {
    lie.name: lie
    for lie in (
        Lie(
            "traversal_name",
            f"an entry named {CLIMBING!r}: `..` climbs out of the directory asked",
            FILE_ROUTES,
            _first_entry("path", CLIMBING),
        ),
        Lie(
            "absolute_remainder",
            f"an entry named {ROOTED!r}: what follows the directory is an absolute path",
            FILE_ROUTES,
            _first_entry("path", ROOTED),
        ),
        Lie(
            "outside_root",
            "a search or listing of /dir that names /etc/passwd",
            ("search", "list"),
            _first_entry("path", "/etc/passwd"),
        ),
        Lie(
            "renamed",
            f"/dir answered as {RENAMED_DIRECTORY!r}, its files asked by themselves as "
            f"{sorted(RENAMED_FILES.values())}: not the name asked (cp's name stays the user's)",
            ("info", "search"),
            _renamed,
        ),
        Lie(
            "past_path_max",
            f"an entry {len(PAST_PATH_MAX)} bytes long, {PAST_PATH_MAX.count('/')} levels deep",
            FILE_ROUTES,
            _first_entry("path", PAST_PATH_MAX),
        ),
        Lie(
            "lone_surrogate",
            'an entry named "/dir/a\\ud800b" (valid JSON, not valid Unicode: no URL or tar '
            "can carry it)",
            FILE_ROUTES,
            _first_entry("path", "/dir/a\ud800b"),
        ),
        Lie("negative_size", "a file of -1 bytes", FILE_ROUTES, _first_entry("size", -1)),
        Lie(
            "understated_size",
            "a file listed as 1 byte long, whose download sends all its bytes",
            FILE_ROUTES,
            _first_entry("size", 1),
        ),
        Lie("huge_size", "a file of 2**70 bytes", FILE_ROUTES, _first_entry("size", 2**70)),
        Lie(
            "wrong_types",
            "JSON values of the wrong type (a string for a number, an object for a list, "
            "a number for an id; events with odd fields; a cursor that is no number)",
            (*WRONG_TYPES, "code", "command", "session_run", "command_logs"),
            _wrong_types,
        ),
        Lie(
            "absurd_numbers",
            "negative and NaN metrics, a negative replace count, a negative logs cursor",
            (*ABSURD_NUMBERS, "command_logs"),
            _absurd_numbers,
        ),
        Lie(
            "endless_digits",
            "a logs cursor of 5000 digits (past what int() reads from a string)",
            ("command_logs",),
            _endless_digits,
        ),
        Lie(
            "hostile_id",
            f"an id the client would put in a later URL: {HOSTILE_ID!r}",
            ID_ROUTES,
            _with_id(HOSTILE_ID),
        ),
        Lie(
            "terminal_escapes",
            "terminal escape sequences (a new window title, a cleared screen, red, "
            "right-to-left) in a request id and in an error's message or a refused entry",
            ("info", "search"),
            _escapes,
        ),
        Lie(
            "credential_id",
            f"an id with the execd token in it ({CREDENTIAL_ID!r}): shown in a repr, by the CLI",
            ID_ROUTES,
            _with_id(CREDENTIAL_ID),
        ),
        Lie(
            "token_chunk",
            "a chunked answer whose chunk-size line is the execd token (urllib3's error quotes it)",
            ("download", "code", "command"),
            _token_chunk,
        ),
        Lie(
            "token_at_the_cut",
            "a refused value whose repr holds the token across the 120th character, where an "
            "error cuts what it shows",
            ("info", "search"),
            lambda r: replace(
                r,
                body=json.dumps(
                    {"/dir": [CUT_TOKEN]} if r.route == "info" else [[CUT_TOKEN]]
                ).encode(),
            ),
        ),
        Lie(
            "odd_chunks",
            f"no lie in the bytes: a download sent chunked, {ODD_CHUNK} bytes a chunk (as a "
            "proxy relays each read of a length-less answer)",
            ("download",),
            lambda r: replace(r, chunk_size=ODD_CHUNK),
        ),
        Lie(
            "redirect_same_origin",
            "307 (302 to a GET) to /v1/sandboxes/<its id> on execd's own origin, which behind "
            "a server proxy is the lifecycle API's",
            EVERY_EXECD_ROUTE,
            _redirect_same_origin,
        ),
        Lie(
            "deflate_bomb",
            "a body of a few hundred bytes, `Content-Encoding: deflate, deflate`, that inflates "
            "to 32 MiB of zeros (a GiB in the same bytes, to urllib3 < 2.6 in one read)",
            EVERY_EXECD_ROUTE,
            _compressed,
        ),
        Lie(
            "padded",
            f"the healthy answer and {PADDING >> 20} MiB of JSON whitespace: past the cap of an "
            "object answer, within a listing's",
            ("info", "metrics", "search"),
            lambda r: replace(r, body=r.body + b" " * PADDING),
        ),
        Lie(
            "drip_head",
            f"the status line, then a header one byte every {DRIP_INTERVAL} s (under any read "
            "timeout), never ending",
            DRIP_HEAD_ROUTES,
            lambda r: replace(r, drip="head"),
        ),
        Lie(
            "drip_body",
            f"whole headers, then a body one byte every {DRIP_INTERVAL} s, never ending",
            DRIP_BODY_ROUTES,
            lambda r: replace(r, drip="body"),
        ),
        Lie(
            "range_ignored",
            "200 and the whole file to a `Range: bytes=N-` request (206 expected)",
            ("download",),
            lambda r: replace(r, status=200, headers={}),
        ),
    )
}
