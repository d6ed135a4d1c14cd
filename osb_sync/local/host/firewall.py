"""The host is not the internet: nftables tables in each internet-enabled sandbox's own network
namespace keep it from every address of the machine that runs the server.

slirp4netns, a sandbox's way out, connects from the server's network namespace: to it, any
address of this host is local, so a sandbox with internet access would reach every host service
bound to `0.0.0.0` through the host's own addresses (and, with a frame its root writes itself
on the tap device, as Docker's CAP_NET_RAW allows, the host's loopback too: slirp4netns's
`--disable-host-loopback` only covers its alias 10.0.2.2). So before slirp4netns attaches, the
server makes the namespace's tap device itself (down and without carrier until slirp4netns
takes it: nothing leaves by it before the tables are in) and loads one nft transaction there,
never in the host's ruleset (`ruleset`):

- `table netdev osb_sync`, the boundary: chain `egress`, hooked on the tap device's egress,
  sees every frame that leaves the namespace, a socket's or one written with AF_PACKET (which
  the inet hooks never see, PACKET_QDISC_BYPASS included). It drops all but what it accepts:
  ARP (slirp4netns answers it for its own addresses and forwards none) and IPv4 to an address
  outside the set `host4`, each only where the ethertype in the frame's bytes, which
  slirp4netns reads, and the kernel's protocol for it (`meta protocol`, which a packet
  socket's sender chooses, and by which nft finds the IPv4 header) agree: a frame claiming to
  be ARP, IPv6 or anything else while its bytes say IPv4 is dropped. IPv6 has no way out
  (slirp4netns runs without it), and is dropped.
- `table inet osb_sync`: chain `output` rejects an ordinary socket's packet to the same sets
  at once (admin-prohibited), so a connect fails instead of waiting for its timeout.

The sets hold the host's own destinations (every interface's addresses, and every network of
a route whose packets the host takes itself: local, broadcast and anycast routes, of any
table, as AnyIP's `ip route add local 198.51.100.0/24 dev lo` makes a whole range the
host's; read from the kernel by netlink, `host_addresses`) and the ranges no sandbox has
business with: `FIXED_V4` and `FIXED_V6` (this host's loopback and "this network",
link-local and the cloud metadata addresses in it, multicast and broadcast, which the host's
own listeners receive; IPv4-mapped IPv6, by which a dual-stack socket reaches IPv4). They
follow the host: `AddressWatch` listens for the kernel's address and route changes and
rewrites every such sandbox's sets (`Wall.follow`), one sandbox after another; an address the
host gains is reachable from sandboxes for the moment between the kernel's notice and the
update (milliseconds per sandbox). Other machines, the LAN and containers the host routes to,
are the internet to a sandbox; so is the machine a server in a container runs on (its gateway
is no address of the server's namespace). slirp4netns's DNS address (10.0.2.3), which
forwards to the host's resolver, is turned off (`slirp.start_slirp`), and its network is in
the sets too.

Nobody inside changes them: the namespace belongs to the sandbox's user namespace, whose root
has Docker's capabilities, not CAP_NET_ADMIN, and the seccomp filter refuses new user
namespaces (the root of a nested one would own only namespaces it made, not this one). The
server loads them with `nsenter` (util-linux), `ip` (iproute2) and `nft` (nftables); where one
is missing, a create that would reach the internet is refused (`INSTALL`): fail closed.

A policy with rules (egress by name, `egress.py`, `Names`) adds to the netdev table a set
`known4` of the addresses the sandbox's resolver handed out and still holds (past their TTL
too, until a change removes their names or the resolver forgets them), to the inet table a
set `allowed4` (`flags timeout`, `MAX_ALLOWED` elements) of those within their TTL, a set
`revoked4` of the addresses of names a change removed, and a nat chain `dns` that redirects
every IPv4 DNS packet (port 53, UDP and TCP, to any address) to the resolver's sockets on
the namespace's loopback. That chain turns conntrack on in the namespace: the output chain
first refuses a new connection past `CT_LIMIT` tracked ones (by any device), which the
kernel's limit alone would let cost some 80 MB, and drops DNS past `DNS_RATE`. With a deny
default the netdev chain's IPv4 accept narrows to `known4`: the boundary, for every frame (a
socket's, or one the sandbox's root writes itself), never by a packet mark (a root with
CAP_NET_RAW sets one: SO_MARK, Linux 5.17 and later). The output chain, after the host's
sets, refuses every packet to `revoked4` at once (TCP with a reset), accepts a connection
this load allowed (its conntrack mark, `Names.mark`, new at each load) and a packet to
`allowed4` (marking its connection), and refuses the rest at once, logging it (`LOG_GROUP`,
`LOG_RATE`: the resolver reads the log into the sandbox's events). An entry's timeout (the
answer's TTL) so ends new connections only. The redirected DNS passes first (every chain of
the output hook sees the first route's device, tap0).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import logging
import os
import secrets
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .spawn import HeldThread, owning_user_namespace

logger = logging.getLogger("osb_sync.local")

TABLE = "osb_sync"
FAMILIES = ("netdev", "inet")  # its two tables', one name
DEVICE = "tap0"  # slirp4netns's, as `slirp.start_slirp` names it
# The ethertype as the frame's bytes say (what slirp4netns reads), beside `meta protocol`, the
# kernel's, which a packet socket's sender chooses (its sll_protocol)
ETHERTYPE = "@ll,96,16"
ETH_P_IP, ETH_P_ARP = 0x0800, 0x0806
FIXED_V4 = (
    "0.0.0.0/8",  # "this network": a connect to 0.0.0.0 reaches the host's own listeners
    # slirp4netns's own: its aliases of the host (10.0.2.2) and of the host's resolver
    # (10.0.2.3, which with --disable-dns is passed on as any address is); none other answers
    "10.0.2.0/24",
    "127.0.0.0/8",
    "169.254.0.0/16",  # link-local; the cloud metadata service, 169.254.169.254
    "224.0.0.0/4",
    "255.255.255.255/32",
)
FIXED_V6 = (
    "::/127",  # unspecified and loopback
    "fe80::/10",
    "fd00:ec2::254/128",  # EC2's metadata service over IPv6
    "ff00::/8",
    "::ffff:0:0/96",  # IPv4-mapped: a dual-stack socket reaches IPv4 (127.0.0.1 too) by it
)
TOOLS = ("nsenter", "ip", "nft")
PACKAGES = "apt-get install nftables iproute2 util-linux"
INSTALL = (
    f"a sandbox with internet access needs nftables here ({', '.join(TOOLS)}: the server keeps"
    f" it from this host's own addresses with them), and they are not all installed: {PACKAGES};"
    " or create it with a deny-all networkPolicy"
)
TUN = "/dev/net/tun"  # what `ip tuntap` and slirp4netns open, in the sandbox's namespaces
SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")  # an ordinary user's PATH has no sbin
COMMAND_TIMEOUT = 20.0
MAX_ALLOWED = 1024  # `egress.MAX_ADDRESSES`: the size of the allowed addresses' sets
MAX_REVOKED = 65536  # addresses of names a policy change removed (refused at once)
REVOKED_FOR = "1h"  # then their packets are dropped by the boundary alone
# Connections a sandbox with rules may hold tracked at once (its nat chain turns conntrack on in
# its namespace; the kernel's own limit, per namespace, is often 262144: some 80 MB)
CT_LIMIT = 16384
# DNS questions (UDP packets, TCP connections) a second that reach the resolver; the rest are
# dropped in the sandbox's namespace, at its own cost, never read by the server
DNS_RATE = "200/second burst 200 packets"
LOG_GROUP = 4444  # the nflog group of refused packets, in the sandbox's own namespace
LOG_RATE = "20/second burst 20 packets"
# netlink (linux/netlink.h, linux/rtnetlink.h, linux/if_addr.h)
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFA_ADDRESS, IFA_LOCAL, IFA_BROADCAST = 1, 2, 4
RTA_DST = 1
RTN_LOCAL, RTN_BROADCAST, RTN_ANYCAST = 2, 3, 4  # the routes whose packets the host takes
NOTICES = 0x10 | 0x40 | 0x100 | 0x400  # RTMGRP_IPV4_IFADDR, _IPV4_ROUTE, _IPV6_IFADDR, _IPV6_ROUTE
HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, pid
IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, interface index
RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst and src length, tos, table, protocol,
#                                      scope, type, flags
RTATTR = struct.Struct("=HH")  # length, type


@dataclass(frozen=True)
class Tools:
    """The paths of `nsenter`, `ip` and `nft`."""

    nsenter: str
    ip: str
    nft: str


def find_tools() -> Tools | None:
    """`nsenter`, `ip` and `nft` on PATH or in the system's sbin and bin; None if one is missing."""
    found = []
    for name in TOOLS:
        path = shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))
        if path is None:
            return None
        found.append(path)
    return Tools(*found)


def parse_destinations(data: bytes) -> tuple[set[str], bool]:
    """The host's own destinations in netlink messages `data`, and whether a dump ended
    (NLMSG_DONE): an address message's local, address and broadcast addresses, and a route's
    destination network where the host takes its packets itself (local, broadcast and anycast
    routes, of any table: `ip route add local 198.51.100.0/24 dev lo`, AnyIP, makes a whole
    range the host's, with no interface holding an address of it). New and removed alike.

    Raises:
        OSError: the kernel answered an error.
    """
    found: set[str] = set()
    offset = 0
    wanted: tuple[int, ...]
    while offset + HEADER.size <= len(data):
        length, kind, _, _, _ = HEADER.unpack_from(data, offset)
        if length < HEADER.size:
            break
        body = data[offset + HEADER.size : offset + length]
        offset += (length + 3) & ~3
        if kind == NLMSG_DONE:
            return found, True
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", body)
            if code:
                raise OSError(-code, f"netlink: {os.strerror(-code)}")
            continue
        if kind in (RTM_NEWADDR, RTM_DELADDR) and len(body) >= IFADDRMSG.size:
            wanted, at, prefix = (IFA_ADDRESS, IFA_LOCAL, IFA_BROADCAST), IFADDRMSG.size, None
        elif kind in (RTM_NEWROUTE, RTM_DELROUTE) and len(body) >= RTMSG.size:
            if body[7] not in (RTN_LOCAL, RTN_BROADCAST, RTN_ANYCAST):
                continue
            wanted, at, prefix = (RTA_DST,), RTMSG.size, body[1]
        else:
            continue
        family = body[0]
        size = 4 if family == socket.AF_INET else 16 if family == socket.AF_INET6 else 0
        if not size:
            continue
        values = [bytes(size)] if prefix == 0 else []  # no destination: the whole family
        while at + RTATTR.size <= len(body):
            attr_length, attr_type = RTATTR.unpack_from(body, at)
            if attr_length < RTATTR.size:
                break
            value = body[at + RTATTR.size : at + attr_length]
            if attr_type in wanted and len(value) == size:
                values.append(value)
            at += (attr_length + 3) & ~3
        for value in values:
            network = ipaddress.ip_network((value, size * 8 if prefix is None else prefix), False)
            whole = network.prefixlen == network.max_prefixlen
            found.add(str(network.network_address) if whole else str(network))
    return found, False


def host_addresses() -> set[str]:
    """The server's network namespace's own destinations (IPv4 and IPv6): every interface's
    addresses and every local route's network, as the kernel lists them (RTM_GETADDR and
    RTM_GETROUTE dumps).

    Raises:
        OSError: netlink refused or failed.
    """
    requests = (
        (RTM_GETADDR, IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)),
        (RTM_GETROUTE, RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0)),
    )
    found: set[str] = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(COMMAND_TIMEOUT)
        for sequence, (kind, request) in enumerate(requests, 1):
            header = HEADER.pack(
                HEADER.size + len(request), kind, NLM_F_REQUEST | NLM_F_DUMP, sequence, 0
            )
            sock.send(header + request)
            done = False
            while not done:
                part, done = parse_destinations(sock.recv(1 << 16))
                found |= part
    return found


def blocked(addresses: Iterable[str]) -> tuple[list[str], list[str]]:
    """The IPv4 and IPv6 networks of the sets: `addresses` and the fixed ranges, merged (an
    interval set refuses overlapping elements)."""
    networks = [ipaddress.ip_network(a, strict=False) for a in (*FIXED_V4, *FIXED_V6, *addresses)]
    v4 = [n for n in networks if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in networks if isinstance(n, ipaddress.IPv6Network)]
    return (
        [str(n) for n in ipaddress.collapse_addresses(v4)],
        [str(n) for n in ipaddress.collapse_addresses(v6)],
    )


def _elements(networks: Sequence[str]) -> str:
    return ", ".join(networks)


@dataclass(frozen=True)
class Names:
    """A policy with rules (`egress.py`): the ports of its resolver on the namespace's
    loopback, where the nat chain sends DNS; whether packets may leave only toward the
    addresses it handed out (`restrict`: a deny default; an allow default refuses names
    only); and the conntrack mark of this load's allowed connections (`new_mark`: a load's
    own, so a connection allowed under an earlier load is judged again)."""

    udp: int
    tcp: int
    restrict: bool
    mark: int = 1


def new_mark() -> int:
    """A connection mark for a load of the tables (random, never 0)."""
    return secrets.randbits(31) | 1


def ruleset(
    v4: Sequence[str], v6: Sequence[str], replace: bool = False, names: Names | None = None
) -> str:
    """The nft transaction that makes both tables with these sets (see the module docstring);
    with `replace` (a load after `Wall.down`, or another policy), it deletes them first:
    deleting costs about 10 ms, which a namespace's first load, with no tables yet, is spared.
    With `names`, the sets `known4`, `allowed4` and `revoked4`, the resolver's nat chain and,
    with a deny default, the narrowed accepts too (`egress.py`)."""
    host4 = f"  set host4 {{ type ipv4_addr; flags interval; elements = {{ {_elements(v4)} }}; }}\n"
    host6 = f"  set host6 {{ type ipv6_addr; flags interval; elements = {{ {_elements(v6)} }}; }}\n"
    delete = "".join(f"table {f} {TABLE} {{}}\ndelete table {f} {TABLE}\n" for f in FAMILIES)
    tap = f'oifname "{DEVICE}"'
    ip = f"{ETHERTYPE} {ETH_P_IP:#06x} meta protocol ip ip daddr != @host4"
    boundary = f"    {ip} accept\n"
    known = sets = first = narrowed = dns = ""
    if names is not None:
        known = f"  set known4 {{ type ipv4_addr; size {MAX_ALLOWED}; }}\n"
        sets = (
            f"  set allowed4 {{ type ipv4_addr; flags timeout; size {MAX_ALLOWED}; }}\n"
            f"  set revoked4 {{ type ipv4_addr; flags timeout; timeout {REVOKED_FOR};"
            f" size {MAX_REVOKED}; }}\n"
        )
        # A redirected DNS packet keeps the output hook's first device (tap0) in every chain
        # of the hook: let it by (at 127.0.0.1 now, which the netdev chain never sees).
        first = (
            f"    ct state new ct count over {CT_LIMIT} reject with icmpx admin-prohibited\n"
            f"    ip daddr 127.0.0.1 udp dport {names.udp} limit rate over {DNS_RATE} drop\n"
            f"    ip daddr 127.0.0.1 tcp dport {names.tcp} ct state new"
            f" limit rate over {DNS_RATE} drop\n"
            f"    {tap} ip daddr 127.0.0.1 udp dport {names.udp} accept\n"
            f"    {tap} ip daddr 127.0.0.1 tcp dport {names.tcp} accept\n"
        )
        if names.restrict:
            mark = f"{names.mark:#x}"
            # The boundary: every frame (a socket's, or one the sandbox's root writes itself,
            # which no inet hook sees) only toward an address the resolver handed out and
            # still holds; never by a packet mark, which a root with CAP_NET_RAW sets
            # (SO_MARK, Linux 5.17 and later) and reads (SO_RCVMARK).
            boundary = f"    {ip} ip daddr @known4 accept\n"
            narrowed = (
                # a removed name's address: every packet, an open connection's too, refused
                # at once (the boundary drops them anyway)
                f"    {tap} ip daddr @revoked4 meta l4proto tcp reject with tcp reset\n"
                f"    {tap} ip daddr @revoked4 reject with icmpx admin-prohibited\n"
                # a connection allowed under this load outlives its address's entry (a TTL)
                f"    {tap} ct state established,related ct mark {mark} accept\n"
                f"    {tap} ip daddr @allowed4 ct mark set {mark} accept\n"
                f"    {tap} limit rate {LOG_RATE} log group {LOG_GROUP}\n"  # its events
                f"    {tap} meta l4proto tcp reject with tcp reset\n"
                f"    {tap} reject with icmpx admin-prohibited\n"
            )
        dns = (
            "  chain dns {\n"
            "    type nat hook output priority -100; policy accept;\n"
            f"    meta nfproto ipv4 udp dport 53 redirect to :{names.udp}\n"
            f"    meta nfproto ipv4 tcp dport 53 redirect to :{names.tcp}\n"
            "  }\n"
        )
    return (
        (delete if replace else "") + f"table netdev {TABLE} {{\n{host4}{known}"
        f"  chain egress {{\n"
        f'    type filter hook egress device "{DEVICE}" priority 0; policy drop;\n'
        f"    {ETHERTYPE} {ETH_P_ARP:#06x} meta protocol arp accept\n"
        f"{boundary}"
        f"  }}\n}}\n"
        f"table inet {TABLE} {{\n{host4}{host6}{sets}"
        f"  chain output {{\n"
        f"    type filter hook output priority 0; policy accept;\n"
        f"{first}"
        f"    {tap} ip daddr @host4 reject with icmpx admin-prohibited\n"
        f"    {tap} ip6 daddr @host6 reject with icmpx admin-prohibited\n"
        f"{narrowed}"
        f"  }}\n{dns}}}\n"
    )


def _ensure_then(command: str, element: str) -> list[str]:
    """`command` (delete or add) of `element`, whether or not it is there: an `add` first (a
    no-op where it is), so the transaction never fails on it."""
    return [f"add element {element} }}", f"{command} element {element} }}"]


def allow_elements(addresses: dict[str, int]) -> str:
    """The nft transaction that puts `addresses` in `known4` (the boundary's) and, those with
    seconds left, in `allowed4` with these timeouts (renewing the timeout of those already
    there: `add` alone would not), and takes them out of `revoked4`."""
    lines = []
    for address, seconds in sorted(addresses.items()):
        lines.append(f"add element netdev {TABLE} known4 {{ {address} }}")
        if seconds > 0:
            element = f"inet {TABLE} allowed4 {{ {address}"
            lines += _ensure_then("delete", element)
            lines.append(f"add element {element} timeout {int(seconds)}s }}")
        lines += _ensure_then("delete", f"inet {TABLE} revoked4 {{ {address}")
    return "\n".join(lines) + "\n"


def disallow_elements(addresses: Sequence[str]) -> str:
    """The nft transaction that takes `addresses` out of `known4` and `allowed4` (those that
    expired already too) and puts them in `revoked4` (their open connections are refused at
    once, not left to time out)."""
    lines = []
    for address in sorted(addresses):
        lines += _ensure_then("delete", f"netdev {TABLE} known4 {{ {address}")
        lines += _ensure_then("delete", f"inet {TABLE} allowed4 {{ {address}")
        lines.append(f"add element inet {TABLE} revoked4 {{ {address} }}")
    return "\n".join(lines) + "\n"


def set_update(v4: Sequence[str], v6: Sequence[str]) -> str:
    """The nft transaction that replaces the sets' elements in both tables (atomically)."""
    lines = []
    for family, name, networks in (
        ("netdev", "host4", v4),
        ("inet", "host4", v4),
        ("inet", "host6", v6),
    ):
        lines.append(f"flush set {family} {TABLE} {name}")
        lines.append(f"add element {family} {TABLE} {name} {{ {_elements(networks)} }}")
    return "\n".join(lines) + "\n"


def tun_refusal(own_ids: bool, tun: str = TUN) -> str | None:
    """Why a server that is not root cannot give a sandbox internet access here, with the fix,
    or None: its tap device is made through `tun` by the sandbox's root (the server itself
    where `own_ids`, else an id of its range), which only the file's mode lets open (a user
    namespace's root has no privilege over a file of the host's root)."""
    try:
        mode = os.stat(tun).st_mode
    except OSError as exc:
        return f"a sandbox with internet access needs {tun}, which this host lacks ({exc})"
    if os.access(tun, os.R_OK | os.W_OK) if own_ids else mode & 0o006 == 0o006:
        return None
    return (
        f"a sandbox with internet access needs {tun} (its tap device), which this host lets"
        f" only some ids open (mode {mode & 0o777:04o}; distributions make it 0666, containers"
        f" often 0600): as root, chmod 0666 {tun}; or run the server as root, or create the"
        " sandbox with a deny-all networkPolicy"
    )


class Wall:
    """One sandbox's tables: loaded before its internet is turned on, following the host.

    Args:
        tools: `find_tools`'s.
        netns: a descriptor of the sandbox's network namespace (the container's, which keeps
            it open: never a pid, which a later process may have).
        join_user: enter its user namespace too (a server that is not root has no privilege
            over the network namespace otherwise); as its root, mapped to the range's first id.
        own_ids: the server's own uid and gid are that root (`IdRange.own`): it enters as
            itself, since becoming root there means a `setgroups`, which the map denies (an
            `ip` as another id would lose the capabilities at its exec).
    """

    def __init__(self, tools: Tools, netns: int, join_user: bool, own_ids: bool = False) -> None:
        self._tools = tools
        # its own descriptor, closed by `forget` only: the container's may be closed (and its
        # number reused) while a resolver's late answer is still on its way here
        self._netns, self._join_user, self._own_ids = os.dup(netns), join_user, own_ids
        self._lock = threading.RLock()  # every command, and `forget`
        self._device = False  # the tap device is made
        self._tables = False  # the tables were loaded once (a next load replaces them)
        self._loaded = False  # the tables are in, following the host

    def up(self, names: Names | None = None) -> None:
        """Make the tap device (down) and load the tables with the host's addresses now
        (and, with `names`, a policy's sets and nat chain); they follow the host's until
        `down`.

        Raises:
            RuntimeError: a command failed (its message says which and why); nothing of it
                is left (a next `up` starts afresh).
        """
        with self._lock:
            WATCH.subscribe(self)  # first: an address change from now on is not missed
            try:
                self._run([self._tools.ip, "tuntap", "add", "dev", DEVICE, "mode", "tap"])
                self._device = True
                script = ruleset(*blocked(WATCH.addresses()), self._tables, names)
                self._run([self._tools.nft, "-f", "-"], script)
                self._tables = True
            except BaseException:
                with contextlib.suppress(RuntimeError):
                    self._down()
                raise
            self._loaded = True

    def reload(self, names: Names | None) -> None:
        """Load the tables again (atomically, the tap device kept) for another kind of policy:
        with `names`, its sets (empty) and nat chain; without, allow-all's.

        Raises:
            RuntimeError: nft failed (the tables are as they were).
        """
        with self._lock:
            script = ruleset(*blocked(WATCH.addresses()), True, names)
            self._run([self._tools.nft, "-f", "-"], script)

    def allow(self, addresses: dict[str, int]) -> None:
        """Put `addresses` in the allowed sets for these many seconds.

        Raises:
            RuntimeError: nft failed (a full set, or the namespace is gone).
        """
        self._run([self._tools.nft, "-f", "-"], allow_elements(addresses))

    def disallow(self, addresses: Sequence[str]) -> None:
        """Take `addresses` out of the allowed sets.

        Raises:
            RuntimeError: nft failed.
        """
        self._run([self._tools.nft, "-f", "-"], disallow_elements(addresses))

    def sockets(self) -> tuple[socket.socket, socket.socket, socket.socket]:
        """A UDP socket and a listening TCP socket on the namespace's loopback (127.0.0.1),
        at ports the kernel chose, and a netfilter netlink socket (for the log group
        `LOG_GROUP`, `listen_log`): the resolver's (`egress.py`). A root server makes them
        from a thread that joins the namespace; another server through `nsenter` (a thread
        cannot join a user namespace), which hands them over on a socket pair.

        Raises:
            RuntimeError: they could not be made.
        """
        if not self._join_user:
            return _sockets_in(self._netns)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        with ours, theirs:
            code = HANDOVER.format(fd=theirs.fileno())
            self._run([sys.executable, "-I", "-S", "-c", code], fds=(theirs.fileno(),))
            ours.settimeout(COMMAND_TIMEOUT)
            try:
                _, fds, _, _ = socket.recv_fds(ours, 1, 3)
            except OSError as exc:
                raise RuntimeError(f"the sandbox's resolver could not be set up ({exc})") from None
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            raise RuntimeError("the sandbox's resolver could not be set up (no sockets)")
        return tuple(socket.socket(fileno=fd) for fd in fds)  # type: ignore[return-value]

    def down(self) -> None:
        """Remove the tap device (slirp4netns has left it); the tables stay until the next
        `up` replaces them. Idempotent.

        Raises:
            RuntimeError: `ip` failed.
        """
        with self._lock:
            self._down()

    def _down(self) -> None:
        WATCH.unsubscribe(self)
        self._loaded = False
        if self._device:
            self._device = False
            self._run([self._tools.ip, "link", "del", DEVICE])

    def forget(self) -> None:
        """Stop following the host (the container is gone with its namespace); close the
        descriptor: no command runs after (idempotent)."""
        with self._lock:
            WATCH.unsubscribe(self)
            self._loaded = self._device = False
            if self._netns >= 0:
                os.close(self._netns)
                self._netns = -1

    def follow(self, addresses: set[str]) -> None:
        """Give the sets the host's `addresses` (the watch calls it on a change)."""
        with self._lock:
            if self._loaded:
                self._run([self._tools.nft, "-f", "-"], set_update(*blocked(addresses)))

    def _run(self, argv: list[str], script: str | None = None, fds: tuple[int, ...] = ()) -> None:
        with self._lock:
            if self._netns < 0:
                raise RuntimeError("the sandbox's network namespace is gone")
            self._run_in(argv, script, fds)

    def _run_in(self, argv: list[str], script: str | None, fds: tuple[int, ...]) -> None:
        user = -1
        try:
            enter = [self._tools.nsenter, f"--net=/proc/self/fd/{self._netns}"]
            if self._join_user:
                user = owning_user_namespace(self._netns)
                enter.insert(1, f"--user=/proc/self/fd/{user}")
                if self._own_ids:  # its ids are the namespace's root already; setgroups,
                    enter.insert(2, "--preserve-credentials")  # which nsenter calls, denied
            done = subprocess.run(
                [*enter, "--", *argv],
                pass_fds=(self._netns, *([user] if user >= 0 else []), *fds),
                input=script,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT,
                env={"PATH": os.pathsep.join(SBIN), "LC_ALL": "C"},
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise RuntimeError(f"the sandbox's firewall could not be set up ({exc})") from None
        finally:
            if user >= 0:
                os.close(user)
        if done.returncode != 0:
            said = done.stderr.strip()[-500:] or f"exit {done.returncode}"
            raise RuntimeError(
                f"the sandbox's firewall could not be set up ({os.path.basename(argv[0])}: {said})"
            )


# `_sockets_in`'s, as a program run through nsenter: it hands them over on descriptor {fd}
HANDOVER = (
    "import socket; u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM);"
    " u.bind(('127.0.0.1', 0)); t = socket.socket(); t.bind(('127.0.0.1', 0)); t.listen(16);"
    " n = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12); n.bind((0, 0));"
    " socket.send_fds(socket.socket(fileno={fd}), [b'1'], [u.fileno(), t.fileno(), n.fileno()])"
)
NETLINK_NETFILTER = 12
CLONE_NEWNET = 0x40000000


def _sockets_in(netns: int) -> tuple[socket.socket, socket.socket, socket.socket]:
    """`Wall.sockets` of a root server: made by a thread that joined the namespace `netns`
    (only that thread's namespace changes; it ends after)."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(netns, CLONE_NEWNET) != 0:
                code = ctypes.get_errno()
                raise OSError(code, os.strerror(code))
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            made.append(udp)
            udp.bind(("127.0.0.1", 0))
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            made.append(tcp)
            tcp.bind(("127.0.0.1", 0))
            tcp.listen(16)
            log = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
            made.append(log)
            log.bind((0, 0))
        except BaseException as exc:  # noqa: BLE001 (handed to the caller)
            failed.append(exc)

    thread = threading.Thread(target=work, name="osb-local-netns")
    thread.start()
    thread.join()
    if failed:
        for sock in made:
            sock.close()
        raise RuntimeError(f"the sandbox's resolver could not be set up ({failed[0]})")
    return made[0], made[1], made[2]


# nfnetlink_log (linux/netfilter/nfnetlink_log.h): what the output chain logs, read back
NFNL_SUBSYS_ULOG = 4
NFULNL_MSG_PACKET, NFULNL_MSG_CONFIG = 0, 1
NFULA_CFG_CMD, NFULA_CFG_MODE, NFULA_PAYLOAD = 1, 2, 9
NFULNL_CFG_CMD_BIND, NFULNL_COPY_PACKET = 1, 2
NLM_F_ACK = 0x4
LOG_COPY = 64  # bytes of each logged packet: its IPv4 header and its ports


def _attribute(kind: int, data: bytes) -> bytes:
    length = RTATTR.size + len(data)
    return RTATTR.pack(length, kind) + data + bytes(-length % 4)


def listen_log(sock: socket.socket, group: int) -> None:
    """Bind `sock` (`Wall.sockets`' netlink socket) to the namespace's log group `group`,
    copying `LOG_COPY` bytes of each packet.

    Raises:
        OSError: the kernel refused (its error).
    """
    sock.settimeout(COMMAND_TIMEOUT)
    for sequence, attribute in enumerate(
        (
            _attribute(NFULA_CFG_CMD, struct.pack("=B", NFULNL_CFG_CMD_BIND)),
            _attribute(NFULA_CFG_MODE, struct.pack("!IBB", LOG_COPY, NFULNL_COPY_PACKET, 0)),
        ),
        1,
    ):
        body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(group)) + attribute
        kind = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG
        sock.send(
            HEADER.pack(HEADER.size + len(body), kind, NLM_F_REQUEST | NLM_F_ACK, sequence, 0)
            + body
        )
        answer = sock.recv(4096)
        if len(answer) >= HEADER.size + 4 and HEADER.unpack_from(answer)[1] == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", answer, HEADER.size)
            if code:
                raise OSError(-code, f"netlink: {os.strerror(-code)}")
    sock.settimeout(None)


def parse_log(data: bytes) -> list[tuple[str, int, int]]:
    """The packets in nfnetlink_log messages `data`: (destination, IP protocol, destination
    port or 0), IPv4 only."""
    found = []
    offset = 0
    while offset + HEADER.size <= len(data):
        length, kind, _, _, _ = HEADER.unpack_from(data, offset)
        if length < HEADER.size:
            break
        end = min(offset + length, len(data))
        if kind == (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET:
            at = offset + HEADER.size + 4  # past nfgenmsg
            while at + RTATTR.size <= end:
                attr_length, attr_type = RTATTR.unpack_from(data, at)
                if attr_length < RTATTR.size:
                    break
                packet = data[at + RTATTR.size : min(at + attr_length, end)]
                if (
                    attr_type & 0x7FFF == NFULA_PAYLOAD
                    and len(packet) >= 20
                    and packet[0] >> 4 == 4
                ):
                    head = (packet[0] & 0xF) * 4
                    port = 0
                    if packet[9] in (6, 17) and len(packet) >= head + 4:
                        port = struct.unpack_from("!H", packet, head + 2)[0]
                    found.append((socket.inet_ntoa(packet[16:20]), packet[9], port))
                at += (attr_length + 3) & ~3
        offset += (length + 3) & ~3
    return found


class AddressWatch:
    """The host's addresses, followed: a thread reads the kernel's address notices (netlink)
    while a server that gives sandboxes internet access runs (`hold` / `release`), and hands
    every change to each subscribed `Wall`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._walls: set[Wall] = set()
        self._known: set[str] = set()
        self._socket: socket.socket | None = None  # while the thread runs
        self._thread = HeldThread("osb-local-addresses", self._open)

    def hold(self) -> None:
        """Count one more server; the first starts the watch.

        Raises:
            OSError: netlink refused (the addresses could not be read).
        """
        self._thread.hold()

    def release(self) -> None:
        """Count one server fewer; the last one's release stops the watch."""
        self._thread.release()

    def _open(self) -> Callable[[int], None]:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        try:
            sock.bind((0, NOTICES))
            known = host_addresses()  # after the bind: no change is missed
        except BaseException:
            sock.close()
            raise
        with self._lock:
            self._socket, self._known = sock, known
        return lambda stop: self._watch(sock, stop)

    def addresses(self) -> set[str]:
        """The host's addresses as last seen (read afresh where no server holds the watch)."""
        with self._lock:
            return set(self._known) if self._socket is not None else host_addresses()

    def subscribe(self, wall: Wall) -> None:
        """Hand `wall` every change from now on."""
        with self._lock:
            self._walls.add(wall)

    def unsubscribe(self, wall: Wall) -> None:
        """Stop handing `wall` changes."""
        with self._lock:
            self._walls.discard(wall)

    def _watch(self, sock: socket.socket, stop: int) -> None:
        with sock, selectors.DefaultSelector() as waiter:
            waiter.register(sock, selectors.EVENT_READ)
            waiter.register(stop, selectors.EVENT_READ)
            while stop not in {key.fd for key, _ in waiter.select()}:
                try:  # any change of the host's destinations: all is read again
                    if parse_destinations(sock.recv(1 << 16))[0]:
                        self._changed()
                except OSError as exc:  # ENOBUFS: notices were lost
                    logger.debug("local server: address notices lost (%s): reading all", exc)
                    self._changed()
            with self._lock:
                self._socket = None

    def _changed(self) -> None:
        try:
            now = host_addresses()
        except OSError as exc:
            logger.error("local server: the host's addresses could not be read: %s", exc)
            return
        with self._lock:
            changed, self._known = now != self._known, now
            walls = list(self._walls)
        if changed:
            for wall in walls:
                try:
                    wall.follow(now)
                except RuntimeError as exc:  # a container that is ending, most likely
                    logger.warning("local server: a sandbox's firewall: %s", exc)


WATCH = AddressWatch()
