"""Reverse proxy from `/sandboxes/{id}/proxy/{port}/...` to a port inside the sandbox.

Request and response bodies are streamed; a response without a Content-Length is relayed
chunked, one chunk per upstream read, so event streams pass through live. Like the real server
proxy, credentials meant for the proxy itself are not forwarded.

A WebSocket upgrade (`GET` with `Upgrade: websocket`, execd's terminals at `/pty/{id}/ws`)
passes the same checks (the sandbox's token, a running sandbox), goes up with the same
headers plus the handshake's own, and once the upstream answers 101 the two connections are
joined byte for byte until either ends, each read bounded by the same timeouts as HTTP (the
client's `io_timeout`, the upstream's `UPSTREAM_TIMEOUT`; execd pings every 30 s). The frames
are the endpoints' to check. An upstream that refuses the handshake (401, 404, 409) is
relayed as the HTTP answer it is; the released server proxy accepts the socket instead and
closes it with 1008, losing the status (opensandbox-1.1.1.md 2.2): ours keeps it. A handshake
with a body is refused (400: it would go up as WebSocket bytes), and an interim answer (1xx)
other than the 101 to a handshake is a 502: it has no body, so what followed it would be taken
for the answer to the client's next request.
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Callable

from ... import _websocket as websocket
from ..http.exchange import Exchange, HttpError, error
from .container import SandboxContainer
from .validation import issue, unprocessable

EXECD_PORT = 44772  # execd's in every sandbox: the proxy passes the sandbox's token on there
# The egress sidecar's API: served by the server itself (`network.py`), behind its own token.
EGRESS_PORT = 18080
EGRESS_HEADER = "OPENSANDBOX-EGRESS-AUTH"
PIECE = 1 << 16
UPSTREAM_TIMEOUT = 180.0
NOT_FORWARDED = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "open-sandbox-api-key",
    "authorization",
    "cookie",
    "x-execd-access-token",
}
NO_BODY = {204, 304}
UPGRADE_ANSWER = (
    "upgrade", "connection", "sec-websocket-accept", "sec-websocket-protocol",
    "sec-websocket-extensions",
)  # fmt: skip
REFUSAL_BODY = 1 << 20  # what a refused handshake's answer body may weigh
SET_BY_THIS_SERVER = {"server", "date", "x-request-id"}  # one of each in an answer


def port_number(raw: str) -> int:
    """The port of a proxy path; 400 unless it is a number from 1 to 65535."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 5 or not 1 <= int(raw) <= 65535:
        raise error(
            400, "DOCKER::INVALID_PORT", f"Port {raw[:20]!r} must be a number from 1 to 65535."
        )
    return int(raw)


def endpoint_port(raw: str) -> int:
    """The port of an endpoint path: 422 unless digits, 400 unless from 1 to 65535."""
    if not (raw.isascii() and raw.isdigit()):
        message = "Input should be a valid integer, unable to parse string as an integer"
        raise unprocessable([issue("int_parsing", ["path", "port"], message, raw)])
    if len(raw) > 5 or not 1 <= int(raw) <= 65535:
        raise error(400, "DOCKER::INVALID_PORT", f"Port {raw[:20]} must be between 1 and 65535.")
    return int(raw)


def unreachable(sandbox_id: str, detail: object) -> HttpError:
    """The real server proxy's 502 when the sandbox cannot be reached."""
    return error(
        502,
        "GENERAL::UNKNOWN_ERROR",
        f"Could not connect to the backend sandbox {sandbox_id}: {detail}",
    )


def forward(
    ex: Exchange,
    container: SandboxContainer,
    sandbox_id: str,
    port: int,
    path: str,
    extra: dict[str, str],
) -> None:
    """Send `ex` to 127.0.0.1:`port` in the sandbox (adding `extra` headers), relay the answer.

    The request body goes up from its own thread, so an answer that comes before the whole
    body (a 400 for a bad upload, while the client waits for it) is relayed at once.
    """
    try:
        sock = container.connect(port)
    except OSError as exc:
        raise unreachable(sandbox_id, exc) from None
    if is_upgrade(ex):
        with sock:
            _upgrade(ex, sock, sandbox_id, port, path, extra)
        return
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=UPSTREAM_TIMEOUT)
    conn.sock = sock
    sock.settimeout(UPSTREAM_TIMEOUT)
    body = _BodyPump(ex, sock)
    try:
        body.start(_send_head(ex, conn, port, path, extra))
        response = conn.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        body.stop()
        conn.close()
        raise unreachable(sandbox_id, exc) from None
    if response.status < 200:
        # an interim answer nobody asked for (a 101 without an upgrade): it has no body, so
        # whatever followed it would answer the client's next request on this connection
        body.stop()
        conn.close()
        raise unreachable(sandbox_id, f"an interim answer {response.status} to a plain request")
    if not ex.body.finished:
        # The upstream answered before the whole body came (it may never read it): the
        # connection cannot carry another request, and the answer has to say so.
        ex.handler.close_connection = True
    try:
        _relay(ex, response)
    finally:
        body.stop()
        conn.close()


class _BodyPump:
    """Copies the request body to the upstream in a thread (see `forward`)."""

    def __init__(self, ex: Exchange, upstream: socket.socket) -> None:
        self._ex = ex
        self._upstream = upstream
        self._thread: threading.Thread | None = None
        self._failure: HttpError | None = None

    def start(self, chunked: bool) -> None:
        """Start copying, unless the request has no body."""
        if not self._ex.body.finished:
            self._thread = threading.Thread(target=self._copy, args=(chunked,), daemon=True)
            self._thread.start()

    def _copy(self, chunked: bool) -> None:
        try:
            while data := self._ex.body.read(PIECE):
                self._upstream.sendall(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            if chunked:
                self._upstream.sendall(b"0\r\n\r\n")
        except HttpError as exc:  # a broken body: answer the client, not the upstream
            self._failure = exc
            _quietly(self._upstream.shutdown, socket.SHUT_RDWR)
        except OSError:
            pass  # the upstream stopped reading or the client stalled: the answer says which

    def stop(self) -> None:
        """End the copy (the exchange with the upstream is over) and wait for its thread.

        A client whose body is still coming is cut off (its connection closes after the
        answer); an upstream that stopped reading is shut down, so no send stays blocked.

        Raises:
            HttpError: the client's body was malformed (and nothing was answered yet).
        """
        if self._thread is None:
            return
        if self._thread.is_alive():
            if not self._ex.body.finished:
                self._ex.handler.close_connection = True
                _quietly(self._ex.handler.connection.shutdown, socket.SHUT_RD)
            _quietly(self._upstream.shutdown, socket.SHUT_RDWR)
        self._thread.join()
        if self._failure is not None and not self._ex.responded:
            raise self._failure


def _quietly(action: Callable[[int], None], how: int) -> None:
    try:
        action(how)
    except OSError:
        pass


def _send_head(
    ex: Exchange, conn: http.client.HTTPConnection, port: int, path: str, extra: dict[str, str]
) -> bool:
    """Send the request line and headers; True when the body goes up chunked."""
    target = path + (f"?{ex.raw_query}" if ex.raw_query else "")
    conn.putrequest(ex.method, target, skip_host=True, skip_accept_encoding=True)
    for name, value in ex.headers.items():
        if name.lower() not in NOT_FORWARDED:
            conn.putheader(name, value)
    conn.putheader("Host", f"127.0.0.1:{port}")
    conn.putheader("X-Forwarded-For", ex.handler.client_address[0])
    conn.putheader("X-Forwarded-Host", ex.headers.get("Host") or "")
    conn.putheader("X-Forwarded-Proto", "http")
    conn.putheader("Connection", "close")
    for name, value in extra.items():
        conn.putheader(name, value)
    chunked = "chunked" in (ex.headers.get("Transfer-Encoding") or "").lower()
    if chunked:
        conn.putheader("Transfer-Encoding", "chunked")
    elif ex.headers.get("Content-Length"):
        conn.putheader("Content-Length", ex.headers["Content-Length"])
    conn.endheaders()
    return chunked


def _relay(ex: Exchange, response: http.client.HTTPResponse) -> None:
    headers = [
        (k, v)
        for k, v in response.getheaders()
        if (k.lower() not in NOT_FORWARDED or k.lower() == "content-length")
        and k.lower() not in SET_BY_THIS_SERVER
    ]
    if ex.method == "HEAD" or response.status in NO_BODY:
        ex.start(response.status, headers)
        return
    if response.getheader("Content-Length") is not None and not response.chunked:
        ex.start(response.status, headers)
        while data := response.read(PIECE):
            ex.handler.wfile.write(data)
        ex.handler.wfile.flush()
        return
    writer = ex.start_chunked(
        response.status, [(k, v) for k, v in headers if k.lower() != "content-length"]
    )
    try:
        while data := response.read1(PIECE):
            writer.write(data)
    except http.client.IncompleteRead:
        # The upstream broke off mid-answer (seen with real execd, its client gone):
        # so does this answer, without the last chunk that would say it is complete.
        ex.handler.close_connection = True
        return
    writer.end()


def is_upgrade(ex: Exchange) -> bool:
    """Whether `ex` asks for a WebSocket (`GET`, `Upgrade: websocket`, `Connection: upgrade`)."""
    tokens = {
        item.strip().lower()
        for value in ex.headers.get_all("Connection") or []
        for item in value.split(",")
    }
    upgrade = (ex.headers.get("Upgrade") or "").strip().lower()
    return ex.method == "GET" and upgrade == "websocket" and "upgrade" in tokens


def _upgrade(
    ex: Exchange,
    upstream: socket.socket,
    sandbox_id: str,
    port: int,
    path: str,
    extra: dict[str, str],
) -> None:
    """Relay a WebSocket handshake and then its bytes (see the module docstring)."""
    if ex.headers.get("Transfer-Encoding") or ex.headers.get("Content-Length", "0") != "0":
        # it would go up as the WebSocket's first bytes: frames nobody checked as a request
        raise error(400, "INVALID_REQUEST", "a WebSocket handshake has no body")
    target = path + (f"?{ex.raw_query}" if ex.raw_query else "")
    lines = [f"GET {target} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    for name, value in ex.headers.items():  # Sec-WebSocket-Key and -Version among them
        if name.lower() not in NOT_FORWARDED:
            lines.append(f"{name}: {value}")
    lines += [
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"X-Forwarded-For: {ex.handler.client_address[0]}",
        f"X-Forwarded-Host: {ex.headers.get('Host') or ''}",
        "X-Forwarded-Proto: http",
        *(f"{name}: {value}" for name, value in extra.items()),
    ]
    upstream.settimeout(UPSTREAM_TIMEOUT)
    try:
        upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        answer = websocket.read_answer(upstream.recv)
    except (OSError, websocket.ProtocolError, websocket.Closed) as exc:
        raise unreachable(sandbox_id, exc) from None
    if answer.status < 200 and answer.status != 101:  # no answer at all: relayed, it has no end
        raise unreachable(sandbox_id, f"an interim answer {answer.status} to a handshake")
    if answer.status != 101:
        _refused(ex, upstream, answer)
        return
    headers = {name: value for name, value in answer.headers.items() if name in UPGRADE_ANSWER}
    ex.handler.close_connection = False  # a 101 says Connection: Upgrade, not close
    ex.start(101, headers)
    ex.handler.wfile.flush()
    ex.handler.close_connection = True  # the connection is the WebSocket's now
    client = ex.handler.connection
    if answer.rest:
        client.sendall(answer.rest)
    back = threading.Thread(target=_pump, args=(upstream.recv, client), daemon=True)
    back.start()
    _pump(ex.handler.rfile.read1, upstream)  # type: ignore[attr-defined]
    _quietly(client.shutdown, socket.SHUT_RDWR)
    back.join()


def _pump(read: Callable[[int], bytes], target: socket.socket) -> None:
    """Copy until EOF, a timeout or an error on either side, then end `target` both ways."""
    try:
        while data := read(PIECE):
            target.sendall(data)
    except OSError:
        pass
    _quietly(target.shutdown, socket.SHUT_RDWR)


def _refused(ex: Exchange, upstream: socket.socket, answer: websocket.Answer) -> None:
    """Relay a refused handshake's answer (its body at most `REFUSAL_BODY` bytes)."""
    length = answer.headers.get("content-length", "")
    want = min(int(length), REFUSAL_BODY) if length.isdigit() and len(length) < 12 else 0
    body = answer.rest[:want]
    try:
        while len(body) < want:
            data = upstream.recv(want - len(body))
            if not data:
                break
            body += data
    except OSError:
        pass
    headers = {}
    for name in ("content-type", "www-authenticate", "retry-after"):
        if name in answer.headers:
            headers[name.title()] = answer.headers[name]
    ex.handler.close_connection = True
    ex.send(answer.status, body, headers)
