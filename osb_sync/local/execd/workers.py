"""What runs inside a local sandbox: shell commands and bash sessions (Python workers are in
`pyworker.py`), and the execd event helpers they share.

Each runner reports output through an `emit` callback taking one execd event (without its
timestamp) and never touches HTTP, so the framing stays in the route modules.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import selectors
import shlex
import signal
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from ..http.bodies import rfc3339
from .output import OutputLog
from .runner import SandboxRuntime, kill_group

POLL_INTERVAL = 0.02
EXIT_POLL_INTERVAL = 0.1  # how often a background command's exit is polled without a pidfd
READ_SIZE = 1 << 16
LINE_LIMIT = 1 << 20  # a longer line without a newline is sent in pieces of this size
TERM_GRACE = 3.0
SIGNAL_WORDS = {signal.SIGKILL: "killed", signal.SIGTERM: "terminated", signal.SIGINT: "interrupt"}

Emit = Callable[[dict[str, Any]], None]


def exit_error(returncode: int) -> tuple[str, str]:
    """The (evalue, Go-style error text) of a failed process, as execd reports it."""
    if returncode < 0:
        sig = signal.Signals(-returncode)
        return "-1", f"signal: {SIGNAL_WORDS.get(sig, sig.name.lower())}"
    return str(returncode), f"exit status {returncode}"


def run_error(runtime: SandboxRuntime, returncode: int, oom_before: int) -> tuple[str, str]:
    """`exit_error`, saying so when the OOM killer ended the process (its count went up)."""
    evalue, text = exit_error(returncode)
    if returncode == -signal.SIGKILL and runtime.oom_kills() > oom_before:
        text += " (out of memory: the OOM killer ended it at the sandbox's memory limit)"
    return evalue, text


def failure(evalue: str, text: str) -> dict[str, Any]:
    """An `error` event as execd sends it for a failed command."""
    return {
        "type": "error",
        "error": {"ename": "CommandExecError", "evalue": evalue, "traceback": [text]},
    }


def complete(started: float) -> dict[str, Any]:
    """An `execution_complete` event for a run started at monotonic time `started`."""
    event: dict[str, Any] = {"type": "execution_complete"}
    elapsed = int((time.monotonic() - started) * 1000)
    if elapsed:
        event["execution_time"] = elapsed  # execd omits zero values (Go's omitempty)
    return event


class Pipes:
    """Closes a process's pipes once it was killed and no run is reading them any more.

    Closing them under a running reader could hand their descriptor numbers to new files.
    """

    def __init__(self, *files: IO[bytes] | None) -> None:
        self._files = [f for f in files if f is not None]
        self._lock = threading.Lock()
        self._readers = 0
        self._killed = False

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Mark a run as using the pipes for the duration of the block."""
        with self._lock:
            self._readers += 1
        try:
            yield
        finally:
            with self._lock:
                self._readers -= 1
            self._close_if_done()

    def killed(self) -> None:
        """The process is dead: close the pipes now or when the last run ends."""
        with self._lock:
            self._killed = True
        self._close_if_done()

    def _close_if_done(self) -> None:
        with self._lock:
            if self._killed and not self._readers:
                for handle in self._files:
                    handle.close()
                self._files = []


class LineSplitter:
    """Splits a byte stream into lines the way execd reports /command output."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes) -> list[str]:
        """The complete lines in `data` plus what was buffered, without terminators.

        A line longer than LINE_LIMIT is cut into pieces of that size, so memory stays bounded.
        """
        *lines, self._rest = (self._rest + data).split(b"\n")
        while len(self._rest) >= LINE_LIMIT:
            lines.append(self._rest[:LINE_LIMIT])
            self._rest = self._rest[LINE_LIMIT:]
        return [self._text(line) for line in lines]

    def flush(self) -> list[str]:
        """The trailing partial line, if any."""
        rest, self._rest = self._rest, b""
        return [self._text(rest)] if rest else []

    @staticmethod
    def _text(line: bytes) -> str:
        # execd sends a blank line as "\n" because empty texts are never sent.
        return line.removesuffix(b"\r").decode("utf-8", "replace") or "\n"


def follow_pipes(
    proc: subprocess.Popen[bytes],
    pipes: dict[str, IO[bytes]],
    sink: Callable[[str, bytes], None],
    deadline: float | None = None,
) -> bool:
    """Feed what `proc` writes to its `pipes` into `sink` until it exits; True if it timed out.

    Pipes, not files: output needs no free disk, so a sandbox whose disk is full (or a shared
    disk another sandbox filled) still sees every line. Once `proc` has exited, what is in the
    pipes is read and the run ends without waiting for EOF: a background child that inherited
    a pipe (`sleep 60 &`) does not hold the stream open; what it writes later is read and
    dropped by a thread of its own until EOF (closed, the pipe would kill it with SIGPIPE).
    """
    timed_out = False
    open_pipes = dict(pipes)
    try:
        with selectors.DefaultSelector() as waiter:
            for name, pipe in pipes.items():
                os.set_blocking(pipe.fileno(), False)
                waiter.register(pipe.fileno(), selectors.EVENT_READ, name)
            while waiter.get_map():
                exited = proc.poll() is not None
                wait = 0 if exited else POLL_INTERVAL
                if deadline is not None and not timed_out:
                    wait = min(wait, max(0.0, deadline - time.monotonic()))
                ready = waiter.select(wait)
                for key, _ in ready:
                    try:
                        data = os.read(int(key.fd), READ_SIZE)
                    except BlockingIOError:
                        continue
                    if data:
                        sink(key.data, data)
                    else:
                        waiter.unregister(key.fd)
                        open_pipes.pop(key.data).close()
                if exited and not ready:
                    return timed_out
                if deadline is not None and not timed_out and time.monotonic() > deadline:
                    kill_group(proc.pid, signal.SIGKILL)
                    timed_out = True
            proc.wait()
            return timed_out
    finally:
        if open_pipes:
            threading.Thread(target=_drop, args=(list(open_pipes.values()),), daemon=True).start()


def _drop(pipes: list[IO[bytes]]) -> None:
    """Read and drop what `pipes` still get until EOF, then close them."""
    for pipe in pipes:
        try:
            os.set_blocking(pipe.fileno(), True)
            while pipe.read(READ_SIZE):
                pass
        except (OSError, ValueError):
            pass
        finally:
            pipe.close()


def collect_output(
    proc: subprocess.Popen[bytes],
    pipe: IO[bytes],
    write: Callable[[bytes], None],
    deadline: float | None,
    on_exit: Callable[[], None],
) -> None:
    """Read `pipe` into `write` until EOF, killing `proc`'s group at `deadline`.

    `on_exit` is called once `proc` has exited and what it had written was read (so a
    status that says done has all its output), and the pipe is read on after it while a
    child that inherited it (`sleep 60 &`) holds it open. The exit is seen through a pidfd,
    or polled every EXIT_POLL_INTERVAL where there is none. Closes `pipe`.
    """
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    try:
        exit_fd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # before Linux 5.3 or Python 3.9
        exit_fd = None
    exited = False
    try:
        with selectors.DefaultSelector() as waiter:
            waiter.register(fd, selectors.EVENT_READ, "output")
            if exit_fd is not None:
                waiter.register(exit_fd, selectors.EVENT_READ, "exit")
            while waiter.get_map() or not exited:
                wait = None if exit_fd is not None or exited else EXIT_POLL_INTERVAL
                if deadline is not None and not exited:
                    left = max(0.0, deadline - time.monotonic())
                    wait = left if wait is None else min(wait, left)
                for key, _ in waiter.select(wait):
                    if key.data == "output" and not _read_into(fd, write, READ_SIZE):
                        waiter.unregister(fd)
                    elif key.data == "exit":
                        waiter.unregister(key.fd)
                        proc.wait()
                if not exited and proc.poll() is not None:
                    _drain(fd, write)
                    exited = True
                    on_exit()
                elif deadline is not None and not exited and time.monotonic() >= deadline:
                    kill_group(proc.pid, signal.SIGKILL)
                    deadline = None
    finally:
        if exit_fd is not None:
            os.close(exit_fd)
        pipe.close()
        if not exited:  # an error above: never leave the status running
            proc.wait()
            on_exit()


def _read_into(fd: int, write: Callable[[bytes], None], size: int) -> bool:
    """Read up to `size` bytes of `fd` into `write`; False at EOF."""
    try:
        data = os.read(fd, size)
    except BlockingIOError:
        return True
    if data:
        write(data)
    return bool(data)


def _drain(fd: int, write: Callable[[bytes], None]) -> None:
    """Read what `fd` holds now (not what a writer adds meanwhile, which could be endless)."""
    held = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, held)
    left = int.from_bytes(held, "little")
    while left > 0:
        data = b""
        with contextlib.suppress(BlockingIOError):
            data = os.read(fd, min(left, READ_SIZE))
        if not data:
            return
        write(data)
        left -= len(data)


@dataclass
class CommandRecord:
    """A /command run, foreground or background, for status, logs and interrupt."""

    id: str
    content: str
    proc: subprocess.Popen[bytes]
    background: bool
    output: OutputLog | None = None  # a background command's output
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    finished_at: datetime | None = None
    exit_code: int | None = None
    error: str | None = None

    def finish(self) -> None:
        """Record the exit of the process (which must have exited)."""
        returncode = self.proc.wait()
        if returncode != 0:
            self.error = exit_error(returncode)[1]
        self.exit_code = -1 if returncode < 0 else returncode
        self.finished_at = datetime.now(timezone.utc)

    def status(self) -> dict[str, Any]:
        """The `GET /command/status/{id}` body."""
        body: dict[str, Any] = {
            "id": self.id,
            "content": self.content,
            "running": self.finished_at is None,
            "started_at": rfc3339(self.started_at),
        }
        if self.finished_at is not None:
            body["exit_code"] = self.exit_code
            body["finished_at"] = rfc3339(self.finished_at)
        if self.error:
            body["error"] = self.error
        return body

    def terminate(self) -> None:
        """SIGTERM the process group, SIGKILL it after a grace period, as execd does."""
        kill_group(self.proc.pid, signal.SIGTERM)
        timer = threading.Timer(TERM_GRACE, kill_group, (self.proc.pid, signal.SIGKILL))
        timer.daemon = True
        timer.start()


class ShellSession:
    """A persistent bash process: cwd and environment survive between runs."""

    def __init__(self, runtime: SandboxRuntime, cwd: Path) -> None:
        self.id = secrets.token_hex(16)
        self.lock = threading.Lock()
        self._marker = f"__osb_done_{secrets.token_hex(8)}__"
        self._proc = runtime.spawn(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._pipes = Pipes(self._proc.stdin, self._proc.stdout)

    def run(
        self, command: str, cwd: str | None, deadline: float | None, on_line: Callable[[str], None]
    ) -> int | None:
        """Run `command`, passing each output line on; its exit code, or None on timeout/EOF."""
        with self._pipes.reading():
            return self._run(command, cwd, deadline, on_line)

    def _run(
        self,
        command: str,
        cwd: str | None,
        deadline: float | None,
        on_line: Callable[[str], None],
    ) -> int | None:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        prefix = f"cd {shlex.quote(cwd)} && " if cwd else ""
        script = f"{prefix}{{ {command}\n}} </dev/null 2>&1; printf '%s %d\\n' {self._marker} $?\n"
        try:
            self._proc.stdin.write(script.encode())
            self._proc.stdin.flush()
        except (OSError, ValueError):  # ValueError: the pipe was closed when it was killed
            return None
        splitter = LineSplitter()
        fd = self._proc.stdout.fileno()
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            with selectors.DefaultSelector() as sel:
                sel.register(fd, selectors.EVENT_READ)
                if not sel.select(wait):
                    self.kill()
                    return None
            data = os.read(fd, READ_SIZE)
            lines = splitter.feed(data) if data else splitter.flush()
            for line in lines:
                head, found, code = line.rpartition(f"{self._marker} ")
                if found and code.isdigit():
                    if head:
                        on_line(head)
                    return int(code)
                on_line(line)
            if not data:
                return None

    def kill(self) -> None:
        """Kill the session's process group."""
        kill_group(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._pipes.killed()
