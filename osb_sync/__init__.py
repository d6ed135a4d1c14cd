"""osb_sync: a synchronous, thread-safe client for OpenSandbox.

Table of contents only; see README.rst for the API and error tables.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._client import Client
from ._commands import BackgroundCommand, BashSession, Commands
from ._constants import (
    DEFAULT_ENTRYPOINT,
    DEFAULT_LANGUAGE,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_READY_TIMEOUT,
    DEFAULT_RESOURCE_LIMITS,
    DEFAULT_TEMPLATE,
    DEFAULT_TIMEOUT,
    EXECD_PORT,
    MAX_OUTPUT_BYTES,
    NO_TIMEOUT,
)
from ._constants import VERSION as _VERSION
from ._contexts import Contexts
from ._errors import (
    ApiError,
    CommandFailed,
    ConfigurationError,
    NotFoundError,
    OpenSandboxError,
    OutputLimitExceeded,
    SandboxStateError,
    SandboxTimeoutError,
    StreamError,
    TransportError,
)
from ._execution import ExecutionStream
from ._models import (
    CodeContext,
    CommandResult,
    CommandStatus,
    Endpoint,
    Event,
    ExecutionError,
    ExecutionResult,
    FileInfo,
    Metrics,
    SandboxInfo,
)
from ._sandbox import Sandbox
from ._stream import parse_execution

if _TYPE_CHECKING:
    from ._files import Files
    from ._functions import code_interpreter_tool, create_sandbox, delete_sandbox, run_code
    from ._pool import SandboxPool
    from ._provider import OpenSandboxProvider, discover_providers

__version__ = _VERSION

# Imported on first use, so that a script that only runs code does not pay for them.
_LAZY = {
    "Files": "._files",
    "SandboxPool": "._pool",
    "OpenSandboxProvider": "._provider",
    "discover_providers": "._provider",
    "code_interpreter_tool": "._functions",
    "create_sandbox": "._functions",
    "delete_sandbox": "._functions",
    "run_code": "._functions",
}


def __getattr__(name: str) -> _Any:
    """The names of ``_LAZY`` and ``osb_sync.local`` (the server) on first use."""
    if name == "local":
        return _importlib.import_module(".local", __name__)
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """Every name, the ones imported on first use included."""
    return sorted({*globals(), *_LAZY, "local"})


__all__ = [
    "DEFAULT_ENTRYPOINT",
    "DEFAULT_LANGUAGE",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_READY_TIMEOUT",
    "DEFAULT_RESOURCE_LIMITS",
    "DEFAULT_TEMPLATE",
    "DEFAULT_TIMEOUT",
    "EXECD_PORT",
    "MAX_OUTPUT_BYTES",
    "NO_TIMEOUT",
    "ApiError",
    "BackgroundCommand",
    "BashSession",
    "Client",
    "CodeContext",
    "CommandFailed",
    "CommandResult",
    "CommandStatus",
    "Commands",
    "ConfigurationError",
    "Contexts",
    "Endpoint",
    "Event",
    "ExecutionError",
    "ExecutionResult",
    "ExecutionStream",
    "FileInfo",
    "Files",
    "Metrics",
    "NotFoundError",
    "OpenSandboxError",
    "OpenSandboxProvider",
    "OutputLimitExceeded",
    "Sandbox",
    "SandboxInfo",
    "SandboxPool",
    "SandboxStateError",
    "SandboxTimeoutError",
    "StreamError",
    "TransportError",
    "code_interpreter_tool",
    "create_sandbox",
    "delete_sandbox",
    "discover_providers",
    "parse_execution",
    "run_code",
]
