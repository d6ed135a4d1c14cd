"""slirp4netns: outbound network for a running container's network namespace.

It attaches to the namespace of the container's init (a spare's too, at its claim), with the
host's loopback out of reach, and exits once the pipe whose write end the caller keeps closes.
"""

from __future__ import annotations

import os
import subprocess

from .spawn import read_until


def start_slirp(slirp: str, init_pid: int, deadline: float) -> tuple[subprocess.Popen[bytes], int]:
    """Start slirp4netns for the namespace of `init_pid` and wait until it configured it.

    Args:
        slirp: the slirp4netns executable.
        init_pid: the host pid of the container's init.
        deadline: time.monotonic() by which it must be ready.

    Returns:
        The process and the write end of its exit pipe (close it to stop slirp4netns).

    Raises:
        RuntimeError: it did not configure the network in time.
        OSError: it could not start.
    """
    ready_r, ready_w = os.pipe()
    # slirp4netns exits once this pipe's write end closes: on delete, or when the server dies.
    exit_r, exit_w = os.pipe()
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = subprocess.Popen(
            [
                slirp,
                "--configure",
                "--mtu=65520",
                "--disable-host-loopback",
                "--ready-fd",
                str(ready_w),
                "--exit-fd",
                str(exit_r),
                str(init_pid),
                "tap0",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(ready_w, exit_r),
            start_new_session=True,
        )
        os.close(ready_w)
        ready_w = -1
        if read_until(ready_r, b"1", deadline) != b"1":
            raise RuntimeError("slirp4netns did not configure the sandbox's network")
        return proc, exit_w
    except BaseException:
        os.close(exit_w)
        if proc is not None:
            proc.kill()
            proc.wait()
        raise
    finally:
        os.close(ready_r)
        os.close(exit_r)
        if ready_w >= 0:
            os.close(ready_w)
