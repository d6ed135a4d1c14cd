"""Egress by name (issue 44), against a fake internet in namespaces the test makes
(`fakenet.py`): a sandbox with rules reaches exactly the allowed names, by name and by the
addresses the server's resolver handed out, and nothing else, however it asks.

Root only (the namespaces); CI runs as root.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import requests

from osb_sync import Client, NetworkPolicy, NetworkRule
from osb_sync.local.host import capacity, firewall
from tests.local.fakenet import (
    ECHO,
    LISTEN,
    ZONE,
    FakeInternet,
    Relay,
    fetch_code,
    parse_result,
    setns,
    wait_until,
)
from tests.local.serverproc import ServerProcess
from tests.local.support import (
    CREATE_BODY,
    Box,
    host_pids_with,
    require_isolation,
    require_slirp,
    texts,
)
from tests.local.test_host_firewall import probe

WILD_POLICY = {
    "defaultAction": "deny",
    "egress": [
        {"action": "allow", "target": "allowed.test"},
        {"action": "allow", "target": "*.wild.test"},
    ],
}


@pytest.fixture(scope="module")
def net() -> Iterator[SimpleNamespace]:
    """A server in the fake internet's `server` namespace, reached through a relay."""
    require_isolation()
    require_slirp()
    if os.geteuid() != 0:
        pytest.skip("the fake internet's namespaces need root")
    internet = FakeInternet()
    server = relay = None
    try:
        server = ServerProcess(wrap=internet.wrap(), ping_interval=0.2, min_timeout=1)
        relay = Relay(internet.server, server.port)
        yield SimpleNamespace(
            internet=internet,
            pid=server.pid,
            api_base=f"http://127.0.0.1:{relay.port}/v1",
            root_dir=str(server.root),
            isolated=True,
        )
    finally:
        if relay is not None:
            relay.close()
        if server is not None:
            server.stop()
        internet.close()


@pytest.fixture
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def make(net: SimpleNamespace, http: requests.Session, policy: Any) -> Box:
    body: dict[str, Any] = {**CREATE_BODY, "timeout": 300}
    if policy is not None:
        body["networkPolicy"] = policy
    return Box(net, http, body)  # type: ignore[arg-type]


def fetch(box: Box, *targets: str) -> dict[str, str]:
    """What each target's fetch gives in the sandbox: ok:<name>, dns or net."""
    events = box.command(f"python3 -I -c {shlex.quote(fetch_code(list(targets)))}")
    return parse_result("".join(texts(events)))


def run_python(box: Box, code: str, *args: str) -> str:
    return "".join(texts(box.command(shlex.join(["python3", "-I", "-c", code, *args]))))


# What a script that holds a connection open runs once it is open: a process whose command
# line says so (the test waits for it), then USE seconds before it uses the connection again.
OPENED = (
    "import subprocess\n"
    "opened = subprocess.Popen(['sh', '-c', 'sleep 60', 'opened-' + sys.argv[-1]])\n"
    "time.sleep(6)\n"
    "opened.kill()\n"
)


def held(box: Box, script: str, *args: str) -> tuple[threading.Thread, list[str], int]:
    """`script` (which runs `OPENED` once its connection is open) started in the sandbox with
    `args`; returned once that connection is open, with its thread, its output to come and
    the host pid of a process in the sandbox."""
    marker = f"{os.getpid()}-{time.monotonic_ns()}"
    out: list[str] = []
    worker = threading.Thread(target=lambda: out.append(run_python(box, script, *args, marker)))
    worker.start()
    assert wait_until(lambda: bool(host_pids_with(f"opened-{marker}")), 30), out
    return worker, out, host_pids_with(f"opened-{marker}")[0]


def remove(box: Box) -> None:
    box.http.delete(f"{box.server.api_base}/sandboxes/{box.id}")


def test_exactly_the_allowed_names_by_name_and_by_address(
    net: SimpleNamespace, http: requests.Session
) -> None:
    box = make(net, http, WILD_POLICY)
    try:
        got = fetch(
            box,
            "allowed.test",
            "ALLOWED.TEST.",  # case and a trailing dot: the same name
            "a.wild.test",
            "deep.b.wild.test",  # the fake zone answers 198.18.1.3 for any name below wild.test
            "wild.test",  # not matched by *.wild.test
            "evilwild.test",
            "denied.test",
            "allowed.test.denied.test",
            ZONE["allowed.test"],  # handed out above: reachable by address too
            ZONE["denied.test"],  # never handed out: an IP literal is denied
            ZONE["wild.test"],
            "198.18.0.1",  # the fake internet's router
        )
    finally:
        remove(box)
    assert got == {
        "allowed.test": "ok:allowed.test",
        "ALLOWED.TEST.": "ok:allowed.test",
        "a.wild.test": "ok:a.wild.test",
        "deep.b.wild.test": "ok:a.wild.test",
        "wild.test": "dns",
        "evilwild.test": "dns",
        "denied.test": "dns",
        "allowed.test.denied.test": "dns",
        ZONE["allowed.test"]: "ok:allowed.test",
        ZONE["denied.test"]: "net",
        ZONE["wild.test"]: "net",
        "198.18.0.1": "net",
    }


def test_allow_all_reaches_the_fake_internet_but_no_address_of_the_server(
    net: SimpleNamespace, http: requests.Session
) -> None:
    box = make(net, http, None)
    try:
        got = fetch(box, "denied.test", "allowed.test", "198.18.0.2")
    finally:
        remove(box)
    assert got == {"denied.test": "ok:denied.test", "allowed.test": "ok:allowed.test",
                   "198.18.0.2": "net"}  # fmt: skip


def test_deny_all_reaches_nothing(net: SimpleNamespace, http: requests.Session) -> None:
    box = make(net, http, {"defaultAction": "deny", "egress": []})
    try:
        got = fetch(box, "allowed.test", ZONE["allowed.test"])
    finally:
        remove(box)
    assert got == {"allowed.test": "dns", ZONE["allowed.test"]: "net"}


def test_no_way_out_reaches_an_address_no_allowed_name_resolved_to(
    net: SimpleNamespace, http: requests.Session
) -> None:
    """A socket's TCP and UDP, and frames the sandbox's root writes itself on the tap device
    (claiming any protocol, through the queue or past it): to the address handed out they go
    (the control), to another address nothing arrives."""
    box = make(net, http, {"egress": [{"action": "allow", "target": "allowed.test"}]})
    try:
        assert fetch(box, "allowed.test") == {"allowed.test": "ok:allowed.test"}
        said = probe(box, [ZONE["denied.test"], ZONE["allowed.test"]], LISTEN)
        time.sleep(1)  # what a packet through slirp4netns would take, many times over
        heard = net.internet.heard()
    finally:
        remove(box)
    allowed, denied = ZONE["allowed.test"], ZONE["denied.test"]
    assert f"tcp {allowed}@{allowed}" in heard and f"udp {allowed}@{allowed}" in heard, (
        heard,
        said,
    )
    assert not [line for line in heard if line.endswith(f"@{denied}")], (heard, said)
    assert said[f"tcp {denied}"] != "connected", said


def test_deleted_sandboxes_leave_no_resolver_thread_or_descriptor(
    net: SimpleNamespace, http: requests.Session
) -> None:
    def counts() -> tuple[int, int]:
        return len(os.listdir(f"/proc/{net.pid}/task")), len(os.listdir(f"/proc/{net.pid}/fd"))

    remove(make(net, http, WILD_POLICY))  # the server's own first-time threads and caches
    before = counts()
    for _ in range(3):
        box = make(net, http, WILD_POLICY)
        assert fetch(box, "allowed.test") == {"allowed.test": "ok:allowed.test"}
        held = counts()[1] - before[1]  # a live sandbox with rules, as the capacity counts it
        assert held + 2 <= capacity.FDS_PER_SANDBOX, held
        remove(box)
    assert wait_until(lambda: counts() <= before, 10), (counts(), before)


def test_a_cname_chain_is_followed_for_the_allowed_name_only(
    net: SimpleNamespace, http: requests.Session
) -> None:
    box = make(net, http, {"egress": [{"action": "allow", "target": "alias.test"}]})
    try:
        got = fetch(box, "alias.test", "target.other.test")
    finally:
        remove(box)
    assert got == {"alias.test": "ok:target.other.test", "target.other.test": "dns"}


# Asks a DNS server itself, over UDP and TCP, at addresses its resolv.conf does not name
ASK = r"""
import json, socket, struct
def query(name):
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", 4242, 0x0100, 1, 0, 0, 0) + labels + b"\0\0\1\0\1"
def rcode_and_last_a(reply):
    answered = struct.unpack("!H", reply[6:8])[0]
    return reply[3] & 0xF, ".".join(map(str, reply[-4:])) if answered else ""
def udp(server, name):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5); s.sendto(query(name), (server, 53)); return rcode_and_last_a(s.recv(4096))
def tcp(server, name):
    with socket.create_connection((server, 53), timeout=5) as s:
        q = query(name); s.sendall(struct.pack("!H", len(q)) + q)
        n = struct.unpack("!H", s.recv(2))[0]; data = b""
        while len(data) < n: data += s.recv(n - len(data))
        return rcode_and_last_a(data)
out = {}
for way, ask in (("udp", udp), ("tcp", tcp)):
    for server in ("198.18.0.53", "192.0.2.53", "127.0.0.53"):
        for name in ("allowed.test", "denied.test"):
            try:
                out[f"{way} {server} {name}"] = list(ask(server, name))
            except OSError as exc:
                out[f"{way} {server} {name}"] = str(exc)
print("RESULT" + json.dumps(out))
"""


def test_dns_of_its_own_udp_and_tcp_to_any_server_reaches_only_the_servers_resolver(
    net: SimpleNamespace, http: requests.Session
) -> None:
    """A sandbox that ignores its resolv.conf (a resolver of its own, DNS over TCP, another
    server's address) gets the server's resolver all the same; nothing else answers."""
    box = make(net, http, {"egress": [{"action": "allow", "target": "allowed.test"}]})
    try:
        got = parse_result(run_python(box, ASK))
    finally:
        remove(box)
    for way in ("udp", "tcp"):
        # 192.0.2.53: nobody's (TEST-NET-1); 127.0.0.53: systemd-resolved's, as the host's
        # resolv.conf often names it (nothing listens there in the sandbox's namespace)
        for server in ("198.18.0.53", "192.0.2.53", "127.0.0.53"):
            assert got[f"{way} {server} allowed.test"] == [0, ZONE["allowed.test"]]
            assert got[f"{way} {server} denied.test"] == [3, ""]  # NXDOMAIN


def test_hosts_file_and_ip_literals_lead_nowhere(
    net: SimpleNamespace, http: requests.Session
) -> None:
    """A name the sandbox maps itself (its own hosts entry is an IP literal to the kernel)
    reaches only an address the resolver handed out; its /etc files are read-only anyway."""
    box = make(net, http, {"egress": [{"action": "allow", "target": "allowed.test"}]})
    try:
        code = (
            "import os\n"
            "for path in ('/etc/hosts', '/etc/resolv.conf'):\n"
            "    try:\n"
            "        open(path, 'a').write('198.18.1.2 denied.test\\n'); print('WROTE', path)\n"
            "    except OSError as exc:\n"
            "        print('REFUSED', path)\n"
        )
        said = run_python(box, code)
        got = fetch(box, ZONE["denied.test"], ZONE["also.test"])
    finally:
        remove(box)
    assert "WROTE" not in said
    assert got == {ZONE["denied.test"]: "net", ZONE["also.test"]: "net"}


def test_patch_and_delete_take_effect_for_new_connections_and_end_open_ones(
    net: SimpleNamespace, http: requests.Session
) -> None:
    box = make(net, http, {"egress": [{"action": "allow", "target": "allowed.test"}]})
    policy = f"{net.api_base}/sandboxes/{box.id}/networkpolicy"
    try:
        assert fetch(box, "allowed.test", "also.test") == {
            "allowed.test": "ok:allowed.test",
            "also.test": "dns",
        }
        added = http.patch(policy, json=[{"action": "allow", "target": "also.test"}])
        assert added.status_code == 200, added.text
        assert fetch(box, "also.test") == {"also.test": "ok:also.test"}

        # An open connection to allowed.test, used again after the rule is gone.
        hold = (
            "import socket, sys, time\n"
            "s = socket.create_connection(('allowed.test', 80), timeout=5)\n"
            "print('OPEN', flush=True)\n"
            f"{OPENED}"
            "try:\n"
            "    s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); print('GOT', s.recv(100))\n"
            "except OSError as exc:\n"
            "    print('ENDED', type(exc).__name__)\n"
        )
        worker, out, _ = held(box, hold)
        gone = http.delete(policy, json=["allowed.test"])
        assert gone.status_code == 200, gone.text
        assert "allowed.test" not in gone.text
        worker.join(30)
        assert "OPEN" in out[0] and "ENDED" in out[0], out
        assert fetch(box, "allowed.test", ZONE["allowed.test"], "also.test") == {
            "allowed.test": "dns",
            ZONE["allowed.test"]: "net",
            "also.test": "ok:also.test",
        }
    finally:
        remove(box)


def test_an_open_connection_outlives_its_address_s_entry_a_new_one_does_not(
    net: SimpleNamespace, http: requests.Session
) -> None:
    """The `allowed4` entries end with the answer's TTL (60 s at least): a download that lasts
    longer goes on (its connection was allowed; the boundary's `known4` still holds the
    address), while a new connection needs the name asked again. The entry is taken out here
    as its timeout would (nft, in the sandbox's namespace), not waited for."""
    box = make(net, http, {"egress": [{"action": "allow", "target": "allowed.test"}]})
    hold = (
        "import socket, sys, time\n"
        f"s = socket.create_connection(('allowed.test', {ECHO}), timeout=5)\n"
        "s.sendall(b'a'); assert s.recv(1) == b'a'\n"
        "print('OPEN', flush=True)\n"
        f"{OPENED}"
        "try:\n"
        "    s.sendall(b'b'); print('ECHOED', s.recv(1))\n"
        "except OSError as exc:\n"
        "    print('ENDED', type(exc).__name__)\n"
        "try:\n"
        f"    socket.create_connection(('{ZONE['allowed.test']}', {ECHO}), timeout=3)\n"
        "    print('NEW CONNECTED')\n"
        "except OSError as exc:\n"
        "    print('NEW REFUSED')\n"
    )
    try:
        worker, out, pid = held(box, hold)
        expire = f"delete element inet osb_sync allowed4 {{ {ZONE['allowed.test']} }}\n"
        done = subprocess.run(
            ["nsenter", "-t", str(pid), "-n", "nft", "-f", "-"],
            input=expire, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        worker.join(30)
    finally:
        remove(box)
    assert "OPEN" in out[0] and "ECHOED b'b'" in out[0], out
    assert "NEW REFUSED" in out[0], out


HOLD = (
    "import socket, sys, time\n"
    "s = socket.create_connection((sys.argv[1], 7), timeout=5)\n"
    "s.sendall(b'a'); assert s.recv(1) == b'a'\n"
    "print('OPEN', flush=True)\n"
    f"{OPENED}"
    "try:\n"
    "    s.settimeout(3); s.sendall(b'b'); print('ECHOED', s.recv(1))\n"
    "except OSError as exc:\n"
    "    print('ENDED', type(exc).__name__)\n"
)


@pytest.mark.parametrize(
    ("first", "then", "name"),
    [
        # opened under allow-all, to a name the new policy does not allow
        (None, [{"egress": [{"action": "allow", "target": "allowed.test"}]}], "denied.test"),
        # opened under rules that allowed it; allow-all; rules that do not: it ends
        (
            {"egress": [{"action": "allow", "target": "allowed.test"}]},
            [{}, {"egress": [{"action": "allow", "target": "also.test"}]}],
            "allowed.test",
        ),
    ],
)
def test_an_open_connection_a_new_policy_does_not_allow_ends(
    net: SimpleNamespace,
    http: requests.Session,
    first: dict[str, Any] | None,
    then: list[dict[str, Any]],
    name: str,
) -> None:
    box = make(net, http, first)
    url = f"{net.api_base}/sandboxes/{box.id}/networkpolicy"
    try:
        worker, out, _ = held(box, HOLD, name)
        for policy in then:
            answer = http.put(url, json=policy)
            assert answer.status_code == 200, answer.text
        worker.join(30)
    finally:
        remove(box)
    assert "OPEN" in out[0] and "ENDED" in out[0], out


def test_from_allow_all_to_rules_and_back_at_run_time(
    net: SimpleNamespace, http: requests.Session
) -> None:
    box = make(net, http, None)
    policy = f"{net.api_base}/sandboxes/{box.id}/networkpolicy"
    try:
        assert fetch(box, "denied.test") == {"denied.test": "ok:denied.test"}
        put = http.put(policy, json={"egress": [{"action": "allow", "target": "allowed.test"}]})
        assert put.status_code == 200, put.text
        assert put.json()["mode"] == "deny_all_with_rules"
        assert fetch(box, "denied.test", "allowed.test", ZONE["denied.test"]) == {
            "denied.test": "dns",
            "allowed.test": "ok:allowed.test",
            ZONE["denied.test"]: "net",
        }
        back = http.put(policy, json={})
        assert back.status_code == 200, back.text
        assert fetch(box, "denied.test") == {"denied.test": "ok:denied.test"}
    finally:
        remove(box)


def test_denied_names_show_in_the_sandbox_events(
    net: SimpleNamespace, http: requests.Session
) -> None:
    box = make(net, http, {"egress": [{"action": "allow", "target": "allowed.test"}]})
    try:
        fetch(box, "denied.test", ZONE["denied.test"])
        events = f"{net.api_base}/sandboxes/{box.id}/diagnostics/events"
        assert wait_until(lambda: "egress denied: denied.test" in http.get(events).text, 10)
        by_address = f"egress denied: {ZONE['denied.test']}:80/tcp (no allowed name resolved to it)"
        assert wait_until(lambda: by_address in http.get(events).text, 10), http.get(events).text
    finally:
        remove(box)


@pytest.mark.parametrize(
    "target", ["198.18.1.2", "198.18.0.0/16", "::1", "*", "exa mple.test", "a.*.test"]
)
def test_targets_that_are_no_host_name_are_refused(
    net: SimpleNamespace, http: requests.Session, target: str
) -> None:
    body = {
        **CREATE_BODY,
        "timeout": 60,
        "networkPolicy": {"egress": [{"action": "allow", "target": target}]},
    }
    refused = http.post(f"{net.api_base}/sandboxes", json=body)
    assert refused.status_code == 400, refused.text
    assert "target" in refused.text or "host name" in refused.text


FLOOD = r"""
import socket, struct, time
q = struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x06denied\x04test\x00\x00\x01\x00\x01"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
sent = 0
end = time.monotonic() + 3
while time.monotonic() < end:
    try:
        sent += 1
        s.sendto(q, ("198.18.0.53", 53))
    except OSError:  # a full buffer, or dropped past the rate (EPERM)
        pass
print("SENT", sent)
"""


def server_cpu(pid: int) -> float:
    """The CPU seconds (user and system) of the process `pid` so far, all its threads."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_query_flood_is_bounded_and_the_resolver_answers_after(
    net: SimpleNamespace, http: requests.Session
) -> None:
    box = make(net, http, {"egress": [{"action": "allow", "target": "allowed.test"}]})
    try:
        cpu = server_cpu(net.pid)
        said = run_python(box, FLOOD)
        spent = server_cpu(net.pid) - cpu
        assert int(said.split("SENT")[1].split()[0]) > 1000, said
        # the flood costs the sandbox's CPU, not the server's (the review's F3: 0.59 of a
        # core in the server, past the sandbox's own limit)
        assert spent < 0.4, (spent, said)  # 0.12 s here with the limit, 1.0-1.4 s without
        started = time.monotonic()
        assert fetch(box, "allowed.test") == {"allowed.test": "ok:allowed.test"}
        assert time.monotonic() - started < 15
        assert http.get(f"{net.api_base}/sandboxes/{box.id}").status_code == 200
    finally:
        remove(box)


# The official OpenSandbox e2e network-policy flows (create with a rule; the blocked and the
# allowed fetch; get; patch, through the lifecycle route and through the egress sidecar's
# /policy; fetch again; delete), ported: allowed.test stands for pypi.org, also.test for
# www.github.com, through this package's client.
SIDECAR, LIFECYCLE = "sidecar", "lifecycle"


@pytest.mark.parametrize("route", [LIFECYCLE, SIDECAR])
def test_official_flow_create_get_patch_fetch_delete(net: SimpleNamespace, route: str) -> None:
    policy = NetworkPolicy("deny", (NetworkRule("allow", "allowed.test"),))
    with Client(net.api_base) as client:
        sandbox = client.create_sandbox(
            template=CREATE_BODY["image"]["uri"], network_policy=policy.to_dict()
        )
        with sandbox:

            def reach(*names: str) -> dict[str, str]:
                code = fetch_code(list(names))
                return parse_result(
                    sandbox.commands.run(f"python3 -I -c {shlex.quote(code)}").stdout
                )

            assert reach("also.test", "allowed.test") == {
                "also.test": "dns",
                "allowed.test": "ok:allowed.test",
            }
            got = sandbox.network_policy.get()
            assert got == policy and got.mode == "deny_all_with_rules"
            change = [NetworkRule("allow", "also.test"), NetworkRule("deny", "allowed.test")]
            if route == LIFECYCLE:
                sandbox.network_policy.patch_rules(change)
            else:
                egress = client.get_endpoint(sandbox.id, 18080)
                patched = requests.patch(
                    f"{egress.url}/policy",
                    headers=egress.headers,
                    json=[r.to_dict() for r in change],
                    timeout=30,
                )
                assert patched.status_code == 200, patched.text
            assert sandbox.network_policy.get() == NetworkPolicy("deny", tuple(change))
            assert reach("also.test", "allowed.test") == {
                "also.test": "ok:also.test",
                "allowed.test": "dns",
            }
            sandbox.network_policy.delete_rules(["also.test", "allowed.test"])
            assert sandbox.network_policy.get() == NetworkPolicy("deny")
            assert reach("also.test", "allowed.test") == {"also.test": "dns", "allowed.test": "dns"}


def test_a_sandbox_s_tracked_connections_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy with rules turns conntrack on in the sandbox's namespace (its nat chain):
    each connection it opens, by the tap device or its loopback (a DNS query from a new port
    is one), holds kernel memory that the host's limit (nf_conntrack_max, 262144 here, per
    namespace) would let grow to some 80 MB. The tables cap them (`CT_LIMIT`; 20 here): the
    tables loaded by themselves in a namespace of the test's, tracked UDP flows on loopback."""
    if os.geteuid() != 0:
        pytest.skip("makes a network namespace: needs root")
    monkeypatch.setattr(firewall, "CT_LIMIT", 20, raising=False)
    name = f"osbt-ct-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        inside = ("ip", "netns", "exec", name)
        subprocess.run([*inside, "ip", "link", "set", "lo", "up"], check=True)
        subprocess.run([*inside, "ip", "tuntap", "add", "dev", "tap0", "mode", "tap"], check=True)
        script = firewall.ruleset(*firewall.blocked([]), names=firewall.Names(5301, 5302, True, 7))
        subprocess.run([*inside, "nft", "-f", "-"], input=script, text=True, check=True)
        outcome: list[int] = []

        def flows() -> None:
            fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
            try:
                setns(fd)
            finally:
                os.close(fd)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
                sink.bind(("127.0.0.1", 9999))
                sent = 0
                for _ in range(60):  # each from a port of its own: a connection each
                    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as flow:
                        try:
                            flow.sendto(b"x", ("127.0.0.1", 9999))
                            sent += 1
                        except OSError:
                            pass
                outcome.append(sent)

        thread = threading.Thread(target=flows)
        thread.start()
        thread.join(30)
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
    assert outcome and 20 <= outcome[0] <= 21, outcome


# Run in a sandbox as its root (CAP_NET_RAW): read the packet mark of its own outgoing frames
# (SO_RCVMARK on a packet socket), then write frames with it, or a guessed one (SO_MARK: only
# CAP_NET_RAW since Linux 5.17), to the address of a denied name; and, the control, to the
# allowed one. The review's F14.
FORGE = r"""
import json, socket, struct, sys, time
ETH_P_ALL, SO_MARK, SO_RCVMARK = 3, 36, 75
tag, allowed, denied = sys.argv[1:4]
out = {}
cap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
cap.bind(("tap0", 0))
try:
    cap.setsockopt(socket.SOL_SOCKET, SO_RCVMARK, 1)
except OSError as exc:
    out["rcvmark"] = repr(exc)
cap.settimeout(3)
conn = socket.create_connection(("allowed.test", 80), timeout=5)
mark = frame = None
end = time.monotonic() + 5
while time.monotonic() < end and frame is None:
    try:
        data, ancillary, _, where = cap.recvmsg(65535, 1024)
    except socket.timeout:
        break
    if where[2] != socket.PACKET_OUTGOING or data[12:14] != b"\x08\x00":
        continue
    if socket.inet_ntoa(data[30:34]) != allowed:
        continue
    frame = data
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_MARK:
            mark = struct.unpack("I", value[:4])[0]
conn.close()
out["mark"] = mark
def checksum(data):
    data += b"\0" * (len(data) % 2)
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF
def udp_frame(target, payload):
    udp = struct.pack("!HHHH", 40000, 9, 8 + len(payload), 0) + payload
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, frame[26:30],
                       socket.inet_aton(target))
    return frame[:14] + head[:10] + struct.pack("!H", checksum(head)) + head[12:] + udp
for label, target, value in (("stolen", denied, mark), ("guessed", denied, 1),
                             ("plain", denied, None), ("control", allowed, None)):
    if frame is None or (label == "stolen" and value is None):
        continue
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
        raw.bind(("tap0", 0))
        try:
            if value is not None:
                raw.setsockopt(socket.SOL_SOCKET, SO_MARK, value)
            raw.send(udp_frame(target, f"{label}-{tag}".encode()))
            out[label] = "sent"
        except OSError as exc:
            out[label] = repr(exc)
print("RESULT" + json.dumps(out))
"""


def test_no_packet_mark_opens_the_boundary(net: SimpleNamespace, http: requests.Session) -> None:
    """A mark its root reads from its own frames, or guesses, takes no frame past the
    boundary to an address no allowed name resolved to; a frame to the handed-out address
    (the control) arrives."""
    box = make(net, http, {"egress": [{"action": "allow", "target": "allowed.test"}]})
    tag = f"forged{os.getpid()}{time.monotonic_ns() % 100000}"
    argv = [tag, ZONE["allowed.test"], ZONE["denied.test"]]
    try:
        said = run_python(box, FORGE + "\n", *argv)
        time.sleep(1.5)  # what a frame through slirp4netns would take, many times over
        heard = [line for line in net.internet.heard() if tag in line]
    finally:
        remove(box)
    assert f"control-{tag}@{ZONE['allowed.test']}" in heard, (said, heard)
    assert not [line for line in heard if line.endswith(f"@{ZONE['denied.test']}")], (said, heard)
