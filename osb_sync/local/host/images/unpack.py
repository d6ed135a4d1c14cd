"""An image's layers, from a `dir:` layout (`pull.py`), into one root directory, carefully.

Every blob is checked: the manifest's descriptors give each compressed blob's sha256 and the
config's `rootfs.diff_ids` each uncompressed layer's; a mismatch refuses the image.

A layer is a tar stream applied in order (gzip or plain; zstd is refused with what to do).
What is refused (`UnpackError`, the member named), since it could reach outside the root or
the host: an absolute or `..` member name; a member whose parent is a symbolic link (writing
through a link, wherever it points: real layers never need it, the kernel writes what the
overlay below saw); a hard link whose target is absolute, has `..`, or is not a file of the
root; character and block devices. Symbolic links are kept as they are (an absolute target is
the container's, resolved inside its root; the host never follows them here). Whiteouts
(`.wh.NAME`) delete NAME of the layers below, an opaque marker (`.wh..wh..opq`) everything its
directory had below; entries of the same layer are kept. Set-user and set-group bits are
dropped (the files are the server's, see `server_owned`); xattrs are not applied.

Who owns what is one function (`OwnerMap`): the image's uid and gid to the host's, or None to
leave files to the server. Until sandboxes get a user namespace over a range of host ids, the
store uses `server_owned` (every file the server's; a sandbox sees them as its root's).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

OwnerMap = Callable[[int, int], "tuple[int, int] | None"]
CHUNK = 1 << 20
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class UnpackError(Exception):
    """An image refused: a digest mismatch, or a layer member named in the message."""


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
    """What an unpack gives: the image's config (the whole blob) and the bytes written."""

    config: dict[str, Any]
    size: int


class _Hashing:
    """A reader that hashes what goes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.sha.update(data)
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
        config = json.loads(_verified_bytes(layout, manifest["config"]["digest"]))
        diff_ids = config["rootfs"]["diff_ids"]
        layers = manifest["layers"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UnpackError(f"not an image manifest and config: {exc}") from None
    if not isinstance(layers, list) or not isinstance(diff_ids, list):
        raise UnpackError("the manifest's layers or the config's diff_ids are not lists")
    if len(layers) != len(diff_ids):
        raise UnpackError(f"{len(layers)} layers but {len(diff_ids)} diff_ids")
    return manifest, config


def unpack(layout: Path, rootfs: Path, owner: OwnerMap = server_owned) -> Unpacked:
    """Apply every layer of the image in `layout` to the new directory `rootfs`.

    Args:
        layout: a `dir:` layout (manifest.json, blobs named by their hex digest).
        rootfs: a directory to make (its parent exists).
        owner: the image's (uid, gid) to the host's, or None to leave them the server's.

    Raises:
        UnpackError: a digest mismatch or a refused member (see the module docstring).
        OSError: the disk said no.
    """
    manifest, config = read_manifest(layout)
    rootfs.mkdir(mode=0o755)
    writer = _Writer(rootfs, owner)
    pairs = zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True)  # lengths checked
    for descriptor, diff_id in pairs:
        digest = str(descriptor.get("digest", ""))
        with _blob_path(layout, digest).open("rb") as raw:
            packed = _Hashing(raw)
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
            plain = _Hashing(stream)
            try:
                with tarfile.open(fileobj=plain, mode="r|") as tar:  # type: ignore[call-overload]
                    writer.apply(tar)
            except (tarfile.TarError, EOFError, gzip.BadGzipFile) as exc:
                raise UnpackError(f"layer {digest} is not a tar stream: {exc}") from None
            if plain.drain() != diff_id:
                raise UnpackError(f"layer {digest} does not match its diff_id {diff_id}")
            if packed.drain() != digest:
                raise UnpackError(f"layer {digest} does not match its digest")
    writer.finish()
    return Unpacked(config, writer.size)


class _Writer:
    """Applies tar members under `root` (the rules are the module docstring's)."""

    def __init__(self, root: Path, owner: OwnerMap) -> None:
        self.root = root
        self.owner = owner
        self.size = 0
        self._dirs: dict[str, tuple[int, float, int, int]] = {}  # mode, mtime, uid, gid: set last
        self._real_dirs: set[str] = {""}
        self._this_layer: set[str] = set()

    def apply(self, tar: tarfile.TarFile) -> None:
        self._this_layer = set()
        for member in tar:
            parts = _parts(member.name)
            if not parts:
                if member.isdir():
                    self._dirs[""] = (member.mode, member.mtime, member.uid, member.gid)
                continue
            self._parents(parts[:-1], member.name)
            base = parts[-1]
            parent = "/".join(parts[:-1])
            if base == OPAQUE:
                self._opaque(parent)
            elif base.startswith(WHITEOUT):
                hidden = "/".join([*parts[:-1], base[len(WHITEOUT) :]])
                if hidden not in self._this_layer:
                    self._remove(hidden)
            else:
                self._member(tar, member, "/".join(parts))

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo, rel: str) -> None:
        path = self.root / rel
        if member.ischr() or member.isblk():
            raise UnpackError(f"layer member {member.name!r} is a device node")
        if member.isdir():
            if not (rel in self._real_dirs or _is_dir(path)):
                self._remove(rel)
                path.mkdir(mode=0o700)
            self._real_dirs.add(rel)
            self._dirs[rel] = (member.mode, member.mtime, member.uid, member.gid)
        else:
            self._remove(rel)
            if member.issym():
                os.symlink(member.linkname, path)
            elif member.islnk():
                os.link(self._link_source(member), path, follow_symlinks=False)
            elif member.isfifo():
                os.mkfifo(path, 0o600)
            else:
                self._file(tar, member, path)
            if not member.islnk():
                self._own(path, member)
                os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
            self._this_layer.add(rel)
        self._this_layer.add(rel)

    def _file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> None:
        source = tar.extractfile(member)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags, 0o600)
        with os.fdopen(fd, "wb") as out:
            if source is not None:
                shutil.copyfileobj(source, out, CHUNK)
            os.fchmod(out.fileno(), member.mode & 0o1777)
        self.size += member.size

    def _own(self, path: Path, member: tarfile.TarInfo) -> None:
        mapped = self.owner(member.uid, member.gid)
        if mapped is not None:
            os.chown(path, *mapped, follow_symlinks=False)

    def _link_source(self, member: tarfile.TarInfo) -> Path:
        if member.linkname.startswith("/"):
            raise UnpackError(f"hard link {member.name!r} names the absolute {member.linkname!r}")
        parts = _parts(member.linkname)
        if not parts:
            raise UnpackError(f"hard link {member.name!r} names the root")
        self._parents(parts[:-1], member.name)
        source = self.root.joinpath(*parts)
        try:
            mode = os.lstat(source).st_mode
        except FileNotFoundError:
            raise UnpackError(f"hard link {member.name!r} names a missing file") from None
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise UnpackError(f"hard link {member.name!r} names no file")
        return source

    def _parents(self, parts: list[str], name: str) -> None:
        """Make sure every parent is a real directory of the root (made if missing)."""
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            if rel in self._real_dirs:
                continue
            path = self.root / rel
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                path.mkdir(mode=0o755)
                self._real_dirs.add(rel)
                self._dirs.setdefault(rel, (0o755, 0.0, 0, 0))  # root's, as Docker makes it
                continue
            if stat.S_ISLNK(mode):
                raise UnpackError(f"layer member {name!r} would be written through the link {rel}")
            if not stat.S_ISDIR(mode):
                raise UnpackError(f"layer member {name!r} is under {rel}, which is no directory")
            self._real_dirs.add(rel)

    def _opaque(self, rel: str) -> None:
        path = self.root / rel if rel else self.root
        prefix = f"{rel}/" if rel else ""
        for child in os.listdir(path):
            if prefix + child not in self._this_layer:
                self._remove(prefix + child)

    def _remove(self, rel: str) -> None:
        path = self.root / rel
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISDIR(mode):
            _writable_tree(path)
            shutil.rmtree(path)
        else:
            path.unlink()
        self._real_dirs = {d for d in self._real_dirs if d != rel and not d.startswith(rel + "/")}
        self._real_dirs.add("")

    def finish(self) -> None:
        """Set the directories' owners, modes and times (deepest first), now all is in them."""
        self._dirs.setdefault("", (0o755, 0.0, 0, 0))  # the root is the image's root's
        for rel, (mode, mtime, uid, gid) in sorted(
            self._dirs.items(), key=lambda kv: -kv[0].count("/")
        ):
            path = self.root / rel if rel else self.root
            if _is_dir(path):
                mapped = self.owner(uid, gid)
                if mapped is not None:
                    os.chown(path, *mapped, follow_symlinks=False)
                os.chmod(path, mode & 0o1777)
                if mtime:
                    os.utime(path, (mtime, mtime), follow_symlinks=False)


def _parts(name: str) -> list[str]:
    """A member name's components; absolute and `..` names refused."""
    if name.startswith("/"):
        raise UnpackError(f"layer member {name!r} has an absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnpackError(f"layer member {name!r} has a '..' component")
    return parts


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _writable_tree(path: Path) -> None:
    """Give the server write access to every directory under `path` (so it can remove it)."""
    for folder, dirs, _ in os.walk(path):
        for name in dirs:
            full = os.path.join(folder, name)
            if not os.path.islink(full):
                os.chmod(full, 0o700)
    os.chmod(path, 0o700)
