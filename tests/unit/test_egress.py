"""Egress by name (`osb_sync/local/host/egress.py`): the rules' semantics, DNS on bytes, and
the resolver's decisions, with its upstream and its sets replaced by recorders."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from osb_sync.local.host import egress
from osb_sync.local.host.egress import Resolver, Rules, TargetError


def rules(*pairs: tuple[str, str], default: str = "deny") -> Rules:
    return Rules.of(
        {"defaultAction": default, "egress": [{"action": a, "target": t} for a, t in pairs]}
    )


def test_a_wildcard_matches_names_below_it_only() -> None:
    wild = rules(("allow", "*.example.org"))
    assert wild.allows("a.example.org") and wild.allows("a.b.example.org")
    assert not wild.allows("example.org")
    assert not wild.allows("evilexample.org")
    assert not wild.allows("example.org.evil.test")


def test_an_exact_name_matches_itself_only() -> None:
    exact = rules(("allow", "example.org"))
    assert exact.allows("example.org")
    assert not exact.allows("a.example.org") and not exact.allows("example.org.denied.test")


def test_the_first_matching_rule_wins_and_the_default_decides_the_rest() -> None:
    ordered = rules(("deny", "bad.example.org"), ("allow", "*.example.org"))
    assert not ordered.allows("bad.example.org") and ordered.allows("good.example.org")
    reversed_ = rules(("allow", "*.example.org"), ("deny", "bad.example.org"))
    assert reversed_.allows("bad.example.org")
    assert not ordered.allows("other.test")
    assert rules(("deny", "evil.test"), default="allow").allows("other.test")


@pytest.mark.parametrize("target", ["Example.ORG", "example.org.", "EXAMPLE.org."])
def test_targets_are_compared_without_case_or_trailing_dot(target: str) -> None:
    assert rules(("allow", target)).allows("example.org")


def test_a_non_ascii_target_is_compared_in_its_idna_form() -> None:
    assert rules(("allow", "bücher.example")).allows("xn--bcher-kva.example")
    assert egress.normal_name("BÜCHER.example.") == "xn--bcher-kva.example"


@pytest.mark.parametrize(
    "target",
    ["192.0.2.1", "10.0.0.0/8", "::1", "[2001:db8::1]", "2001:db8::/32"],
)
def test_ip_and_cidr_targets_are_refused_as_upstream_refuses_them(target: str) -> None:
    with pytest.raises(TargetError, match="IP and CIDR targets are not supported"):
        egress.check_target(target)


@pytest.mark.parametrize(
    "target", ["", "*", "*.", "a.*.test", "a..test", "exa mple.test", "a/b", "x" * 64 + ".test"]
)
def test_targets_that_are_no_host_name_are_refused(target: str) -> None:
    with pytest.raises(TargetError):
        egress.check_target(target)


def query(name: str, qtype: int = 1, ident: int = 7) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return (
        struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", qtype, 1)
    )


def test_a_question_is_read_lowercased_and_a_pointer_loop_is_refused() -> None:
    question = egress.parse_question(query("ALLOWED.Test"))
    assert (question.ident, question.name, question.qtype, question.rd) == (
        7,
        "allowed.test",
        1,
        True,
    )
    looped = struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c" + b"\0\1\0\1"
    with pytest.raises(ValueError):
        egress.parse_question(looped)
    with pytest.raises(ValueError):
        egress.parse_question(query("a.test")[:-3])  # cut short
    with pytest.raises(ValueError):  # a response is no query
        egress.parse_question(b"\0\7\x81\0" + query("a.test")[4:])


def a_record(owner: str, address: str, ttl: int = 300) -> egress.Record:
    return (owner, egress.TYPE_A, ttl, socket.inet_aton(address))


def cname(owner: str, target: str, ttl: int = 300) -> egress.Record:
    return (owner, egress.TYPE_CNAME, ttl, egress.encode_name(target))


class Recorder:
    """The resolver's upstream and sets, recorded."""

    def __init__(self, records: list[egress.Record], rcode: int = 0) -> None:
        self.records, self.rcode = records, rcode
        self.asked: list[str] = []
        self.allowed: list[dict[str, int]] = []
        self.disallowed: list[list[str]] = []
        self.events: list[str] = []

    def ask(self, name: str) -> egress.Answer:
        self.asked.append(name)
        return self.rcode, list(self.records)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket()
    yield udp, tcp
    udp.close()
    tcp.close()


def resolver(
    policy: Rules, recorder: Recorder, pair: tuple[socket.socket, socket.socket]
) -> Resolver:
    return Resolver(
        policy,
        *pair,
        allow=recorder.allowed.append,
        disallow=recorder.disallowed.append,
        report=recorder.events.append,
        ask=recorder.ask,
    )


def records_of(reply: bytes) -> tuple[int, list[str]]:
    """(rcode, A addresses) of our answer."""
    rcode = reply[3] & 0xF
    count = struct.unpack_from("!H", reply, 6)[0]
    _, at = egress.read_name(reply, 12)
    at += 4
    found = []
    for _ in range(count):
        _, at = egress.read_name(reply, at)
        rtype, _, _, length = struct.unpack_from("!HHIH", reply, at)
        at += 10
        if rtype == egress.TYPE_A:
            found.append(socket.inet_ntoa(reply[at : at + length]))
        at += length
    return rcode, found


def test_an_allowed_name_is_answered_and_its_addresses_handed_out_for_at_least_a_minute(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    recorder = Recorder([a_record("allowed.test", "198.18.1.1", ttl=5)])
    reply = resolver(rules(("allow", "allowed.test")), recorder, pair).answer(query("Allowed.TEST"))
    assert reply is not None and records_of(reply) == (0, ["198.18.1.1"])
    assert recorder.asked == ["allowed.test"]
    assert recorder.allowed == [{"198.18.1.1": egress.MIN_TTL}]
    assert reply[12 : 12 + 14] == query("Allowed.TEST")[12 : 12 + 14]  # the question as asked


def test_a_denied_name_never_leaves_the_server_and_shows_in_the_events(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    recorder = Recorder([a_record("denied.test", "198.18.1.2")])
    server = resolver(rules(("allow", "allowed.test")), recorder, pair)
    for name in ("denied.test", "allowed.test.denied.test", "denied.test"):
        reply = server.answer(query(name))
        assert reply is not None and records_of(reply) == (egress.NXDOMAIN, [])
    assert recorder.asked == [] and recorder.allowed == []
    assert recorder.events == [
        "egress denied: denied.test (no rule allows it)",
        "egress denied: allowed.test.denied.test (no rule allows it)",
    ]  # one line per name a minute


def test_a_hostile_upstream_answer_hands_out_the_chain_of_the_name_asked_only(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    recorder = Recorder(
        [
            a_record("evil.test", "198.18.9.9"),  # another owner: not the answer
            cname("alias.test", "target.other.test"),
            a_record("target.other.test", "198.18.1.7", ttl=10**6),
            a_record("alias.test", "198.18.9.8"),  # beside a CNAME: not the chain's end
        ]
    )
    reply = resolver(rules(("allow", "alias.test")), recorder, pair).answer(query("alias.test"))
    assert reply is not None and records_of(reply) == (0, ["198.18.1.7"])
    assert recorder.allowed == [{"198.18.1.7": egress.MAX_TTL}]


def test_a_cname_loop_ends() -> None:
    looped = [cname("a.test", "b.test"), cname("b.test", "a.test")]
    assert len(egress.chain("a.test", looped)) == 2


def test_other_types_get_no_data_and_ask_nobody(pair: tuple[socket.socket, socket.socket]) -> None:
    recorder = Recorder([])
    server = resolver(rules(("allow", "allowed.test")), recorder, pair)
    reply = server.answer(query("allowed.test", qtype=28))  # AAAA: IPv6 has no way out
    assert reply is not None and records_of(reply) == (0, [])
    assert recorder.asked == []
    assert server.answer(b"\0\1garbage") is None


def test_the_sets_are_capped(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(egress, "MAX_ADDRESSES", 2)
    recorder = Recorder([])
    server = resolver(rules(("allow", "*.wild.test")), recorder, pair)
    for index in range(3):
        recorder.records = [a_record(f"h{index}.wild.test", f"198.18.2.{index}")]
        reply = server.answer(query(f"h{index}.wild.test"))
        assert reply is not None
        assert records_of(reply)[0] == (egress.SERVFAIL if index == 2 else 0)
    assert set(server.handed()) == {"198.18.2.0", "198.18.2.1"}


def test_a_changed_policy_takes_the_removed_names_addresses_out(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    recorder = Recorder([])
    server = resolver(rules(("allow", "a.test"), ("allow", "b.test")), recorder, pair)
    for name, address in (
        ("a.test", "198.18.3.1"),
        ("b.test", "198.18.3.2"),
        ("b.test", "198.18.3.1"),
    ):
        recorder.records = [a_record(name, address)]
        server.answer(query(name))
    server.set_rules(rules(("allow", "b.test")))
    assert recorder.disallowed == []  # 198.18.3.1 is b.test's too
    assert server.handed() == {"198.18.3.1": {"b.test"}, "198.18.3.2": {"b.test"}}
    server.set_rules(rules())
    assert sorted(recorder.disallowed[0]) == ["198.18.3.1", "198.18.3.2"]
    assert server.handed() == {}


def test_questions_beyond_the_burst_are_dropped(pair: tuple[socket.socket, socket.socket]) -> None:
    server = resolver(rules(), Recorder([]), pair)
    taken = sum(server._take() for _ in range(int(egress.BURST) + 50))
    assert int(egress.BURST) <= taken < int(egress.BURST) + 10


def test_a_large_answer_is_truncated_for_udp() -> None:
    question = egress.parse_question(query("many.test"))
    records = [a_record("many.test", f"198.18.4.{i}") for i in range(32)]
    small = egress.response(question, 0, records)
    assert small[2] & 0x02 and struct.unpack_from("!H", small, 6)[0] == 0  # TC, no records
    big = egress.response(question, 0, records, limit=65535)
    assert struct.unpack_from("!H", big, 6)[0] == 32


def test_the_server_s_resolvers_are_read_from_its_resolv_conf(
    tmp_path: pytest.TempPathFactory,
) -> None:
    conf = tmp_path / "resolv.conf"  # type: ignore[operator]
    conf.write_text("# x\nnameserver 198.18.0.53\nnameserver fe80::1%eth0\nnameserver bogus\n")
    # a link-local server keeps its zone (F13: connect refuses fe80::1 without one)
    assert egress.upstreams(str(conf)) == ["198.18.0.53", "fe80::1%eth0"]
    assert egress.upstreams(str(conf) + ".missing") == ["127.0.0.1"]


def test_a_slow_tcp_client_holds_the_resolver_for_tcp_timeout_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sandbox that trickles a TCP question byte by byte is cut off after TCP_TIMEOUT in
    all, not per byte: its UDP questions are answered soon after."""
    monkeypatch.setattr(egress, "TCP_TIMEOUT", 1.0)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    tcp = socket.create_server(("127.0.0.1", 0))
    recorder = Recorder([a_record("allowed.test", "198.18.1.1")])
    server = resolver(rules(("allow", "allowed.test")), recorder, (udp, tcp))
    server.start()
    slow = socket.create_connection(tcp.getsockname())
    asker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        started = time.monotonic()
        slow.sendall(b"\x00\x40")  # 64 bytes to come
        stop = threading.Event()

        def trickle() -> None:
            for byte in query("allowed.test")[:20]:
                if stop.wait(0.2):
                    return
                with contextlib.suppress(OSError):
                    slow.send(bytes([byte]))

        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(0.3)
        asker.settimeout(10)
        asker.sendto(query("allowed.test"), udp.getsockname())
        reply = asker.recv(4096)
        waited = time.monotonic() - started
        stop.set()
        assert records_of(reply) == (0, ["198.18.1.1"])
        assert waited < 2.5, waited  # the trickle alone lasts 4 s
    finally:
        server.stop()
        slow.close()
        asker.close()


@dataclass
class Busy:
    """A started Resolver (STOP_WAIT 0.2 s) whose upstream question for allowed.test waits
    on `release`."""

    server: Resolver
    udp: socket.socket
    tcp: socket.socket
    recorder: Recorder
    release: threading.Event


def busy_resolver(monkeypatch: pytest.MonkeyPatch) -> Busy:
    """A Busy resolver, its question asked and upstream when this returns."""
    monkeypatch.setattr(egress, "STOP_WAIT", 0.2)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    tcp = socket.create_server(("127.0.0.1", 0))
    release, asked = threading.Event(), threading.Event()

    def slow_ask(name: str) -> egress.Answer:
        asked.set()
        release.wait(10)
        return 0, [a_record(name, "198.18.1.1")]

    recorder = Recorder([])
    server = Resolver(rules(("allow", "allowed.test")), udp, tcp, recorder.allowed.append,
                      recorder.disallowed.append, recorder.events.append, ask=slow_ask)  # fmt: skip
    server.start()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as asker:
        asker.sendto(query("allowed.test"), udp.getsockname())
        assert asked.wait(5)
    return Busy(server, udp, tcp, recorder, release)


def test_a_resolver_stopped_while_busy_closes_its_sockets_once_it_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The delete of a sandbox waits STOP_WAIT at most for its resolver; what the resolver
    still holds is closed when its question is done, not left open."""
    busy = busy_resolver(monkeypatch)
    started = time.monotonic()
    busy.server.stop()
    assert time.monotonic() - started < 2
    busy.release.set()
    assert wait_until(lambda: busy.udp.fileno() == -1 and busy.tcp.fileno() == -1, 5)


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not predicate():
        time.sleep(0.05)
    return predicate()


def test_names_kept_per_address_are_capped(pair: tuple[socket.socket, socket.socket]) -> None:
    """A wildcard whose domain answers one address for every name: a sandbox asking about
    ever new names grows no table without bound in the server."""
    recorder = Recorder([])
    server = resolver(rules(("allow", "*.wild.test")), recorder, pair)
    for index in range(egress.NAMES_PER_ADDRESS * 4):
        name = f"n{index}.wild.test"
        recorder.records = [a_record(name, "198.18.1.3")]
        reply = server.answer(query(name))
        assert reply is not None and records_of(reply) == (0, ["198.18.1.3"])
    assert len(server.handed()["198.18.1.3"]) == egress.NAMES_PER_ADDRESS
    assert len(recorder.allowed) == 1  # the set's entry was fresh all along


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(st.binary(max_size=600), st.integers(0, 600), st.binary(min_size=1, max_size=8))
def test_no_query_bytes_raise_or_reach_upstream_unless_allowed(
    junk: bytes, at: int, patch: bytes
) -> None:
    """Whatever bytes a sandbox sends its resolver (junk, or a valid query with bytes
    changed): an answer or none, never an exception; only an allowed name is asked about."""
    recorder = Recorder([a_record("allowed.test", "198.18.1.1")])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, socket.socket() as tcp:
        server = resolver(rules(("allow", "allowed.test")), recorder, (udp, tcp))
        base = query("allowed.test")
        mutated = base[:at] + patch + base[at + len(patch) :]
        for data in (junk, mutated):
            reply = server.answer(data)
            assert reply is None or reply[:2] == data[:2]  # its id, when it answers
    assert set(recorder.asked) <= {"allowed.test"}
    for names in server.handed().values():
        assert names <= {"allowed.test"}


# --- the review's findings (attack-44-s3.md), each failing before its fix ---


def test_a_removed_name_is_revoked_after_its_ttl_passed_too(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """F1: an open connection outlives its entry's TTL (its conntrack mark); a question about
    another name after that must not make the resolver forget the address, or removing the
    name would leave that connection open."""
    clock = [1000.0]
    monkeypatch.setattr(egress.time, "monotonic", lambda: clock[0])
    recorder = Recorder([a_record("allowed.test", "198.18.1.1", ttl=60)])
    server = resolver(rules(("allow", "allowed.test"), ("allow", "*.wild.test")), recorder, pair)
    server.answer(query("allowed.test"))
    clock[0] += 61
    recorder.records = [a_record("x.wild.test", "198.18.1.3", ttl=60)]
    server.answer(query("x.wild.test"))
    server.set_rules(rules(("allow", "*.wild.test")))
    assert recorder.disallowed == [["198.18.1.1"]]


def test_no_set_changes_once_stop_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    """F2: a question still upstream when the sandbox is deleted: its answer must not reach
    the sets after stop() returned (the namespace's descriptor is closed then, and its
    number may be another sandbox's)."""
    busy = busy_resolver(monkeypatch)
    busy.server.stop()
    busy.release.set()
    assert wait_until(lambda: busy.udp.fileno() == -1, 5)
    assert busy.recorder.allowed == []
    busy.server.set_rules(rules())  # nor a change after it
    assert busy.recorder.disallowed == []


def test_a_full_table_costs_little_per_question_and_memory(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """F4: a wildcard over a domain that answers an address per name fills the table; each
    question then must not sweep it all in the server's process, nor the table hold tens of
    MiB."""
    recorder = Recorder([])
    server = resolver(rules(("allow", "*.wild.test")), recorder, pair)
    long = ".".join(["a" * 60] * 3)
    tracemalloc.start()
    for index in range(egress.MAX_ADDRESSES):
        address = f"10.{index // 256}.{index % 256}.1"
        for n in range(egress.NAMES_PER_ADDRESS + 2):
            name = f"{n}x{index}.{long}.wild.test"
            recorder.records = [a_record(name, address)]
            server.answer(query(name))
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    recorder.records = [a_record("q.wild.test", "10.0.0.1")]
    started = time.perf_counter()
    for _ in range(20):
        server.answer(query("q.wild.test"))
    per_question = (time.perf_counter() - started) / 20
    assert size < 4 << 20 and per_question < 0.005, (size, per_question)


def test_a_cname_into_an_explicitly_denied_name_is_refused(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """F6: rules deny secret.corp.test, allow *.corp.test; alias.corp.test is a CNAME of
    secret.corp.test: the denied name's address is not handed out through the alias."""
    recorder = Recorder([cname("alias.corp.test", "secret.corp.test"),
                         a_record("secret.corp.test", "198.18.9.9")])  # fmt: skip
    policy = rules(("deny", "secret.corp.test"), ("allow", "*.corp.test"))
    reply = resolver(policy, recorder, pair).answer(query("alias.corp.test"))
    assert reply is not None and records_of(reply) == (egress.NXDOMAIN, [])
    assert recorder.allowed == []
    assert recorder.events == [
        "egress denied: alias.corp.test (an alias of secret.corp.test, which a rule denies)"
    ]


@pytest.mark.parametrize("target", ["straße.de", "faß.de", "βόλος.gr", "a\u200db.test"])
def test_a_target_idna_2003_would_turn_into_another_domain_is_refused(target: str) -> None:
    """F8: Python's codec is IDNA 2003, which maps ß, ς, ZWJ and ZWNJ (straße.de becomes
    strasse.de, another domain); registries use IDNA 2008: such a target is refused, with
    its fix."""
    with pytest.raises(TargetError, match="xn--"):
        egress.check_target(target)
    assert egress.normal_name("bücher.example") == "xn--bcher-kva.example"  # the rest stays


def test_a_full_table_writes_the_server_log_once_a_minute(
    pair: tuple[socket.socket, socket.socket],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """F9: past the address cap every question was a WARNING line in the server's log."""
    monkeypatch.setattr(egress, "MAX_ADDRESSES", 3)
    recorder = Recorder([])
    server = resolver(rules(("allow", "*.wild.test")), recorder, pair)
    caplog.set_level("WARNING", logger="osb_sync.local")
    for index in range(200):
        recorder.records = [a_record(f"m{index}.wild.test", f"11.0.{index}.1")]
        server.answer(query(f"m{index}.wild.test"))
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1
    assert (
        recorder.events.count(
            "egress denied: m3.wild.test (the sandbox's allowed addresses are full)"
        )
        == 1
    )


def test_a_failed_revocation_is_not_forgotten(pair: tuple[socket.socket, socket.socket]) -> None:
    """F10: when the sets cannot change (nft fails), the policy change fails whole: the
    resolver keeps its rules and its addresses, and the next change revokes them."""
    calls: list[list[str]] = []
    fail = [True]

    def disallow(addresses: list[str]) -> None:
        calls.append(list(addresses))
        if fail[0]:
            raise RuntimeError("nft: set full")

    recorder = Recorder([a_record("allowed.test", "198.18.1.1")])
    server = Resolver(rules(("allow", "allowed.test"), ("allow", "also.test")), *pair,
                      recorder.allowed.append, disallow, recorder.events.append,
                      ask=recorder.ask)  # fmt: skip
    server.answer(query("allowed.test"))
    with pytest.raises(RuntimeError):
        server.set_rules(rules(("allow", "also.test")))
    assert records_of(server.answer(query("allowed.test")) or b"")[0] == 0  # rules unchanged
    fail[0] = False
    server.set_rules(rules())
    assert calls == [["198.18.1.1"], ["198.18.1.1"]]
    assert server.handed() == {}


def test_a_short_upstream_datagram_is_ignored_and_the_answer_awaited() -> None:
    """F5: a datagram shorter than a header from the upstream raised struct.error (no
    ValueError) out of ask_upstream."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as upstream:
        upstream.bind(("127.0.0.1", 0))

        def serve() -> None:
            data, peer = upstream.recvfrom(512)
            upstream.sendto(b"\x00\x01\x02", peer)  # short
            name = egress.parse_question(data).name
            answer = struct.pack("!HHHHHH", struct.unpack("!H", data[:2])[0], 0x8180, 1, 1, 0, 0)
            answer += data[12:] + egress.encode_name(name) + struct.pack("!HHIH", 1, 1, 300, 4)
            upstream.sendto(answer + socket.inet_aton("198.18.1.1"), peer)

        threading.Thread(target=serve, daemon=True).start()
        host, port = upstream.getsockname()
        got = egress.ask_upstream([host], "allowed.test", timeout=5, port=port)
    assert got == (0, [a_record("allowed.test", "198.18.1.1")])


def test_a_full_table_revokes_the_addresses_whose_entries_ended_longest_ago(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """F1 and F4: the table keeps addresses past their TTL, for revocation, until it is full;
    then the one whose entry ended longest ago is revoked (it leaves the boundary's set: its
    connections end, since no change could end them once its names are forgotten)."""
    clock = [1000.0]
    monkeypatch.setattr(egress.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(egress, "MAX_ADDRESSES", 2)
    recorder = Recorder([])
    server = resolver(rules(("allow", "*.wild.test")), recorder, pair)
    for index in range(2):
        recorder.records = [a_record(f"h{index}.wild.test", f"198.18.2.{index}", ttl=60)]
        server.answer(query(f"h{index}.wild.test"))
        clock[0] += 1
    recorder.records = [a_record("h2.wild.test", "198.18.2.2", ttl=60)]
    reply = server.answer(query("h2.wild.test"))
    assert reply is not None and records_of(reply) == (egress.SERVFAIL, [])  # none ended
    assert recorder.disallowed == []
    clock[0] += 60  # both entries ended; their connections may live on
    reply = server.answer(query("h2.wild.test"))
    assert reply is not None and records_of(reply) == (0, ["198.18.2.2"])
    assert recorder.disallowed == [["198.18.2.0"]]  # the oldest, revoked
    assert set(server.handed()) == {"198.18.2.2"}
    recorder.allowed.clear()
    server.refill()  # tables loaded again: the boundary's set gets every address held
    assert recorder.allowed == [{"198.18.2.1": 0, "198.18.2.2": 61}]  # rounded up


def test_an_address_being_handed_out_again_is_not_the_one_revoked_for_room(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(egress.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(egress, "MAX_ADDRESSES", 2)
    recorder = Recorder([])
    server = resolver(rules(("allow", "*.wild.test")), recorder, pair)
    for index in range(2):
        recorder.records = [a_record(f"h{index}.wild.test", f"198.18.2.{index}", ttl=60)]
        server.answer(query(f"h{index}.wild.test"))
        clock[0] += 1
    clock[0] += 60
    recorder.records = [
        a_record("h9.wild.test", "198.18.2.0"),
        a_record("h9.wild.test", "198.18.2.9"),
    ]
    reply = server.answer(query("h9.wild.test"))
    assert reply is not None and records_of(reply) == (0, ["198.18.2.0", "198.18.2.9"])
    assert recorder.disallowed == [["198.18.2.1"]]  # not .0, which this answer hands out
    assert set(server.handed()) == {"198.18.2.0", "198.18.2.9"}
