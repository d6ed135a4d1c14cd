"""What every ``/command`` run shares: its request body, its folder, its deadline, its end."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable

from ._errors import ConfigurationError, SandboxTimeoutError
from ._execution import ExecutionStream
from ._models import CommandResult, Event, ExecutionError
from ._stream import cut_output, error_of, utf8_len
from ._validators import non_empty, positive_seconds, whole

if TYPE_CHECKING:
    pass

# Our own deadline comes this long after execd's, so execd's kill (with its exit status) wins.
DEADLINE_SLACK = 2.0


class CommandFolder:
    """Folds ``/command`` events into a CommandResult.

    execd sends one event per line without its terminator, and an empty line as ``"\\n"``;
    the output counted (``output_bytes``) is the text kept, each line with its newline.
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
        self.output_bytes = 0  # UTF-8 bytes of the stdout and stderr kept so far

    def add(self, event: Event) -> None:
        """Take one event into account."""
        kind = event.type
        if kind in ("stdout", "stderr") and event.text:
            line = event.text if event.text == "\n" else event.text + "\n"
            (self._stdout if kind == "stdout" else self._stderr).append(line)
            self.output_bytes += len(line) if line.isascii() else utf8_len(line)
        elif kind == "init" and self.execution_id is None and event.text:
            self.execution_id = event.text
        elif kind == "execution_complete" and self._error is None:
            self._exit_code = 0
            self.completed = True
        elif kind == "error" and self._error is None:
            self._error = error_of(event.data)
            self._exit_code = _exit_code(self._error)
            self.completed = True

    def cut(self, last: Event, limit: int) -> None:
        """Keep ``limit`` bytes of output: the line of ``last`` (added last) is shortened."""
        pieces = self._stderr if last.type == "stderr" else self._stdout
        self.output_bytes = cut_output(pieces, self.output_bytes, limit)

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
    return max(1, math.ceil(positive_seconds("timeout", timeout, "or None: no deadline") * 1000))


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
    command: str,
    cwd: str | None,
    env: dict[str, str] | None,
    timeout: float | None,
    uid: int | None = None,
    gid: int | None = None,
) -> dict[str, Any]:
    """The ``POST /command`` body.

    Raises:
        ConfigurationError: an empty command, a bad timeout, or a ``gid`` without ``uid``.
    """
    body: dict[str, Any] = {"command": non_empty("command", command)}
    for name, number in (("uid", uid), ("gid", gid)):
        if number is not None:
            body[name] = whole(name, number, 0)
    if gid is not None and uid is None:
        raise ConfigurationError("gid needs uid (execd sets the group only with the user)")
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["envs"] = {str(k): str(v) for k, v in env.items()}
    ms = timeout_ms(timeout)
    if ms is not None:
        body["timeout"] = ms
    return body
