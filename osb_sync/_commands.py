"""``sandbox.commands``: shell commands, foreground or background, and bash sessions."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from . import _answers as answers
from ._command_stream import (
    CommandFolder,
    as_shell_command,
    client_deadline,
    collect,
    command_body,
    env_line,
    line_callbacks,
    refused_argv,
)
from ._constants import DEFAULT_POLL_INTERVAL, MAX_OUTPUT_BYTES
from ._errors import (
    ApiError,
    CommandFailed,
    NotFoundError,
    SandboxTimeoutError,
)
from ._execd import LOGS_BYTES
from ._models import CommandResult, CommandStatus, Event

if TYPE_CHECKING:
    from types import TracebackType

    from ._execd import Execd
    from ._execution import ExecutionStream

logger = logging.getLogger("osb_sync")

LOGS_CURSOR_HEADER = "EXECD-COMMANDS-TAIL-CURSOR"
# Real execd records a background command in a goroutine of its own and may send
# `execution_complete` first: status, logs and kill then fail for a moment (seen in CI).
REGISTRATION_WAIT = 10.0
SET_ENV_LINE = "OSB_SET_ENV_LINE"  # the variable that carries set_env's line to its script


class Commands:
    """``sandbox.commands``: run commands in the sandbox through execd: a shell command line
    (``bash -c``), or an argv (a list: the program and its arguments, passed unchanged)."""

    def __init__(self, execd: Execd):
        self._execd = execd
        self._started: list[BackgroundCommand] = []
        self._argv_refused = False  # execd is June's: argv goes as a quoted shell command

    def _post(self, body: dict[str, Any], **stream: Any) -> ExecutionStream[CommandResult]:
        """POST ``/command``; an argv that June's execd refuses is sent again as a shell
        command that runs exactly that argv (``as_shell_command``), and later ones at once."""
        if "argv" in body and self._argv_refused:
            body = as_shell_command(body)
        try:
            return self._execd.stream("/command", body, folder=CommandFolder(), **stream)
        except ApiError as exc:
            if not refused_argv(body, exc.status_code, exc.message):
                raise
        logger.debug("execd refused argv (June's execd): sending it as a quoted shell command")
        self._argv_refused = True
        shell = as_shell_command(body)
        return self._execd.stream("/command", shell, folder=CommandFolder(), **stream)

    def run(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_stdout: Callable[[str], object] | None = None,
        on_stderr: Callable[[str], object] | None = None,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        uid: int | None = None,
        gid: int | None = None,
    ) -> CommandResult:
        """Run a command and wait for it: a string runs with ``bash -c``; a list (or tuple) is an
        argv, run without a shell, each argument passed unchanged (``["python3", "-c", code]``).

        An argv needs execd 1.1.0 or later; June's execd refuses it (400), and the argv is sent
        again as ``exec -- <each argument single-quoted>`` through bash, which runs the same
        program with the same arguments (bash searches every ``PATH`` entry, a program that
        cannot start exits 127 instead of failing with an ``error``, and the program's
        environment also has bash's ``PWD`` and ``SHLVL``).

        A non-zero exit is data (``exit_code``); ``result.check()`` raises for it. ``timeout``
        (seconds) is enforced by execd and bounds the client's wait; expiry gives
        ``timed_out=True``. ``on_stdout``/``on_stderr`` receive the output as it arrives, in
        pieces that join to ``stdout``/``stderr`` (lines, parts of lines; a ``\\r`` ends a
        line). June's execd and execd 1.1.1 give the same text (one exception: see
        ``osb_sync/_command_stream.py``). ``uid``/``gid`` run it as that numeric user and
        group (``gid`` needs ``uid``).

        Raises:
            OutputLimitExceeded: the output passed ``max_output_bytes``.
            SandboxTimeoutError: execd did not answer within ``timeout`` plus 2 s (its
                ``DEADLINE_SLACK``); the command may have started.
            ApiError: execd refused the command.
            StreamError: the stream broke or stalled.
        """
        stream = self.stream(
            command,
            cwd=cwd,
            env=env,
            timeout=timeout,
            on_event=line_callbacks(on_stdout, on_stderr),
            max_output_bytes=max_output_bytes,
            uid=uid,
            gid=gid,
        )
        return collect(stream, timeout)

    def stream(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        on_event: Callable[[Event], object] | None = None,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        uid: int | None = None,
        gid: int | None = None,
    ) -> ExecutionStream[CommandResult]:
        """Start a command and return its live events; ``stream.result()`` is a CommandResult.

        The events are execd's, as sent: their texts are lines without terminators from a June
        execd, pieces of the exact output from execd 1.1.1; ``stream.result()`` joins either
        into the same text. The stream ends at the terminal event; leaving it early interrupts
        the command.

        ``command`` is a shell command line or an argv, as in :meth:`run`.

        Raises:
            ConfigurationError: an empty command or argv, or a bad timeout.
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        body = command_body(command, cwd, dict(env) if env else None, timeout, uid, gid)
        return self._post(
            body,
            max_output_bytes=max_output_bytes,
            timeout=client_deadline(timeout),
            on_event=on_event,
            interrupt_path="/command",
            stop_at_terminal=True,
        )

    def start(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        uid: int | None = None,
        gid: int | None = None,
    ) -> BackgroundCommand:
        """Start a command in the background and return at once (``command``, an argv too,
        and ``uid``/``gid`` as in :meth:`run`).

        Raises:
            ApiError: execd refused the command, or named it with no id or one that cannot
                stand in a URL (``code`` ``INVALID_RESPONSE``).
            CommandFailed: execd said the command did not start.
            SandboxTimeoutError: execd did not answer that it started within the client's
                ``call_timeout`` (its answer is a stream, which execd ends at once), or did
                not know the command it started within ``REGISTRATION_WAIT`` seconds.
        """
        options = command_body(command, cwd, dict(env) if env else None, None, uid, gid)
        body = {**options, "background": True}
        stream = self._post(
            body,
            max_output_bytes=MAX_OUTPUT_BYTES,
            timeout=self._execd.call_timeout,
            stop_at_terminal=True,
        )
        with stream:
            for event in stream:
                if event.type in ("execution_complete", "error"):
                    break
            result = stream.partial()
        if result.error is not None:
            raise CommandFailed(
                f"the background command did not start: {result.error.value}",
                exit_code=result.exit_code,
                stderr=result.stderr,
            )
        try:
            named = "the init event's text (the command id)"
            if result.id is None:
                raise answers.BadAnswer(named, "is missing: the stream named no command")
            answers.a_segment(result.id, named, self._execd.secrets)
        except answers.BadAnswer as exc:
            raise self._execd.invalid(stream.response, exc) from None
        handle = BackgroundCommand(self._execd, result.id)
        handle._await_registration(REGISTRATION_WAIT)
        self._started.append(handle)
        return handle

    def set_env(self, key: str, value: str, *, timeout: float | None = 30.0) -> None:
        """Set ``key`` to ``value`` for every later command (execd 1.1.1's ``commands.set_env``).

        execd rereads the file named by ``$EXECD_ENVS`` for every command; this appends
        ``KEY='value'`` to it (``KEY="..."``, backslash, double quote, LF, CR and tab escaped,
        when the value holds a single quote: execd then expands ``$NAME`` in it). A command's
        own ``env`` still wins. The line reaches the sandbox in the command's environment,
        never in its command line, so execd's record of the command does not show the value.

        Raises:
            ConfigurationError: ``key`` is not ``[A-Za-z_][A-Za-z0-9_]*``, or ``value`` is not
                a str or holds a NUL.
            CommandFailed: the sandbox has no ``EXECD_ENVS`` (an older execd), or the file
                could not be written (the message has the script's stderr).
        """
        line = env_line(key, value)
        script = (
            'if [ -z "${EXECD_ENVS:-}" ]; then echo "EXECD_ENVS is not set: this execd reads '
            'no environment file (execd 1.1.1 or later)" >&2; exit 3; fi; '
            'mkdir -p -- "$(dirname -- "$EXECD_ENVS")" && '
            'printf \'%s\\n\' "$OSB_SET_ENV_LINE" >> "$EXECD_ENVS"'
        )
        result = self.run(script, env={SET_ENV_LINE: line}, timeout=timeout)
        try:
            result.check()
        except CommandFailed as exc:
            raise CommandFailed(
                f"commands.set_env failed for {key!r}: {result.stderr.strip()[-500:]}",
                exit_code=exc.exit_code,
                stderr=exc.stderr,
            ) from None

    @property
    def started(self) -> tuple[BackgroundCommand, ...]:
        """The background commands started through this handle, oldest first."""
        return tuple(self._started)

    def get(self, command_id: str) -> BackgroundCommand:
        """A handle on a command execd knows, by id (say, one started by another process).

        No request is made: the handle's calls fail with NotFoundError if execd does not
        know the command.

        Raises:
            ConfigurationError: an empty id, ``.`` or ``..`` (the id goes into URLs, escaped).
        """
        return BackgroundCommand(self._execd, command_id)

    def interrupt(self, command_id: str) -> None:
        """Stop a command by id: ``commands.get(command_id).kill()``.

        Raises:
            The errors of :meth:`BackgroundCommand.kill`.
        """
        self.get(command_id).kill()

    def session(self, cwd: str | None = None) -> BashSession:
        """A persistent bash session (use it in ``with``: it is deleted on exit).

        Raises:
            ApiError: execd refused the call, or answered no ``session_id`` that can stand in a
                URL (``code`` ``INVALID_RESPONSE``).
            TransportError: execd could not be reached.
        """
        body = {"cwd": cwd} if cwd else {}
        session_id = self._execd.answer(
            "POST",
            "/session",
            lambda data: answers.session_id(data, self._execd.secrets),
            json=body,
        )
        return BashSession(self._execd, session_id)


class BackgroundCommand:
    """A command started with ``background: true``: poll its status and read its output."""

    def __init__(self, execd: Execd, command_id: str):
        self.id = command_id
        self._execd = execd
        self._in_url = answers.in_url(command_id, "a command id")

    def __repr__(self) -> str:
        return f"BackgroundCommand(id={self.id!r})"

    def status(self) -> CommandStatus:
        """The command's current status.

        Raises:
            NotFoundError: execd does not know the command.
            ApiError: an answer that is not a status (``code`` ``INVALID_RESPONSE``: ``running``
                not a boolean, say).
        """
        return self._execd.answer(
            "GET",
            f"/command/status/{self._in_url}",
            lambda data: answers.command_status(data, self.id),
        )

    def _await_registration(self, seconds: float) -> None:
        """Poll the status until execd knows the command (see `REGISTRATION_WAIT`)."""
        deadline = time.monotonic() + seconds
        pause = 0.01
        while True:
            try:
                self.status()
                return
            except NotFoundError:
                if time.monotonic() + pause > deadline:
                    raise SandboxTimeoutError(
                        f"execd started background command {self.id} but did not know it "
                        f"{seconds:g} s later"
                    ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    def logs(self, cursor: int | None = None) -> tuple[str, int]:
        """Output (stdout and stderr together) from byte ``cursor`` on, and the next cursor.

        Raises:
            ApiError: not a background command (execd answers 400), or a next cursor that is
                not a byte offset at or after ``cursor`` (``code`` ``INVALID_RESPONSE``).
            TransportError: execd could not be reached.
        """
        params = {"cursor": cursor} if cursor is not None else None
        response = self._execd.request(
            "GET", f"/command/{self._in_url}/logs", params=params, max_body=LOGS_BYTES
        )
        text = response.content.decode("utf-8", "replace")
        header = response.headers.get(LOGS_CURSOR_HEADER)
        try:
            return text, answers.logs_cursor(header, cursor, len(response.content))
        except answers.BadAnswer as exc:
            raise self._execd.invalid(response, exc) from None

    def iter_logs(self, poll_interval: float = 0.5) -> Iterator[str]:
        """Follow the output until the command has ended and everything was read.

        execd says when the command has ended: one that never does (or a sandbox that says so)
        is followed until the caller stops iterating, as ``tail -f`` is.

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
        self._execd.interrupt("/command", self.id)


class BashSession:
    """A persistent bash: cwd and environment survive between runs. Deleted on ``with`` exit.

    execd merges stderr into stdout for sessions.
    """

    def __init__(self, execd: Execd, session_id: str):
        self.id = session_id
        self._execd = execd
        self._in_url = answers.in_url(session_id, "a session id")

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
            f"/session/{self._in_url}/run",
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
        self._execd.request("DELETE", f"/session/{self._in_url}")
