"""Who a sandbox's root is on the host: one unprivileged id range shared by every sandbox.

Each sandbox's user namespace maps its ids 0-65535 to `COUNT` host ids starting at a range's
first id, never the server's own uid and never host root (Docker's `userns-remap` does the
same: one range for all containers; PID, mount and network namespaces keep them apart). So
root in a sandbox is an unprivileged host user: a file it writes in a host volume belongs to
uid `start` on the host, or, through an ID-mapped volume (`mount_map`), to the volume
directory's owner; it can give no such file a set-id mode or a file capability (`seccomp.py`).

Where the range comes from:
- a server running as root: the range `/etc/subuid` and `/etc/subgid` reserve for the system
  user `USER` (`osb-sync`), made on first use with `useradd --system --add-subids-for-system`
  (shadow's own locking and choice of a free range). The server writes the child's `uid_map`
  and `gid_map` itself and starts bwrap as the range's first id: bwrap 0.8, started as uid 0,
  refuses a map whose outside ids are not its own ("Value too large").
  bwrap waits on `--userns-block-fd` until the map is written.
- any other server: its own subordinate ids (`/etc/subuid` lines of its name or uid), written
  by the setuid `newuidmap` and `newgidmap` (Debian's `uidmap` package) to a namespace made
  beforehand (`user_namespace`), which bwrap joins (`--userns`) and becomes its root in.
- a server that is not root and has no such range (or not the helpers): its own uid and gid,
  the one id inside (`own_ids`), as bubblewrap and Flatpak map them: root inside is the
  server's user outside (the status says so); every other id shows as the overflow id,
  nobody. `require_id_range` refuses that instead (`server.LocalServer`).
"""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import os
import pwd
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

USER = "osb-sync"
COUNT = 65536
SUBUID = Path("/etc/subuid")
SUBGID = Path("/etc/subgid")
HELPER_TIMEOUT = 20.0
NPROC_RESERVE = 64  # processes a user keeps beyond all its sandboxes' (`sandboxes_nproc`)
RESERVE_LOCK = "/run/lock/osb-sync-useradd.lock"  # root's; where /run/lock is missing, no lock


@dataclass(frozen=True)
class IdRange:
    """The host ids a sandbox's 0-65535 map to, and how the map is written.

    `helpers` is None for a root server (it writes the maps itself), else the paths of
    `newuidmap` and `newgidmap`. `no_range` is set (why there is no range; `range_fix` the
    fix) where the ids are the server's own (`own_ids`): one id, mapped by the server itself.
    """

    uid: int
    gid: int
    count: int = COUNT
    helpers: tuple[str, str] | None = None
    no_range: str = ""
    range_fix: str = ""

    @property
    def own(self) -> bool:
        """True when root inside is the server's own user outside (`own_ids`)."""
        return bool(self.no_range)

    @property
    def by_root(self) -> bool:
        """True for a root server's range: it writes the maps and starts bwrap as the range's
        root; any other server makes the namespace beforehand (`user_namespace`)."""
        return self.helpers is None and not self.own

    @property
    def uid_map(self) -> str:
        """The `uid_map` line: inside 0, outside `uid`, `count` ids."""
        return f"0 {self.uid} {self.count}\n"

    @property
    def gid_map(self) -> str:
        """The `gid_map` line: inside 0, outside `gid`, `count` ids."""
        return f"0 {self.gid} {self.count}\n"

    def owns(self, host_id: int) -> bool:
        """True when `host_id` is a uid of the range."""
        return self.uid <= host_id < self.uid + self.count


def ranges(text: str, names: tuple[str, ...]) -> list[tuple[int, int]]:
    """The (start, count) ranges of a subuid/subgid file's `text` that `names` own, in order.

    Malformed lines are skipped (the helpers skip them too).
    """
    found = []
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) != 3 or parts[0] not in names:
            continue
        try:
            start, count = int(parts[1]), int(parts[2])
        except ValueError:
            continue
        if start > 0 and count > 0:
            found.append((start, count))
    return found


def pick(text: str, names: tuple[str, ...], avoid: int) -> int | None:
    """The start of the first range of `names` in `text` with `COUNT` ids, none of them `avoid`."""
    for start, count in ranges(text, names):
        if count >= COUNT and not start <= avoid < start + COUNT:
            return start
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _reserve_once() -> str:
    """`_reserve`, one server at a time: servers starting together (tox's parallel envs on a
    fresh machine) would each run useradd, and the losers would read /etc/subuid before the
    winner had written it."""
    try:
        lock = os.open(RESERVE_LOCK, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return _reserve()
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pwd.getpwnam(USER)
            return ""  # made by the server that held the lock before us
        except KeyError:
            return _reserve()
    finally:
        os.close(lock)


def _reserve() -> str:
    """Make the system user `USER` with its own subordinate ids; "" or what went wrong."""
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    try:
        done = subprocess.run(
            [
                useradd,
                "--system",
                "--add-subids-for-system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                "--comment",
                "osb-sync sandboxes' root",
                USER,
            ],
            capture_output=True,
            timeout=HELPER_TIMEOUT,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"useradd could not run: {exc}"
    if done.returncode != 0:
        return done.stderr.decode(errors="replace").strip() or f"useradd exit {done.returncode}"
    return ""


def _root_range() -> IdRange | str:
    names = (USER,)
    uid, gid = pick(_read(SUBUID), names, 0), pick(_read(SUBGID), names, 0)
    if uid is None or gid is None:
        try:
            pwd.getpwnam(USER)
            known = True
        except KeyError:
            known = False
        why = "" if known else _reserve_once()
        uid, gid = pick(_read(SUBUID), names, 0), pick(_read(SUBGID), names, 0)
        if uid is None or gid is None:
            return (
                f"no range of {COUNT} subordinate ids for the user {USER!r} in {SUBUID} and "
                f"{SUBGID}{f' ({why})' if why else ''}"
            )
    return IdRange(uid, gid)


def free_start(*texts: str) -> int:
    """The first id past every range of these subuid/subgid files' `texts` (100000 at least,
    where Debian's useradd starts): a range from there is no one's."""
    ends = [start + count for text in texts for start, count in ranges(text, _names(text))]
    return max([100000, *ends])


def _names(text: str) -> tuple[str, ...]:
    return tuple({line.split(":", 1)[0] for line in text.splitlines() if ":" in line})


def usermod_line(name: str) -> str:
    """The command, as root, that gives the user `name` a range of `COUNT` subordinate ids
    no other line of /etc/subuid and /etc/subgid has."""
    start = free_start(_read(SUBUID), _read(SUBGID))
    ids = f"{start}-{start + COUNT - 1}"
    return f"usermod --add-subuids {ids} --add-subgids {ids} {name} (as root)"


def own_ids(uid: int, gid: int, why: str, fix: str) -> IdRange:
    """The server's own `uid` and `gid` as a sandbox's only ids (root inside): `why` there is
    no range, and the `fix`."""
    return IdRange(uid, gid, 1, None, why, fix)


def _own_range(uid: int) -> IdRange:
    try:
        name = pwd.getpwuid(uid).pw_name
        names: tuple[str, ...] = (name, str(uid))
    except KeyError:
        name, names = str(uid), (str(uid),)
    gid = os.getegid()
    start_uid, start_gid = pick(_read(SUBUID), names, uid), pick(_read(SUBGID), names, uid)
    if start_uid is None or start_gid is None:
        return own_ids(
            uid,
            gid,
            f"the user {name!r} has no range of {COUNT} subordinate ids in {SUBUID} and {SUBGID}",
            usermod_line(name),
        )
    helpers = shutil.which("newuidmap"), shutil.which("newgidmap")
    if helpers[0] is None or helpers[1] is None:
        return own_ids(
            uid,
            gid,
            f"the user {name!r} has a range of subordinate ids, but newuidmap and newgidmap,"
            " which map it, are not installed",
            "apt-get install uidmap (as root)",
        )
    return IdRange(start_uid, start_gid, helpers=(helpers[0], helpers[1]))


@functools.cache
def host_range() -> IdRange | str:
    """This server's id range (see the module docstring), or why there is none; once a process."""
    uid = os.geteuid()
    return _root_range() if uid == 0 else _own_range(uid)


def admit(path: Path, ids: IdRange) -> None:
    """Let the range's ids traverse the server's directory `path` (a root server only).

    bwrap runs as the range's first id and binds the sandbox's directories from below `path`:
    its group becomes the range's root group, with search permission (nothing else changes).
    """
    if not ids.by_root:
        return
    info = path.stat()
    if info.st_gid != ids.gid:
        os.chown(path, -1, ids.gid)
    if not info.st_mode & 0o010:
        path.chmod((info.st_mode & 0o7777) | 0o010)


def give(path: Path, ids: IdRange) -> None:
    """Make the server's new directory `path` the sandboxes' root's (a root server only)."""
    if ids.by_root:
        os.chown(path, ids.uid, ids.gid)


def write_maps(pid: int, ids: IdRange) -> None:
    """Map process `pid`'s (new) user namespace onto `ids`.

    The server's own ids (`own_ids`) it writes itself, as any process may map its own uid and
    gid, the latter once the namespace may no longer `setgroups` (the kernel's rule): its
    processes keep the user's supplementary groups, shown as nogroup.

    Raises:
        OSError: the kernel or a helper refused the map.
    """
    if ids.helpers is None:
        if ids.own:
            with open(f"/proc/{pid}/setgroups", "w") as out:
                out.write("deny")
        with open(f"/proc/{pid}/uid_map", "w") as out:
            out.write(ids.uid_map)
        with open(f"/proc/{pid}/gid_map", "w") as out:
            out.write(ids.gid_map)
        return
    _helpers(pid, ids.helpers, (ids.uid_map, ids.gid_map))


def _helpers(pid: int, helpers: tuple[str, str], lines: tuple[str, str]) -> None:
    """`newuidmap` and `newgidmap` (`helpers`) write `lines` to process `pid`'s maps."""
    for helper, line in zip(helpers, lines, strict=True):
        try:
            done = subprocess.run(
                [helper, str(pid), *line.split()],
                capture_output=True,
                timeout=HELPER_TIMEOUT,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise OSError(f"{helper} could not run: {exc}") from None
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
            raise OSError(f"{os.path.basename(helper)} refused the map: {why}")


def mount_map(owner: int, start: int, count: int = COUNT) -> str:
    """The `uid_map` (or `gid_map`) of an ID-mapped volume mount (`staging.bind_idmapped`).

    In a mount's map, the first id of a line is the id on disk and the second the host id a
    process has: the directory's `owner` on disk shows as `start` (the sandboxes' root), so
    what that root writes there is stored as `owner`. The range's other ids stay themselves
    (a sandbox's user 1000 writes as host id `start + 1000`, as without the mapping); where
    `owner` is one of them, `start` on disk shows as `owner` instead (the two swap places).
    """
    if owner == start:
        return f"{start} {start} {count}\n"
    lines = [f"{owner} {start} 1"]
    if start < owner < start + count:
        lines.append(f"{start} {owner} 1")
        stays = [(start + 1, owner - start - 1), (owner + 1, start + count - owner - 1)]
    else:
        stays = [(start + 1, count - 1)]
    lines += [f"{first} {first} {number}" for first, number in stays if number > 0]
    return "\n".join(lines) + "\n"


def sandboxes_nproc(soft: int | None = None) -> int | None:
    """The processes all sandboxes of a server that is not root may have together: its user's
    RLIMIT_NPROC (`soft`, default this process's) less a reserve for the user's own (a tenth,
    at least `NPROC_RESERVE`); None where the user's is unlimited."""
    if soft is None:
        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return max(soft - max(NPROC_RESERVE, soft // 10), 1)


def _nproc_cap() -> list[str]:
    """`prlimit` arguments that start a user namespace's creator under `sandboxes_nproc`.

    Since Linux 5.14 a process counts in RLIMIT_NPROC at every user-namespace level up to the
    host's (ucounts): a sandbox's processes count in its own namespace and in its creator's
    uid, which the user's shells and the server count in too. The kernel keeps the creator's
    RLIMIT_NPROC as the namespace's cap at that level, so every sandbox stops forking once the
    user has the reserve left (none for root, whom the kernel does not count).
    """
    cap = sandboxes_nproc() if os.geteuid() != 0 else None
    prlimit = shutil.which("prlimit")
    return [prlimit, f"--nproc={cap}:{cap}", "--"] if cap is not None and prlimit else []


def _held_namespace(write: Callable[[int], None]) -> int:
    """A new user namespace (its first process, the holder, made by `unshare`, its maps
    written by `write(pid)`): a descriptor of it. The holder exits once it is open.

    Raises:
        OSError: it could not be made, or its maps could not be written.
    """
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    holder = subprocess.Popen(
        [*_nproc_cap(), unshare, "--user", "--", "/bin/sh", "-c", "echo && read -r _"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        if holder.stdout.readline() != b"\n":  # EOF: unshare failed
            _, err = holder.communicate(timeout=HELPER_TIMEOUT)
            raise OSError(f"unshare --user failed: {err.decode(errors='replace').strip()}")
        write(holder.pid)
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        if holder.returncode is None:
            holder.kill()
            holder.communicate()


def mount_namespace(uid_map: str, gid_map: str) -> int:
    """A user namespace with these maps (`mount_map`), for an ID-mapped mount (root only): a
    descriptor of it.

    Raises:
        OSError: it could not be made, or the kernel refused a map.
    """

    def write(pid: int) -> None:
        for name, text in (("uid_map", uid_map), ("gid_map", gid_map)):
            with open(f"/proc/{pid}/{name}", "w") as out:
                out.write(text)

    return _held_namespace(write)


def user_namespace(ids: IdRange) -> int:
    """A new user namespace of this server's (not root), mapped onto `ids` (its range, or its
    own ids): a descriptor of it, for bwrap's `--userns`.

    bwrap cannot make it itself (`--unshare-user`) and wait for the map there: it stays the
    user's uid, which the map leaves out (root inside is an id of the range, never the user),
    and its first directory in its new root's tmpfs fails with EOVERFLOW ("Creating newroot
    failed: Value too large for defined data type"): the kernel makes no inode of an id the
    namespace does not map. Joining a namespace mapped beforehand, bwrap becomes its `--uid 0`
    (the range's first id) before it makes anything. The namespace's first process, the
    holder, exits once it is open; the descriptor keeps it.

    Raises:
        OSError: it could not be made, or a helper refused the map.
    """
    return _held_namespace(lambda pid: write_maps(pid, ids))


def store_namespace(ids: IdRange) -> int:
    """A new user namespace of this server's (not root, `ids` its range and helpers) mapping
    the range as 0 to `count - 1` and the server's own uid and gid as `count`, for the image
    store's work (`images.inside`): a descriptor of it.

    Raises:
        OSError: it could not be made, or a helper refused the map.
    """
    if ids.helpers is None or ids.own:
        raise ValueError("a store namespace is for a server with a range and its helpers")
    helpers = ids.helpers
    lines = (
        f"0 {ids.uid} {ids.count} {ids.count} {os.getuid()} 1",
        f"0 {ids.gid} {ids.count} {ids.count} {os.getgid()} 1",
    )
    return _held_namespace(lambda pid: _helpers(pid, helpers, lines))


def passwd_file(home: str) -> bytes:
    """The sandbox's `/etc/passwd`: root (whose home is `home`), and nobody (65534) as Debian's."""
    return (
        f"root:x:0:0:root:{home}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ).encode()


def group_file() -> bytes:
    """The sandbox's `/etc/group`: root, and nogroup (65534) as in Debian."""
    return b"root:x:0:\nnogroup:x:65534:\n"


def _address(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """An address of /proc/net/tcp{,6} (`HEX:PORT`, each 32-bit word of the address in the
    host's byte order): an IPv4-mapped IPv6 one as IPv4."""
    where, port = text.split(":")
    raw = bytes.fromhex(where)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, int(port, 16)
    return ip, int(port, 16)


def socket_owner(table: str, local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The uid of the TCP socket bound to `local` and connected to `remote` in `table` (the
    text of /proc/net/tcp or tcp6), or None."""
    wanted = [(_normal(host), port) for host, port in (local, remote)]
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 7 and [_address(fields[1]), _address(fields[2])] == wanted:
            return int(fields[7])
    return None


def _normal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def peer_uid(peer: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the client end of a connection to this host's `server` address from
    `peer` (both in this network namespace, as loopback's are), or None where not found."""
    for name in ("tcp", "tcp6"):
        try:
            table = Path("/proc/net", name).read_text()
        except OSError:
            continue
        owner = socket_owner(table, peer, server)
        if owner is not None:
            return owner
    return None
