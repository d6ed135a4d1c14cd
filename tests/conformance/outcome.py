"""Normalised outcomes: what a client can notice, without what legitimately varies (ids, times,
paths of the scenario's private folder)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Callable

from osb_sync import (
    ApiError,
    CommandResult,
    ExecutionError,
    ExecutionResult,
    FileInfo,
    OpenSandboxError,
)

Outcome = dict[str, Any]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def raised(call: Callable[[], object]) -> Outcome:
    """What a call raised (type, and status/code for API errors), or ``{"ok": True}``."""
    try:
        call()
    except OpenSandboxError as exc:
        return error_outcome(exc)
    return {"ok": True}


def error_outcome(exc: OpenSandboxError) -> Outcome:
    out: Outcome = {"raised": type(exc).__name__}
    if isinstance(exc, ApiError):
        out.update(status=exc.status_code, code=exc.code)
    return out


def execution_error(error: ExecutionError | None) -> Outcome | None:
    """Name, value and the last traceback line without colours; the layout is kept apart."""
    if error is None:
        return None
    last = ANSI.sub("", error.traceback[-1]).strip() if error.traceback else None
    layout = "ansi" if any("\x1b[" in line for line in error.traceback) else "plain"
    return {"name": error.name, "value": error.value, "last_line": last, "layout": layout}


def code_outcome(result: ExecutionResult) -> Outcome:
    return {
        "stdout": result.stdout,
        "stderr": result.stderr,
        "results": result.results,
        "error": execution_error(result.error),
        "execution_count": result.execution_count,
    }


def command_outcome(result: CommandResult) -> Outcome:
    return {
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "error": execution_error(result.error),
        "timed_out": result.timed_out,
        "has_id": bool(result.id),
    }


def file_outcome(info: FileInfo, root: str) -> Outcome:
    # A directory's size is its filesystem's (4096 on ext4, 40 + 20 per entry on a tmpfs, as
    # a local sandbox's disk is): compared as "some number", a file's exactly.
    size = info.size if info.type != "directory" else isinstance(info.size, int)
    return {
        "path": relative(info.path, root),
        "type": info.type,
        "size": size,
        "mode": oct(info.mode),
        "owner_set": bool(info.owner),
        "group_set": bool(info.group),
        "modified_at_set": info.modified_at is not None,
        "created_at_set": info.created_at is not None,
    }


def relative(path: str, root: str) -> str:
    return path.replace(root, "<dir>", 1) if path.startswith(root) else path


def digest(data: bytes) -> str:
    return f"{len(data)} bytes sha256:{hashlib.sha256(data).hexdigest()[:16]}"


@dataclass(frozen=True)
class Large:
    """A large output: compared whole (so a lost tail is seen as one), shown as its digest."""

    data: bytes

    def __repr__(self) -> str:
        return digest(self.data)


def differences(real: Outcome, local: Outcome, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Leaf paths (``a.b``) where the outcomes differ, with both values."""
    found: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(real) | set(local), key=str):
        left, right = real.get(key, "<absent>"), local.get(key, "<absent>")
        path = f"{prefix}{key}"
        if isinstance(left, dict) and isinstance(right, dict):
            found.update(differences(left, right, path + "."))
        elif left != right:
            found[path] = (left, right)
    return found


def lacks_trailing(real: Any, local: Any) -> bool:
    """Whether ``real`` is ``local`` with something missing at the end (lost late events):
    a shorter prefix of a text or list, or nothing where the local side has something."""
    if real is None or real == "<absent>":
        return local is not None
    if isinstance(real, str) and isinstance(local, str):
        return local.startswith(real) and real != local
    if isinstance(real, list) and isinstance(local, list):
        return local[: len(real)] == real and len(real) < len(local)
    if isinstance(real, Large) and isinstance(local, Large):
        return local.data.startswith(real.data) and real != local
    return False
