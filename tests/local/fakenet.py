"""A fake internet in network namespaces the tests make (root only): never the real network.

Two namespaces joined by a veth pair: `internet` (198.18.0.1, and the fake hosts' addresses
on its loopback) runs `serve` (this file as a program): a DNS server on 198.18.0.53 (UDP and
TCP, the zone `ZONE`, `*.wild.test` answered for any name below it, a CNAME) and an HTTP
server on port 80 of every address that answers the name of the address it was reached at.
`server` (198.18.0.2, its default route through `internet`) is where the local server runs, in
a mount namespace of its own whose `/etc/resolv.conf` names the fake DNS server only
(`FakeInternet.wrap`). slirp4netns connects sandboxes from there. The test process reaches
the server's loopback listener through `Relay` (a socket made in that namespace).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DNS = "198.18.0.53"
ZONE = {  # name -> address (A, TTL 300)
    "allowed.test": "198.18.1.1",
    "denied.test": "198.18.1.2",
    "a.wild.test": "198.18.1.3",
    "wild.test": "198.18.1.4",
    "evilwild.test": "198.18.1.5",
    "allowed.test.denied.test": "198.18.1.6",
    "target.other.test": "198.18.1.7",
    "also.test": "198.18.1.8",
}
WILD = ("wild.test", "198.18.1.3")  # any name below it
CNAMES = {"alias.test": "target.other.test"}
NAMES = {address: name for name, address in ZONE.items()}
CLONE_NEWNET = 0x40000000


def _name(data: bytes, at: int) -> tuple[str, int]:
    labels = []
    while data[at]:
        labels.append(data[at + 1 : at + 1 + data[at]].decode().lower())
        at += 1 + data[at]
    return ".".join(labels), at + 1


def _encode(name: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"


def answer(query: bytes) -> bytes:
    """The zone's answer to `query` (A and CNAME; NXDOMAIN for names it has not)."""
    ident, flags = struct.unpack_from("!HH", query)
    name, at = _name(query, 12)
    qtype = struct.unpack_from("!H", query, at)[0]
    question = query[12 : at + 4]
    records = []
    current = name
    if current in CNAMES:
        target = CNAMES[current]
        rdata = _encode(target)
        records.append(_encode(current) + struct.pack("!HHIH", 5, 1, 300, len(rdata)) + rdata)
        current = target
    address = ZONE.get(current) or (WILD[1] if current.endswith("." + WILD[0]) else None)
    rcode = 0 if address or records else 3
    if address and qtype == 1:
        rdata = socket.inet_aton(address)
        records.append(_encode(current) + struct.pack("!HHIH", 1, 1, 300, 4) + rdata)
    head = struct.pack("!HHHHHH", ident, 0x8180 | (flags & 0x0100) | rcode, 1, len(records), 0, 0)
    return head + question + b"".join(records)


HEARD: list[str] = []  # what the listeners of port `LISTEN` heard, "payload@address"
LISTEN = 9
ECHO = 7  # an echo server on every address: a connection that stays open


class _Http(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/heard":  # the test's question (asked from the internet namespace)
            body = json.dumps(HEARD).encode()
        else:
            body = NAMES.get(self.connection.getsockname()[0], "?").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _DnsTcp(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        length = struct.unpack("!H", self.request.recv(2))[0]
        reply = answer(self.request.recv(length))
        self.request.sendall(struct.pack("!H", len(reply)) + reply)


def serve() -> None:
    """The fake hosts (run in `internet`): DNS and HTTP until stdin closes."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((DNS, 53))

    def dns_udp() -> None:
        while True:
            data, peer = udp.recvfrom(4096)
            with contextlib.suppress(Exception):
                udp.sendto(answer(data), peer)

    heard_udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    heard_udp.setsockopt(socket.IPPROTO_IP, 8, 1)  # IP_PKTINFO: the address it came to
    heard_udp.bind(("0.0.0.0", LISTEN))
    heard_tcp = socket.create_server(("0.0.0.0", LISTEN))

    def listen_udp() -> None:
        while True:
            data, ancillary, _, _ = heard_udp.recvmsg(512, 256)
            to = next((socket.inet_ntoa(d[8:12]) for _, _, d in ancillary), "?")
            HEARD.append(f"{data.decode(errors='replace').strip()}@{to}")

    def listen_tcp() -> None:
        while True:
            conn, _ = heard_tcp.accept()
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    data = conn.recv(512)
                    HEARD.append(f"{data.decode(errors='replace').strip()}@{conn.getsockname()[0]}")

    echo = socket.create_server(("0.0.0.0", ECHO))

    def echo_one(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(512):
                conn.sendall(data)

    def serve_echo() -> None:
        while True:
            conn, _ = echo.accept()
            threading.Thread(target=echo_one, args=(conn,), daemon=True).start()

    for target in (listen_udp, listen_tcp, serve_echo):
        threading.Thread(target=target, daemon=True).start()
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    tcp = socketserver.ThreadingTCPServer((DNS, 53), _DnsTcp)
    http = ThreadingHTTPServer(("0.0.0.0", 80), _Http)
    for target in (dns_udp, tcp.serve_forever, http.serve_forever):
        threading.Thread(target=target, daemon=True).start()
    print("up", flush=True)
    sys.stdin.read()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace `fd`."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def socket_in(netns: str) -> socket.socket:
    """A TCP socket made in the named network namespace (by a thread that joins it)."""
    made: list[socket.socket] = []

    def work() -> None:
        fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            setns(fd)
            made.append(socket.socket())
        finally:
            os.close(fd)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return made[0]


class Relay:
    """127.0.0.1:`port` of this namespace to 127.0.0.1:`target` of the namespace `netns`."""

    def __init__(self, netns: str, target: int) -> None:
        self.netns, self.target = netns, target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            far = socket_in(self.netns)
            try:
                far.connect(("127.0.0.1", self.target))
            except OSError:
                conn.close()
                far.close()
                continue
            for a, b in ((conn, far), (far, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Stop accepting."""
        self.listener.close()


class FakeInternet:
    """The namespaces and the fake hosts (see the module docstring); `close` removes them."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.internet, self.server = f"osbt-net-{tag}", f"osbt-srv-{tag}"
        self.dir = Path(tempfile.mkdtemp(prefix="osbt-fakenet-"))
        self.resolv = self.dir / "resolv.conf"
        self.resolv.write_text(f"nameserver {DNS}\n")
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            self._build(tag)
        except BaseException:
            self.close()
            raise

    def _build(self, tag: str) -> None:
        _ip("netns", "add", self.internet)
        _ip("netns", "add", self.server)
        net, srv = ("netns", "exec", self.internet), ("netns", "exec", self.server)
        _ip("link", "add", f"osbn{tag}", "netns", self.internet, "type", "veth", "peer", "name",
            f"osbs{tag}", "netns", self.server)  # fmt: skip
        _ip(*net, "ip", "addr", "add", "198.18.0.1/24", "dev", f"osbn{tag}")
        _ip(*net, "ip", "link", "set", f"osbn{tag}", "up")
        _ip(*net, "ip", "link", "set", "lo", "up")
        for address in {*ZONE.values(), DNS}:
            _ip(*net, "ip", "addr", "add", f"{address}/32", "dev", "lo")
        _ip(*srv, "ip", "addr", "add", "198.18.0.2/24", "dev", f"osbs{tag}")
        _ip(*srv, "ip", "link", "set", f"osbs{tag}", "up")
        _ip(*srv, "ip", "link", "set", "lo", "up")
        _ip(*srv, "ip", "route", "add", "default", "via", "198.18.0.1")
        self.proc = subprocess.Popen(
            ["ip", *net, sys.executable, "-I", __file__, "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == b"up\n", "the fake hosts did not start"

    def wrap(self) -> tuple[str, ...]:
        """The command prefix that runs a server in `server`, with the private resolv.conf."""
        script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
        return (
            "ip", "netns", "exec", self.server,
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", script, str(self.resolv),
        )  # fmt: skip

    def heard(self) -> list[str]:
        """What the fake hosts' listeners of port `LISTEN` heard so far."""
        with socket_in(self.internet) as sock:
            sock.settimeout(10)
            sock.connect(("198.18.0.1", 80))
            sock.sendall(b"GET /heard HTTP/1.0\r\n\r\n")
            data = b""
            while part := sock.recv(65536):
                data += part
        heard: list[str] = json.loads(data.split(b"\r\n\r\n", 1)[1])
        return heard

    def run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """`argv` in `server` (as the server runs: its resolv.conf)."""
        return subprocess.run(
            [*self.wrap(), *argv], capture_output=True, text=True, timeout=timeout, check=False
        )

    def close(self) -> None:
        """Stop the fake hosts; remove the namespaces and the directory."""
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()
            self.proc.kill()
            self.proc.wait()
        for name in (self.internet, self.server):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            self.resolv.unlink()
            self.dir.rmdir()


# Run in a sandbox: for each target (a name or an address), what a fetch of it gives.
FETCH = r"""
import json, socket
def fetch(target, port=80):
    try:
        address = socket.gethostbyname(target)
    except OSError as exc:
        return "dns"
    try:
        with socket.create_connection((address, port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\nHost: " + target.encode() + b"\r\n\r\n")
            data = b""
            while part := sock.recv(4096):
                data += part
        return "ok:" + data.split(b"\r\n\r\n", 1)[1].decode()
    except OSError as exc:
        return "net"
print("RESULT" + json.dumps({t: fetch(t) for t in TARGETS}))
"""


def fetch_code(targets: list[str]) -> str:
    """Python for a sandbox that prints `RESULT{...}`, each target's fetch (`FETCH`)."""
    return f"TARGETS = {json.dumps(targets)}\n{FETCH}"


def parse_result(stdout: str) -> dict[str, str]:
    """The `RESULT` line's mapping."""
    for line in stdout.splitlines():
        if line.startswith("RESULT"):
            result: dict[str, str] = json.loads(line[len("RESULT") :])
            return result
    raise AssertionError(f"no result in {stdout!r}")


def wait_until(predicate: Any, timeout: float) -> bool:
    """Poll `predicate` until true or `timeout` seconds pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    serve()
