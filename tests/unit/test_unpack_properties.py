"""The unpacker cannot leave its root, whatever the layers say (issue 37), checked with
hypothesis (bounded and derandomized: see tests/properties.py).

Each example unpacks generated layers (directories, files, links absolute and relative, hard
links, fifos, device nodes, whiteouts, opaque markers, a directory replaced by a link and back,
within a layer and across layers, sparse files whose maps and sizes may lie, headers no file
system takes) into `world/rootfs`, beside a decoy tree `world/decoy` that holds the same names,
with an image size limit of 2 MiB. Links point at the decoy (absolute, and relative with enough
`..`), at the container's own paths and at each other. Nothing outside the root may change: the
decoy's contents, modes, owners and times, and no entry appears beside the root. An image may
be refused, with `UnpackError` only; one unpacked takes on disk no more than its recorded size,
which is within the limit.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from osb_sync.local.host.images.unpack import (
    SizeLimit,
    UnpackError,
    in_range,
    server_owned,
    unpack,
)
from tests.imagekit import Entry, Image, layer_bytes, snapshot, write_dir_layout
from tests.properties import bounded

NAMES = ("a", "b", "a/b", "a/c", "b/a", "a/b/c")
DECOY = "{decoy}"  # the decoy's absolute path, filled in per example
TARGETS = (
    DECOY,
    f"{DECOY}/a",
    f"{DECOY}/a/b",
    "../decoy",
    "../../decoy",
    "../../../decoy/a",
    "..",
    "../..",
    "/a",
    "/b/a",
    "a",
    "b",
    ".",
)
OUT = (DECOY, f"{DECOY}/a", "../decoy", "../../decoy")
DIR_MODES = (0o755, 0o777, 0o700, 0o1777, 0o555)
FILE_MODES = (0o644, 0o4755, 0o600)


def _whiteout(name: str) -> Entry:
    folder, _, base = name.rpartition("/")
    return Entry(f"{folder}/.wh.{base}" if folder else f".wh.{base}")


def _opaque(folder: str) -> Entry:
    return Entry(f"{folder}/.wh..wh..opq" if folder else ".wh..wh..opq")


names = st.sampled_from(NAMES)
entries = st.one_of(
    st.builds(lambda n, m: Entry(n, "dir", mode=m), names, st.sampled_from(DIR_MODES)),
    st.builds(
        lambda n, d, m: Entry(n, data=d, mode=m),
        names,
        st.sampled_from([b"", b"image's"]),
        st.sampled_from(FILE_MODES),
    ),
    st.builds(lambda n, t: Entry(n, "symlink", target=t), names, st.sampled_from(TARGETS)),
    st.builds(
        lambda n, t: Entry(n, "link", target=t),
        names,
        st.sampled_from([*NAMES, f"{DECOY}/c", "../decoy/c"]),
    ),
    names.map(lambda n: Entry(n, "fifo")),
    names.map(lambda n: Entry(n, "chardev")),
    names.map(_whiteout),
    st.sampled_from(["", "a", "b", "a/b"]).map(_opaque),
    st.builds(  # sparse: `size` bytes, the data's places in it (pax 0.1), maybe lying
        lambda n, size, regions: Entry(
            n,
            data=b"d" * sum(int(r.split(",")[1]) for r in regions if r),
            pax={
                "GNU.sparse.map": ",".join(r for r in regions if r) or "0,0",
                "GNU.sparse.size": size,
            },
        ),
        names,
        st.sampled_from(["0", "4096", "9000", str(8 << 20), "-1", "x"]),
        st.lists(st.sampled_from(["", "0,10", "100,50", "8000,1000", "5,-1", "-5,1"]), max_size=2),
    ),
    st.builds(
        lambda n, pax: Entry(n, data=b"x", pax=pax),
        names,
        st.sampled_from([{"mtime": "1e300"}, {"mtime": "nan"}, {"path": "a\0b"}, {"size": "-1"}]),
    ),
)
# Besides single entries, the moves that matter: a directory with one inside it (made, or
# made again after a swap), and a directory swapped for a link.
tops = st.sampled_from(["a", "b", "a/b"])
trees = st.builds(
    lambda top, child, mode, inner: [
        Entry(top, "dir", mode=mode),
        Entry(f"{top}/{child}", "dir", mode=inner),
    ],
    tops,
    st.sampled_from(["b", "c", "t1"]),
    st.sampled_from(DIR_MODES),
    st.sampled_from(DIR_MODES),
)
# (to the decoy: a link elsewhere is one of the single entries)
swaps = st.builds(lambda top, t: [Entry(top, "symlink", target=t)], tops, st.sampled_from(OUT))
moves = st.one_of(entries.map(lambda e: [e]), trees, swaps)
layers = st.lists(
    st.lists(moves, min_size=1, max_size=6).map(lambda ms: [e for m in ms for e in m]),
    min_size=1,
    max_size=3,
)


def _world(top: Path) -> Path:
    """`top/decoy`: the generated names as host files and directories (0700/0600, 2001)."""
    decoy = top / "decoy"
    for name in ("a/b", "b", "t1"):
        (decoy / name).mkdir(parents=True)
    for name in ("a/b/c", "a/c", "b/a", "c"):
        (decoy / name).write_bytes(b"host's")
    for folder, dirs, files in os.walk(decoy, topdown=False):
        for name in dirs + files:
            path = os.path.join(folder, name)
            os.chmod(path, 0o700 if name in dirs else 0o600)
            os.utime(path, (1_000_000_000, 1_000_000_000))
    os.utime(decoy, (1_000_000_000, 1_000_000_000))
    return decoy


@bounded(200)
@given(layers)
def test_nothing_outside_the_root_changes(generated: list[list[Entry]]) -> None:
    owner = in_range(100000, 100000, 65536) if os.geteuid() == 0 else server_owned
    with tempfile.TemporaryDirectory() as scratch:
        world = Path(scratch) / "world"
        decoy = _world(world)
        filled = [
            [replace(e, target=e.target.replace(DECOY, str(decoy))) for e in layer]
            for layer in generated
        ]
        write_dir_layout(Path(scratch) / "layout", Image([layer_bytes(e) for e in filled]))
        before = snapshot(world, skip=["rootfs"])
        try:
            unpacked = unpack(Path(scratch) / "layout", world / "rootfs", owner, SizeLimit(2 << 20))
        except UnpackError:
            unpacked = None  # refused: allowed, as long as nothing outside changed
        assert snapshot(world, skip=["rootfs"]) == before
        assert sorted(os.listdir(world)) == ["decoy", "rootfs"]
        if unpacked is not None:
            on_disk = sum(p.lstat().st_blocks * 512 for p in (world / "rootfs").rglob("*"))
            assert on_disk <= unpacked.size <= 2 << 20
