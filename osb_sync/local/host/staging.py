"""Bind mounts a root server makes on the host for one sandbox's start, then takes away.

bwrap resolves every bind source by name, as the sandboxes' unprivileged root (`identity.py`),
after the sandbox's code could have run elsewhere: a source the range may not reach (the
server's interpreter under `/root`) fails, and a source below a directory some sandbox may
write (a pvc volume) may be swapped for a symlink between any check and bwrap's mount. So the
server opens each such source itself (a descriptor: what it checked is what gets mounted),
binds the descriptor (`/proc/self/fd/N`, which names that very directory, not a path) onto an
empty directory of a directory it makes in the system's temporary directory (owned by root,
searchable by the range's root group only, which no sandbox can change), and hands bwrap that
path. Once bwrap has made its mount namespace (its copy of these mounts),
`release` detaches them from the host's. Each bind is private (no propagation either way),
and read-only or `nosuid,nodev` as asked.

Why `mount(2)` of `/proc/self/fd/N` and not `open_tree`/`move_mount`: both mount the very
directory the descriptor holds (the kernel follows the proc link to it, no name is looked up),
but the new mount API needs Linux 5.2 and raw syscall numbers per architecture through ctypes
(glibc wraps it only from 2.36), and its detached mount would still have to reach bwrap by a
path: bwrap takes no mount descriptor, and may not attach one from another user namespace.
The exception is an ID-mapped volume (`bind_idmapped`, Linux 5.12): only a detached mount can
be given an ID mapping, so `open_tree(OPEN_TREE_CLONE)` clones the descriptor's directory
(again no name is looked up), `mount_setattr(MOUNT_ATTR_IDMAP)` maps it, and `move_mount`
attaches it at its staging path, which bwrap binds as any other (a bind keeps the mapping).
These three system calls have the same numbers on every architecture we filter.

Only a server running as root can mount: elsewhere `available()` is False, sources are bound
by name, and volumes (which a sandbox may swap) from their descriptors by the server inside the
sandbox's namespaces, or by bwrap's `--bind-fd` (`volumes.py`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import platform
import tempfile
import time
from pathlib import Path

from .identity import IdRange

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _base() -> str:
    """Where staging directories go: `/run` (root's), else `/tmp`, never `$TMPDIR`.

    `$TMPDIR` may be a directory the range's root cannot search.
    """
    return "/run" if os.path.isdir("/run") else "/tmp"  # noqa: S108


def available() -> bool:
    """True where this process may make bind mounts (root on Linux)."""
    return os.name == "posix" and os.geteuid() == 0 and hasattr(os, "O_PATH")


def _mount(source: str | None, target: str, flags: int) -> None:
    src = source.encode() if source is not None else None
    if _libc().mount(src, target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def bind_descriptor(fd: int, target: str, read_only: bool, volume: bool) -> None:
    """Bind the directory or file `fd` names onto `target`, private, read-only if asked.

    Raises:
        OSError: the kernel refused a step (the bind is undone).
    """
    _mount(f"/proc/self/fd/{fd}", target, MS_BIND | MS_REC)
    try:
        _mount(None, target, MS_PRIVATE | MS_REC)
        flags = (MS_RDONLY if read_only else 0) | (MS_NOSUID | MS_NODEV if volume else 0)
        if flags:
            _mount(None, target, MS_REMOUNT | MS_BIND | flags)
    except OSError:
        detach(target)
        raise


# The new mount API (linux/mount.h; the numbers of asm-generic, x86_64's too).
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
IDMAP_MACHINES = ("x86_64", "aarch64")
OPEN_TREE_CLONE = 1
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 1, 2, 4
MOUNT_ATTR_IDMAP = 0x100000


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _syscall(number: int, what: str, *args: object) -> int:
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    done = int(libc.syscall(ctypes.c_long(number), *args))
    if done < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return done


def bind_idmapped(fd: int, target: str, read_only: bool, userns_fd: int) -> None:
    """Mount the directory `fd` holds at `target`, ID-mapped by the user namespace
    `userns_fd` (`identity.mount_namespace`), `nosuid,nodev`, private, read-only if asked.

    Raises:
        OSError: the kernel or the file system refused it (ENOSYS before Linux 5.12, EINVAL
            on a file system without ID-mapped mounts, EPERM without the right): nothing is
            mounted.
    """
    if platform.machine() not in IDMAP_MACHINES:
        raise OSError(errno.ENOSYS, f"no system call table for {platform.machine()}")
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE
    tree = _syscall(SYS_OPEN_TREE, "open_tree", ctypes.c_int(fd), b"", ctypes.c_uint(flags))
    try:
        attr = _MountAttr(
            MOUNT_ATTR_IDMAP
            | MOUNT_ATTR_NOSUID
            | MOUNT_ATTR_NODEV
            | (MOUNT_ATTR_RDONLY if read_only else 0),
            0,
            MS_PRIVATE,
            userns_fd,
        )
        _syscall(
            SYS_MOUNT_SETATTR,
            "mount_setattr",
            ctypes.c_int(tree),
            b"",
            ctypes.c_uint(AT_EMPTY_PATH | AT_RECURSIVE),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        )
        _syscall(
            SYS_MOVE_MOUNT,
            "move_mount",
            ctypes.c_int(tree),
            b"",
            ctypes.c_int(AT_FDCWD),
            os.fsencode(target),
            ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
        )
    finally:
        os.close(tree)
    try:  # attached under a shared mount (`/run`), it joined its peer group: private again
        _mount(None, target, MS_PRIVATE | MS_REC)
    except OSError:
        detach(target)
        raise


def detach(target: str) -> None:
    """Detach the mount at `target` (lazily: a process still in it keeps it); errors ignored."""
    _libc().umount2(target.encode(), MNT_DETACH)


STALE_AFTER = 120.0  # seconds: far longer than any start's staging lives


def sweep() -> None:
    """Detach and remove the staging directories a killed server left (older than STALE_AFTER)."""
    if not available():
        return
    base = Path(_base())
    for directory in base.glob("osb-binds-*"):
        try:
            if time.time() - directory.stat().st_mtime < STALE_AFTER:
                continue
            for target in directory.iterdir():
                detach(str(target))
                (os.rmdir if target.is_dir() else os.unlink)(target)
            directory.rmdir()
        except OSError:
            pass


class Staging:
    """The host binds of one sandbox's start, in a directory made on first use, removed by
    `release`; searchable by the group of `ids` (the range's root group) only."""

    def __init__(self, ids: IdRange | None) -> None:
        self.ids = ids
        self.directory: Path | None = None
        self._targets: list[str] = []

    def add_fd(
        self, fd: int, is_dir: bool, read_only: bool, volume: bool = False, userns: int = -1
    ) -> str:
        """Bind descriptor `fd` at a new path of the directory; that path. A volume's bind is
        ID-mapped by the user namespace `userns` where one is given (`bind_idmapped`).

        Raises:
            OSError: the directory or the bind could not be made (the path is removed).
        """
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="osb-binds-", dir=_base()))
            if self.ids is not None:
                os.chown(self.directory, 0, self.ids.gid)
            self.directory.chmod(0o710)
        target = str(self.directory / str(len(self._targets)))
        if is_dir:
            os.mkdir(target, 0o755)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
        try:
            if userns >= 0:
                bind_idmapped(fd, target, read_only, userns)
            else:
                bind_descriptor(fd, target, read_only, volume)
        except OSError:
            (os.rmdir if is_dir else os.unlink)(target)
            raise
        self._targets.append(target)
        return target

    def add(self, source: str, read_only: bool) -> str:
        """Bind the host path `source` (opened by the server) at a new path; that path."""
        fd = os.open(source, os.O_PATH | os.O_CLOEXEC)
        try:
            return self.add_fd(fd, os.path.isdir(f"/proc/self/fd/{fd}"), read_only)
        finally:
            os.close(fd)

    def release(self) -> None:
        """Detach every bind from the host and remove the directory; idempotent.

        Never a recursive removal: a bind still there would take its source's files with it.
        """
        for target in reversed(self._targets):
            detach(target)
            try:
                (os.rmdir if os.path.isdir(target) else os.unlink)(target)
            except OSError:
                pass
        self._targets = []
        if self.directory is not None:
            try:
                self.directory.rmdir()
            except OSError:
                pass
            self.directory = None
