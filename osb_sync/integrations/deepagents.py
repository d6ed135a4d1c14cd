"""OpenSandbox as a deepagents-code sandbox (``dcode --sandbox opensandbox``).

deepagents-code finds :class:`OpenSandboxProvider` through the entry point
``deepagents_code.sandbox_providers: opensandbox`` and calls it with no arguments. This module
imports the host's base classes, so only the host imports it; ``import osb_sync`` never does.

Configuration: ``OPEN_SANDBOX_API_BASE`` and ``OPEN_SANDBOX_API_KEY``, or ``params`` of a
provider declared in ``~/.deepagents/config.toml`` (with ``class_path`` naming
:class:`OpenSandboxProvider`: a config entry replaces the entry point). ``api_base``,
``api_key``, ``execd_scheme``, ``connect_timeout`` and ``read_timeout`` configure the client,
``execute_timeout`` and ``max_output_bytes`` the backend; the rest go to
``Client.create_sandbox`` (``template``, ``timeout``, ``allow_internet_access``, ``env_vars``...).
The network is deny-all unless ``allow_internet_access = true``. A sandbox lives one hour
unless ``timeout`` says otherwise, and is renewed for as long again while the agent keeps using
it. ``OPEN_SANDBOX_WORKING_DIR`` (default ``/tmp``) is the directory the agent is told to work
in.

The backend runs commands through execd's ``/command`` and moves files through its file API;
``ls``, ``read``, ``write``, ``edit``, ``grep`` and ``glob`` come from the host's ``BaseSandbox``,
which builds them on ``execute`` and ``upload_files``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from deepagents.backends.protocol import (
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)
from deepagents.backends.sandbox import BaseSandbox
from deepagents_code.integrations.sandbox_provider import (
    SandboxInstallHint,
    SandboxNotFoundError,
    SandboxProvider,
    SandboxProviderMetadata,
)

from .._client import Client
from .._constants import MAX_OUTPUT_BYTES
from .._errors import ApiError, NotFoundError, OpenSandboxError, OutputLimitExceeded
from .._sandbox import Sandbox

logger = logging.getLogger("osb_sync")

# The host's own local shell waits 120 s by default; a command may ask for more.
DEFAULT_EXECUTE_TIMEOUT = 120
DEFAULT_LIFETIME = 3600
WORKING_DIR_ENV = "OPEN_SANDBOX_WORKING_DIR"
CLIENT_OPTIONS = ("api_base", "api_key", "execd_scheme", "connect_timeout", "read_timeout")
BACKEND_OPTIONS = ("execute_timeout", "max_output_bytes")
CONNECT_OPTIONS = ("use_server_proxy", "ready_timeout", "poll_interval")


class OpenSandboxBackend(BaseSandbox):  # type: ignore[misc]
    """One OpenSandbox sandbox as a deepagents ``SandboxBackendProtocol``.

    Args:
        sandbox: the running sandbox.
        execute_timeout: seconds a command may run when ``execute`` is given no timeout.
        max_output_bytes: cap on a command's output and on a downloaded file.
        lifetime: the sandbox's lifetime in seconds, if known: while the agent keeps using it,
            it is renewed for that long once half of it has passed.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        execute_timeout: float = DEFAULT_EXECUTE_TIMEOUT,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        lifetime: float | None = None,
    ):
        self.sandbox = sandbox
        self.execute_timeout = execute_timeout
        self.max_output_bytes = max_output_bytes
        self.lifetime = lifetime
        self._renew_at = None if lifetime is None else time.monotonic() + lifetime / 2

    @property
    def id(self) -> str:
        """The sandbox id."""
        return self.sandbox.id

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run a shell command; stdout and stderr interleaved as they arrived.

        ``timeout`` in seconds (``0``: none; ``None``: ``execute_timeout``). A command past it
        is killed by execd and answered with exit code 124; output past ``max_output_bytes``
        stops the command and sets ``truncated``. Transport and API errors raise.
        """
        self._keep_alive()
        limit = self.execute_timeout if timeout is None else timeout
        output: list[str] = []
        try:
            result = self.sandbox.commands.run(
                command,
                timeout=limit or None,
                on_stdout=output.append,
                on_stderr=output.append,
                max_output_bytes=self.max_output_bytes,
            )
        except OutputLimitExceeded:
            output.append(f"\n... output truncated at {self.max_output_bytes} bytes")
            return ExecuteResponse(output="".join(output), exit_code=None, truncated=True)
        if result.timed_out:
            output.append(f"\nError: command timed out after {limit} seconds")
            return ExecuteResponse(output="".join(output), exit_code=124)
        return ExecuteResponse(output="".join(output), exit_code=result.exit_code)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write files (parents created); a failure is reported per file, never raised."""
        self._keep_alive()
        try:
            self.sandbox.files.write_many(files)
            return [FileUploadResponse(path=path) for path, _ in files]
        except OpenSandboxError:
            pass  # find out which ones failed, one by one
        responses = []
        for path, content in files:
            try:
                self.sandbox.files.write(path, content)
                responses.append(FileUploadResponse(path=path))
            except OpenSandboxError as exc:
                responses.append(FileUploadResponse(path=path, error=_file_error(exc)))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read files (each up to ``max_output_bytes``); a failure is reported per file."""
        self._keep_alive()
        responses = []
        for path in paths:
            try:
                content = self.sandbox.files.read_bytes(path, max_bytes=self.max_output_bytes)
                responses.append(FileDownloadResponse(path=path, content=content))
            except NotFoundError:
                error = "is_directory" if self._is_directory(path) else "file_not_found"
                responses.append(FileDownloadResponse(path=path, error=error))
            except OpenSandboxError as exc:
                responses.append(FileDownloadResponse(path=path, error=_file_error(exc)))
        return responses

    def _keep_alive(self) -> None:
        """Renew a sandbox in use past half its lifetime (an agent session may outlast it)."""
        if self._renew_at is None or self.lifetime is None or time.monotonic() < self._renew_at:
            return
        try:
            self.sandbox.renew(self.lifetime)
        except OpenSandboxError as exc:
            logger.warning("could not renew sandbox %s: %s", self.sandbox.id, exc)
            return
        self._renew_at = time.monotonic() + self.lifetime / 2

    def _is_directory(self, path: str) -> bool:
        try:
            found = self.sandbox.files.info(path)
        except OpenSandboxError:
            return False
        return any(info.type == "directory" for info in found.values())


def _file_error(exc: OpenSandboxError) -> str:
    """deepagents' standard error names where they apply, else the message."""
    text = str(exc).lower()
    if (isinstance(exc, ApiError) and exc.status_code == 403) or "permission denied" in text:
        return "permission_denied"
    if "is a directory" in text:
        return "is_directory"
    return str(exc)


class OpenSandboxProvider(SandboxProvider):  # type: ignore[misc]
    """deepagents-code's provider for OpenSandbox; zero-argument, as the host calls it.

    Clients are made on first use (one per api_base and api_key) and shared by the backends.
    """

    def __init__(self) -> None:
        self._clients: dict[tuple[Any, ...], Client] = {}
        self._lock = threading.Lock()

    @property
    def metadata(self) -> SandboxProviderMetadata:
        """What the host shows and tells the agent (the name and the working directory)."""
        return SandboxProviderMetadata(
            name="opensandbox",
            working_dir=os.environ.get(WORKING_DIR_ENV) or "/tmp",  # noqa: S108
            install=SandboxInstallHint(kind="package", name="osb-sync"),
            supports_sandbox_id=True,
            supports_snapshot_name=False,
        )

    def get_or_create(self, *, sandbox_id: str | None = None, **kwargs: Any) -> OpenSandboxBackend:
        """Connect to ``sandbox_id``, or create a sandbox with ``kwargs``.

        Raises:
            SandboxNotFoundError: no sandbox ``sandbox_id``.
            OpenSandboxError: the server refused or could not be reached.
        """
        client = self._client(kwargs)
        backend_options = {k: kwargs.pop(k) for k in BACKEND_OPTIONS if k in kwargs}
        if sandbox_id:
            options = {k: v for k, v in kwargs.items() if k in CONNECT_OPTIONS}
            try:
                client.get_sandbox(sandbox_id)  # connect() would wait for an endpoint instead
            except NotFoundError as exc:
                raise SandboxNotFoundError(f"no OpenSandbox sandbox {sandbox_id}") from exc
            sandbox = client.connect(sandbox_id, **options)
        else:
            lifetime = kwargs.setdefault("timeout", DEFAULT_LIFETIME)
            sandbox = client.create_sandbox(**kwargs)
            if isinstance(lifetime, (int, float)):
                backend_options["lifetime"] = lifetime
        return OpenSandboxBackend(sandbox, **backend_options)

    def delete(self, *, sandbox_id: str, **kwargs: Any) -> None:
        """Delete a sandbox (one already gone is fine).

        Raises:
            OpenSandboxError: the server refused or could not be reached.
        """
        self._client(kwargs).delete_sandbox(sandbox_id)

    def _client(self, kwargs: dict[str, Any]) -> Client:
        """The shared client for the client options in ``kwargs`` (removed from it)."""
        options = {k: kwargs.pop(k) for k in CLIENT_OPTIONS if k in kwargs}
        key = tuple(sorted(options.items()))
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = Client(**options)
            return client
