"""Shell commands in a sandbox: foreground runs, background commands, bash sessions."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ._constants import DEFAULT_POLL_INTERVAL, MAX_OUTPUT_BYTES
from ._errors import ConfigurationError, SandboxTimeoutError
from ._execution import ExecutionStream
from ._models import CommandResult, CommandStatus, Event, ExecutionError
from ._stream import error_of

if TYPE_CHECKING:
    from types import TracebackType

    from ._execd import Execd

LOGS_CURSOR_HEADER = "EXECD-COMMANDS-TAIL-CURSOR"
# Our own deadline comes this long after execd's, so execd's kill (with its exit status) wins.
DEADLINE_SLACK = 2.0


class CommandFolder:
    """Folds ``/command`` events into a CommandResult.

    execd sends one event per line without its terminator, and an empty line as ``"\\n"``.
    """

    def __init__(self) -> None:
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._started = time.monotonic()
        self._error: ExecutionError | None = None
        self._exit_code: int | None = None
        self.execution_id: str | None = None
        self.completed = False
        self.timed_out = False

    def add(self, event: Event) -> None:
        """Take one event into account."""
        kind = event.type
        if kind in ("stdout", "stderr") and event.text:
            line = event.text if event.text == "\n" else event.text + "\n"
            (self._stdout if kind == "stdout" else self._stderr).append(line)
        elif kind == "init" and self.execution_id is None and event.text:
            self.execution_id = event.text
        elif kind == "execution_complete" and self._error is None:
            self._exit_code = 0
            self.completed = True
        elif kind == "error" and self._error is None:
            self._error = error_of(event.data)
            self._exit_code = _exit_code(self._error)
            self.completed = True

    def result(self) -> CommandResult:
        """The result of everything added so far."""
        return CommandResult(
            id=self.execution_id,
            exit_code=self._exit_code,
            stdout="".join(self._stdout),
            stderr="".join(self._stderr),
            error=self._error,
            timed_out=self.timed_out,
            duration=time.monotonic() - self._started,
        )


def _exit_code(error: ExecutionError) -> int | None:
    try:
        return int(error.value)
    except ValueError:
        return None


def timeout_ms(timeout: float | None) -> int | None:
    """Seconds (our API) to execd's milliseconds, at least 1."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigurationError("timeout must be a positive number of seconds, or None")
    return max(1, math.ceil(timeout * 1000))


def line_callbacks(
    on_stdout: Callable[[str], object] | None, on_stderr: Callable[[str], object] | None
) -> Callable[[Event], object] | None:
    """An ``on_event`` that hands each output line (with its newline) to the right callback."""
    if on_stdout is None and on_stderr is None:
        return None

    def on_event(event: Event) -> None:
        callback = {"stdout": on_stdout, "stderr": on_stderr}.get(event.type)
        if callback is not None and event.text:
            callback(event.text if event.text == "\n" else event.text + "\n")

    return on_event


def collect(stream: ExecutionStream[CommandResult], timeout: float | None) -> CommandResult:
    """Read a command stream to its end; a run past ``timeout`` is a result, not an error."""
    with stream:
        try:
            for _ in stream:
                pass
        except SandboxTimeoutError:
            result = stream.partial()
            return CommandResult(**{**result.__dict__, "timed_out": True})
        result = stream.result()
    stopped = result.error is not None and result.exit_code in (-1, None)
    if timeout is not None and stopped and result.duration >= timeout:
        return CommandResult(**{**result.__dict__, "timed_out": True})
    return result


def client_deadline(timeout: float | None) -> float | None:
    """How long the client waits for a command that execd should stop after ``timeout``."""
    return None if timeout is None else timeout + DEADLINE_SLACK


def command_body(
    command: str, cwd: str | None, env: dict[str, str] | None, timeout: float | None
) -> dict[str, Any]:
    """The ``POST /command`` body."""
    if not isinstance(command, str) or not command.strip():
        raise ConfigurationError("command must be a non-empty str")
    body: dict[str, Any] = {"command": command}
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["envs"] = {str(k): str(v) for k, v in env.items()}
    ms = timeout_ms(timeout)
    if ms is not None:
        body["timeout"] = ms
    return body


class BackgroundCommand:
    """A command started with ``background: true``: poll its status and read its output."""

    def __init__(self, execd: Execd, command_id: str):
        self.id = command_id
        self._execd = execd

    def __repr__(self) -> str:
        return f"BackgroundCommand(id={self.id!r})"

    def status(self) -> CommandStatus:
        """The command's current status.

        Raises:
            NotFoundError: execd does not know the command.
        """
        data = self._execd.json("GET", f"/command/status/{self.id}")
        return CommandStatus.from_dict(data if isinstance(data, dict) else {"id": self.id})

    def logs(self, cursor: int | None = None) -> tuple[str, int]:
        """Output (stdout and stderr together) from byte ``cursor`` on, and the next cursor.

        Raises:
            ApiError: not a background command (execd answers 400).
            TransportError: execd could not be reached.
        """
        params = {"cursor": cursor} if cursor is not None else None
        response = self._execd.request("GET", f"/command/{self.id}/logs", params=params)
        text = response.content.decode("utf-8", "replace")
        try:
            next_cursor = int(response.headers.get(LOGS_CURSOR_HEADER, ""))
        except ValueError:
            next_cursor = (cursor or 0) + len(response.content)
        return text, next_cursor

    def iter_logs(self, poll_interval: float = 0.5) -> Iterator[str]:
        """Follow the output until the command has ended and everything was read.

        Raises:
            NotFoundError: execd does not know the command.
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        cursor: int | None = None
        while True:
            running = self.status().running
            text, cursor = self.logs(cursor)
            if text:
                yield text
            if not running:
                return
            time.sleep(poll_interval)

    def wait(
        self, timeout: float | None = None, poll_interval: float = DEFAULT_POLL_INTERVAL
    ) -> CommandStatus:
        """Poll until the command ends.

        Raises:
            SandboxTimeoutError: still running after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            if not status.running:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise SandboxTimeoutError(
                    f"command {self.id} still running after {timeout} seconds"
                )
            time.sleep(poll_interval)

    def kill(self) -> None:
        """Stop the command (SIGTERM to its process group, then SIGKILL).

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self._execd.request("DELETE", "/command", params={"id": self.id})


class BashSession:
    """A persistent bash: cwd and environment survive between runs. Deleted on ``with`` exit.

    execd merges stderr into stdout for sessions.
    """

    def __init__(self, execd: Execd, session_id: str):
        self.id = session_id
        self._execd = execd

    def __repr__(self) -> str:
        return f"BashSession(id={self.id!r})"

    def __enter__(self) -> BashSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def run(
        self,
        command: str,
        *,
        cwd: str | None = None,
        timeout: float | None = None,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
    ) -> CommandResult:
        """Run a command in the session and wait for it.

        Raises:
            OutputLimitExceeded: the output passed ``max_output_bytes``.
            ApiError: execd refused the run.
            StreamError: the stream broke.
        """
        body = command_body(command, cwd, None, timeout)
        stream = self._execd.stream(
            f"/session/{self.id}/run",
            body,
            folder=CommandFolder(),
            max_output_bytes=max_output_bytes,
            timeout=client_deadline(timeout),
            stop_at_terminal=True,
        )
        return collect(stream, timeout)

    def close(self) -> None:
        """Delete the session (its shell ends).

        Raises:
            NotFoundError: the session is already gone.
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self._execd.request("DELETE", f"/session/{self.id}")
