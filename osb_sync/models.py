"""Plain data returned by the client. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass, field
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
