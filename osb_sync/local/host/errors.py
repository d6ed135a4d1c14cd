"""What the local server's mechanics refuse, as their own errors, before any HTTP answer.

The mechanics (`limits`, `volumes`, `capacity`, `bwrap`'s network plan, `images/`) raise these
and never an HTTP status; the server turns each into the answer the released server gives for
the same refusal in one place (`server.answer`, for every route). The root is never raised,
only its leaves::

    LocalError
     ├── LimitError       a resourceLimits value the server cannot take
     ├── UnenforcedLimitError  a limit asked for that it cannot enforce (`--require-limits`)
     ├── PolicyError      a network policy the server cannot enforce
     ├── InternetError    internet access where the firewall's tools are missing
     ├── IsolationError   what needs isolated sandboxes, where they are not
     ├── CapacityError    no descriptors or memory left for another sandbox
     ├── FieldError       a field of the wrong shape (FastAPI's 422 names it)
     ├── VolumeError      a volume refused (its code: INVALID_MOUNT_PATH, ...)
     └── ImageError       an image that cannot be had or run (its reason: IMAGE_TOO_LARGE, ...)

Each message says what to change, in the caller's terms (a create field, a server option).
"""

from __future__ import annotations

from typing import Any


class LocalError(Exception):
    """The root of the local server's own errors (never raised itself)."""


class LimitError(LocalError):
    """A `resourceLimits` value that is malformed or out of range."""


class UnenforcedLimitError(LocalError):
    """A limit the create asked for that this server cannot enforce, where it was told to
    refuse such creates (`require_limits`)."""


class PolicyError(LocalError):
    """A network policy the server cannot enforce, and was not told to accept unenforced."""


class InternetError(LocalError):
    """Internet access asked for where the tools that keep it from the host are missing."""


class IsolationError(LocalError):
    """Something only an isolated sandbox can have, where sandboxes are not isolated."""


class CapacityError(LocalError):
    """No descriptors or memory left for another sandbox."""


class FieldError(LocalError):
    """A request field of the wrong shape.

    Args:
        kind: pydantic's error type (`dict_type`, `missing`, `string_pattern_mismatch`...).
        loc: where the field is (`["body", "volumes", 0, "name"]`).
        msg: pydantic's sentence.
        value: the value found.
    """

    def __init__(self, kind: str, loc: list[Any], msg: str, value: Any) -> None:
        super().__init__(f"{'.'.join(map(str, loc))}: {msg}")
        self.kind, self.loc, self.msg, self.value = kind, loc, msg, value


class VolumeError(LocalError):
    """A volume refused; `code` names the rule (`INVALID_MOUNT_PATH`, `CREATE_FAILED`...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class ImageError(LocalError):
    """The image `uri` cannot be had or run; `reason` first (`IMAGE_TOO_LARGE`...)."""

    def __init__(self, uri: str, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.uri, self.reason, self.message = uri, reason, message
