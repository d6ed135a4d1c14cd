"""An image's layers, from a `dir:` layout (`pull.py`), into one root directory it cannot leave.

Every blob is checked: the manifest's descriptors give each compressed blob's sha256 and the
config's `rootfs.diff_ids` each uncompressed layer's; a mismatch refuses the image.

A layer is a tar stream applied in order (gzip or plain; zstd is refused with what to do).

Nothing is done by path. The root is opened once; every member is made under the descriptor
of its parent directory, reached one component at a time with `O_NOFOLLOW | O_DIRECTORY`
(`_Writer._dir`), so a link or a file on the way is never followed, whatever an earlier member
or layer made of that path. The member is made by name in that descriptor (`mkdirat`, `openat`
with `O_EXCL | O_NOFOLLOW`, `symlinkat`, `linkat`, `mkfifoat`), a file's owner, mode and times
are set through its own descriptor, a link's or a fifo's by name in its parent's without
following it. Directories get theirs last, each once all is in it (a read-only one would refuse
what comes into it), in one walk down the tree by descriptor (`finish`); removals (whiteouts,
a member that replaces another) go down the tree by descriptor too (`_remove_tree`;
`shutil.rmtree(dir_fd=)` is Python 3.11's). A walk, not `openat2(RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS)` through ctypes: the walk would be needed anyway where openat2 is missing
(kernels before 5.6, seccomp profiles that refuse it), so it is the one path to test. It is
cheap: the descriptors of the `DIR_CACHE` directories used last are kept (a layer's members
come grouped by directory), and a walk starts at the deepest of them above the member, so an
unpack is O(members x depth) at worst (a layer made to miss them, `MAX_DEPTH` opens a member)
and O(members) for real ones; whiteouts and opaque markers do not grow with what came before
them. `UNPACK_TIMEOUT` bounds an unpack whatever its layers: it holds its reference's lock.

What is refused (`UnpackError`, the member named), since it could reach outside the root or
the host: an absolute or `..` member name, or one deeper than `MAX_DEPTH`; a member whose parent
is a symbolic link (writing through a link, wherever it points: real layers never need it, the
kernel writes what the overlay below saw); a hard link whose target is absolute, has `..`, or
is not a file of the root; a whiteout of `.` or `..`; a NUL byte in a name or link, a time past
`MTIME_LIMIT`, a header tarfile cannot read (typed: never tarfile's ValueError). Character and
block devices are skipped (`Unpacked.skipped`), as rootless Podman skips them: bwrap gives every
sandbox its own `/dev`.
Symbolic links are kept as they are (an absolute target is the container's, resolved inside
its root; the host never follows them here). Whiteouts (`.wh.NAME`) delete NAME of the layers
below, an opaque marker (`.wh..wh..opq`) everything its directory had below; entries of the
same layer are kept. Set-user and set-group bits are dropped (the files are the server's, see
`server_owned`); xattrs are not applied.

What an image may cost (`SizeLimit`): at most `total` bytes, the larger of its layers'
uncompressed bytes (their tar streams, headers included), counted as they are read, and what its
entries take on disk, counted before each is made: every entry a `BLOCK` at least (an inode, a
directory's block: that is also a cap on inodes, `total / BLOCK`), a file its size in whole
blocks, a sparse one its whole size (it is written whole). And past `floor` bytes, at most
`ratio` bytes per compressed byte read (a decompression bomb; below the floor any ratio goes: a
layer of zeros compresses 1000:1). A refusal is `TooLarge`, naming the limit and both sizes; the
caller removes the partial root (`store.py` does). A negative size, a sparse map that leaves its
file and more than `DEVICE_NODES` device nodes are refused too. The server's memory does not
grow with a layer's size: tarfile reads a member's headers (pax, GNU long names, a sparse map)
whole, so they may take `HEADER_LIMIT` bytes of the stream; the members it keeps are dropped as
they are applied.

Who owns what is one function (`OwnerMap`): the image's uid and gid to the host's, or None to
leave files to the server. Until sandboxes get a user namespace over a range of host ids, the
store uses `server_owned` (every file the server's; a sandbox sees them as its root's).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import shutil
import stat
import tarfile
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

OwnerMap = Callable[[int, int], "tuple[int, int] | None"]
CHUNK = 1 << 20
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_DEPTH = 128  # components of a name (a descriptor each while a tree is removed; real: 15)
DIR_CACHE = 64  # directory descriptors an unpack keeps open
UNPACK_TIMEOUT = 900.0  # seconds an unpack may take (as a download: `pull.PULL_TIMEOUT`)
RATIO = 100  # unpacked bytes per compressed byte, past RATIO_FLOOR
RATIO_FLOOR = 1 << 30
# Bytes of the stream tarfile may read for one member's headers (tar, pax, GNU long names, a
# sparse map): it reads each whole, and CPython before 3.10.15, 3.11.10 and 3.12.6 parses a pax
# header in time quadratic in its size (CVE-2024-6232; 32 KiB: about 1 s there). Real headers
# take under 9 KiB (two PATH_MAX names); Go's reader allows 1 MiB.
HEADER_LIMIT = 32 << 10
BLOCK = 4096  # a file system's block: what an entry costs at least (`entry_cost`)
DEVICE_NODES = 1024  # skipped and listed; a root file system has a few dozen
MTIME_LIMIT = 1 << 40  # seconds either side of 1970 (the year 36812)
GLOBAL_KEYS = 64  # records of pax global headers, which tarfile copies into every member
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnpackError(Exception):
    """An image refused: a digest mismatch, or a layer member named in the message."""


class TooLarge(UnpackError):
    """An image past its `SizeLimit`: `limit`, and the bytes `unpacked` so far from `packed`."""

    def __init__(self, message: str, limit: int, unpacked: int, packed: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.unpacked = unpacked
        self.packed = packed


def size_text(size: int) -> str:
    """`4.0 MiB (4194304 bytes)`: a size as a person reads it, and exactly."""
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit} ({size} bytes)"
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class SizeLimit:
    """What an image may cost unpacked (see the module docstring).

    Attributes:
        total: bytes of all its layers, uncompressed (tar streams) and on disk.
        ratio: past `floor` uncompressed bytes, at most this many per compressed byte.
        floor: uncompressed bytes below which any ratio goes.
    """

    total: int
    ratio: int = RATIO
    floor: int = RATIO_FLOOR

    def check(self, unpacked: int, packed: int) -> None:
        """Refuse `unpacked` bytes from `packed` compressed ones past the limit.

        Raises:
            TooLarge: naming the limit and both sizes.
        """
        sizes = f"at least {size_text(unpacked)}, from {size_text(packed)} compressed"
        if unpacked > self.total:
            raise TooLarge(
                f"the image unpacks past the image size limit of {size_text(self.total)}: {sizes}",
                self.total,
                unpacked,
                packed,
            )
        if unpacked > self.floor and unpacked > self.ratio * packed:
            raise TooLarge(
                f"the image unpacks to more than {self.ratio} times its compressed size past"
                f" {size_text(self.floor)} (a decompression bomb): {sizes}",
                self.ratio * packed,
                unpacked,
                packed,
            )


def server_owned(uid: int, gid: int) -> tuple[int, int] | None:
    """Leave every file to the server (no sandbox id range yet); see the module docstring."""
    return None


def in_range(uid: int, gid: int, count: int) -> OwnerMap:
    """Owners in the sandboxes' id range: the image's id N is the range's N (`identity`).

    An id past the range is left to the server (the sandbox sees it as nobody).
    """

    def owner(image_uid: int, image_gid: int) -> tuple[int, int] | None:
        if 0 <= image_uid < count and 0 <= image_gid < count:
            return uid + image_uid, gid + image_gid
        return None

    return owner


@dataclass(frozen=True)
class Unpacked:
    """What an unpack gives: the image's config (the whole blob), the bytes it takes on disk
    (what it was charged: see the module docstring), and the device nodes skipped (their names
    in the image)."""

    config: dict[str, Any]
    size: int
    skipped: tuple[str, ...] = ()


class _Meter:
    """What an unpack has read, compressed and not, and what it has made (`cost`: the bytes
    its entries take on disk, see `entry_cost`), held to its `SizeLimit`."""

    def __init__(self, limit: SizeLimit | None) -> None:
        self.limit = limit
        self.packed = 0
        self.read = 0
        self.cost = 0

    @property
    def unpacked(self) -> int:
        """The larger of what was read and what was made."""
        return max(self.read, self.cost)

    def read_packed(self, size: int) -> None:
        self.packed += size

    def read_unpacked(self, size: int) -> None:
        self.read += size
        self.check()

    def charge(self, cost: int) -> None:
        """Count `cost` bytes made, refusing (TooLarge) before they are made past the limit."""
        self.cost += cost
        self.check()

    def check(self) -> None:
        if self.limit is not None:
            self.limit.check(self.unpacked, self.packed)


def entry_cost(size: int = 0) -> int:
    """What an entry of `size` bytes takes on disk, at most: its size in whole `BLOCK`s, and a
    block at least (an empty file, a link or a directory: an inode, a directory's block)."""
    return max(BLOCK, -(-size // BLOCK) * BLOCK)


class _Hashing:
    """A reader that hashes what goes through it and tells `count` how much; while `window`
    is set, it refuses to give more than that many bytes (`_members`)."""

    def __init__(self, raw: IO[bytes], count: Callable[[int], None]) -> None:
        self.raw = raw
        self.count = count
        self.sha = hashlib.sha256()
        self.window: int | None = None

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.sha.update(data)
        self.count(len(data))
        if self.window is not None:
            self.window -= len(data)
            if self.window < 0:
                raise UnpackError(
                    f"a layer member's headers take more than {size_text(HEADER_LIMIT)} of"
                    " its stream (pax or GNU long-name headers, or a sparse map)"
                )
        return data

    def drain(self) -> str:
        while self.read(CHUNK):
            pass
        return "sha256:" + self.sha.hexdigest()


def _blob_path(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    if (
        algorithm != "sha256"
        or len(hexdigest) != 64
        or not all(c in "0123456789abcdef" for c in hexdigest)
    ):
        raise UnpackError(f"unsupported digest {digest!r}")
    return layout / hexdigest


def _verified_bytes(layout: Path, digest: str) -> bytes:
    data = _blob_path(layout, digest).read_bytes()
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise UnpackError(f"blob {digest} does not match its digest")
    return data


def read_manifest(layout: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, config) of a `dir:` layout, the config checked against its digest.

    Raises:
        UnpackError: not an image manifest, or the config does not match.
    """
    try:
        manifest = json.loads((layout / "manifest.json").read_bytes())
        config = json.loads(_verified_bytes(layout, str(manifest["config"]["digest"])))
        diff_ids = config["rootfs"]["diff_ids"]
        layers = manifest["layers"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UnpackError(f"not an image manifest and config: {exc}") from None
    if not (
        isinstance(layers, list)
        and isinstance(diff_ids, list)
        and all(isinstance(d, dict) and isinstance(d.get("digest"), str) for d in layers)
        and all(isinstance(d, str) for d in diff_ids)
    ):
        raise UnpackError("the manifest's layers or the config's diff_ids are not lists of digests")
    if len(layers) != len(diff_ids):
        raise UnpackError(f"{len(layers)} layers but {len(diff_ids)} diff_ids")
    return manifest, config


def unpack(
    layout: Path,
    rootfs: Path,
    owner: OwnerMap = server_owned,
    limit: SizeLimit | None = None,
    timeout: float = UNPACK_TIMEOUT,
) -> Unpacked:
    """Apply every layer of the image in `layout` to the new directory `rootfs`.

    Args:
        layout: a `dir:` layout (manifest.json, blobs named by their hex digest).
        rootfs: a directory to make (its parent exists).
        owner: the image's (uid, gid) to the host's, or None to leave them the server's.
        limit: what the image may cost unpacked (None: no limit).
        timeout: seconds it may take.

    Raises:
        UnpackError: a digest mismatch or a refused member (see the module docstring);
            TooLarge past `limit`; past `timeout` too. What was unpacked is left: the caller
            removes `rootfs`.
        OSError: the disk said no.
    """
    manifest, config = read_manifest(layout)
    rootfs.mkdir(mode=0o755)
    meter = _Meter(limit)
    writer = _Writer(os.open(rootfs, _DIR), owner, meter, timeout)
    try:
        pairs = zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True)  # checked
        for descriptor, diff_id in pairs:
            _apply_layer(layout, descriptor["digest"], diff_id, writer, meter)
        writer.finish()
    finally:
        writer.close()
    return Unpacked(config, meter.cost, tuple(writer.skipped))


def _apply_layer(layout: Path, digest: str, diff_id: str, writer: _Writer, meter: _Meter) -> None:
    with _blob_path(layout, digest).open("rb") as raw:
        packed = _Hashing(raw, meter.read_packed)
        magic = raw.read(4)
        raw.seek(0)
        if magic.startswith(ZSTD_MAGIC):
            raise UnpackError(
                f"layer {digest} is zstd-compressed, which this server cannot read; push"
                " the image with gzip layers (skopeo copy --dest-compress-format gzip)"
            )
        stream: Any = packed
        if magic.startswith(GZIP_MAGIC):
            stream = gzip.GzipFile(fileobj=cast(IO[bytes], packed), mode="rb")
        plain = _Hashing(stream, meter.read_unpacked)
        try:
            with _headers(plain):  # tarfile.open reads the first member
                tar = tarfile.open(fileobj=plain, mode="r|")  # type: ignore[call-overload]
            with tar:
                writer.apply(tar, _members(tar, plain))
        except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise UnpackError(f"layer {digest} is not a tar stream: {exc}") from None
        if plain.drain() != diff_id:
            raise UnpackError(f"layer {digest} does not match its diff_id {diff_id}")
        if packed.drain() != digest:
            raise UnpackError(f"layer {digest} does not match its digest")


@contextmanager
def _headers(plain: _Hashing) -> Iterator[None]:
    """While tarfile reads a member's headers: at most `HEADER_LIMIT` bytes of `plain`, and
    its errors of a number it reads (a pax or sparse field) are the member's."""
    plain.window = HEADER_LIMIT
    try:
        yield
    except ValueError as exc:
        raise UnpackError(f"a layer member's header is malformed: {exc}") from None
    finally:
        plain.window = None


def _members(tar: tarfile.TarFile, plain: _Hashing) -> Iterator[tarfile.TarInfo]:
    """The members of a layer read in stream mode, each once, none kept.

    tarfile reads a member's headers whole (`_headers` bounds them), keeps every member it
    read in `members` (cleared here: a layer's millions of members would stay in memory), and
    copies its pax global records into each member (a few are allowed).
    """
    while True:
        with _headers(plain):
            member = tar.next()
        cast(Any, tar).members.clear()  # (not in typeshed; an attribute of every CPython's)
        if member is None:
            return
        if len(tar.pax_headers) > GLOBAL_KEYS:
            raise UnpackError(f"a layer has more than {GLOBAL_KEYS} pax global records")
        yield member


class _Dir:
    """A directory the unpack made (or a member named): its metadata, set last, and the
    directories in it."""

    __slots__ = ("kids", "meta")

    def __init__(self, meta: tuple[int, float, int, int] | None = None) -> None:
        self.meta = meta  # mode, mtime, uid, gid; None: not the image's to set
        self.kids: dict[str, _Dir] = {}


IMPLICIT = (0o755, 0.0, 0, 0)  # a parent no member names, as Docker makes it


class _Writer:
    """Applies tar members under the root's descriptor `root` (see the module docstring).

    What it keeps costs O(depth) per member at most: the directories it made (a tree of
    `_Dir`, so that a removal drops what it took at once, whatever was below), and the
    descriptors of the `DIR_CACHE` directories used last (a member's parent is usually one of
    them; else the walk starts at its deepest ancestor kept open).
    """

    def __init__(self, root: int, owner: OwnerMap, meter: _Meter, timeout: float) -> None:
        self.root = root
        self.owner = owner
        self.meter = meter
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.skipped: list[str] = []
        self._tree = _Dir()
        self._open: OrderedDict[str, tuple[int, _Dir]] = OrderedDict()  # least recent first
        self._this_layer: set[str] = set()
        self._opaque_done: set[str] = set()

    def close(self) -> None:
        """Close the descriptors (the root's too)."""
        self._close_below("")
        os.close(self.root)

    def apply(self, tar: tarfile.TarFile, members: Iterable[tarfile.TarInfo]) -> None:
        """Apply one layer's `members` (`_members` of `tar`).

        Raises:
            UnpackError: a refused member, or the deadline passed.
            OSError: the disk said no (the member named: by descriptor, the kernel's error
                names only the last component).
        """
        self._this_layer, self._opaque_done = set(), set()
        for member in members:
            if time.monotonic() > self.deadline:
                raise UnpackError(
                    f"the image was not unpacked within {self.timeout:.0f} s (at layer member"
                    f" {member.name!r}): more members, or a slower disk, than an unpack may take"
                )
            try:
                self._apply(tar, member)
            except OSError as exc:
                raise OSError(exc.errno, f"{exc.strerror}: layer member {member.name!r}") from None

    def _apply(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        _check_fields(member)
        parts = _parts(member.name)
        if not parts:
            if member.isdir():
                self._tree.meta = (member.mode, member.mtime, member.uid, member.gid)
            return
        self._parent(parts, member.name)  # every parent a directory of the root, made
        base = parts[-1]
        if base == OPAQUE:
            self._opaque(parts[:-1])
        elif base.startswith(WHITEOUT):
            hidden = base[len(WHITEOUT) :]
            if hidden in ("", ".", ".."):
                raise UnpackError(f"whiteout {member.name!r} names {hidden!r}")
            if "/".join([*parts[:-1], hidden]) not in self._this_layer:
                self._remove([*parts[:-1], hidden])
        else:
            self._member(tar, member, parts)

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parts: list[str]) -> None:
        rel, base = "/".join(parts), parts[-1]
        if member.ischr() or member.isblk():
            if len(self.skipped) >= DEVICE_NODES:
                raise UnpackError(
                    f"layer member {member.name!r} is past {DEVICE_NODES} device nodes"
                )
            self.skipped.append(rel)  # bwrap makes each sandbox's /dev
            return
        if member.isdir():
            if not stat.S_ISDIR(_mode_at(self._parent(parts, member.name)[0], base)):
                self._remove(parts)
                self.meter.charge(entry_cost())
                os.mkdir(base, 0o700, dir_fd=self._parent(parts, member.name)[0])
            node = self._parent(parts, member.name)[1].kids.setdefault(base, _Dir())
            node.meta = (member.mode, member.mtime, member.uid, member.gid)
        else:
            self._remove(parts)
            self.meter.charge(entry_cost(member.size if _is_file(member) else 0))
            if member.islnk():
                self._link(member, parts)
            elif member.issym() or member.isfifo():
                parent = self._parent(parts, member.name)[0]
                if member.issym():
                    os.symlink(member.linkname, base, dir_fd=parent)
                else:
                    os.mkfifo(base, 0o600, dir_fd=parent)
                mapped = self.owner(member.uid, member.gid)
                if mapped is not None:
                    os.chown(base, *mapped, dir_fd=parent, follow_symlinks=False)
                times = (member.mtime, member.mtime)
                os.utime(base, times, dir_fd=parent, follow_symlinks=False)
            else:
                self._file(tar, member, parts)
        self._this_layer.add(rel)

    def _file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parts: list[str]) -> None:
        source = tar.extractfile(member)
        fd = os.open(parts[-1], _NEW_FILE, 0o600, dir_fd=self._parent(parts, member.name)[0])
        with os.fdopen(fd, "wb") as out:
            if source is not None:
                shutil.copyfileobj(source, out, CHUNK)
            out.flush()
            mapped = self.owner(member.uid, member.gid)
            if mapped is not None:
                os.fchown(fd, *mapped)
            os.fchmod(fd, member.mode & 0o1777)
            os.utime(fd, (member.mtime, member.mtime))

    def _link(self, member: tarfile.TarInfo, parts: list[str]) -> None:
        """A hard link to a file (or link) of the root, each end under its parent's descriptor."""
        if member.linkname.startswith("/"):
            raise UnpackError(f"hard link {member.name!r} names the absolute {member.linkname!r}")
        source = _parts(member.linkname)
        if not source:
            raise UnpackError(f"hard link {member.name!r} names the root")
        try:  # (a copy: the next `_parent` may close the writer's)
            folder = os.dup(self._parent(source, member.name, make=False)[0])
        except FileNotFoundError:
            raise UnpackError(f"hard link {member.name!r} names a missing file") from None
        try:
            mode = _mode_at(folder, source[-1])
            if not mode:
                raise UnpackError(f"hard link {member.name!r} names a missing file")
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                raise UnpackError(f"hard link {member.name!r} names no file")
            os.link(
                source[-1],
                parts[-1],
                src_dir_fd=folder,
                dst_dir_fd=self._parent(parts, member.name)[0],
                follow_symlinks=False,
            )
        finally:
            os.close(folder)

    def _parent(self, parts: Sequence[str], name: str, make: bool = True) -> tuple[int, _Dir]:
        """The directory holding `parts` (`_dir`)."""
        return self._dir(parts[:-1], name, make)

    def _dir(self, parts: Sequence[str], name: str, make: bool) -> tuple[int, _Dir]:
        """The descriptor of the directory `parts` (the writer's: valid until the next call)
        and its `_Dir`. Unless it is open, it is walked to from its deepest ancestor open (or
        the root), each component opened under the one before it without following a link;
        a missing one made (0755) when `make`.

        Raises:
            UnpackError: a component is a link or no directory (`name` is the member's).
            FileNotFoundError: a component is missing and not `make`.
        """
        if not parts:
            return self.root, self._tree
        key = "/".join(parts)
        kept = self._open.get(key)
        if kept is not None:
            self._open.move_to_end(key)
            return kept
        if len(parts) >= MAX_DEPTH:
            raise UnpackError(f"layer member {name!r} is past {MAX_DEPTH} directories deep")
        fd, node, start, cut = self.root, self._tree, 0, len(key)
        while (cut := key.rfind("/", 0, cut)) > 0:
            kept = self._open.get(key[:cut])
            if kept is not None:
                (fd, node), start = kept, key.count("/", 0, cut) + 1
                break
        walked = False  # whether `fd` is the walk's own (else the root's or a kept one)
        try:
            for depth in range(start, len(parts)):
                part = parts[depth]
                try:
                    inner = os.open(part, _DIR, dir_fd=fd)
                    node = node.kids.get(part) or node.kids.setdefault(part, _Dir())
                except FileNotFoundError:
                    if not make:
                        raise
                    self.meter.charge(entry_cost())
                    os.mkdir(part, 0o755, dir_fd=fd)
                    inner = os.open(part, _DIR, dir_fd=fd)
                    made = node.kids[part] = _Dir(IMPLICIT)
                    node = made
                except NotADirectoryError:
                    rel = "/".join(parts[: depth + 1])
                    if stat.S_ISLNK(_mode_at(fd, part)):
                        raise UnpackError(
                            f"layer member {name!r} would be written through the link {rel}"
                        ) from None
                    raise UnpackError(
                        f"layer member {name!r} is under {rel}, which is no directory"
                    ) from None
                if walked:
                    os.close(fd)
                fd, walked = inner, True
        except BaseException:
            if walked:
                os.close(fd)
            raise
        self._open[key] = (fd, node)
        if len(self._open) > DIR_CACHE:
            os.close(self._open.popitem(last=False)[1][0])
        return fd, node

    def _close_below(self, rel: str) -> None:
        """Close the descriptors kept of `rel` and what is below it ("": all)."""
        for key in [k for k in self._open if not rel or k == rel or k.startswith(rel + "/")]:
            os.close(self._open.pop(key)[0])

    def _opaque(self, parts: list[str]) -> None:
        rel = "/".join(parts)
        if rel in self._opaque_done:
            return  # it holds this layer's entries only
        self._opaque_done.add(rel)
        children = os.listdir(self._dir(parts, OPAQUE, make=False)[0])
        prefix = rel + "/" if parts else ""
        for child in children:
            if prefix + child not in self._this_layer:
                self._remove([*parts, child])

    def _remove(self, parts: list[str]) -> None:
        """Remove what `parts` names, if anything (a directory with all below it)."""
        rel = "/".join(parts)
        parent, node = self._parent(parts, rel)
        mode = _mode_at(parent, parts[-1])
        if not mode:
            return
        if stat.S_ISDIR(mode):
            self._close_below(rel)
            _remove_tree(parent, parts[-1])
        else:
            os.unlink(parts[-1], dir_fd=parent)
        node.kids.pop(parts[-1], None)

    def finish(self) -> None:
        """Set the directories' owners, modes and times, each once all is in it (those below it
        first), through its own descriptor, in one walk down the tree from the root (one that
        is no directory of the root any more is left)."""
        self._close_below("")
        self._settle(self.root, self._tree)
        self._set(self.root, self._tree.meta or IMPLICIT)  # the root is the image's root's

    def _settle(self, fd: int, node: _Dir) -> None:
        for name, kid in node.kids.items():
            try:
                inner = os.open(name, _DIR, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                continue
            try:
                self._settle(inner, kid)
                if kid.meta is not None:
                    self._set(inner, kid.meta)
            finally:
                os.close(inner)

    def _set(self, fd: int, meta: tuple[int, float, int, int]) -> None:
        mode, mtime, uid, gid = meta
        mapped = self.owner(uid, gid)
        if mapped is not None:
            os.fchown(fd, *mapped)
        os.fchmod(fd, mode & 0o1777)
        if mtime:
            os.utime(fd, (mtime, mtime))


def _check_fields(member: tarfile.TarInfo) -> None:
    """Refuse what no file system takes from a member's header: a NUL in its name or link, a
    time no file can have."""
    if "\0" in member.name or "\0" in member.linkname:
        raise UnpackError(f"layer member {member.name!r} has a NUL byte in its name or link")
    if not math.isfinite(member.mtime) or abs(member.mtime) >= MTIME_LIMIT:
        raise UnpackError(f"layer member {member.name!r} has the time {member.mtime!r}")
    if member.size < 0:
        raise UnpackError(f"layer member {member.name!r} has the size {member.size}")
    regions = cast("list[tuple[int, int]]", member.sparse or [])  # (typeshed says bytes)
    end = 0
    for offset, length in regions:  # where its data goes in the file, holes between
        if offset < end or length < 0 or offset + length > member.size:
            raise UnpackError(
                f"layer member {member.name!r} has a sparse map that leaves its size"
                f" {member.size} or goes back: {regions[:8]!r}"
            )
        end = offset + length


def _is_file(member: tarfile.TarInfo) -> bool:
    """Whether `_Writer` writes the member's data as a file (of a type tarfile does not know
    too: tarfile gives their data, as GNU tar extracts them)."""
    return not (member.isdir() or member.issym() or member.islnk() or member.isdev())


def _parts(name: str) -> list[str]:
    """A member name's components; absolute and `..` names refused."""
    if name.startswith("/"):
        raise UnpackError(f"layer member {name!r} has an absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnpackError(f"layer member {name!r} has a '..' component")
    return parts


def _mode_at(folder: int, name: str) -> int:
    """The mode of `name` in the directory `folder` (a link's own), 0 when there is none."""
    try:
        return os.lstat(name, dir_fd=folder).st_mode
    except FileNotFoundError:
        return 0


def _remove_tree(folder: int, name: str) -> None:
    """Remove the directory `name` of `folder` and all below it, each by descriptor.

    Only for trees of the unpack in progress: their directories are still the server's
    (0700 or 0755: modes come last, in `finish`).
    """
    fd = os.open(name, _DIR, dir_fd=folder)
    try:
        with os.scandir(fd) as found:
            entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in found]
        for child, is_dir in entries:
            if is_dir:
                _remove_tree(fd, child)
            else:
                os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=folder)
