"""Plain data returned by the client. No I/O here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ._errors import CommandFailed, ConfigurationError, OpenSandboxError


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True)
class CommandResult:
    """What one shell command produced. A non-zero exit is data, not an exception.

    Attributes:
        id: the command id from ``init`` (for status, logs, interrupt).
        exit_code: the exit code, -1 for a signal death, None when unknown.
        stdout: the output text, each line followed by ``"\\n"``.
        stderr: the error text, likewise (empty for bash sessions: they merge it into stdout).
        error: the error event, or None.
        timed_out: the command ran past its ``timeout`` and was stopped.
        duration: seconds from the request to the end of the stream.
    """

    id: str | None = None
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: ExecutionError | None = None
    timed_out: bool = False
    duration: float = 0.0

    def check(self) -> CommandResult:
        """Return self if the command succeeded.

        Raises:
            CommandFailed: non-zero exit, an error, or a timeout; with the tail of stderr.
        """
        if self.exit_code == 0 and not self.timed_out and self.error is None:
            return self
        tail = (self.stderr or self.stdout)[-_TAIL_CHARS:]
        if self.timed_out:
            reason = "timed out"
        elif self.exit_code is not None:
            reason = f"exited with {self.exit_code}"
        else:
            reason = f"failed: {self.error.value if self.error else 'no exit code'}"
        raise CommandFailed(
            f"command {self.id or ''} {reason}".replace("  ", " ") + (f": {tail}" if tail else ""),
            exit_code=self.exit_code,
            stderr=self.stderr,
        )


_TAIL_CHARS = 2000


@dataclass(frozen=True)
class CommandStatus:
    """A command's state as execd reports it."""

    id: str
    running: bool
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    content: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommandStatus:
        """Build from execd's ``/command/status`` body."""
        exit_code = data.get("exit_code")
        return cls(
            id=str(data.get("id", "")),
            running=bool(data.get("running")),
            exit_code=exit_code if isinstance(exit_code, int) else None,
            started_at=parse_time(data.get("started_at")),
            finished_at=parse_time(data.get("finished_at")),
            error=_str_or_none(data.get("error")),
            content=_str_or_none(data.get("content")),
        )


@dataclass(frozen=True)
class CodeContext:
    """A named code context: state (variables, imports) persists between runs in it."""

    id: str
    language: str

    @classmethod
    def from_dict(cls, data: Any, language: str = "") -> CodeContext:
        """Build from execd's ``{"id", "language"}``; ``language`` fills a missing one.

        Raises:
            OpenSandboxError: the answer has no id.
        """
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise OpenSandboxError("execd described a code context without an id")
        return cls(id=data["id"], language=str(data.get("language") or language))


@dataclass(frozen=True)
class Endpoint:
    """How to reach a port a sandbox serves: ``url`` with scheme, and the headers to send."""

    url: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Metrics:
    """One resource sample of a sandbox."""

    cpu_count: float
    cpu_used_pct: float
    mem_total_mib: float
    mem_used_mib: float
    timestamp: int | None = None

    @classmethod
    def from_dict(cls, data: Any) -> Metrics:
        """Build from execd's ``/metrics`` answer; missing numbers are 0."""
        data = data if isinstance(data, dict) else {}
        timestamp = data.get("timestamp")
        return cls(
            cpu_count=_number(data.get("cpu_count")),
            cpu_used_pct=_number(data.get("cpu_used_pct")),
            mem_total_mib=_number(data.get("mem_total_mib")),
            mem_used_mib=_number(data.get("mem_used_mib")),
            timestamp=timestamp if type(timestamp) is int else None,
        )


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


@dataclass(frozen=True)
class FileInfo:
    """A file or directory in a sandbox.

    ``mode`` holds the permission bits as a number (``0o644``); execd's wire form (the decimal
    digits ``644``) is converted both ways.
    """

    path: str
    type: str
    size: int = 0
    mode: int = 0
    owner: str | None = None
    group: str | None = None
    modified_at: datetime | None = None
    created_at: datetime | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FileInfo:
        """Build from execd's ``FileInfo`` object."""
        size = data.get("size")
        return cls(
            path=str(data.get("path", "")),
            type=str(data.get("type", "")),
            size=size if isinstance(size, int) else 0,
            mode=mode_from_wire(data.get("mode")),
            owner=_str_or_none(data.get("owner")),
            group=_str_or_none(data.get("group")),
            modified_at=parse_time(data.get("modified_at")),
            created_at=parse_time(data.get("created_at")),
        )


def mode_to_wire(mode: int) -> int:
    """0o755 -> 755: execd reads the decimal digits as octal.

    Raises:
        ConfigurationError: not an int from 0 to 0o7777.
    """
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
        raise ConfigurationError(
            f"a file mode must be an int from 0 to 0o7777 such as 0o644, got {mode!r}"
        )
    return int(format(mode, "o"))


def mode_from_wire(value: Any) -> int:
    """755 -> 0o755; anything unreadable -> 0."""
    try:
        return int(str(int(value)), 8)
    except (TypeError, ValueError):
        return 0
