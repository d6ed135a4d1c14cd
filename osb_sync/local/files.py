"""execd file routes (upload, download with Range, stat, list, search, move, ...) and metrics.

Relative paths resolve inside the sandbox directory; absolute paths are used as they are
(the sandbox shares the host's file system). Uploads and downloads stream through disk in
64 KiB pieces, so a large file is never held in memory.
"""

from __future__ import annotations

import fnmatch
import functools
import grp
import json
import os
import pwd
import re
import shutil
import stat
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ._http import Exchange, MultipartReader, Route, error, now_ms
from .runner import SandboxRuntime
from .workers import rfc3339

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


def apply_permissions(path: Path, spec: Any) -> None:
    """chmod/chown `path` from an execd permission object `{"mode": 755, "owner", "group"}`."""
    if not isinstance(spec, dict):
        return
    mode = spec.get("mode") or 0
    try:
        if mode:
            os.chmod(path, int(str(mode), 8))
        owner, group = spec.get("owner") or None, spec.get("group") or None
        if owner is not None:
            shutil.chown(path, str(owner), group)
        elif group is not None:
            shutil.chown(path, group=str(group))
    except (ValueError, LookupError) as exc:
        raise error(400, "INVALID_REQUEST_BODY", f"invalid permissions for {path}: {exc}") from None
    except OSError as exc:
        raise error(500, "RUNTIME_ERROR", f"cannot set permissions of {path}: {exc}") from None


def _existing(runtime: SandboxRuntime, raw: str) -> Path:
    path = runtime.resolve(raw)
    if not os.path.lexists(path):
        raise error(404, "FILE_NOT_FOUND", f"file not found: {raw}")
    return path


def _paths(ex: Exchange) -> list[str]:
    paths = [p for p in ex.query.get("path", []) if p]
    if not paths:
        raise error(400, "MISSING_QUERY", "missing query parameter: path")
    return paths


def _json_object(ex: Exchange) -> Any:
    try:
        return ex.json_body()
    except ValueError as exc:
        raise error(400, "INVALID_REQUEST_BODY", f"invalid JSON body: {exc}") from None


def upload(runtime: SandboxRuntime, ex: Exchange) -> None:
    """POST /files/upload: pairs of `metadata` and `file` parts (the i-th with the i-th)."""
    content_type = ex.headers.get("Content-Type") or ""
    found = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.startswith("multipart/form-data") or not found:
        raise error(400, "INVALID_FILE", "expected a multipart/form-data body")
    staged: list[Path] = []
    try:
        metas: list[Path] = []
        contents: list[Path] = []
        for name, filename, path in MultipartReader(ex.body, found.group(1)).parts(runtime.run_dir):
            staged.append(path)
            if name == "metadata" and filename is not None:
                metas.append(path)
            elif name == "file" and filename is not None:
                contents.append(path)
        if not metas:
            raise error(400, "INVALID_FILE_METADATA", "metadata file is missing")
        if len(metas) != len(contents):
            raise error(400, "INVALID_FILE", "metadata and file parts do not pair up")
        for meta_path, content in zip(metas, contents, strict=True):
            if meta_path.stat().st_size > METADATA_LIMIT:
                raise error(400, "INVALID_FILE_METADATA", "metadata too large")
            try:
                meta = json.loads(meta_path.read_bytes())
            except ValueError as exc:
                raise error(400, "INVALID_FILE_METADATA", f"invalid metadata: {exc}") from None
            if not isinstance(meta, dict) or not meta.get("path"):
                raise error(400, "INVALID_FILE_METADATA", "metadata path is empty")
            target = runtime.resolve(str(meta["path"]))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(content), str(target))
            apply_permissions(target, meta)
    finally:
        for path in staged:
            path.unlink(missing_ok=True)
    ex.send(200)


class _Unsatisfiable(Exception):
    """A `Range` no byte of the file satisfies; the message is Go's, as real execd answers."""


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a single `Range` header, None for the whole file."""
    if not header or "," in header:
        return None  # no range, or several: RFC 9110 lets a server send the whole file
    found = RANGE.fullmatch(header.strip())
    if not found or found.group(1) == found.group(2) == "":
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


def download(runtime: SandboxRuntime, ex: Exchange) -> None:
    """GET /files/download?path=, with single-range support."""
    raw = ex.arg("path") or ""
    if not raw:
        raise error(400, "MISSING_QUERY", "missing query parameter: path")
    path = runtime.resolve(raw)
    if not path.is_file():
        raise error(404, "FILE_NOT_FOUND", f"file not found: {raw}")
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
            "Content-Disposition": f'attachment; filename="{path.name}"',
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
    ex.send_json(200, {raw: file_info(_existing(runtime, raw)) for raw in _paths(ex)})


def list_directory(runtime: SandboxRuntime, ex: Exchange) -> None:
    """GET /directories/list?path=&depth=1: entries in lexical order, symlinks not followed."""
    raw = ex.arg("path") or "."
    root = _existing(runtime, raw)
    if root.is_symlink() or not root.is_dir():
        raise error(400, "INVALID_REQUEST_BODY", f"not a directory: {raw}")
    try:
        depth = max(1, int(ex.arg("depth") or 1))
    except ValueError:
        raise error(400, "INVALID_REQUEST_BODY", "depth must be an integer") from None
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
    root = _existing(runtime, ex.arg("path") or ".")
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
        path = runtime.resolve(raw)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise error(500, "RUNTIME_ERROR", f"cannot delete {raw}: {exc}") from None
    ex.send(200)


def make_directories(runtime: SandboxRuntime, ex: Exchange) -> None:
    """POST /directories: `{"<path>": {"mode": 755, ...}}`, like mkdir -p."""
    body = _json_object(ex)
    if not isinstance(body, dict):
        raise error(400, "INVALID_REQUEST_BODY", "body must be an object of paths")
    for raw, spec in body.items():
        path = runtime.resolve(raw)
        path.mkdir(parents=True, exist_ok=True)
        apply_permissions(path, spec)
    ex.send(200)


def delete_directories(runtime: SandboxRuntime, ex: Exchange) -> None:
    """DELETE /directories?path=...: like rm -rf."""
    for raw in _paths(ex):
        path = runtime.resolve(raw)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            raise error(500, "RUNTIME_ERROR", f"not a directory: {raw}")
    ex.send(200)


def move(runtime: SandboxRuntime, ex: Exchange) -> None:
    """POST /files/mv: `[{"src", "dest"}]`."""
    body = _json_object(ex)
    if not isinstance(body, list):
        raise error(400, "INVALID_REQUEST_BODY", "body must be a list of {src, dest}")
    for item in body:
        if not isinstance(item, dict) or not item.get("src") or not item.get("dest"):
            raise error(400, "INVALID_REQUEST_BODY", "each move needs src and dest")
        source = _existing(runtime, str(item["src"]))
        target = runtime.resolve(str(item["dest"]))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(source), str(target))
    ex.send(200)


def permissions(runtime: SandboxRuntime, ex: Exchange) -> None:
    """POST /files/permissions: `{"<path>": {"owner", "group", "mode"}}`."""
    body = _json_object(ex)
    if not isinstance(body, dict):
        raise error(400, "INVALID_REQUEST_BODY", "body must be an object of paths")
    for raw, spec in body.items():
        path = runtime.resolve(raw)
        if not os.path.lexists(path):  # real execd's answer: a 500, not a 404
            reason = f"chmod {raw}: no such file or directory"
            raise error(500, "RUNTIME_ERROR", f"error changing permissions for {raw}. {reason}")
        apply_permissions(path, spec)
    ex.send(200)


def replace(runtime: SandboxRuntime, ex: Exchange) -> None:
    """POST /files/replace?verbose=: `{"<path>": {"old", "new"}}`, in place."""
    body = _json_object(ex)
    if not isinstance(body, dict):
        raise error(400, "INVALID_REQUEST_BODY", "body must be an object of paths")
    counts: dict[str, dict[str, int]] = {}
    for raw, spec in body.items():
        old = spec.get("old") if isinstance(spec, dict) else None
        if not old:
            raise error(400, "INVALID_REQUEST_BODY", f"old text for {raw} is empty")
        path = _existing(runtime, raw)
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        counts[raw] = {"replacedCount": text.count(old)}
        path.write_text(
            text.replace(old, str(spec.get("new") or "")),
            encoding="utf-8",
            errors="surrogateescape",
        )
    if (ex.arg("verbose") or "").lower() == "true":
        ex.send_json(200, counts)
    else:
        ex.send(200)


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as proc_stat:
        values = [int(v) for v in proc_stat.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values), idle


def metrics() -> dict[str, Any]:
    """One `/metrics` sample from /proc (CPU over 50 ms, not execd's 1 s)."""
    cpu_count = os.cpu_count() or 1
    try:
        total0, idle0 = _cpu_times()
        time.sleep(0.05)
        total1, idle1 = _cpu_times()
        busy = 100.0 * (1 - (idle1 - idle0) / max(1, total1 - total0))
        with open("/proc/meminfo") as meminfo:
            fields = {line.split(":")[0]: int(line.split()[1]) for line in meminfo}
        total_kib = fields["MemTotal"]
        used_kib = total_kib - fields.get("MemAvailable", fields.get("MemFree", 0))
    except (OSError, ValueError, KeyError, IndexError):
        busy = min(100.0, 100.0 * os.getloadavg()[0] / cpu_count)
        total_kib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 1024
        used_kib = 0
    return {
        "cpu_count": cpu_count,
        "cpu_used_pct": round(busy, 2),
        "mem_total_mib": round(total_kib / 1024, 2),
        "mem_used_mib": round(used_kib / 1024, 2),
        "timestamp": now_ms(),
    }


def add_routes(add: Callable[[str, str, Route], None], runtime: SandboxRuntime) -> None:
    """Register the file routes of `runtime`'s sandbox with `add(method, pattern, route)`."""
    table = [
        ("POST", "/files/upload", upload),
        ("GET", "/files/download", download),
        ("GET", "/files/info", info),
        ("GET", "/directories/list", list_directory),
        ("GET", "/files/search", search),
        ("DELETE", "/files", delete_files),
        ("POST", "/directories", make_directories),
        ("DELETE", "/directories", delete_directories),
        ("POST", "/files/mv", move),
        ("POST", "/files/permissions", permissions),
        ("POST", "/files/replace", replace),
    ]
    for method, pattern, handler in table:
        add(method, pattern, functools.partial(handler, runtime))
