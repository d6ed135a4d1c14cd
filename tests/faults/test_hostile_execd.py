"""A hostile execd (issue 38): code running as root in a sandbox can replace its execd, so
every name, size, id and number an execd answers is hostile input for the client too.

Every execd route the client calls is answered with lies by the fault server
(``tests/faults/faultserver.py``): each ``LIES`` entry that names the route (traversal names,
absolute paths, absurd or negative sizes, wrong JSON types, ids that would climb out of their
URL or hold the token, absurd numbers, an ignored Range, ...), and on every route an endless
body or stream (``flood``), a redirect to another origin (``redirect_cross_origin``) and to its
own (``redirect_same_origin``: behind a server proxy, the lifecycle API's) and a compressed
bomb (``deflate_bomb``). Each call ends within its bound in a contained result or a typed error
(a lie the client can see is ``ApiError(code="INVALID_RESPONSE")`` naming the field), never
sends the execd token or the API key to another origin (the fault server's ``other`` records
what reaches it), and never shows either, or all but the end of either, in an error or a log
line. One route of each way the client reads an answer drips a byte at a time
(``drip_head``, ``drip_body``): it ends at its ``call_timeout``, or at the timeout it was given.

The routes the client calls (``client_routes()`` reads them from the source of ``osb_sync``;
a route the client calls that is missing here, or that no case below covers, fails
``test_every_route_the_client_calls_is_listed_and_attacked``):

- ``GET /ping``
- ``POST /code``, ``DELETE /code`` (interrupt)
- ``POST /code/context``, ``GET /code/contexts``, ``DELETE /code/contexts``,
  ``GET /code/contexts/{id}``, ``DELETE /code/contexts/{id}``
- ``POST /command``, ``DELETE /command`` (interrupt), ``GET /command/status/{id}``,
  ``GET /command/{id}/logs``
- ``POST /session``, ``POST /session/{id}/run``, ``DELETE /session/{id}``
- ``GET /files/info``, ``GET /files/download``, ``POST /files/upload``, ``GET /files/search``,
  ``DELETE /files``, ``POST /files/mv``, ``POST /files/permissions``, ``POST /files/replace``
- ``GET /directories/list``, ``POST /directories``, ``DELETE /directories``
- ``GET /metrics``
- ``POST /pty``, ``GET /pty/{id}``, ``DELETE /pty/{id}`` (the terminal's WebSocket is attacked
  in ``tests/sockets/test_pty.py``)

``osb-sync cp`` out of a sandbox first (rows 1-4 of the issue, and the planted symlinks of a
DEST): nothing is written outside DEST, the ``-`` tar carries clean relative names only, and a
file streams in bounded memory.
"""

from __future__ import annotations

import ast
import io
import logging
import os
import stat
import sys
import tarfile
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from osb_sync import ApiError, Client, OpenSandboxError, Sandbox, TransportError, _cli_copy
from osb_sync._cli import main
from osb_sync._models import FileInfo
from tests.faults.faultserver import (
    API_KEY_HEADER,
    FILE_BYTES,
    KEY,
    LIES,
    RENAMED_DIRECTORY,
    RENAMED_FILES,
    TOKEN,
    World,
    _match,
    generated,
)
from tests.faults.test_fault_matrix import bounded, chain_text

EXIT_REFUSED = 1


@pytest.fixture
def sandbox_id(world: World) -> Iterator[str]:
    with Client(world.api_base, KEY) as client:
        sandbox = client.create_sandbox(ready_timeout=5)
        yield sandbox.id
        client.delete_sandbox(sandbox.id)


# -- osb-sync cp out of a hostile sandbox -----------------------------------------------------


class _Counter(io.RawIOBase):
    """A standard output that keeps nothing: it counts and keeps the first bytes."""

    def __init__(self, keep: int) -> None:
        self.size = 0
        self.kept = bytearray()
        self._keep = keep

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if len(self.kept) < self._keep:
            self.kept += bytes(data[: self._keep - len(self.kept)])
        self.size += len(data)
        return len(data)


@dataclass
class Copied:
    status: int
    stdout: _Counter
    stderr: str


def cp(world: World, src: str, dest: str, keep: int = 1 << 20, *flags: str) -> Copied:
    """``osb-sync cp SRC DEST`` in this process; standard output as bytes (at most ``keep``)."""
    out, err = _Counter(keep), io.StringIO()
    saved = sys.stdout
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(out))
    try:
        with redirect_stderr(err):
            status = main(["cp", "--api-base", world.api_base, "--api-key", KEY, *flags, src, dest])
        sys.stdout.flush()
    finally:
        sys.stdout = saved
    return Copied(status, out, err.getvalue())


def written(root: Path) -> list[str]:
    """Every file under ``root`` (and every link, but to a directory), relative to it."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


def tar_names(data: bytes) -> list[str]:
    names = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as archive:
        for member in archive:
            names.append(member.name)
    return names


def clean_relative(name: str) -> bool:
    parts = name.split("/")
    return not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def test_cp_refuses_an_entry_that_climbs_out_of_dest(
    world: World, sandbox_id: str, tmp_path: Path
) -> None:
    """Row 1: search answers ``/dir/../../escaped``."""
    world.files["/dir/../../escaped"] = b"planted"
    dest = tmp_path / "a" / "b" / "dest"
    dest.parent.mkdir(parents=True)
    copied = cp(world, f"{sandbox_id}:/dir", str(dest))
    assert copied.status == EXIT_REFUSED, copied.stderr
    assert "/dir/../../escaped" in copied.stderr
    assert [f for f in written(tmp_path) if not f.startswith("a/b/dest/")] == []


def test_cp_refuses_an_absolute_remainder(world: World, sandbox_id: str, tmp_path: Path) -> None:
    """Row 2: search answers ``/dir//<an absolute path>``, which would replace DEST."""
    target = tmp_path / "rooted"
    world.files[f"/dir/{target}"] = b"planted"
    copied = cp(world, f"{sandbox_id}:/dir", str(tmp_path / "dest"))
    assert copied.status == EXIT_REFUSED, copied.stderr
    assert f"/dir/{target}" in copied.stderr
    assert not target.exists()
    assert [f for f in written(tmp_path) if not f.startswith("dest/")] == []


def test_cp_of_a_relative_path_refuses_an_entry_outside_it(
    world: World, sandbox_id: str, tmp_path: Path
) -> None:
    """execd resolves a relative SRC, so ``Files.search`` cannot say what is beneath it: cp
    holds the line itself (against the directory ``info`` named)."""
    world.inject("search", "outside_root", times=1)
    copied = cp(world, f"{sandbox_id}:dir", str(tmp_path / "dest"))
    assert copied.status == EXIT_REFUSED, copied.stderr
    assert "'/etc/passwd'" in copied.stderr and "'/dir'" in copied.stderr
    assert written(tmp_path) == []
    assert cp(world, f"{sandbox_id}:dir", str(tmp_path / "dest")).status == 0
    assert written(tmp_path) == ["dest/a.txt", "dest/sub/b.txt"]


def test_cp_names_the_copy_after_the_users_path(
    world: World, sandbox_id: str, tmp_path: Path
) -> None:
    """execd resolves a relative PATH and may answer any name for it (``.bashrc``, ``.ssh``):
    the copy is named after the user's PATH, as docker cp's, never after execd's answer."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".bashrc").write_bytes(b"# mine\n")
    (home / ".ssh" / "a.txt").write_bytes(b"ssh-ed25519 mine\n")
    # The hostile execd serves the files it named too.
    world.files.update({RENAMED_FILES["/dir/a.txt"]: b"owned\n"})
    world.files.update({f"{RENAMED_DIRECTORY}/a.txt": b"alpha\n"})
    world.files.update({f"{RENAMED_DIRECTORY}/sub/b.txt": b"beta\n"})
    world.inject("info", "renamed")
    world.inject("search", "renamed")
    for src in ("dir/a.txt", "dir"):
        copied = cp(world, f"{sandbox_id}:{src}", str(home))
        assert copied.status == 0, copied.stderr
    assert written(home) == [".bashrc", ".ssh/a.txt", "a.txt", "dir/a.txt", "dir/sub/b.txt"]
    assert (home / ".bashrc").read_bytes() == b"# mine\n"
    assert (home / ".ssh" / "a.txt").read_bytes() == b"ssh-ed25519 mine\n"
    assert (home / "a.txt").read_bytes() == b"alpha\n"


def test_cp_follows_dest_when_it_is_the_users_symlink(
    world: World, sandbox_id: str, tmp_path: Path
) -> None:
    """DEST is a symlink to a directory: the user's own path, followed (as docker cp does),
    whatever name execd gives the file (here ``/``, which would name DEST itself)."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "dl").symlink_to(real)
    world.files["/"] = b"owned"  # as long as /dir/sub/b.txt
    world.inject("info", "renamed")
    copied = cp(world, f"{sandbox_id}:dir/sub/b.txt", str(tmp_path / "dl"))
    assert copied.status == 0, copied.stderr
    assert (tmp_path / "dl").is_symlink()
    assert written(real) == ["b.txt"] and (real / "b.txt").read_bytes() == b"beta\n"


def test_cp_dash_writes_clean_relative_names_only(world: World, sandbox_id: str) -> None:
    """Row 3: ``cp SB:/top/dir -`` of an entry ``/top/dir/../../../tmp/escaped``."""
    world.files.update({"/top/dir/ok.txt": b"ok", "/top/dir/../../../tmp/escaped": b"planted"})
    copied = cp(world, f"{sandbox_id}:/top/dir", "-")
    names = tar_names(bytes(copied.stdout.kept)) if copied.stdout.size else []
    assert all(clean_relative(name) for name in names), names
    assert copied.status == EXIT_REFUSED, copied.stderr
    assert "/top/dir/../../../tmp/escaped" in copied.stderr


def test_cp_dash_streams_a_file_in_bounded_memory(world: World, sandbox_id: str) -> None:
    """Row 4: a 64 MiB file goes to the tar stream without being held (the 2 GiB figure is
    benchmarks/bench_cp.py's)."""
    size = 64 << 20
    world.files["/top/dir/big.bin"] = size
    tracemalloc.start()
    try:
        copied = cp(world, f"{sandbox_id}:/top/dir", "-", keep=512)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert copied.status == 0, copied.stderr
    header = tarfile.TarInfo.frombuf(bytes(copied.stdout.kept), "utf-8", "surrogateescape")
    assert (header.name, header.size) == ("dir/big.bin", size)
    assert copied.stdout.size >= 512 + size
    assert peak < 16 << 20, f"the copy held {peak / 2**20:.0f} MiB at its peak"


def test_cp_dash_copies_a_download_that_comes_in_odd_chunks(world: World, sandbox_id: str) -> None:
    """tarfile reads 16 KiB at a time and takes a short read for a truncated file: the chunks
    of a length-less download are whatever the wire brought (10 000 bytes each here)."""
    world.files["/top/dir/f.bin"] = 100_000
    world.inject("download", "odd_chunks")
    copied = cp(world, f"{sandbox_id}:/top/dir", "-")
    assert copied.status == 0, copied.stderr
    with tarfile.open(fileobj=io.BytesIO(bytes(copied.stdout.kept))) as archive:
        handle = archive.extractfile("dir/f.bin")
        assert handle is not None and handle.read() == generated(100_000)


def test_cp_refuses_a_download_longer_than_its_listing(
    world: World, sandbox_id: str, tmp_path: Path
) -> None:
    """Row 4, a fake size: the listing says 1 byte, the download sends 8 MiB."""
    world.files["/top/dir/big.bin"] = 8 << 20
    world.inject("search", "understated_size", times=1)
    copied = cp(world, f"{sandbox_id}:/top/dir", "-", keep=512)
    assert copied.status == EXIT_REFUSED, copied.stderr
    assert "/top/dir/big.bin" in copied.stderr
    assert copied.stdout.size < 1 << 20
    world.inject("search", "understated_size", times=1)
    copied = cp(world, f"{sandbox_id}:/top/dir", str(tmp_path / "dest"))
    assert copied.status == EXIT_REFUSED, copied.stderr
    assert written(tmp_path) == []


def test_cp_never_writes_through_a_symlink_in_dest(
    world: World, sandbox_id: str, tmp_path: Path
) -> None:
    """DEST/dir/sub is a symlink to a directory outside and DEST/dir/a.txt one to a file
    outside (planted before the copy, or by another process during it): neither is followed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.txt").write_bytes(b"keep me")
    dest = tmp_path / "dest"
    (dest / "dir").mkdir(parents=True)
    (dest / "dir" / "a.txt").symlink_to(outside / "a.txt")
    (dest / "dir" / "sub").symlink_to(outside)
    copied = cp(world, f"{sandbox_id}:/dir", str(dest))
    assert copied.status == EXIT_REFUSED, copied.stderr
    assert "/dir/sub/b.txt" in copied.stderr
    assert written(outside) == ["a.txt"] and (outside / "a.txt").read_bytes() == b"keep me"


def test_cp_holds_two_descriptors_however_deep_an_entry_is(
    world: World, sandbox_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One descriptor a level ran out at the default 1024 (EMFILE, exit 125, directories left
    behind): a parent is closed once its child is open."""
    deep = "/dir/" + "d/" * 300 + "f.txt"
    world.files[deep] = b"deep\n"
    opened: list[int] = []
    write_file = _cli_copy._write_file

    def counting(parent: int, name: str, chunks: Iterator[bytes], stamp: Any) -> None:
        opened.append(len(os.listdir("/proc/self/fd")))
        write_file(parent, name, chunks, stamp)

    monkeypatch.setattr(_cli_copy, "_write_file", counting)
    before = len(os.listdir("/proc/self/fd"))
    copied = cp(world, f"{sandbox_id}:/dir", str(tmp_path / "dest"))
    assert copied.status == 0, copied.stderr
    assert (tmp_path / "dest" / deep[len("/dir/") :]).read_bytes() == b"deep\n"
    assert len(opened) == 3 and max(opened) - before < 16, (before, opened)


def test_cp_refuses_a_listing_larger_than_the_free_space(
    world: World, sandbox_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox may list a file of any size and stream zeros to match: what the listing adds
    up to must fit where DEST is (here, 1 MiB free), checked before anything is written."""
    world.files["/top/dir/big.bin"] = 2 << 20
    found = os.statvfs(tmp_path)

    def one_mib_free(fd: int) -> os.statvfs_result:
        free = (1 << 20) // found.f_frsize
        return os.statvfs_result((*found[:4], free, *found[5:]))

    monkeypatch.setattr(_cli_copy.os, "fstatvfs", one_mib_free)
    for src in ("/top/dir", "/top/dir/big.bin"):
        copied = cp(world, f"{sandbox_id}:{src}", str(tmp_path / "dest"))
        assert copied.status == EXIT_REFUSED, copied.stderr
        assert "listed 2097152 bytes to copy" in copied.stderr
        assert written(tmp_path) == []


@pytest.mark.parametrize("dest", ["-", "dest"])
def test_cp_refuses_a_name_no_path_can_carry(
    dest: str, world: World, sandbox_id: str, tmp_path: Path
) -> None:
    """A lone surrogate in a name (valid JSON) went into a URL or a tar header, which raised
    UnicodeEncodeError (a traceback, exit 1 as if refused)."""
    world.inject("search", "lone_surrogate")
    copied = cp(world, f"{sandbox_id}:/dir", dest if dest == "-" else str(tmp_path / dest))
    assert copied.status == EXIT_REFUSED, copied.stderr
    assert "'/dir/a\\ud800b'" in copied.stderr and "Traceback" not in copied.stderr
    assert copied.stdout.size == 0 and written(tmp_path) == []


@pytest.mark.parametrize("route", ["info", "search"])
@pytest.mark.parametrize("debug", [False, True])
def test_cp_prints_what_execd_said_as_text(
    route: str, debug: bool, world: World, sandbox_id: str, tmp_path: Path
) -> None:
    """An escape sequence in a request id, an error's message or an entry reaches stderr as
    text (``printable``), with ``--debug`` (its traceback and log lines) too, and never the
    token."""
    world.inject(route, "terminal_escapes")
    copied = cp(world, f"{sandbox_id}:/dir", str(tmp_path), 1 << 20, *(["--debug"] * debug))
    assert copied.status == (125 if route == "info" else EXIT_REFUSED), copied.stderr
    assert "\\x1b]0;PWNED\\x07\\x1b[2J" in copied.stderr and "\\u202e" in copied.stderr
    unprintable = {c for c in copied.stderr if not c.isprintable() and c != "\n"}
    assert unprintable == set(), unprintable
    assert TOKEN[:-1] not in copied.stderr


def test_cp_of_a_healthy_tree_both_ways(world: World, sandbox_id: str, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    assert cp(world, f"{sandbox_id}:/dir", str(dest)).status == 0
    assert written(dest) == ["a.txt", "sub/b.txt"]
    assert (dest / "sub" / "b.txt").read_bytes() == b"beta\n"
    copied = cp(world, f"{sandbox_id}:/dir", "-")
    assert copied.status == 0, copied.stderr
    with tarfile.open(fileobj=io.BytesIO(bytes(copied.stdout.kept))) as archive:
        assert sorted(archive.getnames()) == ["dir/a.txt", "dir/sub/b.txt"]
        handle = archive.extractfile("dir/a.txt")
        assert handle is not None and handle.read() == b"alpha\n"


@pytest.fixture(autouse=True)
def _healthy_commands(world: World) -> Iterator[None]:
    """Each test's ``/command`` prints "ok" unless it says otherwise (the world outlives it)."""
    world.command_stdout = None
    yield
    world.command_stdout = None


def _specials(*lines: str) -> list[str]:
    """What the sandbox's listing of symlinks and empty directories prints (`_cli_copy`)."""
    return [_cli_copy.SPECIALS_HEAD, *lines, _cli_copy.SPECIALS_END]


def _hex(text: str) -> str:
    return text.encode().hex()


@pytest.mark.parametrize("name", ["../up", "/abs", "a/../../up", "", "a//b", "./a"])
def test_cp_refuses_a_special_entry_that_is_not_a_clean_name_beneath(
    world: World, sandbox_id: str, tmp_path: Path, name: str
) -> None:
    """Issue 49: the names of symlinks and empty directories come from a command's output."""
    for line in (f"d {_hex(name)}", f"l {_hex(name)} {_hex('x')}0a"):
        world.command_stdout = _specials(line)
        dest = tmp_path / "a" / "dest"
        copied = cp(world, f"{sandbox_id}:/dir", str(dest))
        assert copied.status == EXIT_REFUSED, copied.stderr
        assert "nothing more was copied" in copied.stderr or "nothing was copied" in copied.stderr
        assert [f for f in written(tmp_path) if not f.startswith("a/dest/")] == []
        assert not (tmp_path / "up").exists()


@pytest.mark.parametrize("line", ["x 00", "d zz", "l 61", "l 61 00", "l 61 " + "61" * 5000])
def test_cp_refuses_a_special_listing_it_cannot_read(
    world: World, sandbox_id: str, tmp_path: Path, line: str
) -> None:
    world.command_stdout = _specials(line)
    copied = cp(world, f"{sandbox_id}:/dir", str(tmp_path / "dest"))
    assert copied.status == EXIT_REFUSED and "symlinks and empty directories" in copied.stderr


def test_cp_makes_a_sandboxs_link_last_and_never_writes_through_one(
    world: World, sandbox_id: str, tmp_path: Path
) -> None:
    """A link the sandbox names where its listing has a directory of files is refused (the
    files came first, and a rename never replaces a directory); one elsewhere is made, pointing
    wherever it said, after every file: nothing of the copy goes through it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    world.command_stdout = _specials(f"l {_hex('sub')} {_hex(str(outside))}0a")
    copied = cp(world, f"{sandbox_id}:/dir", str(tmp_path / "dest"))
    assert copied.status == EXIT_REFUSED and "'/dir/sub'" in copied.stderr, copied.stderr
    assert written(outside) == []
    # A directory below a link the copy made: made through it never (the walk meets the link).
    world.command_stdout = _specials(
        f"l {_hex('hop')} {_hex(str(outside))}0a", f"d {_hex('hop/inner')}"
    )
    copied = cp(world, f"{sandbox_id}:/dir", str(tmp_path / "dest1"))
    assert copied.status == EXIT_REFUSED and "'/dir/hop/inner'" in copied.stderr, copied.stderr
    assert list(outside.iterdir()) == []
    world.command_stdout = _specials(
        f"l {_hex('link')} {_hex(str(outside))}0a", f"d {_hex('sub/empty')}"
    )
    dest = tmp_path / "dest2"
    copied = cp(world, f"{sandbox_id}:/dir", str(dest))
    assert copied.status == 0, copied.stderr
    assert os.readlink(dest / "link") == str(outside) and written(outside) == []
    assert (dest / "sub" / "empty").is_dir() and not (dest / "sub" / "empty").is_symlink()
    tarred = cp(world, f"{sandbox_id}:/dir", "-")
    assert tarred.status == 0, tarred.stderr
    with tarfile.open(fileobj=io.BytesIO(bytes(tarred.stdout.kept))) as archive:
        link, empty = archive.getmember("dir/link"), archive.getmember("dir/sub/empty")
        assert (link.issym(), link.linkname, empty.isdir()) == (True, str(outside), True)


def test_cp_without_the_sandboxs_listing_says_what_is_lost(
    world: World, sandbox_id: str, tmp_path: Path
) -> None:
    """An image without find, od or bash (here: a command that prints "ok"): one line."""
    copied = cp(world, f"{sandbox_id}:/dir", str(tmp_path / "dest"))
    assert copied.status == 0
    assert copied.stderr.count("symlinks and empty directories were not copied") == 1


def test_cp_refuses_a_listing_of_more_entries_than_it_holds(
    world: World, sandbox_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 MiB of listing is a million short lines, which took some 300 MiB of the client's
    memory to hold and check: more entries than ``SPECIALS_ENTRIES`` (as a search, some
    80 000 files) stop the copy before any is parsed. Here the bound is lowered to 50."""
    monkeypatch.setattr(_cli_copy, "SPECIALS_ENTRIES", 50)
    world.command_stdout = _specials(*(f"d {_hex(f'e{n}')}" for n in range(51)))
    copied = cp(world, f"{sandbox_id}:/dir", str(tmp_path / "dest"))
    assert copied.status == EXIT_REFUSED, copied.stderr
    assert "more than 50" in copied.stderr and written(tmp_path) == []
    world.command_stdout = _specials(*(f"d {_hex(f'e{n}')}" for n in range(50)))
    assert cp(world, f"{sandbox_id}:/dir", str(tmp_path / "dest")).status == 0


def test_a_later_cp_never_follows_a_link_an_earlier_one_left_in_dest(
    world: World, sandbox_id: str, tmp_path: Path
) -> None:
    """A sandbox's symlink copied out (``cp SB:/x/dir DEST``, /x/dir a link to anywhere) lands
    in DEST; a later ``cp SB:/dir DEST`` must not write through it: only DEST itself is the
    user's to follow."""
    outside, dest = tmp_path / "outside", tmp_path / "dest"
    outside.mkdir()
    dest.mkdir()
    (dest / "dir").symlink_to(outside)  # what the earlier copy made
    world.command_stdout = _specials(f"d {_hex('empty')}")
    for src in (f"{sandbox_id}:/dir", f"{sandbox_id}:/dir/"):
        copied = cp(world, src, str(dest))
        assert copied.status == EXIT_REFUSED, copied.stderr
        assert "symlink" in copied.stderr
        assert list(outside.iterdir()) == []


def test_cp_out_applies_no_mode_bit_the_umask_takes_away(
    world: World, sandbox_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox saying 4777 (a file) or 1777 (a directory) gets a world-writable copy neither
    (nor setuid, nor sticky): the modes it says are masked with the umask, as tar and cp do
    for a user."""
    import tests.faults.faultserver as faultserver

    info = faultserver._info

    def wide(path: str, files: dict[str, bytes | int]) -> dict[str, Any] | None:
        found = info(path, files)
        if found is not None:
            found["mode"] = 4777 if found["type"] == "file" else 1777
        return found

    monkeypatch.setattr(faultserver, "_info", wide)
    world.command_stdout = _specials(f"d {_hex('sub')}", f"d {_hex('empty')}")
    dest = tmp_path / "dest"
    old = os.umask(0o022)
    try:
        copied = cp(world, f"{sandbox_id}:/dir", str(dest))
    finally:
        os.umask(old)
    assert copied.status == 0, copied.stderr
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in dest.rglob("*")}
    assert modes == {"a.txt": 0o755, "sub": 0o755, "b.txt": 0o755, "empty": 0o755}, modes


def test_cp_out_counts_the_listings_directories_against_the_free_space(
    world: World, sandbox_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each directory takes a block and an inode: a listing of millions of them (16 MiB of
    listing holds 3 million) must fit where DEST is, as its files must."""
    found = os.statvfs(tmp_path)

    def little_free(fd: int) -> os.statvfs_result:
        blocks = 100
        return os.statvfs_result((*found[:4], blocks, found[5], 100, 100, *found[8:]))

    monkeypatch.setattr(_cli_copy.os, "fstatvfs", little_free)
    world.command_stdout = _specials(*(f"d {_hex(f'e{n}')}" for n in range(500)))
    copied = cp(world, f"{sandbox_id}:/dir", str(tmp_path / "dest"))
    assert copied.status == EXIT_REFUSED, copied.stderr
    assert not (tmp_path / "dest" / "e0").exists()


# -- every execd route the client calls, lied to --------------------------------------------

PACKAGE = Path(__file__).resolve().parents[2] / "osb_sync"
# Calls on an ``_execd`` that make no request, or make one only through those below.
NOT_ROUTES = {"invalid", "move", "tls_settings"}  # tls_settings: the WebSocket's TLS, no request
GENERIC = ("flood", "redirect_cross_origin", "redirect_same_origin", "deflate_bomb")
READ_TIMEOUT = 0.4
RUN_TIMEOUT = 1.0
CAP = 64 * 1024
BOUND = 3.0


# Methods that forward their caller's route to execd (``Files`` adds the files-as-a-user prefix):
# their callers' literals are read instead.
FORWARDERS = {("_files.py", "_request"), ("_files.py", "_answer")}


def _template(node: ast.expr, where: str) -> str:
    """A call's path: a str, or an f-string whose fields become ``{id}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{id}" for v in node.values)
    raise AssertionError(f"{where}: an execd path that is not a literal ({ast.unparse(node)})")


def client_routes() -> set[tuple[str, str]]:
    """(method, path) of every execd call in the client's source (``osb_sync/*.py``; ``local``
    is the server): ``request``, ``answer``, ``stream`` (POST, and its ``interrupt_path``
    DELETE) and ``interrupt`` (DELETE) on an ``_execd``."""
    found: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        inside_forwarders = {
            id(inner)
            for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef) and (path.name, function.name) in FORWARDERS
            for inner in ast.walk(function)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if id(node) in inside_forwarders:
                continue
            receiver, verb = node.func.value, node.func.attr
            where = f"{path.name}:{node.lineno}"
            if isinstance(receiver, ast.Name) and (path.name, verb) in FORWARDERS:
                verb = verb.lstrip("_")  # self._request(...): read as execd.request(...)
            elif not (isinstance(receiver, ast.Attribute) and receiver.attr == "_execd"):
                continue
            if verb in ("request", "answer"):
                method = node.args[0]
                assert isinstance(method, ast.Constant), f"{where}: a method that is no literal"
                found.add((str(method.value), _template(node.args[1], where)))
            elif verb == "stream":
                found.add(("POST", _template(node.args[0], where)))
                for keyword in node.keywords:
                    if keyword.arg == "interrupt_path":
                        found.add(("DELETE", _template(keyword.value, where)))
            elif verb == "interrupt":
                found.add(("DELETE", _template(node.args[0], where)))
            else:
                assert verb in NOT_ROUTES, f"{where}: execd.{verb}: a route this test cannot read"
    return found


def fault_route(method: str, template: str) -> str:
    """The fault server's name for a route the client calls."""
    route, _ = _match("execd", method, "/sbx-1" + template.replace("{id}", "x1"))
    assert route is not None, f"the fault server has no route for {method} {template}"
    return route


@dataclass(frozen=True)
class Case:
    """One client call on a lying route, and what it must end in: ``ok`` (a contained result,
    checked by ``holds``), ``INVALID_RESPONSE`` (naming ``names``), or an error class."""

    route: str
    lie: str
    call: Callable[[Sandbox, Path], Any]
    outcome: str
    names: str = ""
    holds: Callable[[Any], bool] = lambda value: True


def _session_run(sandbox: Sandbox) -> Any:
    session = sandbox.commands.session()
    try:
        return session.run("echo ok", max_output_bytes=CAP, timeout=RUN_TIMEOUT)
    finally:
        session.close()


CALLS: dict[str, Callable[[Sandbox, Path], Any]] = {
    "ping": lambda sb, tmp: sb.ping(),
    "code": lambda sb, tmp: sb.run_code("print('ok')", timeout=RUN_TIMEOUT, max_output_bytes=CAP),
    "interrupt": lambda sb, tmp: sb.contexts.interrupt("ctx-1"),
    "context_create": lambda sb, tmp: sb.contexts.create("python"),
    "contexts_list": lambda sb, tmp: sb.contexts.list(),
    "contexts_delete": lambda sb, tmp: sb.contexts.delete_all("python"),
    "context_get": lambda sb, tmp: sb.contexts.get("ctx-1"),
    "context_delete": lambda sb, tmp: sb.contexts.delete("ctx-1"),
    "command": lambda sb, tmp: sb.commands.run("echo ok", timeout=0.3, max_output_bytes=CAP),
    "command_status": lambda sb, tmp: sb.commands.get("cmd-1").status(),
    "command_logs": lambda sb, tmp: sb.commands.get("cmd-1").logs(1),
    "session_create": lambda sb, tmp: sb.commands.session(),
    "session_run": lambda sb, tmp: _session_run(sb),
    "session_delete": lambda sb, tmp: sb.commands.session().close(),
    "info": lambda sb, tmp: sb.files.info("/dir"),
    "download": lambda sb, tmp: sb.files.read_bytes("/data.bin", max_bytes=CAP),
    "upload": lambda sb, tmp: sb.files.write("/dir/new.txt", "new"),
    "search": lambda sb, tmp: sb.files.search("/dir"),
    "remove": lambda sb, tmp: sb.files.remove("/dir/a.txt"),
    "move": lambda sb, tmp: sb.files.move("/dir/a.txt", "/dir/c.txt"),
    "chmod": lambda sb, tmp: sb.files.chmod("/dir/a.txt", 0o600),
    "replace": lambda sb, tmp: sb.files.replace("/dir/a.txt", "alpha", "beta"),
    "list": lambda sb, tmp: sb.files.list("/dir"),
    "mkdir": lambda sb, tmp: sb.files.mkdir("/dir/new"),
    "rmtree": lambda sb, tmp: sb.files.rmtree("/dir/sub"),
    "metrics": lambda sb, tmp: sb.metrics(),
    "pty_create": lambda sb, tmp: sb.pty.create(),
    "pty_status": lambda sb, tmp: sb.pty.status("pty-1"),
    "pty_delete": lambda sb, tmp: sb.pty.delete("pty-1"),
}
STREAMS = ("code", "command", "session_run")
# What the client refuses a lie with: a piece of the message that names the field.
NAMED = {
    "traversal_name": "is not a clean absolute path",
    "absolute_remainder": "is not a clean absolute path",
    "outside_root": "'path' of entry 0 is not beneath '/dir'",
    "renamed": "'path' of entry 0 is not beneath '/dir'",
    "past_path_max": "is longer than a path can be (4096 bytes, PATH_MAX)",
    "lone_surrogate": "is not valid Unicode (a lone surrogate)",
    "endless_digits": "EXECD-COMMANDS-TAIL-CURSOR header is not a byte offset",
    "negative_size": "'size' of",
    "huge_size": "'size' of",
    "hostile_id": "is not an id that can stand in a URL",
    "credential_id": "holds a credential of this sandbox (its execd token)",
    "token_at_the_cut": "is not a JSON object (got ['xxx",
    "range_ignored": "a download from byte 100 is not a 206",
}
NAMED_PER_ROUTE = {
    ("wrong_types", "info"): "the entry for '/dir' is not a JSON object",
    ("wrong_types", "search"): "'path' of entry 0 is not a string",
    ("wrong_types", "list"): "the answer is not a JSON array",
    ("wrong_types", "replace"): "'replacedCount' of the entry for '/dir/a.txt'",
    ("wrong_types", "metrics"): "'cpu_count' of the answer is not a number",
    ("wrong_types", "context_create"): "'id' of the answer",
    ("wrong_types", "context_get"): "'id' of the answer",
    ("wrong_types", "contexts_list"): "the answer is not a JSON array",
    ("wrong_types", "command_status"): "'running' of the answer is not a boolean",
    ("wrong_types", "session_create"): "'session_id' of the answer",
    ("wrong_types", "pty_create"): "'session_id' of the answer",
    ("wrong_types", "pty_status"): "'running' of the answer is not a boolean",
    ("absurd_numbers", "pty_status"): "'output_offset' of the answer",
    ("wrong_types", "command_logs"): "EXECD-COMMANDS-TAIL-CURSOR header is not a byte offset",
    ("absurd_numbers", "metrics"): "'cpu_count' of the answer is not a finite number of 0",
    ("absurd_numbers", "replace"): "'replacedCount' of the entry for '/dir/a.txt'",
    ("absurd_numbers", "command_logs"): "EXECD-COMMANDS-TAIL-CURSOR header is not a byte offset",
}


def _ran_ok(value: Any) -> bool:
    return str(value.stdout).startswith("ok\n")


def _case(route: str, lie: str) -> Case:
    call = CALLS[route]
    if lie == "flood":
        if route == "ping":
            return Case(route, lie, call, "ok", holds=lambda value: value is False)
        limited = route in STREAMS or route == "download"
        return Case(route, lie, call, "OutputLimitExceeded" if limited else "TransportError")
    if lie in ("redirect_cross_origin", "redirect_same_origin", "deflate_bomb"):
        if route == "ping":
            return Case(route, lie, call, "ok", holds=lambda value: value is False)
        if lie == "deflate_bomb":
            return Case(route, lie, call, "INVALID_RESPONSE", "Content-Encoding header is not")
            return Case(route, lie, call, "ok", holds=lambda value: value is False)
        return Case(route, lie, call, "TransportError")
    if lie == "terminal_escapes":  # the library's messages are data; the CLI prints them
        if route == "info":
            return Case(route, lie, call, "ApiError", "-> 500 X\x1b]0;PWNED")
        return Case(route, lie, call, "INVALID_RESPONSE", "entry 0 is not a JSON object")
    if lie == "token_chunk":
        return Case(route, lie, call, "StreamError", "[redacted]")
    if lie in ("hostile_id", "credential_id") and route == "command":
        call = lambda sb, tmp: sb.commands.start("sleep 1")  # noqa: E731 - its id goes in URLs
    if lie == "range_ignored":
        call = lambda sb, tmp: b"".join(sb.files.iter_bytes("/data.bin", start=100))  # noqa: E731
    if lie == "wrong_types" and route in STREAMS:
        return Case(route, lie, call, "ok", holds=_ran_ok)  # events with odd fields are dropped
    if lie == "understated_size":  # not a lie a listing can show: cp holds it (above)
        return Case(route, lie, call, "ok")
    if lie == "padded":  # 2 MiB: past an object's cap (1 MiB), within a listing's (16 MiB)
        if route == "search":
            return Case(route, lie, call, "ok", holds=lambda value: len(value) == 2)
        return Case(route, lie, call, "TransportError", "exceeded 1048576 bytes")
    if lie == "odd_chunks":
        return Case(route, lie, call, "ok", holds=lambda value: value == FILE_BYTES)
    if lie == "renamed" and route == "info":  # data, never a host path: cp holds it (above)
        return Case(route, lie, call, "ok")
    names = NAMED_PER_ROUTE.get((lie, route)) or NAMED[lie]
    return Case(route, lie, call, "INVALID_RESPONSE", names)


DRIPS = ("drip_head", "drip_body")  # each ends at the call's bound: a client of their own
CASES = [
    _case(route, lie)
    for route in CALLS
    for lie in dict.fromkeys(
        [*GENERIC, *(name for name, lie in LIES.items() if route in lie.routes)]
    )
    if lie not in DRIPS
]
# Beyond the route's own call: a download to disk, which a hostile execd could make endless.
CASES.append(
    Case(
        "download",
        "flood",
        lambda sb, tmp: sb.files.download("/data.bin", tmp / "data.bin", max_bytes=CAP),
        "OutputLimitExceeded",
    )
)


@pytest.fixture
def client(world: World) -> Iterator[Client]:
    with Client(world.api_base, KEY, connect_timeout=0.5, read_timeout=READ_TIMEOUT) as c:
        yield c


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.route}-{case.lie}")
def test_a_lying_route_ends_contained_or_typed(
    case: Case, world: World, client: Client, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="osb_sync")
    sandbox = client.create_sandbox(ready_timeout=2)
    try:
        world.inject(case.route, case.lie)
        outcome = bounded(world, lambda: case.call(sandbox, tmp_path), BOUND)
        world.heal()
        assert not outcome.hung, f"no answer within {BOUND} s"
        error = outcome.error
        if error is not None and not isinstance(error, OpenSandboxError):
            raise AssertionError(f"untyped error: {error!r}") from error
        if case.outcome == "ok":
            assert error is None and case.holds(outcome.value), (outcome.value, error)
        elif case.outcome == "INVALID_RESPONSE":
            assert isinstance(error, ApiError) and error.code == "INVALID_RESPONSE", repr(error)
            assert case.names in str(error), str(error)
        else:
            assert type(error).__name__ == case.outcome, repr(error)
            assert case.names in str(error), str(error)
        text = chain_text(error) + caplog.text
        # All but its last character is a leak too (a value cut before it was redacted).
        assert KEY[:-1] not in text and TOKEN[:-1] not in text, "a credential leaked"
        assert world.requests("other") == [], "a request reached another origin"
        for seen in world.requests("execd"):
            assert API_KEY_HEADER.lower() not in {h.lower() for h in seen.headers}
            assert seen.route is not None and ".." not in seen.path and "v1" not in seen.path
        assert sandbox.ping(), "the same client could not reach execd afterwards"
    finally:
        client.delete_sandbox(sandbox.id)


@pytest.mark.parametrize("route", CALLS)
def test_a_redirect_from_execd_never_reaches_the_lifecycle_api(
    route: str, world: World, client: Client, tmp_path: Path
) -> None:
    """Behind a server proxy (the local server's endpoints, the real server's
    ``use_server_proxy``) execd's origin is the lifecycle API's: followed there, a redirect
    from execd made the client delete a sandbox (on a server without a key, as the local one
    is by default: the execd token went along, the API key never does)."""
    world.proxied = True
    sandbox = client.create_sandbox(ready_timeout=2)
    try:
        assert sandbox.execd_url.startswith(world.api.url + "/sandboxes/")
        world.inject(route, "redirect_same_origin")
        asked = len(world.requests("api"))
        outcome = bounded(world, lambda: CALLS[route](sandbox, tmp_path), BOUND)
        world.heal()
        assert world.requests("api")[asked:] == [], "execd made the client call the API"
        assert world.live() == [sandbox.id]
        if route != "ping":  # ping answers False
            assert isinstance(outcome.error, TransportError), repr(outcome.error)
            assert "follows no redirect" in str(outcome.error)
    finally:
        client.delete_sandbox(sandbox.id)


# -- a byte now and then: the read timeout bounds each silence, call_timeout the whole call ----

CALL_TIMEOUT = 0.25
PATIENT = 2.0  # the read timeout of these clients: it cannot be what ends their calls
WITHIN = 1.5  # generous, but under PATIENT


def _drip_case(route: str, lie: str) -> Case:
    if route == "ping":
        return Case(route, lie, CALLS[route], "ok", holds=lambda value: value is False)
    if route == "download" and lie == "drip_body":  # read_bytes: its body within call_timeout
        return Case(route, lie, CALLS[route], "StreamError", "within call_timeout (0.25 s)")
    return Case(route, lie, CALLS[route], "TransportError", "within call_timeout (0.25 s)")


DRIP_CASES = [_drip_case(route, lie) for lie in DRIPS for route in LIES[lie].routes]


@pytest.fixture
def patient(world: World) -> Iterator[Client]:
    with Client(
        world.api_base, KEY, connect_timeout=0.5, read_timeout=PATIENT, call_timeout=CALL_TIMEOUT
    ) as client:
        yield client


@pytest.mark.parametrize("case", DRIP_CASES, ids=lambda case: f"{case.route}-{case.lie}")
def test_a_dripping_route_ends_within_the_call_timeout(
    case: Case, world: World, patient: Client, tmp_path: Path
) -> None:
    """A byte every 50 ms in the headers or the body, under any read timeout: one of each way
    the client reads an answer ends at its ``call_timeout`` (an event stream's body is its
    run's timeout's: the fault matrix's ``drip``)."""
    sandbox = patient.create_sandbox(ready_timeout=2)
    try:
        world.inject(case.route, case.lie)
        outcome = bounded(world, lambda: case.call(sandbox, tmp_path), BOUND)
        world.heal()
        assert not outcome.hung, f"no answer within {BOUND} s"
        assert outcome.elapsed < WITHIN, outcome.elapsed
        if case.outcome == "ok":
            assert outcome.error is None and case.holds(outcome.value), outcome.error
        else:
            assert type(outcome.error).__name__ == case.outcome, repr(outcome.error)
            assert case.names in str(outcome.error), str(outcome.error)
        assert sandbox.ping(), "the same client could not reach execd afterwards"
    finally:
        patient.delete_sandbox(sandbox.id)


def test_through_a_callers_session_a_dripping_body_is_bounded_too(world: World) -> None:
    """A caller's session: its connections are not the client's, so the bound starts once the
    headers are in (the module docstring of ``_transport`` says so); the body is still cut."""
    with (
        requests.Session() as session,
        Client(
            world.api_base, KEY, session=session, read_timeout=PATIENT, call_timeout=CALL_TIMEOUT
        ) as client,
    ):
        sandbox = client.create_sandbox(ready_timeout=2)
        world.inject("info", "drip_body")
        outcome = bounded(world, lambda: sandbox.files.info("/dir"), BOUND)
        world.heal()
        client.delete_sandbox(sandbox.id)
    assert not outcome.hung and outcome.elapsed < WITHIN, outcome.elapsed
    assert isinstance(outcome.error, TransportError), repr(outcome.error)
    assert "within call_timeout (0.25 s)" in str(outcome.error)


TIMED: dict[str, tuple[str, str, Callable[[Sandbox, Path], Any], str]] = {
    "ping": ("ping", "drip_head", lambda sb, tmp: sb.ping(timeout=0.3), "ok"),
    "ping (body)": ("ping", "drip_body", lambda sb, tmp: sb.ping(timeout=0.3), "ok"),
    "wait_until_healthy": (
        "ping",
        "drip_head",
        lambda sb, tmp: sb.wait_until_healthy(0.5, 0.05),
        "SandboxTimeoutError",
    ),
    "run_code": (
        "code",
        "drip_head",
        lambda sb, tmp: sb.run_code("1", timeout=0.3),
        "SandboxTimeoutError",
    ),
    "iter_bytes": (
        "download",
        "drip_body",
        lambda sb, tmp: b"".join(sb.files.iter_bytes("/data.bin", timeout=0.3)),
        "SandboxTimeoutError",
    ),
    "download": (
        "download",
        "drip_head",
        lambda sb, tmp: sb.files.download("/data.bin", tmp / "data.bin", timeout=0.3),
        "SandboxTimeoutError",
    ),
}


@pytest.mark.parametrize("name", TIMED)
def test_a_timeout_given_bounds_the_whole_call(name: str, world: World, tmp_path: Path) -> None:
    """A call given a timeout (``ping``'s, ``wait_until_healthy``'s, a run's, a download's)
    ends within it, the wait for the headers included, whatever the call timeout."""
    route, lie, call, expected = TIMED[name]
    with Client(
        world.api_base, KEY, connect_timeout=0.5, read_timeout=PATIENT, call_timeout=30
    ) as client:
        sandbox = client.create_sandbox(ready_timeout=2)
        world.inject(route, lie)
        outcome = bounded(world, lambda: call(sandbox, tmp_path), BOUND)
        world.heal()
        client.delete_sandbox(sandbox.id)
    assert not outcome.hung and outcome.elapsed < WITHIN, outcome.elapsed
    if expected == "ok":
        assert outcome.error is None and outcome.value is False, outcome.error
    else:
        assert type(outcome.error).__name__ == expected, repr(outcome.error)


def test_every_route_the_client_calls_is_listed_and_attacked() -> None:
    """A route added to the client needs a line in this module's docstring, a route in the
    fault server and a call here: else this fails."""
    routes = client_routes()
    assert len(routes) >= 26, sorted(routes)  # the reader found the calls it is meant to
    doc = __doc__ or ""
    attacked = {(case.route, case.lie) for case in CASES}
    for method, template in sorted(routes):
        assert f"``{method} {template}``" in doc, f"{method} {template}: not in the docstring"
        route = fault_route(method, template)
        assert route in CALLS, f"{method} {template} ({route}): no call attacks it"
        lies = {lie for r, lie in attacked if r == route}
        assert set(GENERIC) <= lies, f"{route}: only {sorted(lies)}"
    assert {route for route, _ in attacked} == set(CALLS)
    assert all(any(lie.name == c.lie for c in CASES + DRIP_CASES) for lie in LIES.values())


def test_the_route_reader_sees_a_new_route(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader can fail: a module with an execd call it has never seen adds a route, and
    a call it cannot read (a path in a variable) is an error, not a silent miss."""
    (tmp_path / "_new.py").write_text(
        'def f(self):\n    return self._execd.request("GET", f"/new/{self.id}/thing")\n'
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert client_routes() == {("GET", "/new/{id}/thing")}
    (tmp_path / "_new.py").write_text('def f(self, p):\n    self._execd.request("GET", p)\n')
    with pytest.raises(AssertionError, match="not a literal"):
        client_routes()


@pytest.mark.parametrize(
    ("mode", "when", "stamp"),
    [
        (0o4755, "2001-09-09T01:46:40Z", (0o755, 1_000_000_000)),
        (0o7777, "9999-12-31T23:59:59Z", (0o777, 253402300799)),
        (0o2644, "1900-01-01T00:00:00Z", (0o644, 0)),
        ("not a mode", "not a time", (0o644, None)),
    ],
)
def test_cp_gives_a_copy_the_listings_mode_and_mtime_without_special_bits(
    tmp_path: Path, mode: Any, when: str, stamp: tuple[int, int | None]
) -> None:
    """A listing's setuid, setgid or sticky bit never reaches a copied file; an mtime before
    1970 is 1970, and one execd left out or garbled is the copy's own."""
    wire = int(oct(mode)[2:]) if isinstance(mode, int) else mode
    item = FileInfo.from_dict({"path": "/x", "type": "file", "mode": wire, "modified_at": when})
    assert _cli_copy._stamp(item) == stamp
    with _cli_copy._Tree(tmp_path) as tree:
        tree.write("x", iter([b"data"]), "/x", _cli_copy._stamp(item))
    found = (tmp_path / "x").stat()
    assert found.st_mode & 0o7777 == stamp[0] & ~_cli_copy._umask()
    if stamp[1] is not None and stamp[1] < 2**31:  # file systems clamp later times
        assert found.st_mtime == stamp[1]
