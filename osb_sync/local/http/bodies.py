"""Checked values of request bodies and timestamps, for both servers (lifecycle and execd).

Every string and number of an execd body is validated before a route starts a process or
answers with a stream, so bad input is a 400, never a broken stream.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .exchange import Exchange, HttpError, error

MAX_TIMEOUT_MS = 86_400_000  # one day, the local server's largest sandbox timeout
MAX_ID = 2**32 - 2  # the largest uid or gid


def rfc3339(moment: datetime) -> str:
    """`moment` as RFC 3339 UTC with a `Z` suffix."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def bad_request(message: str) -> HttpError:
    """execd's 400 for an invalid body or parameter."""
    return error(400, "INVALID_REQUEST_BODY", f"invalid request, validation error {message}")


def read_object(ex: Exchange, empty: Any = None) -> dict[str, Any]:
    """The JSON object body of `ex` (`empty` when there is no body); 400 otherwise."""
    try:
        body = ex.json_body(empty)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    if not isinstance(body, dict):
        raise bad_request("body must be a JSON object")
    return body


def text(body: dict[str, Any], name: str) -> str:
    """The required string `name` of a body; 400 when missing, empty or holding a NUL."""
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise bad_request(f"{name} is required")
    if "\0" in value:
        raise bad_request(f"{name} must not contain NUL characters")
    return value


def bounded_int(body: dict[str, Any], name: str, low: int, high: int) -> int | None:
    """The optional integer `name` of a body, from `low` to `high`; 400 otherwise."""
    value = body.get(name)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
    ):
        raise bad_request(f"{name} must be an integer from {low} to {high}")
    return value


def timeout_ms(body: dict[str, Any]) -> int | None:
    """The optional `timeout` (milliseconds, 1 to MAX_TIMEOUT_MS) of a request body."""
    return bounded_int(body, "timeout", 1, MAX_TIMEOUT_MS)


def environment(envs: Any) -> dict[str, str]:
    """The `envs` object of a body as variables (null values dropped); 400 if invalid."""
    if envs is None:
        return {}
    if not isinstance(envs, dict):
        raise bad_request("envs must be an object")
    found = {str(k): str(v) for k, v in envs.items() if v is not None}
    for key, value in found.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise bad_request(f"envs: {key[:100]!r} is not a valid variable")
    return found


def working_dir(cwd: Any, default: Path, resolve: Callable[[str], Path]) -> Path:
    """The directory a body's `cwd` names (variables expanded, then `resolve`d: relative to
    the sandbox's directory), else `default`; 400 unless it is a directory."""
    if cwd in (None, ""):
        return default
    if not isinstance(cwd, str) or "\0" in cwd:
        raise bad_request("cwd must be a path without NUL characters")
    path = resolve(os.path.expandvars(cwd))
    if not path.is_dir():
        raise bad_request(f"cwd {cwd!r} is not a directory")
    return path
