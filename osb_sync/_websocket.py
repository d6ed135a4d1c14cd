"""RFC 6455 WebSockets over a socket we hold: frames, messages and the opening handshake.

Standard library only, and Python 3.9: the local execd imports this module inside a sandbox
(as it imports ``_json``), so both ends of ``/pty/{id}/ws`` speak one implementation, and the
client's end is also tested against RFC 6455's own examples (section 5.7).

Every frame from the peer is hostile until checked (a sandbox's execd sends them to the
client; any sandbox process may connect to execd):

- a frame's length is checked against ``max_message`` (the whole message's, fragments added
  up) before a byte of its payload is read; a 64-bit length with its top bit set is refused;
  a message may take at most ``MAX_FRAGMENTS`` frames (empty fragments add no bytes);
- RSV bits without an extension, an unknown opcode, a control frame that is fragmented or
  longer than 125 bytes, a masked frame to a client or an unmasked one to a server, a
  continuation with no message started, a data frame inside a fragmented message, text that
  is not UTF-8 and a close frame with a code that may not travel are each a
  :class:`ProtocolError` carrying the close code to answer with (1002, 1007, 1009);
- a ping is answered with a pong of the same payload; a close is echoed, then the connection
  ends (:class:`Closed`, with the peer's code and reason; 1006 when it ended with no close).

A :class:`WebSocket` is read by one thread at a time and written by any (sends hold a lock);
``abort`` from any thread ends a blocked read.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import struct
import threading
from typing import Callable, NamedTuple

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
OP_CONTINUATION = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA
DATA_OPCODES = (OP_TEXT, OP_BINARY)
CONTROL_OPCODES = (OP_CLOSE, OP_PING, OP_PONG)
MAX_CONTROL = 125
NORMAL = 1000
GOING_AWAY = 1001
PROTOCOL_ERROR = 1002
NO_STATUS = 1005  # a close frame without a code (never sent)
ABNORMAL = 1006  # the connection ended without a close frame (never sent)
INVALID_DATA = 1007
POLICY = 1008
TOO_BIG = 1009
INTERNAL = 1011
MAX_HEAD = 16 * 1024  # the handshake answer's head, status line and headers
FAIL_WAIT = 1.0  # seconds a close after a protocol error may take: the connection is cut then
MAX_FRAGMENTS = 4096  # frames read while one message is incomplete (its fragments, pings)


class ProtocolError(Exception):
    """The peer broke RFC 6455: ``code`` is the close code to answer with."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"WebSocket protocol error ({code}): {reason}")
        self.code = code
        self.reason = reason


class Closed(Exception):
    """The connection is over: the peer's close ``code`` and ``reason`` (1006: no close frame)."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(f"WebSocket closed ({code}{': ' + reason if reason else ''})")
        self.code = code
        self.reason = reason


class Frame(NamedTuple):
    """One frame as read: FIN bit, opcode and the unmasked payload."""

    fin: bool
    opcode: int
    payload: bytes


def accept_key(key: str) -> str:
    """The ``Sec-WebSocket-Accept`` value that answers the ``Sec-WebSocket-Key`` ``key``."""
    digest = hashlib.sha1((key.strip() + GUID).encode("ascii")).digest()  # noqa: S324 (RFC 6455)
    return base64.b64encode(digest).decode("ascii")


def new_key() -> str:
    """A fresh ``Sec-WebSocket-Key``: 16 random bytes, base64."""
    return base64.b64encode(os.urandom(16)).decode("ascii")


def valid_key(key: str) -> bool:
    """Whether ``key`` is base64 of 16 bytes, as RFC 6455 4.2.1 requires."""
    try:
        return len(base64.b64decode(key.strip().encode("ascii"), validate=True)) == 16
    except (ValueError, UnicodeEncodeError):
        return False


def mask_bytes(payload: bytes, mask: bytes) -> bytes:
    """``payload`` XOR the 4-byte ``mask`` repeated (masking and unmasking alike)."""
    if not payload:
        return b""
    size = len(payload)
    repeated = (mask * (size // 4 + 1))[:size]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(size, "big")


def encode_frame(
    opcode: int, payload: bytes, *, fin: bool = True, mask: bytes | None = None
) -> bytes:
    """One frame on the wire; ``mask`` (4 bytes) masks it, as a client must."""
    head = bytearray([(0x80 if fin else 0) | opcode])
    size = len(payload)
    mask_bit = 0x80 if mask is not None else 0
    if size < 126:
        head.append(mask_bit | size)
    elif size < 1 << 16:
        head.append(mask_bit | 126)
        head += struct.pack("!H", size)
    else:
        head.append(mask_bit | 127)
        head += struct.pack("!Q", size)
    if mask is None:
        return bytes(head) + payload
    return bytes(head) + mask + mask_bytes(payload, mask)


def close_payload(code: int, reason: str = "") -> bytes:
    """A close frame's payload: the code, then the reason cut to fit 125 bytes in all."""
    data = reason.encode("utf-8")[: MAX_CONTROL - 2]
    return struct.pack("!H", code) + data.decode("utf-8", "ignore").encode("utf-8")


def sendable_code(code: int) -> bool:
    """Whether a close code may travel on the wire (RFC 6455 7.4: 1000-1003, 1007-1014,
    3000-4999)."""
    return code in (1000, 1001, 1002, 1003) or 1007 <= code <= 1014 or 3000 <= code <= 4999


def parse_close(payload: bytes) -> tuple[int, str]:
    """The code and reason of a close frame's payload (1005 when it has none).

    Raises:
        ProtocolError: one byte, a code that may not travel, or a reason that is not UTF-8.
    """
    if not payload:
        return NO_STATUS, ""
    if len(payload) == 1:
        raise ProtocolError(PROTOCOL_ERROR, "a close frame with a one-byte payload")
    code = struct.unpack("!H", payload[:2])[0]
    if not sendable_code(code):
        raise ProtocolError(PROTOCOL_ERROR, f"close code {code} may not be sent")
    try:
        reason = payload[2:].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(INVALID_DATA, "a close reason that is not UTF-8") from None
    return code, reason


def prefixed(rest: bytes, read: Callable[[int], bytes]) -> Callable[[int], bytes]:
    """A reader that returns ``rest`` (bytes that came after a handshake's head) first."""
    left = [rest]

    def take(size: int) -> bytes:
        if left[0]:
            data, left[0] = left[0][:size], left[0][size:]
            return data
        return read(size)

    return take


def read_exact(read: Callable[[int], bytes], size: int) -> bytes:
    """``size`` bytes from ``read`` (which returns what it has, b"" at EOF).

    Raises:
        Closed: 1006, the connection ended first.
    """
    parts = []
    left = size
    while left:
        data = read(left)
        if not data:
            raise Closed(ABNORMAL, "the connection ended without a close frame")
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def read_frame(read: Callable[[int], bytes], max_size: int, masked: bool) -> Frame:
    """Read one frame, checking its head before its payload (see the module docstring).

    Args:
        read: returns up to n bytes, b"" at EOF.
        max_size: the largest payload to accept.
        masked: whether the peer must mask (it is a client).

    Raises:
        ProtocolError: the frame breaks the rules (its close code says which).
        Closed: 1006, the connection ended mid-frame.
    """
    first, second = read_exact(read, 2)
    fin, opcode = bool(first & 0x80), first & 0x0F
    if first & 0x70:
        raise ProtocolError(PROTOCOL_ERROR, "RSV bits set without an extension")
    if opcode not in (OP_CONTINUATION, *DATA_OPCODES, *CONTROL_OPCODES):
        raise ProtocolError(PROTOCOL_ERROR, f"unknown opcode {opcode:#x}")
    if bool(second & 0x80) != masked:
        which = "an unmasked frame from a client" if masked else "a masked frame from a server"
        raise ProtocolError(PROTOCOL_ERROR, which)
    size = second & 0x7F
    if opcode in CONTROL_OPCODES and (not fin or size > MAX_CONTROL):
        raise ProtocolError(PROTOCOL_ERROR, "a control frame fragmented or over 125 bytes")
    if size == 126:
        size = struct.unpack("!H", read_exact(read, 2))[0]
    elif size == 127:
        size = struct.unpack("!Q", read_exact(read, 8))[0]
        if size >> 63:
            raise ProtocolError(PROTOCOL_ERROR, "a 64-bit length with its top bit set")
    if opcode not in CONTROL_OPCODES and size > max_size:  # a control frame: 125 at most
        raise ProtocolError(TOO_BIG, f"a frame of {size} bytes (at most {max_size})")
    mask = read_exact(read, 4) if masked else None
    payload = read_exact(read, size)
    return Frame(fin, opcode, mask_bytes(payload, mask) if mask else payload)


class WebSocket:
    """One open WebSocket connection (after the handshake), either end.

    Args:
        sock: the connected socket (its timeout bounds each read and write).
        read: returns up to n bytes of what arrives, b"" at EOF (default: ``sock.recv``;
            a server passes its buffered reader, which may hold bytes read past the head).
        client: this end is the client (it masks what it sends, and the peer must not).
        max_message: the largest message accepted, fragments added up.
    """

    def __init__(
        self,
        sock: socket.socket,
        read: Callable[[int], bytes] | None = None,
        *,
        client: bool,
        max_message: int,
    ) -> None:
        self.sock = sock
        self._read = read or sock.recv
        self._client = client
        self.max_message = max_message
        self._send_lock = threading.Lock()
        self._close_sent = False
        self.close_received: tuple[int, str] | None = None

    def send(self, opcode: int, payload: bytes) -> None:
        """Send one unfragmented frame (thread-safe).

        Raises:
            OSError: the connection is broken, or a close was already sent.
        """
        mask = os.urandom(4) if self._client else None
        data = encode_frame(opcode, payload, mask=mask)
        with self._send_lock:
            if self._close_sent:
                raise BrokenPipeError("the WebSocket is closing")
            self.sock.sendall(data)

    def send_binary(self, payload: bytes) -> None:
        """Send a binary message."""
        self.send(OP_BINARY, payload)

    def send_text(self, text: str) -> None:
        """Send a text message."""
        self.send(OP_TEXT, text.encode("utf-8"))

    def ping(self, payload: bytes = b"") -> None:
        """Send a ping control frame (the peer answers with a pong)."""
        self.send(OP_PING, payload)

    def close(self, code: int = NORMAL, reason: str = "", timeout: float | None = None) -> None:
        """Send a close frame once (later calls, and a broken connection, are no-ops).

        ``timeout``: seconds to wait for a send in progress and to send the close, after which
        it is given up (a peer that stopped reading; the caller then aborts). Default: the
        socket's own timeout.
        """
        mask = os.urandom(4) if self._client else None
        if not self._send_lock.acquire(timeout=-1 if timeout is None else timeout):
            return
        try:
            if self._close_sent:
                return
            self._close_sent = True
            try:
                if timeout is not None:
                    self.sock.settimeout(timeout)
                self.sock.sendall(encode_frame(OP_CLOSE, close_payload(code, reason), mask=mask))
            except OSError:
                pass
        finally:
            self._send_lock.release()

    def abort(self) -> None:
        """End the connection at once, both ways (a blocked read returns); from any thread."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def fail(self, exc: ProtocolError) -> None:
        """Close with ``exc``'s code (waiting at most ``FAIL_WAIT`` s to send it), then end
        the connection (after a protocol error)."""
        self.close(exc.code, exc.reason, timeout=FAIL_WAIT)
        self.abort()

    def recv(self) -> tuple[int, bytes]:
        """The next message: ``(OP_TEXT or OP_BINARY, payload)``; pings are answered here.

        Raises:
            Closed: the peer closed (its close was echoed), or the connection ended (1006).
            ProtocolError: the peer broke the protocol (a close with its code was sent).
            OSError: a read timed out or failed.
        """
        opcode = None
        parts: list[bytes] = []
        size = 0
        frames = 0
        while True:
            if frames > MAX_FRAGMENTS:  # empty fragments or pings add no bytes: no end
                endless = ProtocolError(TOO_BIG, f"a message in over {MAX_FRAGMENTS} frames")
                self.fail(endless)
                raise endless
            if opcode is not None:
                frames += 1
            try:
                frame = read_frame(self._read, self.max_message - size, not self._client)
            except ProtocolError as exc:
                self.fail(exc)
                raise
            if frame.opcode == OP_PING:
                try:
                    self.send(OP_PONG, frame.payload)
                except OSError:
                    pass
                continue
            if frame.opcode == OP_PONG:
                continue
            if frame.opcode == OP_CLOSE:
                try:
                    code, reason = parse_close(frame.payload)
                except ProtocolError as exc:
                    self.fail(exc)
                    raise
                self.close_received = (code, reason)
                self.close(NORMAL if code == NO_STATUS else code)
                raise Closed(code, reason)
            if (frame.opcode == OP_CONTINUATION) != (opcode is not None):
                broken = ProtocolError(
                    PROTOCOL_ERROR,
                    "a continuation with no message started"
                    if opcode is None
                    else "a new message inside a fragmented one",
                )
                self.fail(broken)
                raise broken
            if opcode is None:
                opcode = frame.opcode
            parts.append(frame.payload)
            size += len(frame.payload)
            if frame.fin:
                data = b"".join(parts)
                if opcode == OP_TEXT:
                    try:
                        data.decode("utf-8")
                    except UnicodeDecodeError:
                        bad = ProtocolError(INVALID_DATA, "a text message that is not UTF-8")
                        self.fail(bad)
                        raise bad from None
                return opcode, data


def handshake_request(host: str, target: str, key: str, headers: dict[str, str]) -> bytes:
    """The client's opening handshake (RFC 6455 4.1) for ``target`` on ``host``, with
    ``headers`` added (values must not hold CR or LF: checked here).

    Raises:
        ValueError: a header name or value would split the request head.
    """
    lines = [
        f"GET {target} HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    for name, value in headers.items():
        if any(c in f"{name}{value}" for c in "\r\n\0") or ":" in name:
            raise ValueError(f"header {name[:40]!r} cannot be sent")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Answer(NamedTuple):
    """The handshake's answer: status, headers (names lower-cased) and what followed its head."""

    status: int
    headers: dict[str, str]
    rest: bytes


def read_answer(recv: Callable[[int], bytes]) -> Answer:
    """Read the server's answer head to a handshake (at most ``MAX_HEAD`` bytes).

    Raises:
        ProtocolError: no HTTP status line, or a head over ``MAX_HEAD`` bytes (1002).
        Closed: 1006, the connection ended before the head did.
    """
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD:
            raise ProtocolError(PROTOCOL_ERROR, f"an answer head over {MAX_HEAD} bytes")
        chunk = recv(4096)
        if not chunk:
            raise Closed(ABNORMAL, "the connection ended before the handshake's answer")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    if len(head) > MAX_HEAD:
        raise ProtocolError(PROTOCOL_ERROR, f"an answer head over {MAX_HEAD} bytes")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(PROTOCOL_ERROR, f"not an HTTP status line: {lines[0][:60]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return Answer(int(parts[1]), headers, rest)


def check_upgrade(answer: Answer, key: str) -> None:
    """Whether a 101 answer accepts the handshake made with ``key`` (RFC 6455 4.2.2).

    Raises:
        ProtocolError: a header is missing or wrong (1002).
    """
    if answer.headers.get("upgrade", "").lower() != "websocket":
        raise ProtocolError(PROTOCOL_ERROR, "the answer's Upgrade header is not websocket")
    tokens = [t.strip().lower() for t in answer.headers.get("connection", "").split(",")]
    if "upgrade" not in tokens:
        raise ProtocolError(PROTOCOL_ERROR, "the answer's Connection header lacks upgrade")
    if answer.headers.get("sec-websocket-accept") != accept_key(key):
        raise ProtocolError(PROTOCOL_ERROR, "the answer's Sec-WebSocket-Accept does not match")
    if answer.headers.get("sec-websocket-extensions") or answer.headers.get(
        "sec-websocket-protocol"
    ):
        raise ProtocolError(PROTOCOL_ERROR, "the answer names an extension or subprotocol")
