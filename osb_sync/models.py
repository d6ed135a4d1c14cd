"""Plain data returned by the client. No I/O here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any


@dataclass(frozen=True)
class Event:
    """One decoded event of an execd stream.

    Attributes:
        type: ``init``, ``ping``, ``stdout``, ``stderr``, ``result``, ``execution_count``,
            ``status``, ``error``, ``execution_complete``, or whatever the server sends.
            A type-less ``{"code", "message"}`` object (execd's mid-stream failure) is ``error``.
        text: the event's ``text``, or None.
        timestamp: Unix milliseconds, or None.
        data: the whole decoded object.
    """

    type: str
    text: str | None = None
    timestamp: int | None = None
    data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ExecutionError:
    """An error raised by the code inside the sandbox (returned, not raised)."""

    name: str
    value: str
    traceback: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ExecutionResult:
    """What one run produced.

    Attributes:
        stdout: the concatenated stdout text.
        stderr: the concatenated stderr text.
        results: one dict per ``result`` event (MIME type to value; ``text`` for plain text).
        error: the first error, or None.
        execution_count: the kernel's execution counter, when it sent one.
        execution_id: the ``init`` event's text (for ``/code``, the context id).
    """

    stdout: str = ""
    stderr: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    error: ExecutionError | None = None
    execution_count: int | None = None
    execution_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return LiteLLM's result shape."""
        error = None
        if self.error is not None:
            error = {
                "name": self.error.name,
                "value": self.error.value,
                "traceback": list(self.error.traceback),
            }
        return {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "results": [dict(r) for r in self.results],
            "error": error,
            "execution_count": self.execution_count,
        }


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the lifecycle API describes it.

    Attributes:
        id: the sandbox id.
        state: ``Pending``, ``Running``, ``Paused``... (servers add values; kept as sent).
        reason: machine-readable reason of the state, or None.
        message: human-readable detail of the state, or None.
        metadata: the sandbox's labels.
        image: the image URI, or None (e.g. created from a snapshot).
        entrypoint: the main process.
        created_at: creation time (timezone-aware), or None.
        expires_at: expiry time (timezone-aware), or None when it never expires.
    """

    id: str
    state: str | None = None
    reason: str | None = None
    message: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    image: str | None = None
    entrypoint: list[str] = field(default_factory=list)
    created_at: datetime | None = None
    expires_at: datetime | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SandboxInfo:
        """Build from a lifecycle ``Sandbox`` object, tolerating missing or odd fields."""
        raw_status = data.get("status")
        status: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
        image = data.get("image")
        metadata = data.get("metadata")
        entrypoint = data.get("entrypoint")
        return cls(
            id=str(data.get("id", "")),
            state=_str_or_none(status.get("state")),
            reason=_str_or_none(status.get("reason")),
            message=_str_or_none(status.get("message")),
            metadata=(
                {str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {}
            ),
            image=_str_or_none(image.get("uri")) if isinstance(image, dict) else None,
            entrypoint=[str(e) for e in entrypoint] if isinstance(entrypoint, list) else [],
            created_at=parse_time(data.get("createdAt")),
            expires_at=parse_time(data.get("expiresAt")),
        )


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


_FRACTION = re.compile(r"\.(\d+)")


def parse_time(value: Any) -> datetime | None:
    """Parse an RFC 3339 time (``Z`` and nanoseconds included, which Python 3.10 rejects)."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    if text[-1:] in ("Z", "z"):
        text = text[:-1] + "+00:00"
    text = _FRACTION.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), text, count=1)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
