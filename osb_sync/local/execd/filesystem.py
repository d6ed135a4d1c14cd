"""execd's Filesystem routes: download with Range, stat, list, search, move, delete, ...

Relative paths resolve inside the sandbox directory; absolute paths are used as they are
(the sandbox shares the host's file system). Downloads stream from disk in 64 KiB pieces;
uploads, replacements and permissions live in `uploads.py`.
"""

from __future__ import annotations

import fnmatch
import grp
import os
import pwd
import re
import shutil
import stat
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

from ..http.bodies import rfc3339
from ..http.exchange import Exchange, error
from .runner import SandboxRuntime
from .uploads import (
    apply_permissions,
    bad_value,
    existing,
    json_object,
    permissions_of,
    sandbox_path,
)

PIECE = 1 << 16
METADATA_LIMIT = 1 << 20
RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def file_info(path: Path) -> dict[str, Any]:
    """The execd FileInfo of `path` (symlinks are described, not followed)."""
    st = path.lstat()
    kind = (
        "directory"
        if stat.S_ISDIR(st.st_mode)
        else "file"
        if stat.S_ISREG(st.st_mode)
        else "symlink"
        if stat.S_ISLNK(st.st_mode)
        else "other"
    )
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)

    def when(seconds: float) -> str:
        return rfc3339(datetime.fromtimestamp(seconds, timezone.utc))

    return {
        "path": str(path),
        "type": kind,
        "size": st.st_size,
        "modified_at": when(st.st_mtime),
        "created_at": when(getattr(st, "st_birthtime", st.st_ctime)),
        "owner": owner,
        "group": group,
        # execd writes the octal digits as a decimal number: 0o644 -> 644.
        "mode": int(oct(stat.S_IMODE(st.st_mode))[2:]),
    }


def attachment(name: bytes) -> str:
    """The `Content-Disposition` of a download of the file named `name` (its bytes on disk).

    A name of visible ASCII and spaces, without `"`, `\\`, `%`, `;` or `,`, keeps execd's
    `attachment; filename="NAME"`. Any other (non-ASCII, a newline, a quote, bytes that are not
    UTF-8) gets an ASCII fallback, each other character an `_` (RFC 6266 4.3), then RFC 8187's
    `filename*=UTF-8''` with the name's exact bytes percent-encoded: never a control character.
    """
    text = name.decode("utf-8", "replace")
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\%;,' else "_" for c in text)
    if fallback == text:
        return f'attachment; filename="{text}"'
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def _paths(ex: Exchange) -> list[str]:
    paths = [p for p in ex.query.get("path", []) if p]
    if not paths:
        raise error(400, "MISSING_QUERY", "missing query parameter: path")
    return paths


class _Unsatisfiable(Exception):
    """A `Range` no byte of the file satisfies; the message is Go's, as real execd answers."""


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a single `Range` header, None for the whole file."""
    if not header or "," in header:
        return None  # no range, or several: RFC 9110 lets a server send the whole file
    found = RANGE.fullmatch(header.strip())
    if not found or found.group(1) == found.group(2) == "" or len(header) > 50:
        raise _Unsatisfiable("invalid range")
    first, last = found.groups()
    if first == "":
        start, end = max(0, size - int(last)), size - 1
        if int(last) == 0:
            raise _Unsatisfiable("invalid range: failed to overlap")
    else:
        start, end = int(first), min(size - 1, int(last)) if last else size - 1
    if start > end and start < size:
        raise _Unsatisfiable("invalid range")
    if start >= size:
        raise _Unsatisfiable("invalid range: failed to overlap")
    return start, end


def _line_number(ex: Exchange, name: str) -> int | None:
    """The `offset` or `limit` of a line download: a decimal integer of 1 or more; 400 else."""
    raw = ex.arg(name)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18 or int(raw) < 1:
        shown = raw[:40].encode("ascii", "backslashreplace").decode()
        raise error(400, "INVALID_REQUEST_BODY", f"invalid query parameter '{name}': {shown}")
    return int(raw)


def _selected_lines(source: BinaryIO, first: int, count: int | None) -> Iterator[bytes]:
    """Lines `first` to `first + count - 1` (1-based) of `source`, without their LF or CRLF,
    joined by LF, in pieces of at most PIECE bytes (a line longer than that is never held)."""
    number, at_start, started, held_cr = 1, True, False, b""
    while count is None or number < first + count:
        piece = source.readline(PIECE)
        if not piece:
            break
        whole = piece.endswith(b"\n")
        if number >= first:
            text = piece[:-1] if whole else piece
            if whole and text.endswith(b"\r"):
                text = text[:-1]
            if held_cr and piece != b"\n":
                text = held_cr + text  # a CR before a piece's end, not a CRLF's
            held_cr = b""
            if not whole and text.endswith(b"\r"):
                held_cr, text = b"\r", text[:-1]
            if at_start and started:
                yield b"\n"
            started = True
            if text:
                yield text
        at_start = whole
        number += whole
    if held_cr:
        yield held_cr


def _download_lines(ex: Exchange, path: Path, first: int, count: int | None) -> None:
    """Answer a line download (execd 1.1.1, #1030): text/plain, chunked, streamed."""
    if ex.headers.get("Range"):
        message = "offset/limit and Range are mutually exclusive"
        raise error(400, "INVALID_REQUEST_BODY", message)
    with open(path, "rb") as source:
        writer = ex.start_chunked(200, {"Content-Type": "text/plain; charset=utf-8"})
        batch = bytearray()
        for piece in _selected_lines(source, first, count):
            batch += piece
            if len(batch) >= PIECE:
                writer.write(bytes(batch))
                batch.clear()
        writer.write(bytes(batch))
        writer.end()


def download(runtime: SandboxRuntime, ex: Exchange) -> None:
    """GET /files/download?path=, with single-range support, or lines (`offset`, `limit`)."""
    raw = ex.arg("path") or ""
    if not raw:
        raise error(400, "MISSING_QUERY", "missing query parameter: path")
    first, count = _line_number(ex, "offset"), _line_number(ex, "limit")
    path = sandbox_path(runtime, raw)
    if not path.is_file():
        raise error(404, "FILE_NOT_FOUND", f"file not found: {raw}")
    if first is not None or count is not None:
        _download_lines(ex, path, first or 1, count)
        return
    with open(path, "rb") as source:
        size = os.fstat(source.fileno()).st_size
        try:
            span = _byte_range(ex.headers.get("Range"), size)
        except _Unsatisfiable as exc:  # real execd: Go's plain-text 416, not a JSON error
            text_plain = {"Content-Type": "text/plain; charset=utf-8"}
            ex.send(416, f"{exc}\n".encode(), {**text_plain, "Content-Range": f"bytes */{size}"})
            return
        start, end = span or (0, size - 1)
        headers = {
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "Content-Disposition": attachment(os.fsencode(path.name)),
            "Content-Length": str(end - start + 1),
        }
        if span:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        ex.start(206 if span else 200, headers)
        source.seek(start)
        left = end - start + 1
        while left > 0 and (data := source.read(min(PIECE, left))):
            ex.handler.wfile.write(data)
            left -= len(data)
        ex.handler.wfile.flush()


def info(runtime: SandboxRuntime, ex: Exchange) -> None:
    """GET /files/info?path=a&path=b."""
    ex.send_json(200, {raw: file_info(existing(runtime, raw)) for raw in _paths(ex)})


def list_directory(runtime: SandboxRuntime, ex: Exchange) -> None:
    """GET /directories/list?path=&depth=1: entries in lexical order, symlinks not followed."""
    raw = ex.arg("path") or "."
    root = existing(runtime, raw)
    if root.is_symlink() or not root.is_dir():
        raise error(400, "INVALID_REQUEST_BODY", f"not a directory: {raw}")
    raw_depth = ex.arg("depth") or "1"
    if not (raw_depth.isascii() and raw_depth.isdigit()) or len(raw_depth) > 6:
        raise bad_value("depth must be a number from 1 to 999999")
    depth = max(1, int(raw_depth))
    found: list[dict[str, Any]] = []

    def walk(directory: Path, level: int) -> None:
        for entry in sorted(directory.iterdir()):
            found.append(file_info(entry))
            if level < depth and entry.is_dir() and not entry.is_symlink():
                walk(entry, level + 1)

    walk(root, 1)
    ex.send_json(200, found)


def search(runtime: SandboxRuntime, ex: Exchange) -> None:
    """GET /files/search?path=&pattern=: files whose base name matches, recursively."""
    root = existing(runtime, ex.arg("path") or ".")
    pattern = ex.arg("pattern") or "**"
    found = [
        Path(top, name)
        for top, _, names in os.walk(root)
        for name in names
        if fnmatch.fnmatch(name, pattern)
    ]
    ex.send_json(200, [file_info(path) for path in sorted(found)])


def delete_files(runtime: SandboxRuntime, ex: Exchange) -> None:
    """DELETE /files?path=...: missing files are fine, directories are an error."""
    for raw in _paths(ex):
        path = sandbox_path(runtime, raw)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise error(500, "RUNTIME_ERROR", f"cannot delete {raw}: {exc}") from None
    ex.send(200)


def make_directories(runtime: SandboxRuntime, ex: Exchange) -> None:
    """POST /directories: `{"<path>": {"mode": 755, ...}}`, like mkdir -p."""
    body = json_object(ex)
    if not isinstance(body, dict):
        raise error(400, "INVALID_REQUEST_BODY", "body must be an object of paths")
    plan = [(sandbox_path(runtime, raw), permissions_of(spec)) for raw, spec in body.items()]
    for path, spec in plan:
        path.mkdir(parents=True, exist_ok=True)
        apply_permissions(path, spec)
    ex.send(200)


def delete_directories(runtime: SandboxRuntime, ex: Exchange) -> None:
    """DELETE /directories?path=...: like rm -rf."""
    for raw in _paths(ex):
        path = sandbox_path(runtime, raw)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            raise error(500, "RUNTIME_ERROR", f"not a directory: {raw}")
    ex.send(200)


def move(runtime: SandboxRuntime, ex: Exchange) -> None:
    """POST /files/mv: `[{"src", "dest"}]`."""
    body = json_object(ex)
    if not isinstance(body, list):
        raise error(400, "INVALID_REQUEST_BODY", "body must be a list of {src, dest}")
    for item in body:
        if not isinstance(item, dict) or not item.get("src") or not item.get("dest"):
            raise error(400, "INVALID_REQUEST_BODY", "each move needs src and dest")
        source = existing(runtime, item["src"])
        target = sandbox_path(runtime, item["dest"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(source), str(target))
    ex.send(200)


def permissions(runtime: SandboxRuntime, ex: Exchange) -> None:
    """POST /files/permissions: `{"<path>": {"owner", "group", "mode"}}`."""
    body = json_object(ex)
    if not isinstance(body, dict):
        raise error(400, "INVALID_REQUEST_BODY", "body must be an object of paths")
    plan = [(_chmod_target(runtime, raw), permissions_of(spec)) for raw, spec in body.items()]
    for path, spec in plan:
        apply_permissions(path, spec)
    ex.send(200)


def _chmod_target(runtime: SandboxRuntime, raw: str) -> Path:
    path = sandbox_path(runtime, raw)
    if not os.path.lexists(path):  # real execd's answer: a 500, not a 404
        reason = f"chmod {raw}: no such file or directory"
        raise error(500, "RUNTIME_ERROR", f"error changing permissions for {raw}. {reason}")
    return path
