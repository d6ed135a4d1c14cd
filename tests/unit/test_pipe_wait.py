"""`spawn.await_pipe_read`: where a server that is not root waits for bwrap's child to sleep on
its `--block-fd` before it mounts the sandbox's volumes (`volumes.mount_inside`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from osb_sync.local.host import spawn

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/wchan")

READS = "import os, sys; os.read(int(sys.argv[1]), 1)"


def _waiting(code: str, *fds: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, fds)], pass_fds=fds)


def test_it_returns_once_the_process_sleeps_reading_a_pipe() -> None:
    read, write = os.pipe()
    child = _waiting(READS, read)
    pid_fd = spawn.pidfd(child.pid)
    try:
        spawn.await_pipe_read(pid_fd, child.pid, time.monotonic() + 30)
        assert child.poll() is None  # still waiting: nothing was written
    finally:
        os.write(write, b"1")
        assert child.wait(timeout=30) == 0
        for fd in (read, write, pid_fd):
            os.close(fd)


def test_a_process_that_reads_no_pipe_times_out_and_one_that_ended_is_named() -> None:
    child = _waiting("import time; time.sleep(60)")
    pid_fd = spawn.pidfd(child.pid)
    try:
        with pytest.raises(TimeoutError, match="did not wait on its --block-fd"):
            spawn.await_pipe_read(pid_fd, child.pid, time.monotonic() + 0.5)
        child.kill()
        child.wait(timeout=30)
        with pytest.raises(ProcessLookupError):
            spawn.await_pipe_read(pid_fd, child.pid, time.monotonic() + 30)
    finally:
        child.kill()
        child.wait(timeout=30)
        os.close(pid_fd)
