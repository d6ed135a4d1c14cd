"""execd command routes: `/command` (foreground and background), its status, logs and
interrupt, and persistent bash sessions (`/session`), plus helpers shared by the execd routes.

A command writes to pipes (real execd tails files; pipes need no free disk, so a full disk
does not silence it). A foreground command's output is sent as execd 1.1.1 sends it (#2033):
texts that join to the exact output, each line with its terminator (a lone CR ends one too,
so a progress line goes out at once; `OutputPieces`); its stream stays open `command_grace`
seconds after the terminal event. Every command reads the `EXECD_ENVS` file afresh
(`envs_file.py`, execd 1.1.1's `commands.set_env`). Sessions keep June's form (one line per
event, terminator stripped: `workers.LineSplitter`); the client reads both.

A background command's stdout and stderr share one pipe, which a thread of its own reads
into the command's bounded in-memory `OutputLog` (`output.py`: the newest 4 MiB per command,
32 MiB per sandbox); the logs route reads it by byte offset, and the status says done only
once the pipe was read to the exit.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..http.bodies import (
    MAX_ID,
    bad_request,
    bounded_int,
    environment,
    read_object,
    text,
    timeout_ms,
    working_dir,
)
from ..http.exchange import EventStream, Exchange, error
from . import envs_file
from .output import LogBudget
from .runner import SandboxRuntime
from .workers import (
    LINE_LIMIT,
    CommandRecord,
    ShellSession,
    collect_output,
    complete,
    exit_error,
    failure,
    follow_pipes,
    run_error,
)

LINE_END = re.compile(rb"\r\n|\r|\n")
ENVS_FILE = ".opensandbox/envs"  # EXECD_ENVS when the sandbox's environment names none


class OutputPieces:
    """Cuts a byte stream into execd 1.1.1's output texts: each line with its terminator (LF,
    CR, or CRLF when both arrive together), a longer run without one in pieces of LINE_LIMIT
    bytes, so memory stays bounded; the texts join to the output (bytes that are not UTF-8
    replaced, as execd does)."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes) -> list[str]:
        """The texts `data` completes, with what was held before it."""
        data = self._rest + data
        pieces = []
        start = 0
        for end in _line_ends(data):
            pieces.append(data[start:end])
            start = end
        self._rest = data[start:]
        while len(self._rest) >= LINE_LIMIT:
            pieces.append(self._rest[:LINE_LIMIT])
            self._rest = self._rest[LINE_LIMIT:]
        return [piece.decode("utf-8", "replace") for piece in pieces]

    def flush(self) -> list[str]:
        """The last text, a line without a terminator, if any."""
        rest, self._rest = self._rest, b""
        return [rest.decode("utf-8", "replace")] if rest else []


def _line_ends(data: bytes) -> list[int]:
    """Where each line of `data` ends (after its LF, CR, or CRLF)."""
    return [found.end() for found in LINE_END.finditer(data)]


@dataclass
class CommandSpec:
    """What to run for one /command (or language-less /code) request."""

    command: str
    cwd: Path
    envs: dict[str, str]
    deadline: float | None = None
    user: int | None = None
    group: int | None = None
    argv: list[str] | None = None  # run without a shell (execd 1.1.0's argv, #1760)


PARSE_ERROR = "error parsing request, MAYBE invalid body format."
ONE_OF = f"{PARSE_ERROR} exactly one of non-empty command or argv is required"


def command_or_argv(body: dict[str, Any]) -> tuple[str, list[str] | None]:
    """A /command body's `command`, or its `argv` (and the JSON text its status shows), with
    execd 1.1.1's answers to each bad shape (reference 3.1); 400 otherwise."""
    command, argv = body.get("command"), body.get("argv")
    if (command not in (None, "")) == (argv is not None):
        raise error(400, "INVALID_REQUEST_BODY", ONE_OF)
    if argv is None:
        return text(body, "command"), None
    if not isinstance(argv, list):
        raise error(400, "INVALID_REQUEST_BODY", ONE_OF)
    if not all(isinstance(arg, str) for arg in argv):
        raise error(400, "INVALID_REQUEST_BODY", f"{PARSE_ERROR} argv elements must be strings")
    if not argv or not argv[0]:
        raise bad_request("argv must contain a non-empty executable")
    if any("\0" in arg for arg in argv):
        raise bad_request("argv must not contain NUL")
    return json.dumps(argv, separators=(",", ":")), argv


def find_program(name: str, cwd: Path, env: dict[str, str]) -> str:
    """Where execd 1.1.1 finds `argv[0]`: a name with a `/` against `cwd`; a bare name in
    the absolute entries of the command's `PATH`, a regular file with an execute bit.
    OSError (Go's message) if none."""
    if "/" in name:
        path = cwd / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        raise OSError(f"fork/exec {name}: no such file or directory")
    for entry in env.get("PATH", "").split(os.pathsep):
        if os.path.isabs(entry):
            path = Path(entry, name)
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    raise OSError(f'exec: "{name}": executable file not found in $PATH')


def command_env(runtime: SandboxRuntime, spec: CommandSpec) -> dict[str, str]:
    """A command's environment over the sandbox's: `EXECD_ENVS` (the file's path, by default
    `ENVS_FILE` under the sandbox directory), the file's variables, read afresh, then the
    request's `envs` (`envs_file.py`)."""
    path = runtime.env.get("EXECD_ENVS") or str(runtime.dir / ENVS_FILE)
    owners = {os.getuid()}
    for user in (runtime.user[0] if runtime.user else None, spec.user):
        if user is not None:
            owners.add(user)
    return {"EXECD_ENVS": path, **envs_file.read(path, owners, runtime.env), **spec.envs}


def spawn_shell(
    runtime: SandboxRuntime,
    spec: CommandSpec,
    stdout: int | IO[bytes],
    stderr: int | IO[bytes],
) -> subprocess.Popen[bytes]:
    """Start `spec` with the shell (its argv without one), in the sandbox, writing to the
    given files or pipes."""
    # found at each start, on the sandbox's PATH: an execd the template forked imported this
    # module outside the container, whose shell may be elsewhere (an image's)
    shell = shutil.which("bash", path=runtime.env.get("PATH")) or "/bin/sh"
    argv = [shell, "-c", spec.command]
    env = command_env(runtime, spec)
    if spec.argv is not None:
        argv = [find_program(spec.argv[0], spec.cwd, {**runtime.env, **env}), *spec.argv[1:]]
    return runtime.spawn(
        argv,
        cwd=spec.cwd,
        env=env,
        stdout=stdout,
        stderr=stderr,
        user=spec.user,
        group=spec.group,
    )


def start_shell(
    runtime: SandboxRuntime, spec: CommandSpec
) -> tuple[subprocess.Popen[bytes], dict[str, IO[bytes]]]:
    """Start `spec` writing to pipes (no disk needed); the process and its pipes. OSError if not."""
    proc = spawn_shell(runtime, spec, subprocess.PIPE, subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    return proc, {"stdout": proc.stdout, "stderr": proc.stderr}


def follow_shell(
    proc: subprocess.Popen[bytes],
    pipes: dict[str, IO[bytes]],
    sink: Callable[[str, bytes], None],
    deadline: float | None,
) -> int | str:
    """Read a process started by `start_shell` into `sink`; its exit code, or the error."""
    try:
        follow_pipes(proc, pipes, sink, deadline)
        return proc.wait()
    except OSError as exc:
        return str(exc)


def run_shell(
    runtime: SandboxRuntime,
    spec: CommandSpec,
    sink: Callable[[str, bytes], None],
    on_start: Callable[[subprocess.Popen[bytes]], None] = lambda proc: None,
) -> int | str:
    """Run `spec` with its output read from pipes into `sink`; the exit code, or the start error."""
    try:
        proc, paths = start_shell(runtime, spec)
    except OSError as exc:
        return str(exc)
    on_start(proc)
    return follow_shell(proc, paths, sink, spec.deadline)


class Commands:
    """Commands and bash sessions of one sandbox."""

    def __init__(self, runtime: SandboxRuntime, ping_interval: float, grace: float) -> None:
        self.runtime = runtime
        self.ping_interval = ping_interval
        self.grace = grace
        self._lock = threading.Lock()
        self._commands: dict[str, CommandRecord] = {}
        self._sessions: dict[str, ShellSession] = {}
        self._logs = LogBudget()

    def close(self) -> None:
        """Kill every session (commands die with the sandbox's process groups)."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session.kill()

    def _cwd(self, cwd: object) -> Path:
        """A body's `cwd` (`bodies.working_dir`), default the sandbox's directory."""
        return working_dir(cwd, self.runtime.dir, self.runtime.resolve)

    def stream(self, ex: Exchange, init_text: str) -> EventStream:
        """Start an event stream with its `init` event."""
        stream = EventStream(ex, self.ping_interval)
        stream.event({"type": "init", "text": init_text})
        return stream

    def run_command(self, ex: Exchange) -> None:
        """POST /command."""
        body = read_object(ex)
        command, argv = command_or_argv(body)
        timeout = timeout_ms(body)
        uid, gid = bounded_int(body, "uid", 0, MAX_ID), bounded_int(body, "gid", 0, MAX_ID)
        if gid is not None and uid is None:
            raise bad_request("uid is required when gid is provided")
        spec = CommandSpec(
            command,
            self._cwd(body.get("cwd")),
            environment(body.get("envs")),
            None if timeout is None else time.monotonic() + timeout / 1000,
            uid,
            gid,
            argv,
        )
        self.execute(ex, spec, background=bool(body.get("background")))

    def execute(self, ex: Exchange, spec: CommandSpec, background: bool) -> None:
        """Answer `ex` with the event stream of running `spec`.

        The process is started and recorded before `init` names it, as execd does, so an
        interrupt sent as soon as `init` arrives finds it.
        """
        command_id = secrets.token_hex(16)
        if background:
            self._background(ex, command_id, spec)
        else:
            self._foreground(ex, command_id, spec)

    def _started_stream(self, ex: Exchange, command_id: str) -> EventStream:
        stream = self.stream(ex, command_id)
        stream.start_pings()
        return stream

    def _end(self, stream: EventStream) -> None:
        try:
            time.sleep(self.grace)
        finally:
            stream.close()

    def _remember(self, record: CommandRecord) -> None:
        with self._lock:
            self._commands[record.id] = record

    def _foreground(self, ex: Exchange, command_id: str, spec: CommandSpec) -> None:
        started = time.monotonic()
        oom_before = self.runtime.oom_kills()
        try:
            proc, paths = start_shell(self.runtime, spec)
        except OSError as exc:
            stream = self._started_stream(ex, command_id)
            stream.event(failure(str(exc), str(exc)))
            self._end(stream)
            return
        record = CommandRecord(command_id, spec.command, proc, background=False)
        self._remember(record)
        stream = self._started_stream(ex, command_id)
        try:
            splitters = {"stdout": OutputPieces(), "stderr": OutputPieces()}

            def sink(name: str, data: bytes) -> None:
                for line in splitters[name].feed(data):
                    stream.event({"type": name, "text": line})

            outcome = follow_shell(proc, paths, sink, spec.deadline)
            for name, splitter in splitters.items():
                for line in splitter.flush():
                    stream.event({"type": name, "text": line})
            if isinstance(outcome, str):
                stream.event(failure(outcome, outcome))
            else:
                record.finish()
                stream.event(
                    complete(started)
                    if outcome == 0
                    else failure(*run_error(self.runtime, outcome, oom_before))
                )
        finally:
            self._end(stream)

    def _background(self, ex: Exchange, command_id: str, spec: CommandSpec) -> None:
        try:
            proc = spawn_shell(self.runtime, spec, subprocess.PIPE, subprocess.STDOUT)
        except OSError as exc:
            stream = self._started_stream(ex, command_id)
            stream.bare_error("RUNTIME_ERROR", f"error starting background command: {exc}")
            self._end(stream)
            return
        assert proc.stdout is not None
        output = self._logs.new_log()
        record = CommandRecord(command_id, spec.command, proc, background=True, output=output)
        self._remember(record)

        def collect(pipe: IO[bytes]) -> None:
            try:
                collect_output(proc, pipe, output.write, spec.deadline, record.finish)
            finally:
                output.close()

        threading.Thread(
            target=collect, args=(proc.stdout,), name=f"osb-local-bg-{command_id[:8]}", daemon=True
        ).start()
        stream = self._started_stream(ex, command_id)
        stream.event({"type": "execution_complete"})
        self._end(stream)

    def _record(self, command_id: str) -> CommandRecord | None:
        with self._lock:
            return self._commands.get(command_id)

    def status(self, ex: Exchange) -> None:
        """GET /command/status/{id}."""
        record = self._record(ex.params["id"])
        if record is None:
            raise error(404, "INVALID_REQUEST_BODY", f"command {ex.params['id']} not found")
        ex.send_json(200, record.status())

    def logs(self, ex: Exchange) -> None:
        """GET /command/{id}/logs?cursor=N: background output from byte offset N.

        A cursor into output dropped past the log's bounds gets `[N bytes dropped]` first and
        resumes at the oldest byte kept (`output.py`).
        """
        record = self._record(ex.params["id"])
        if record is None or record.output is None:
            raise bad_request(f"command {ex.params['id']} not found or not a background command")
        raw = ex.arg("cursor") or "0"
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
            raise bad_request("cursor must be a byte offset")
        pieces, cursor = record.output.read(int(raw))
        headers = {
            "Content-Type": "text/plain; charset=utf-8",
            "Content-Length": str(sum(len(piece) for piece in pieces)),
            "EXECD-COMMANDS-TAIL-CURSOR": str(cursor),
        }
        ex.start(200, headers)
        for piece in pieces:
            ex.handler.wfile.write(piece)
        ex.handler.wfile.flush()

    def interrupt(self, ex: Exchange) -> None:
        """DELETE /command?id=: SIGTERM the command's group, SIGKILL it 3 s later."""
        command_id = ex.arg("id")
        if not command_id:
            raise error(400, "MISSING_QUERY", "missing query parameter: id")
        record = self._record(command_id)
        if record is None:
            raise error(500, "RUNTIME_ERROR", "no such session")
        record.terminate()
        ex.send(200)

    def create_session(self, ex: Exchange) -> None:
        """POST /session: start a persistent bash."""
        body = read_object(ex, empty={})
        try:
            session = ShellSession(self.runtime, self._cwd(body.get("cwd")))
        except OSError as exc:
            raise error(500, "RUNTIME_ERROR", f"error creating session: {exc}") from None
        with self._lock:
            self._sessions[session.id] = session
        ex.send_json(200, {"session_id": session.id})

    def _session(self, session_id: str) -> ShellSession:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise error(404, "CONTEXT_NOT_FOUND", f"session {session_id} not found")
        return session

    def run_in_session(self, ex: Exchange) -> None:
        """POST /session/{id}/run: one event per output line, stderr merged into stdout."""
        session = self._session(ex.params["id"])
        body = read_object(ex)
        command = text(body, "command")
        timeout = timeout_ms(body)
        cwd = str(self._cwd(body["cwd"])) if body.get("cwd") else None
        stream = self.stream(ex, session.id)
        if not session.lock.acquire(blocking=False):
            stream.bare_error("RUNTIME_ERROR", "error running in session. session is busy")
            stream.close()
            return
        started = time.monotonic()
        try:
            stream.start_pings()
            deadline = None if timeout is None else started + timeout / 1000
            try:
                code = session.run(
                    command,
                    cwd,
                    deadline,
                    lambda line: stream.event({"type": "stdout", "text": line}),
                )
            finally:
                # Free before the terminal event: a client may send the next run the moment it
                # reads that event.
                session.lock.release()
            if code is None:
                late = deadline is not None and time.monotonic() >= deadline
                why = f"timeout after {(timeout or 0) / 1000:g}s" if late else "session exited"
                stream.bare_error("RUNTIME_ERROR", f"error running in session. {why}")
            else:
                stream.event(complete(started) if code == 0 else failure(*exit_error(code)))
        finally:
            stream.close()

    def delete_session(self, ex: Exchange) -> None:
        """DELETE /session/{id}."""
        session = self._session(ex.params["id"])
        with self._lock:
            self._sessions.pop(session.id, None)
        session.kill()
        ex.send(200)
