"""The client where the local server cannot run: no fork, no Unix-only modules (Windows).

``import osb_sync`` is checked in a fresh interpreter with what Windows lacks taken away
before the import; the process hooks are checked to go through ``osb_sync._hooks``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from osb_sync import _hooks

PACKAGE = Path(__file__).resolve().parents[2] / "osb_sync"

# Modules Windows does not have (their stdlib users guard the import), and names it lacks.
MISSING_MODULES = ("fcntl", "resource", "pwd", "grp", "termios", "tty", "pty")
MISSING_NAMES = {
    "os": (
        "register_at_fork", "fork", "forkpty", "killpg", "getpgid", "setsid", "setpgid",
        "getuid", "geteuid", "getgid", "getegid", "uname", "sched_getaffinity", "O_NOFOLLOW",
        "WNOHANG", "getloadavg", "sysconf", "mkfifo", "chown", "lchown",
    ),
    "signal": (
        "SIGKILL", "SIGHUP", "SIGQUIT", "SIGPIPE", "SIGALRM", "SIGCHLD", "SIGUSR1", "SIGUSR2",
        "SIGSTOP", "SIGCONT", "pthread_kill", "pthread_sigmask", "setitimer", "alarm",
        "siginterrupt", "sigwait",
    ),
    "socket": ("AF_UNIX", "SO_REUSEPORT"),
}  # fmt: skip

SCRIPT = textwrap.dedent(
    """
    import importlib, io, json, sys, threading
    for name in MISSING_MODULES:
        sys.modules[name] = None
    for module, names in MISSING_NAMES.items():
        module = importlib.import_module(module)
        for name in names:
            if hasattr(module, name):
                delattr(module, name)

    import requests
    import osb_sync
    from osb_sync._execution import ExecutionStream
    from osb_sync._watchdog import WATCHDOG
    from osb_sync import _cli

    client = osb_sync.Client("http://127.0.0.1:9/", api_key="k")
    body = b"".join(
        json.dumps(event).encode() + b"\\n\\n"
        for event in [
            {"type": "init", "text": "ctx-1"},
            {"type": "stdout", "text": "hi\\n"},
            {"type": "result", "results": {"text": "4"}},
            {"type": "execution_complete", "execution_time": 3},
        ]
    )
    parsed = osb_sync.parse_execution(body.split(b"\\n\\n"))
    response = requests.Response()
    response.status_code, response.raw = 200, io.BytesIO(body)
    with ExecutionStream(response, max_output_bytes=1 << 20, timeout=30) as stream:
        streamed = stream.result()
    fired = threading.Event()
    WATCHDOG.schedule(0.01, fired.set)
    print(json.dumps({
        "api_base": client.api_base,
        "parsed": [parsed.results, parsed.stdout],
        "streamed": [streamed.results, streamed.stdout, streamed.execution_id],
        "pool": osb_sync.SandboxPool.__name__,
        "cli": _cli.build_parser().prog,
        "watchdog": fired.wait(10),
    }))
    client.close()
    """
)


def test_the_client_imports_and_works_without_what_windows_lacks() -> None:
    prelude = f"MISSING_MODULES = {MISSING_MODULES!r}\nMISSING_NAMES = {MISSING_NAMES!r}\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PACKAGE.parent,
        env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "api_base": "http://127.0.0.1:9",
        "parsed": [[{"text": "4"}], "hi\n"],
        "streamed": [[{"text": "4"}], "hi\n", "ctx-1"],
        "pool": "SandboxPool",
        "cli": "osb-sync",
        "watchdog": True,
    }


def test_a_fork_hook_is_skipped_where_there_is_no_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "register_at_fork", raising=False)
    _hooks.in_forked_child(lambda: None)  # nothing to register with, and no error


def test_a_fork_hook_is_registered_for_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[dict[str, object]] = []
    monkeypatch.setattr(os, "register_at_fork", lambda **hooks: registered.append(hooks))

    def hook() -> None:
        return None

    _hooks.in_forked_child(hook)
    assert registered == [{"after_in_child": hook}]


def test_the_client_sets_process_hooks_only_through_the_helper() -> None:
    direct = []
    for path in sorted(PACKAGE.glob("*.py")):  # the client; osb_sync.local is the server's
        if path.name == "_hooks.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("register_at_fork", "register"):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("os", "atexit"):
                    direct.append(f"{path.name}:{node.lineno} {owner.id}.{node.attr}")
    assert direct == []
