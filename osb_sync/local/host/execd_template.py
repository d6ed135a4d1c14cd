"""The server's side of the execd template (`execd/template.py`): one per process, started at a
container's first need of it and stopped when no container holds it.

A container that can use it (`usable`: with the host's own root view and our execd, on a root
server or one that is not, whose template joins the namespaces its user owns) starts bwrap
with `PLACEHOLDER` (`placeholder`) as its command instead of execd's `main.py`. Once the
placeholder says `up` (bwrap has made every namespace and mount, loaded the seccomp filter,
dropped to the sandbox's root), the container asks the template for its execd (`Template.fork`),
which it then drives exactly as one bwrap started: the start and claim lines on its standard
input, `ready` and `serving` on the ready pipe, the relay socket. The template writes the
execd's exit status to the placeholder's standard input when it ends, and the placeholder exits
with it: bwrap's exit is the execd's, as before. A template that died reports nothing more:
the container holds a pidfd of its execd (`Forked`), and an execd that ended after its
template did reads `Failed`, its status unknown (`liveness.py`). Deleting the sandbox kills
the namespace's init, and the execd with it.

An image's sandbox uses it too where the image has the placeholder's shells
(`rootfs.ImageView.template`): its execd is then this interpreter in the image's namespaces,
which imports nothing more from files once there (`execd/template.py`'s `seal_imports`), and
runs the sandbox's code on the image's python3 (`protocol.Start.python`).

Where it cannot be used (an image without /bin/sh and /bin/bash, whose execd runs on its
python3 as bwrap starts it; an execd binary; a server that is not root on a machine without
bash, `placeholder`; a server whose sandboxes' root is its own user, who owns its interpreter,
`usable`; a kernel before 5.8, without setns(2) on a pidfd; a machine without a seccomp table
for bwrap), containers start as before.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..protocol import Fork, ForkAnswer, TemplateSetup
from . import bwrap, package
from .spawn import SPAWNER, exited, log_tail

# Run by path, never imported here: execd/ is the sandbox side of the security line.
TEMPLATE_SCRIPT = str(Path(__file__).parents[1] / "execd" / "template.py")
# The template's command line names no host path (a sandbox reads it: its execds share it).
BOOTSTRAP = "import runpy, sys; runpy.run_path(sys.stdin.readline()[:-1], run_name='__main__')"
# bwrap's child in a container whose execd the template forks: PID 2 of its namespace.
PLACEHOLDER_SCRIPT = 'echo up; exec >/dev/null; read -r code; exit "${code:-1}"'
PLACEHOLDER = ["/bin/sh", "-c", PLACEHOLDER_SCRIPT]
# The placeholder where bwrap joined a user namespace by descriptor (`placeholder`).
BASH = "/bin/bash"
# linux/capability.h
CAP_NUMBERS = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_FOWNER": 3,
    "CAP_FSETID": 4,
    "CAP_KILL": 5,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
    "CAP_SETPCAP": 8,
    "CAP_NET_BIND_SERVICE": 10,
    "CAP_NET_RAW": 13,
    "CAP_SYS_CHROOT": 18,
    "CAP_MKNOD": 27,
    "CAP_AUDIT_WRITE": 29,
    "CAP_SETFCAP": 31,
}
ANSWER_TIMEOUT = 30.0
MESSAGE_SIZE = 1 << 16


def kernel_joins_by_pidfd(release: str | None = None) -> bool:
    """True on Linux 5.8 or later, whose setns(2) takes a pidfd and several namespaces."""
    if not sys.platform.startswith("linux"):
        return False
    numbers = (release or platform.release()).split("-")[0].split(".")
    try:
        return (int(numbers[0]), int(numbers[1])) >= (5, 8)
    except (ValueError, IndexError):
        return False


def usable(support: bwrap.Support, binary: object) -> bool:
    """Whether a container whose root view allows it (`rootview.RootView.template`) with this
    execd `binary` (None: ours) gets its execd from the template.

    Not where root inside is the server's user (`identity.own_ids`) who owns the interpreter
    (a venv made with --copies, pyenv, conda): a forked execd's /proc/self/exe is the
    template's, that file on the host's own mount, which execd's file routes (a chmod of
    /proc/self/exe, or of a link to it) would reach as its owner; a bwrap-started execd's is
    the sandbox's read-only bind of it.
    """
    return (
        support.bwrap is not None
        and support.ids is not None
        and (support.ids.by_root or os.access(BASH, os.X_OK))
        and not (support.ids.own and _owns_interpreter())
        and support.seccomp is not None
        and binary is None
        and hasattr(os, "pidfd_open")
        and kernel_joins_by_pidfd()
    )


def _owns_interpreter() -> bool:
    """Whether this process's user owns the interpreter file it runs (True where unknown)."""
    try:
        return os.stat(sys.executable).st_uid == os.geteuid()
    except OSError:
        return True


def placeholder(userns: int = -1) -> list[str]:
    """bwrap's command in a container whose execd the template forks (`PLACEHOLDER`).

    `userns` is the descriptor of the user namespace bwrap joins (`--userns`, a server that is
    not root), which bwrap leaves open in what it starts: bash closes it first (an execd
    bwrap starts closes it itself, `execd/main.py`), as dash, naming no descriptor past 9,
    cannot.
    """
    if userns < 0:
        return list(PLACEHOLDER)
    return [BASH, "-c", f"exec {userns}<&-; {PLACEHOLDER_SCRIPT}"]


def capability_mask(names: Sequence[str] = bwrap.CAPABILITIES) -> int:
    """The capability set of `names` as a bit mask (bit N: capability N)."""
    mask = 0
    for name in names:
        mask |= 1 << CAP_NUMBERS[name]
    return mask


@dataclass(frozen=True)
class Forked:
    """An execd the template forked: its host pid, a pidfd of it (the caller's to close), and
    the template process that reaps it and reports its exit to the placeholder."""

    pid: int
    pidfd: int
    template: subprocess.Popen[bytes]

    def lost(self) -> bool:
        """Whether the execd has ended after its template did: nobody reported its exit."""
        return self.template.poll() is not None and exited(self.pidfd)


class Template:
    """The template process: started on demand, shared by the containers that hold it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._log = -1  # the template's standard error, a memfd (read back on failure)

    def hold(self) -> None:
        """Count one more container that uses the template (it starts at the first fork)."""
        with self._lock:
            self._holders += 1

    def release(self) -> None:
        """Count one container fewer; the last one's release stops the template."""
        with self._lock:
            self._holders -= 1
            if self._holders <= 0:
                self._holders = 0
                self._stop()

    def fork(
        self,
        init_pid: int,
        fds: Sequence[int],
        seccomp: bytes | None,
        groups: Sequence[str] = (),
        home: str | None = None,
    ) -> Forked:
        """Fork an execd into the namespaces of `init_pid` (see `Forked`).

        Args:
            init_pid: the container's init (bwrap's child).
            fds: init's pidfd, then execd's standard input (read end), its standard error,
                the relay socket, the ready pipe (write end) and the exit pipe (write end).
            seccomp: the filter program bwrap loaded (the same for every container).
            groups: the `cgroup.procs` files of the sandbox's groups, where the execd is born.
            home: its working directory, in the container (None: the sandbox's home).

        Raises:
            RuntimeError: the template refused (why), or died twice.
        """
        request = Fork(init_pid, tuple(groups), home).encode()
        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._proc is None or self._proc.poll() is not None:
                        self._start(seccomp)
                    assert self._socket is not None
                    socket.send_fds(self._socket, [request], list(fds))
                    answer, given, _, _ = socket.recv_fds(self._socket, MESSAGE_SIZE, 1)
                    if not answer:
                        raise ConnectionResetError("the execd template exited")
                except OSError as exc:
                    said = self._log_tail()
                    self._stop()
                    if attempt == 2:
                        raise RuntimeError(
                            f"the sandbox's execd did not start: the execd template failed"
                            f" ({exc}): {said}"
                        ) from None
                    continue
                try:
                    reply = ForkAnswer.decode(answer)
                except ValueError as exc:
                    reply = ForkAnswer(error=str(exc))
                if reply.pid is None or len(given) != 1:
                    for fd in given:
                        os.close(fd)
                    raise RuntimeError(
                        f"the sandbox's execd did not start: the execd template refused: "
                        f"{reply.error}"
                    )
                assert self._proc is not None
                return Forked(reply.pid, given[0], self._proc)
        raise AssertionError("unreachable")

    def _start(self, seccomp: bytes | None) -> None:
        self._stop()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log = os.memfd_create("execd-template.log", 0)
        try:
            self._proc = SPAWNER.run(
                lambda: subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", BOOTSTRAP, str(theirs.fileno())],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=self._log,
                    pass_fds=(theirs.fileno(),),
                    cwd="/",
                    env={"PATH": bwrap.SANDBOX_PATH, "HOME": bwrap.SANDBOX_HOME},
                )
            )
            assert self._proc.stdin is not None
            with self._proc.stdin:
                self._proc.stdin.write(package.pinned(TEMPLATE_SCRIPT).encode() + b"\n")
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        mine.settimeout(ANSWER_TIMEOUT)
        self._socket = mine
        setup = TemplateSetup(capability_mask(), seccomp, bwrap.SANDBOX_HOME, bwrap.PACKAGE_VIEW)
        mine.send(setup.encode())

    def _log_tail(self, size: int = 2000) -> str:
        """The end of the template's standard error (its traceback, if it failed)."""
        if self._log < 0:
            return ""
        if self._proc is not None:
            try:
                self._proc.wait(1)  # it may be writing its traceback still
            except subprocess.TimeoutExpired:
                pass
        return log_tail(self._log, size).strip()

    def _stop(self) -> None:
        if self._socket is not None:
            self._socket.close()  # EOF: the template exits
            self._socket = None
        if self._proc is not None:
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log >= 0:
            os.close(self._log)
            self._log = -1


TEMPLATE = Template()
