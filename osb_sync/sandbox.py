"""The Sandbox handle: code, commands, contexts, files and lifecycle of one sandbox."""

from __future__ import annotations

import builtins
import time
from typing import TYPE_CHECKING, Callable, Mapping

from .commands import (
    BackgroundCommand,
    BashSession,
    CommandFolder,
    client_deadline,
    collect,
    command_body,
    line_callbacks,
)
from .config import check_run_arguments
from .constants import DEFAULT_LANGUAGE, MAX_OUTPUT_BYTES
from .errors import OpenSandboxError, SandboxStateError, SandboxTimeoutError
from .execd import Execd, execd_base_url
from .files import Files
from .models import (
    CodeContext,
    CommandResult,
    Endpoint,
    Event,
    ExecutionResult,
    Metrics,
    SandboxInfo,
)
from .stream import ExecutionFolder

if TYPE_CHECKING:
    from datetime import datetime
    from types import TracebackType

    from .client import Client
    from .execution import ExecutionStream


class Sandbox:
    """A running sandbox: its id, its execd endpoint, and the client that reaches it.

    Used as a context manager, it deletes the sandbox on exit when ``delete_on_exit`` is true:
    the default for a sandbox this client created, not for one obtained with ``connect()``.

    Attributes:
        id: the sandbox id.
        api_base: the lifecycle API it belongs to.
        execd_endpoint: execd's address as the server gave it (usually without a scheme).
        execd_headers: headers the server requires on execd calls (e.g. an access token).
        use_server_proxy: whether the endpoint goes through the server's proxy.
        delete_on_exit: whether leaving a ``with`` block deletes the sandbox.
    """

    def __init__(
        self,
        client: Client,
        sandbox_id: str,
        *,
        execd_endpoint: str,
        execd_headers: Mapping[str, str] | None = None,
        use_server_proxy: bool = False,
        delete_on_exit: bool = False,
    ):
        self.id = sandbox_id
        self.api_base = client.api_base
        self.execd_endpoint = execd_endpoint
        self.execd_headers = dict(execd_headers or {})
        self.use_server_proxy = use_server_proxy
        self.delete_on_exit = delete_on_exit
        self._client = client
        self._background_ids: set[str] = set()  # for SandboxPool's reset

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, execd_endpoint={self.execd_endpoint!r})"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.delete_on_exit:
            self._client._delete_quietly(self.id)

    @property
    def execd_url(self) -> str:
        """execd's base URL, with the scheme of the client's ``api_base`` (or ``execd_scheme``)."""
        return execd_base_url(self.execd_endpoint, self._client.execd_scheme)

    @property
    def _execd(self) -> Execd:
        return Execd(self._client._transport, self.execd_url, self.execd_headers)

    @property
    def files(self) -> Files:
        """The sandbox's file system."""
        return Files(self._execd)

    # -- code ---------------------------------------------------------------------------------

    def run_code(
        self,
        code: str,
        *,
        language: str = DEFAULT_LANGUAGE,
        context: CodeContext | str | None = None,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        timeout: float | None = None,
        on_event: Callable[[Event], object] | None = None,
    ) -> ExecutionResult:
        """Run code and return what it produced; see :meth:`Client.run_code`.

        ``context``: a CodeContext (its language is used) or a context id (with ``language``).

        Raises:
            The errors of :meth:`Client.run_code`.
        """
        with self.stream_code(
            code,
            language=language,
            context=context,
            max_output_bytes=max_output_bytes,
            timeout=timeout,
            on_event=on_event,
        ) as stream:
            return stream.result()

    def stream_code(
        self,
        code: str,
        *,
        language: str = DEFAULT_LANGUAGE,
        context: CodeContext | str | None = None,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        timeout: float | None = None,
        on_event: Callable[[Event], object] | None = None,
    ) -> ExecutionStream[ExecutionResult]:
        """Start running code and return the live event stream; see :meth:`Client.stream_code`.

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        if isinstance(context, CodeContext):
            language = context.language
        check_run_arguments(code, language, max_output_bytes, timeout)
        target: dict[str, str] = {"language": language}
        if context is not None:
            # Both, always: without a language real execd runs the code as a shell command.
            target["id"] = context.id if isinstance(context, CodeContext) else context
        return self._execd.stream(
            "/code",
            {"code": code, "context": target},
            folder=ExecutionFolder(),
            max_output_bytes=max_output_bytes,
            timeout=timeout,
            on_event=on_event,
            interrupt_path="/code",
        )

    def interrupt_code(self, context_id: str) -> None:
        """Interrupt the run going on in a code context (``CodeContext.id``).

        Raises:
            NotFoundError: no such context.
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self._execd.request("DELETE", "/code", params={"id": context_id})

    def create_context(
        self, language: str = DEFAULT_LANGUAGE, cwd: str | None = None
    ) -> CodeContext:
        """Create a named code context: its state persists between runs.

        Raises:
            ApiError: execd refused (an unknown language, for instance).
        """
        body = {"language": language, **({"cwd": cwd} if cwd else {})}
        return CodeContext.from_dict(self._execd.json("POST", "/code/context", json=body), language)

    def list_contexts(self, language: str | None = None) -> builtins.list[CodeContext]:
        """The code contexts, of one language or all.

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        params = {"language": language} if language else None
        data = self._execd.json("GET", "/code/contexts", params=params)
        return [CodeContext.from_dict(item, language or "") for item in data or ()]

    def get_context(self, context_id: str) -> CodeContext:
        """One code context.

        Raises:
            NotFoundError: no such context.
        """
        return CodeContext.from_dict(self._execd.json("GET", f"/code/contexts/{context_id}"))

    def delete_context(self, context: CodeContext | str) -> None:
        """Delete a code context (its kernel state goes with it).

        Raises:
            NotFoundError: no such context.
        """
        context_id = context.id if isinstance(context, CodeContext) else context
        self._execd.request("DELETE", f"/code/contexts/{context_id}")

    def delete_contexts(self, language: str) -> None:
        """Delete every code context of a language.

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self._execd.request("DELETE", "/code/contexts", params={"language": language})

    # -- commands -----------------------------------------------------------------------------

    def run_command(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
    ) -> CommandResult:
        """Run a shell command (``bash -c``) and wait for it.

        A non-zero exit is data (``exit_code``); ``result.check()`` raises for it. ``timeout``
        (seconds) is enforced by execd and bounds the client's wait; expiry gives
        ``timed_out=True``. ``on_stdout``/``on_stderr`` receive each line as it arrives.

        Raises:
            OutputLimitExceeded: the output passed ``max_output_bytes``.
            ApiError: execd refused the command.
            StreamError: the stream broke or stalled.
        """
        stream = self.stream_command(
            command,
            cwd=cwd,
            env=env,
            timeout=timeout,
            on_event=line_callbacks(on_stdout, on_stderr),
            max_output_bytes=max_output_bytes,
        )
        return collect(stream, timeout)

    def stream_command(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_event: Callable[[Event], object] | None = None,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
    ) -> ExecutionStream[CommandResult]:
        """Start a command and return its live events; ``stream.result()`` is a CommandResult.

        The stream ends at the terminal event; leaving it early interrupts the command.

        Raises:
            ConfigurationError: an empty command or a bad timeout.
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        body = command_body(command, cwd, dict(env) if env else None, timeout)
        return self._execd.stream(
            "/command",
            body,
            folder=CommandFolder(),
            max_output_bytes=max_output_bytes,
            timeout=client_deadline(timeout),
            on_event=on_event,
            interrupt_path="/command",
            stop_at_terminal=True,
        )

    def start_command(
        self, command: str, *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> BackgroundCommand:
        """Start a command in the background and return at once.

        Raises:
            ApiError: execd refused the command, or gave it no id.
        """
        body = {**command_body(command, cwd, dict(env) if env else None, None), "background": True}
        stream = self._execd.stream(
            "/command",
            body,
            folder=CommandFolder(),
            max_output_bytes=MAX_OUTPUT_BYTES,
            stop_at_terminal=True,
        )
        with stream:
            for event in stream:
                if event.type in ("execution_complete", "error"):
                    break
            result = stream.partial()
        if result.id is None or result.error is not None:
            reason = result.error.value if result.error else "no command id"
            raise OpenSandboxError(f"the background command did not start: {reason}")
        self._background_ids.add(result.id)
        return BackgroundCommand(self._execd, result.id)

    def interrupt_command(self, command_id: str) -> None:
        """Stop a command (SIGTERM to its process group, then SIGKILL).

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self._execd.request("DELETE", "/command", params={"id": command_id})

    def session(self, cwd: str | None = None) -> BashSession:
        """A persistent bash session (use it in ``with``: it is deleted on exit).

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        data = self._execd.json("POST", "/session", json={"cwd": cwd} if cwd else {})
        session_id = data.get("session_id") if isinstance(data, dict) else None
        if not isinstance(session_id, str) or not session_id:
            raise OpenSandboxError("execd created a session without a session_id")
        return BashSession(self._execd, session_id)

    # -- the sandbox itself ---------------------------------------------------------------------

    def get_endpoint(self, port: int) -> Endpoint:
        """How to reach a port the sandbox serves (a web app started inside it).

        Raises:
            SandboxTimeoutError: no endpoint within the default ready timeout.
            ApiError: the server refused (a bad port, for instance).
        """
        return self._client.get_endpoint(self.id, port, use_server_proxy=self.use_server_proxy)

    def metrics(self) -> Metrics:
        """One resource sample (CPU and memory).

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        return Metrics.from_dict(self._execd.json("GET", "/metrics"))

    def ping(self) -> bool:
        """Whether execd answers ``/ping``.

        Raises:
            SandboxStateError: the sandbox is paused (waiting would not help).
        """
        try:
            self._execd.request("GET", "/ping", retry=False).close()
        except SandboxStateError:
            raise
        except OpenSandboxError:
            return False
        return True

    def wait_until_healthy(self, ready_timeout: float, poll_interval: float) -> None:
        """Poll ``/ping`` until execd answers: one sleep between two pings.

        Raises:
            SandboxStateError: the sandbox is paused.
            SandboxTimeoutError: no answer within ``ready_timeout`` seconds.
        """
        deadline = time.monotonic() + ready_timeout
        while not self.ping():
            if time.monotonic() >= deadline:
                raise SandboxTimeoutError(
                    f"execd of sandbox {self.id} did not answer /ping within {ready_timeout} "
                    f"seconds ({self.execd_url})"
                )
            time.sleep(poll_interval)

    def info(self) -> SandboxInfo:
        """A fresh description from the lifecycle API.

        Raises:
            NotFoundError: the sandbox is gone.
            ApiError: the server refused the call.
            TransportError: the server could not be reached.
        """
        return self._client.get_sandbox(self.id)

    def pause(self) -> None:
        """Pause the sandbox (its processes stop; execution is refused until resumed).

        Raises:
            ApiError: e.g. 409 when it is not running.
            TransportError: the server could not be reached.
        """
        self._client.pause(self.id)

    def resume(
        self, *, ready_timeout: float | None = None, poll_interval: float | None = None
    ) -> None:
        """Resume, wait until Running, and re-resolve execd (its endpoint may change).

        Raises:
            ApiError: e.g. 409 when it is not paused.
            SandboxTimeoutError: not Running, or execd not answering, within ``ready_timeout``.
            TransportError: the server could not be reached.
        """
        self._client.resume(self.id, ready_timeout=ready_timeout, poll_interval=poll_interval)
        fresh = self._client.connect(
            self.id,
            use_server_proxy=self.use_server_proxy,
            ready_timeout=ready_timeout,
            poll_interval=poll_interval,
        )
        self.execd_endpoint, self.execd_headers = fresh.execd_endpoint, fresh.execd_headers

    def renew(self, seconds: float) -> datetime | None:
        """Expire ``seconds`` from now instead; returns the new expiry.

        Raises:
            ApiError: e.g. a sandbox without expiry.
            TransportError: the server could not be reached.
        """
        return self._client.renew(self.id, seconds)

    def patch_metadata(self, patch: Mapping[str, str | None]) -> SandboxInfo:
        """Merge-patch the labels (``None`` deletes a key).

        Raises:
            ApiError: e.g. a reserved or invalid label.
            TransportError: the server could not be reached.
        """
        return self._client.patch_metadata(self.id, patch)

    def delete(self) -> bool:
        """Delete this sandbox; see :meth:`Client.delete_sandbox`.

        Raises:
            ApiError: an error status other than 404.
            TransportError: the server could not be reached.
        """
        return self._client.delete_sandbox(self)
