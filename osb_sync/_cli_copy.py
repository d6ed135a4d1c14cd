"""``osb-sync cp``: files and directories between this machine and a sandbox.

Out of a sandbox, every name, size and type comes from its execd, which code running as root in
the sandbox can replace: the copy stays in DEST whatever execd answers.

- The copy's name in DEST is the last component of the user's PATH (as ``docker cp``), never a
  name execd answered: for a relative PATH execd says which directory it resolved it to, and
  only what lies beneath that comes from execd. A PATH that names no component (``.``, ``..``,
  ``/``) copies a directory's contents into DEST. DEST itself is the user's, followed if it is
  a symlink; nothing the copy finds or makes beneath it is, nor what an earlier copy left
  there (``DEST/NAME`` a symlink stops the copy).
- An entry of a directory is copied when it lies beneath the directory asked for and what
  follows that directory in its path is a clean relative path (no ``..``, ``.`` or empty
  component, not absolute); any other entry stops the copy (exit 1, the entry named).
  ``Files.search`` already refuses such an entry when the directory was given as an absolute
  path; the check here holds for a relative one too.
- Files are written under a descriptor of DEST, never through a path string: each directory on
  the way is opened with ``O_DIRECTORY | O_NOFOLLOW`` from its parent's descriptor (a symlink
  there, planted before the copy or by another process during it, stops the copy), and each
  file is created under a temporary name with ``O_CREAT | O_EXCL | O_NOFOLLOW``, then renamed
  over its name (a rename replaces a symlink, it never writes through one).
- Each file streams, ``CHUNK_SIZE`` at a time, and must be as long as the listing said: a longer
  one is refused at the first chunk past its size (an endless download ends), a shorter one at
  its end (a file that changed during the copy: copy it again). It gets the permission bits
  and mtime the listing said, without setuid, setgid or sticky bit (in the tar stream too),
  and without the bits of the umask (as a user's tar and cp: a sandbox's 0777 is no
  world-writable file here).
- Disk use is bounded by the listing: each file is exactly as long as it says, and what it says
  adds up to must fit in the space free where DEST is, checked before the first byte is written
  (a sandbox may claim any size, up to 2**63 - 1 bytes a file, and stream zeros to match).
  Each directory and link counts a block and an inode, each file an inode.
  Directories are walked one level at a time, two descriptors open at most, however deep an
  entry is (its path is shorter than PATH_MAX: ``Files`` refuses a longer one).
- Files are copied by execd's API. Symlinks and directories, which it does not tell (no
  link's text in a ``FileInfo``, no directory in a search), come from ``SPECIALS_SCRIPT`` run
  in the sandbox (bash, find, od, readlink): each name and link text in hex, every name checked
  as a search's entry is (a bad one, or a line that is not the script's, stops the copy).
  Symlinks are made after the files, each under a temporary name renamed over its own (never
  over a directory), so no write of the copy goes through a link it made; what they say is
  kept as it is, never followed here. Then every directory, deepest first, is made if it is
  empty and given the mode and mtime ``files.info`` says (through its descriptor). Where the
  script cannot run, one warning says what was not copied. A FIFO,
  device or socket is skipped with a warning. A SRC that is a symlink is copied as the link
  it is (``LINK_SCRIPT`` says what it says), one that is not a file, directory or link is
  refused (execd's download would follow a link to anything).
- ``-`` writes a tar stream whose names are ``BASE/REMAINDER`` (clean and relative), whose
  modes have no setuid, setgid or sticky bit, each file streamed at the size the listing said.

Into a sandbox, paths are the user's own; a tar archive on standard input keeps only members
that stay beneath the destination, and streams (a member of ``SPOOL_FROM`` bytes or more is read
from stdin as it is sent; smaller ones are sent ``BATCH_BYTES`` at a time). Files keep their
permission bits, and directories (empty ones too) are made after the files, deepest first, with
theirs. Then files and directories get their mtimes (whole seconds) from ``touch`` run in the
sandbox, execd's API having no way to set one; where it fails, one warning says they were not
kept. Symlinks, never followed here (a local one is not read through, a tar member is a
link), are made last with ``ln -s`` in the sandbox, so no write of the copy goes through one;
where that fails, one warning says they were not copied.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import posixpath
import secrets
import stat
import sys
import tarfile
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from ._cli_options import CopyOptions, GlobalOptions, Refused, UsageError
from ._cli_output import EXIT_NOT_FOUND
from ._cli_sandboxes import resolve_id
from ._errors import ApiError, NotFoundError, OutputLimitExceeded
from ._models import FileInfo
from ._sandbox import Sandbox

# What opening or renaming beneath DEST answers when DEST's tree is not what the copy needs
# (a symlink or a file where a directory goes, a directory where a file goes).
_CONFLICTS = (errno.ENOTDIR, errno.ELOOP, errno.EISDIR, errno.ENOTEMPTY)
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# The sandbox's symlinks (with what each says) and directories below "$1", which execd's API
# does not tell (a search lists files): each name, and each link's text, in hex (any byte
# crosses a text stream).
SPECIALS_HEAD, SPECIALS_END = "osb-sync-specials 1", "osb-sync-specials end"
SPECIALS_SCRIPT = f"""command -v find >/dev/null && command -v od >/dev/null || exit 127
cd -- "$1" || exit 3
hex() {{ od -An -v -tx1 | tr -d ' \\n'; }}
echo '{SPECIALS_HEAD}'
find . -mindepth 1 \\( -type l -o -type d \\) -print0 |
while IFS= read -r -d '' p; do
  name=$(printf %s "${{p#./}}" | hex)
  if [ -L "$p" ]; then printf 'l %s %s\\n' "$name" "$(readlink -- "$p" | hex)"
  else printf 'd %s\\n' "$name"; fi
done
[ "${{PIPESTATUS[0]}}" -eq 0 ] || exit 5
echo '{SPECIALS_END}'"""
# What the symlink "$1" says, as that listing would give a link named "l".
LINK_SCRIPT = f"""command -v od >/dev/null || exit 127
echo '{SPECIALS_HEAD}'
printf 'l 6c %s\\n' "$(readlink -- "$1" | od -An -v -tx1 | tr -d ' \\n')"
echo '{SPECIALS_END}'"""
SPECIALS_BYTES = 16 << 20  # of that listing's output
# its lines at most: a million short ones took some 300 MiB to hold and check (a search is
# bounded at some 80 000 files)
SPECIALS_ENTRIES = 100_000
LINK_MAX = 4095  # bytes of a symlink's text (PATH_MAX less its NUL)
INFO_BATCH = 64  # paths a files.info call asks for (they go in its query string)
SPOOL_FROM = 1 << 20  # a tar member this large goes in a request of its own, streamed
BATCH_BYTES = 8 << 20  # smaller members are sent together, this much held at most
LATEST = 253402300799  # 9999-12-31T23:59:59Z, the last mtime `touch -t` takes (4 digits)
ARGUMENT_BYTES = 64 * 1024  # of paths in one `touch` or `ln` run going in
# `ln -s` of each (what it says, path) pair of its arguments, a missing parent made first (a
# tar may name none), stopping at the first failure: a path taken, and a directory (or a link
# to one) there, where ln would make the link inside it
LINKS_SCRIPT = (
    'while [ "$#" -gt 1 ]; do case $2 in */*) mkdir -p -- "${2%/*}" || exit;; esac;'
    ' if [ -d "$2" ]; then echo "ln: $2: a directory is there" >&2; exit 1; fi;'
    ' ln -s -- "$1" "$2" || exit; shift 2; done'
)


def cmd_cp(cli: GlobalOptions, copy: CopyOptions) -> int:
    """``osb-sync cp SRC DEST``: one side is ``SANDBOX:PATH``; ``-`` is a tar stream."""
    src, dest = _split_remote(copy.src), _split_remote(copy.dest)
    if (src is None) == (dest is None):
        raise UsageError(
            "cp copies between this machine and a sandbox: exactly one of SRC and DEST is "
            f"SANDBOX:PATH (got {copy.src!r} and {copy.dest!r})"
        )
    with cli.client() as client:
        if src is not None:
            sandbox = client.connect(resolve_id(client, src[0]))
            try:
                return _copy_out(sandbox, src[1], copy.dest)
            except ApiError as exc:
                if exc.code == "INVALID_RESPONSE":
                    raise Refused(str(exc)) from None
                raise
        assert dest is not None
        sandbox = client.connect(resolve_id(client, dest[0]))
        return _copy_in(sandbox, copy.src, dest[1])


def _split_remote(spec: str) -> tuple[str, str] | None:
    """``SANDBOX:PATH`` as (id, path), or None for a local path (or ``-``)."""
    if spec == "-" or spec.startswith(("/", ".")):
        return None
    sandbox_id, sep, path = spec.partition(":")
    if not sep or not sandbox_id or "/" in sandbox_id:
        return None
    return sandbox_id, path or "."


def _remote_info(sandbox: Sandbox, path: str) -> FileInfo | None:
    try:
        return next(iter(sandbox.files.info(path).values()), None)
    except NotFoundError:
        return None


# -- out of a sandbox ---------------------------------------------------------------------------


def _copy_out(sandbox: Sandbox, path: str, dest: str) -> int:
    """A sandbox's file or directory to a local path, or as a tar archive to stdout."""
    info = _remote_info(sandbox, path)
    if info is None:
        print(f"osb-sync: error: no such file in the sandbox: {path}", file=sys.stderr)
        return EXIT_NOT_FOUND
    name = _local_name(path)
    if info.type == "symlink" and name:
        return _copy_out_link(sandbox, path, name, dest)
    is_dir = info.type.lower().startswith("dir")
    if is_dir:
        top = _absolute(path) or info.path
        specials = _specials(sandbox, top)
        files = [(_remainder(item, top), item) for item in _search(sandbox, path)]
        files = [(rest, item) for rest, item in files if _regular(item, specials is not None)]
    else:
        specials = None
        _refuse_irregular(info)
        if not name:
            raise Refused(f"the sandbox says {path!r} is a file, but it names no file")
        info = replace(info, path=path)  # the file the user named, at the size execd said
        files = [("", info)]
    directories, links = _special_entries(sandbox, top if is_dir else "", specials)
    if dest == "-":
        _write_tar(sandbox, files, name, directories, links)
        return 0
    target = Path(dest)
    if not is_dir:
        if target.is_dir():
            target = target / name
        with _Tree(target.parent) as tree, contextlib.closing(_exactly(sandbox, info)) as data:
            tree.check_room(info.size)
            tree.write(target.name, data, info.path, _stamp(info))
        return 0
    with _Tree(target, name if target.is_dir() else "") as tree:
        tree.check_room(sum(i.size for _, i in files), len(directories) + len(links), len(files))
        for rest, item in files:
            with contextlib.closing(_exactly(sandbox, item)) as data:
                tree.write(rest, data, item.path, _stamp(item))
        for rest, text in links:  # after the files: nothing of the copy is written through one
            tree.link(rest, f"{top}/{rest}", text)
        for rest, stamp in directories:  # made if empty; modes and mtimes last, deepest first
            tree.make_directory(rest, f"{top}/{rest}", stamp)
    return 0


def _search(sandbox: Sandbox, path: str) -> list[FileInfo]:
    """The files below the sandbox's ``path`` (``files.search``), each one execd can download.

    Raises:
        Refused: a file whose name is not UTF-8, which execd's API names as no file (ours with
            a lone surrogate, OpenSandbox's with U+FFFD in its place), before anything is
            written: its download would fail half way.
    """
    try:
        found = sandbox.files.search(path)
    except ApiError as exc:
        if exc.code == "INVALID_RESPONSE" and "(a lone surrogate)" in str(exc):
            raise Refused(_not_utf8(str(exc))) from None
        raise
    for item in found:
        if "\ufffd" in item.path and _remote_info(sandbox, item.path) is None:
            raise Refused(_not_utf8(f"execd said {item.path!r}, and no such file is there"))
    return found


def _not_utf8(said: str) -> str:
    return (
        "the sandbox has a file whose name is not UTF-8, which execd's API (names as UTF-8"
        " text) cannot name to download it: rename it in the sandbox, or copy a tar archive"
        f" made there; nothing was copied ({said})"
    )


def _copy_out_link(sandbox: Sandbox, path: str, name: str, dest: str) -> int:
    """A SRC that is a symlink, copied as the link it is (docker cp without -L): what it says
    comes from ``LINK_SCRIPT`` in the sandbox."""
    lines = _specials(sandbox, path, LINK_SCRIPT)
    links = _special_entries(sandbox, path, lines)[1]
    if len(links) != 1:
        raise Refused(f"{path!r} is a symlink, and the sandbox did not say where it points")
    text = links[0][1]
    if dest == "-":
        _write_tar(sandbox, [], "", [], [(name, text)])
        return 0
    target = Path(dest)
    if target.is_dir():
        target = target / name
    with _Tree(target.parent) as tree:
        tree.link(target.name, path, text)
    return 0


def _specials(sandbox: Sandbox, top: str, script: str = "") -> list[str] | None:
    """The lines of the sandbox's listing of its symlinks and directories below ``top``
    (``SPECIALS_SCRIPT``: execd's API tells neither a link's text nor a directory in a
    search), or None, with one warning, where the sandbox cannot run it."""
    try:
        done = sandbox.commands.run(
            ["bash", "-c", script or SPECIALS_SCRIPT, "bash", top], max_output_bytes=SPECIALS_BYTES
        )
    except OutputLimitExceeded:
        done = None
    text = done.stdout if done is not None else ""
    if text.count("\n") > SPECIALS_ENTRIES + 2:  # counted before any line is held
        raise Refused(_unreadable(f"more than {SPECIALS_ENTRIES} symlinks and directories"))
    lines = text.split("\n")  # the script's line ends only (splitlines takes \r, \x1c...)
    if lines[-1] == "":
        lines.pop()
    if done is None or done.exit_code != 0 or lines[:1] != [SPECIALS_HEAD]:
        why = "its listing passed 16 MiB" if done is None else f"exit {done.exit_code}"
        print(
            "osb-sync: warning: symlinks and empty directories were not copied, nor the modes"
            " and mtimes of directories: the sandbox could not list them (bash, find, od and"
            f" readlink, {why})",
            file=sys.stderr,
        )
        return None
    if lines[-1] != SPECIALS_END:
        raise Refused(_unreadable("its listing ended early"))
    return lines[1:-1]


def _unreadable(what: str) -> str:
    return (
        f"the sandbox's listing of symlinks and empty directories is not readable ({what});"
        " nothing more was copied"
    )


def _special_entries(
    sandbox: Sandbox, top: str, lines: list[str] | None
) -> tuple[list[tuple[str, tuple[int, int | None]]], list[tuple[str, str]]]:
    """The directories (clean relative names, deepest first, with their mode and mtime) and
    symlinks (names, and what each says) of ``_specials``' lines.

    Raises:
        Refused: a line that is not one of the script's, a name that is not a clean relative
            path, a link's text that no link can hold.
    """
    directories: list[str] = []
    links: list[tuple[str, str]] = []
    for line in lines or []:
        kind, *fields = line.split(" ")
        try:
            raw = [bytes.fromhex(field) for field in fields]
        except ValueError:
            raise Refused(_unreadable(f"{line[:80]!r}")) from None
        if kind == "d" and len(raw) == 1:
            directories.append(_special_name(raw[0], top))
        elif kind == "l" and len(raw) == 2:
            text = raw[1][:-1] if raw[1].endswith(b"\n") else raw[1]  # readlink's line end
            if not text or b"\0" in text or len(text) > LINK_MAX:
                raise Refused(_unreadable(f"a link's text of {len(text)} bytes: {line[:80]!r}"))
            links.append((_special_name(raw[0], top), os.fsdecode(text)))
        else:
            raise Refused(_unreadable(f"{line[:80]!r}"))
    directories = list(dict.fromkeys(directories))  # each asked of execd once
    stamps: dict[str, tuple[int, int | None]] = {}
    carried = [rest for rest in directories if _utf8(rest)]  # execd's API takes no other
    for start in range(0, len(carried), INFO_BATCH):
        try:
            found = sandbox.files.info(*(f"{top}/{r}" for r in carried[start : start + INFO_BATCH]))
        except NotFoundError:
            found = {}  # one went away since the listing: these keep the default
        stamps.update((path[len(top) + 1 :], _stamp(item)) for path, item in found.items())
    deepest = sorted(directories, key=lambda rest: (-rest.count("/"), rest))
    return [(rest, stamps.get(rest, (0o755, None))) for rest in deepest], links


def _special_name(raw: bytes, top: str) -> str:
    """A name of the sandbox's listing, a clean relative path beneath ``top``.

    Raises:
        Refused: it is not one (it could land outside DEST).
    """
    rest = os.fsdecode(raw)
    parts = rest.split("/")
    if not rest or "\0" in rest or len(raw) >= 4096 or any(p in ("", ".", "..") for p in parts):
        raise Refused(
            f"the sandbox listed {rest[:200]!r} in {top!r}: not a clean path beneath it, so it"
            " could land outside DEST; nothing more was copied"
        )
    return rest


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _stamp(item: FileInfo) -> tuple[int, int | None]:
    """The permission bits and mtime (whole seconds) a copied file gets: the listing's, the
    bits without setuid, setgid or sticky, 0o644 when it has none, no mtime when it has none."""
    when = item.modified_at
    return (item.mode & 0o777) or 0o644, None if when is None else max(0, int(when.timestamp()))


def _local_name(path: str) -> str:
    """The name a copy of the sandbox's ``path`` takes in DEST: the last component of the
    user's own argument, or "" for one that names none (``.``, ``..``, ``/``: the directory's
    contents go into DEST, as ``docker cp SB:DIR/. DEST`` does)."""
    name = posixpath.basename(posixpath.normpath(path))
    return "" if name in ("", ".", "..") else name


def _absolute(path: str) -> str | None:
    """``path`` made clean, when it is absolute (execd resolves a relative one itself)."""
    return "/" + posixpath.normpath(path).lstrip("/") if path.startswith("/") else None


def _remainder(item: FileInfo, top: str) -> str:
    """What follows ``top`` in the entry's path, a clean relative path.

    Raises:
        Refused: the entry is not beneath ``top``, or its remainder could climb out of DEST.
    """
    prefix = top.rstrip("/") + "/"
    rest = item.path[len(prefix) :] if item.path.startswith(prefix) else ""
    if not rest or "\0" in rest or any(p in ("", ".", "..") for p in rest.split("/")):
        raise Refused(
            f"the sandbox listed {item.path!r} in {top!r}: not a clean path beneath it, "
            "so it could land outside DEST; nothing was copied"
        )
    return rest


def _regular(item: FileInfo, links_listed: bool = False) -> bool:
    """Whether an entry of a directory is a regular file (the others are skipped, with a
    warning; a symlink silently where the sandbox's own listing brings links)."""
    if item.type == "file":
        return True
    if item.type == "symlink" and links_listed:
        return False
    print(f"osb-sync: warning: skipped {item.path!r}: {_irregular(item)}", file=sys.stderr)
    return False


def _refuse_irregular(item: FileInfo) -> None:
    """Raise Refused unless the SRC itself is a regular file."""
    if item.type != "file":
        raise Refused(f"{item.path!r} is {_irregular(item)}: copy what it points to by its path")


def _irregular(item: FileInfo) -> str:
    if item.type == "symlink":
        return "a symlink, and execd does not say where it points"
    return f"of type {item.type!r}, not a regular file"


def _exactly(sandbox: Sandbox, item: FileInfo) -> Generator[bytes, None, None]:
    """The file's bytes, as many as its listing said.

    Raises:
        Refused: execd sent more (at the first chunk past them) or fewer.
    """
    left = item.size
    with contextlib.closing(sandbox.files.iter_bytes(item.path)) as chunks:
        for chunk in chunks:
            if len(chunk) > left:
                raise Refused(
                    f"the download of {item.path!r} passed the {item.size} bytes its listing "
                    "said (a file that grew during the copy, or a lying sandbox); stopped there"
                )
            left -= len(chunk)
            yield chunk
    if left:
        raise Refused(
            f"the download of {item.path!r} ended {left} bytes short of the {item.size} its "
            "listing said (the file changed during the copy?)"
        )


class _Tree:
    """A local directory (made if need be), written beneath through descriptors only: ``root``
    (the user's, followed if it is a symlink), or its entry ``below`` (never followed: it may
    be a symlink an earlier copy made)."""

    def __init__(self, root: Path, below: str = ""):
        root.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if below:
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(below, dir_fd=self._fd)
                child = os.open(below, _DIRECTORY, dir_fd=self._fd)
            except OSError as exc:
                os.close(self._fd)
                if exc.errno not in _CONFLICTS:
                    raise
                raise Refused(
                    f"{str(root / below)!r} is a symlink or a file, and the copy goes beneath"
                    f" it ({os.strerror(exc.errno)}): DEST is followed, what is in it never;"
                    " nothing was copied"
                ) from None
            os.close(self._fd)
            self._fd = child

    def __enter__(self) -> _Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)

    def write(
        self, relative: str, chunks: Iterator[bytes], entry: str, stamp: tuple[int, int | None]
    ) -> None:
        """Write ``chunks`` to ``relative`` (a clean relative path) beneath the root, with
        ``stamp``'s permission bits and mtime.

        Raises:
            Refused: a symlink or a file where a directory of ``relative`` goes, or a
                directory where its file goes.
            OSError: the disk refused (full, read-only, no permission).
        """
        self._beneath(
            relative, entry, lambda parent, name: _write_file(parent, name, chunks, stamp)
        )

    def make_directory(self, relative: str, entry: str, stamp: tuple[int, int | None]) -> None:
        """Make the directory ``relative`` (if it is not there) with ``stamp``'s permission
        bits and mtime, set through its descriptor.

        Raises:
            Refused: a symlink or a file where it, or a directory above it, goes.
        """
        self._beneath(relative, entry, lambda parent, name: _make_directory(parent, name, stamp))

    def link(self, relative: str, entry: str, text: str) -> None:
        """Make ``relative`` a symlink saying ``text``: made under a temporary name, then
        renamed over whatever file is there (a rename never replaces a directory).

        Raises:
            Refused: a directory where it goes, a symlink or file where a directory above it.
        """
        self._beneath(relative, entry, lambda parent, name: _make_link(parent, name, text))

    def _beneath(self, relative: str, entry: str, act: Callable[[int, str], None]) -> None:
        """``act(parent, name)`` with the descriptor of ``relative``'s directory, each level
        made if missing and opened without following a symlink."""
        *directories, name = relative.split("/")
        parent = self._fd
        try:
            for directory in directories:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(directory, dir_fd=parent)
                child = os.open(directory, _DIRECTORY, dir_fd=parent)
                self._close(parent)  # one descriptor a level would run out at depth 1024
                parent = child
            act(parent, name)
        except OSError as exc:
            if exc.errno not in _CONFLICTS:
                raise
            raise Refused(
                f"{entry!r} would be written through a symlink, or over a directory, in DEST "
                f"({os.strerror(exc.errno)}); nothing more was copied"
            ) from None
        finally:
            self._close(parent)

    def _close(self, fd: int) -> None:
        """Close a directory opened on the way (the root stays open)."""
        if fd != self._fd:
            os.close(fd)

    def check_room(self, size: int, others: int = 0, files: int = 1) -> None:
        """Check that ``size`` bytes and ``others`` directories and links (a block and an inode
        each, and an inode each of ``files``) fit in the root's file system (what ordinary
        users may write of it), before anything is written.

        Raises:
            Refused: they do not.
        """
        found = os.fstatvfs(self._fd)
        free = found.f_bavail * found.f_frsize
        needed = size + others * found.f_frsize  # a fragment each at least
        if found.f_files and others + files > found.f_favail:  # 0 inodes: not counted there
            raise Refused(
                f"the sandbox listed {others + files} files, directories and links to copy, more"
                f" than the {found.f_favail} inodes free where DEST is; nothing was copied"
            )
        if needed > free:
            raise Refused(
                f"the sandbox listed {needed} bytes to copy (its files, and a block each of"
                f" {others} directories and links), more than the {free} free where DEST "
                "is; nothing was copied"
            )


def _write_file(
    parent: int, name: str, chunks: Iterator[bytes], stamp: tuple[int, int | None]
) -> None:
    """``chunks`` to a new file beneath ``parent``, renamed over ``name`` once whole, with
    ``stamp``'s permission bits and mtime (when it has one)."""
    temporary = f".osb-sync-{secrets.token_hex(8)}.part"
    fd = os.open(temporary, _NEW_FILE, 0o666, dir_fd=parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            handle.flush()
            mode, mtime = stamp
            os.fchmod(handle.fileno(), mode & ~_umask())
            if mtime is not None:
                os.utime(handle.fileno(), (mtime, mtime))
        os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=parent)
        raise


def _umask() -> int:
    """This process's umask, which the modes a sandbox says lose on this machine (as a user's
    tar and cp apply it): a sandbox's 0o777 is no world-writable file here."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # where /proc tells none (the CLI is one thread here)
    os.umask(mask)
    return mask


def _make_directory(parent: int, name: str, stamp: tuple[int, int | None]) -> None:
    """The directory ``name`` beneath ``parent``, with ``stamp``'s bits and mtime."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=parent)
    fd = os.open(name, _DIRECTORY, dir_fd=parent)
    try:
        mode, mtime = stamp
        os.fchmod(fd, mode & ~_umask())
        if mtime is not None:
            os.utime(fd, (mtime, mtime))
    finally:
        os.close(fd)


def _make_link(parent: int, name: str, text: str) -> None:
    """The symlink ``name`` beneath ``parent`` saying ``text``, renamed over ``name``."""
    temporary = f".osb-sync-{secrets.token_hex(8)}.link"
    os.symlink(text, temporary, dir_fd=parent)
    try:
        os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=parent)
        raise


def _write_tar(
    sandbox: Sandbox,
    files: list[tuple[str, FileInfo]],
    base: str,
    directories: list[tuple[str, tuple[int, int | None]]],
    links: list[tuple[str, str]],
) -> None:
    """A tar stream of ``files`` on standard output, each streamed (bounded memory), then the
    ``directories`` (their modes and mtimes) and the ``links``."""
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as archive:
        for rest, item in files:
            member = tarfile.TarInfo("/".join(p for p in (base, rest) if p))
            member.size = item.size
            mode, mtime = _stamp(item)
            member.mode, member.mtime = mode, mtime or 0
            with contextlib.closing(_exactly(sandbox, item)) as data:
                reader = _Reader(data)
                archive.addfile(member, reader)
                reader.finish()
        for rest, (mode, mtime) in directories:
            member = tarfile.TarInfo("/".join(p for p in (base, rest) if p))
            member.type, member.mode, member.mtime = tarfile.DIRTYPE, mode, mtime or 0
            archive.addfile(member)
        for rest, text in links:
            member = tarfile.TarInfo("/".join(p for p in (base, rest) if p))
            member.type, member.linkname, member.mode = tarfile.SYMTYPE, text, 0o777
            archive.addfile(member)


class _Reader:
    """A file object over chunks, for ``TarFile.addfile`` (which reads the member's size)."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks
        self._pending = b""

    def read(self, size: int = -1, /) -> bytes:
        """``size`` bytes (all that is left for a negative one); fewer only at the end: tarfile
        takes a short read for a truncated file, and a chunk is whatever the wire brought."""
        pieces, have = [self._pending], len(self._pending)
        while size < 0 or have < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            pieces.append(chunk)
            have += len(chunk)
        data = b"".join(pieces)
        cut = len(data) if size < 0 else size
        self._pending = data[cut:]
        return data[:cut]

    def finish(self) -> None:
        """Read the chunks to their end (``_exactly`` then checks the size)."""
        for _ in self._chunks:
            pass


# -- into a sandbox -----------------------------------------------------------------------------


def _copy_in(sandbox: Sandbox, src: str, path: str) -> int:
    """A local file or directory (or a tar archive on stdin) into a sandbox."""
    if src == "-":
        try:
            _copy_in_tar(sandbox, path)
        except tarfile.TarError as exc:  # the producer died half way, or it is no tar
            raise Refused(
                f"standard input is not a whole tar archive ({exc}): the members before the"
                " break were copied, the one at it may be cut short; nothing more was copied"
            ) from None
        return 0
    local = Path(src)
    if local.is_symlink():  # copied as the link it is, as docker cp does without -L
        info = _remote_info(sandbox, path)
        target = posixpath.join(path, local.name) if info and info.type.startswith("dir") else path
        text = os.readlink(local)
        _check_name(target)
        _check_name(text)
        _make_links(sandbox, [(target, text)])
        return 0
    if not local.exists():
        print(f"osb-sync: error: no such local file: {src}", file=sys.stderr)
        return EXIT_NOT_FOUND
    if local.is_file():
        info = _remote_info(sandbox, path)
        target = posixpath.join(path, local.name) if info and info.type.startswith("dir") else path
        _check_name(target)
        with _open_beneath(local.parent, local.name) as handle:
            own = os.fstat(handle.fileno())
            sandbox.files.write(target, handle, mode=own.st_mode & 0o777)
        _set_mtimes(sandbox, [(target, own.st_mtime)])
        return 0
    info = _remote_info(sandbox, path)
    root = posixpath.join(path, local.name) if info is not None else path
    found, files, links = _walk(local)
    for entry in [*found[1:], *files, *(link for link, _ in links)]:
        _check_name(posixpath.join(root, entry.relative_to(local).as_posix()))
    for _, text in links:
        _check_name(text)
    _check_name(root)
    stamps: list[tuple[str, float]] = []
    for file in files:
        relative = file.relative_to(local).as_posix()
        target = posixpath.join(root, relative)
        with _open_beneath(local, relative) as handle:  # what was walked, or nothing
            own = os.fstat(handle.fileno())
            sandbox.files.write(target, handle, mode=own.st_mode & 0o777)
        stamps.append((target, own.st_mtime))
    made = [(posixpath.join(root, p.relative_to(local).as_posix()), p.lstat()) for p in found]
    _make_directories(sandbox, [(target, own.st_mode & 0o777) for target, own in made])
    _make_links(
        sandbox, [(posixpath.join(root, p.relative_to(local).as_posix()), t) for p, t in links]
    )
    _set_mtimes(sandbox, [*stamps, *((target, own.st_mtime) for target, own in made)])
    return 0


def _open_beneath(top: Path, relative: str) -> BinaryIO:
    """The regular file ``relative`` beneath ``top`` (the user's, followed), opened without
    following a symlink on the way: one another process put in place of a file or directory
    since the walk would send what it points to (a file of this machine the sandbox may not
    read).

    Raises:
        Refused: a symlink, or something other than a regular file, is there now.
    """
    parent = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        *directories, name = relative.split("/")
        for directory in directories:
            child = os.open(directory, _DIRECTORY, dir_fd=parent)
            os.close(parent)
            parent = child
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO: no wait
        fd = os.open(name, flags, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in _CONFLICTS:
            raise
        raise Refused(_changed(top, relative, "a symlink or a file")) from None
    finally:
        os.close(parent)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused(_changed(top, relative, "not a regular file"))
    return os.fdopen(fd, "rb")


def _changed(top: Path, relative: str, what: str) -> str:
    return (
        f"{str(top / relative)!r} (or a directory above it) is {what} now, changed since the"
        " copy began: it is never followed; what was copied before it stays, nothing after"
    )


def _walk(top: Path) -> tuple[list[Path], list[Path], list[tuple[Path, str]]]:
    """The directories (``top`` first), regular files and symlinks (with what each says) of a
    local tree, no symlink followed; anything else is skipped with a warning."""
    directories, files, links = [top], [], []
    for parent, names, entries in os.walk(top, onerror=_unlisted):
        for name in sorted([*names, *entries]):
            path = Path(parent, name)
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                links.append((path, os.readlink(path)))
            elif stat.S_ISDIR(mode):
                directories.append(path)
            elif stat.S_ISREG(mode):
                if not os.access(path, os.R_OK):  # found now, not half way through the copy
                    raise Refused(f"cannot read {str(path)!r}: nothing was copied")
                files.append(path)
            else:
                print(
                    f"osb-sync: warning: skipped {str(path)!r}: not a regular file", file=sys.stderr
                )
    return directories, sorted(files), links


def _unlisted(exc: OSError) -> None:
    """A directory of the tree that cannot be listed (os.walk would leave it out, unsaid).

    Raises:
        Refused: always, before anything is sent.
    """
    raise Refused(
        f"cannot read {exc.filename!r} ({exc.strerror}): the copy would lack it; nothing was copied"
    )


def _copy_in_tar(sandbox: Sandbox, path: str) -> None:
    """A tar archive on stdin into the sandbox's ``path``, streamed: members smaller than
    ``SPOOL_FROM`` are sent together, ``BATCH_BYTES`` at most held at once; a larger one goes
    in a request of its own, read from stdin as it is sent."""
    batch: list[tuple[str, bytes, int]] = []
    directories: list[tuple[str, int]] = []
    links: list[tuple[str, str]] = []
    stamps: list[tuple[str, float]] = []
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|*") as archive:
        for member in archive:
            name = posixpath.normpath(member.name)
            if name == ".." or name.startswith("../") or posixpath.isabs(name):
                _skipped(member.name, "it would land outside the destination")
                continue  # nothing may climb out ("..foo" does not)
            _check_name(member.name)
            target, mode = posixpath.join(path, name), member.mode & 0o777
            if member.isdir():
                directories.append((target, mode))
                stamps.append((target, member.mtime))
            if member.issym():
                _check_name(member.linkname)
                links.append((target, member.linkname))
            if not member.isfile():
                if not (member.isdir() or member.issym()):
                    _skipped(member.name, "a hard link, FIFO or device, which execd cannot make")
                continue
            stamps.append((target, member.mtime))
            handle = archive.extractfile(member)
            if handle is None or member.size < SPOOL_FROM:
                batch.append((target, handle.read() if handle else b"", mode))
                if sum(len(data) for _, data, _ in batch) >= BATCH_BYTES:
                    sandbox.files.write_many(batch)
                    batch.clear()
                continue
            if batch:
                sandbox.files.write_many(batch)
                batch.clear()
            sandbox.files.write(target, handle, mode=mode, size=member.size)
    if batch:
        sandbox.files.write_many(batch)
    _make_directories(sandbox, directories)
    _make_links(sandbox, links)
    _set_mtimes(sandbox, stamps)


def _skipped(name: str, why: str) -> None:
    print(f"osb-sync: warning: skipped {name!r}: {why}", file=sys.stderr)


def _make_links(sandbox: Sandbox, links: list[tuple[str, str]]) -> None:
    """Make each symlink (path, what it says) with ``ln -s`` in the sandbox, once every file
    and directory of the copy is written, so that no write of the copy goes through one
    (execd's API makes none). Where that fails (an image without ``ln``, a path taken), one
    warning names what was not made."""
    left = list(links)
    while left:
        group: list[str] = []
        size = 0
        while left and (not group or size + len(left[0][0]) + len(left[0][1]) < ARGUMENT_BYTES):
            path, text = left.pop(0)
            size += len(path) + len(text) + 2
            group += [text, path]
        argv = ["sh", "-c", LINKS_SCRIPT, "sh", *group]
        done = sandbox.commands.run(argv)
        if done.exit_code != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            why = said[-1] if said else f"exit {done.exit_code}"
            print(
                f"osb-sync: warning: symlinks were not copied: `ln -s` failed in the sandbox"
                f" ({why}); {len(links)} in all",
                file=sys.stderr,
            )
            return


def _set_mtimes(sandbox: Sandbox, stamps: list[tuple[str, float]]) -> None:
    """Give what was copied in its mtime (whole seconds) with ``touch`` in the sandbox, once
    everything is written: execd's API sets no time. Where ``touch`` fails (an image without
    it), one warning says the copies keep the time they were written at."""
    by_time: dict[str, list[str]] = {}
    for target, mtime in stamps:
        # a tar's PAX header may say any number ("1e20", "nan"): 1970 to 9999, as touch takes
        second = min(max(0, int(mtime)), LATEST) if math.isfinite(mtime) else 0
        when = time.strftime("%Y%m%d%H%M.%S", time.gmtime(second))
        by_time.setdefault(when, []).append(target)
    for when, targets in by_time.items():
        while targets:
            group: list[str] = []
            size = 0
            while targets and (not group or size + len(targets[0]) < ARGUMENT_BYTES):
                size += len(targets[0]) + 1
                group.append(targets.pop(0))
            argv = ["touch", "-m", "-c", "-t", when, "--", *group]
            done = sandbox.commands.run(argv, env={"TZ": "UTC0"})
            if done.exit_code != 0:
                said = (done.stderr or done.stdout).strip().splitlines()
                why = said[-1] if said else f"exit {done.exit_code}"
                print(
                    "osb-sync: warning: mtimes were not kept: `touch` failed in the sandbox"
                    f" ({why}); the copies have the time they were written",
                    file=sys.stderr,
                )
                return


def _check_name(name: str) -> None:
    """Refuse a local name execd's API cannot carry: names cross it as JSON text (UTF-8), and
    bytes that are not UTF-8 (decoded with surrogateescape) are none.

    Raises:
        Refused: ``name`` is such a name.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = repr(name.encode("utf-8", "surrogateescape"))[2:-1]
        raise Refused(
            f"the name '{shown}' is not UTF-8, and execd's API carries file names as UTF-8 "
            "text: rename it (or copy it in an archive); nothing was copied"
        ) from None


def _make_directories(sandbox: Sandbox, directories: list[tuple[str, int]]) -> None:
    """Make each directory (an empty one too) and give it its mode, after the files: deepest
    first, so a parent's mode without write permission comes last."""
    for directory, mode in sorted(directories, reverse=True):
        sandbox.files.mkdir(directory, mode=mode)
