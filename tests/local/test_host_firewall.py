"""The host is not the internet: a sandbox with internet access reaches no address of the
machine that runs the server, by any way its root has (a socket, or a frame it writes itself
on the tap device, as CAP_NET_RAW allows, claiming any protocol), and cannot change what
stops it.

The listener is on every address of the server's own network namespace (`::`, dual-stack:
IPv4 too); the control is a network namespace the test makes, on a veth pair whose host end
is one more address of the host. Nothing here leaves the machine.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from osb_sync.local import LocalServer
from tests.local.support import (
    CREATE_BODY,
    Box,
    local_server,
    require_isolation,
    require_slirp,
    sandbox_of,
    texts,
    wait_for,
)

DENY_ALL = {"defaultAction": "deny", "egress": []}
CAP_NET_ADMIN = 12

# Run in the sandbox (as its root): each way out, to each target, with a payload naming it.
PROBE = r"""
import errno, json, socket, struct

def checksum(data):
    data += b"\0" * (len(data) % 2)
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF

def udp_frame(source, target, port, payload):
    udp = struct.pack("!HHHH", 40000, port, 8 + len(payload), 0) + payload
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                       socket.inet_aton(source), socket.inet_aton(target))
    head = head[:10] + struct.pack("!H", checksum(head)) + head[12:]
    return b"\xff" * 6 + b"\x02\0\0\0\0\x01" + b"\x08\x00" + head + udp

def tap_address():
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.0.2.2", 9))
            return probe.getsockname()[0]
    except OSError:
        return None

said = {}
source = tap_address()
for target in TARGETS:
    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    try:
        with socket.create_connection((target, PORT), timeout=3) as conn:
            conn.sendall(f"tcp {target}\n".encode())
        said[f"tcp {target}"] = "connected"
    except OSError as exc:
        said[f"tcp {target}"] = errno.errorcode.get(exc.errno, str(exc))
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as udp:
            udp.sendto(f"udp {target}\n".encode(), (target, PORT))
        said[f"udp {target}"] = "sent"
    except OSError as exc:
        said[f"udp {target}"] = errno.errorcode.get(exc.errno, str(exc))
    if family != socket.AF_INET or source is None:
        continue
    # An IPv4 frame, sent as the kernel's protocol says (0: read from the frame) or as its
    # root claims (ARP, IPv6, any other, ETH_P_ALL), through the queue or past it.
    for proto in (0, 0x0806, 0x86DD, 0x1234, 0x0003):
        for bypass in (0, 1):
            way = f"raw {proto:#06x}{' bypass' if bypass else ''} {target}"
            try:
                with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
                    raw.setsockopt(263, 20, bypass)  # SOL_PACKET, PACKET_QDISC_BYPASS
                    raw.bind(("tap0", proto))
                    raw.send(udp_frame(source, target, PORT, f"{way}\n".encode()))
                said[way] = "sent"
            except OSError as exc:
                said[way] = errno.errorcode.get(exc.errno, str(exc))
print(json.dumps(said))
"""

# The control namespace's listener: TCP and UDP on every address, each payload printed.
LISTENER = r"""
import socket, sys, threading
tcp = socket.create_server(("0.0.0.0", int(sys.argv[1])))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("0.0.0.0", int(sys.argv[1])))
def accept():
    while True:
        conn, _ = tcp.accept()
        print(conn.recv(200).decode().strip(), flush=True)
threading.Thread(target=accept, daemon=True).start()
print("listening", flush=True)
while True:
    print(udp.recv(200).decode().strip(), flush=True)
"""


# Run by `ip netns exec` in a namespace of the test's own, its /etc/resolv.conf naming
# 127.0.0.1 (where its "host resolver" listens): a server, listeners, an internet sandbox; then
# a local route (AnyIP) for a range; what the sandbox reached there and at slirp4netns's DNS
# address, 10.0.2.3, printed as JSON.
OWN_NAMESPACE = r"""
import json, socket, subprocess, sys, threading
import requests
sys.path.insert(0, sys.argv[1])
from tests.local.support import CREATE_BODY, Box, local_server, sandbox_of, texts, wait_for

heard = []
def serve(family, kind, address):
    sock = socket.socket(family, kind)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(address)
    if kind == socket.SOCK_STREAM:
        sock.listen()
    def run():
        while True:
            if kind == socket.SOCK_STREAM:
                conn, _ = sock.accept()
                heard.append(conn.recv(100).decode(errors="replace"))
                conn.close()
            else:
                heard.append(sock.recv(100).decode(errors="replace"))
    threading.Thread(target=run, daemon=True).start()
    return sock.getsockname()[1]

port = serve(socket.AF_INET6, socket.SOCK_STREAM, ("::", 0))
serve(socket.AF_INET6, socket.SOCK_DGRAM, ("::", port))
serve(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 53))
serve(socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 53))
PROBE = '''
import errno, json, socket
said = {}
for target, port in TARGETS:
    try:
        with socket.create_connection((target, port), timeout=3) as conn:
            conn.sendall(f"tcp {target}:{port}".encode())
        said[f"tcp {target}"] = "connected"
    except OSError as exc:
        said[f"tcp {target}"] = errno.errorcode.get(exc.errno, str(exc))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.sendto(f"udp {target}:{port}".encode(), (target, port))
        said[f"udp {target}"] = "sent"
    except OSError as exc:
        said[f"udp {target}"] = errno.errorcode.get(exc.errno, str(exc))
print(json.dumps(said))
'''
with local_server(spare_containers=0, isolation=True) as server:
    with requests.Session() as http:
        box = Box(server, http, CREATE_BODY)
        anyip = sys.argv[2]  # a /28, which no interface has an address of
        subprocess.run(["ip", "route", "add", "local", anyip, "dev", "lo"], check=True)
        first = anyip.split("/")[0]
        init = sandbox_of(server, box.id).container.init_pid
        element = ["nft", "get", "element", "netdev", "osb_sync", "host4", "{ %s }" % first]
        enter = ["nsenter", "-t", str(init), "-n", "--"]
        held = lambda: subprocess.run([*enter, *element], capture_output=True).returncode == 0
        blocked = wait_for(held, 10)
        targets = [(first, port), ("10.0.2.3", 53)]
        said = json.loads("".join(texts(box.code(PROBE.replace("TARGETS", repr(targets))))))
        wait_for(lambda: heard, 1)  # what a packet through slirp4netns takes, many times over
print(json.dumps({"blocked": blocked, "said": said, "heard": heard}))
"""


@pytest.fixture
def host_listener() -> Iterator[tuple[int, list[str]]]:
    """TCP and UDP listeners on `::` (every address of the host, IPv4 too), on one port, and
    the payloads they heard."""
    heard: list[str] = []
    while True:
        tcp = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        port = tcp.getsockname()[1]
        udp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        udp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            udp.bind(("::", port))
            break
        except OSError:
            tcp.close()
            udp.close()
    stop = threading.Event()

    def accept() -> None:
        tcp.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = tcp.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(3)
                try:
                    heard.append(conn.recv(200).decode(errors="replace").strip() or "tcp")
                except OSError:
                    heard.append("tcp (connected)")

    def receive() -> None:
        udp.settimeout(0.2)
        while not stop.is_set():
            try:
                heard.append(udp.recv(200).decode(errors="replace").strip())
            except TimeoutError:
                continue

    threads = [threading.Thread(target=accept), threading.Thread(target=receive)]
    for thread in threads:
        thread.start()
    try:
        yield port, heard
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        tcp.close()
        udp.close()


def host_addresses() -> list[str]:
    """Every address of the host's interfaces as iproute2 lists them (not the server's own
    reading), but the IPv6 link-local ones (a connect to them needs a scope)."""
    shown = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True).stdout)
    found = []
    for link in shown:
        for info in link.get("addr_info", []):
            address = ipaddress.ip_address(info["local"])
            if not (address.version == 6 and address.is_link_local):
                found.append(str(address))
    return found


@dataclass(frozen=True)
class Control:
    """A network namespace of the test's own, behind a veth pair whose host end is one more
    address of the host (`host_end`), in a /30 of 198.18.0.0/15 (benchmarking addresses), and
    its listener on every address, on the host listener's port (`heard_by` reads it)."""

    namespace: str
    device: str  # the host end
    network: str  # the /30's own address, free to add to the host end later
    host_end: str
    far_end: str
    listener: subprocess.Popen[str] | None = None


@pytest.fixture
def control(host_listener: tuple[int, list[str]]) -> Iterator[Control]:
    if os.geteuid() != 0:
        pytest.skip("the control network namespace needs root (ip netns)")
    tag = secrets.token_hex(3)
    name, outer, inner = f"osbt{tag}", f"osbh{tag}", f"osbc{tag}"
    base = ipaddress.ip_address("198.18.0.0") + secrets.randbelow(1 << 14) * 4
    made = Control(name, outer, str(base), str(base + 1), str(base + 2))
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
        ["ip", "link", "set", inner, "netns", name],
        ["ip", "addr", "add", f"{made.host_end}/30", "dev", outer],
        ["ip", "link", "set", outer, "up"],
        ["ip", "-n", name, "addr", "add", f"{made.far_end}/30", "dev", inner],
        ["ip", "-n", name, "link", "set", inner, "up"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        listener = listen_in(name, host_listener[0])
        try:
            yield dataclasses.replace(made, listener=listener)
        finally:
            listener.kill()
            listener.wait()
    finally:
        subprocess.run(["ip", "link", "del", outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def blocked_in(server: LocalServer, box: Box, address: str) -> bool:
    """Whether the sandbox's firewall holds `address` (read from the host, as root)."""
    sandbox = sandbox_of(server, box.id)
    assert sandbox is not None and sandbox.container.init_pid is not None
    element = ["nft", "get", "element", "netdev", "osb_sync", "host4", f"{{ {address} }}"]
    enter = ["nsenter", "-t", str(sandbox.container.init_pid), "-n", "--"]
    return subprocess.run([*enter, *element], capture_output=True).returncode == 0


def take_pid(pid: int, argv: list[str]) -> subprocess.Popen[bytes] | None:
    """`argv` started as process `pid` (a free pid), or None if another process holds it now
    or other forks kept taking it. The kernel gives the next fork the pid after
    `ns_last_pid`, which root may set (as CRIU does); a fork elsewhere between that write and
    ours gets `pid` instead (CI runs other suites beside this one), and may keep it."""
    for _ in range(50):
        if os.path.exists(f"/proc/{pid}"):
            return None
        with open("/proc/sys/kernel/ns_last_pid", "w") as last:
            last.write(str(pid - 1))
        proc = subprocess.Popen(argv)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def listen_in(namespace: str, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", namespace, sys.executable, "-c", LISTENER, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
    return proc


def heard_by(control: Control, awaited: set[str], timeout: float) -> list[str]:
    """The control listener's lines, once it printed all of `awaited` or after `timeout`."""
    proc = control.listener
    assert proc is not None and proc.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.strip() for line in proc.stdout))
    reader.start()
    wait_for(lambda: awaited <= set(lines), timeout)
    proc.terminate()
    reader.join(30)
    proc.wait(30)
    return lines


def probe(box: Box, targets: list[str], port: int) -> dict[str, str]:
    script = PROBE.replace("TARGETS", repr(targets)).replace("PORT", str(port))
    out = texts(box.code(script))
    assert out, box.code(script)
    said: dict[str, str] = json.loads("".join(out))
    return said


@pytest.fixture
def server() -> Iterator[LocalServer]:
    require_isolation()
    require_slirp()
    with local_server(command_grace=0, spare_containers=0, isolation=True) as srv:
        yield srv


def test_an_internet_sandbox_reaches_no_address_of_the_host(
    server: LocalServer,
    http: requests.Session,
    host_listener: tuple[int, list[str]],
    control: Control,
) -> None:
    port, heard = host_listener
    box = Box(server, http, CREATE_BODY)
    # An address the host gains after the sandbox started is followed.
    later = ["ip", "addr", "add", f"{control.network}/32", "dev", control.device]
    subprocess.run(later, check=True, capture_output=True)
    assert wait_for(lambda: blocked_in(server, box, control.network), 10)
    far_end = control.far_end
    targets = [*host_addresses(), "0.0.0.0", "10.0.2.2", "224.0.0.1", far_end]
    assert control.network in targets and control.host_end in targets
    # Its root has no CAP_NET_ADMIN over its network namespace, nor a user namespace of its
    # own to get one in (seccomp): the tables stay as they are.
    changed = texts(box.command("nft flush ruleset 2>&1; nft list ruleset 2>&1; echo rc=$?"))
    status = texts(box.command("grep -E '^Cap(Eff|Bnd)' /proc/self/status"))
    nested = texts(box.command("unshare -rn true 2>&1; echo $?"))
    said = probe(box, targets, port)
    ways = {f"tcp {far_end}", f"udp {far_end}", f"raw 0x0000 {far_end}"}
    from_far_end = heard_by(control, ways, 30)
    assert not heard, f"the host heard {heard}; the sandbox said {said}"
    # The control: each way out works, to an address that is not the host's.
    assert ways <= set(from_far_end), said
    for target in targets[:-1]:
        assert said[f"tcp {target}"] != "connected", (target, said)
    assert any("Operation not permitted" in line for line in changed), changed
    assert nested[-1] != "0", nested
    for line in status:
        assert not int(line.split()[1], 16) >> CAP_NET_ADMIN & 1, line
    # Internet taken away and given back (the tables loaded again): the host stays out.
    policy = f"{server.api_base}/sandboxes/{box.id}/networkpolicy"
    for action in ("deny", "allow"):
        assert http.put(policy, json={"defaultAction": action}).status_code == 200
    again = probe(box, [control.host_end, "127.0.0.1"], port)
    time.sleep(0.5)  # what a packet through slirp4netns would take, many times over
    assert not heard and again[f"tcp {control.host_end}"] != "connected", again


def test_a_deny_all_sandbox_still_reaches_nothing(
    server: LocalServer,
    http: requests.Session,
    host_listener: tuple[int, list[str]],
    control: Control,
) -> None:
    port, heard = host_listener
    box = Box(server, http, {**CREATE_BODY, "networkPolicy": DENY_ALL})
    said = probe(box, [*host_addresses(), control.far_end], port)
    assert heard_by(control, {"nothing"}, 1) == [] and heard == [], said
    assert not any(outcome == "connected" for outcome in said.values()), said


def test_a_dead_sandbox_s_policy_change_touches_no_namespace_of_its_recycled_pid(
    server: LocalServer, http: requests.Session
) -> None:
    """A sandbox's container can end (its own code can end it) while the sandbox stays listed;
    its init's pid then goes to the next process, here one in a namespace of the test's own.
    A policy change must not reach that namespace: refused, and nothing made there."""
    if os.geteuid() != 0 or not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("taking a given pid needs root and a writable /proc/sys (ns_last_pid)")
    name = f"osbt{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        # A pid another process took first is lost: a new sandbox gives a new one.
        for _ in range(5):
            box = Box(server, http, CREATE_BODY)
            sandbox = sandbox_of(server, box.id)
            assert sandbox is not None and sandbox.container.init_pid is not None
            init = sandbox.container.init_pid
            os.kill(init, signal.SIGKILL)
            assert wait_for(lambda gone=init: not os.path.exists(f"/proc/{gone}"), 30)
            squatter = take_pid(init, ["ip", "netns", "exec", name, "sleep", "60"])
            if squatter is not None:
                break
        else:
            pytest.fail("five sandboxes' init pids were each taken by other processes first")
        try:
            ours = os.stat(f"/run/netns/{name}").st_ino
            assert wait_for(lambda: os.stat(f"/proc/{init}/ns/net").st_ino == ours, 10)
            policy = f"{server.api_base}/sandboxes/{box.id}/networkpolicy"
            answers = [
                http.put(policy, json={"defaultAction": action}) for action in ("deny", "allow")
            ]
            links = subprocess.run(["ip", "-n", name, "-o", "link"], capture_output=True, text=True)
            tables = subprocess.run(
                ["ip", "netns", "exec", name, "nft", "list", "tables"],
                capture_output=True,
                text=True,
            )
        finally:
            squatter.kill()
            squatter.wait()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    said = [(answer.status_code, answer.text[:200]) for answer in answers]
    made = [line.split(":")[1].strip() for line in links.stdout.splitlines()]
    assert made == ["lo"] and tables.stdout == "", (made, tables.stdout, said)
    for answer in answers:
        assert answer.status_code == 409, answer.text
        assert "exited" in answer.json()["message"], answer.text


def test_a_local_route_and_the_host_s_resolver_are_the_host_too() -> None:
    """AnyIP: a local route makes a whole range this host's (`ip route add local`, added after
    the sandbox started), its listeners answering on every address of it; and slirp4netns's
    DNS address, 10.0.2.3, would forward to the host's resolver, often on its loopback
    (systemd-resolved's 127.0.0.53): neither reaches the host. The server runs in a network
    namespace of the test's own, with a resolv.conf of its own."""
    require_isolation()
    require_slirp()
    if os.geteuid() != 0:
        pytest.skip("a network namespace of the test's own needs root (ip netns)")
    name = f"osbt{secrets.token_hex(3)}"
    anyip = ipaddress.ip_address("198.18.0.0") + secrets.randbelow(1 << 13) * 16
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        with tempfile.NamedTemporaryFile("w", suffix=".conf") as resolv:
            resolv.write("nameserver 127.0.0.1\n")
            resolv.flush()
            bind = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
            repo = str(Path(__file__).resolve().parents[2])  # where `tests` is a package
            argv = [sys.executable, "-c", OWN_NAMESPACE, repo, f"{anyip}/28"]
            done = subprocess.run(
                ["ip", "netns", "exec", name, "sh", "-c", bind, resolv.name, *argv],
                capture_output=True,
                text=True,
                timeout=120,
            )
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["blocked"] and seen["heard"] == [], seen
    assert seen["said"][f"tcp {anyip}"] != "connected", seen
