"""slirp4netns: outbound network for a running container's network namespace.

It attaches to the container's network namespace by the descriptor the container holds (a
spare's too, at its claim), with the host's loopback and its resolver out of reach, and exits
once the pipe whose write end the caller keeps closes.
"""

from __future__ import annotations

import os
import subprocess

from .spawn import owning_user_namespace, read_until


def start_slirp(
    slirp: str, netns: int, join_user: bool, deadline: float
) -> tuple[subprocess.Popen[bytes], int]:
    """Start slirp4netns for the network namespace `netns` and wait until it configured it.

    Args:
        slirp: the slirp4netns executable.
        netns: a descriptor of the container's network namespace (never its init's pid, which
            a later process may have).
        join_user: enter the user namespace that owns it too (a server that is not root).
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
    user = -1
    proc: subprocess.Popen[bytes] | None = None
    try:
        if join_user:
            user = owning_user_namespace(netns)
        proc = subprocess.Popen(
            [
                slirp,
                "--configure",
                "--mtu=65520",
                "--disable-host-loopback",
                # 10.0.2.3 would forward to the host's resolver: often on its loopback
                # (127.0.0.53), always the host. A sandbox asks the servers its resolv.conf
                # names, through the firewall, as it reaches any other address.
                "--disable-dns",
                "--ready-fd",
                str(ready_w),
                "--exit-fd",
                str(exit_r),
                "--netns-type=path",
                *([f"--userns-path=/proc/self/fd/{user}"] if user >= 0 else []),
                f"/proc/self/fd/{netns}",
                "tap0",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(ready_w, exit_r, netns, *([user] if user >= 0 else [])),
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
        if user >= 0:
            os.close(user)
        if ready_w >= 0:
            os.close(ready_w)
