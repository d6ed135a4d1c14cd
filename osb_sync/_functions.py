"""Module-level functions for callers without a client, mirroring LiteLLM's entry points.

Each call that is not given a Sandbox builds a short-lived Client from ``api_base``,
``api_key`` and ``session`` (or the environment). Code that makes many calls should hold one
``Client`` instead, so that connections are reused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import requests

from ._client import Client
from ._models import ExecutionResult
from ._options import CODE_RUN_DEFAULTS, CodeRunOptions, with_keywords
from ._sandbox import Sandbox

if TYPE_CHECKING:
    from typing_extensions import Unpack


def create_sandbox(
    *,
    api_key: str | None = None,
    api_base: str | None = None,
    session: requests.Session | None = None,
    **create_kwargs: Any,
) -> Sandbox:
    """Create a sandbox with a new client (the Sandbox keeps its connections).

    Raises:
        The errors of :meth:`Client.create_sandbox`.
    """
    client = Client(api_base, api_key, session=session)
    try:
        return client.create_sandbox(**create_kwargs)
    except BaseException:
        client.close()
        raise


@with_keywords(CodeRunOptions, CODE_RUN_DEFAULTS)
def run_code(
    container: Sandbox | str,
    code: str,
    *,
    api_key: str | None = None,
    api_base: str | None = None,
    session: requests.Session | None = None,
    **options: Unpack[CodeRunOptions],
) -> ExecutionResult:
    """Run code in a sandbox: a Sandbox (which carries its own client) or a bare id.

    The run's keywords are :meth:`Sandbox.run_code`'s (``context`` only with a Sandbox).

    Raises:
        The errors of :meth:`Client.run_code`.
    """
    if isinstance(container, Sandbox):
        return container.run_code(code, **options)
    with Client(api_base, api_key, session=session) as client:
        # A context needs its sandbox's handle: Client.run_code refuses it (TypeError).
        return client.run_code(container, code, **options)  # type: ignore[misc]


def delete_sandbox(
    container: Sandbox | str,
    *,
    api_key: str | None = None,
    api_base: str | None = None,
    session: requests.Session | None = None,
) -> bool:
    """Delete a sandbox (a Sandbox or a bare id); False if it did not exist.

    Raises:
        The errors of :meth:`Client.delete_sandbox`.
    """
    if isinstance(container, Sandbox):
        return container.delete()
    with Client(api_base, api_key, session=session) as client:
        return client.delete_sandbox(container)


def code_interpreter_tool(
    code: str,
    *,
    api_key: str | None = None,
    api_base: str | None = None,
    session: requests.Session | None = None,
    **kw: Any,
) -> ExecutionResult:
    """Create a sandbox, run code, delete the sandbox; see :meth:`Client.code_interpreter_tool`.

    Raises:
        The errors of :meth:`Client.code_interpreter_tool`.
    """
    with Client(api_base, api_key, session=session) as client:
        return client.code_interpreter_tool(code, **kw)
