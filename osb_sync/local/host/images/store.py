"""The image store: each image unpacked once, by manifest digest, shared by every sandbox.

Layout under the store's root (default `$XDG_CACHE_HOME/osb-sync/images`, mode 0700: its
files are the server's, see `unpack.server_owned`):

    lock                  flock: held while refs, images or the size change
    refs.json             "REFERENCE|os/arch[|auth=HMAC]" -> manifest digest (what a tag
                          pulled to); an image pulled with credentials is found again only
                          by creates giving the same ones (an HMAC under `secret`, never
                          the credentials): a create without them asks the registry
    secret                32 random bytes (0600), the key of those HMACs
    images/sha256-HEX/    rootfs/, config.json (the blob), image.json (reference, size,
                          python3, the device nodes skipped); its `used` file's mtime is its
                          last use, its image.json is held with a shared flock by every
                          sandbox that runs it
    keys/HASH.lock        flock per reference: concurrent creates of one image pull it once
    tmp/NAME, NAME.lock   pulls and unpacks in progress, each held by its flock; anything
                          there whose lock is free was killed half-way and is removed

A cached reference is used without asking its registry again (Docker's `missing` pull
policy); `get(refresh=True)` (`osb-sync pull`) asks again. Nothing enters `images/` before it
is complete (a rename from `tmp/`). After a pull the store evicts least recently used images
no sandbox holds until it is under its cap (default 10 GiB). An image may unpack to `limit`
bytes (default the cap, since a larger one could never be kept; 10 GiB for a cap of 0, which
keeps only the images sandboxes run), and no more than `unpack.RATIO`
times its compressed size past `unpack.RATIO_FLOOR`: past either, the pull is refused
(`IMAGE_TOO_LARGE`) and what it unpacked removed. Layers are not kept once unpacked, and two
images sharing a layer each hold their own copy of it.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import CONFIG_INVALID, ConfigError, ImageConfig, find_python
from .inside import RangeWork
from .pull import TOO_LARGE, Progress, Puller, PullError, Source, parse
from .unpack import OwnerMap, SizeLimit, TooLarge, UnpackError, server_owned, unpack

DEFAULT_CAP = 10 << 30
REFUSED = "IMAGE_REFUSED"


def default_root() -> Path:
    """`$XDG_CACHE_HOME/osb-sync/images` (`~/.cache/...` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "osb-sync" / "images"


@dataclass(frozen=True)
class StoredImage:
    """An unpacked image of the store."""

    digest: str
    reference: str
    path: Path
    config: ImageConfig
    python: str | None  # the container path of its python3, None without one
    size: int  # bytes it takes on disk, at most (`unpack.Unpacked.size`)
    skipped: tuple[str, ...] = ()  # its device nodes, not made (`unpack.py`)

    @property
    def rootfs(self) -> Path:
        """Its root directory (read-only for sandboxes: each gets a layer over it)."""
        return self.path / "rootfs"

    @property
    def pinned(self) -> str:
        """Its reference with the digest really run (`name:tag@sha256:...`)."""
        return f"{self.reference.split('@', 1)[0]}@{self.digest}"


@contextmanager
def _flock(path: Path, kind: int = fcntl.LOCK_EX) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, kind)
        yield fd
    finally:
        os.close(fd)


def _remove_tree(path: Path) -> None:
    """Remove a tree whose directories may be read-only (an image's)."""

    def retry(function: Any, name: str, info: Any) -> None:
        os.chmod(os.path.dirname(name), 0o700)
        function(name)

    shutil.rmtree(path, onerror=retry)


class ImageStore:
    """The store (see the module docstring).

    Args:
        root: its directory (made 0700).
        puller: runs skopeo.
        cap: bytes of unpacked images kept before least recently used ones go.
        owner: the image's ids to the host's (`unpack.OwnerMap`).
        inside: where a server that is not root unpacks and removes in its id range
            (`inside.RangeWork`; `owner` is not used then).
        limit: bytes one image may unpack to (None: `cap`, or DEFAULT_CAP for a cap of 0,
            which keeps no image that no sandbox runs).
    """

    def __init__(
        self,
        root: Path,
        puller: Puller,
        cap: int = DEFAULT_CAP,
        owner: OwnerMap = server_owned,
        limit: int | None = None,
        inside: RangeWork | None = None,
    ) -> None:
        self.root = root
        self.inside = inside
        self.puller = puller
        self.cap = cap
        self.owner = owner
        self.limit = SizeLimit(limit if limit is not None else cap or DEFAULT_CAP)
        self.pulls = 0  # images pulled by this process (tests, figures)
        for folder in (root, root / "images", root / "keys", root / "tmp"):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(root, 0o700)

    def _credential_tag(self, auth: dict[str, Any]) -> str:
        """An HMAC of the credentials under the store's secret (made at first use)."""
        path = self.root / "secret"
        if not path.exists():
            partial = self.root / f"secret.{uuid.uuid4().hex}"
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(os.urandom(32))
            try:
                os.link(partial, path)  # whole or not at all; the first one made wins
            except FileExistsError:
                pass
            finally:
                partial.unlink()
        given = f"{auth.get('username', '')}\0{auth.get('password', '')}".encode()
        return hmac.new(path.read_bytes(), given, hashlib.sha256).hexdigest()[:32]

    def _refs(self) -> dict[str, str]:
        try:
            data = json.loads((self.root / "refs.json").read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _write_refs(self, refs: dict[str, str]) -> None:
        partial = self.root / f"refs.json.{uuid.uuid4().hex}"
        partial.write_text(json.dumps(refs, indent=1, sort_keys=True))
        partial.replace(self.root / "refs.json")

    def _load(self, digest: str) -> StoredImage | None:
        path = self.root / "images" / digest.replace(":", "-")
        try:
            meta = json.loads((path / "image.json").read_text())
            blob = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return None
        try:
            config = ImageConfig.from_blob(blob)
        except ConfigError:  # kept by an older server: pulled again, and refused
            return None
        python, skipped = meta.get("python"), tuple(meta.get("skipped") or ())
        return StoredImage(
            digest, str(meta["reference"]), path, config, python, int(meta["size"]), skipped
        )

    def get(
        self,
        uri: str,
        platform: dict[str, str],
        auth: dict[str, Any] | None = None,
        refresh: bool = False,
        progress: Progress | None = None,
    ) -> tuple[StoredImage, bool]:
        """The image `uri` names for `platform`, pulled if the store lacks it; (it, pulled?).

        `progress` hears how a pull goes (`pull.Progress`): its download, then its unpack.

        Raises:
            PullError: it cannot be had (the reason says why: `TOO_LARGE` past `limit`);
                nothing of it is left.
        """
        try:
            source = parse(uri)
        except ValueError as exc:
            raise PullError("IMAGE_INVALID_REFERENCE", str(exc)) from None
        self.puller.check_source(source)
        key = f"{source.canonical}|{platform.get('os', 'linux')}/{platform.get('arch', '')}"
        if auth:
            key += "|auth=" + self._credential_tag(auth)
        lock = self.root / "keys" / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".lock")
        with _flock(lock):
            digest = self._refs().get(key)
            found = self._load(digest) if digest and not refresh else None
            if found is not None:
                self.touch(found)
                return found, False
            image = self._pull(source, key, platform, auth, progress)
        self.evict(keep=image.digest)
        return image, True

    def _pull(
        self,
        source: Source,
        key: str,
        platform: dict[str, str],
        auth: dict[str, Any] | None,
        progress: Progress | None = None,
    ) -> StoredImage:
        self.clean_tmp()
        name = f"{os.getpid()}-{uuid.uuid4().hex}"
        work = self.root / "tmp" / name
        with _flock(self.root / "tmp" / f"{name}.lock"):
            try:
                work.mkdir(mode=0o700)
                (work / "image").mkdir()
                digest = self.puller.copy(source, work / "layout", platform, auth, progress)
                if progress is not None:
                    progress("unpack", 0, None)
                rootfs = work / "image" / "rootfs"
                try:
                    if self.inside is not None:
                        unpacked = self.inside.unpack(work / "layout", rootfs, self.limit)
                    else:
                        unpacked = unpack(work / "layout", rootfs, self.owner, self.limit)
                except TooLarge as exc:
                    raise PullError(TOO_LARGE, f"{source.canonical}: {exc}") from None
                except UnpackError as exc:
                    raise PullError(REFUSED, f"{source.canonical}: {exc}") from None
                try:
                    config = ImageConfig.from_blob(unpacked.config)
                except ConfigError as exc:
                    raise PullError(CONFIG_INVALID, f"{source.canonical}: {exc}") from None
                python = find_python(rootfs, config)
                (work / "image" / "config.json").write_text(json.dumps(unpacked.config))
                meta = {
                    "reference": source.canonical,
                    "size": unpacked.size,
                    "python": python,
                    "skipped": list(unpacked.skipped),
                }
                (work / "image" / "image.json").write_text(json.dumps(meta))
                (work / "image" / "used").touch()
                final = self.root / "images" / digest.replace(":", "-")
                with _flock(self.root / "lock"):
                    if not final.exists():
                        (work / "image").rename(final)
                    refs = self._refs()
                    refs[key] = digest
                    self._write_refs(refs)
                self.pulls += 1
            finally:
                if work.exists():
                    self._remove(work)
                (self.root / "tmp" / f"{name}.lock").unlink(missing_ok=True)
        image = self._load(digest)
        if image is None:
            raise PullError("IMAGE_PULL_FAILED", f"{source.canonical}: the store lost it")
        return image

    def clean_tmp(self) -> None:
        """Remove what pulls killed half-way left in `tmp/` (their locks are free)."""
        for lock in (self.root / "tmp").glob("*.lock"):
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a pull in progress
            else:
                work = lock.with_suffix("")
                if work.exists():
                    self._remove(work)
                lock.unlink(missing_ok=True)
            finally:
                os.close(fd)

    def _remove(self, path: Path) -> None:
        """Remove a tree of the store (an image's: in the id range where `inside` is set)."""
        if self.inside is not None:
            try:
                self.inside.remove(path)
                return
            except OSError:
                pass  # no namespace: nothing of the range's may be there (a pull that failed first)
        _remove_tree(path)

    def touch(self, image: StoredImage) -> None:
        """Mark `image` used now (the LRU order)."""
        try:
            os.utime(image.path / "used")
        except OSError:
            pass

    def images(self) -> list[dict[str, Any]]:
        """Every stored image: digest, references, size, last use, in use, python3, the
        device nodes its layers had (skipped)."""
        refs = self._refs()
        found: list[dict[str, Any]] = []
        for path in sorted((self.root / "images").iterdir()):
            image = self._load(path.name.replace("-", ":", 1))
            if image is None:
                continue
            found.append(
                {
                    "digest": image.digest,
                    "references": sorted(k for k, v in refs.items() if v == image.digest),
                    "size": image.size,
                    "last_used": _mtime(path / "used"),
                    "in_use": self._in_use(image),
                    "python": image.python,
                    "skipped": list(image.skipped),
                }
            )
        return found

    def _in_use(self, image: StoredImage) -> bool:
        try:
            fd = os.open(image.path / "image.json", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def remove(self, digest: str) -> bool:
        """Remove the image `digest` unless a sandbox holds it; True if it went."""
        path = self.root / "images" / digest.replace(":", "-")
        with _flock(self.root / "lock"):
            try:
                fd = os.open(path / "image.json", os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            doomed = self.root / "tmp" / f"gone-{uuid.uuid4().hex}"
            path.rename(doomed)
            os.close(fd)
            self._write_refs({k: v for k, v in self._refs().items() if v != digest})
        self._remove(doomed)
        return True

    def prune(self) -> list[str]:
        """Remove every image no sandbox holds; the digests removed."""
        return [i["digest"] for i in self.images() if not i["in_use"] and self.remove(i["digest"])]

    def evict(self, keep: str = "") -> list[str]:
        """Remove least recently used images no sandbox holds until under the cap."""
        images = sorted(self.images(), key=lambda i: i["last_used"])
        total = sum(i["size"] for i in images)
        gone: list[str] = []
        for image in images:
            if total <= self.cap:
                break
            if image["digest"] != keep and not image["in_use"] and self.remove(image["digest"]):
                total -= image["size"]
                gone.append(image["digest"])
        return gone


def hold(image: StoredImage) -> int:
    """A descriptor holding `image` against eviction and prune until it is closed."""
    fd = os.open(image.path / "image.json", os.O_RDONLY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        os.utime(image.path / "used")
    except OSError:
        pass
    return fd


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def skipped_note(skipped: tuple[str, ...]) -> str:
    """`8 device nodes skipped`: what a pull of an image with `skipped` says of them."""
    return f"{len(skipped)} device node{'s' if len(skipped) != 1 else ''} skipped"


def describe_age(seconds: float) -> str:
    """`3 minutes ago` style text for the CLI."""
    ago = max(0.0, time.time() - seconds)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if ago >= size:
            count = int(ago // size)
            return f"{count} {unit}{'s' if count != 1 else ''} ago"
    return "just now"
