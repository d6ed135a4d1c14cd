"""What a server killed without a chance to clean up leaves behind, and how a start reaps it.

A server owns its state directory by an exclusive `flock` on `LOCK_NAME` in it, held for its
whole life; the kernel lets go when the process dies, however it dies. So "the owner is gone"
is exactly "the lock can be taken", with no pid that could have been reused.

Sandboxes end with the server that started them (bwrap's `--die-with-parent`); a sandbox is
never carried over: after a restart its id answers 404. What can outlive a killed server, and
what `reap` removes, sandbox by sandbox (each is named by its id, a directory of the state
directory or of its `.spares/`), with one log line each:

- processes: every process in the sandbox's cgroups (an inner bwrap still setting up holds
  them forever), and, without cgroups, every process whose working directory is inside it;
- its cgroups, of any age, in every controller (only groups named by an id of this state
  directory: other servers' groups share the parent);
- mounts below its directories (lazily detached): its disk's tmpfs (`disk.py`), an image's
  overlay, staged binds;
- its directories, with the staging files of uploads cut short.

`sweep_strays` does the same for `osb-local-*` temporary directories whose server is gone, of
this user only (TMPDIR may be a shared `/tmp`: another user's, or a symlink, is left alone).
A directory without a lock file (made by an older version) is left alone: its owner cannot be
known.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import re
import shutil
import signal
import stat
import tempfile
from pathlib import Path

from . import cgroup
from .images import inside

logger = logging.getLogger("osb_sync.local")

LOCK_NAME = ".osb-server.lock"
SPARES_DIR = ".spares"  # under the server's root, which holds sandboxes only (`spares.py`)
STRAY_PREFIX = "osb-local-"

_SANDBOX = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}(\.run)?")
MNT_DETACH = 2


class StateDirBusy(RuntimeError):
    """Another live server holds the state directory."""


def check_owner(root: Path) -> None:
    """Refuse a state directory `root` that this server's user does not own, or that others
    may write: whoever may write it could swap its entries (run directories, volumes, the
    lock) for links to anywhere, or read what sandboxes keep there.

    Raises:
        StateDirBusy: it is not the server's to use, with the fix.
    """
    info = root.stat()  # a link to it is the user's choice; what it names is checked
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022:
        return
    raise StateDirBusy(
        f"the state directory {root} is not this server's own (owner uid {info.st_uid}, mode"
        f" {stat.S_IMODE(info.st_mode):o}; it must be a directory of uid {os.geteuid()} that"
        " no one else may write): another user could swap what the server keeps there; give"
        " a directory of your own (or none: a fresh one is made), or chmod go-w it"
    )


def claim(root: Path) -> int:
    """Take the state directory `root` for this process: the descriptor of its held lock.

    A new lock file is locked before it gets its name (a sweep that finds the name finds it
    held), so a directory is never seen unowned while its server starts.

    Raises:
        StateDirBusy: another live server holds it.
        OSError: the lock file cannot be made.
    """
    lock = root / LOCK_NAME
    fresh = root / f"{LOCK_NAME}.{os.getpid()}"
    fd = os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        os.link(fresh, lock)
    except FileExistsError:  # a server had it: take it over if that one is gone
        os.close(fd)
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateDirBusy(
                f"another local server is running on the state directory {root}: stop it, or"
                " give this one a directory of its own"
            ) from None
    finally:
        fresh.unlink(missing_ok=True)
    os.ftruncate(fd, 0)
    os.write(fd, b"%d\n" % os.getpid())
    return fd


def owner_gone(root: Path) -> bool:
    """True when `root` has a lock file and no live process holds it."""
    try:
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the probe's lock, if it got it


def sandbox_ids(root: Path) -> dict[str, list[Path]]:
    """Each sandbox id found in `root` (and its `.spares/`), with its directories there."""
    found: dict[str, list[Path]] = {}
    for directory in (root, root / SPARES_DIR):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if _SANDBOX.fullmatch(name):
                found.setdefault(name.removesuffix(".run"), []).append(directory / name)
    return found


def reap(root: Path, place: cgroup.Place = cgroup.OWN) -> int:
    """Remove what dead servers left in `root` (see the module docstring); how many sandboxes.

    Call it only while holding `root` (`claim`), or once its owner is gone (`owner_gone`).
    """
    leftovers = sandbox_ids(root)
    for sandbox_id, dirs in sorted(leftovers.items()):
        groups = cgroup.leftover_groups(sandbox_id, place)
        killed = cgroup.kill_members(groups)
        killed += _kill_by_cwd(dirs)
        cgroup.remove_groups(groups)
        unmounted = _unmount_below(dirs)
        for path in dirs:
            if path.is_symlink():  # a home on the sandbox's tmpfs (`disk.py`)
                path.unlink()
            _remove_tree(path)
        logger.info(
            "local server: reaped sandbox %s of a previous server (%d processes killed, %d"
            " cgroups and %d mounts removed, its directories deleted)",
            sandbox_id,
            killed,
            len(groups),
            unmounted,
        )
    return len(leftovers)


def stray_parents() -> list[Path]:
    """Where a server's temporary directories go: TMPDIR, and `/tmp` (the package's copy, where
    TMPDIR is out of the sandboxes' reach: `package.parent_dir`)."""
    here, shared = Path(tempfile.gettempdir()), Path("/tmp")  # noqa: S108
    return [here] if here == shared else [here, shared]


def _own_directory(path: Path) -> bool:
    """A directory (not a link to one) of this process's user: TMPDIR may be shared, and
    another user's `osb-local-*` there is not a server of ours."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def sweep_strays(parent: Path | None = None, place: cgroup.Place = cgroup.OWN) -> list[Path]:
    """Reap and delete every `osb-local-*` directory of this user in `parent` (TMPDIR) whose
    server is gone (its sandboxes' groups looked for at `place`, this server's)."""
    parent = parent or Path(tempfile.gettempdir())
    removed = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return []
    for name in names:
        path = parent / name
        if name.startswith(STRAY_PREFIX) and _own_directory(path) and owner_gone(path):
            reap(path, place)
            _remove_tree(path)
            logger.info("local server: removed %s, left by a server that is gone", path)
            removed.append(path)
    return removed


def _remove_tree(path: Path) -> None:
    """Remove `path` as far as this user may: a server that is not root but has a range in a
    namespace of it first (an image's copy is its range's, of any depth: `images/inside.py`)."""
    work = inside.of_host() if os.path.lexists(path) else None
    if work is not None:
        with contextlib.suppress(OSError):
            work.remove(path)
    shutil.rmtree(path, ignore_errors=True)


def _kill_by_cwd(dirs: list[Path]) -> int:
    """SIGKILL live processes whose working directory is inside `dirs` (no cgroups)."""
    prefixes = [str(path) for path in dirs]
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if any(cwd == prefix or cwd.startswith(prefix + os.sep) for prefix in prefixes):
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def mount_points() -> list[str]:
    """This mount namespace's mount points (octal escapes of /proc/self/mountinfo decoded)."""
    try:
        with open("/proc/self/mountinfo", "rb") as info:
            lines = info.read().splitlines()
    except OSError:
        return []
    points = []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4])
            points.append(os.fsdecode(raw))
    return points


def unmount_below(root: Path) -> int:
    """Detach every mount below `root` before a server removes it: a container that left one
    (a bug, logged) would hold the directory, whose lock file goes with the removal, so no
    later start could tell it was this server's and reap it. How many there were."""
    count = _unmount_below([root])
    if count:
        logger.warning("local server: %d mounts were left below %s; detached", count, root)
    return count


def _unmount_below(dirs: list[Path]) -> int:
    prefixes = [str(path) for path in dirs]
    below = [
        point
        for point in mount_points()
        if any(point == prefix or point.startswith(prefix + os.sep) for prefix in prefixes)
    ]
    libc = ctypes.CDLL(None, use_errno=True)
    count = 0
    for point in sorted(below, key=len, reverse=True):  # the deepest first
        if libc.umount2(os.fsencode(point), MNT_DETACH) == 0:
            count += 1
    return count
