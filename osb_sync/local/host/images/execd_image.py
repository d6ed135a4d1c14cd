"""The execd binary of an image: `execd_image` (`osb-sync serve --execd-image REF`).

As the real server's `execd_image` setting: the image is pulled like any other (the store,
`store.py`, for the host's platform, with the server's own registry credentials) and its
execd binary is taken from its root, found by the first rule that names an executable file
(`RULES`): `/execd`, `/usr/local/bin/execd`, else the image's Entrypoint (its first word,
looked up on the image's PATH when it has no slash). What is found must be an ELF executable
for this machine (its header read: magic, type EXEC or DYN, the host's machine); a dynamically
linked one would need its libraries in every sandbox, and OpenSandbox's is static.

The binary is copied once per image digest to `execd/sha256-HEX/execd` in the store (0555,
renamed into place when complete), so a restart of the server, or the image's eviction,
needs no new copy. Every failure is an `ExecdImageError` naming the reference and what to fix.
"""

from __future__ import annotations

import os
import platform
import shutil
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .config import find_executable, is_executable, resolve_in_root
from .pull import PullError, host_platform
from .store import ImageStore, StoredImage

RULES = ("/execd", "/usr/local/bin/execd", "the image's Entrypoint")
ELF_MAGIC = b"\x7fELF"
ET_EXEC, ET_DYN = 2, 3
# platform.machine() -> ELF e_machine
MACHINES = {"x86_64": 62, "aarch64": 183, "armv7l": 40, "ppc64le": 21, "s390x": 22}


class ExecdImageError(RuntimeError):
    """The execd image cannot be had, or holds no usable execd binary."""


@dataclass(frozen=True)
class ExecdFromImage:
    """An execd binary taken from an image.

    Attributes:
        path: the host path of the cached copy.
        pinned: the image's reference with its digest (`name:tag@sha256:...`).
        found_at: where in the image it was, and by which rule (`/execd (rule /execd)`).
    """

    path: Path
    pinned: str
    found_at: str


def locate(image: StoredImage) -> tuple[str, str]:
    """(container path of the image's execd binary, the rule that found it).

    Raises:
        ExecdImageError: no rule names an executable file.
    """
    rootfs = image.rootfs
    for path in RULES[:2]:
        if is_executable(rootfs, path):
            return path, path
    entry = image.config.effective_entrypoint(None)
    if entry:
        first = entry[0]
        found = first if "/" in first else find_executable(rootfs, image.config, first)
        if found is not None and found.startswith("/") and is_executable(rootfs, found):
            return found, RULES[2]
    raise ExecdImageError(
        f"the execd image {image.pinned} has no execd binary: none of {', '.join(RULES)}"
        f" (Entrypoint {entry or 'none'}) is an executable file of it; use an image that"
        " holds OpenSandbox's execd (e.g. opensandbox/execd) or pass the binary (--execd PATH)"
    )


def check_elf(path: Path, shown: str) -> None:
    """Check that `path` is an ELF executable for this machine.

    Raises:
        ExecdImageError: it is not (what it is instead named, shown as `shown`).
    """
    with path.open("rb") as binary:
        head = binary.read(20)
    if len(head) < 20 or not head.startswith(ELF_MAGIC):
        raise ExecdImageError(f"{shown} is not an ELF executable (no ELF header)")
    order = "<" if head[5] == 1 else ">"
    kind, machine = struct.unpack(order + "HH", head[16:20])
    if kind not in (ET_EXEC, ET_DYN):
        raise ExecdImageError(f"{shown} is an ELF file of type {kind}, not an executable")
    wanted = MACHINES.get(platform.machine())
    if wanted is not None and machine != wanted:
        raise ExecdImageError(
            f"{shown} is built for ELF machine {machine}, not this {platform.machine()}"
            f" ({wanted}); use the image's {host_platform()} variant"
        )


def execd_from_image(store: ImageStore, reference: str) -> ExecdFromImage:
    """Pull `reference` into `store` (if needed) and give its execd binary, cached by digest.

    Raises:
        ExecdImageError: the image cannot be had (the pull's reason first), or holds no
            ELF executable by the rules of the module docstring.
    """
    try:
        image, _ = store.get(reference, host_platform(), None)
    except PullError as exc:
        raise ExecdImageError(
            f"the execd image {reference} cannot be pulled: {exc.reason}: {exc.message}"
        ) from None
    except OSError as exc:
        raise ExecdImageError(f"the execd image {reference}: the store said {exc}") from None
    inside, rule = locate(image)
    found_at = inside if rule == inside else f"{inside} ({rule})"
    cached = store.root / "execd" / image.digest.replace(":", "-") / "execd"
    if not cached.is_file():
        resolved = resolve_in_root(image.rootfs, inside) or PurePosixPath(inside)
        source = image.rootfs.joinpath(*resolved.parts[1:])
        check_elf(source, f"{inside} of the execd image {image.pinned}")
        cached.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        partial = cached.with_name(f".execd-{uuid.uuid4().hex}")
        try:
            shutil.copyfile(source, partial, follow_symlinks=False)
            os.chmod(partial, 0o555)  # noqa: S103 (bound read-only into every sandbox)
            os.replace(partial, cached)
        finally:
            partial.unlink(missing_ok=True)
    check_elf(cached, f"{inside} of the execd image {image.pinned}")
    return ExecdFromImage(cached, image.pinned, found_at)
