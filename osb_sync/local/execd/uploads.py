"""execd file writes: uploads (all files or none), in-place text replacement, permissions.

Every path and permission of a request is checked before the first change on disk. Uploads and
replacements stream through disk in 64 KiB pieces, so a large file is never held in memory.
"""

from __future__ import annotations

import contextlib
import email.parser
import errno
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..http.exchange import BODY_PIECE, BodyReader, Exchange, HttpError, error, parse_json
from .runner import SandboxRuntime

PIECE = 1 << 16
METADATA_LIMIT = 1 << 20
PART_HEADER_LIMIT = 16 * 1024
STAGING_PREFIX = ".osb-upload-"
# A write that fails for want of room: said as such, not as a bare OSError.
NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class MultipartReader:
    """Streams the parts of a multipart/form-data body, writing file parts to disk."""

    def __init__(self, body: BodyReader, boundary: str) -> None:
        self._body = body
        self._delimiter = b"\r\n--" + boundary.encode()
        self._buffer = b"\r\n"  # lets the first delimiter match like the others

    def _more(self) -> None:
        data = self._body.read(BODY_PIECE)
        if not data:
            raise error(400, "INVALID_FILE", "truncated multipart body")
        self._buffer += data

    def _until(self, marker: bytes, sink: Callable[[bytes], object]) -> None:
        while (index := self._buffer.find(marker)) < 0:
            keep = len(marker) - 1
            if len(self._buffer) > keep:
                sink(self._buffer[:-keep])
                self._buffer = self._buffer[-keep:]
            self._more()
        sink(self._buffer[:index])
        self._buffer = self._buffer[index + len(marker) :]

    def _part_header(self) -> bytes:
        block = bytearray()

        def keep(data: bytes) -> None:
            block.extend(data)
            if len(block) > PART_HEADER_LIMIT:
                raise error(400, "INVALID_FILE", "multipart part header too large")

        self._until(b"\r\n\r\n", keep)
        return bytes(block)

    def parts(
        self, place: Callable[[str, str | None], Path]
    ) -> Iterator[tuple[str, str | None, Path]]:
        """Yield (field name, filename, file holding the content) for every part.

        Each part is written in the directory `place(name, filename)` names; a part cut short
        (a broken body, a full disk) is removed before the error goes up.
        """
        self._until(self._delimiter, lambda _: None)
        while True:
            while len(self._buffer) < 2:
                self._more()
            if self._buffer.startswith(b"--"):
                return
            headers = email.parser.BytesHeaderParser().parsebytes(self._part_header().lstrip())
            name = str(headers.get_param("name", header="content-disposition") or "")
            filename = headers.get_filename()
            target = place(name, filename) / f"{STAGING_PREFIX}{secrets.token_hex(8)}"
            try:
                with open(target, "wb") as out:
                    self._until(self._delimiter, out.write)
            except BaseException:
                target.unlink(missing_ok=True)
                raise
            yield name, filename, target


@dataclass(frozen=True)
class Permissions:
    """A checked execd permission object: mode bits and owner/group names (None: keep)."""

    mode: int | None = None
    owner: str | None = None
    group: str | None = None


def permissions_of(spec: Any) -> Permissions:
    """Check an execd permission object `{"mode": 755, "owner", "group"}`; 400 if invalid.

    execd writes the octal digits as a decimal number (755), or as a string.
    """
    if not isinstance(spec, dict):
        return Permissions()
    raw = spec.get("mode") or 0
    text = str(raw) if isinstance(raw, (int, str)) and not isinstance(raw, bool) else "?"
    if not text or len(text) > 5 or text.strip("01234567") or int(text, 8) > 0o7777:
        raise bad_value(f"mode {text[:20]!r} must be octal digits from 0 to 7777")
    names = [spec.get("owner") or None, spec.get("group") or None]
    for name in names:
        if name is not None and (not isinstance(name, (str, int)) or "\0" in str(name)):
            raise bad_value(f"owner/group {str(name)[:40]!r} is not a user or group name")
    owner, group = (None if n is None else str(n) for n in names)
    return Permissions(int(text, 8) or None, owner, group)


def apply_permissions(path: Path, spec: Permissions) -> None:
    """chmod/chown `path`; 400 for an unknown user or group."""
    try:
        if spec.mode:
            os.chmod(path, spec.mode)
        if spec.owner is not None:
            shutil.chown(path, spec.owner, spec.group)
        elif spec.group is not None:
            shutil.chown(path, group=spec.group)
    except LookupError as exc:
        raise bad_value(f"invalid permissions for {path}: {exc}") from None


def bad_value(message: str) -> HttpError:
    """execd's 400 for an invalid value in a request."""
    return error(400, "INVALID_REQUEST_BODY", message)


def sandbox_path(runtime: SandboxRuntime, raw: Any) -> Path:
    """The path on disk for a path of the request; 400 unless a non-empty string without NUL."""
    if not isinstance(raw, str) or not raw or "\0" in raw:
        raise bad_value(f"invalid path {str(raw)[:100]!r}")
    return runtime.resolve(raw)


def existing(runtime: SandboxRuntime, raw: str) -> Path:
    path = sandbox_path(runtime, raw)
    if not os.path.lexists(path):
        raise error(404, "FILE_NOT_FOUND", f"file not found: {raw}")
    return path


def json_object(ex: Exchange) -> Any:
    try:
        return ex.json_body()
    except ValueError as exc:
        raise bad_value(f"invalid JSON body: {exc}") from None


def upload(runtime: SandboxRuntime, ex: Exchange) -> None:
    """POST /files/upload: pairs of `metadata` and `file` parts (the i-th with the i-th).

    All files are written or none: every entry is checked and staged next to its target
    before the first one is renamed into place. A file part whose metadata came first (as
    the SDKs send them) is written straight into its target's directory, so it is renamed,
    not copied (no second copy's room needed); otherwise it waits in execd's state
    directory. Every staged file is removed on every failure path.
    """
    content_type = ex.headers.get("Content-Type") or ""
    found = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.startswith("multipart/form-data") or not found:
        raise error(400, "INVALID_FILE", "expected a multipart/form-data body")
    staged: list[Path] = []
    targets: list[tuple[Path, Permissions]] = []
    contents: list[Path] = []
    made: list[Path] = []

    def place(name: str, filename: str | None) -> Path:
        if name == "file" and filename is not None and len(contents) < len(targets):
            parent = targets[len(contents)][0].parent
            made.extend(_make_parents(parent))
            return parent
        return runtime.run_dir

    done = False
    try:
        for name, filename, path in MultipartReader(ex.body, found.group(1)).parts(place):
            staged.append(path)
            if name == "metadata" and filename is not None:
                targets.append(_upload_target(runtime, path))
            elif name == "file" and filename is not None:
                contents.append(path)
        if not targets:
            raise error(400, "INVALID_FILE_METADATA", "metadata file is missing")
        if len(targets) != len(contents):
            raise error(400, "INVALID_FILE", "metadata and file parts do not pair up")
        plan = [
            (*target, content)
            for target, content in zip(targets, contents)  # noqa: B905 (paired above; 3.9 has no strict=)
        ]
        _install(plan)
        done = True
    except OSError as exc:
        if exc.errno in NO_ROOM:
            raise error(
                500,
                "RUNTIME_ERROR",
                f"upload failed, nothing was written: {os.strerror(exc.errno or 0)}"
                " (the sandbox's disk is full: free room, or upload less)",
            ) from None
        raise
    finally:
        for path in staged:
            path.unlink(missing_ok=True)
        if not done:
            for directory in reversed(made):
                with contextlib.suppress(OSError):
                    directory.rmdir()
    ex.send(200)


def _upload_target(runtime: SandboxRuntime, meta_path: Path) -> tuple[Path, Permissions]:
    if meta_path.stat().st_size > METADATA_LIMIT:
        raise error(400, "INVALID_FILE_METADATA", "metadata too large")
    try:
        meta = parse_json(meta_path.read_bytes())
    except ValueError as exc:
        raise error(400, "INVALID_FILE_METADATA", f"invalid metadata: {exc}") from None
    if not isinstance(meta, dict) or not meta.get("path"):
        raise error(400, "INVALID_FILE_METADATA", "metadata path is empty")
    target = sandbox_path(runtime, meta["path"])
    if target.is_dir() and not target.is_symlink():
        raise error(400, "INVALID_FILE_METADATA", f"{meta['path']} is a directory")
    return target, permissions_of(meta)


def _install(plan: list[tuple[Path, Permissions, Path]]) -> None:
    """Move each staged file next to its target, then rename them all into place."""
    ready: list[tuple[Path, Path]] = []
    made: list[Path] = []
    try:
        for target, spec, content in plan:
            made += _make_parents(target.parent)
            if content.parent == target.parent:
                temp = content  # staged in place: renamed below, never copied
            else:
                temp = target.parent / f"{STAGING_PREFIX}{secrets.token_hex(8)}"
                try:
                    shutil.move(str(content), str(temp))
                except BaseException:
                    temp.unlink(missing_ok=True)  # a copy cut short (a full disk)
                    raise
            ready.append((temp, target))
            apply_permissions(temp, spec)
    except BaseException:
        for temp, _ in ready:
            temp.unlink(missing_ok=True)
        for directory in reversed(made):
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise
    for temp, target in ready:
        os.replace(temp, target)


def _make_parents(directory: Path) -> list[Path]:
    """mkdir -p `directory`; the directories it created, outermost first."""
    missing = []
    while not os.path.lexists(directory) and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        path.mkdir(exist_ok=True)
    return missing[::-1]


def replace(runtime: SandboxRuntime, ex: Exchange) -> None:
    """POST /files/replace?verbose=: `{"<path>": {"old", "new"}}`, in place, streamed."""
    body = json_object(ex)
    if not isinstance(body, dict):
        raise bad_value("body must be an object of paths")
    plan = [(raw, existing(runtime, raw), *_replacement(raw, spec)) for raw, spec in body.items()]
    counts: dict[str, dict[str, int]] = {}
    for raw, path, old, new in plan:
        counts[raw] = {"replacedCount": _replace_in_file(path, old, new, runtime.run_dir)}
    if (ex.arg("verbose") or "").lower() == "true":
        ex.send_json(200, counts)
    else:
        ex.send(200)


def _replacement(raw: str, spec: Any) -> tuple[bytes, bytes]:
    old = spec.get("old") if isinstance(spec, dict) else None
    new = spec.get("new") if isinstance(spec, dict) else None
    if not isinstance(old, str) or not old:
        raise bad_value(f"old text for {raw} is empty")
    try:
        return old.encode("utf-8", "surrogateescape"), str(new or "").encode(
            "utf-8", "surrogateescape"
        )
    except UnicodeEncodeError:
        raise bad_value(f"old or new text for {raw} is not valid text") from None


def _replace_in_file(path: Path, old: bytes, new: bytes, scratch: Path) -> int:
    """Replace every `old` with `new` in `path` (same inode); the count. Memory stays bounded."""
    count = 0
    with open(path, "rb") as source, tempfile.TemporaryFile(dir=scratch) as out:
        pending = b""
        while True:
            data = source.read(PIECE)
            # split() finds the same leftmost, non-overlapping matches as str.replace.
            *before, rest = (pending + data).split(old)
            count += len(before)
            if before:
                out.write(new.join(before) + new)
            # A match may still start in the last len(old) - 1 bytes: keep them for later.
            keep = len(rest) if not data else max(0, len(rest) - len(old) + 1)
            out.write(rest[:keep])
            pending = rest[keep:]
            if not data:
                break
        if count:
            out.seek(0)
            with open(path, "r+b") as target:
                shutil.copyfileobj(out, target, PIECE)
                target.truncate()
    return count
