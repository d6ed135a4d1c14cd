"""The sandboxes' firewall (`osb_sync/local/host/firewall.py`): the host's addresses as netlink
gives them, the sets, and the refusal where its tools are missing (the tables themselves are
tested loaded, in tests/local/test_host_firewall.py)."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path

import pytest

from osb_sync.local.host import bwrap, egress, firewall
from osb_sync.local.host.errors import InternetError, PolicyError
from osb_sync.local.host.identity import IdRange
from osb_sync.local.host.server import answer


def attribute(kind: int, value: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(value), kind) + value
    return data + b"\0" * (-len(data) % 4)


def message(kind: int, body: bytes) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, 2, 1, 0) + body


def new_address(family: int, *attributes: bytes) -> bytes:
    return message(
        firewall.RTM_NEWADDR, struct.pack("=BBBBI", family, 24, 0, 0, 2) + b"".join(attributes)
    )


def route(kind: int, family: int, prefix: int, route_type: int, *attributes: bytes) -> bytes:
    rtmsg = struct.pack("=BBBBBBBBI", family, prefix, 0, 0, 255, 2, 254, route_type, 0)
    return message(kind, rtmsg + b"".join(attributes))


def test_netlink_destinations_are_read_from_a_dump() -> None:
    v4 = socket.inet_pton(socket.AF_INET, "192.0.2.7")
    broadcast = socket.inet_pton(socket.AF_INET, "192.0.2.255")
    v6 = socket.inet_pton(socket.AF_INET6, "2001:db8::7")
    anyip = socket.inet_pton(socket.AF_INET, "198.51.100.0")
    data = (
        new_address(
            socket.AF_INET,
            attribute(firewall.IFA_ADDRESS, v4),
            attribute(firewall.IFA_LOCAL, v4),
            attribute(firewall.IFA_BROADCAST, broadcast),
            attribute(3, b"eth0\0"),
        )
        + new_address(socket.AF_INET6, attribute(firewall.IFA_ADDRESS, v6))
        + new_address(socket.AF_PACKET, attribute(firewall.IFA_ADDRESS, b"\1" * 6))
        # a local route (AnyIP), the host's; a unicast one (type 1), which is not
        + route(firewall.RTM_NEWROUTE, socket.AF_INET, 24, firewall.RTN_LOCAL,
                attribute(firewall.RTA_DST, anyip), attribute(4, b"\1\0\0\0"))
        + route(firewall.RTM_NEWROUTE, socket.AF_INET, 24, 1,
                attribute(firewall.RTA_DST, socket.inet_pton(socket.AF_INET, "203.0.113.0")))
    )  # fmt: skip
    found = {"192.0.2.7", "192.0.2.255", "2001:db8::7", "198.51.100.0/24"}
    assert firewall.parse_destinations(data) == (found, False)
    assert firewall.parse_destinations(data + message(firewall.NLMSG_DONE, b"\0" * 4))[1]
    # `ip route add local default`: every address is the host's; a removal is a change too
    everything = route(firewall.RTM_NEWROUTE, socket.AF_INET6, 0, firewall.RTN_LOCAL)
    assert firewall.parse_destinations(everything)[0] == {"::/0"}
    gone = route(firewall.RTM_DELROUTE, socket.AF_INET, 24, firewall.RTN_LOCAL,
                 attribute(firewall.RTA_DST, anyip))  # fmt: skip
    assert firewall.parse_destinations(gone)[0] == {"198.51.100.0/24"}
    with pytest.raises(OSError, match="Operation not permitted"):
        firewall.parse_destinations(
            message(firewall.NLMSG_ERROR, struct.pack("=i", -1) + b"\0" * 16)
        )


def test_this_host_s_addresses_include_its_loopback() -> None:
    assert {"127.0.0.1", "::1"} <= firewall.host_addresses()


def test_the_sets_hold_the_host_and_the_fixed_ranges_merged() -> None:
    given = ["127.0.0.1", "192.0.2.7", "192.0.2.6", "198.51.100.0/24", "fd00::2", "fe80::1"]
    v4, v6 = firewall.blocked(given)
    assert v4 == [
        "0.0.0.0/8",
        "10.0.2.0/24",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "192.0.2.6/31",
        "198.51.100.0/24",
        "224.0.0.0/4",
        "255.255.255.255/32",
    ]
    wanted = [
        "::/127",
        "::ffff:0:0/96",
        "fd00::2/128",
        "fd00:ec2::254/128",
        "fe80::/10",
        "ff00::/8",
    ]
    assert [ipaddress.ip_network(n) for n in v6] == [ipaddress.ip_network(n) for n in wanted]
    script = firewall.ruleset(v4, v6)
    assert "delete" not in script and "192.0.2.6/31" in script
    assert 'hook egress device "tap0"' in script and "hook output" in script
    # Frames leave only where the bytes' ethertype and the kernel's protocol agree.
    egress = script[script.index("chain egress") : script.index("table inet")]
    assert "policy drop;" in egress and egress.count(" accept") == 2
    assert "@ll,96,16 0x0806 meta protocol arp accept" in egress
    assert "@ll,96,16 0x0800 meta protocol ip ip daddr != @host4 accept" in egress
    again = firewall.ruleset(v4, v6, replace=True)  # both tables replaced, in one transaction
    assert again.count("delete table") == 2 and again.endswith(script)
    update = firewall.set_update(v4, v6)
    assert update.count("flush set") == 3 and "table" not in update.replace(" osb_sync ", " ")


def test_a_sandbox_with_internet_is_refused_where_the_firewall_s_tools_are_missing() -> None:
    ids = IdRange(100000, 100000)
    missing = bwrap.Support("bwrap", "", "slirp4netns", False, None, ids, None)
    with pytest.raises(InternetError) as raised:
        bwrap.network_plan("nothing", missing, accept_unenforced=False)
    assert answer(raised.value).status == 503  # what the create answers
    assert "apt-get install nftables" in answer(raised.value).body["message"]
    with pytest.raises(InternetError) as raised:  # rules accepted unenforced: internet all the same
        bwrap.network_plan("rules", missing, accept_unenforced=True)
    assert answer(raised.value).status == 503
    assert bwrap.network_plan("deny-all", missing, accept_unenforced=False)[0] is False
    no_way_out = bwrap.Support("bwrap", "", None, False, None, ids, None)
    assert bwrap.network_plan("nothing", no_way_out, accept_unenforced=False) == (True, "")
    tools = firewall.Tools("/usr/bin/nsenter", "/usr/sbin/ip", "/usr/sbin/nft")
    complete = bwrap.Support("bwrap", "", "slirp4netns", False, None, ids, tools)
    assert bwrap.network_plan("nothing", complete, accept_unenforced=False) == (True, "")
    # rules by name: enforced where the firewall's tools and slirp4netns are; fail closed
    internet, note = bwrap.network_plan("rules", complete, accept_unenforced=False)
    assert internet is True and "enforced by name" in note
    with pytest.raises(InternetError, match="apt-get install nftables"):
        bwrap.network_plan("rules", missing, accept_unenforced=False)
    with pytest.raises(PolicyError, match="apt-get install slirp4netns"):
        bwrap.network_plan("rules", no_way_out, accept_unenforced=False)


def test_a_policy_with_names_narrows_both_tables_to_the_handed_out_addresses() -> None:
    v4, v6 = firewall.blocked(["192.0.2.6"])
    plain = firewall.ruleset(v4, v6)
    names = firewall.ruleset(v4, v6, names=firewall.Names(40001, 40002, True, 0x1234))
    assert "known4" not in plain and "redirect" not in plain and "mark" not in plain
    egress_chain = names[names.index("chain egress") : names.index("table inet")]
    # the boundary: an address the resolver handed out and holds; never a packet mark (a
    # root with CAP_NET_RAW sets and reads those)
    ip = "@ll,96,16 0x0800 meta protocol ip ip daddr != @host4"
    assert f"{ip} ip daddr @known4 accept" in egress_chain
    assert egress_chain.count(" accept") == 2 and "mark" not in egress_chain
    assert f"set known4 {{ type ipv4_addr; size {firewall.MAX_ALLOWED}; }}" in names
    allowed = f"set allowed4 {{ type ipv4_addr; flags timeout; size {firewall.MAX_ALLOWED}; }}"
    assert names.count(allowed) == 1 and "meta mark" not in names
    output = names[names.index("chain output") : names.index("chain dns")]
    order = [
        f"ct state new ct count over {firewall.CT_LIMIT} reject",  # conntrack's memory, first
        f"udp dport 40001 limit rate over {firewall.DNS_RATE} drop",  # a flood, at its cost
        "127.0.0.1 udp dport 40001 accept",  # the redirected DNS
        "ip daddr @host4 reject",
        "ip daddr @revoked4 meta l4proto tcp reject with tcp reset",  # a removed name's
        "ct state established,related ct mark 0x1234 accept",
        "ip daddr @allowed4 ct mark set 0x1234 accept",
        f"limit rate {firewall.LOG_RATE} log group {firewall.LOG_GROUP}",
        'oifname "tap0" meta l4proto tcp reject with tcp reset',  # the rest
        'oifname "tap0" reject with icmpx admin-prohibited',
    ]
    assert [output.index(rule) for rule in order] == sorted(output.index(r) for r in order)
    # every DNS packet, to any address (a resolver on its loopback too), to the resolver's
    assert "    meta nfproto ipv4 udp dport 53 redirect to :40001\n" in names
    assert "    meta nfproto ipv4 tcp dport 53 redirect to :40002\n" in names
    # an allow default: names refused at the resolver, every address reachable but the host's
    loose = firewall.ruleset(v4, v6, names=firewall.Names(40001, 40002, False, 0x1234))
    assert "mark" not in loose and "@known4 accept" not in loose and "@revoked4 r" not in loose
    assert "redirect to :40001" in loose
    assert firewall.new_mark() != firewall.new_mark() and firewall.new_mark() & 1
    added = firewall.allow_elements({"198.18.1.1": 90, "198.18.1.2": 0})
    # add (a no-op where present), delete, add again: the timeout renewed, in one
    # transaction; out of the revoked set; 0 seconds: the boundary's set only
    assert added.splitlines() == [
        "add element netdev osb_sync known4 { 198.18.1.1 }",
        "add element inet osb_sync allowed4 { 198.18.1.1 }",
        "delete element inet osb_sync allowed4 { 198.18.1.1 }",
        "add element inet osb_sync allowed4 { 198.18.1.1 timeout 90s }",
        "add element inet osb_sync revoked4 { 198.18.1.1 }",
        "delete element inet osb_sync revoked4 { 198.18.1.1 }",
        "add element netdev osb_sync known4 { 198.18.1.2 }",
        "add element inet osb_sync revoked4 { 198.18.1.2 }",
        "delete element inet osb_sync revoked4 { 198.18.1.2 }",
    ]
    removed = firewall.disallow_elements(["198.18.1.1"])
    assert removed.count("delete element") == 2 and "timeout" not in removed
    assert "delete element netdev osb_sync known4 { 198.18.1.1 }" in removed
    assert removed.endswith("add element inet osb_sync revoked4 { 198.18.1.1 }\n")


@pytest.mark.parametrize(("mode", "refused"), [(0o666, False), (0o600, True), (0o660, True)])
def test_a_range_s_root_needs_a_tun_everyone_may_open(
    tmp_path: Path, mode: int, refused: bool
) -> None:
    tun = tmp_path / "tun"
    tun.touch(mode)
    tun.chmod(mode)
    said = firewall.tun_refusal(False, str(tun))
    assert (said is not None) == refused, said
    if refused:
        assert f"mode {mode:04o}" in str(said) and f"chmod 0666 {tun}" in str(said), said


def test_a_missing_tun_is_named() -> None:
    said = firewall.tun_refusal(True, "/nonexistent/tun")
    assert said is not None and "/nonexistent/tun" in said, said


def nflog_packet(payload: bytes) -> bytes:
    """One nfnetlink_log packet message carrying `payload` (and a prefix attribute)."""
    prefix = struct.pack("=HH", 8, 10) + b"osb\0"
    data = struct.pack("=HH", 4 + len(payload), firewall.NFULA_PAYLOAD) + payload
    data += bytes(-len(data) % 4)
    body = struct.pack("=BBH", socket.AF_INET, 0, 0) + prefix + data
    kind = (firewall.NFNL_SUBSYS_ULOG << 8) | firewall.NFULNL_MSG_PACKET
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


def test_refused_packets_are_read_from_the_log_by_destination_protocol_and_port() -> None:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 1, 0, 64, 6, 0,
                     socket.inet_aton("10.0.2.100"), socket.inet_aton("198.18.1.2"))  # fmt: skip
    tcp = struct.pack("!HH", 40000, 80) + bytes(16)
    icmp = ip[:9] + b"\x01" + ip[10:]
    two = nflog_packet(ip + tcp) + nflog_packet(icmp + bytes(8))
    assert firewall.parse_log(two) == [("198.18.1.2", 6, 80), ("198.18.1.2", 1, 0)]
    assert firewall.parse_log(nflog_packet(ip[:12])) == []  # cut short: nothing, no error
    assert firewall.parse_log(two[:30]) == []
    assert firewall.parse_log(b"") == []
    v6 = b"\x60" + bytes(39)
    assert firewall.parse_log(nflog_packet(v6)) == []


def test_a_wall_runs_nothing_once_forgotten_and_holds_its_own_descriptor(tmp_path: Path) -> None:
    """F2 of the review: a resolver's late answer ran `nsenter --net=/proc/self/fd/N` after
    the container had closed N, which the server may have reused for another sandbox's
    namespace. The wall keeps a descriptor of its own, and refuses to run once forgotten."""
    log = tmp_path / "entered"
    nsenter = tmp_path / "nsenter"
    nsenter.write_text(
        '#!/bin/sh\nfor a; do case $a in --net=*) readlink "${a#--net=}" >> '
        f"{log};; esac; done\ncat >/dev/null\n"
    )
    nsenter.chmod(0o755)
    tools = firewall.Tools(str(nsenter), "/bin/true", "/bin/true")
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    wall = firewall.Wall(tools, fd, join_user=False)
    os.close(fd)  # the container's own, closed; another file may get its number
    with open(os.devnull) as other:
        assert other.fileno() == fd
        wall.allow({"198.18.1.1": 60})
    assert log.read_text().startswith("net:[")  # its own descriptor: the namespace still
    wall.forget()
    with pytest.raises(RuntimeError, match="gone"):
        wall.allow({"198.18.1.1": 60})
    with pytest.raises(RuntimeError, match="gone"):
        wall.disallow(["198.18.1.1"])
    assert len(log.read_text().splitlines()) == 1


def test_the_resolver_s_cap_is_the_sets_size() -> None:
    assert egress.MAX_ADDRESSES == firewall.MAX_ALLOWED
