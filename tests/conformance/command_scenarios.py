"""Scenarios about shell commands: foreground, background and bash sessions."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from osb_sync import ExecutionStream

from .execds import Target
from .outcome import Outcome, command_outcome, digest, raised

TIMEOUT_BOUND = 10.0  # a 1 s command timeout must end the wait well within this


def exit_codes(t: Target) -> Outcome:
    commands = [
        "echo hi; echo err >&2; exit 3",
        "true",
        "echo; echo a; echo",
        "printf 'no newline'",
        "exit 255",
        "kill -TERM $$",
        "no-such-program-xyz",
    ]
    return {c: command_outcome(t.sandbox.commands.run(c)) for c in commands}


def command_output(t: Target) -> Outcome:
    """How output is cut into lines and decoded: long lines, CR LF, bad UTF-8, no stdin."""
    commands = {
        "long_line": "head -c 200000 /dev/zero | tr '\\0' x; echo",
        "many_lines": "seq 1 20000",
        "crlf": "printf 'a\\r\\nb\\r\\n'",
        "bad_utf8": "printf '\\xff\\xfe ok\\n'",
        "no_stdin": "cat; echo done",
    }
    outcome: Outcome = {}
    for name, command in commands.items():
        result = command_outcome(t.sandbox.commands.run(command, timeout=30))
        result["stdout"] = digest(result["stdout"].encode())
        outcome[name] = result
    return outcome


def env_and_cwd(t: Target) -> Outcome:
    folder = t.fresh_dir()
    t.sandbox.files.mkdir(folder)
    result = t.sandbox.commands.run(
        'pwd; echo "$FOO|$EMPTY|${UNSET-unset}"', cwd=folder, env={"FOO": "bar baz", "EMPTY": ""}
    )
    outcome = command_outcome(result)
    outcome["stdout"] = outcome["stdout"].replace(folder, "<dir>")
    outcome["missing_cwd"] = command_outcome_or_error(t, "pwd", folder + "/missing")
    return outcome


def command_outcome_or_error(t: Target, command: str, cwd: str) -> Outcome:
    try:
        return command_outcome(t.sandbox.commands.run(command, cwd=cwd))
    except Exception as exc:
        return {"raised": type(exc).__name__}


def timeout(t: Target) -> Outcome:
    started = time.monotonic()
    result = t.sandbox.commands.run("echo before; sleep 30; echo after", timeout=1)
    return {
        **command_outcome(result),
        "within_bound": time.monotonic() - started < TIMEOUT_BOUND,
    }


def background(t: Target) -> Outcome:
    sandbox = t.sandbox
    command = sandbox.commands.start("echo one; sleep 1; echo two >&2; exit 4")
    early = command.status()
    final = command.wait(timeout=20, poll_interval=0.1)
    text, cursor = command.logs()
    tail, _ = command.logs(cursor)
    return {
        "running_at_start": early.running,
        "running": final.running,
        "exit_code": final.exit_code,
        "times_set": (final.started_at is not None, final.finished_at is not None),
        "logs": text,
        "cursor_is_length": cursor == len(text.encode()),
        "tail_after_cursor": tail,
        "killed_status": _killed(t),
        "interrupt_unknown": raised(lambda: sandbox.commands.interrupt("no-such-command")),
    }


def _killed(t: Target) -> Outcome:
    command = t.sandbox.commands.start("sleep 30")
    command.kill()
    final = command.wait(timeout=20, poll_interval=0.1)
    return {"running": final.running, "exit_code": final.exit_code}


def bash_session(t: Target) -> Outcome:
    folder = t.fresh_dir()
    t.sandbox.files.mkdir(folder + "/sub")
    with t.sandbox.commands.session(cwd=folder) as session:
        runs = {
            "cd": session.run("cd sub && export KEPT=yes"),
            "state": session.run('basename "$PWD"; echo "$KEPT"'),
            "stderr": session.run("echo to-err >&2; echo to-out"),
            "false": session.run("false"),
            "exit_code": session.run("(exit 7)"),
            "after": session.run("echo still"),
            "timeout": session.run("echo before; sleep 30", timeout=1),
            "after_timeout": session.run("echo alive"),
        }
        outcome: Outcome = {k: command_outcome(r) for k, r in runs.items()}
    outcome["close_again"] = raised(session.close)
    return outcome


def early_exit(t: Target) -> Outcome:
    """Leaving a command's stream early stops the command: its marker file never appears."""
    marker = t.fresh_dir() + ".marker"
    command = f"echo start; sleep 1; touch {marker}; echo end"
    seen = None
    with t.sandbox.commands.stream(command) as stream:
        for event in stream:
            if event.type == "stdout" and event.text:
                # June's texts lack the line end, 1.1.1's keep it (#2033): compare the line
                seen = event.text.rstrip("\r\n")
                break
    time.sleep(2.5)  # the marker would be written 1 s after start: checking absence needs a wait
    return {"first_stdout": seen, "marker_written": t.sandbox.files.exists(marker)}


def heartbeat(t: Target) -> Outcome:
    """Streams open with init then a ping, and ping every 3 s (4.5 s of silence: 2 pings).
    The code and the command run at the same time, to keep the scenario short."""
    streams = {
        "code": lambda: t.sandbox.stream_code("import time\ntime.sleep(4.5)", timeout=60),
        "command": lambda: t.sandbox.commands.stream("sleep 4.5", timeout=60),
    }
    with ThreadPoolExecutor(len(streams)) as pool:
        kinds = dict(zip(streams, pool.map(event_types, streams.values()), strict=True))
    return {name: {"first_two": k[:2], "pings": k.count("ping")} for name, k in kinds.items()}


def event_types(start: Callable[[], ExecutionStream[Any]]) -> list[str]:
    with start() as events:
        return [event.type for event in events]
