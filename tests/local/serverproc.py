"""A LocalServer in a process of its own, for tests that kill it or change its limits."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = """
import json, logging, sys
from osb_sync.local import LocalServer
logging.basicConfig(level=logging.INFO, format="%(message)s")
server = LocalServer(**json.loads(sys.argv[1])).start()
print(server.port, server.root_dir, flush=True)
sys.stdin.read()
server.stop()
"""
CHECKOUT = str(Path(__file__).resolve().parents[2])  # the directory of `osb_sync/`


class ServerProcess:
    """`LocalServer(**options)` in a child process; `nofile` caps its RLIMIT_NOFILE (soft, hard).

    `user` runs it as that user (`runuser`, root only) with `python`, `path` (this checkout by
    default) first on its path, as a user's own interpreter would, and `env` added to its
    environment; a `path` of its own is the package the server imports also without `user`.
    `wrap` is a command that runs the rest, given as its arguments.
    """

    def __init__(
        self,
        nofile: tuple[int, int] | None = None,
        log: Path | None = None,
        user: str | None = None,
        python: str = sys.executable,
        path: str = CHECKOUT,
        env: dict[str, str] | None = None,
        wrap: tuple[str, ...] = (),
        **options: Any,
    ) -> None:
        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        own_path = user is not None or path != CHECKOUT
        self._log = open(log, "ab") if log is not None else subprocess.DEVNULL
        command = [python, "-c", SCRIPT, json.dumps(options)]
        if user is not None:
            command = [shutil.which("runuser") or "runuser", "-u", user, "--", *command]
        command = [*wrap, *command]  # a command that runs its arguments (as root)
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            preexec_fn=limit,
            cwd="/" if own_path else None,  # not this checkout (sys.path[0] of `-c`)
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": path, **(env or {})} if own_path else None,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().split()
        assert line, "the server process did not start"
        self.port, self.root = int(line[0]), Path(line[1])
        self.api_base = f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int:
        """The server's pid."""
        return self.proc.pid

    def stop(self, timeout: float = 60.0) -> int:
        """A clean stop (stdin closed); its exit code."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self._done(self.proc.wait(timeout))

    def kill(self) -> None:
        """SIGKILL the server (by its own pid) and reap it."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self._done(self.proc.wait(30))

    def _done(self, code: int) -> int:
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        if self._log is not subprocess.DEVNULL:
            self._log.close()  # type: ignore[union-attr]
        return code


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.add(child)
        todo.extend(children.get(child, []))
    return found


def options_json(**options: Any) -> str:
    """The options as the child reads them (for messages)."""
    return json.dumps(options)
