"""``sandbox.pty``: interactive terminals, execd's ``/pty`` sessions and their WebSocket.

execd has served them since 1.0.10, outside every released spec, and no official SDK speaks
the WebSocket (facts: ``opensandbox-1.1.1.md`` section 2). A session is made dormant
(``POST /pty``) and its process starts on the first connect; it outlives its connections
until it is deleted (execd reaps none), so :meth:`Pty.open` deletes it when its ``with``
block ends, and a connection that dropped can :meth:`PtyConnection.reconnect`.

No gap and no repeat across a reattach: the connection counts the offset of the next output
byte (a replay frame's 8-byte offset plus its length, then every live frame's length) and
reconnects with ``since=`` that offset; a replay that starts before it is cut to it, one that
starts after it (more than execd's 1 MiB ring behind) is counted in ``lost``.

The WebSocket is our own RFC 6455 client (``_websocket``: the runtime dependencies stay
requests and sseclient-py). It connects to execd's origin only (the scheme, host and port of
``sandbox.execd_url``, so the token in ``execd_headers`` goes nowhere else; a redirect is an
error, never followed), verifies TLS as the client's HTTP calls do (``verify`` and ``cert``
of its session and the environment's CA bundle), and does not go through an HTTP proxy.
What execd sends is hostile: a message is at most ``MAX_SERVER_MESSAGE`` bytes, at most
``MAX_BUFFERED`` bytes of output wait for the caller (then nothing more is read: execd is held
back, not buffered for), the handshake's answer comes within the connect's timeout in all,
frames are checked as ``_websocket`` says, and a text frame that is not one of execd's is refused
(``ApiError`` ``INVALID_RESPONSE``, the connection closed) or ignored when its type is unknown.
"""

from __future__ import annotations

import io
import json
import os
import queue
import shlex
import socket
import ssl
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple
from urllib.parse import urlencode, urlsplit

import requests
from requests import certs
from requests.structures import CaseInsensitiveDict

from . import _answers as answers
from . import _websocket as websocket
from ._answers import BadAnswer
from ._constants import MAX_OUTPUT_BYTES
from ._errors import (
    ApiError,
    ConfigurationError,
    OutputLimitExceeded,
    SandboxTimeoutError,
    TransportError,
    error_from_response,
    redact,
)
from ._json import loads

if TYPE_CHECKING:
    from types import TracebackType

    from ._execd import Execd

MAX_SERVER_MESSAGE = (1 << 20) + (64 << 10)  # execd's whole 1 MiB ring in one replay frame
SILENCE = 90.0  # seconds without a frame before a connection counts as dropped (execd pings
# every 30 s)
STDIN, STDOUT, STDERR, REPLAY = 0x00, 0x01, 0x02, 0x03
SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL", "SIGQUIT", "SIGHUP")
TAKEN_OVER = 4001
MAX_ERROR_BODY = 64 << 10
INPUT_FRAME = 64 << 10  # input bytes a frame carries at most
CLOSE_WAIT = 1.0  # seconds a close waits to go out before the connection is cut
MAX_BUFFERED = 4 << 20  # output read from execd and not yet by the caller: the reader waits
_END = object()


class PtyStatus(NamedTuple):
    """``GET /pty/{id}``: whether its process runs, and how many bytes it wrote in all."""

    session_id: str
    running: bool
    output_offset: int


def pty_status(value: Any, session_id: str) -> PtyStatus:
    """Check execd's answer to ``GET /pty/{id}``."""
    data = answers.an_object(value, "the answer")
    running = answers.field(data, "running", answers.a_bool, "the answer")
    offset = answers.field(
        data, "output_offset", lambda v, f: answers.an_int(v, f, 1 << 62), "the answer"
    )
    return PtyStatus(session_id, running, offset)


def shell_command(command: str | None, env: Mapping[str, str] | None) -> str | None:
    """The session's command with ``env`` exported first (``POST /pty`` takes no environment);
    without a command, an interactive shell (bash, else sh).

    Raises:
        ConfigurationError: a variable name that is not a shell identifier, or a NUL.
    """
    if not env:
        return command
    exports = []
    for name, value in env.items():
        if not (isinstance(name, str) and name.isidentifier() and name.isascii()):
            raise ConfigurationError(f"env names must be shell identifiers, got {name!r}")
        if not isinstance(value, str) or "\0" in value:
            raise ConfigurationError(f"env[{name!r}] must be a str without NUL")
        exports.append(f"export {name}={shlex.quote(value)}")
    shell = command or ("command -v bash >/dev/null 2>&1 && exec bash --noprofile --norc; exec sh")
    return "; ".join([*exports, shell])


def until(sock: socket.socket, deadline: float) -> Callable[[int], bytes]:
    """``sock.recv`` bounded by ``deadline`` (``time.monotonic``) in all, not each read by a
    timeout of its own (an answer that drips a byte at a time never lets one expire)."""

    def recv(size: int) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline passed")
        sock.settimeout(left)
        return sock.recv(size)

    return recv


class Output(NamedTuple):
    """What one server frame means for the reader: its kind and fields."""

    kind: str  # "output", "replay", "connected", "exit", "error", "pong", "ignored"
    channel: int = STDOUT
    offset: int = 0
    data: bytes = b""
    exit_code: int | None = None
    code: str = ""
    message: str = ""


def parse_frame(opcode: int, payload: bytes) -> Output:
    """One server message of ``/pty/{id}/ws``, checked (a pure function, tested on bytes).

    Raises:
        BadAnswer: a replay frame without its offset, a text frame that is not a JSON object
            with a string ``type``, an ``exit_code`` that is not an int.
    """
    if opcode == websocket.OP_BINARY:
        if not payload:
            return Output("ignored")
        channel = payload[0]
        if channel in (STDOUT, STDERR):
            return Output("output", channel, data=payload[1:])
        if channel == REPLAY:
            if len(payload) < 9:
                raise BadAnswer("a replay frame", "is shorter than its 8-byte offset")
            offset = struct.unpack("!Q", payload[1:9])[0]
            if offset >> 62:
                raise BadAnswer("a replay frame's offset", "is out of range", offset)
            return Output("replay", offset=offset, data=payload[9:])
        return Output("ignored")
    try:
        message = loads(payload)
    except ValueError:
        raise BadAnswer("a text frame", "is not JSON") from None
    data = answers.an_object(message, "a text frame")
    kind = answers.field(data, "type", answers.a_str, "a text frame")
    if kind == "exit":
        code = answers.field(
            data, "exit_code", lambda v, f: answers.an_int(v, f, 1 << 31, -(1 << 31)), "exit"
        )
        return Output("exit", exit_code=code)
    if kind == "error":
        code_text = answers.field(data, "code", answers.optional(answers.a_str), "error")
        text = answers.field(data, "error", answers.optional(answers.a_str), "error")
        return Output("error", code=(code_text or "")[:100], message=(text or "")[:1000])
    if kind in ("connected", "pong"):
        return Output(kind)
    return Output("ignored")


class Pty:
    """``sandbox.pty``: execd's terminal sessions (see the module docstring)."""

    def __init__(self, execd: Execd):
        self._execd = execd

    def create(
        self,
        command: str | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Make a dormant session and return its id; its process starts on the first connect.

        Args:
            command: what the shell runs (``bash -c COMMAND``); default an interactive shell.
            cwd: its working directory (made, with its parents, when missing).
            env: variables exported before ``command`` runs.

        Raises:
            ConfigurationError: a bad ``command``, ``cwd`` or ``env``.
            ApiError: execd refused (``NotFoundError``: an execd without terminals).
            TransportError: execd could not be reached.
        """
        for name, value in (("command", command), ("cwd", cwd)):
            if value is not None and (not isinstance(value, str) or "\0" in value):
                raise ConfigurationError(f"{name} must be a str without NUL")
        body: dict[str, str] = {}
        full = shell_command(command, env)
        if full:
            body["command"] = full
        if cwd:
            body["cwd"] = cwd
        secrets = self._execd.secrets
        return self._execd.answer(
            "POST", "/pty", lambda v: answers.session_id(v, secrets), json=body, retry=False
        )

    def status(self, session_id: str) -> PtyStatus:
        """Whether the session's process runs, and its output offset.

        Raises:
            NotFoundError: no such session.
            ApiError: execd refused, or answered what is not a status (``INVALID_RESPONSE``).
            TransportError: execd could not be reached.
        """
        return self._execd.answer(
            "GET",
            f"/pty/{answers.in_url(session_id, 'session_id')}",
            lambda v: pty_status(v, session_id),
        )

    def delete(self, session_id: str) -> bool:
        """Kill the session's process group and drop its client; False when it was gone.

        Raises:
            ApiError: execd refused (other than 404).
            TransportError: execd could not be reached.
        """
        try:
            self._execd.request(
                "DELETE", f"/pty/{answers.in_url(session_id, 'session_id')}", retry=False
            ).close()
        except ApiError as exc:
            if exc.status_code == 404:
                return False
            raise
        return True

    def connect(
        self,
        session_id: str,
        *,
        since: int = 0,
        takeover: bool = False,
        pipe: bool = False,
        size: tuple[int, int] | None = None,
        timeout: float | None = None,
    ) -> PtyConnection:
        """Attach to a session (launching its process if none runs) and return the live
        connection, once execd said ``connected``.

        Args:
            session_id: from :meth:`create`.
            since: the output offset to replay from (0: all execd kept).
            takeover: evict the client attached now (it is closed with 4001) instead of 409.
            pipe: no terminal: stdout and stderr apart (only the connect that launches it).
            size: ``(cols, rows)`` to resize to once connected (execd starts at 80x24).
            timeout: seconds to connect and get ``connected`` (default: the client's read
                timeout).

        Raises:
            ApiError: execd refused the upgrade (``NotFoundError``: no such session; 409
                ``ALREADY_CONNECTED``: another client holds it), or its process could not start
                (``code`` ``START_FAILED``), or it broke the protocol (``INVALID_RESPONSE``).
            SandboxTimeoutError: not connected within ``timeout``.
            TransportError: execd could not be reached.
        """
        connection = PtyConnection(self._execd, session_id, pipe=pipe, offset=since)
        connection.attach(takeover=takeover, timeout=timeout)
        if size is not None:
            connection.resize(*size)
        return connection

    def open(
        self,
        command: str | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        size: tuple[int, int] | None = None,
        pipe: bool = False,
        timeout: float | None = None,
    ) -> PtyConnection:
        """:meth:`create` and :meth:`connect` in one; leaving its ``with`` block (or
        :meth:`PtyConnection.close` with ``delete=True``) deletes the session, and so does a
        connect that fails.

        Raises:
            The errors of :meth:`create` and :meth:`connect`.
        """
        session_id = self.create(command, cwd=cwd, env=env)
        try:
            connection = self.connect(session_id, pipe=pipe, size=size, timeout=timeout)
        except BaseException:
            try:
                self.delete(session_id)
            except (ApiError, TransportError):
                pass
            raise
        connection.delete_on_exit = True
        return connection


class PtyConnection:
    """One client connection to a terminal session; thread-safe.

    Attributes:
        session_id: the session.
        offset: the offset of the next output byte (reconnect from here).
        lost: output bytes execd no longer held when a reattach asked for them.
        exit_code: the process's exit status once it exited, else None.
        ended: why the connection ended (``"exited"``, ``"taken over"``, ``"dropped"``,
            ``"closed"``, ``"error"``), None while open.
        close_code: the close code execd (or a proxy) sent, if any.
        error: execd's last error frame (``"CODE: message"``), if any.
        delete_on_exit: leaving a ``with`` block deletes the session too.
    """

    def __init__(self, execd: Execd, session_id: str, *, pipe: bool = False, offset: int = 0):
        self._execd = execd
        self.session_id = session_id
        self.pipe = pipe
        self.offset = offset
        self.lost = 0
        self.exit_code: int | None = None
        self.ended: str | None = None
        self.error: str | None = None
        self.delete_on_exit = False
        self._lock = threading.Lock()
        self._input_lock = threading.Lock()
        self._queue: queue.Queue[tuple[int, Any]] = queue.Queue()
        self._room = threading.Condition()  # guards _buffered; notified as output is read
        self._buffered = 0
        self._halt = threading.Event()  # the current reader's: stop waiting for room
        self._generation = 0
        self._ws: websocket.WebSocket | None = None
        self._reader: threading.Thread | None = None
        self._connected = threading.Event()
        self._failure: BaseException | None = None
        self._saw_connected = False
        self.close_code: int | None = None

    def __repr__(self) -> str:
        return f"PtyConnection(session_id={self.session_id!r}, offset={self.offset})"

    def __enter__(self) -> PtyConnection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(delete=self.delete_on_exit)

    # -- connecting -------------------------------------------------------------------------

    def attach(self, *, takeover: bool = False, timeout: float | None = None) -> None:
        """(Re)connect from :attr:`offset` (see :meth:`Pty.connect` for the errors)."""
        wait = self._execd.read_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        with self._lock:
            self._stop_reader()
            self._generation += 1
            generation = self._generation
            self._connected.clear()
            self._saw_connected = False
            self.close_code = None
            self._failure = None
            self.ended = None
            ws = self._open(takeover, deadline)
            self._ws = ws
            self._halt = halt = threading.Event()
            self._reader = threading.Thread(
                target=self._read, args=(ws, generation, halt), name="osb-pty-reader", daemon=True
            )
            self._reader.start()
        if not self._connected.wait(max(0.0, deadline - time.monotonic())):
            self._abort()
            raise SandboxTimeoutError(
                f"pty session {self.session_id}: execd did not say connected within {wait:g} s"
            )
        if self._failure is not None:
            self._abort()
            raise self._failure
        if not self._saw_connected:
            self._abort()
            hint = ""
            if self.close_code == websocket.POLICY:
                hint = (
                    "; closed with 1008: OpenSandbox's server proxy answers so when execd "
                    "refused the attach (401, 404, or 409 while another client holds the "
                    "session: takeover=True evicts it)"
                )
            raise TransportError(
                f"pty session {self.session_id}: the connection ended before execd said "
                f"connected ({self.ended or 'dropped'}){hint}"
            )

    def reconnect(self, *, takeover: bool = False, timeout: float | None = None) -> None:
        """Attach again after the connection dropped, from :attr:`offset`: output goes on
        with no gap and no repeat. ``takeover``: evict a holder execd has not yet let go.

        Raises:
            The errors of :meth:`Pty.connect`.
        """
        self.attach(takeover=takeover, timeout=timeout)

    def _url(self, takeover: bool) -> tuple[str, str, int, bool]:
        base = urlsplit(self._execd.base_url)
        query: dict[str, str] = {}
        if self.pipe:
            query["pty"] = "0"
        if self.offset:
            query["since"] = str(self.offset)
        if takeover:
            query["takeover"] = "1"
        target = f"{base.path.rstrip('/')}/pty/{answers.in_url(self.session_id, 'session_id')}/ws"
        if query:
            target += "?" + urlencode(query)
        secure = base.scheme == "https"
        port = base.port or (443 if secure else 80)
        return target, base.hostname or "", port, secure

    def _open(self, takeover: bool, deadline: float) -> websocket.WebSocket:
        target, host, port, secure = self._url(takeover)
        secrets = self._execd.secrets
        left = max(0.01, deadline - time.monotonic())
        try:
            sock = socket.create_connection(
                (host, port), timeout=min(self._execd.connect_timeout, left)
            )
        except OSError as exc:
            raise TransportError(
                redact(f"connecting to execd for pty session {self.session_id}: {exc}", secrets)
            ) from None
        try:
            if secure:
                sock = self._tls().wrap_socket(sock, server_hostname=host)
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            key = websocket.new_key()
            netloc = urlsplit(self._execd.base_url).netloc.rpartition("@")[2]
            sock.sendall(websocket.handshake_request(netloc, target, key, self._execd.headers))
            recv = until(sock, deadline)
            answer = websocket.read_answer(recv)
            if answer.status != 101:
                raise self._refused(answer, recv, target)
            websocket.check_upgrade(answer, key)
        except ApiError:
            sock.close()
            raise
        except websocket.ProtocolError as exc:
            sock.close()
            raise ApiError(
                f"GET {target.split('?')[0]}: execd's handshake answer: {exc.reason}",
                status_code=101,
                code="INVALID_RESPONSE",
                message=exc.reason,
            ) from None
        except (OSError, websocket.Closed, ValueError) as exc:
            sock.close()
            if isinstance(exc, socket.timeout):
                raise SandboxTimeoutError(
                    f"pty session {self.session_id}: no WebSocket handshake answer in time"
                ) from None
            raise TransportError(
                redact(f"the WebSocket to execd for pty session {self.session_id}: {exc}", secrets)
            ) from None
        sock.settimeout(SILENCE)
        read = websocket.prefixed(answer.rest, sock.recv)
        return websocket.WebSocket(sock, read, client=True, max_message=MAX_SERVER_MESSAGE)

    def _tls(self) -> ssl.SSLContext:
        verify, cert = self._execd.tls_settings()
        if verify is False:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif isinstance(verify, str):
            if os.path.isdir(verify):
                context = ssl.create_default_context(capath=verify)
            else:
                context = ssl.create_default_context(cafile=verify)
        else:
            context = ssl.create_default_context(cafile=certs.where())  # type: ignore[attr-defined]
        if cert:
            if isinstance(cert, (tuple, list)):
                context.load_cert_chain(cert[0], cert[1])
            else:
                context.load_cert_chain(cert)
        return context

    def _refused(
        self, answer: websocket.Answer, recv: Callable[[int], bytes], target: str
    ) -> ApiError:
        """The ApiError for a handshake answered with another status than 101 (its body read
        at most ``MAX_ERROR_BODY`` bytes; a redirect is not followed)."""
        body = answer.rest
        length = answer.headers.get("content-length", "")
        want = int(length) if length.isdigit() else 0
        try:
            while len(body) < min(want, MAX_ERROR_BODY):
                data = recv(MAX_ERROR_BODY - len(body))
                if not data:
                    break
                body += data
        except OSError:
            pass
        response = requests.Response()
        response.status_code = answer.status
        response.headers = CaseInsensitiveDict(answer.headers)
        response.raw = io.BytesIO(body[:MAX_ERROR_BODY])
        base = urlsplit(self._execd.base_url)
        response.url = f"{base.scheme}://{base.netloc.rpartition('@')[2]}{target}"
        path = urlsplit(response.url).path
        exc = error_from_response(response, "GET", path, self._execd.secrets)
        if 300 <= answer.status < 400:
            exc.args = (f"{exc.args[0]} (a redirect: not followed)",)
        return exc

    # -- reading ----------------------------------------------------------------------------

    def _read(self, ws: websocket.WebSocket, generation: int, halt: threading.Event) -> None:
        """The reader thread: frames into the queue until the connection ends; it reads no
        more while ``MAX_BUFFERED`` bytes wait for the caller (TCP then holds execd back)."""
        ended = "dropped"
        try:
            while True:
                opcode, payload = ws.recv()
                output = parse_frame(opcode, payload)
                if output.kind in ("output", "replay"):
                    self._deliver(output, generation, halt)
                elif output.kind == "connected":
                    self._saw_connected = True
                    self._connected.set()
                elif output.kind == "exit":
                    self.exit_code = output.exit_code
                    ended = "exited"
                elif output.kind == "error":
                    self.error = f"{output.code}: {output.message}"
                    if output.code in ("START_FAILED", "ALREADY_CONNECTED"):
                        self._failure = ApiError(
                            f"pty session {self.session_id}: {self.error}",
                            status_code=101,
                            code=output.code,
                            message=output.message,
                        )
                        ended = "error"
        except websocket.Closed as exc:
            self.close_code = exc.code
            if exc.code == TAKEN_OVER:
                ended = "taken over"
            elif ended == "dropped" and exc.code != websocket.ABNORMAL:
                ended = "closed"
        except BadAnswer as exc:
            self.error = f"INVALID_RESPONSE: {exc.describe(self._execd.secrets)}"
            if not self._saw_connected:  # else the reader's end says it
                self._failure = ApiError(
                    f"pty session {self.session_id}: execd sent {self.error}",
                    status_code=101,
                    code="INVALID_RESPONSE",
                    message=self.error,
                )
            ended = "error"
            ws.fail(websocket.ProtocolError(websocket.PROTOCOL_ERROR, "bad frame"))
        except websocket.ProtocolError as exc:
            self.error = f"INVALID_RESPONSE: {exc.reason}"
            ended = "error"
        except OSError:
            pass
        ws.abort()
        try:
            ws.sock.close()
        except OSError:
            pass
        if generation == self._generation:
            if self.ended is None:
                self.ended = ended
            self._queue.put((generation, _END))
        self._connected.set()  # a wait for connected ends too

    def _deliver(self, output: Output, generation: int, halt: threading.Event) -> None:
        with self._room:  # not before `connected`: only a replay comes first, and output a
            # dropped connection left unread must not keep a reconnect from its answer
            while self._buffered >= MAX_BUFFERED and self._saw_connected and not halt.is_set():
                self._room.wait()
        data = output.data
        if output.kind == "replay":
            if output.offset > self.offset:
                self.lost += output.offset - self.offset
                self.offset = output.offset
            data = data[self.offset - output.offset :]
        self.offset += len(data)
        if data:
            with self._room:
                self._buffered += len(data)
            self._queue.put((generation, data))

    def read(self, timeout: float | None = None) -> bytes | None:
        """The next output (stdout and stderr alike), as it comes; b"" once the connection
        ended (see :attr:`ended`, :attr:`exit_code`); None when nothing came within
        ``timeout`` seconds (default: wait)."""
        while True:
            try:
                generation, item = self._queue.get(timeout=timeout)
            except queue.Empty:
                return None
            if item is _END:
                if generation != self._generation:
                    continue  # the end of a connection a reattach replaced (its output is
                    # shown all the same: the reattach asked for what follows it)
                self._queue.put((generation, item))  # every later read sees the end too
                return b""
            data: bytes = item
            with self._room:
                self._buffered -= len(data)
                self._room.notify_all()
            return data

    def read_all(self, timeout: float, *, max_bytes: int = MAX_OUTPUT_BYTES) -> bytes:
        """Everything until the connection ends, at most ``timeout`` seconds and
        ``max_bytes`` bytes.

        Raises:
            SandboxTimeoutError: it had not ended within ``timeout``.
            OutputLimitExceeded: more than ``max_bytes`` came (``partial``: the first
                ``max_bytes``); the connection stays as it is (close it, or read on).
        """
        deadline = time.monotonic() + timeout
        parts: list[bytes] = []
        held = 0
        while True:
            left = deadline - time.monotonic()
            data = self.read(max(0.0, left)) if left > 0 else None
            if data is None:
                raise SandboxTimeoutError(
                    f"pty session {self.session_id} did not end within {timeout:g} s"
                )
            if not data:
                return b"".join(parts)
            if held + len(data) > max_bytes:
                parts.append(data[: max_bytes - held])
                raise OutputLimitExceeded(
                    f"pty session {self.session_id}: its output passed {max_bytes} bytes before "
                    "it ended (raise max_bytes to allow more)",
                    limit=max_bytes,
                    partial=b"".join(parts),
                )
            parts.append(data)
            held += len(data)

    # -- writing ----------------------------------------------------------------------------

    def _send(self, opcode: int, payload: bytes) -> None:
        ws = self._ws
        if ws is None:
            raise TransportError(f"pty session {self.session_id}: not connected")
        try:
            ws.send(opcode, payload)
        except OSError as exc:
            raise TransportError(
                f"pty session {self.session_id}: the connection is gone ({exc}); reconnect()"
            ) from None

    def send(self, data: bytes | str) -> None:
        """Type ``data`` into the terminal (str as UTF-8; ``"\\x03"`` is Ctrl-C).

        Raises:
            TransportError: the connection is gone (reconnect first).
        """
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        with self._input_lock:  # in frames execd takes (ours caps a message at 1 MiB), in order
            for start in range(0, len(raw), INPUT_FRAME):
                piece = raw[start : start + INPUT_FRAME]
                self._send(websocket.OP_BINARY, bytes([STDIN]) + piece)

    def _send_json(self, message: dict[str, Any]) -> None:
        self._send(websocket.OP_TEXT, json.dumps(message, separators=(",", ":")).encode())

    def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's size (its programs get SIGWINCH); a no-op in pipe mode.

        Raises:
            ConfigurationError: not ints from 1 to 65535.
            TransportError: the connection is gone.
        """
        for name, value in (("cols", cols), ("rows", rows)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
                raise ConfigurationError(f"{name} must be an int from 1 to 65535")
        self._send_json({"type": "resize", "cols": cols, "rows": rows})

    def signal(self, name: str) -> None:
        """Send a signal to the session's process group (SIGINT, SIGTERM, SIGKILL, SIGQUIT or
        SIGHUP: the ones execd accepts).

        Raises:
            ConfigurationError: another name.
            TransportError: the connection is gone.
        """
        if name not in SIGNALS:
            raise ConfigurationError(f"signal must be one of {', '.join(SIGNALS)}")
        self._send_json({"type": "signal", "signal": name})

    # -- ending -----------------------------------------------------------------------------

    def _stop_reader(self) -> None:
        """End the current connection and its reader (the caller holds the lock)."""
        ws, reader = self._ws, self._reader
        self._ws = self._reader = None
        with self._room:
            self._halt.set()
            self._room.notify_all()
        if ws is not None:
            ws.close(websocket.NORMAL, timeout=CLOSE_WAIT)  # an execd that stopped reading
            ws.abort()
        if reader is not None and reader is not threading.current_thread():
            reader.join()

    def _abort(self) -> None:
        with self._lock:
            self._stop_reader()

    def close(self, *, delete: bool = False) -> None:
        """Disconnect (the session goes on: :meth:`reconnect` or connect again later), and
        with ``delete`` delete the session too (its process is killed). Safe to call twice
        and from another thread (a blocked :meth:`read` then returns b"").

        Raises:
            TransportError: with ``delete``, execd could not be reached.
        """
        with self._lock:
            generation = self._generation
            if self.ended is None:
                self.ended = "closed"
            self._stop_reader()
            self._queue.put((generation, _END))
        if delete:
            Pty(self._execd).delete(self.session_id)
