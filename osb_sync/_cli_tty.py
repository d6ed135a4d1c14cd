"""``osb-sync exec -it``: this terminal joined to a terminal session in a sandbox (``sandbox.pty``).

The rules, as ``docker exec -it`` keeps them:

- ``-i`` with ``-t`` needs a terminal on standard input ("the input device is not a TTY"
  otherwise, exit 1); ``-t`` alone shows the remote terminal's output and sends no input.
- This terminal is put in raw mode, so Ctrl-C, Ctrl-D and Ctrl-Z go to the sandbox as bytes
  (its terminal turns them into SIGINT, EOF and SIGTSTP there), and restored on every exit
  path Python sees (the end, an error, SIGTERM, SIGHUP); a window-size change (SIGWINCH) is
  sent on as a resize.
- The exit status is the remote process's; a connection that dropped is reattached once
  (``since=`` the last byte seen, so nothing is shown twice or lost); another client taking
  the terminal over ends this one with status 1.
- No session is left behind: the CLI deletes it when it ends, and where it can fork a
  guardian process does so if the CLI itself is killed (SIGKILL): the guardian holds the read
  end of a pipe whose write end only the CLI holds, sees EOF at once when the CLI dies, and
  deletes the session (within the time a DELETE takes; the session's processes are
  SIGKILLed by execd), and with ``run -it`` the sandbox it made (unless ``--keep``). Without
  fork (Windows) a killed CLI's session lives on until the sandbox ends (execd reaps no idle
  session).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ._cli_options import UsageError
from ._errors import ApiError, OpenSandboxError
from ._pty import PtyConnection
from ._sandbox import Sandbox

NOT_A_TTY = "the input device is not a TTY"
DEFAULT_TERM = "xterm"
GUARD_DONE = b"done"
EXIT_TAKEN_OVER = 1
EXIT_DROPPED = 255
GUARD_LIMIT = 300  # seconds a guardian may spend deleting once the CLI died (then SIGALRM)
EXIT_BROKEN_PIPE = 128 + 13  # as a program killed by SIGPIPE: a reader of the output went


class InputNotATerminal(Exception):
    """``-it`` with standard input that is not a terminal (exit 1, as docker)."""


def terminal_size(fd: int) -> tuple[int, int] | None:
    """``(cols, rows)`` of the terminal on ``fd``, None when it is none."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return (size.columns, size.lines) if size.columns > 0 and size.lines > 0 else None


def exit_status(code: int | None) -> int:
    """The CLI's status for the remote exit code (out of 0..255: 255)."""
    if code is None:
        return EXIT_DROPPED
    return code if 0 <= code <= 255 else 255


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """This terminal in raw mode, restored however the block ends."""
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        with contextlib.suppress(termios.error, OSError):  # a terminal that hung up is gone
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """SIGHUP (the terminal went away) unwinds like Ctrl-C, so the clean-up runs."""

    def hang_up(signum: int, frame: Any) -> None:
        exc = KeyboardInterrupt()
        exc.signum = signum  # type: ignore[attr-defined]
        raise exc

    previous = signal.signal(signal.SIGHUP, hang_up)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def require_terminal(interactive: bool) -> None:
    """Refuse ``-i`` with ``-t`` when standard input is no terminal.

    Raises:
        InputNotATerminal: it is not.
    """
    fd = descriptor(sys.stdin)
    if interactive and (fd is None or not os.isatty(fd)):
        raise InputNotATerminal(NOT_A_TTY)


def start_guardian(sandbox: Sandbox, session_id: str, owned: bool = False) -> int | None:
    """Fork the guardian that deletes the session if this process dies (see the module
    docstring), and the sandbox too when ``owned`` (``run -it`` made it); returns the write
    end of its pipe (None without fork)."""
    if not hasattr(os, "fork"):
        return None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the guardian
        code = 0
        try:
            os.close(write_end)
            os.setsid()  # out of this terminal's signals
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # nor holding it (or a pipe the CLI writes to) open
                os.dup2(devnull, fd)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            told = b""
            while chunk := os.read(read_end, 64):
                told += chunk
            # forked from a threaded process, it may wait on a lock no thread will release:
            # it never outlives the CLI by more than this (SIGALRM's default ends it)
            signal.alarm(GUARD_LIMIT)
            if GUARD_DONE not in told:
                try:
                    sandbox.pty.delete(session_id)
                finally:
                    if owned:
                        sandbox.delete()
        except BaseException:  # noqa: BLE001 - a guardian never returns into the CLI
            code = 1
        finally:
            os._exit(code)
    os.close(read_end)
    _guardians[write_end] = pid
    return write_end


_guardians: dict[int, int] = {}


def stop_guardian(write_end: int | None) -> None:
    """Tell the guardian the session is dealt with, and wait for it to exit."""
    if write_end is None:
        return
    pid = _guardians.pop(write_end)
    try:
        os.write(write_end, GUARD_DONE)
    finally:
        os.close(write_end)
    os.waitpid(pid, 0)


def run_terminal(
    sandbox: Sandbox,
    command: str | None,
    *,
    interactive: bool,
    cwd: str | None,
    env: dict[str, str] | None,
    owned: bool = False,
) -> int:
    """Run ``command`` (default: a shell) on a terminal in ``sandbox``, joined to this one;
    returns the status to exit with (see the module docstring). ``owned``: the caller made
    ``sandbox`` and deletes it when this returns; if this process is killed, the guardian does.

    Raises:
        InputNotATerminal: ``interactive`` but standard input is no terminal.
    """
    stdin_fd, stdout_fd = descriptor(sys.stdin), descriptor(sys.stdout)
    require_terminal(interactive)
    variables = {"TERM": os.environ.get("TERM") or DEFAULT_TERM, **(env or {})}
    session_id = sandbox.pty.create(command, cwd=cwd, env=variables)
    guardian = start_guardian(sandbox, session_id, owned)
    try:
        size = None
        for fd in (stdout_fd, stdin_fd):
            size = size or (terminal_size(fd) if fd is not None else None)
        conn = sandbox.pty.connect(session_id, size=size)
        try:
            with signals_unwind():
                if interactive and stdin_fd is not None:
                    with raw_mode(stdin_fd):
                        broken = _relay(conn, stdin_fd, stdout_fd)
                else:
                    broken = _relay(conn, None, stdout_fd)
        finally:
            conn.close()
    finally:
        try:
            sandbox.pty.delete(session_id)
        except OpenSandboxError:
            pass  # the guardian tries too, once told nothing
        else:
            stop_guardian(guardian)
            guardian = None
        if guardian is not None:
            os.close(guardian)  # EOF without "done": the guardian deletes it
    if broken is not None:
        print(f"osb-sync: the output could not be written ({broken})", file=sys.stderr)
        return EXIT_BROKEN_PIPE
    if conn.ended == "taken over":
        print("osb-sync: another client took this terminal over", file=sys.stderr)
        return EXIT_TAKEN_OVER
    if conn.ended != "exited":
        print(f"osb-sync: the terminal's connection ended ({conn.ended})", file=sys.stderr)
    return exit_status(conn.exit_code)


def descriptor(stream: Any) -> int | None:
    """The file descriptor under a standard stream; None for one without (a StringIO)."""
    try:
        fd: int = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return None
    return fd


def writer(fd: int | None) -> Callable[[bytes], None]:
    """Writes output to ``fd`` as it is, or as text to ``sys.stdout`` without one."""
    if fd is not None:

        def write(data: bytes) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]

        return write
    decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def write_text(data: bytes) -> None:
        sys.stdout.write(decoder.decode(data))
        sys.stdout.flush()

    return write_text


def _relay(conn: PtyConnection, stdin_fd: int | None, stdout_fd: int | None) -> str | None:
    """Copy input to the session and its output here until it ends; resize on SIGWINCH.
    Returns why the output could not be written (a reader that went: EPIPE), else None."""
    wake_r, wake_w = os.pipe()
    winch_r, winch_w = os.pipe()  # SIGWINCH's: the loop below sends the resize
    os.set_blocking(winch_w, False)
    done = threading.Event()
    write = writer(stdout_fd)
    broken: list[str] = []

    def show() -> None:
        try:
            while True:
                data = conn.read()
                if data is None:
                    continue
                if not data:
                    if conn.ended != "dropped" or not _reattach(conn):
                        return
                    continue
                write(data)
        except OSError as exc:  # the output's reader went (`| head`): the end, no traceback
            broken.append(exc.strerror or str(exc))
        finally:
            done.set()
            os.write(wake_w, b"x")

    def resized(signum: int, frame: Any) -> None:
        # not a send from here: the handler runs in the main thread wherever it is, maybe in
        # a send holding the lock a resize would wait for (for ever)
        with contextlib.suppress(OSError):  # full: a resize is pending already
            os.write(winch_w, b"w")

    def resize() -> None:
        os.read(winch_r, 4096)
        size = terminal_size(stdout_fd) if stdout_fd is not None else None
        if size is not None:
            with contextlib.suppress(OpenSandboxError):
                conn.resize(*size)

    previous = signal.signal(signal.SIGWINCH, resized) if hasattr(signal, "SIGWINCH") else None
    shower = threading.Thread(target=show, name="osb-sync-tty", daemon=True)
    shower.start()
    try:
        watched = [wake_r, winch_r] if stdin_fd is None else [stdin_fd, wake_r, winch_r]
        while not done.is_set():
            ready, _, _ = select.select(watched, [], [])
            if winch_r in ready:
                resize()
            if stdin_fd in ready:
                data = os.read(stdin_fd, 4096)
                if not data:
                    watched = [wake_r, winch_r]  # no more input; the output goes on
                    continue
                with contextlib.suppress(OpenSandboxError):
                    conn.send(data)
    finally:
        if previous is not None:
            signal.signal(signal.SIGWINCH, previous)
        conn.close()
        shower.join()
        for fd in (wake_r, wake_w, winch_r, winch_w):
            os.close(fd)
    return broken[0] if broken else None


def _reattach(conn: PtyConnection) -> bool:
    """Reconnect once from the last byte shown (taking over the dropped connection's place,
    which execd may not have noticed yet); False when that fails too."""
    try:
        conn.reconnect(takeover=True)
    except (ApiError, OpenSandboxError):
        return False
    return True


def check_tty_options(user: str | None, detach: bool) -> None:
    """Refuse what a terminal session cannot do.

    Raises:
        UsageError: -u (execd runs a terminal as itself) or -d with -t.
    """
    if user:
        raise UsageError("-u does not go with -t: execd runs a terminal as its own user")
    if detach:
        raise UsageError("give -t or -d, not both: a background command has no terminal")
