"""osb_sync: a blocking, thread-safe Python client for OpenSandbox.

It creates sandboxes through the OpenSandbox lifecycle API, waits until they run, runs code and
commands in them with capped output, manages their files and code contexts, and deletes
them. No event loop needed: for scripts, Django and Flask handlers, workers and notebooks.

Five names to start with:

- ``Client``: a connection to a server (``OPEN_SANDBOX_API_BASE`` and ``OPEN_SANDBOX_API_KEY``,
  or arguments); ``create_sandbox``, ``connect``, ``code_interpreter_tool``, ``list_sandboxes``.
- ``Sandbox``: one sandbox; ``run_code``, ``stream_code``, ``commands``, ``contexts``, ``files``;
  ``with`` deletes it.
- ``ExecutionResult``: what a run returns: ``stdout``, ``stderr``, ``results`` and ``error`` (an
  exception in the sandbox is returned, not raised).
- ``SandboxPool``: warm sandboxes lent to threads (web handlers, workers); with a
  ``RedisStore``, one pool shared by every worker process and host.
- ``OpenSandboxError``: the base class of every error osb_sync raises.

Example::

    import osb_sync

    with osb_sync.Client() as client, client.create_sandbox() as sandbox:
        print(sandbox.run_code("6 * 7").results)  # [{'text': '42'}]

Also: ``osb_sync.local.LocalServer`` (and ``osb-sync serve``), a local OpenSandbox-compatible
server; ``osb_sync.testing``, a pytest plugin; ``osb_sync.integrations``, for Flask, Django and
deepagents-code. ``help()`` on each name gives its reference. In the source repository,
README.rst is the overview and ``docs/`` holds the guides and API reference (build them with
``tox -e docs``).
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._constants import VERSION as _VERSION

if _TYPE_CHECKING:  # what a type checker sees; at run time each name loads on first use
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
    from ._contexts import Contexts
    from ._errors import (
        ApiError,
        CapacityError,
        CommandFailed,
        ConfigurationError,
        EndpointNotReadyError,
        NotFoundError,
        NotSupportedError,
        OpenSandboxError,
        OutputLimitExceeded,
        PoolClosedError,
        ProxyConnectError,
        ProxyError,
        ProxyResponseError,
        ProxyTimeoutError,
        QuotaExceededError,
        SandboxStateError,
        SandboxTimeoutError,
        StartTimeoutError,
        StreamError,
        TransportError,
    )
    from ._execution import ExecutionStream
    from ._files import Files
    from ._functions import code_interpreter_tool, create_sandbox, delete_sandbox, run_code
    from ._models import (
        CodeContext,
        CommandResult,
        CommandStatus,
        DiagnosticContent,
        Endpoint,
        Event,
        ExecutionError,
        ExecutionResult,
        FileInfo,
        Metrics,
        NetworkPolicy,
        NetworkRule,
        Pool,
        PoolCapacity,
        SandboxInfo,
        SandboxStats,
        Snapshot,
        Template,
    )
    from ._pool import SandboxPool
    from ._pool_in_process import InProcessStore
    from ._pool_redis import RedisStore
    from ._provider import OpenSandboxProvider, discover_providers
    from ._pty import Pty, PtyConnection, PtyStatus
    from ._resources import Diagnostics, Network, Pools, Snapshots, Templates
    from ._sandbox import Sandbox
    from ._stream import parse_execution

__version__ = _VERSION

# Every name is imported on first use (PEP 562): `import osb_sync` and `osb-sync --version` load
# neither requests nor the client until a name is used.
_LAZY = {
    "ApiError": "._errors",
    "BackgroundCommand": "._commands",
    "BashSession": "._commands",
    "Client": "._client",
    "CodeContext": "._models",
    "CommandFailed": "._errors",
    "CommandResult": "._models",
    "CommandStatus": "._models",
    "Commands": "._commands",
    "ConfigurationError": "._errors",
    "Contexts": "._contexts",
    "DEFAULT_ENTRYPOINT": "._constants",
    "DEFAULT_LANGUAGE": "._constants",
    "DEFAULT_POLL_INTERVAL": "._constants",
    "DEFAULT_READY_TIMEOUT": "._constants",
    "DEFAULT_RESOURCE_LIMITS": "._constants",
    "DEFAULT_TEMPLATE": "._constants",
    "DEFAULT_TIMEOUT": "._constants",
    "EXECD_PORT": "._constants",
    "Endpoint": "._models",
    "Event": "._models",
    "ExecutionError": "._models",
    "ExecutionResult": "._models",
    "ExecutionStream": "._execution",
    "FileInfo": "._models",
    "MAX_OUTPUT_BYTES": "._constants",
    "Metrics": "._models",
    "NO_TIMEOUT": "._constants",
    "NotFoundError": "._errors",
    "OpenSandboxError": "._errors",
    "OutputLimitExceeded": "._errors",
    "PoolClosedError": "._errors",
    "Sandbox": "._sandbox",
    "SandboxInfo": "._models",
    "SandboxStats": "._models",
    "SandboxStateError": "._errors",
    "SandboxTimeoutError": "._errors",
    "StreamError": "._errors",
    "TransportError": "._errors",
    # the released 1.1 API (issue 26)
    "NotSupportedError": "._errors",
    "DiagnosticContent": "._models",
    "NetworkPolicy": "._models",
    "NetworkRule": "._models",
    "Pool": "._models",
    "PoolCapacity": "._models",
    "Snapshot": "._models",
    "Template": "._models",
    # the Kubernetes contract (issue 47)
    "CapacityError": "._errors",
    "EndpointNotReadyError": "._errors",
    "ProxyConnectError": "._errors",
    "ProxyError": "._errors",
    "ProxyResponseError": "._errors",
    "ProxyTimeoutError": "._errors",
    "QuotaExceededError": "._errors",
    "StartTimeoutError": "._errors",
    "Diagnostics": "._resources",
    "Network": "._resources",
    "Pools": "._resources",
    "Snapshots": "._resources",
    "Templates": "._resources",
    "parse_execution": "._stream",
    "Files": "._files",
    "SandboxPool": "._pool",
    "InProcessStore": "._pool_in_process",
    "RedisStore": "._pool_redis",
    "OpenSandboxProvider": "._provider",
    "discover_providers": "._provider",
    "code_interpreter_tool": "._functions",
    "create_sandbox": "._functions",
    "delete_sandbox": "._functions",
    "run_code": "._functions",
    # terminals (issue 46)
    "Pty": "._pty",
    "PtyConnection": "._pty",
    "PtyStatus": "._pty",
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
    "CapacityError",
    "Client",
    "CodeContext",
    "CommandFailed",
    "CommandResult",
    "CommandStatus",
    "Commands",
    "ConfigurationError",
    "Contexts",
    "DiagnosticContent",
    "Diagnostics",
    "Endpoint",
    "EndpointNotReadyError",
    "Event",
    "ExecutionError",
    "ExecutionResult",
    "ExecutionStream",
    "FileInfo",
    "Files",
    "InProcessStore",
    "Metrics",
    "Network",
    "NetworkPolicy",
    "NetworkRule",
    "NotFoundError",
    "NotSupportedError",
    "OpenSandboxError",
    "OpenSandboxProvider",
    "OutputLimitExceeded",
    "Pool",
    "PoolCapacity",
    "PoolClosedError",
    "Pools",
    "ProxyConnectError",
    "ProxyError",
    "ProxyResponseError",
    "ProxyTimeoutError",
    "Pty",
    "PtyConnection",
    "PtyStatus",
    "QuotaExceededError",
    "RedisStore",
    "Sandbox",
    "SandboxInfo",
    "SandboxPool",
    "SandboxStateError",
    "SandboxStats",
    "SandboxTimeoutError",
    "Snapshot",
    "Snapshots",
    "StartTimeoutError",
    "StreamError",
    "Template",
    "Templates",
    "TransportError",
    "code_interpreter_tool",
    "create_sandbox",
    "delete_sandbox",
    "discover_providers",
    "parse_execution",
    "run_code",
]
