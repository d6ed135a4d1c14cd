"""A sandbox's `volumes`, as OpenSandbox's Docker runtime mounts them: checked, opened, bound.

- `host` `{path}`: that host directory, only under a directory the server allows
  (`allowed_host_paths`, none by default);
- `pvc` `{claimName, createIfNotExists}`: the directory `<volume root>/<claimName>`, made on
  first use unless `createIfNotExists` is false; it outlives the sandboxes that mount it.

`subPath` (relative, no `..`) selects a directory inside either. `readOnly` binds it read-only:
writes fail with EROFS. Other backends (`ossfs`) are refused. Every volume is mounted
`nosuid,nodev`. A mountPath at, above or inside another's is refused (`INVALID_MOUNT_PATH`,
naming both; unlike Docker): bwrap makes a mount point with
`mkdir -p` by name, following links, while the host is its `/oldroot`, so in an outer volume a
sandbox had replaced a directory by a link to `/oldroot/...`, it made the inner one on the host
(runc's CVE-2021-30465 shape; bwrap 0.8 cannot mount on a descriptor). Volumes are mounted last,
after the server's own mounts, which none may cover (`clash`).

Bound by descriptor, never by name. A sandbox's own code may write a pvc (or a read-write host
directory) that another sandbox is being created on, and swap a directory of it for a symlink
to anywhere, in a loop (`renameat2(RENAME_EXCHANGE)`): a path checked here and bound later by
name may by then name a directory outside. So each source is resolved once (symlinks that stay
inside its volume are followed, as Kubernetes does for `subPath`), then opened from `/`
component by component with `O_PATH | O_NOFOLLOW | O_DIRECTORY`, each component under the
descriptor of its parent: a symlink met there (a swap since the check) refuses the create
(`INVALID_SUB_PATH`, try again) instead of being followed. The descriptor is checked
itself (a directory, and the path the kernel names for it still inside its volume), and what is
mounted is that descriptor (`Bind`): on a root server, `staging.Staging.add_fd` bind-mounts its
`/proc/self/fd/N` (a kernel reference to that very directory, not a path looked up again) onto
a directory of the server's own, and bwrap binds that; a server that is not root, whose
sandboxes' root is an id of its range, mounts the descriptor's directory into the sandbox's
mount namespace itself once bwrap has made it, before anything runs there (`mount_inside`:
bwrap's `--bind-fd` would look its path up again as that id, which may not search the user's
home); a server without a range gives bwrap `--bind-fd N`, which looks up the descriptor's
path again (as the user) but compares device and inode of what it mounted with the
descriptor's and dies on a difference ("Race condition binding dirfd"): the create fails,
nothing outside is mounted. Directories the server makes (a claim, a missing `subPath`)
are made the same way, under their parent's descriptor, and given to the range through their
own descriptor, so no swap redirects a `chown`.

Whose files: a root server ID-maps each volume (`ownership`, `staging.bind_idmapped`) so that
its directory's owner and group are the sandbox's root and root group there, never host root
unless the server opted in (`--volume-root-is-host-root`); a sandbox with a writable volume
makes no set-id file and no file capability (`seccomp.py`, `bwrap.VOLUME_CAPABILITIES`).

A create's volumes are checked first, all of them and without a change to any file system
(`checked`), then opened (`opened`: claims and missing `subPath`s made); the descriptors live
until bwrap has mounted them: the caller closes them (`close`) once the create is done,
whether it succeeded or not. What is refused is a `VolumeError` naming its rule (its `code`:
the released server's `VOLUME::<code>`), or a `FieldError` for an entry of the wrong shape.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import bwrap, identity, package
from .errors import FieldError, VolumeError

NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
PATTERN = "String should match pattern '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'"
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
PROTECTED_OWN = (bwrap.EXECD_STATE_DIR, bwrap.OWN_DIR)
# ... nor above these (it would hide them).
HIDDEN_BY_PARENT = ("/tmp", bwrap.SANDBOX_HOME)  # noqa: S108 (the container's own /tmp)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _check_shape(index: int, volume: Any) -> None:
    loc = ["body", "volumes", index]
    if not isinstance(volume, dict):
        raise FieldError("dict_type", loc, "Input should be a valid dictionary", volume)
    for key in ("name", "mountPath"):
        if not isinstance(volume.get(key), str):
            raise FieldError("missing", [*loc, key], "Field required", volume)
    if not NAME.fullmatch(volume["name"]) or len(volume["name"]) > 63:
        raise FieldError("string_pattern_mismatch", [*loc, "name"], PATTERN, volume["name"])
    if not isinstance(volume.get("readOnly", False), bool):
        raise FieldError(
            "bool_type", [*loc, "readOnly"], "Input should be a valid boolean", volume["readOnly"]
        )


def clash(path: str, protected: tuple[str, ...] = ()) -> str:
    """Why a volume at `path` cannot be: it would cover, or lie in, one of `PROTECTED`,
    `PROTECTED_OWN` and `protected`, or hide one of `HIDDEN_BY_PARENT`; "" when it can."""
    for root in (*PROTECTED, *PROTECTED_OWN, *protected):
        if _within(path, root) or _within(root, path):
            return f"would cover {root}, which the container needs"
    for kept in HIDDEN_BY_PARENT:
        if _within(kept, path) and path != kept:
            return f"would hide {kept}"
    return ""


def _mount_path(volume: dict[str, Any], protected: tuple[str, ...]) -> str:
    raw = volume["mountPath"]
    # What the kernel takes (NAME_MAX, PATH_MAX), checked before bwrap fails on it.
    if len(raw.encode()) >= PATH_MAX or any(len(p.encode()) > NAME_MAX for p in raw.split("/")):
        raise VolumeError(
            "INVALID_MOUNT_PATH",
            f"mountPath {raw[:100]!r}... is too long: at most {NAME_MAX} bytes a component "
            f"and {PATH_MAX - 1} in all",
        )
    path = posixpath.normpath(raw) if raw.startswith("/") else ""
    if not path or ".." in raw.split("/") or "\0" in raw:
        raise VolumeError(
            "INVALID_MOUNT_PATH", f"mountPath {raw[:200]!r} must be an absolute path without '..'"
        )
    if path == "/" or path.startswith("//"):
        raise VolumeError("INVALID_MOUNT_PATH", "mountPath '/' would hide the whole container")
    why = clash(path, protected)
    if why:
        raise VolumeError(
            "INVALID_MOUNT_PATH",
            f"mountPath {path!r} {why}; choose a path such as /data or /mnt/NAME",
        )
    return path


@dataclass(frozen=True)
class Bind:
    """One volume, opened: the descriptor of its source directory, how and where to mount it."""

    fd: int  # O_PATH, close-on-exec; closed by `close`
    read_only: bool
    target: str  # the mountPath inside the sandbox
    name: str = ""  # the volume's, for messages
    mapped: tuple[int, int] | None = None  # host (uid, gid) shown as the sandbox's root
    note: str = ""  # what the create's status says of it (`ownership`)

    def bwrap_args(self) -> list[str]:
        """bwrap's `--bind-fd` arguments (the descriptor must be passed to bwrap)."""
        return ["--ro-bind-fd" if self.read_only else "--bind-fd", str(self.fd), self.target]


# Run as `python -I -S -c MOUNT_INSIDE USERNS_FD MNTNS_FD FD READ_ONLY TARGET` (`mount_inside`).
# Syscall numbers are the same on every architecture (open_tree 428, move_mount 429,
# mount_setattr 442). Once in the sandbox's mount namespace, its root is the sandbox's (an
# image's): nothing there may import (an uncaught exception's report imports `traceback` on
# 3.13, which would come from the image), so every error ends in `os._exit` with bytes written
# by `os.write`, and nothing of the host's (the volume's descriptor, the user namespace) is
# held any more.
MOUNT_INSIDE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
class Attr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("set", "clr", "propagation", "userns_fd")]
def fail(message):
    os.write(2, message.encode("utf-8", "replace") + b"\\n")
    os._exit(1)
def ok(result, what):
    if result < 0:
        fail(what + ": " + os.strerror(ctypes.get_errno()))
    return result
try:
    userns, mntns, fd, read_only, target = sys.argv[1:]
    userns, mntns, fd = int(userns), int(mntns), int(fd)
    there = os.fstat(fd)
    os.fchdir(fd)  # the directory opened and checked: no name is looked up
    ok(libc.setns(userns, 0x10000000), "setns (user)")  # CLONE_NEWUSER
    ok(libc.unshare(0x20000), "unshare (mount)")  # CLONE_NEWNS: the cwd moves to its copy
    # OPEN_TREE_CLONE | AT_RECURSIVE: the volume with the mounts below it, as bwrap's --bind
    tree = ok(libc.syscall(428, -100, b".", 1 | 0x8000 | os.O_CLOEXEC), "open_tree")
    attr = Attr(2 | 4 | (read_only == "1"))  # MOUNT_ATTR_NOSUID | NODEV (| RDONLY)
    ok(libc.syscall(442, tree, b"", 0x1000 | 0x8000, ctypes.byref(attr), ctypes.sizeof(attr)),
       "mount_setattr")  # AT_EMPTY_PATH | AT_RECURSIVE
    os.chdir("/")
    os.close(fd)
    os.close(userns)
    ok(libc.setns(mntns, 0x20000), "setns (mount)")  # its root and cwd become the sandbox's
    os.close(mntns)
    # The mount point bwrap made, found as bwrap found it: inside the sandbox's root, whose
    # links lead nowhere else (an image's were checked by `rootfs.confine`).
    at = os.open(target, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    ok(libc.syscall(429, tree, b"", at, b"", 4 | 0x40), "move_mount")  # F_ and T_EMPTY_PATH
    here = os.stat(target)
    if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
        fail("another directory than the volume's is mounted there")
except BaseException as exc:
    fail(type(exc).__name__ + ": " + str(exc))
os._exit(0)
"""
INSIDE_TIMEOUT = 10.0  # seconds, each volume


def mount_inside(userns: int, mntns: int, binds: Sequence[Bind]) -> None:
    """Mount each of `binds` (its descriptor's directory, `nosuid,nodev`, read-only if asked) at
    its target in the mount namespace `mntns`, owned by the user namespace `userns` of this
    server (not root), once bwrap has made it and before anything runs in it.

    bwrap's `--bind-fd` resolves the descriptor's path again by name (`realpath` of
    `/proc/self/fd/N`) as the sandbox's root: where that is an id of the server's range, it
    may not search the directories above the volume (a home of mode 700), and bwrap fails
    ("Can't find source path"). Here, for each volume, a fresh Python of the host's (running
    nothing of the sandbox's tree) makes the descriptor's directory its working directory,
    enters `userns` (its owner has every capability there), makes a private copy of the host's
    mount namespace (the working directory moves to the copy), clones the working directory
    with the mounts below it (`open_tree`: no name is looked up, so no swap for a symlink can
    redirect it), drops the host's descriptors, enters
    `mntns` and attaches the clone at the target (`move_mount`; Linux 5.12 for
    `mount_setattr`), and checks that the target is now the descriptor's directory.

    Raises:
        OSError: a volume could not be mounted (the message says which and why).
    """
    for bind in binds:
        args = [str(userns), str(mntns), str(bind.fd), "1" if bind.read_only else "0"]
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-S", "-c", MOUNT_INSIDE, *args, bind.target],
                pass_fds=(userns, mntns, bind.fd),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=INSIDE_TIMEOUT,
                cwd="/",
                env={},
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise OSError(
                f"volume {bind.name!r} was not mounted in {INSIDE_TIMEOUT:.0f} s"
            ) from None
        if done.returncode != 0:
            why = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            raise OSError(f"volume {bind.name!r} could not be mounted at {bind.target}: {why[0]}")


def close(binds: Iterable[Bind]) -> None:
    """Close the descriptors of `binds` (each once; errors ignored)."""
    for bind in binds:
        with contextlib.suppress(OSError):
            os.close(bind.fd)


_DIR = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


def _changed(what: str) -> VolumeError:
    return VolumeError(
        "INVALID_SUB_PATH",
        f"{what} changed while it was checked (a symlink took a directory's place); "
        "symlinks out of a volume are never followed: retry, or stop whatever swaps it",
    )


def _step(
    parent: int, name: str, create: bool, what: str, owner: tuple[int, int] | None = None
) -> int:
    """The descriptor of directory `name` under `parent`, never through a symlink.

    Made (and given to the sandboxes' root on a root server, as the host sees it: `owner` in
    an ID-mapped volume, else the range's root) when missing and `create`.
    Raises VolumeError: missing, not a directory, or a symlink (a swap since the check).
    """
    missing = VolumeError("SUB_PATH_NOT_FOUND", f"{what} is not a directory of its volume")
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise missing from None
    except OSError:
        try:  # a symlink now, or a directory again: either way it was swapped
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except OSError:
            mode = 0
        raise (_changed(what) if stat.S_ISLNK(mode) or stat.S_ISDIR(mode) else missing) from None
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
        made = True
    except FileExistsError:
        made = False
    try:
        new = os.open(name, _DIR & ~os.O_PATH, dir_fd=parent)
    except OSError:
        raise _changed(what) from None
    try:
        ids = bwrap.probe().ids
        if made and ids is not None and os.geteuid() == 0:
            # Sandbox root is the range's first host id (`identity.py`): it writes a pvc as its
            # owner. Through the descriptor: a swapped name cannot redirect it.
            os.fchown(new, *(owner or (ids.uid, ids.gid)))
        return os.open(".", _DIR, dir_fd=new)
    finally:
        os.close(new)


def _open(path: str, base: str, what: str, create_below: str | None = None) -> int:
    """The descriptor of directory `path` (resolved, inside `base`), opened from `/` without
    following a symlink, each directory missing below `create_below` made; checked through it.

    Raises:
        VolumeError: it is missing, not a directory, or changed since the check.
    """
    fd = os.open("/", _DIR)
    try:
        made_from = len(create_below.rstrip("/").split("/")) if create_below else sys.maxsize
        for depth, name in enumerate(path.split("/")[1:], start=1):
            if not name:
                continue
            child = _step(fd, name, depth >= made_from, what)
            os.close(fd)
            fd = child
        named = os.readlink(f"/proc/self/fd/{fd}")
        if not stat.S_ISDIR(os.fstat(fd).st_mode) or not _within(named, base):
            raise _changed(what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _sub_path_given(volume: dict[str, Any]) -> str | None:
    """A volume's `subPath` (None for none), relative and without '..'."""
    sub = volume.get("subPath")
    if sub is None or sub == "":
        return None
    if not isinstance(sub, str) or sub.startswith("/") or ".." in sub.split("/") or "\0" in sub:
        raise VolumeError(
            "INVALID_SUB_PATH", f"subPath {str(sub)[:200]!r} must be relative, without '..'"
        )
    return sub


def _sub_path(volume: dict[str, Any], base: str, create: bool) -> int:
    """The descriptor of `base` joined with `subPath`, resolved, still inside `base` (made
    where missing when `create`)."""
    sub = _sub_path_given(volume)
    if sub is None:
        return _open(base, base, f"volume {volume['name']!r}")
    try:
        resolved = os.path.realpath(os.path.join(base, sub))
    except OSError:  # a symlink became a directory while realpath read it (EINVAL)
        raise _changed(f"subPath {sub[:200]!r}") from None
    if not _within(resolved, base):
        raise VolumeError("INVALID_SUB_PATH", f"subPath {sub[:200]!r} leads outside its volume")
    return _open(resolved, base, f"subPath {sub[:200]!r}", base if create else None)


def _host_source(volume: dict[str, Any], allowed: tuple[Path, ...]) -> int:
    return _sub_path(volume, _host_path(volume, allowed), create=False)


def _host_path(volume: dict[str, Any], allowed: tuple[Path, ...]) -> str:
    """A `host` volume's directory, resolved, under an allowed one (nothing opened)."""
    host = volume["host"]
    path = host.get("path") if isinstance(host, dict) else None
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise VolumeError("INVALID_HOST_PATH", "host.path must be an absolute path")
    if not allowed:
        raise VolumeError(
            "HOST_PATH_NOT_ALLOWED",
            f"host path {path[:200]!r} is not allowed: this server allows no host paths. "
            "Start it with --allow-host-path DIR (osb-sync serve) or "
            "LocalServer(allowed_host_paths=[DIR]) to allow paths under DIR.",
        )
    try:
        resolved = os.path.realpath(path)
    except OSError:  # as in `_sub_path`: a writable host tree swapped while realpath read it
        raise _changed(f"host path {path[:200]!r}") from None
    roots = [os.path.realpath(root) for root in allowed]
    if not any(_within(resolved, root) for root in roots):
        raise VolumeError(
            "HOST_PATH_NOT_ALLOWED",
            f"host path {path[:200]!r} is not under an allowed directory ({', '.join(roots)}); "
            "allow its directory with --allow-host-path DIR",
        )
    if not os.path.isdir(resolved):
        raise VolumeError("HOST_PATH_NOT_FOUND", f"host path {path[:200]!r} is not a directory")
    return resolved


def _pvc_directory(volume: dict[str, Any], volume_root: Path) -> tuple[str, str]:
    """A `pvc` volume's (root, directory): its claim name checked, and that it exists unless
    it may be made (nothing made)."""
    pvc = volume["pvc"]
    claim = pvc.get("claimName") if isinstance(pvc, dict) else None
    if not isinstance(claim, str) or not NAME.fullmatch(claim) or len(claim) > 253:
        loc = ["body", "volumes", "pvc", "claimName"]
        raise FieldError("string_pattern_mismatch", loc, PATTERN, claim)
    root = os.path.realpath(volume_root)
    directory = os.path.join(root, claim)
    if not os.path.isdir(directory) and pvc.get("createIfNotExists", True) is False:
        raise VolumeError(
            "PVC_NOT_FOUND",
            f"volume {claim!r} does not exist and createIfNotExists is false",
        )
    return root, directory


def _pvc_source(volume: dict[str, Any], volume_root: Path) -> int:
    root, directory = _pvc_directory(volume, volume_root)
    claim = volume["pvc"]["claimName"]
    if not os.path.isdir(directory):
        try:
            os.makedirs(root, exist_ok=True)  # the server's: only claims are the range's
            os.close(_open(directory, directory, f"volume {claim!r}", create_below=root))
        except OSError as exc:
            raise VolumeError(
                "CREATE_FAILED", f"volume {claim!r} could not be made: {exc}"
            ) from None
    return _sub_path(volume, directory, create=True)


@dataclass(frozen=True)
class Volume:
    """One entry of a create's `volumes`, checked (`checked`), not opened yet."""

    spec: dict[str, Any]  # as the request gives it
    target: str  # its mountPath, normalized
    backend: str  # "host" or "pvc"


def mounts(
    volumes: Any,
    allowed: tuple[Path, ...],
    volume_root: Path,
    isolated: bool,
    protected: tuple[str, ...] = (),
) -> list[Bind]:
    """A create's `volumes`, `checked` and `opened` (empty for none); the caller `close`s them.

    Raises:
        The errors of `checked` and `opened`.
    """
    return opened(checked(volumes, isolated, protected), allowed, volume_root)


def checked(volumes: Any, isolated: bool, protected: tuple[str, ...] = ()) -> tuple[Volume, ...]:
    """A create's `volumes`, every entry checked, nothing opened or made (empty for none).

    Args:
        volumes: the request's `volumes` (None or a list).
        isolated: whether sandboxes are containers (volumes need one).
        protected: container paths of the server's own a volume may neither cover nor lie in,
            besides `PROTECTED` and `PROTECTED_OWN` (an execd binary's, the OOM counter).

    Raises:
        FieldError: a malformed entry.
        VolumeError: a refused one.
    """
    if volumes is None or volumes == []:
        return ()
    if not isinstance(volumes, list):
        raise FieldError("list_type", ["body", "volumes"], "Input should be a valid list", volumes)
    if not isolated:
        raise VolumeError(
            "UNSUPPORTED",
            f"volumes need isolated sandboxes, and these are not; to isolate them, {bwrap.FIX}",
        )
    own = (
        sys.base_prefix,
        sys.prefix,
        bwrap.package_dir(),
        str(package.installed_dir()),
        *protected,
    )
    found: list[Volume] = []
    for index, volume in enumerate(volumes):
        _check_shape(index, volume)
        target = _mount_path(volume, own)
        for other in found:
            path = other.target
            if volume["name"] == other.spec["name"] or target == path:
                raise VolumeError(
                    "DUPLICATE", f"volume name {volume['name']!r} or mountPath {target!r} repeats"
                )
            where = relation(target, path)
            if where:
                raise VolumeError(
                    "INVALID_MOUNT_PATH",
                    f"mountPath {target!r} of volume {volume['name']!r} is {where} the mountPath"
                    f" {path!r} of volume {other.spec['name']!r}: {NOT_NESTED}",
                )
        backends = [k for k in ("host", "pvc", "ossfs") if volume.get(k) is not None]
        if len(backends) != 1:
            raise VolumeError(
                "INVALID_BACKEND", f"volume {volume['name']!r} needs exactly one of host or pvc"
            )
        if backends[0] == "ossfs":
            raise VolumeError(
                "INVALID_BACKEND", "ossfs volumes (Alibaba OSS) are not supported locally"
            )
        found.append(Volume(volume, target, backends[0]))
    return tuple(found)


def sources_checked(
    volumes: Sequence[Volume], allowed: tuple[Path, ...], volume_root: Path
) -> None:
    """Refuse, before anything is opened, made or pulled, a `checked` volume whose source
    `opened` would refuse: a host path not allowed or missing, a claim name of the wrong
    shape or a claim that must exist and does not, a `subPath` that is absolute or has '..'.
    `opened` checks them again, by descriptor (the tree may change in between).

    Raises:
        VolumeError, FieldError: as `opened` does.
    """
    for volume in volumes:
        if volume.backend == "host":
            _host_path(volume.spec, allowed)
        else:
            _pvc_directory(volume.spec, volume_root)
        _sub_path_given(volume.spec)


HOST_ROOT_FIX = (
    "chown it to a user and group other than root (chown UID:GID DIR: the sandbox's root"
    " then writes there as them), or start the server with --volume-root-is-host-root"
    " (LocalServer(volume_root_is_host_root=True)) to have the sandbox's root write there as"
    " host root, as Docker's container root does"
)


def ownership(
    owner: tuple[int, int],
    read_only: bool,
    name: str,
    host_root: bool,
    ids: identity.IdRange | None,
) -> tuple[tuple[int, int] | None, str]:
    """Whom the sandbox's root is in the volume `name` whose directory's host (uid, gid) is
    `owner`, on a server of the range `ids`: (the host (uid, gid) it is there, None where the
    volume is not ID-mapped; what the create's status says).

    A root server ID-maps a volume (`staging.bind_idmapped`) so that its directory's owner
    and group are the sandbox's root and root group there: what the sandbox's root writes
    belongs on the host to them, as with Podman's `:idmap`. Not where that is host root (uid
    or gid 0) unless `host_root` (the server's opt-in): a sandbox's root is never host root
    by default; nor where the sandbox's root owns the directory already (the range's root:
    a claim the server made), nor on a server that is not root (it cannot mount). Where the
    sandbox's root is then not the owner of a writable volume, the note says so and what to
    do.
    """
    uid, gid = owner
    if ids is None or uid == ids.uid:
        return None, ""
    if not ids.by_root:  # a server that is not root
        note = (
            f" Volume {name!r} is not ID-mapped (only a server running as root maps volumes):"
            f" the sandbox's root writes there as host uid {ids.uid} and gid {ids.gid}, where"
            f" those may (the directory belongs to uid {uid}, gid {gid})."
        )
        return None, "" if read_only else note
    if 0 in (uid, gid) and not host_root:
        note = (
            f" Volume {name!r} is NOT writable by the sandbox's root: its directory belongs to"
            f" host root (uid {uid}, gid {gid}), which a sandbox's root is not by default. To"
            f" let it write there, {HOST_ROOT_FIX}."
        )
        return None, "" if read_only else note
    who = "host ROOT (--volume-root-is-host-root)" if 0 in (uid, gid) else "them"
    return (uid, gid), (
        f" Volume {name!r} is ID-mapped: its directory's owner and group (host uid {uid},"
        f" gid {gid}) are the sandbox's root there, which writes as {who}."
    )


DEEPEST = 64  # directory levels `privileged_file` looks into


def privileged_file(
    fd: int, mapped: Callable[[int, int], bool] = lambda uid, gid: True
) -> str | None:
    """The path (in its volume) of a file under the directory `fd` that is set-id or carries
    a file capability and whose owner or group `mapped` says the mount maps, or that could
    not be looked at; None where there is none.

    An ID-mapped writable volume makes its directory's owner the sandbox's root, who may open
    that owner's files for writing; the kernel clears set-id bits and file capabilities on
    write(2), truncate and fallocate, but not on a write through a shared writable mapping
    (mmap): such a file would keep its privilege and run the sandbox's code as its owner (host
    root under the opt-in). A file of neither a mapped owner nor a mapped group is not the
    sandbox's to write or chown (the kernel refuses a write to a file with an id the mount
    does not map). A walk through descriptors, never following a symbolic link, across the
    mounts below (the mapping covers them too), `DEEPEST` levels deep: a directory below
    those is one that could not be looked at.
    """

    def unseen(exc: OSError) -> None:
        raise exc

    try:
        for top, dirs, files, dir_fd in os.fwalk(".", dir_fd=fd, onerror=unseen):
            if dirs and top.count("/") >= DEEPEST:  # a descriptor and a frame each level
                return os.path.normpath(os.path.join(top, dirs[0]))
            for name in files:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode) or not mapped(info.st_uid, info.st_gid):
                    continue
                path = os.path.normpath(os.path.join(top, name))
                if info.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    return path
                # executable or not: a chmod, which the sandbox may do, keeps a capability
                at = f"/proc/self/fd/{dir_fd}/{name}"
                if "security.capability" in os.listxattr(at, follow_symlinks=False):
                    return path
    except OSError as exc:
        return os.path.normpath(exc.filename) if isinstance(exc.filename, str) else "?"
    return None


def _mapped_ids(owner: tuple[int, int], ids: identity.IdRange | None) -> Callable[[int, int], bool]:
    """Whether a file's host (uid, gid) has an id the mount of `owner`'s volume maps
    (`identity.mount_map`): the owner's, the group's, or one of the range."""

    def mapped(uid: int, gid: int) -> bool:
        if ids is None:
            return True
        in_range = ids.uid <= uid < ids.uid + ids.count or ids.gid <= gid < ids.gid + ids.count
        return uid == owner[0] or gid == owner[1] or in_range

    return mapped


def _privileged_note(name: str, path: str) -> str:
    shown = path if len(path) <= 200 else f"...{path[-200:]}"  # a sandbox may name it
    return (
        f" Volume {name!r} is NOT ID-mapped: it holds {shown!r}, a set-id or file-capable file"
        " (or one the server could not check, too deep or unreadable), which its directory's"
        " owner, the sandbox's root there, could rewrite keeping its privilege. Remove the"
        " set-id bits and capabilities of such files, or mount the volume read-only, to have"
        " it mapped."
    )


def opened(
    volumes: Sequence[Volume],
    allowed: tuple[Path, ...],
    volume_root: Path,
    host_root: bool = False,
) -> list[Bind]:
    """The `checked` volumes' sources, opened (a claim or a `subPath` made where missing); the
    caller `close`s them.

    Args:
        allowed: host directories whose trees `host` volumes may mount.
        volume_root: the directory of `pvc` volumes.
        host_root: whether a directory of host root's is ID-mapped (`ownership`).

    Raises:
        VolumeError: a source refused or missing (nothing is left open).
        FieldError: a claim name of the wrong shape.
    """
    binds: list[Bind] = []
    try:
        for volume in volumes:
            spec = volume.spec
            if volume.backend == "host":
                fd = _host_source(spec, allowed)
            else:
                fd = _pvc_source(spec, volume_root)
            read_only = bool(spec.get("readOnly"))
            binds.append(Bind(fd, read_only, volume.target, spec["name"]))  # closed on failure
            info = os.fstat(fd)
            owner = (info.st_uid, info.st_gid)
            mapped, note = ownership(owner, read_only, spec["name"], host_root, bwrap.probe().ids)
            held = None
            if mapped is not None and not read_only:
                held = privileged_file(fd, _mapped_ids(mapped, bwrap.probe().ids))
            if held is not None:
                mapped, note = None, _privileged_note(spec["name"], held)
            binds[-1] = replace(binds[-1], mapped=mapped, note=note)
    except BaseException:
        close(binds)
        raise
    return binds


def relation(path: str, other: str) -> str:
    """Where `path` is from `other`: "at", "above" or "inside" ("" for none of them)."""
    if path == other:
        return "at"
    return "above" if _within(other, path) else "inside" if _within(path, other) else ""


def invalid_mount_path(message: str) -> VolumeError:
    """`INVALID_MOUNT_PATH` with `message` (`rootfs.confine` says it too)."""
    return VolumeError("INVALID_MOUNT_PATH", message)


NOT_NESTED = (
    "the local server mounts no volume in another (bwrap would make its mount point through"
    " what a sandbox may have written there); mount it beside"
)


def make_inside(bind: Bind, parts: Sequence[str], what: str) -> None:
    """Make the directories `parts` inside `bind`'s source as far as they are missing, each
    under its parent's descriptor and given to the sandbox's root (as a claim is, `_step`:
    the directory's owner where the volume is ID-mapped, else the range's root); stop at
    anything else (a link, a file: what the container makes of it is its own view's).

    Raises:
        VolumeError: one is missing in a read-only volume, or was swapped meanwhile.
    """
    fd = os.dup(bind.fd)
    try:
        for name in parts:
            try:
                child = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if bind.read_only:
                    raise VolumeError(
                        "SUB_PATH_NOT_FOUND", f"{what} is not in the read-only volume {bind.name!r}"
                    ) from None
                child = _step(fd, name, True, what, bind.mapped)
            except OSError:
                return
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
