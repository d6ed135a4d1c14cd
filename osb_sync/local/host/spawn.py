"""Host-side process helpers of the containers: the spawner thread, pipes read with a deadline,
and the processes of a PID namespace or of a process tree.
"""

from __future__ import annotations

import fcntl
import functools
import os
import queue
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

# A root server starts bwrap as the range's root through setpriv(1) where there is one, not
# Popen's user=/group=: those make CPython fork() the whole server instead of vfork(), which
# copies its page tables (2 -> 17 ms from 20 to 300 MiB of resident memory, issue 50).
SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin")


@functools.cache
def _setpriv() -> str | None:
    """`SETPRIV` where it takes util-linux's options (busybox's applet does not), else None:
    Popen's user= then (tried once)."""
    if SETPRIV is None or os.geteuid() != 0:
        return None
    probe = [SETPRIV, "--reuid=0", "--regid=0", "--clear-groups", "--", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return SETPRIV if done.returncode == 0 else None


def as_ids(argv: list[str], uid: int, gid: int) -> list[str] | None:
    """`argv` run as `uid`:`gid` with no supplementary group through setpriv(1) (see
    `SETPRIV`), or None where there is none that takes util-linux's options."""
    setpriv = _setpriv()
    if setpriv is None:
        return None
    return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]


class _Spawner:
    """One thread, as long-lived as the process, that starts every container.

    bwrap's `--die-with-parent` (PR_SET_PDEATHSIG) fires when the *thread* that forked it
    ends, and a request's handler thread ends with its connection.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, job: Callable[[], T]) -> T:
        """Run `job` in the spawner thread and return its result (or raise its error)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="osb-local-spawner", daemon=True
                )
                self._thread.start()
        future: Future[T] = Future()
        self._jobs.put((job, future))
        return future.result()

    def _serve(self) -> None:
        while True:
            job, future = self._jobs.get()
            try:
                future.set_result(job())
            except BaseException as exc:  # noqa: BLE001 (handed to the caller)
                future.set_exception(exc)


SPAWNER = _Spawner()


class HeldThread:
    """A daemon thread that runs while a server holds it (`hold` / `release`, counted).

    The first `hold` calls `start()`, which prepares what the thread needs (its error: not
    held) and returns the thread's body; the body runs with the read end of a stop pipe, which
    reads EOF once the last `release` closed the write end, and returns then; that release
    waits for it.
    """

    def __init__(self, name: str, start: Callable[[], Callable[[int], None]]) -> None:
        self._name, self._start = name, start
        self._lock = threading.Lock()
        self._holders = 0
        self._stop = -1  # the write end
        self._thread: threading.Thread | None = None

    def hold(self) -> None:
        """Count one more holder; the first starts the thread."""
        with self._lock:
            if self._holders == 0:
                body = self._start()
                stop, self._stop = os.pipe()
                self._thread = threading.Thread(
                    target=_until_stopped, args=(body, stop), name=self._name, daemon=True
                )
                self._thread.start()
            self._holders += 1

    def release(self) -> None:
        """Count one holder fewer; the last one's release stops the thread."""
        with self._lock:
            self._holders -= 1
            if self._holders > 0:
                return
            self._holders = 0
            thread, stop, self._thread, self._stop = self._thread, self._stop, None, -1
        if stop >= 0:
            os.close(stop)
        if thread is not None:
            thread.join()


def _until_stopped(body: Callable[[int], None], stop: int) -> None:
    try:
        body(stop)
    finally:
        os.close(stop)


def read_until(fd: int, end: bytes, deadline: float, limit: int = 4096) -> bytes:
    """Read `fd` until `end` is seen, EOF, the deadline, or `limit` bytes; what was read.

    Waits with a selector (epoll or poll), never `select()`: a server holding a few hundred
    sandboxes has descriptors above FD_SETSIZE (1024), which `select()` cannot watch. What
    writes there may be a sandbox's (an image's shell, the placeholder), hence the limit.
    """
    data = b""
    with selectors.DefaultSelector() as waiter:
        waiter.register(fd, selectors.EVENT_READ)
        while end not in data and len(data) < limit:
            left = deadline - time.monotonic()
            if left <= 0 or not waiter.select(left):
                break
            piece = os.read(fd, 4096)
            if not piece:
                break
            data += piece
    return data


def log_tail(fd: int, limit: int) -> str:
    """A log's text (a file or memfd `fd`) from the first whole line of its last `limit` bytes."""
    try:
        start = max(0, os.fstat(fd).st_size - limit)
        raw = os.pread(fd, limit, start)
    except OSError:
        start, raw = 0, b""
    if start and b"\n" in raw:
        raw = raw[raw.index(b"\n") + 1 :]
    return raw.decode(errors="replace")


def pids_in_namespace(init_pid: int) -> list[int]:
    """Every process in the PID namespace whose init is `init_pid` (init first)."""
    try:
        wanted = os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return []
    found = [init_pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != init_pid:
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == wanted:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def descendants(root_pid: int) -> list[int]:
    """`root_pid` and every process below it, by parent pid (what a plain subprocess made)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    ppid = int(stat.read().rpartition(b")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def pidfd(pid: int) -> int:
    """A descriptor naming process `pid` for good (see pidfd_open(2)), or -1 where unsupported."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


def exited(pid_fd: int) -> bool:
    """Whether the process of pidfd `pid_fd` has ended (a pidfd reads ready then)."""
    with selectors.DefaultSelector() as waiter:
        waiter.register(pid_fd, selectors.EVENT_READ)
        return bool(waiter.select(0))


def namespace(pid_fd: int, pid: int, kind: str) -> int:
    """A descriptor of the `kind` namespace ("net") of process `pid`, which pidfd `pid_fd`
    names: it stays that namespace's, whatever process later has the pid.

    Raises:
        ProcessLookupError: the process has ended (the pid may name another already).
    """
    fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
    if pid_fd >= 0 and exited(pid_fd):  # still running after the open: it was its
        os.close(fd)
        raise ProcessLookupError(f"process {pid} has ended")
    return fd


def await_pipe_read(pid_fd: int, pid: int, deadline: float) -> None:
    """Wait until process `pid` (which pidfd `pid_fd` names) sleeps reading a pipe, as its
    `/proc/PID/wchan` says (`pipe_read`, `anon_pipe_read` since Linux 6.14; "0" until it is
    this server's to inspect): where bwrap's child waits on its `--block-fd`, its mount
    namespace made, its old root gone, nothing run (it reads no other pipe before).

    Raises:
        ProcessLookupError: the process has ended.
        TimeoutError: it does not by `deadline` (a `time.monotonic()` instant).
    """
    while True:
        try:
            with open(f"/proc/{pid}/wchan") as file:
                where = file.read().strip()
        except OSError:
            where = ""
        if pid_fd >= 0 and exited(pid_fd):
            raise ProcessLookupError(f"process {pid} has ended")
        if where.endswith("pipe_read"):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"bwrap's child {pid} did not wait on its --block-fd ({where!r})")
        time.sleep(0.002)


NS_GET_USERNS = 0xB701  # linux/nsfs.h: _IO(0xb7, 0x1)


def owning_user_namespace(ns_fd: int) -> int:
    """A new descriptor of the user namespace that owns namespace `ns_fd`."""
    return fcntl.ioctl(ns_fd, NS_GET_USERNS)


def signal_pids(pids: list[int], sig: int) -> None:
    """Send `sig` to each of `pids`, ignoring those that are gone."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_init(init_fd: int, init_pid: int, pid_is_init: bool) -> None:
    """SIGKILL a container's init through its pidfd `init_fd` (closed), or by pid.

    Args:
        init_fd: a pidfd of init, or -1 (then its pid, if `pid_is_init`).
        init_pid: init's host pid.
        pid_is_init: the pid still names init (its parent has not reaped it).
    """
    if init_fd >= 0:
        try:
            signal.pidfd_send_signal(init_fd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(init_fd)
    elif pid_is_init:
        signal_pids([init_pid], signal.SIGKILL)
