"""What every ``/command`` run shares: its request body, its folder, its deadline, its end.

Two forms of output events, one text (issue 45). June's execd sends one event per line
without its terminator (CR, LF and CRLF alike end a line) and a blank line as ``"\\n"``;
execd 1.1.1 (#2033) sends texts whose concatenation is the exact output, every ``\\r`` and
``\\n`` kept, split where it likes. There is no version route, so :class:`OutputJoiner` tells
the forms apart from the events themselves: a June text never holds a line break, except the
lone ``"\\n"``, so the first text that does (``"a\\n"``, ``"50%\\r"``) shows the released
form, for the rest of the stream and both channels. Until then a text without a line break is
ambiguous (a June line, or a piece of a released line): it is passed on at once and the
newline June would add after it is held back; the next text decides: one with a line break
means released (no newline); another text without one, or a lone ``"\\n"``, means June (the
newline), as a released execd splits a line only where a write ended, rarely twice in a row.

Both give the same text: released output has its line ends made June's (CRLF and a lone CR
become LF, a CRLF split across two events too), so a ``\\r`` progress line reaches a callback
at once, as a line. At the end of a stream still undecided the held newline is added, as June
adds one to each line: a released execd's output that is one line without a final newline
(``printf abc``) reads ``"abc\\n"``, as from June's, whose events cannot say whether the line
had one. Any other output without a final newline is exact from a released execd and gets one
from June's; all output that ends with a newline is the same from both.
"""

from __future__ import annotations

import math
import re
import shlex
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ._errors import ConfigurationError, SandboxTimeoutError
from ._execution import ExecutionStream
from ._models import CommandResult, Event, ExecutionError
from ._stream import cut_output, error_of, utf8_len
from ._validators import positive_seconds, whole

if TYPE_CHECKING:
    pass

# Our own deadline comes this long after execd's, so execd's kill (with its exit status) wins.
DEADLINE_SLACK = 2.0


CHANNELS = ("stdout", "stderr")


class OutputJoiner:
    """Turns the output texts of either execd form into the exact output (see the module).

    :meth:`feed` takes one event's text and returns what to append, channel by channel (the
    pieces may differ from the events; their concatenation is the output); :meth:`finish`
    returns the newlines still held at the stream's end.
    """

    def __init__(self) -> None:
        self.released: bool | None = None  # None until the events say which form
        self._held = {name: False for name in CHANNELS}  # a June newline may follow
        self._cr = {name: False for name in CHANNELS}  # a released text ended with CR

    @property
    def held(self) -> int:
        """How many newlines are held back (one per channel at most)."""
        return sum(self._held.values())

    def feed(self, channel: str, text: str) -> list[tuple[str, str]]:
        """The pieces ``text`` (a ``stdout`` or ``stderr`` event's text) adds."""
        if self.released:
            return self._released(channel, text)
        breaks = text != "\n" and ("\n" in text or "\r" in text)
        if breaks:
            self.released = True
            self._held = dict.fromkeys(CHANNELS, False)  # they were pieces of lines
            return self._released(channel, text)
        if self.released is None and not self._held[channel]:
            if text != "\n":
                self._held[channel] = True  # a June line, or a piece of a released one
            return [(channel, text)]
        # June: a line after a line (or a blank one); released execd splits only at a write
        out = self._decide_june()
        piece = "\n" if text == "\n" else text + "\n"
        return [*out, (channel, piece)]

    def _released(self, channel: str, text: str) -> list[tuple[str, str]]:
        """A released text with June's line ends: CRLF and lone CR as LF."""
        if self._cr[channel] and text[:1] == "\n":
            text = text[1:]  # the LF of a CRLF split across events: its CR was the newline
        if "\r" in text:
            self._cr[channel] = text[-1:] == "\r"
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        else:
            self._cr[channel] = False
        return [(channel, text)] if text else []

    def _decide_june(self) -> list[tuple[str, str]]:
        self.released = False
        held = [(name, "\n") for name in CHANNELS if self._held[name]]
        self._held = dict.fromkeys(CHANNELS, False)
        return held

    def finish(self) -> list[tuple[str, str]]:
        """The newlines held at the stream's end (a June line's, by the rule of the module)."""
        if self.released:
            return []
        return self._decide_june() if self.held else []

    def tail(self) -> dict[str, str]:
        """What :meth:`finish` would add, by channel, without deciding anything."""
        if self.released:
            return {}
        return {name: "\n" for name in CHANNELS if self._held[name]}

    def drop(self) -> None:
        """Forget the held newlines (the output was cut at the cap)."""
        self._held = dict.fromkeys(CHANNELS, False)


class CommandFolder:
    """Folds ``/command`` events into a CommandResult.

    The output texts of both execd forms are joined by an :class:`OutputJoiner`; the output
    counted (``output_bytes``) is the text kept, a held newline included.
    """

    def __init__(self) -> None:
        self._joiner = OutputJoiner()
        self._kept = 0  # UTF-8 bytes of the pieces kept
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
        if kind in CHANNELS and event.text:
            self._keep(self._joiner.feed(kind, event.text))
            self.output_bytes = self._kept + self._joiner.held
        elif kind == "init" and self.execution_id is None and event.text:
            self.execution_id = event.text
        elif kind == "execution_complete" and self._error is None:
            self._exit_code = 0
            self.completed = True
        elif kind == "error" and self._error is None:
            self._error = error_of(event.data)
            self._exit_code = _exit_code(self._error)
            self.completed = True

    def _keep(self, pieces: list[tuple[str, str]]) -> None:
        for channel, piece in pieces:
            (self._stdout if channel == "stdout" else self._stderr).append(piece)
            self._kept += len(piece) if piece.isascii() else utf8_len(piece)

    def cut(self, last: Event, limit: int) -> None:
        """Keep ``limit`` bytes of output: the text of ``last`` (added last) is shortened."""
        self._joiner.drop()
        pieces = self._stderr if last.type == "stderr" else self._stdout
        self.output_bytes = self._kept = cut_output(pieces, self._kept, limit)

    def result(self) -> CommandResult:
        """The result of everything added so far (a held newline added, see the module)."""
        held = self._joiner.tail()
        return CommandResult(
            id=self.execution_id,
            exit_code=self._exit_code,
            stdout="".join(self._stdout) + held.get("stdout", ""),
            stderr="".join(self._stderr) + held.get("stderr", ""),
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
    """An ``on_event`` that hands the output, as it arrives, to the right callback.

    Each call gets a piece of the output (a line, part of one, a ``\\r`` progress line); the
    pieces join to the result's ``stdout`` and ``stderr``, whichever execd form the events
    have (:class:`OutputJoiner`). A newline held back is handed on at the terminal event.
    """
    if on_stdout is None and on_stderr is None:
        return None
    callbacks = {"stdout": on_stdout, "stderr": on_stderr}
    joiner = OutputJoiner()

    def on_event(event: Event) -> None:
        if event.type in CHANNELS and event.text:
            pieces = joiner.feed(event.type, event.text)
        elif event.type in ("execution_complete", "error"):
            pieces = joiner.finish()
        else:
            return
        for channel, piece in pieces:
            callback = callbacks[channel]
            if callback is not None:
                callback(piece)

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


Command = str | Sequence[str]  # a shell command line, or an argv (execd 1.1.0+)


def command_body(
    command: Command,
    cwd: str | None,
    env: dict[str, str] | None,
    timeout: float | None,
    uid: int | None = None,
    gid: int | None = None,
) -> dict[str, Any]:
    """The ``POST /command`` body: ``command`` for a string, ``argv`` for a list or tuple.

    Raises:
        ConfigurationError: an empty command, an argv that is not strings, has an empty first
            element or a NUL, a bad timeout, or a ``gid`` without ``uid``.
    """
    body: dict[str, Any]
    if isinstance(command, (list, tuple)):
        body = {"argv": checked_argv(command)}
    elif not isinstance(command, str) or not command.strip():
        raise ConfigurationError("command must be a non-empty str, or an argv (a list of str)")
    else:
        body = {"command": command}
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


def checked_argv(argv: Sequence[object]) -> list[str]:
    """``argv`` as execd 1.1.0 takes it (#1760): strings, the first not empty, no NUL.

    Raises:
        ConfigurationError: it is not.
    """
    if not argv or not all(isinstance(arg, str) for arg in argv):
        raise ConfigurationError("argv must be a non-empty list of str")
    args = [str(arg) for arg in argv]
    if not args[0]:
        raise ConfigurationError("argv[0] (the program) must not be empty")
    if any("\0" in arg for arg in args):
        raise ConfigurationError("argv must not contain a NUL character")
    return args


# June's execd, given argv, answers 400 with the validator's message for the missing command
# (reference/opensandbox-1.1.1.md 3.1: usable as a capability probe).
_JUNE_ARGV_REFUSAL = ("RunCommandRequest.Command", "required")


def refused_argv(body: dict[str, Any], status: int, message: str) -> bool:
    """Whether an answer to ``body`` is June's execd refusing ``argv`` (it needs ``command``)."""
    return "argv" in body and status == 400 and all(w in message for w in _JUNE_ARGV_REFUSAL)


def as_shell_command(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with its ``argv`` as a bash command that runs exactly that argv.

    ``exec --`` makes bash run the program itself (never a builtin, function or alias of the
    same name) with the arguments unchanged: each is single-quoted (``shlex.quote``), so
    nothing in them is expanded. What differs from execd's own argv: bash searches every
    ``PATH`` entry (execd only the absolute ones), a program that cannot start exits 127
    with bash's message on stderr instead of an ``error`` event, and bash exports ``PWD`` and
    ``SHLVL`` to the program.
    """
    shell = {k: v for k, v in body.items() if k != "argv"}
    shell["command"] = "exec -- " + shlex.join(body["argv"])
    return shell


ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def env_line(key: str, value: str) -> str:
    """The line ``commands.set_env`` appends to execd's ``EXECD_ENVS`` file: ``KEY='value'``,
    or ``KEY="..."`` (backslash, quote, LF, CR and tab escaped) when the value holds a ``'``.

    Raises:
        ConfigurationError: a key that is not ``[A-Za-z_][A-Za-z0-9_]*``, or a value that is
            not a str or holds a NUL.
    """
    if not isinstance(key, str) or not ENV_KEY.fullmatch(key):
        raise ConfigurationError("key must match [A-Za-z_][A-Za-z0-9_]*")
    if not isinstance(value, str) or "\0" in value:
        raise ConfigurationError("value must be a str without NUL characters")
    if "'" not in value:
        return f"{key}='{value}'"
    return f'{key}="{"".join(_ESCAPES.get(char, char) for char in value)}"'
