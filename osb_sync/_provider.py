"""Host plugins: the ``sandbox_providers`` entry point and portable entry-point discovery."""

from __future__ import annotations

import logging
from typing import Any

from . import _functions as functions
from ._models import ExecutionResult
from ._sandbox import Sandbox

logger = logging.getLogger("osb_sync")


class OpenSandboxProvider:
    """Sandbox provider for hosts that discover providers through entry points.

    A zero-argument class; its methods take the keywords of osb_sync's module-level functions.
    """

    name = "opensandbox"

    def create_sandbox(self, **kw: Any) -> Sandbox:
        """Create a sandbox; see :func:`osb_sync.create_sandbox`."""
        return functions.create_sandbox(**kw)

    def run_code(self, *, container: Sandbox | str, code: str, **kw: Any) -> ExecutionResult:
        """Run code in a sandbox; see :func:`osb_sync.run_code`."""
        return functions.run_code(container, code, **kw)

    def delete_sandbox(self, *, container: Sandbox | str, **kw: Any) -> bool:
        """Delete a sandbox; see :func:`osb_sync.delete_sandbox`."""
        return functions.delete_sandbox(container, **kw)

    def code_interpreter_tool(self, *, code: str, **kw: Any) -> ExecutionResult:
        """Create, run, delete; see :func:`osb_sync.code_interpreter_tool`."""
        return functions.code_interpreter_tool(code, **kw)


def discover_providers(group: str = "sandbox_providers") -> dict[str, object]:
    """Load every entry point of ``group``; a broken plugin is logged and skipped.

    Returns:
        Entry-point name to the loaded object (for osb_sync's own, the provider class).
    """
    from importlib.metadata import entry_points  # imported here: it costs import time

    eps: Any = entry_points()
    selected = eps.select(group=group) if hasattr(eps, "select") else eps.get(group, ())
    providers: dict[str, object] = {}
    for ep in selected:
        try:
            providers[ep.name] = ep.load()
        except Exception:
            logger.warning(
                "could not load sandbox provider %r (%s)", ep.name, ep.value, exc_info=True
            )
    return providers
