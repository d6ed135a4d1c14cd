"""The package sandboxes run: a private copy of osb_sync's files, one per server process.

Every sandbox runs the server's `execd/`, `http/` and `protocol.py`, and opens more of them
while it lives: each Python worker starts `_worker.py` by path, modules are imported late.
Bound from the installed package, they went with it when `pip install` replaced its files
under a running server: warm spares and pooled sandboxes answered `DeadKernelError`.

So the first server a process starts copies the package (`snapshot`): every file but bytecode,
read once, hashed (SHA-256 of names and contents) as it is written into a directory of its
own, `osb-local-package-<hash>-*` in TMPDIR, or in `/tmp` where the sandboxes' root could not
reach TMPDIR (`parent_dir`), where the modules a container imports are then compiled. It is
made by `mkdtemp` (0700: no other user reaches in while it is made), then opened to all: 0755
and 0644 whatever the umask (the sandboxes' ids read it, only the server writes it). Its hash
in the name is a guess any user can make: where another took the name first, the copy keeps
`mkdtemp`'s. Containers bind that copy (`bwrap.package_dir`), the execd template and an
unisolated execd run from it (`pinned`), for the whole life of the process: what a sandbox
needs of the package is fixed for its lifetime. The copy is of the files the process imported
its own modules from, at its first start; a later server of the same process shares it.

The copy goes at the process's exit; a killed process's is removed by the next server's
`recovery.sweep_strays`, as its state directory is (the copy holds a lock, `recovery.claim`,
which the kernel lets go with the process).

`Snapshot.changed` says whether the installed package now differs from the copy: one stat of
each file, and its contents hashed again only where a stat differs (a reinstall of the same
files changes nothing). The server checks it at each create and logs a warning, once, naming a
restart: new sandboxes still run the copy, but the server's own code stays the version it
started with until it restarts. A create stats only the package's directories (a few): a
reinstall removes and writes files, changing each directory, and is seen at the next create;
every file is stat'ed at a create at most once per `FILES_INTERVAL`, which sees a file
rewritten in place (its directory unchanged) within that time. Stat'ing every file at each
create cost 2-15 ms of the server's CPU. A directory changed within `RACY_SECONDS` of its stat
could change again unseen (the same coarse time, an inode reused): until a stat finds every
directory older, every create stats every file (git's racy-clean rule).
"""

from __future__ import annotations

import atexit
import compileall
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import recovery

logger = logging.getLogger("osb_sync.local")

PREFIX = f"{recovery.STRAY_PREFIX}package-"
SKIPPED = "__pycache__"
# (name relative to the package, size, mtime in ns, inode) of each file, in name order
Marks = tuple[tuple[str, int, int, int], ...]
# (name relative to the package, "." for itself; ctime in ns, inode) of each directory: its
# ctime, not its mtime, which a copy that keeps times (`cp -a`, `copytree`) sets back
DirMarks = tuple[tuple[str, int, int], ...]
FILES_INTERVAL = 10.0  # seconds between two stats of every file (`Snapshot.changed`)
RACY_SECONDS = 2.0  # a directory changed this recently may change again with the same stat


def installed_dir() -> Path:
    """The directory of the installed osb_sync package this process imported."""
    return Path(__file__).resolve().parents[2]


def _files(package: Path) -> list[Path]:
    """The package's regular files, bytecode caches left out, in name order."""
    found = []
    for parent, dirs, names in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != SKIPPED)
        for name in sorted(names):
            path = Path(parent, name)
            if stat.S_ISREG(path.lstat().st_mode):
                found.append(path)
    return sorted(found, key=lambda path: path.relative_to(package).as_posix())


def marks(package: Path) -> Marks:
    """What a stat says of each file of `package` (`Marks`)."""
    result = []
    for path in _files(package):
        info = path.lstat()
        name = path.relative_to(package).as_posix()
        result.append((name, info.st_size, info.st_mtime_ns, info.st_ino))
    return tuple(result)


def dir_marks(package: Path, names: tuple[str, ...] | None = None) -> DirMarks:
    """What a stat says of `package` and each directory below it (bytecode caches left out),
    or of the directories `names` only (a few stats, no listing).

    Raises:
        OSError: one of `names` is gone.
    """
    if names is None:
        found = []
        for parent, dirs, _ in os.walk(package):
            dirs[:] = [d for d in dirs if d != SKIPPED]
            found.append(Path(parent).relative_to(package).as_posix())
        names = tuple(sorted(found))
    result = []
    for name in names:
        info = os.lstat(os.path.join(package, name))
        result.append((name, info.st_ctime_ns, info.st_ino))
    return tuple(result)


def settled(dirs: DirMarks, at_ns: int) -> DirMarks | None:
    """`dirs` (stat'ed at `at_ns`, `time.time_ns()`'s) where each changed `RACY_SECONDS` or
    more before: a later change shows in them; else None."""
    newest = max((ctime for _, ctime, _ in dirs), default=0)
    return dirs if newest < at_ns - RACY_SECONDS * 1e9 else None


def _add(digest: Any, name: str, data: bytes) -> None:  # a hashlib object
    encoded = name.encode("utf-8", "surrogateescape")
    digest.update(b"%d:%b%d:" % (len(encoded), encoded, len(data)))
    digest.update(data)


def content_hash(package: Path) -> str:
    """The SHA-256 of the names and contents of `package`'s files (what `snapshot` copies)."""
    digest = hashlib.sha256()
    for path in _files(package):
        _add(digest, path.relative_to(package).as_posix(), path.read_bytes())
    return digest.hexdigest()


@dataclass
class Snapshot:
    """The process's copy of the package (see the module docstring)."""

    path: Path  # the copy's package directory (`osb_sync`)
    digest: str  # `content_hash` of the copy
    installed: Path  # the package it was copied from
    marks: Marks  # the installed files' `marks` as they were copied
    dirs: DirMarks | None  # the installed directories' `dir_marks` where `settled`
    owner: int = field(default_factory=os.getpid)
    files_checked: float = field(default_factory=time.monotonic)  # when `marks` were compared
    _reported: str = ""  # the installed hash `changed` reported
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def pinned(self, path: str) -> str:
        """`path` of the installed package in the copy; any other path unchanged."""
        installed = str(self.installed)
        if path == installed or path.startswith(installed + os.sep):
            return str(self.path) + path[len(installed) :]
        return path

    def changed(self, now: float | None = None) -> str | None:
        """The installed package's hash the first time its files differ from the copy's (a
        warning is due), else None: a restart is due from then on, and a reinstall under way
        is seen half done. Its files are stat'ed where a directory changed, or where
        `FILES_INTERVAL` passed since they last were (at `now`, `time.monotonic()`'s)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._reported:
                return None
            if now - self.files_checked < FILES_INTERVAL and self.dirs is not None:
                try:
                    names = tuple(name for name, _, _ in self.dirs)
                    if dir_marks(self.installed, names) == self.dirs:
                        return None
                except OSError:  # a directory gone: a reinstall
                    pass
            self.files_checked = now
            try:
                dirs = settled(dir_marks(self.installed), time.time_ns())
                files = marks(self.installed)
                if files == self.marks:
                    self.dirs = dirs
                    return None
                digest = content_hash(self.installed)
            except OSError:  # half removed, half written: a reinstall under way
                digest = "(unreadable)"
            else:
                if digest == self.digest:
                    self.marks, self.dirs = files, dirs  # the same files written again
                    return None
            self._reported = digest
            return digest


_current: Snapshot | None = None
_taking = threading.Lock()


def take(installed: Path, parent: Path | None = None) -> Snapshot:
    """Copy the package `installed` into a new directory of `parent` (TMPDIR) and compile the
    modules a container imports there.

    Raises:
        OSError: the copy cannot be made (nothing is left behind).
    """
    dirs, before = settled(dir_marks(installed), time.time_ns()), marks(installed)
    where = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    try:
        lock = recovery.claim(where)
        copy = where / installed.name
        copy.mkdir(0o755)
        digest = hashlib.sha256()
        for path in _files(installed):
            name = path.relative_to(installed).as_posix()
            data = path.read_bytes()
            _add(digest, name, data)
            target = copy / name
            target.parent.mkdir(0o755, parents=True, exist_ok=True)
            with open(target, "xb") as out:
                out.write(data)
            target.chmod(0o644)
        local = copy / "local"
        for side in ("http", "execd"):
            compileall.compile_dir(local / side, maxlevels=0, quiet=2)
        compileall.compile_file(local / "protocol.py", quiet=2)
        _readable_by_all(copy)  # mkdtemp's 0700 kept all others out until now
        where.chmod(0o755)
        named = where.with_name(f"{PREFIX}{digest.hexdigest()[:16]}-{where.name[len(PREFIX) :]}")
        try:
            where.rename(named)
        except OSError:  # another user took the name (it can be guessed): keep mkdtemp's
            named = where
    except BaseException:
        shutil.rmtree(where, ignore_errors=True)
        raise
    taken = Snapshot(named / installed.name, digest.hexdigest(), installed, before, dirs)
    atexit.register(_remove, taken, lock)
    return taken


def _readable_by_all(copy: Path) -> None:
    """Directories 0755 and files 0644 in `copy`, whatever the umask made of them (0700: the
    sandboxes' ids could not read it; 0777: anyone could plant bytecode in `__pycache__`).
    Only the server has reached it yet: no link in it to follow."""
    copy.chmod(0o755)
    for parent, dirs, names in os.walk(copy):
        for name in dirs:
            Path(parent, name).chmod(0o755)
        for name in names:
            Path(parent, name).chmod(0o644)


def parent_dir() -> Path:
    """Where the copy goes: TMPDIR, or `/tmp` where the sandboxes' root could not reach it
    in TMPDIR (one only its user may search, such as `$XDG_RUNTIME_DIR`): bwrap binds the copy
    by name, as the range's root."""
    here = Path(tempfile.gettempdir()).resolve()
    for directory in (here, *here.parents):  # `bwrap.reachable` for any user
        try:
            if not directory.stat().st_mode & 0o001:
                return recovery.stray_parents()[-1]
        except OSError:
            return recovery.stray_parents()[-1]
    return here


def _remove(taken: Snapshot, lock: int) -> None:
    if os.getpid() == taken.owner:  # not in a forked child that exits
        shutil.rmtree(taken.path.parent, ignore_errors=True)
        os.close(lock)


def snapshot() -> Snapshot:
    """The process's copy of its package, taken at the first call (`take`).

    Raises:
        OSError: the copy cannot be made.
    """
    global _current
    with _taking:
        if _current is None or _current.owner != os.getpid():
            _current = take(installed_dir(), parent_dir())
        return _current


def pinned(path: str) -> str:
    """`path` of the installed package in the process's copy (`Snapshot.pinned`)."""
    return snapshot().pinned(path)


def warn_if_changed() -> None:
    """Log a warning, once, when the installed package differs from the copy."""
    taken = snapshot()
    digest = taken.changed()
    if digest is not None:
        logger.warning(
            "local server: the osb_sync package in %s changed since the server started (a"
            " reinstall?): sandboxes keep running the copy it started with (%s), but the"
            " server's own code is the old one: restart the server to run the new one",
            taken.installed,
            taken.digest[:16],
        )
