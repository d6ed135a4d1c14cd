"""Egress by name: a sandbox with `egress` rules resolves names only through a resolver the
server runs, and its packets leave only toward the addresses that resolver handed out for
allowed names.

The rules (`Rules`) are OpenSandbox's sidecar's: evaluated in order, the first whose target
matches a name decides, `defaultAction` where none does. A target is a host name
(`example.org`: that name only) or a wildcard (`*.example.org`: every name below it, never
`example.org` itself, never `evilexample.org`), matched without regard to ASCII case, with or
without one trailing dot; a name with non-ASCII letters is matched in its IDNA form
(`bücher.example` is `xn--bcher-kva.example`). IP and CIDR targets are refused (400), as the
sidecar's API says ("IP/CIDR not yet supported"); so are targets that are no host name, and
those IDNA 2003 (Python's codec) and 2008 read differently (`DEVIATIONS`). An allowed name
whose CNAME chain passes through a name a rule denies is refused.

The resolver (`Resolver`, one thread per sandbox, in the server's process) holds a UDP and a
TCP socket made in the sandbox's network namespace on its loopback (`firewall.Wall.sockets`),
at ports the kernel chose; the namespace's nat chain sends every IPv4 DNS packet (port 53,
UDP and TCP) there, whatever address the sandbox's `resolv.conf` or its code names (one on
its own loopback, as systemd-resolved's 127.0.0.53 in the host's `resolv.conf`, too).
For a question of type A about an allowed name it asks the server's own
resolvers (the server's `/etc/resolv.conf`, from the server's namespace) a question of its own
(a fresh id, that one question), follows the answer's CNAME chain from the name asked (at most
`MAX_CHAIN` links), answers the chain and its A records, and puts those addresses in the
sandbox's sets (`firewall.Wall.allow`) for the records' TTL, at least `MIN_TTL` and at most
`MAX_TTL` seconds, before the answer leaves. Every other type about an allowed name gets an
empty answer (AAAA too: IPv6 has no way out); a denied name gets NXDOMAIN and never leaves the
server (no query about it reaches any resolver), and a line in the sandbox's events
(`REPORT_EVERY`), as does a packet the tables refused (the namespace's netfilter log, read
from a socket made there too: `firewall.listen_log`). Bounds: `RATE` questions a second
(`BURST` at once; the rest are dropped unanswered), one TCP connection at a time for at most
`TCP_TIMEOUT` seconds, `MAX_ADDRESSES` addresses held and `NAMES_PER_ADDRESS` names
remembered for each, `UPSTREAM_TIMEOUT` per upstream resolver, `STOP_WAIT` for a delete to
wait on the last question (no set changes after it: the namespace's descriptor is closed).

The addresses held (the boundary's `known4`) outlive their TTL: an entry that times out ends
no open connection (a download longer than a TTL goes on); a new one needs the name asked
again. A changed policy (`Resolver.set_rules`) revokes the addresses of names it no longer
allows at once (`firewall.Wall.disallow`): the tables refuse new connections to them and
every further packet of an open one (TCP gets a reset). Out of room, the resolver revokes
the addresses whose entries ended longest ago; where none has ended, the answer is SERVFAIL.
"""

from __future__ import annotations

import contextlib
import heapq
import ipaddress
import logging
import os
import re
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .firewall import parse_log

logger = logging.getLogger("osb_sync.local")

MIN_TTL = 60
MAX_TTL = 3600
MAX_ADDRESSES = 1024  # addresses remembered (in the sets, or past their TTL): the sets' size
NAMES_PER_ADDRESS = 4  # names remembered per address (those handed out last)
MAX_CHAIN = 8
MAX_RECORDS = 32
RATE, BURST = 100.0, 200.0
TCP_TIMEOUT = 3.0
UPSTREAM_TIMEOUT = 2.0
STOP_WAIT = 2.0  # what a sandbox's delete waits for its resolver's last question
REPORT_EVERY = 60.0  # seconds between two event lines about one denied name
REPORTS_PER_MINUTE = 20
WARN_EVERY = 60.0  # seconds between two lines of one resolver in the server's log
# IDNA 2003 (Python's codec) maps these where IDNA 2008 keeps them: another domain
DEVIATIONS = frozenset("\u00df\u03c2\u200c\u200d")
RESOLV_CONF = "/etc/resolv.conf"
TYPE_A, TYPE_CNAME, CLASS_IN = 1, 5, 1
NOERROR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED = 0, 2, 3, 4, 5
HEADER = struct.Struct("!HHHHHH")
Record = tuple[str, int, int, bytes]  # owner, type, TTL, data (an A's 4 bytes, a CNAME's name)
Answer = tuple[int, list[Record]]  # rcode, records
LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\Z")
UNSUPPORTED = (
    "IP and CIDR targets are not supported (OpenSandbox's egress sidecar refuses them too): "
    "name the host instead"
)


class TargetError(ValueError):
    """A rule's target that is no host name or wildcard (its message says which and why)."""


def normal_name(name: str) -> str:
    """`name` as rules and questions are compared: lower case, no trailing dot, IDNA.

    Raises:
        TargetError: it is no host name (empty labels, a label of more than 63 characters,
            more than 253 in all, characters a host name has not).
    """
    bare = name[:-1] if name.endswith(".") else name
    if DEVIATIONS & set(bare):
        raise TargetError(
            f"{name!r} is read differently by IDNA 2003 and 2008 (ß, ς, ZWJ, ZWNJ): give it in"
            " its xn-- form"
        )
    try:
        ascii_name = bare.encode("idna").decode("ascii") if not bare.isascii() else bare
    except UnicodeError:
        raise TargetError(f"{name!r} is no host name (IDNA refuses it)") from None
    ascii_name = ascii_name.lower()
    labels = ascii_name.split(".")
    if len(ascii_name) > 253 or not all(LABEL.match(label) for label in labels):
        raise TargetError(f"{name!r} is no host name")
    return ascii_name


def check_target(target: str) -> tuple[str, bool]:
    """(its name, a wildcard?) of a rule's target.

    Raises:
        TargetError: an IP or CIDR target (`UNSUPPORTED`), or no host name.
    """
    try:
        ipaddress.ip_network(target.strip("[]"), strict=False)
    except ValueError:
        pass
    else:
        raise TargetError(f"{target!r}: {UNSUPPORTED}")
    wildcard = target.startswith("*.")
    name = normal_name(target[2:] if wildcard else target)
    if "*" in name or (not wildcard and "." not in name and name.isdigit()):
        raise TargetError(f"{target!r} is no host name")
    return name, wildcard


@dataclass(frozen=True)
class Rules:
    """A policy's rules, compiled: (allow?, name, wildcard?) in order, and the default."""

    default_allow: bool
    rules: tuple[tuple[bool, str, bool], ...]

    @classmethod
    def of(cls, policy: dict[str, Any]) -> Rules:
        """The rules of a policy (`network.normal`'s shape).

        Raises:
            TargetError: a target is refused (`check_target`).
        """
        rules = []
        for rule in policy.get("egress") or []:
            name, wildcard = check_target(rule["target"])
            rules.append((rule["action"] == "allow", name, wildcard))
        return cls((policy.get("defaultAction") or "deny") == "allow", tuple(rules))

    def decides(self, name: str) -> bool | None:
        """The action of the first rule that matches `name` (normalised), None if none does."""
        for allow, target, wildcard in self.rules:
            if name.endswith("." + target) if wildcard else name == target:
                return allow
        return None

    def allows(self, name: str) -> bool:
        """Whether a question about `name` (normalised) is answered."""
        decided = self.decides(name)
        return self.default_allow if decided is None else decided


# --- DNS messages (RFC 1035): pure functions on bytes ---


@dataclass(frozen=True)
class Question:
    """A query's id, its recursion-desired bit, its question (name as asked, normalised,
    type, class) and the question's bytes as they came."""

    ident: int
    rd: bool
    name: str
    qtype: int
    qclass: int
    raw: bytes


def read_name(data: bytes, at: int) -> tuple[str, int]:
    """The name at `at` (compression followed, at most 32 pointers) and the offset after it.

    Raises:
        ValueError: malformed (past the end, a loop, a label of bytes no host name has).
    """
    labels: list[str] = []
    end = -1
    for _ in range(128):
        if at >= len(data):
            raise ValueError("a name runs past the message")
        length = data[at]
        if length & 0xC0 == 0xC0:
            if at + 1 >= len(data):
                raise ValueError("a pointer runs past the message")
            if end < 0:
                end = at + 2
            at = ((length & 0x3F) << 8) | data[at + 1]
            continue
        if length & 0xC0:
            raise ValueError("an unknown label type")
        if length == 0:
            name = ".".join(labels)
            if len(name) > 253:
                raise ValueError("a name longer than 253")
            return name, end if end >= 0 else at + 1
        label = data[at + 1 : at + 1 + length]
        if len(label) != length:
            raise ValueError("a label runs past the message")
        text = label.decode("ascii", "replace").lower()
        if not LABEL.match(text):
            raise ValueError("a label no host name has")
        labels.append(text)
        at += 1 + length
    raise ValueError("too many labels or pointers")


def encode_name(name: str) -> bytes:
    """`name` (normalised ASCII) as labels, uncompressed."""
    out = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".") if p)
    return out + b"\0"


def parse_question(data: bytes) -> Question:
    """The one question of a query.

    Raises:
        ValueError: no query, or not exactly one question.
    """
    if len(data) < HEADER.size:
        raise ValueError("shorter than a header")
    ident, flags, qd, _, _, _ = HEADER.unpack_from(data)
    if flags & 0x8000 or (flags >> 11) & 0xF or qd != 1:
        raise ValueError("not a standard query with one question")
    name, at = read_name(data, HEADER.size)
    if at + 4 > len(data):
        raise ValueError("a question runs past the message")
    qtype, qclass = struct.unpack_from("!HH", data, at)
    return Question(ident, bool(flags & 0x0100), name, qtype, qclass, data[HEADER.size : at + 4])


def build_query(ident: int, name: str, qtype: int) -> bytes:
    """A recursive query for `name` of `qtype` (class IN)."""
    return HEADER.pack(ident, 0x0100, 1, 0, 0, 0) + encode_name(name) + struct.pack("!HH", qtype, 1)


def parse_answer(data: bytes, ident: int, name: str) -> Answer:
    """(rcode, answer records as (owner, type, ttl, rdata: an A's 4 bytes, a CNAME's target
    name encoded)) of an upstream response to our query `ident` about `name`.

    Raises:
        ValueError: not the answer to that query, or malformed.
    """
    if len(data) < HEADER.size:
        raise ValueError("shorter than a header")
    got, flags, qd, an, _, _ = HEADER.unpack_from(data)
    if got != ident or not flags & 0x8000 or qd != 1:
        raise ValueError("not the answer to our query")
    asked, at = read_name(data, HEADER.size)
    if asked != name:
        raise ValueError("the answer to another question")
    at += 4
    records = []
    for _ in range(min(an, 256)):
        owner, at = read_name(data, at)
        if at + 10 > len(data):
            raise ValueError("a record runs past the message")
        rtype, rclass, ttl, length = struct.unpack_from("!HHIH", data, at)
        at += 10
        rdata = data[at : at + length]
        if len(rdata) != length:
            raise ValueError("a record's data runs past the message")
        if rclass == CLASS_IN and rtype == TYPE_A and length == 4:
            records.append((owner, rtype, ttl, rdata))
        elif rclass == CLASS_IN and rtype == TYPE_CNAME:
            target, _ = read_name(data, at)
            records.append((owner, rtype, ttl, encode_name(target)))
        at += length
    return flags & 0xF, records


def chain(name: str, records: Sequence[Record]) -> list[Record]:
    """The records that answer `name`: its CNAME chain (at most `MAX_CHAIN` links, no loop)
    and the A records of the name it ends at, at most `MAX_RECORDS`."""
    found: list[Record] = []
    current, seen = name, {name}
    for _ in range(MAX_CHAIN):
        alias = next((r for r in records if r[0] == current and r[1] == TYPE_CNAME), None)
        if alias is None:
            break
        target, _ = read_name(alias[3], 0)
        found.append(alias)
        if target in seen:
            return found
        current = target
        seen.add(target)
    found += [r for r in records if r[0] == current and r[1] == TYPE_A]
    return found[:MAX_RECORDS]


def response(
    question: Question,
    rcode: int,
    records: Sequence[Record] = (),
    limit: int = 512,
) -> bytes:
    """Our answer to `question`: the question as it came, `records` (TTLs capped at
    `MAX_TTL`); truncated (TC, no records) past `limit` bytes."""
    body = b""
    for owner, rtype, ttl, rdata in records:
        head = encode_name(owner) + struct.pack(
            "!HHIH", rtype, CLASS_IN, min(ttl, MAX_TTL), len(rdata)
        )
        body += head + rdata
    flags = 0x8000 | 0x0080 | (0x0100 if question.rd else 0) | rcode
    message = HEADER.pack(question.ident, flags, 1, len(records), 0, 0) + question.raw + body
    if len(message) > limit:
        message = HEADER.pack(question.ident, flags | 0x0200, 1, 0, 0, 0) + question.raw
    return message


def upstreams(path: str = RESOLV_CONF) -> list[str]:
    """The server's resolvers (`nameserver` lines of `path`, at most 3), 127.0.0.1 if none."""
    found: list[str] = []
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8", errors="replace") as conf:
            for line in conf:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    address, _, zone = parts[1].partition("%")  # a link-local one's zone kept
                    with contextlib.suppress(ValueError):
                        ipaddress.ip_address(address)
                        found.append(f"{address}%{zone}" if zone else address)
    return found[:3] or ["127.0.0.1"]


def ask_upstream(
    servers: Sequence[str], name: str, timeout: float = UPSTREAM_TIMEOUT, port: int = 53
) -> Answer:
    """Ask `servers` in turn for `name`'s A records (UDP, then TCP where truncated); what is
    not the answer to our question (another id or question, a short datagram) is ignored.

    Raises:
        OSError: none answered.
    """
    failure: Exception = OSError("no resolver answered")
    for server in servers:
        ident = secrets.randbits(16)
        query = build_query(ident, name, TYPE_A)
        try:  # getaddrinfo: a numeric address, with its zone (fe80::1%eth0)
            family, _, _, _, where = socket.getaddrinfo(
                server, port, type=socket.SOCK_DGRAM, flags=socket.AI_NUMERICHOST
            )[0]
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.settimeout(timeout)
                sock.connect(where)
                sock.send(query)
                deadline = time.monotonic() + timeout
                while True:
                    sock.settimeout(max(0.01, deadline - time.monotonic()))
                    data = sock.recv(4096)
                    if len(data) < HEADER.size or data[:2] != query[:2]:
                        continue
                    if data[2] & 0x02:  # truncated: by TCP
                        return _ask_tcp(family, where, ident, name, query, timeout)
                    with contextlib.suppress(ValueError):
                        return parse_answer(data, ident, name)
        except (OSError, ValueError) as exc:
            failure = exc
    raise OSError(f"no resolver answered ({failure})")


def _ask_tcp(
    family: int, server: Any, ident: int, name: str, query: bytes, timeout: float
) -> Answer:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(server)
        sock.sendall(struct.pack("!H", len(query)) + query)
        length = struct.unpack("!H", _read(sock, 2))[0]
        return parse_answer(_read(sock, length), ident, name)


def _read(sock: socket.socket, size: int, deadline: float | None = None) -> bytes:
    """`size` bytes; by `deadline` (time.monotonic()) in all where one is given."""
    data = b""
    while len(data) < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("too slow")
            sock.settimeout(left)
        part = sock.recv(size - len(data))
        if not part:
            raise OSError("the connection closed")
        data += part
    return data


class Resolver:
    """One sandbox's resolver (see the module docstring): a thread from `start` to `stop`.

    Args:
        rules: the policy's, changed by `set_rules`.
        udp, tcp: its sockets, bound (and the TCP one listening) in the sandbox's namespace.
        allow: puts {address: seconds} in the sandbox's sets (`firewall.Wall.allow`).
        disallow: takes addresses out of them.
        report: writes a line to the sandbox's events.
        ask: asks the server's resolvers (`ask_upstream`, with `upstreams()`), for tests.
        log: the namespace's log of refused packets (`firewall.listen_log`), whose
            destinations it reports as it reports denied names; None: none.
    """

    def __init__(
        self,
        rules: Rules,
        udp: socket.socket,
        tcp: socket.socket,
        allow: Callable[[dict[str, int]], None],
        disallow: Callable[[list[str]], None],
        report: Callable[[str], None],
        ask: Callable[[str], Answer] | None = None,
        log: socket.socket | None = None,
    ) -> None:
        self._rules = rules
        self._udp, self._tcp, self._log = udp, tcp, log
        self._allow, self._disallow, self._report = allow, disallow, report
        servers = upstreams()
        self._ask = ask or (lambda name: ask_upstream(servers, name))
        # The rules, what was handed out, and every call of allow and disallow: none after
        # `stop` (the namespace's descriptor is closed then)
        self._lock = threading.Lock()
        self._stopped = False
        # address -> {name: when handed out}, the boundary's `known4`: kept past the TTL (a
        # connection outlives it, and a change that removes its names must still end it)
        # until the table is full (`_evict`)
        self._handed: dict[str, dict[str, float]] = {}
        self._until: dict[str, float] = {}  # address -> when its `allowed4` entry ends
        self._ends: list[tuple[float, str]] = []  # a heap of (until, address), some stale
        self._warned = -WARN_EVERY
        self._tokens, self._at = BURST, time.monotonic()
        self._reported: dict[str, float] = {}
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="osb-local-dns", daemon=True)

    def start(self) -> None:
        """Start answering."""
        self._thread.start()

    def stop(self) -> None:
        """Stop answering (idempotent): the thread ends after the question it is on, if any,
        waited for `STOP_WAIT` seconds at most, and closes the sockets as it ends."""
        if self._stop_w < 0:
            return
        with self._lock:  # an nft run in progress ends first; none starts after
            self._stopped = True
        os.write(self._stop_w, b"x")
        os.close(self._stop_w)
        self._stop_w = -1
        if not self._thread.is_alive() and self._thread.ident is None:  # never started
            self._close()
        elif self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT)

    def _close(self) -> None:
        os.close(self._stop_r)
        self._udp.close()
        self._tcp.close()
        if self._log is not None:
            self._log.close()

    def set_rules(self, rules: Rules) -> None:
        """Answer by `rules` from now on; revoke the addresses of names they deny (their open
        connections end).

        Raises:
            RuntimeError: the sets could not change (`disallow`'s): the rules and the
                addresses stay as they were.
        """
        with self._lock:
            if self._stopped:
                return
            gone = [a for a, names in self._handed.items() if not any(map(rules.allows, names))]
            if gone:
                self._disallow(gone)
            for address in gone:
                del self._handed[address]
                self._until.pop(address, None)
            for names in self._handed.values():  # each keeps one allowed name at least
                for denied in [n for n in names if not rules.allows(n)]:
                    del names[denied]
            self._rules = rules

    def refill(self) -> None:
        """Put the addresses held back in the sets (tables loaded again, empty): `known4`
        all of them, `allowed4` those within their TTL.

        Raises:
            RuntimeError: nft failed.
        """
        with self._lock:
            if not self._stopped:
                self._refill_locked()

    def _refill_locked(self) -> None:
        now = time.monotonic()
        due = {}
        for address in self._handed:  # `known4` all, `allowed4` those with time left
            left = self._until.get(address, now) - now
            due[address] = int(left) + 1 if left > 0 else 0
        if due:
            self._allow(due)

    def handed(self) -> dict[str, set[str]]:
        """The addresses in the sets now, each with the names it was handed out for."""
        now = time.monotonic()
        with self._lock:
            return {
                address: set(self._handed[address])
                for address, until in self._until.items()
                if until > now and address in self._handed
            }

    def answer(self, data: bytes, limit: int = 512) -> bytes | None:
        """The answer to one query from the sandbox (None: none is sent)."""
        try:
            question = parse_question(data)
        except ValueError:
            return None
        if question.qclass != CLASS_IN:
            return response(question, NOTIMP)
        with self._lock:
            allowed = self._rules.allows(question.name)
        if not allowed:
            self._denied(question.name)
            return response(question, NXDOMAIN)
        if question.qtype != TYPE_A:
            return response(question, NOERROR)  # no data: only A records lead anywhere
        try:
            rcode, records = self._ask(question.name)
            found = chain(question.name, records)
        except (OSError, ValueError) as exc:
            logger.debug("local server: a sandbox's question went unanswered: %s", exc)
            return response(question, SERVFAIL)
        if rcode not in (NOERROR, NXDOMAIN):
            return response(question, SERVFAIL)
        with self._lock:
            denied = [
                read_name(r[3], 0)[0]
                for r in found
                if r[1] == TYPE_CNAME and self._rules.decides(read_name(r[3], 0)[0]) is False
            ]
        if denied:  # an alias of a name a rule denies: the rule wins
            self._denied(question.name, f"an alias of {denied[0]}, which a rule denies")
            return response(question, NXDOMAIN)
        ttl = self._hand_out(question.name, found)
        if ttl is None:
            return response(question, SERVFAIL)
        found = [(owner, rtype, min(t, ttl), data) for owner, rtype, t, data in found]
        return response(question, rcode, found, limit)

    def _hand_out(self, name: str, records: Sequence[Record]) -> int | None:
        """Put the A records' addresses in the sets (those whose set entry would end before
        half its time: a renewal costs an nft run); the TTL the answer may say (the sets'
        nearest end), None where they could not be put there."""
        now = time.monotonic()
        addresses: dict[str, int] = {}
        for _, rtype, ttl, rdata in records:
            if rtype == TYPE_A:
                address = socket.inet_ntoa(rdata)
                addresses[address] = max(addresses.get(address, 0), max(MIN_TTL, min(ttl, MAX_TTL)))
        with self._lock:
            if self._stopped or not self._rules.allows(name):  # changed while upstream answered
                return None
            new = [a for a in addresses if a not in self._handed]
            if len(self._handed) + len(new) > MAX_ADDRESSES:
                try:
                    room = self._evict(len(new), now, set(addresses))
                except RuntimeError as exc:
                    self._warn(now, f"a sandbox's allowed addresses: {exc}")
                    return None
                if not room:
                    self._full(name, now)
                    return None
            due = {a: t for a, t in addresses.items() if self._until.get(a, 0.0) - now < t / 2}
            if due:
                try:
                    self._allow(due)
                except RuntimeError as exc:
                    self._warn(now, f"a sandbox's allowed addresses: {exc}")
                    return None
            ends = [now + MAX_TTL]
            for address in addresses:
                if address in due:
                    self._until[address] = now + due[address]
                    heapq.heappush(self._ends, (self._until[address], address))
                ends.append(self._until[address])
                names = self._handed.setdefault(address, {})
                names.pop(name, None)
                names[name] = now  # the latest last: the first is the oldest
                if len(names) > NAMES_PER_ADDRESS:  # forgotten: a change may end the
                    del names[next(iter(names))]  # address's connections sooner
        return max(0, int(min(ends) - now) - 1)

    def _evict(self, count: int, now: float, keep: set[str]) -> bool:
        """Make room for `count` addresses by revoking those whose entries ended longest ago
        (their open connections end: the resolver no longer knows their names), never one of
        `keep` (the answer's own); False where too few have ended.

        Raises:
            RuntimeError: the sets could not change (`disallow`'s): nothing is forgotten.
        """
        ended: list[str] = []
        kept: list[tuple[float, str]] = []
        while len(self._handed) - len(ended) + count > MAX_ADDRESSES and self._ends:
            until, address = self._ends[0]
            if self._until.get(address) != until or address in ended:  # stale
                heapq.heappop(self._ends)
                continue
            if until > now:
                break
            heapq.heappop(self._ends)
            if address in keep:
                kept.append((until, address))
            else:
                ended.append(address)
        for entry in kept:
            heapq.heappush(self._ends, entry)
        if ended:
            try:
                self._disallow(ended)
            except RuntimeError:
                for address in ended:
                    heapq.heappush(self._ends, (self._until[address], address))
                raise
            for address in ended:
                del self._until[address]
                self._handed.pop(address, None)
        if len(self._ends) > 4 * MAX_ADDRESSES:  # stale entries: the heap rebuilt
            self._ends = [(u, a) for a, u in self._until.items()]
            heapq.heapify(self._ends)
        return len(self._handed) + count <= MAX_ADDRESSES

    def _full(self, name: str, now: float) -> None:
        self._denied(name, "the sandbox's allowed addresses are full")
        self._warn(now, f"a sandbox's allowed addresses are full ({MAX_ADDRESSES})")

    def _warn(self, now: float, line: str) -> None:
        """`line` in the server's log, once in `WARN_EVERY` seconds at most."""
        if now - self._warned >= WARN_EVERY:
            self._warned = now
            logger.warning("local server: %s", line)

    def _denied(self, name: str, why: str = "no rule allows it") -> None:
        """One line in the sandbox's events about `name` (a name, or a refused packet's
        destination), at most once in `REPORT_EVERY` each, `REPORTS_PER_MINUTE` in all."""
        now = time.monotonic()
        if now - self._reported.get(name, -REPORT_EVERY) < REPORT_EVERY:
            return
        recent = [t for t in self._reported.values() if now - t < 60]
        if len(recent) >= REPORTS_PER_MINUTE:
            return
        if len(self._reported) > 1000:
            self._reported = {n: t for n, t in self._reported.items() if now - t < REPORT_EVERY}
        self._reported[name] = now
        self._report(f"egress denied: {name} ({why})")

    def _one_log(self) -> None:
        assert self._log is not None
        try:
            data = self._log.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # ENOBUFS: lines lost, which the rate limit drops anyway
            logger.debug("local server: a sandbox's refused packets: %s", exc)
            return
        for address, protocol, port in parse_log(data):
            kind = {6: "tcp", 17: "udp", 1: "icmp"}.get(protocol, f"protocol {protocol}")
            where = f"{address}:{port}/{kind}" if port else f"{address} ({kind})"
            self._denied(where, "no allowed name resolved to it")

    def _take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(BURST, self._tokens + (now - self._at) * RATE)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _serve(self) -> None:
        try:
            self._answer_all()
        finally:
            self._close()

    def _answer_all(self) -> None:
        with selectors.DefaultSelector() as waiter:
            waiter.register(self._udp, selectors.EVENT_READ)
            waiter.register(self._tcp, selectors.EVENT_READ)
            waiter.register(self._stop_r, selectors.EVENT_READ)
            if self._log is not None:
                waiter.register(self._log, selectors.EVENT_READ)
                self._log.setblocking(False)
            self._udp.setblocking(False)
            self._tcp.setblocking(False)
            while True:
                ready = {key.fileobj for key, _ in waiter.select()}
                if self._stop_r in ready:
                    return
                try:
                    if self._udp in ready:
                        self._one_udp()
                    if self._tcp in ready:
                        self._one_tcp()
                    if self._log is not None and self._log in ready:
                        self._one_log()
                except Exception:  # one bad question never ends the resolver
                    logger.exception("local server: a sandbox's resolver")

    def _one_udp(self) -> None:
        try:
            data, peer = self._udp.recvfrom(4096)
        except (BlockingIOError, InterruptedError):
            return
        if not self._take():
            return
        reply = self.answer(data)
        if reply is not None:
            with contextlib.suppress(OSError):
                self._udp.sendto(reply, peer)

    def _one_tcp(self) -> None:
        try:
            conn, _ = self._tcp.accept()
        except (BlockingIOError, InterruptedError):
            return
        with conn:
            if not self._take():
                return
            deadline = time.monotonic() + TCP_TIMEOUT  # for the question, in all
            try:
                length = struct.unpack("!H", _read(conn, 2, deadline))[0]
                reply = self.answer(_read(conn, min(length, 4096), deadline), 65535)
                if reply is not None:
                    conn.settimeout(max(0.1, deadline - time.monotonic()))
                    conn.sendall(struct.pack("!H", len(reply)) + reply)
            except OSError:
                pass
