"""What Client does with sandboxes it names by id: describe, list, pause, resume, delete..."""

from __future__ import annotations

import builtins
import threading
from collections import OrderedDict
from datetime import datetime
from typing import Iterator, Mapping, Sequence

from ._config import check_id, wait_settings
from ._errors import ConfigurationError
from ._lifecycle import MAX_PAGE_SIZE, Lifecycle
from ._models import Endpoint, SandboxInfo
from ._sandbox import Sandbox

# Handles kept for calls by sandbox id (Client.run_code(sandbox_id, ...)).
HANDLES_KEPT = 64


class SandboxManagement:
    """The lifecycle calls of :class:`Client` (its base class) on sandboxes named by id.

    It also keeps the handles reached for runs by id, and forgets one whenever a call here
    may move or end its sandbox.
    """

    def __init__(self, lifecycle: Lifecycle):
        self._lifecycle = lifecycle
        self._handles = Handles()

    def delete_sandbox(self, sandbox: Sandbox | str) -> bool:
        """Delete a sandbox.

        Returns:
            True if it was deleted, False if it did not exist (404).

        Raises:
            ApiError: any other error status.
            TransportError: the server could not be reached.
        """
        sandbox_id = check_id(sandbox.id if isinstance(sandbox, Sandbox) else sandbox)
        self._handles.forget(sandbox_id)
        return self._lifecycle.delete(sandbox_id)

    def delete_quietly(self, sandbox: Sandbox | str) -> bool:
        """Delete a sandbox for a cleanup path: a failure is logged, never raised.

        What ``with sandbox:``, :class:`SandboxPool`, the CLI and the pytest plugin use.

        Returns:
            True if it was deleted; False if it did not exist or could not be deleted.
        """
        sandbox_id = check_id(sandbox.id if isinstance(sandbox, Sandbox) else sandbox)
        self._handles.forget(sandbox_id)
        return self._lifecycle.delete_quietly(sandbox_id)

    def get_sandbox(self, sandbox_id: str) -> SandboxInfo:
        """Fetch a sandbox's current description.

        Raises:
            NotFoundError: no such sandbox.
            ApiError: another error status.
            TransportError: the server could not be reached.
        """
        return self._lifecycle.info(check_id(sandbox_id))

    def list_sandboxes(
        self,
        *,
        states: Sequence[str] | None = None,
        metadata: Mapping[str, str] | None = None,
        page_size: int = 50,
    ) -> Iterator[SandboxInfo]:
        """Iterate over sandboxes, following pagination lazily.

        Args:
            states: keep sandboxes in any of these states.
            metadata: keep sandboxes whose labels include all of these.
            page_size: sandboxes per request (1 to 200).

        Raises:
            ApiError: an error status.
            TransportError: the server could not be reached.
        """
        if not isinstance(page_size, int) or not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ConfigurationError(f"page_size must be an int from 1 to {MAX_PAGE_SIZE}")
        for item in self._lifecycle.iter_sandboxes(states, metadata, page_size):
            yield SandboxInfo.from_dict(item)

    def get_endpoint(
        self,
        sandbox_id: str,
        port: int,
        *,
        use_server_proxy: bool = False,
        ready_timeout: float | None = None,
    ) -> Endpoint:
        """How to reach ``port`` of a sandbox: a URL with scheme, and the headers to send.

        Raises:
            ConfigurationError: a port outside 1..65535.
            SandboxTimeoutError: no endpoint within ``ready_timeout``.
            ApiError: the server refused.
        """
        ready_timeout, poll_interval = wait_settings(ready_timeout, None)
        return self._lifecycle.endpoint(
            check_id(sandbox_id), port, use_server_proxy, ready_timeout, poll_interval
        )

    def pause(self, sandbox_id: str) -> None:
        """Pause a sandbox.

        Raises:
            ApiError: e.g. 409 when it is not running.
        """
        sandbox_id = check_id(sandbox_id)
        self._handles.forget(sandbox_id)
        self._lifecycle.action(sandbox_id, "pause")

    def resume(
        self,
        sandbox_id: str,
        *,
        ready_timeout: float | None = None,
        poll_interval: float | None = None,
    ) -> None:
        """Resume a paused sandbox and wait until it is Running.

        Raises:
            ApiError: e.g. 409 when it is not paused.
            SandboxTimeoutError: not Running within ``ready_timeout``.
        """
        sandbox_id = check_id(sandbox_id)
        ready_timeout, poll_interval = wait_settings(ready_timeout, poll_interval)
        self._handles.forget(sandbox_id)
        self._lifecycle.resume(sandbox_id, ready_timeout, poll_interval)

    def renew(self, sandbox_id: str, seconds: float) -> datetime | None:
        """Make a sandbox expire ``seconds`` from now; returns the new expiry.

        Raises:
            ConfigurationError: ``seconds`` is not a positive number.
            ApiError: e.g. a sandbox without expiry.
        """
        return self._lifecycle.renew(check_id(sandbox_id), seconds)

    def patch_metadata(self, sandbox_id: str, patch: Mapping[str, str | None]) -> SandboxInfo:
        """Merge-patch a sandbox's labels: a value adds or replaces, ``None`` deletes.

        Raises:
            ApiError: e.g. a reserved or invalid label.
        """
        return self._lifecycle.patch_metadata(check_id(sandbox_id), patch)

    def delete_all(self, *, metadata: Mapping[str, str]) -> builtins.list[str]:
        """Delete every sandbox whose labels include ``metadata``; returns their ids.

        The cleanup tool after a crash (pooled sandboxes carry a pool tag, every create an
        ``osb-sync/create-id``). An empty filter is refused: it would match everything.

        Raises:
            ConfigurationError: an empty ``metadata``.
        """
        if not metadata:
            raise ConfigurationError("delete_all needs a non-empty metadata filter")
        ids = [info.id for info in self.list_sandboxes(metadata=metadata, page_size=MAX_PAGE_SIZE)]
        return [sandbox_id for sandbox_id in ids if self._lifecycle.delete(sandbox_id)]


class Handles:
    """The last ``HANDLES_KEPT`` handles reached for calls by sandbox id (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: OrderedDict[str, Sandbox] = OrderedDict()

    def get(self, sandbox_id: str) -> Sandbox | None:
        with self._lock:
            handle = self._handles.get(sandbox_id)
            if handle is not None:
                self._handles.move_to_end(sandbox_id)
            return handle

    def keep(self, handle: Sandbox) -> Sandbox:
        with self._lock:
            self._handles[handle.id] = handle
            while len(self._handles) > HANDLES_KEPT:
                self._handles.popitem(last=False)
        return handle

    def forget(self, sandbox_id: str) -> None:
        with self._lock:
            self._handles.pop(sandbox_id, None)
