"""Processes of a sandbox, as its execd starts them: environment, process groups, cleanup.

This runs inside the sandbox's container (`main.py`), so the paths it resolves and
the processes it starts are the container's. Every process is started in its own session (so
its process group id is its pid) and remembered by that id; closing kills each group with
SIGKILL. Whatever escapes that bookkeeping (setsid, double forks) dies with the container's PID
namespace when the server deletes the sandbox; without isolation (see `container.py`) it can
survive, which the server says in every status message.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

KILL_WAIT_TIMEOUT = 5.0
# sh: cap the address space (KiB, soft and hard) of what it then runs. Not set on execd itself:
# its threads' reserved stacks and arenas would not fit a small cap.
LIMIT_ADDRESS_SPACE = 'ulimit -v "$1" || exit 126; shift; exec "$@"'


def kill_group(pgid: int, sig: int) -> None:
    """Send `sig` to process group `pgid`, ignoring groups that are gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_exists(pgid: int) -> bool:
    """True while process group `pgid` has a member."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SandboxRuntime:
    """The working directory, environment and processes of one sandbox."""

    def __init__(
        self,
        home: Path,
        run_dir: Path,
        env: dict[str, str],
        address_space_limit: int | None = None,
        oom_control: Path | None = None,
        user: tuple[int, int] | None = None,
        python: str | None = None,
    ) -> None:
        self.dir = home
        # what runs code contexts and the terminal's helper: the image's python3 where the
        # sandbox runs an image (the image asked for runs the user's code), else execd's own
        self.python = python or sys.executable
        # (uid, gid) of the image's User: what the sandbox's processes run as unless a
        # request names its own (execd itself stays the namespace's root, for its state)
        self.user = user
        self.oom_control = oom_control  # the sandbox's memory.oom_control, bound in read-only
        self.address_space_limit = address_space_limit
        self.run_dir = run_dir
        self.env = env
        self._lock = threading.Lock()
        self._procs: dict[int, subprocess.Popen[Any]] = {}
        self._closed = False

    def oom_kills(self) -> int:
        """How many processes of the sandbox the OOM killer ended so far (0 if unknown)."""
        if self.oom_control is None:
            return 0
        try:
            for line in self.oom_control.read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
        return 0

    def resolve(self, path: str) -> Path:
        """A sandbox path: relative paths are inside the working directory."""
        return Path(path) if os.path.isabs(path) else self.dir / path

    def spawn(
        self,
        argv: Sequence[str],
        *,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        stdin: int | IO[Any] | None = subprocess.DEVNULL,
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = None,
        pass_fds: Sequence[int] = (),
        user: int | None = None,
        group: int | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `argv` in its own process group inside this sandbox (as the image's User
        unless `user`/`group` name others); OSError if it cannot."""
        extra_groups: list[int] | None = None
        if user is None and group is None and self.user is not None:
            (user, group), extra_groups = self.user, []  # no supplementary group of root's
        with self._lock:
            if self._closed:
                raise OSError("sandbox is being deleted")
            self._forget_finished()
            if self.address_space_limit:
                kib = str(self.address_space_limit // 1024)
                argv = ["/bin/sh", "-c", LIMIT_ADDRESS_SPACE, "sh", kib, *argv]
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd or self.dir,
                env={**self.env, **(env or {})},
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                pass_fds=pass_fds,
                start_new_session=True,
                user=user,
                group=group,
                extra_groups=extra_groups,
            )
            self._procs[proc.pid] = proc
        return proc

    def _forget_finished(self) -> None:
        # A group outlives its leader while any member lives (`cmd &` in bash), so an entry
        # is dropped only once the whole group is gone.
        for pgid, proc in list(self._procs.items()):
            if proc.poll() is not None and not group_exists(pgid):
                del self._procs[pgid]

    def close(self) -> None:
        """Kill every process group of the sandbox; idempotent."""
        with self._lock:
            self._closed = True
            procs = list(self._procs.values())
            self._procs.clear()
        for proc in procs:
            kill_group(proc.pid, signal.SIGKILL)
        for proc in procs:
            try:
                proc.wait(KILL_WAIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
