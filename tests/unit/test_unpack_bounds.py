"""What a hostile layer may cost the server that unpacks it: memory, disk and inodes, CPU time
(issue 37, after the attack: findings 4 to 8, 10 and 13). Each test is a layer of the attack,
small; figures are in benchmarks/README.md, not here.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest

from osb_sync.local.host.images.unpack import UnpackError, unpack
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
