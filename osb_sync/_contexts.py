"""``sandbox.contexts``: named code contexts, whose state persists between runs."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

from ._constants import DEFAULT_LANGUAGE
from ._models import CodeContext

if TYPE_CHECKING:
    from ._execd import Execd


class Contexts:
    """``sandbox.contexts``: create, list, get, interrupt and delete code contexts."""

    def __init__(self, execd: Execd):
        self._execd = execd

    def interrupt(self, context: CodeContext | str) -> None:
        """Interrupt the run going on in a code context (a CodeContext or its id).

        Raises:
            NotFoundError: no such context.
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self._execd.interrupt("/code", context.id if isinstance(context, CodeContext) else context)

    def create(self, language: str = DEFAULT_LANGUAGE, cwd: str | None = None) -> CodeContext:
        """Create a named code context: its state persists between runs.

        Raises:
            ApiError: execd refused (an unknown language, for instance).
        """
        body = {"language": language, **({"cwd": cwd} if cwd else {})}
        return CodeContext.from_dict(self._execd.json("POST", "/code/context", json=body), language)

    def list(self, language: str | None = None) -> builtins.list[CodeContext]:
        """The code contexts, of one language or all.

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        params = {"language": language} if language else None
        data = self._execd.json("GET", "/code/contexts", params=params)
        return [CodeContext.from_dict(item, language or "") for item in data or ()]

    def get(self, context_id: str) -> CodeContext:
        """One code context.

        Raises:
            NotFoundError: no such context.
        """
        return CodeContext.from_dict(self._execd.json("GET", f"/code/contexts/{context_id}"))

    def delete(self, context: CodeContext | str) -> None:
        """Delete a code context (its kernel state goes with it).

        Raises:
            NotFoundError: no such context.
        """
        context_id = context.id if isinstance(context, CodeContext) else context
        self._execd.request("DELETE", f"/code/contexts/{context_id}")

    def delete_all(self, language: str) -> None:
        """Delete every code context of a language.

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self._execd.request("DELETE", "/code/contexts", params={"language": language})
