"""What a create's `image` becomes: the host's view, or a stored image and how to run it.

The host's view (today's root: the host's `/usr`, the server's interpreter) stays what a
create without an image, or with one of `host_images` (by default the client's default
template), gets: no download. Any other image is pulled into the store (`store.py`) and run
with its own root (`rootfs.ImageView`); an image that cannot be had or run is an `ImageError`
with the reason first (`pull.PullError`'s), nothing left behind, which a create answers as the
real server's Docker runtime does (`DOCKER::SANDBOX_IMAGE_PULL_FAILED`, 500; 413 for an image
past the image size limit, `IMAGE_TOO_LARGE`, since only another image or a larger limit
helps, and retrying does not: the client raises `ApiError` with that status and code).
Device nodes skipped in an image's layers are logged (a warning, once per pull; their names
escaped, as an image's names are in every message: no line of the log is the image's).

Which execd a sandbox of an image runs, as OpenSandbox's Docker runtime injects it: the
server's execd binary when it has one (`execd`, or `execd_image`'s, see `execd_image.py`),
with the image's own Jupyter where the image has one (`config.find_jupyter`: the official
code-interpreter images), else without (commands and files work, a run_code answers execd's
own error); without a binary, our execd with the image's python3. An image with neither
python3 nor a server binary fails the create (`IMAGE_NO_EXECD`, naming both ways out). The
container's main process is Python: on the image's python3, or on the server's own where the
image has none (`rootfs.host_interpreter`).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ImageError, IsolationError
from ..execd_binary import ExecdBinary
from ..options import DEFAULT_HOST_IMAGES
from .config import CONFIG_INVALID, ConfigError, find_jupyter
from .execd_image import execd_from_image
from .inside import RangeWork
from .pull import TOO_LARGE, Puller, PullError, host_platform
from .rootfs import ImageView
from .store import DEFAULT_CAP, ImageStore, default_root, skipped_note
from .unpack import OwnerMap, server_owned

logger = logging.getLogger("osb_sync.local")
RAISE_LIMIT = (
    "; the server's image size limit is LocalServer(image_size_limit=BYTES), osb-sync serve"
    " --image-size-limit BYTES (default: the image store's size)"
)
NO_EXECD = (
    "the image {uri} has no python3 on its PATH, for this server's execd, and the server has"
    " no execd binary: use an image with python3 (3.9 or later), or start the server with"
    " OpenSandbox's execd binary (osb-sync serve --execd PATH, or --execd-image REF to take"
    " it from an image), which runs commands and files in any image"
)


@dataclass(frozen=True)
class ImageSettings:
    """The server's image settings (LocalServer options)."""

    store: Path | None = None  # default `store.default_root()`
    cap: int = DEFAULT_CAP
    limit: int | None = None  # bytes an image may unpack to (None: `cap`)
    insecure_registries: tuple[str, ...] = ()
    auth_file: Path | None = None
    local_paths: tuple[Path, ...] = ()
    host_images: tuple[str, ...] = DEFAULT_HOST_IMAGES


@dataclass(frozen=True)
class ImageRun:
    """How a sandbox runs its image: its root view, and the execd binary it runs (None: ours)."""

    view: ImageView
    binary: ExecdBinary | None = None


class ImageService:
    """Turns a create's image into an `ImageRun` (or None: the host's view)."""

    def __init__(
        self,
        settings: ImageSettings,
        isolated: bool,
        binary: ExecdBinary | None,
        owner: OwnerMap = server_owned,
        inside: RangeWork | None = None,
    ) -> None:
        self.settings = settings
        self.isolated = isolated
        self.binary = binary
        self.owner = owner
        self.inside = inside
        self._store: ImageStore | None = None
        self._lock = threading.Lock()

    @property
    def store(self) -> ImageStore:
        """The store, made at first use (a server that runs no image makes no directory)."""
        with self._lock:
            if self._store is None:
                root = self.settings.store or default_root()
                puller = Puller(
                    root / "scratch",
                    self.settings.insecure_registries,
                    self.settings.auth_file,
                    self.settings.local_paths,
                )
                self._store = ImageStore(
                    root, puller, self.settings.cap, self.owner, self.settings.limit, self.inside
                )
            return self._store

    def host_view(self, body: dict[str, Any]) -> bool:
        """True when the create gets the host's view (no image, or one of `host_images`)."""
        image = body.get("image") or {}
        return not image.get("uri") or image["uri"] in self.settings.host_images

    def launch(self, body: dict[str, Any]) -> ImageRun | None:
        """How the create `body` runs its image, pulling it first if needed (None: the host's
        view).

        Raises:
            ImageError: it cannot be had or run (`reason`: `IMAGE_TOO_LARGE` past the image
                size limit).
            IsolationError: sandboxes are not isolated here.
        """
        if self.host_view(body):
            return None
        uri = str(body["image"]["uri"])
        if not self.isolated:
            raise IsolationError(
                f"the image {uri} needs isolated sandboxes (its root is mounted in a"
                " container); this server runs them unisolated"
            )
        platform = body.get("platform") or host_platform()
        try:
            image, pulled = self.store.get(uri, platform, body["image"].get("auth"))
            ids = image.config.ids(image.rootfs)
        except PullError as exc:
            hint = RAISE_LIMIT if exc.reason == TOO_LARGE else ""
            raise ImageError(uri, exc.reason, exc.message + hint) from None
        except ConfigError as exc:
            raise ImageError(uri, CONFIG_INVALID, str(exc)) from None
        except OSError as exc:
            raise ImageError(uri, "IMAGE_PULL_FAILED", f"the store said: {exc}") from None
        if pulled and image.skipped:
            logger.warning(
                "local server: image %s: %s (%s): bwrap gives each sandbox its own /dev",
                image.pinned,
                skipped_note(image.skipped),
                ", ".join(map(repr, image.skipped[:8]))
                + (", ..." if len(image.skipped) > 8 else ""),
            )
        if self.binary is None:
            if image.python is None:
                raise ImageError(uri, "IMAGE_NO_EXECD", NO_EXECD.format(uri=uri))
            return ImageRun(ImageView(image, ids, self.inside))
        binary = self.binary.for_image(find_jupyter(image.rootfs, image.config))
        return ImageRun(ImageView(image, ids, self.inside), binary)

    def execd_binary(self, reference: str, target: Path) -> tuple[Path, str]:
        """The execd binary of the image `reference` (`execd_image.py`), linked at `target`
        (a path the sandboxes' root can reach, e.g. in the server's state directory).

        Returns:
            (`target`, where it came from: `REF@sha256:... (/execd)`).

        Raises:
            ExecdImageError: the image cannot be had or holds no execd binary.
        """
        found = execd_from_image(self.store, reference)
        target.unlink(missing_ok=True)
        try:
            os.link(found.path, target)
        except OSError:  # another file system
            shutil.copy2(found.path, target)
        return target, f"{found.pinned} ({found.found_at})"
