"""A hostile execd (issue 38): code running as root in a sandbox can replace its execd, so
every name, size, id and number an execd answers is hostile input for the client too.

``osb-sync cp`` out of a sandbox first (rows 1-4 of the issue, and the planted symlinks of a
DEST): nothing is written outside DEST, the ``-`` tar carries clean relative names only, and a
file streams in bounded memory.
"""

from __future__ import annotations

import io
import sys
import tarfile
import tracemalloc
from collections.abc import Iterator
from contextlib import redirect_stderr
from dataclasses import dataclass
from pathlib import Path

import pytest

from osb_sync import Client
from osb_sync._cli import main
from tests.faults.faultserver import KEY, World

EXIT_REFUSED = 1


@pytest.fixture(scope="module")
def servers() -> Iterator[World]:
    with World() as world:
        yield world


@pytest.fixture
def world(servers: World) -> Iterator[World]:
    servers.reset()
    yield servers
    servers.heal()


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


def cp(world: World, src: str, dest: str, keep: int = 1 << 20) -> Copied:
    """``osb-sync cp SRC DEST`` in this process; standard output as bytes (at most ``keep``)."""
    out, err = _Counter(keep), io.StringIO()
    saved = sys.stdout
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(out))
    try:
        with redirect_stderr(err):
            status = main(["cp", "--api-base", world.api_base, "--api-key", KEY, src, dest])
        sys.stdout.flush()
    finally:
        sys.stdout = saved
    return Copied(status, out, err.getvalue())


def written(root: Path) -> list[str]:
    """Every file and link under ``root``, relative to it."""
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
