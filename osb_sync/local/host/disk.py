"""A sandbox's disk: one filesystem, size- and inode-limited, holding all it can write.

A root server mounts one tmpfs per sandbox at `MOUNT_DIR` of its run directory
(`size=`, `nr_inodes=`, `nosuid,nodev`, its root `0710` to the range's root group, private:
no propagation) and makes there every directory the sandbox writes: `/tmp`, `/var`, `/srv`,
`/mnt`, `/opt`, `/home`, its home, execd's state directory and, for an image, the overlay's
upper and work directories (or the image's copy). Once the sandbox's bwrap has its copy of the
mount table, the container detaches the tmpfs from the server's namespace (`detach`: every later
bwrap would copy it again) and reaches it through a descriptor of its root from then on (paths
through `/proc/<pid>/fd/N`, `resize` by fspick(2)). A write past the limit gets ENOSPC inside the
sandbox (an upload: execd's 500 naming "No space left on device"); the server's own disk, the
other sandboxes' and the server itself are not touched. The sizes come from `resourceLimits`
(`ephemeral-storage`, Kubernetes' key; `inodes`, ours, like `pids`), else `DEFAULT_BYTES` and
`DEFAULT_INODES`. A spare gets the defaults at its start and its sandbox's sizes at claim (a
remount: a tmpfs's limits can change while it is in use).

Why a tmpfs and not a loop-mounted ext4: it needs no loop device (`/dev/loop-control` is
missing in most containers, CI's included), no backing file, no `mkfs` per sandbox (tens of
milliseconds and e2fsprogs), it takes both limits as mount options and changes them by a
remount (ext4 needs `resize2fs`, and its inode count is fixed by `mkfs`), and it is gone with
its last mount (nothing to reclaim after a crash but the mount). Its cost: it is memory, not
disk. tmpfs pages are charged to the memory cgroup of the process that writes them: the
sandbox's own files count in its `memory` limit (where the memory controller is writable; a
sandbox may then fill its disk up to its memory limit less what its processes use, and past
that the kernel's OOM killer, not ENOSPC, answers), and files the server writes for it (a
snapshot's restore) count in the server's. Without swap, the host needs memory for every
sandbox's disk at once: `ephemeral-storage` times the sandboxes running is the worst case.

A server that is not root cannot mount a tmpfs on the host: bwrap makes each writable directory
a tmpfs of its own inside the sandbox, and the sandbox's limits are split between them
(`SHARES`: /tmp and the home 40% each, the rest a little), so that all of them together hold
no more than asked (each its full size would let a sandbox keep eight times its limit in the
host's memory). bwrap has no option for an inode cap, so once the sandbox is up, before
anything of its own runs, the server remounts each of them with its `size=` and `nr_inodes=`
from inside its user and mount namespaces (`remount_inside`: the owner of a user namespace
may enter it with every capability there, and tmpfs takes new limits on a remount); a spare
gets its sandbox's sizes the same way at its claim. That is a fresh Python of the host's that
enters both namespaces and calls mount(2) itself: it runs nothing of the sandbox's tree (a
`mount` found there would run with more than the sandbox's capabilities, outside its seccomp
filter and PID namespace).
Unisolated sandboxes, and an image's copy on a non-root server, have no disk limit. `mode`
names the case; `limits.plan` says it in the status message.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from . import spawn
from .bwrap import EXECD_STATE_DIR, SANDBOX_HOME, Support

DEFAULT_BYTES = 1 << 30
DEFAULT_INODES = 100_000
MOUNT_DIR = "disk"  # under the sandbox's run directory
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8
SYS_FSCONFIG, SYS_FSPICK = 431, 433  # asm-generic's: x86-64, arm64, riscv (mips differs)
FSPICK_CLOEXEC, FSPICK_EMPTY_PATH = 1, 8
FSCONFIG_SET_STRING, FSCONFIG_CMD_RECONFIGURE = 1, 7
REMOUNT_TIMEOUT = 10.0
PAGE = 4096
# Per mille of a sandbox's size and inodes each writable directory of a non-root server's
# sandbox gets (`split`): they add up to the whole.
SHARES = {
    "/tmp": 400,  # noqa: S108
    SANDBOX_HOME: 400,
    "/var": 60,
    "/opt": 60,
    "/srv": 20,
    "/mnt": 20,
    "/home": 20,
    EXECD_STATE_DIR: 20,  # upload metadata, then execd's own few files
}
# Run as `python -I -S -c REMOUNT USERNS_FD MNTNS_FD (PLACE SIZE INODES)...` (see the docstring).
REMOUNT = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
userns, mntns, *rest = sys.argv[1:]
for fd, kind in ((userns, 0x10000000), (mntns, 0x20000)):  # CLONE_NEWUSER, CLONE_NEWNS
    if libc.setns(int(fd), kind) != 0:
        sys.exit(f"setns: {os.strerror(ctypes.get_errno())}")
for place, size, inodes in zip(rest[0::3], rest[1::3], rest[2::3]):
    data = f"size={size},nr_inodes={inodes}".encode()  # MS_REMOUNT | MS_NOSUID | MS_NODEV
    if libc.mount(None, place.encode(), None, 32 | 2 | 4, data) != 0:
        sys.exit(f"{place}: {os.strerror(ctypes.get_errno())}")
"""


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def mode(support: Support, image: bool) -> str:
    """How a sandbox's disk is limited here: "tmpfs" (one for all it writes, a root server),
    "per-directory" (bwrap's `--size`, a non-root server) or "none"."""
    if support.bwrap is None or support.ids is None:
        return "none"
    if support.ids.by_root:
        return "tmpfs" if usable() else "none"
    return "none" if image else "per-directory"


@functools.cache
def usable() -> bool:
    """True where this process may mount a tmpfs (root with CAP_SYS_ADMIN); tried once."""
    if os.name != "posix" or os.geteuid() != 0:
        return False
    probe = Path(tempfile.mkdtemp(prefix="osb-disk-probe-"))
    try:
        mount(probe, 1 << 20, 64, 0)
    except OSError:
        return False
    else:
        unmount(probe)
        return True
    finally:
        probe.rmdir()


def _call(source: bytes | None, target: Path, fstype: bytes | None, flags: int, data: str) -> None:
    if _libc().mount(source, bytes(target), fstype, flags, data.encode() or None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs {target}: {os.strerror(err)}")


def mount(target: Path, size: int, inodes: int, gid: int) -> None:
    """Mount a sandbox's tmpfs on the empty directory `target`: `size` bytes, `inodes` inodes,
    its root `0710` root:`gid` (the range's root group, which bwrap runs as), private.

    Raises:
        OSError: the kernel refused (the mount is undone).
    """
    data = f"size={size},nr_inodes={inodes},mode=0710,uid=0,gid={gid}"
    _call(b"osb-sandbox-disk", target, b"tmpfs", MS_NOSUID | MS_NODEV, data)
    try:
        _call(None, target, None, MS_PRIVATE, "")
    except OSError:
        unmount(target)
        raise


def resize(target: Path | int, size: int, inodes: int) -> None:
    """Give the tmpfs at `target` (a path, or the descriptor of a detached one's root,
    `detach`) new limits (in use or not).

    Raises:
        OSError: the kernel refused (EINVAL: it already holds more than the new limits).
    """
    if isinstance(target, int):
        _reconfigure(target, {"size": str(size), "nr_inodes": str(inodes)})
        return
    data = f"size={size},nr_inodes={inodes}"
    _call(None, target, None, MS_REMOUNT | MS_NOSUID | MS_NODEV, data)


def detach(target: Path) -> int:
    """Detach the tmpfs at `target` from this mount namespace, once the sandbox's bwrap has
    its copy; returns a descriptor (`O_PATH`) of its root, through which the server keeps
    reaching it (`/proc/<pid>/fd/N`, `resize`); the filesystem lives while that descriptor
    or a sandbox's mount holds it.

    Raises:
        OSError: it could not be opened or detached (nothing is left open).
    """
    fd = os.open(target, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        if os.stat(target).st_dev == os.stat(target.parent).st_dev:
            raise OSError(f"{target} is not a mount point")
        if _libc().umount2(bytes(target), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"umount {target}: {os.strerror(err)}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _reconfigure(root_fd: int, options: Mapping[str, str]) -> None:
    """Set `options` of the filesystem whose root `root_fd` holds, mounted anywhere or
    detached: fspick(2) and fsconfig(2) (Linux 5.2; mount(2)'s MS_REMOUNT needs a mount of
    the caller's namespace). ENOSYS where the numbers differ (mips): a claimed spare fails
    and the create starts cold, its sizes given at mount."""
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    picked = libc.syscall(SYS_FSPICK, root_fd, b"", FSPICK_CLOEXEC | FSPICK_EMPTY_PATH)
    if picked < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"fspick: {os.strerror(err)}")
    try:
        for key, value in options.items():
            if (
                libc.syscall(
                    SYS_FSCONFIG, picked, FSCONFIG_SET_STRING, key.encode(), value.encode(), 0
                )
                < 0
            ):
                err = ctypes.get_errno()
                raise OSError(err, f"tmpfs {key}={value}: {os.strerror(err)}")
        if libc.syscall(SYS_FSCONFIG, picked, FSCONFIG_CMD_RECONFIGURE, None, None, 0) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"tmpfs reconfigure: {os.strerror(err)}")
    finally:
        os.close(picked)


def unmount(target: Path) -> None:
    """Detach the tmpfs at `target` (lazily: its memory goes with its last user); errors
    ignored (not mounted)."""
    _libc().umount2(bytes(target), MNT_DETACH)


def limit_inside(init_fd: int, init: int, size: int, inodes: int) -> None:
    """Give the writable tmpfs bwrap made (a server not root) `size` bytes and `inodes`
    inodes between them (`split`), from inside the mount namespace of the sandbox's init
    `init` (`init_fd` its pidfd) and its owner (`remount_inside`); OSError if refused."""
    mntns = spawn.namespace(init_fd, init, "mnt")
    try:
        userns = spawn.owning_user_namespace(mntns)
        try:
            remount_inside(userns, mntns, split(size, inodes))
        finally:
            os.close(userns)
    finally:
        os.close(mntns)


def split(size: int, inodes: int) -> dict[str, tuple[int, int]]:
    """Each writable directory's bytes (whole pages) and inodes of a sandbox's `size` and
    `inodes` (a server not root: `SHARES`); together no more than those."""
    return {
        place: (max(size * share // 1000 // PAGE * PAGE, PAGE), max(inodes * share // 1000, 8))
        for place, share in SHARES.items()
    }


def remount_inside(userns: int, mntns: int, limits: Mapping[str, tuple[int, int]]) -> None:
    """Give the sandbox's tmpfs at each place of `limits` (its paths) its bytes and inodes,
    from inside its user namespace `userns` and mount namespace `mntns` (descriptors; see the
    module docstring). Call it only while nothing of the sandbox's own has run: the places
    are resolved in its tree.

    Raises:
        OSError: the kernel refused (EINVAL: a tmpfs already holds more than the new limits).
    """
    argv = [sys.executable, "-I", "-S", "-c", REMOUNT, str(userns), str(mntns)]
    for place, (size, inodes) in limits.items():
        argv += [place, str(size), str(inodes)]
    try:
        done = subprocess.run(
            argv,
            pass_fds=(userns, mntns),
            capture_output=True,
            timeout=REMOUNT_TIMEOUT,
            env={},
        )
    except subprocess.SubprocessError as exc:
        raise OSError(f"the sandbox's disk limits could not be set ({exc})") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()[-300:] or f"exit {done.returncode}"
        raise OSError(f"the sandbox's disk limits could not be set ({said})")
