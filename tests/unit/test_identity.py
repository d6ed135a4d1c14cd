"""The sandboxes' id range (issue 22, item 1): /etc/subuid parsing, the maps, staged binds."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from osb_sync.local.host import bwrap, identity

SUBUID = """\
alice:100000:65536
osb-sync:165536:65536
bob:231072:1000
broken line
osb-sync:x:65536
1000:300000:65536
"""


def test_ranges_of_a_user_in_file_order_skipping_malformed_lines() -> None:
    assert identity.ranges(SUBUID, ("osb-sync",)) == [(165536, 65536)]
    assert identity.ranges(SUBUID, ("carol", "1000")) == [(300000, 65536)]


def test_pick_needs_65536_ids_and_never_the_servers_own_uid() -> None:
    assert identity.pick(SUBUID, ("osb-sync",), 0) == 165536
    assert identity.pick(SUBUID, ("bob",), 0) is None  # 1000 ids: too few
    assert identity.pick(SUBUID, ("alice",), 100005) is None  # would map the server's uid
    assert identity.pick("root:0:65536\n", ("root",), 1000) is None  # never host root


def test_the_usermod_line_offers_ids_past_every_range() -> None:
    assert identity.free_start(SUBUID) == 365536  # past 1000's 300000-365535
    assert identity.free_start("", "x:400000:10\n") == 400010  # subgid's count too
    assert identity.free_start("") == 100000


def test_maps_are_one_line_from_inside_zero() -> None:
    ids = identity.IdRange(165536, 170000)
    assert (ids.uid_map, ids.gid_map) == ("0 165536 65536\n", "0 170000 65536\n")
    assert ids.owns(165536) and ids.owns(231071) and not ids.owns(231072)


def test_passwd_and_group_hold_root_nobody_and_nogroup() -> None:
    users = [line.split(":")[:4] for line in identity.passwd_file("/home/x").decode().split()]
    assert users == [["root", "x", "0", "0"], ["nobody", "x", "65534", "65534"]]
    assert identity.group_file() == b"root:x:0:\nnogroup:x:65534:\n"


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A directory every user may reach (pytest's own tmp_path is below a mode-700 one)."""
    path = Path(tempfile.mkdtemp(prefix="osb-identity-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_staged_replaces_only_sources_the_range_cannot_reach(open_tmp: Path) -> None:
    tmp_path = open_tmp
    hidden = tmp_path / "hidden"
    (hidden / "tree").mkdir(parents=True)
    hidden.chmod(0o700)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    staged: list[tuple[str, bool]] = []

    def stage(source: str, read_only: bool) -> str:
        staged.append((source, read_only))
        return "/staged"

    options = [
        "--ro-bind", str(hidden / "tree"), "/a",
        "--bind", str(open_dir), "/b",
        "--ro-bind-try", str(hidden / "missing"), "/c",
        "--tmpfs", "/d",
    ]  # fmt: skip
    assert not bwrap.reachable(str(hidden / "tree")) and bwrap.reachable(str(open_dir))
    assert bwrap.staged(options, stage) == [
        "--ro-bind", "/staged", "/a",
        "--bind", str(open_dir), "/b",
        "--ro-bind-try", str(hidden / "missing"), "/c",
        "--tmpfs", "/d",
    ]  # fmt: skip
    assert staged == [(str(hidden / "tree"), True)]


def test_identity_options_block_until_mapped_and_add_dockers_capabilities() -> None:
    args = bwrap.identity_options(7, 8, 9)
    assert args[:6] == ["--userns-block-fd", "7", "--uid", "0", "--gid", "0"]
    added = [args[i + 1] for i, a in enumerate(args) if a == "--cap-add"]
    assert len(added) == 14 and "CAP_SYS_ADMIN" not in added and "CAP_NET_RAW" in added
    assert args[args.index("--cap-drop") + 1] == "ALL"


def test_a_joined_namespace_replaces_the_new_one_and_its_child_blocks() -> None:
    args = bwrap.identity_options(7, 8, 9, userns_fd=5)
    assert args[:8] == ["--userns", "5", "--block-fd", "7", "--uid", "0", "--gid", "0"]
    made = bwrap.confined(3, bwrap.identity_options(7, -1, -1), {}, [], [])
    joined = bwrap.confined(3, args, {}, [], [])
    assert "--unshare-user" in made and "--unshare-user" not in joined  # bwrap refuses both
    assert "--unshare-pid" in joined and "--unshare-net" in joined


def test_servers_starting_together_make_the_user_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[int] = []
    users: set[str] = set()

    def slow_useradd() -> str:
        time.sleep(0.2)  # long enough for the other server to be waiting
        made.append(1)
        users.add(identity.USER)
        return ""

    def getpwnam(name: str) -> object:
        if name not in users:
            raise KeyError(name)
        return object()

    monkeypatch.setattr(identity, "RESERVE_LOCK", str(tmp_path / "lock"))
    monkeypatch.setattr(identity, "_reserve", slow_useradd)
    monkeypatch.setattr(identity.pwd, "getpwnam", getpwnam)
    answers: list[str] = []
    threads = [threading.Thread(target=lambda: answers.append(identity._reserve_once()))]
    threads.append(threading.Thread(target=lambda: answers.append(identity._reserve_once())))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made == [1] and answers == ["", ""]


def _mapping(text: str) -> dict[int, int]:
    """A map's lines as {id on disk: id seen}."""
    pairs: dict[int, int] = {}
    for line in text.splitlines():
        first, seen, count = map(int, line.split())
        pairs.update({first + n: seen + n for n in range(count)})
    return pairs


@pytest.mark.parametrize("owner", [0, 1000, 165536, 165537, 170000, 231071, 231072])
def test_a_volume_map_shows_its_owner_as_the_sandboxes_root_and_keeps_the_range(
    owner: int,
) -> None:
    start = 165536
    text = identity.mount_map(owner, start)
    assert len(text.splitlines()) <= 4  # the kernel takes up to 340 lines
    pairs = _mapping(text)
    assert pairs[owner] == start  # the sandbox's root writes as the owner
    assert len(set(pairs.values())) == len(pairs)  # one to one, as the kernel demands
    assert set(pairs.values()) == set(range(start, start + identity.COUNT))
    others = [i for i in range(start + 1, start + identity.COUNT) if i != owner]
    assert all(pairs[i] == i for i in others)  # a sandbox user N writes as start + N


# -- issue 42, item 2: a server that is not root and has no range maps its own ids -----------------


@pytest.fixture
def id_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Empty /etc/subuid and /etc/subgid, the server the user 4242 (group 4343) named dev."""
    for name in ("subuid", "subgid"):
        (tmp_path / name).write_text("")
    monkeypatch.setattr(identity, "SUBUID", tmp_path / "subuid")
    monkeypatch.setattr(identity, "SUBGID", tmp_path / "subgid")
    monkeypatch.setattr(identity.pwd, "getpwuid", lambda uid: type("P", (), {"pw_name": "dev"}))
    monkeypatch.setattr(identity.os, "getegid", lambda: 4343)
    monkeypatch.setattr(identity.shutil, "which", lambda name: f"/usr/bin/{name}")
    return tmp_path


def test_a_user_without_a_range_gets_its_own_ids_and_the_usermod_line(id_files: Path) -> None:
    ids = identity._own_range(4242)
    assert ids.own and not ids.by_root and ids.helpers is None
    assert (ids.uid_map, ids.gid_map) == ("0 4242 1\n", "0 4343 1\n")  # one id: the user's
    assert "'dev' has no range of 65536 subordinate ids" in ids.no_range
    free = "100000-165535"  # no line yet: where Debian's useradd starts
    assert ids.range_fix == f"usermod --add-subuids {free} --add-subgids {free} dev (as root)"


def test_a_range_without_newuidmap_gets_own_ids_and_the_package_to_install(
    id_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("subuid", "subgid"):
        (id_files / name).write_text("dev:165536:65536\n")
    monkeypatch.setattr(identity.shutil, "which", lambda name: None)
    ids = identity._own_range(4242)
    assert ids.own and "newuidmap and newgidmap" in ids.no_range
    assert ids.range_fix == "apt-get install uidmap (as root)"
    monkeypatch.setattr(identity.shutil, "which", lambda name: f"/usr/bin/{name}")
    ranged = identity._own_range(4242)
    assert not ranged.own and not ranged.by_root and ranged.uid_map == "0 165536 65536\n"


def test_require_id_range_refuses_own_ids_naming_the_usermod_line(
    id_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from osb_sync.local import LocalServer
    from osb_sync.local.host import server

    own = identity._own_range(4242)
    isolating = bwrap.Support("/usr/bin/bwrap", "", None, False, None, own)
    monkeypatch.setattr(server, "probe", lambda: isolating)
    with pytest.raises(RuntimeError) as refused:
        LocalServer(isolation=True, require_id_range=True).start()
    message = str(refused.value)
    assert "has no range" in message and "require_id_range" in message
    assert "usermod --add-subuids 100000-165535 --add-subgids 100000-165535 dev" in message
    assert "bubblewrap" not in message and "sysctl" not in message


# /proc/net/tcp and tcp6 as the kernel writes them (columns after the uid cut short).
TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1005
   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1006
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1005
"""
MAPPED, ONE = "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"
TCP6 = f"""  sl  local_address remote_address st tx_queue rx_queue tr tm->when retrnsmt   uid
   0: {MAPPED}:D432 {MAPPED}:1F90 01 00000000:00000000 00:00000000 00000000  1007
   1: {ONE}:D433 {ONE}:1F90 01 00000000:00000000 00:00000000 00000000  1008
"""


@pytest.mark.skipif(sys.byteorder != "little", reason="the tables above are a little-endian host's")
def test_socket_owner_finds_the_client_end_of_a_loopback_connection() -> None:
    # The client's end (its port 0xD431 to the server's 0x1F90), not the server's own end.
    assert identity.socket_owner(TCP, ("127.0.0.1", 0xD431), ("127.0.0.1", 0x1F90)) == 1006
    assert identity.socket_owner(TCP, ("127.0.0.1", 0xD432), ("127.0.0.1", 0x1F90)) is None
    mapped = ("::ffff:127.0.0.1", 0x1F90)  # a dual-stack server sees IPv4 peers so
    assert identity.socket_owner(TCP6, ("::ffff:127.0.0.1", 0xD432), mapped) == 1007
    assert identity.socket_owner(TCP6, ("::1", 0xD433), ("::1", 0x1F90)) == 1008


def test_peer_uid_of_a_real_loopback_connection_is_this_process_user() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as client:
            accepted, peer = server.accept()
            with accepted:
                assert identity.peer_uid(peer, accepted.getsockname()) == os.geteuid()
                assert client.getsockname() == peer
