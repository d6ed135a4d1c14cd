"""``sandbox.contexts``: named code contexts, whose state persists between runs."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

from . import _answers as answers
from ._constants import DEFAULT_LANGUAGE
from ._execd import LISTING_BYTES
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
            ApiError: execd refused (an unknown language, for instance), or answered an id
                that cannot stand in a URL (``code`` ``INVALID_RESPONSE``).
        """
        body = {"language": language, **({"cwd": cwd} if cwd else {})}
        return self._execd.answer(
            "POST",
            "/code/context",
            lambda data: answers.code_context(data, language, secrets=self._execd.secrets),
            json=body,
        )

    def list(self, language: str | None = None) -> builtins.list[CodeContext]:
        """The code contexts, of one language or all.

        Raises:
            ApiError: execd refused the call, or answered something else than a list of
                contexts with ids that can stand in a URL (``code`` ``INVALID_RESPONSE``).
            TransportError: execd could not be reached.
        """
        params = {"language": language} if language else None
        return self._execd.answer(
            "GET",
            "/code/contexts",
            lambda data: answers.code_contexts(data, language or "", self._execd.secrets),
            params=params,
            max_body=LISTING_BYTES,
        )

    def get(self, context_id: str) -> CodeContext:
        """One code context.

        Raises:
            ConfigurationError: an empty id, ``.`` or ``..``.
            NotFoundError: no such context.
            ApiError: an answer that is not a context (``code`` ``INVALID_RESPONSE``).
        """
        return self._execd.answer(
            "GET",
            f"/code/contexts/{answers.in_url(context_id, 'a context id')}",
            lambda data: answers.code_context(data, secrets=self._execd.secrets),
        )

    def delete(self, context: CodeContext | str) -> None:
        """Delete a code context (its kernel state goes with it).

        Raises:
            ConfigurationError: an empty id, ``.`` or ``..``.
            NotFoundError: no such context.
        """
        context_id = context.id if isinstance(context, CodeContext) else context
        self._execd.request(
            "DELETE", f"/code/contexts/{answers.in_url(context_id, 'a context id')}"
        )

    def delete_all(self, language: str) -> None:
        """Delete every code context of a language.

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self._execd.request("DELETE", "/code/contexts", params={"language": language})
