"""A sandbox's `volumes`, as OpenSandbox's Docker runtime mounts them: checked, then bwrap binds.

- `host` `{path}`: that host directory, only under a directory the server allows
  (`allowed_host_paths`, none by default);
- `pvc` `{claimName, createIfNotExists}`: the directory `<volume root>/<claimName>`, made on
  first use unless `createIfNotExists` is false; it outlives the sandboxes that mount it.

`subPath` (relative, no `..`) selects a directory inside either; every source is resolved
(symlinks included) and must stay inside the directory it belongs to. `readOnly` binds it
read-only: writes fail with EROFS. Other backends (`ossfs`) answer 400. A sandbox's own code
may swap a directory of a pvc it mounts for a symlink between this check and the mount; the
sources are therefore passed to bwrap already resolved.
"""

from __future__ import annotations

import os
import posixpath
import re
import sys
from pathlib import Path
from typing import Any

from ..http.exchange import HttpError, error
from . import bwrap
from .validation import issue, unprocessable

NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
NAME_MAX = 255
PATH_MAX = 4096
# No volume at or under these (the container's system and our own directories) ...
PROTECTED = (
    "/usr",
    "/etc",
    "/proc",
    "/dev",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
)
PROTECTED_OWN = (bwrap.EXECD_STATE_DIR, bwrap.PYTHON_BIN)
# ... nor above these (it would hide them).
HIDDEN_BY_PARENT = ("/tmp", bwrap.SANDBOX_HOME)  # noqa: S108 (the container's own /tmp)


def _bad(code: str, message: str) -> HttpError:
    return error(400, f"VOLUME::{code}", message)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _check_shape(index: int, volume: Any) -> None:
    loc = ["body", "volumes", index]
    if not isinstance(volume, dict):
        raise unprocessable([issue("dict_type", loc, "Input should be a valid dictionary", volume)])
    for key in ("name", "mountPath"):
        if not isinstance(volume.get(key), str):
            raise unprocessable([issue("missing", [*loc, key], "Field required", volume)])
    if not NAME.fullmatch(volume["name"]) or len(volume["name"]) > 63:
        raise unprocessable(
            [
                issue(
                    "string_pattern_mismatch",
                    [*loc, "name"],
                    "String should match pattern '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'",
                    volume["name"],
                )
            ]
        )
    if not isinstance(volume.get("readOnly", False), bool):
        raise unprocessable(
            [
                issue(
                    "bool_type",
                    [*loc, "readOnly"],
                    "Input should be a valid boolean",
                    volume["readOnly"],
                )
            ]
        )


def _mount_path(volume: dict[str, Any], protected: tuple[str, ...]) -> str:
    raw = volume["mountPath"]
    # What the kernel takes (NAME_MAX, PATH_MAX), checked before bwrap fails on it.
    if len(raw.encode()) >= PATH_MAX or any(len(p.encode()) > NAME_MAX for p in raw.split("/")):
        raise _bad(
            "INVALID_MOUNT_PATH",
            f"mountPath {raw[:100]!r}... is too long: at most {NAME_MAX} bytes a component "
            f"and {PATH_MAX - 1} in all",
        )
    path = posixpath.normpath(raw) if raw.startswith("/") else ""
    if not path or ".." in raw.split("/") or "\0" in raw:
        raise _bad(
            "INVALID_MOUNT_PATH", f"mountPath {raw[:200]!r} must be an absolute path without '..'"
        )
    if path == "/" or path.startswith("//"):
        raise _bad("INVALID_MOUNT_PATH", "mountPath '/' would hide the whole container")
    for root in (*PROTECTED, *PROTECTED_OWN, *protected):
        if _within(path, root) or _within(root, path):
            raise _bad(
                "INVALID_MOUNT_PATH",
                f"mountPath {path!r} would cover {root}, which the container needs; "
                "choose a path such as /data or /mnt/NAME",
            )
    for kept in HIDDEN_BY_PARENT:
        if _within(kept, path) and path != kept:
            raise _bad("INVALID_MOUNT_PATH", f"mountPath {path!r} would hide {kept}")
    return path


def _make_dirs(path: str) -> None:
    """`os.makedirs`, each directory made given to the sandboxes' root (a root server's).

    Sandbox root is the range's first host id (`identity.py`): it writes a pvc as its owner.
    """
    missing = []
    head = path.rstrip("/")
    while head and not os.path.isdir(head):
        missing.append(head)
        head = os.path.dirname(head)
    os.makedirs(path, exist_ok=True)
    ids = bwrap.probe().ids
    if ids is not None and os.geteuid() == 0:
        for made in missing:
            os.chown(made, ids.uid, ids.gid, follow_symlinks=False)


def _sub_path(volume: dict[str, Any], base: str, create: bool) -> str:
    """`base` joined with `subPath`, resolved, and still inside `base` (made when `create`)."""
    sub = volume.get("subPath")
    if sub is None or sub == "":
        return base
    if not isinstance(sub, str) or sub.startswith("/") or ".." in sub.split("/") or "\0" in sub:
        raise _bad("INVALID_SUB_PATH", f"subPath {str(sub)[:200]!r} must be relative, without '..'")
    joined = os.path.join(base, sub)
    if create and _within(os.path.realpath(os.path.dirname(joined.rstrip("/"))), base):
        try:
            _make_dirs(joined)
        except OSError:
            pass  # e.g. a dangling symlink: refused below
    resolved = os.path.realpath(joined)
    if not _within(resolved, base):
        raise _bad("INVALID_SUB_PATH", f"subPath {sub[:200]!r} leads outside its volume")
    if not os.path.isdir(resolved):
        raise _bad("SUB_PATH_NOT_FOUND", f"subPath {sub[:200]!r} is not a directory of its volume")
    return resolved


def _host_source(volume: dict[str, Any], allowed: tuple[Path, ...]) -> str:
    host = volume["host"]
    path = host.get("path") if isinstance(host, dict) else None
    if not isinstance(path, str) or not path.startswith("/"):
        raise _bad("INVALID_HOST_PATH", "host.path must be an absolute path")
    if not allowed:
        raise _bad(
            "HOST_PATH_NOT_ALLOWED",
            f"host path {path[:200]!r} is not allowed: this server allows no host paths. "
            "Start it with --allow-host-path DIR (osb-sync serve) or "
            "LocalServer(allowed_host_paths=[DIR]) to allow paths under DIR.",
        )
    resolved = os.path.realpath(path)
    roots = [os.path.realpath(root) for root in allowed]
    if not any(_within(resolved, root) for root in roots):
        raise _bad(
            "HOST_PATH_NOT_ALLOWED",
            f"host path {path[:200]!r} is not under an allowed directory ({', '.join(roots)}); "
            "allow its directory with --allow-host-path DIR",
        )
    if not os.path.isdir(resolved):
        raise _bad("HOST_PATH_NOT_FOUND", f"host path {path[:200]!r} is not a directory")
    return _sub_path(volume, resolved, create=False)


def _pvc_source(volume: dict[str, Any], volume_root: Path) -> str:
    pvc = volume["pvc"]
    claim = pvc.get("claimName") if isinstance(pvc, dict) else None
    if not isinstance(claim, str) or not NAME.fullmatch(claim) or len(claim) > 253:
        raise unprocessable(
            [
                issue(
                    "string_pattern_mismatch",
                    ["body", "volumes", "pvc", "claimName"],
                    "String should match pattern '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'",
                    claim,
                )
            ]
        )
    root = os.path.realpath(volume_root)
    directory = os.path.join(root, claim)
    if not os.path.isdir(directory):
        if pvc.get("createIfNotExists", True) is False:
            raise _bad(
                "PVC_NOT_FOUND",
                f"volume {claim!r} does not exist and createIfNotExists is false",
            )
        try:
            os.makedirs(root, exist_ok=True)  # the server's: only claims are the range's
            _make_dirs(directory)
        except OSError as exc:
            raise error(
                500, "VOLUME::CREATE_FAILED", f"volume {claim!r} could not be made: {exc}"
            ) from None
    return _sub_path(volume, os.path.realpath(directory), create=True)


def mounts(volumes: Any, allowed: tuple[Path, ...], volume_root: Path, isolated: bool) -> list[str]:
    """The bwrap arguments that mount a create's `volumes` (empty for none).

    Args:
        volumes: the request's `volumes` (None or a list).
        allowed: host directories whose trees `host` volumes may mount.
        volume_root: the directory of `pvc` volumes.
        isolated: whether sandboxes are containers (volumes need one).

    Raises:
        HttpError: 422 for a malformed entry, 400 for a refused one.
    """
    if volumes is None or volumes == []:
        return []
    if not isinstance(volumes, list):
        raise unprocessable(
            [issue("list_type", ["body", "volumes"], "Input should be a valid list", volumes)]
        )
    if not isolated:
        raise _bad(
            "UNSUPPORTED",
            f"volumes need isolated sandboxes, and these are not; to isolate them, {bwrap.FIX}",
        )
    args: list[str] = []
    names: set[str] = set()
    paths: set[str] = set()
    for index, volume in enumerate(volumes):
        _check_shape(index, volume)
        target = _mount_path(volume, (sys.base_prefix, sys.prefix, bwrap.package_dir()))
        if volume["name"] in names or target in paths:
            raise _bad(
                "DUPLICATE", f"volume name {volume['name']!r} or mountPath {target!r} repeats"
            )
        names.add(volume["name"])
        paths.add(target)
        backends = [k for k in ("host", "pvc", "ossfs") if volume.get(k) is not None]
        if len(backends) != 1:
            raise _bad(
                "INVALID_BACKEND", f"volume {volume['name']!r} needs exactly one of host or pvc"
            )
        if backends[0] == "host":
            source = _host_source(volume, allowed)
        elif backends[0] == "pvc":
            source = _pvc_source(volume, volume_root)
        else:
            raise _bad("INVALID_BACKEND", "ossfs volumes (Alibaba OSS) are not supported locally")
        args += ["--ro-bind" if volume.get("readOnly") else "--bind", source, target]
    return args
