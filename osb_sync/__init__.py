"""osb_sync: a synchronous, thread-safe client for OpenSandbox.

Table of contents only; see README.rst for the API and error tables.
"""

import importlib
from typing import Any

from .client import Client
from .commands import BackgroundCommand, BashSession
from .constants import (
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
    VERSION,
)
from .errors import (
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
from .execution import ExecutionStream
from .files import Files
from .functions import code_interpreter_tool, create_sandbox, delete_sandbox, run_code
from .models import (
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
from .pool import SandboxPool
from .provider import OpenSandboxProvider, discover_providers
from .sandbox import Sandbox
from .stream import parse_execution

__version__ = VERSION


def __getattr__(name: str) -> Any:
    """``osb_sync.local`` on first use: ``import osb_sync`` stays light without the server."""
    if name == "local":
        return importlib.import_module(".local", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "ConfigurationError",
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
