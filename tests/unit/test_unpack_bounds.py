"""What a hostile layer may cost the server that unpacks it: memory, disk and inodes, CPU time
(issue 37, after the attack: findings 4 to 8, 10 and 13). Each test is a layer of the attack,
small; figures are in benchmarks/README.md, not here.
"""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from osb_sync.local.host.images import unpack as unpack_module
from osb_sync.local.host.images.unpack import SizeLimit, TooLarge, UnpackError, unpack
from tests.imagekit import Entry, Image, extended_header, layer_bytes, write_dir_layout


def _unpack(tmp_path: Path, *layers: bytes, **options: Any) -> Any:
    write_dir_layout(tmp_path / "layout", Image(list(layers)))
    return unpack(tmp_path / "layout", tmp_path / "rootfs", **options)


def _record(key: str, value: str) -> bytes:
    """One pax record: `LENGTH KEY=VALUE\\n`, LENGTH counting itself."""
    body = f" {key}={value}\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return f"{length}{body}".encode()


FILE = layer_bytes([Entry("f", data=b"x")])
SPARSE_10 = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": "1"}


@pytest.mark.parametrize(
    "layer",
    [
        extended_header(_record("comment", "x" * (4 << 20))) + FILE,  # read whole: memory
        extended_header(b"1" * (128 << 10)) + FILE,  # CVE-2024-6232: quadratic before 3.11.10
        extended_header(b"a" * (1 << 20), tarfile.GNUTYPE_LONGNAME) + FILE,
        extended_header(_record("path", "g")) * 3000 + FILE,  # each parsed in the one before
        layer_bytes([Entry("s", data=b"100000\n" + b"0\n" * 200_000, pax=SPARSE_10)]),
    ],
    ids=["pax-record", "pax-digits", "gnu-long-name", "pax-chain", "sparse-map"],
)
def test_a_members_headers_take_at_most_32_kib_of_the_stream(tmp_path: Path, layer: bytes) -> None:
    """Finding 6 and 7: tarfile reads each whole before a member is seen (a 1 MB layer held a
    3 GiB header; 1 MB of digits in a pax header took half an hour of CPU on 3.11.7, a chain of
    headers raised RecursionError)."""
    with pytest.raises(UnpackError, match=r"headers take more than 32\.0 KiB \(32768 bytes\)"):
        _unpack(tmp_path, layer)


def test_a_layer_keeps_no_member_it_has_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 6: in stream mode tarfile keeps every member it read (500 bytes each: a 10 GiB
    image of small files, 10 GiB of the server's memory)."""
    kept: list[int] = []
    read = tarfile.TarFile.next

    def counting(tar: tarfile.TarFile) -> tarfile.TarInfo | None:
        kept.append(len(tar.members))
        return read(tar)

    monkeypatch.setattr(tarfile.TarFile, "next", counting)
    _unpack(tmp_path, layer_bytes([Entry(f"f{i}") for i in range(50)]))
    assert len(kept) > 50 and max(kept) <= 1


def test_pax_global_records_are_few(tmp_path: Path) -> None:
    """tarfile copies them into every member that follows: thousands of records, thousands
    of copies a member."""
    records = b"".join(_record(f"k{i}", "v") for i in range(100))
    with pytest.raises(UnpackError, match="more than 64 pax global records"):
        _unpack(tmp_path, extended_header(records, tarfile.XGLTYPE) + FILE)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (Entry("s", pax={"GNU.sparse.map": "0,0", "GNU.sparse.size": "x"}), "malformed"),
        (Entry("s", pax={"GNU.sparse.map": "a,b"}), "malformed"),
        (Entry("s", data=b"9", pax=SPARSE_10), "malformed"),  # its map ends without a newline
        (Entry("f", pax={"path": "a\0b"}), "NUL byte"),
        (Entry("l", "symlink", pax={"linkpath": "/etc\0"}), "NUL byte"),
        (Entry("f", pax={"mtime": "1e300"}), "time"),
        (Entry("f", pax={"mtime": "inf"}), "time"),
    ],
)
def test_a_malformed_header_is_refused_with_the_members_name(
    tmp_path: Path, entry: Entry, says: str
) -> None:
    """Finding 13: tarfile's ValueError (a number it reads), the kernel's for a NUL byte, an
    OverflowError of a time: each was a 500 UNKNOWN_ERROR with a traceback in the log."""
    with pytest.raises(UnpackError, match=says):
        _unpack(tmp_path, layer_bytes([entry]))


def _sparse(name: str, size: int, regions: str = "0,0", data: bytes = b"") -> Entry:
    """A pax 0.1 sparse member: `size` bytes, `data` at the places `regions` gives."""
    return Entry(name, data=data, pax={"GNU.sparse.map": regions, "GNU.sparse.size": str(size)})


def _on_disk(root: Path) -> int:
    """The bytes the files and directories under `root` take (their blocks)."""
    return sum(p.lstat().st_blocks * 512 for p in root.rglob("*"))


def test_sparse_members_count_what_they_write(tmp_path: Path) -> None:
    """Finding 4: four 48 MiB sparse members in a 708-byte layout passed a 64 MiB limit (the
    meter counted the stream, which a hole does not advance) and wrote 192 MiB."""
    layer = layer_bytes([_sparse(f"f{i}", 48 << 20) for i in range(4)])
    with pytest.raises(TooLarge, match=r"limit of 64\.0 MiB") as refused:
        _unpack(tmp_path, layer, limit=SizeLimit(64 << 20))
    assert refused.value.unpacked == 96 << 20  # refused before the second was written
    assert _on_disk(tmp_path / "rootfs") <= 64 << 20


@pytest.mark.parametrize(
    "entry",
    [
        _sparse("neg", -(1 << 40)),  # recorded as the image's size: eviction never ran again
        _sparse("past", 10, "0,100"),
        _sparse("back", 20, "0,10,5,10"),
        _sparse("minus", 20, "-5,1"),
    ],
    ids=["negative-size", "past-its-size", "overlapping", "negative-offset"],
)
def test_an_impossible_size_or_sparse_map_is_refused(tmp_path: Path, entry: Entry) -> None:
    with pytest.raises(UnpackError, match=f"layer member '{entry.name}' has"):
        _unpack(tmp_path, layer_bytes([entry]))


def test_every_entry_costs_a_block_at_least(tmp_path: Path) -> None:
    """Finding 8: 20 000 empty directories cost 8 times on disk what the limit counted (their
    512-byte headers), and the image's size was recorded as 0."""
    layer = layer_bytes([Entry(f"d{i}", "dir", mode=0o755) for i in range(600)])
    assert len(layer) < 1 << 20
    with pytest.raises(TooLarge, match=r"limit of 1\.0 MiB"):
        _unpack(tmp_path, layer, limit=SizeLimit(1 << 20))


def test_the_recorded_size_is_what_the_image_takes_on_disk(tmp_path: Path) -> None:
    """Each file in whole blocks, each directory, link and fifo a block (hard links too: a
    directory entry); implicit parents count."""
    entries = [
        Entry("big", data=b"x" * 5000),
        Entry("empty"),
        Entry("d", "dir"),
        Entry("l", "symlink", target="big"),
        Entry("h", "link", target="big"),
        Entry("p", "fifo"),
        Entry("implicit/f", data=b"x"),
        _sparse("sparse", 9000, "8000,1000", b"y" * 1000),
    ]
    unpacked = _unpack(tmp_path, layer_bytes(entries))
    assert unpacked.size == 8192 + 5 * 4096 + 2 * 4096 + 12288
    assert unpacked.size >= _on_disk(tmp_path / "rootfs")
    assert (tmp_path / "rootfs" / "sparse").read_bytes() == bytes(8000) + b"y" * 1000


def test_device_nodes_are_skipped_up_to_a_number(tmp_path: Path) -> None:
    """Each name is kept (image.json, the log): a layer of millions would be read at every
    `images()`."""
    assert len(_unpack(tmp_path, layer_bytes([Entry("dev/n", "chardev")] * 3)).skipped) == 3
    with pytest.raises(UnpackError, match="is past 1024 device nodes"):
        _unpack(tmp_path / "many", layer_bytes([Entry(f"n{i}", "chardev") for i in range(1025)]))


def _lines_run(tmp_path: Path, layer: bytes) -> int:
    """How many lines of the unpacker's module run to unpack `layer` (a count of the work
    done in Python, as a clock would not be: the same on every machine and load)."""
    write_dir_layout(tmp_path / "layout", Image([layer]))
    module = unpack_module.__file__
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if frame.f_code.co_filename != module:
            return None
        count += event == "line"
        return tracer

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        unpack(tmp_path / "layout", tmp_path / "rootfs")
    finally:
        sys.settrace(before)
    return count


def _replaced(n: int) -> bytes:
    return layer_bytes([*(Entry(f"d{i}", "dir") for i in range(n)), *[Entry("f")] * n])


def _opaque_again(n: int) -> bytes:
    return layer_bytes([*(Entry(f"d/f{i}") for i in range(n)), *[Entry("d/.wh..wh..opq")] * n])


@pytest.mark.parametrize("layer", [_replaced, _opaque_again], ids=["replaced", "opaque-again"])
def test_the_work_per_member_does_not_grow_with_the_members_before_it(
    tmp_path: Path, layer: Any
) -> None:
    """Finding 5: N directories then a file replaced N times rebuilt the table of directories
    at each replacement; an opaque marker repeated N times listed its directory each time: a
    200 KB layer took 100 s, and 6 minutes. Four times the members, four times the work."""
    small, large = (_lines_run(tmp_path / str(n), layer(n)) for n in (150, 600))
    assert large < 6 * small, (small, large)


@pytest.mark.parametrize("alternate", [False, True], ids=["one-chain", "two-chains"])
def test_deep_members_are_not_walked_to_from_the_root_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alternate: bool
) -> None:
    """Finding 10: every directory was opened again from the root to set its metadata, and a
    member's parent whenever it was not the last one: 2 ms a member 500 deep."""
    deep = ["/".join([top] * 100) for top in ("a", "b")]
    entries = [Entry(f"{deep[i % 2 if alternate else 0]}/x{i}", "dir") for i in range(100)]
    opened = 0
    real = os.open

    def counting(*args: Any, **kwargs: Any) -> int:
        nonlocal opened
        opened += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    _unpack(tmp_path, layer_bytes(entries))
    assert opened < 4 * (len(entries) + 2 * 100), opened


def test_an_unpack_has_a_deadline(tmp_path: Path) -> None:
    """Past it, refused: an unpack holds the lock of its reference (every create of that image
    waits for it)."""
    with pytest.raises(UnpackError, match="not unpacked within 0 s"):
        _unpack(tmp_path, FILE, timeout=0)
