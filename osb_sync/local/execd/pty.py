"""execd's terminals: `/pty` sessions and their WebSocket, as released execd serves them.

Not in the 1.1.1 spec (execd has served them since 1.0.10, undocumented); the facts are
`opensandbox-1.1.1.md` §2. `POST /pty` makes a dormant session (`cwd`, `command`); the first
WebSocket connect (`GET /pty/{id}/ws`) launches its process: `bash --noprofile --norc` (or
`-c COMMAND`; `sh` without bash) on a real pseudo-terminal of the sandbox, 80x24, its
controlling terminal (so Ctrl-C, Ctrl-Z and `stty size` behave), or with `pty=0` on pipes.
A process that exited is launched again by the next connect, in that connect's mode (as the
real execd does); the bytes and offsets go on.

Every output byte goes into the session's ring (`RING_BYTES`, the newest kept) with its
absolute offset, and to the one connected client (the holder) in the same step under the
session's lock, so a replay (`since=`) and the live frames after it neither miss nor repeat
a byte. A second client gets 409 `ALREADY_CONNECTED` unless it asks `takeover=1`: then the
holder is closed with 4001 `TAKEN_OVER`. Frames (server to client): `0x01`/`0x02` + output,
`0x03` + 8-byte offset + replay; JSON text frames `connected`, `pong`, `error`, `exit` (then
close 1000 `process exited`). From the client: `0x00` + stdin, JSON `stdin`, `resize`,
`signal`, `ping`; anything else is ignored or answered `INVALID_FRAME`.

What a client sends is hostile (any process of the sandbox may connect): messages are capped
at `MAX_CLIENT_MESSAGE`, a resize takes numbers from 1 to 65535, a signal only the five
names execd accepts. Keepalive as execd's: a ping every `PING_INTERVAL` s, a read deadline
of `READ_DEADLINE` s (any frame renews it; the socket's timeout, which bounds writes too).
A session lives until DELETE or the sandbox's end: no idle reaping (as execd).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import termios
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import TypeGuard

from ... import _websocket as websocket
from ..._json import check_depth
from ..http.bodies import read_object, working_dir
from ..http.exchange import Exchange, error
from .runner import SandboxRuntime, kill_group

RING_BYTES = 1 << 20
LIVE_FRAME = 32 * 1024
PING_INTERVAL = 30.0
READ_DEADLINE = 60.0
TAKEOVER_WAIT = 5.0
TAKEOVER_CLOSE = 1.0  # seconds the evicted holder's close 4001 may take to go out
MAX_CLIENT_MESSAGE = 1 << 20
MAX_SESSIONS = 256
STDOUT, STDERR, REPLAY, STDIN = 0x01, 0x02, 0x03, 0x00
SIGNALS = {
    name: getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGKILL", "SIGQUIT", "SIGHUP")
}
TAKEN_OVER = 4001
# Makes standard input (the terminal) the controlling terminal of the new session, then runs
# the shell: not a preexec_fn, which is unsafe in execd's threaded process.
CONTROLLING_TTY = ";".join(
    (
        "import fcntl, os, sys, termios",
        "fcntl.ioctl(0, termios.TIOCSCTTY, 0)",
        "os.execvp(sys.argv[1], sys.argv[1:])",
    )
)


def frame_json(obj: dict[str, Any]) -> str:
    """A JSON text frame as execd writes it (one line, ending with a newline)."""
    return json.dumps(obj, separators=(",", ":")) + "\n"


def is_size(value: object) -> TypeGuard[int]:
    """Whether `value` is a terminal dimension: an int from 1 to 65535."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536


class Ring:
    """The newest `RING_BYTES` of a session's output, with the offset of every byte."""

    def __init__(self, size: int = RING_BYTES) -> None:
        self.size = size
        self.data = bytearray()
        self.total = 0  # bytes ever written: the offset of the next one

    def append(self, data: bytes) -> None:
        """Keep `data`, dropping the oldest bytes past the ring's size."""
        self.data += data
        self.total += len(data)
        if len(self.data) > self.size:
            del self.data[: len(self.data) - self.size]

    def since(self, offset: int) -> tuple[int, bytes]:
        """(offset of the first byte, the bytes retained from `offset` on), clamped to what
        is retained; empty when `offset` is at or past the end."""
        first = self.total - len(self.data)
        start = min(max(offset, first), self.total)
        return start, bytes(self.data[start - first :])


class Session:
    """One terminal session: its process, its ring and its holder (all under `lock`)."""

    def __init__(self, runtime: SandboxRuntime, cwd: Path, command: str | None) -> None:
        self.id = str(uuid.uuid4())
        self.runtime = runtime
        self.cwd = cwd
        self.command = command
        self.lock = threading.Lock()
        self.ring = Ring()
        self.proc: subprocess.Popen[bytes] | None = None
        self.pipe_mode = False
        self.master = -1  # the terminal's master side (PTY mode)
        self.stdin: Any = None  # the process's stdin pipe (pipe mode)
        self.holder: websocket.WebSocket | None = None
        self.released = threading.Condition(self.lock)
        self.deleted = False

    @property
    def running(self) -> bool:
        """Whether its process runs (the caller holds `lock`)."""
        return self.proc is not None and self.proc.returncode is None

    def argv(self) -> list[str]:
        """The shell, as execd runs it."""
        shell = shutil.which("bash", path=self.runtime.env.get("PATH")) or "/bin/sh"
        flags = ["--noprofile", "--norc"] if shell.endswith("bash") else []
        return [shell, *flags, *(["-c", self.command] if self.command else [])]

    def launch(self) -> None:
        """Start the process (the caller holds `lock`); OSError if it cannot."""
        argv = self.argv()
        if self.pipe_mode:
            proc = self.runtime.spawn(
                argv, cwd=self.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            self.proc, self.stdin = proc, proc.stdin
            threading.Thread(target=self._pump_pipes, args=(proc,), daemon=True).start()
            return
        master, slave = os.openpty()
        try:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
            env = {"TERM": self.runtime.env.get("TERM", "xterm")}
            proc = self.runtime.spawn(
                [self.runtime.python, "-I", "-S", "-c", CONTROLLING_TTY, *argv],
                cwd=self.cwd, env=env, stdin=slave, stdout=slave, stderr=slave,
            )  # fmt: skip
        except OSError:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self.proc, self.master = proc, master
        threading.Thread(target=self._pump_terminal, args=(proc, master), daemon=True).start()

    def output(self, channel: int, data: bytes) -> None:
        """Keep `data` and send it to the holder, in one step."""
        with self.lock:
            self.ring.append(data)
            holder = self.holder
            if holder is not None:
                try:
                    holder.send_binary(bytes([channel]) + data)
                except OSError:
                    holder.abort()  # a client that stops reading is dropped

    def _pump_terminal(self, proc: subprocess.Popen[bytes], master: int) -> None:
        # Until the process ends and what it wrote is drained: a child of it that keeps the
        # terminal open must not keep the session running. The pump owns `master`.
        while True:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, LIVE_FRAME)
                except OSError:  # EIO: no process has the terminal open any more
                    data = b""
                if data:
                    self.output(STDOUT, data)
                    continue
                break
            if proc.poll() is not None:
                break
        proc.wait()
        with self.lock:
            if self.master == master:
                self.master = -1
            os.close(master)
        self._exited(proc)

    def _pump_pipes(self, proc: subprocess.Popen[bytes]) -> None:
        pumps = [
            threading.Thread(target=self._pump_pipe, args=(stream, channel), daemon=True)
            for stream, channel in ((proc.stdout, STDOUT), (proc.stderr, STDERR))
        ]
        for pump in pumps:
            pump.start()
        for pump in pumps:
            pump.join()
        self._exited(proc)

    def _pump_pipe(self, stream: Any, channel: int) -> None:
        with stream:
            while True:
                data = os.read(stream.fileno(), LIVE_FRAME)
                if not data:
                    break
                self.output(channel, data)

    def _exited(self, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        status = 128 - code if code < 0 else code
        with self.lock:
            holder = self.holder if self.proc is proc else None
            if holder is not None:
                try:
                    holder.send_text(frame_json({"type": "exit", "exit_code": status}))
                except OSError:
                    pass
                holder.close(websocket.NORMAL, "process exited")
                # the connection is over: a connect that relaunches need not wait for the
                # client's close to come back
                self.holder = None
                self.released.notify_all()

    def write_stdin(self, data: bytes) -> None:
        """Give `data` to the process; OSError if it cannot take it."""
        with self.lock:
            stdin = self.stdin
            if not self.running:
                raise OSError("the process has exited")
            # a descriptor of its own: the write may block, outside the lock, while the pump
            # closes the master, whose number the next open file may get
            master = -1 if self.pipe_mode else os.dup(self.master)
        if self.pipe_mode:
            stdin.write(data)
            stdin.flush()
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(master, view) :]
        finally:
            os.close(master)

    def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's size (the kernel tells its foreground group: SIGWINCH)."""
        with self.lock:
            if self.pipe_mode or self.master < 0:
                return
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def signal(self, number: int) -> None:
        """Send signal `number` to the process group."""
        with self.lock:
            if self.proc is not None and self.running:
                kill_group(self.proc.pid, number)

    def kill(self) -> None:
        """Kill every process of the session, close the terminal, drop the holder."""
        evict(self.holder)  # a send to a holder that stopped reading holds the lock
        with self.lock:
            self.deleted = True
            proc, holder = self.proc, self.holder
            self.holder = None
        if proc is not None:
            kill_session(proc.pid, reaped=proc.returncode is not None)
        evict(holder)


def evict(holder: websocket.WebSocket | None) -> None:
    """End `holder`'s connection at once (read without the session's lock, which a send to
    a holder that stopped reading may hold for `READ_DEADLINE` s: the send then fails)."""
    if holder is not None:
        holder.abort()


def kill_session(sid: int, reaped: bool) -> None:
    """SIGKILL every process of session `sid` (the shell's: it is the session leader).

    Its group is not enough: a shell on a terminal has job control, so each job (`sleep &`,
    a pipeline) is a process group of its own, and it would outlive the delete. Once the
    shell was `reaped`, a process numbered `sid` is another one (the number was free: its
    session had ended) and nothing is killed.
    """
    if reaped and os.path.exists(f"/proc/{sid}"):
        return
    kill_group(sid, signal.SIGKILL)
    for _ in range(10):  # until no member is left (one may fork while we look)
        members = session_members(sid)
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def session_members(sid: int) -> list[int]:
    """The live processes (not zombies) of session `sid`, from /proc."""
    members = []
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: the group is all that can be killed
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[3] == str(sid).encode() and fields[0] != b"Z":
            members.append(int(name))
    return members


class PtySessions:
    """The `/pty` routes of one sandbox's execd."""

    def __init__(self, runtime: SandboxRuntime) -> None:
        self.runtime = runtime
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}

    def _session(self, session_id: str) -> Session:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise error(404, "CONTEXT_NOT_FOUND", f"pty session {session_id} not found")
        return session

    def create(self, ex: Exchange) -> None:
        """POST /pty: a dormant session (`cwd` made with its parents, `~` the sandbox's HOME;
        `command`)."""
        body = read_object(ex, empty={})
        cwd, command = body.get("cwd"), body.get("command")
        if command is not None and (not isinstance(command, str) or "\0" in command):
            raise error(400, "INVALID_REQUEST_BODY", "command must be a string without NUL")
        if isinstance(cwd, str) and (cwd == "~" or cwd.startswith("~/")):
            cwd = (self.runtime.env.get("HOME") or str(self.runtime.dir)) + cwd[1:]
        if isinstance(cwd, str) and cwd and "\0" not in cwd:
            path = self.runtime.resolve(os.path.expandvars(cwd))
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise error(
                    500, "RUNTIME_ERROR", f"error creating pty session: {exc.strerror}"
                ) from None
        directory = working_dir(cwd, self.runtime.dir, self.runtime.resolve)
        with self._lock:
            if len(self._sessions) >= MAX_SESSIONS:
                raise error(
                    429, "RUNTIME_ERROR", f"{MAX_SESSIONS} pty sessions at most: delete one"
                )
            session = Session(self.runtime, directory, command or None)
            self._sessions[session.id] = session
        ex.send_json(201, {"session_id": session.id})

    def status(self, ex: Exchange) -> None:
        """GET /pty/{id}."""
        session = self._session(ex.params["id"])
        # without the lock, which a send to a client that stopped reading may hold
        proc = session.proc
        running, offset = proc is not None and proc.poll() is None, session.ring.total
        ex.send_json(200, {"session_id": session.id, "running": running, "output_offset": offset})

    def delete(self, ex: Exchange) -> None:
        """DELETE /pty/{id}: kill its process group and drop its client."""
        session = self._session(ex.params["id"])
        with self._lock:
            self._sessions.pop(session.id, None)
        session.kill()
        ex.send(200)

    def close(self) -> None:
        """Kill every session (the sandbox is going away)."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session.kill()

    def connect(self, ex: Exchange) -> None:
        """GET /pty/{id}/ws: attach (see the module docstring)."""
        session = self._session(ex.params["id"])
        takeover = ex.arg("takeover") == "1"
        since = ex.arg("since") or "0"
        offset = int(since) if since.isascii() and since.isdigit() and len(since) < 19 else 0
        holder = session.holder  # without the lock (see `evict`); `_attach` checks again
        if holder is not None and not takeover:
            raise error(
                409,
                "ALREADY_CONNECTED",
                f"another client is already connected to pty session {session.id}",
            )
        if holder is not None:
            # the close (best effort) may wait behind a send to a holder that stopped reading
            closer = threading.Thread(target=holder.close, args=(TAKEN_OVER, "TAKEN_OVER"))
            closer.start()
            closer.join(TAKEOVER_CLOSE)
            evict(holder)
        ws = ex.upgrade(MAX_CLIENT_MESSAGE, READ_DEADLINE)
        try:
            if self._attach(session, ws, offset, ex.arg("pty") == "0"):
                self._serve(session, ws)
        finally:
            with session.lock:
                if session.holder is ws:
                    session.holder = None
                    session.released.notify_all()
            ws.abort()

    def _attach(self, session: Session, ws: websocket.WebSocket, since: int, pipe: bool) -> bool:
        """Become the holder, launch if needed, send the replay and `connected`; False when
        the connection ends here (an error frame was sent)."""
        with session.lock:
            if not session.released.wait_for(lambda: session.holder is None, TAKEOVER_WAIT):
                ws.send_text(
                    frame_json(
                        {
                            "type": "error",
                            "code": "ALREADY_CONNECTED",
                            "error": "the holder could not be evicted within 5 s",
                        }
                    )
                )
                ws.close(websocket.POLICY, "ALREADY_CONNECTED")
                return False
            if session.deleted:
                return False
            if session.proc is not None:
                session.proc.poll()
            if not session.running:
                session.pipe_mode = pipe  # the connect that launches chooses (as execd)
                try:
                    session.launch()
                except OSError as exc:
                    ws.send_text(
                        frame_json({"type": "error", "code": "START_FAILED", "error": str(exc)})
                    )
                    ws.close(websocket.INTERNAL, "START_FAILED")
                    return False
            session.holder = ws
            start, data = session.ring.since(since)
            if data:
                ws.send_binary(bytes([REPLAY]) + struct.pack("!Q", start) + data)
            mode = "pipe" if session.pipe_mode else "pty"
            ws.send_text(frame_json({"type": "connected", "session_id": session.id, "mode": mode}))
        return True

    def _serve(self, session: Session, ws: websocket.WebSocket) -> None:
        """Read the client's frames until it goes (pinging it meanwhile)."""
        stop = threading.Event()

        def keepalive() -> None:
            while not stop.wait(PING_INTERVAL):
                try:
                    ws.ping()
                except OSError:
                    return

        threading.Thread(target=keepalive, daemon=True).start()
        try:
            while True:
                try:
                    opcode, data = ws.recv()
                except (websocket.Closed, websocket.ProtocolError, OSError):
                    return
                if not self._frame(session, ws, opcode, data):
                    return
        finally:
            stop.set()

    def _frame(self, session: Session, ws: websocket.WebSocket, opcode: int, data: bytes) -> bool:
        """Act on one client message; False ends the connection."""
        if opcode == websocket.OP_BINARY:
            if len(data) > 1 and data[0] == STDIN:
                return self._stdin(session, ws, data[1:])
            return True
        try:
            check_depth(data)
            message = json.loads(data)
        except (ValueError, RecursionError):
            return True  # not JSON: ignored, as execd does
        if not isinstance(message, dict):
            return True
        kind = message.get("type")
        if kind == "stdin" and isinstance(message.get("data"), str):
            return self._stdin(session, ws, message["data"].encode("utf-8", "replace"))
        if kind == "resize":
            cols, rows = message.get("cols"), message.get("rows")
            if is_size(cols) and is_size(rows):
                session.resize(cols, rows)
            return True
        if kind == "signal":
            number = SIGNALS.get(message.get("signal"))  # type: ignore[arg-type]
            if number is not None:
                session.signal(number)
            return True
        if kind == "ping":
            ws.send_text(frame_json({"type": "pong"}))
            return True
        shown = kind[:40] if isinstance(kind, str) else type(kind).__name__
        ws.send_text(
            frame_json({"type": "error", "code": "INVALID_FRAME", "error": f"unknown {shown!r}"})
        )
        return True

    def _stdin(self, session: Session, ws: websocket.WebSocket, data: bytes) -> bool:
        try:
            session.write_stdin(data)
        except OSError as exc:
            ws.send_text(
                frame_json(
                    {
                        "type": "error",
                        "code": "STDIN_WRITE_FAILED",
                        "error": exc.strerror or str(exc),
                    }
                )
            )
            return False
        return True
