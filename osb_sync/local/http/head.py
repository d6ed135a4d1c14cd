"""A request head on the wire: read under a size cap, then parsed as RFC 9112 says.

Both steps are pure of sockets (they take a reader or bytes), so they are tested on bytes and
against h11 (tests/local/test_http_oracle.py, where every difference is listed with why). The
rules, stricter than `http.server` (which splits the request line on any whitespace, allows
100 headers of 64 KiB each and takes `Name : value`):

- the head is at most `max_bytes` in all and `MAX_FIELDS` header lines (431 past either);
- the request line is `METHOD SP target SP HTTP/d.d`, single spaces, the target visible
  ASCII only (a raw non-ASCII byte, a control character or DEL is a 400 here, before any
  route or proxy sees it); versions other than 1.0 and 1.1 are a 505;
- header lines are `token ":" OWS value OWS`, the value visible characters (obs-text, bytes
  0x80-0xFF, read as Latin-1) with single spaces or tabs inside; folded lines (obs-fold)
  and control characters are a 400 (RFC 9112 5.2 allows refusing them);
- lines end with CRLF or a bare LF (RFC 9112 2.2); a bare CR is a 400, and so is a blank
  line before the request line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

MAX_FIELDS = 100
TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
REQUEST_LINE = re.compile(
    rb"(?P<method>" + TOKEN + rb") (?P<target>[\x21-\x7e]+) HTTP/(?P<version>[0-9]\.[0-9])"
)
FIELD_LINE = re.compile(
    rb"(?P<name>" + TOKEN + rb"):[ \t]*"
    rb"(?P<value>(?:[\x21-\x7e\x80-\xff]+(?:[ \t]+[\x21-\x7e\x80-\xff]+)*)?)[ \t]*"
)
VERSIONS = ("1.0", "1.1")
FIRST_BYTE = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]")  # a method starts with a token byte


class HeadError(Exception):
    """A request head that cannot be served: its status and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message


class LineReader(Protocol):
    """What `read_head` reads from: a buffered binary file's `readline`."""

    def readline(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class Head:
    """A parsed request head; names and values decoded as Latin-1, in their order."""

    method: str
    target: str
    version: str
    fields: tuple[tuple[str, str], ...]

    def values(self, name: str) -> list[str]:
        """Every value of header `name` (any case)."""
        return [value for key, value in self.fields if key.lower() == name.lower()]

    def tokens(self, name: str) -> list[str]:
        """The comma-separated, lower-cased items of header `name` (`Connection`)."""
        return [
            item.strip().lower()
            for value in self.values(name)
            for item in value.split(",")
            if item.strip()
        ]

    @property
    def keep_alive(self) -> bool:
        """Whether the connection stays open after the answer (RFC 9112 9.3)."""
        connection = self.tokens("Connection")
        if "close" in connection:
            return False
        return self.version == "1.1" or "keep-alive" in connection


def read_head(reader: LineReader, max_bytes: int) -> bytes:
    """The bytes of one request head, up to and including its blank line.

    A blank first line is returned alone (`parse_head` refuses it). Fewer bytes than a whole
    head means the peer stopped sending (end of file, or its deadline cut it short).

    Raises:
        HeadError: 431 when the head is longer than `max_bytes`; 400 at once when its first
            byte cannot start a request line (a TLS handshake sent to this plain-HTTP server
            has no newline: waiting for one would hold it until the head deadline).
    """
    pending = reader.readline(1)  # the first line's first byte
    if not pending:
        return b""
    if pending not in (b"\r", b"\n") and not FIRST_BYTE.fullmatch(pending):
        raise HeadError(400, "the request does not start with an HTTP method")
    lines: list[bytes] = []
    total = 0
    while True:
        if pending == b"\n":
            line = pending
        else:
            line = pending + reader.readline(max_bytes - total + 1 - len(pending))
        pending = b""
        lines.append(line)
        total += len(line)
        if total > max_bytes:
            raise HeadError(431, f"the request head is larger than {max_bytes} bytes")
        if not line.endswith(b"\n") or line in (b"\r\n", b"\n"):
            return b"".join(lines)


def is_complete(block: bytes) -> bool:
    """Whether `read_head` returned a whole head (or a blank first line), not a cut one."""
    return block.endswith(b"\n\n") or block.endswith(b"\n\r\n") or block in (b"\n", b"\r\n")


def parse_head(block: bytes) -> Head:
    """Parse a request head as `read_head` returns it (see the module docstring).

    Raises:
        HeadError: 400 for a malformed head, 431 for too many header lines, 505 for an
            HTTP version other than 1.0 or 1.1.
    """
    lines = [line[:-1] if line.endswith(b"\r") else line for line in block.split(b"\n")]
    if lines[0] == b"" and len(lines) > 1:
        raise HeadError(400, "a blank line came before the request line")
    if len(lines) < 3 or lines[-2:] != [b"", b""]:
        raise HeadError(400, "the request head is cut short")
    lines = lines[:-2]  # the blank line that ends the head, and what follows its LF
    found = REQUEST_LINE.fullmatch(lines[0])
    if found is None:
        raise HeadError(
            400,
            f"malformed request line {lines[0][:100]!r}: it must be METHOD SP target SP "
            "HTTP/1.1, the target in visible ASCII (percent-encode other bytes)",
        )
    version = found["version"].decode()
    if version not in VERSIONS:
        raise HeadError(505, f"HTTP/{version} is not supported: use HTTP/1.1")
    if len(lines) - 1 > MAX_FIELDS:
        raise HeadError(431, f"more than {MAX_FIELDS} header lines")
    fields = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            raise HeadError(400, "folded header lines (obs-fold) are not accepted")
        field = FIELD_LINE.fullmatch(line)
        if field is None:
            raise HeadError(
                400,
                f"malformed header line {line[:100]!r}: it must be Name: value, without "
                "control characters",
            )
        fields.append((field["name"].decode("latin-1"), field["value"].decode("latin-1")))
    return Head(found["method"].decode(), found["target"].decode(), version, tuple(fields))
