"""Raw HTTP/1.1 over a loopback socket: for requests `requests` refuses to send."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    """A parsed response: status, lower-cased headers and the whole body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


def read_answer(sock: socket.socket, head: bool = False) -> Answer:
    """Read one complete response (`head`: to a HEAD request, without a body).

    Raises:
        AssertionError: the response is malformed or cut short.
    """
    reader = sock.makefile("rb")
    status_line = reader.readline(65537)
    assert status_line.startswith(b"HTTP/1."), status_line[:200]
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := reader.readline(65537)) not in (b"\r\n", b"\n"):
        assert line, "headers cut short"
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if head or status in (204, 304) or 100 <= status < 200:
        return Answer(status, headers, b"")
    if "chunked" in headers.get("transfer-encoding", ""):
        body = b""
        while True:
            size = int(reader.readline(100).split(b";")[0], 16)
            chunk = reader.read(size + 2)
            assert len(chunk) == size + 2 and chunk.endswith(b"\r\n"), "chunk cut short"
            body += chunk[:-2]
            if size == 0:
                break
    else:
        length = int(headers.get("content-length", "0"))
        body = reader.read(length)
        assert len(body) == length, "body cut short"
    return Answer(status, headers, body)


def exchange(port: int, raw: bytes, timeout: float = 10.0) -> Answer:
    """Send `raw` on a fresh connection and read one answer (without closing our side)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(raw)
        return read_answer(sock)


def request(
    method: str,
    path: str,
    port: int,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> bytes:
    """The bytes of a request with Host, Content-Length and `headers`."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    all_headers = {"Content-Length": str(len(body)), **(headers or {})}
    lines += [f"{name}: {value}" for name, value in all_headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
