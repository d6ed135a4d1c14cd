"""``osb-sync exec`` and ``osb-sync logs``: commands in an existing sandbox, and what they and
the sandbox wrote.

``exec`` runs a shell command (``bash -c``) and exits with its status, echoing its output live
(``--json``: one object at the end); ``-i`` uploads standard input first (execd has no stdin
route), ``-d`` starts it in the background and prints its id; ``-t`` (``-it``) runs it on a
terminal of the sandbox joined to this one (``_cli_tty``: execd's ``/pty`` sessions).
``logs`` prints a background command's output, or the sandbox's own log through the server's
diagnostics route; ``-f`` follows either. ``run --language bash`` runs its code through
:func:`run_command` too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import posixpath
import secrets
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any, Callable, TextIO

from ._cli_options import (
    CannotRun,
    ExecOptions,
    GlobalOptions,
    LogsOptions,
    OutputOptions,
    UsageError,
)
from ._cli_output import command_json, command_status, names_missing_thing, new_lines
from ._cli_sandboxes import resolve_id
from ._client import Client
from ._errors import ApiError, NotFoundError, NotSupportedError
from ._sandbox import Sandbox

LOG_WINDOW = 10000  # lines: the most a diagnostics logs call returns (its tail's maximum)
FOLLOW_INTERVAL = 1.0  # seconds between the polls of logs -f of a sandbox's own log
# Where `exec -i` puts standard input in the sandbox before the command opens it.
STDIN_DIR = "/tmp"  # noqa: S108 - the sandbox's /tmp; the name is random, the mode 0600


def cmd_exec(cli: GlobalOptions, execute: ExecOptions) -> int:
    """``osb-sync exec [-i] [-d] [-e K=V] [-w DIR] [-u UID[:GID]] ID CMD...``: exit with its
    status (``-d``: print the background command's id)."""
    if execute.tty:
        return _exec_tty(cli, execute)
    if not execute.cmd:
        raise UsageError("exec needs a command: osb-sync exec ID CMD...")
    if execute.detach and execute.interactive:
        raise UsageError("give -i or -d, not both: a background command reads no input")
    command = execute.cmd[0] if len(execute.cmd) == 1 else shlex.join(execute.cmd)
    options = _command_options(execute)
    with cli.client() as client, _no_workdir(execute.workdir):
        sandbox = client.connect(resolve_id(client, execute.id))
        if execute.detach:
            handle = sandbox.commands.start(command, **options)
            print(json.dumps({"id": handle.id}) if cli.json else handle.id)
            return 0
        if execute.interactive:
            command = _with_stdin(sandbox, command)
        return run_command(sandbox, command, execute.output, cli.json, options)


def _exec_tty(cli: GlobalOptions, execute: ExecOptions) -> int:
    """``exec -t`` / ``-it``: the command (default a shell) on a terminal of the sandbox."""
    from ._cli_tty import InputNotATerminal, check_tty_options, run_terminal

    check_tty_options(execute.user, execute.detach)
    if cli.json:
        raise UsageError("--json does not go with -t: a terminal's output is not one object")
    command = None
    if execute.cmd:
        command = execute.cmd[0] if len(execute.cmd) == 1 else shlex.join(execute.cmd)
    with cli.client() as client:
        sandbox = client.connect(resolve_id(client, execute.id))
        try:
            return run_terminal(
                sandbox,
                command,
                interactive=execute.interactive,
                cwd=execute.workdir,
                env=execute.env,
            )
        except InputNotATerminal as exc:
            print(f"{exc}", file=sys.stderr)
            return 1


@contextlib.contextmanager
def _no_workdir(workdir: str | None) -> Iterator[None]:
    """execd's 400 for a ``cwd`` that is no directory, as -w's failure (exit 126).

    Raises:
        CannotRun: execd refused the command's ``cwd``.
    """
    try:
        yield
    except ApiError as exc:
        if workdir is None or exc.status_code != 400 or "cwd" not in str(exc):
            raise
        raise CannotRun(
            f"-w {workdir}: no such directory in the sandbox (execd: HTTP 400)"
        ) from exc


def run_command(
    sandbox: Sandbox,
    command: str,
    output: OutputOptions,
    as_json: bool,
    options: dict[str, Any] | None = None,
) -> int:
    """Run a shell command, echoing its output live (unless ``as_json``: its JSON shape at
    the end); ``options``: ``cwd``, ``env``, ``uid``, ``gid``. Returns its exit status."""
    echo = not as_json
    result = sandbox.commands.run(
        command,
        timeout=output.timeout,
        on_stdout=_writer(sys.stdout) if echo else None,
        on_stderr=_writer(sys.stderr) if echo else None,
        max_output_bytes=output.max_output,
        **(options or {}),
    )
    status = command_status(result)
    if as_json:
        print(json.dumps(command_json(result)))
    elif result.timed_out and output.timeout is not None:
        print(f"osb-sync: the command passed --timeout ({output.timeout:g} s)", file=sys.stderr)
    return status


def _command_options(execute: ExecOptions) -> dict[str, Any]:
    """``cwd``, ``env`` and ``uid``/``gid`` of a command, from -w, -e and -u."""
    options: dict[str, Any] = {"cwd": execute.workdir, "env": execute.env}
    if execute.user:
        uid, _, gid = execute.user.partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            raise UsageError(
                f"-u takes a numeric UID or UID:GID (execd runs a command as numbers, not "
                f"names), got {execute.user!r}"
            )
        options["uid"] = int(uid)
        options["gid"] = int(gid) if gid else None
    return options


def _with_stdin(sandbox: Sandbox, command: str) -> str:
    """Upload standard input to a file, and make it the command's standard input.

    execd has no stdin route: the input is read to its end here, streamed to a file of the
    sandbox, opened as the shell's standard input and unlinked at once (the open descriptor
    keeps it), so nothing is left behind and the command reads it as from a pipe that has
    already been written.
    """
    path = posixpath.join(STDIN_DIR, f"osb-stdin-{secrets.token_hex(8)}")
    # A pipe cannot be measured for Content-Length: spooled (in memory up to 8 MiB, then a
    # temporary file), read to its end.
    with tempfile.SpooledTemporaryFile(max_size=8 << 20) as data:
        if hasattr(sys.stdin, "buffer"):
            shutil.copyfileobj(sys.stdin.buffer, data)
        else:  # a text stream in place of stdin (an embedding program's, a test's)
            data.write(sys.stdin.read().encode("utf-8"))
        data.seek(0)
        sandbox.files.write(path, data, mode=0o600)
    quoted = shlex.quote(path)
    return f"exec 0<{quoted} && rm -f {quoted} || exit 125\n{command}"


def _writer(stream: TextIO) -> Callable[[str], None]:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


# -- logs -----------------------------------------------------------------------------------


def cmd_logs(cli: GlobalOptions, logs: LogsOptions) -> int:
    """``osb-sync logs ID [COMMAND_ID] [-f] [--tail N]``: a background command's output, or
    without COMMAND_ID the sandbox's own log (the server's diagnostics route)."""
    if cli.json and logs.follow:
        raise UsageError("--json prints one object when the log is read: give -f or --json")
    with cli.client() as client:
        # a sandbox's log outlives it on osb-sync serve: a gone id is asked for as it is
        logs = dataclasses.replace(logs, id=resolve_id(client, logs.id, missing_ok=True))
        if logs.command_id is None:
            return _sandbox_log(client, logs, cli.json)
        if logs.tail is not None:
            raise UsageError("--tail is for a sandbox's own log (logs ID, without COMMAND_ID)")
        command = client.connect(logs.id).commands.get(logs.command_id)
        if logs.follow:
            for text in command.iter_logs():
                sys.stdout.write(text)
                sys.stdout.flush()
        else:
            text, _ = command.logs()
            if cli.json:
                print(json.dumps({"id": logs.id, "command_id": logs.command_id, "output": text}))
            else:
                sys.stdout.write(text)
    return 0


def _sandbox_log(client: Client, logs: LogsOptions, as_json: bool = False) -> int:
    """The sandbox's log (its container's output), ``--tail`` lines; with ``-f`` polled every
    ``FOLLOW_INTERVAL`` seconds (the route does not stream) until the sandbox is gone."""
    diagnostics = client.diagnostics(logs.id)

    def window() -> list[str]:
        # The route's most lines each time, so each window starts where the last one did or
        # later (what is new follows their overlap); following, a partial line waits.
        lines = (diagnostics.logs(tail=LOG_WINDOW).content or "").splitlines(True)
        return [line for line in lines if line.endswith("\n")] if logs.follow else lines

    try:
        shown = window()
        if as_json:
            tail = shown[-logs.tail :] if logs.tail else shown
            print(json.dumps({"id": logs.id, "log": "".join(tail)}))
            return 0
        sys.stdout.writelines(shown[-logs.tail :] if logs.tail else shown)
        while logs.follow:
            sys.stdout.flush()
            time.sleep(FOLLOW_INTERVAL)
            try:
                now = window()
                sys.stdout.writelines(new_lines(shown, now))
                shown = now
                client.get_sandbox(logs.id)
            except NotFoundError as exc:
                if names_missing_thing(exc):
                    return 0  # the sandbox is gone: its log ended, as docker logs -f ends
                raise
    except NotSupportedError as exc:
        raise UsageError(
            "logs ID without COMMAND_ID reads the server's diagnostics route "
            "(GET /v1/sandboxes/ID/diagnostics/logs), which this server does not serve "
            f"(HTTP {exc.status_code}): it needs OpenSandbox server 1.1 or later, or "
            "osb-sync serve; a background command's output needs no such route: "
            "osb-sync logs ID COMMAND_ID"
        ) from None
    return 0
