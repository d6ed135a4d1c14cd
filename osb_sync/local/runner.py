"""Processes of a local sandbox: its directory, environment, process groups and network namespace.

Every process is started in its own session (so its process group id is its pid) and remembered
by that id; deleting, expiring or stopping kills each group with SIGKILL. A process that calls
setsid() itself leaves its group and escapes this bookkeeping: this is a development server, not
a container runtime.

Network isolation (a deny-all `networkPolicy`) uses one Linux network namespace per sandbox. An
agent process (`_nsagent.py`) is started in a fresh namespace with `unshare`; it brings loopback
up, listens on the in-namespace JUPYTER_PORT, and relays connections from a Unix socket to ports
inside the namespace (Unix sockets live in the file system, so the server reaches them from the
host namespace). Every other process of the sandbox joins the agent's namespace with `nsenter`.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

AGENT_SCRIPT = str(Path(__file__).with_name("_nsagent.py"))
JUPYTER_PORT_IN_NETNS = 44771
AGENT_START_TIMEOUT = 10.0
KILL_WAIT_TIMEOUT = 5.0
BASE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "TZ", "SYSTEMROOT")


class NetnsMode:
    """How to create a network namespace (`unshare` argv) and join one (`nsenter` argv)."""

    def __init__(self, user_namespace: bool) -> None:
        self.user_namespace = user_namespace

    def unshare_argv(self) -> list[str]:
        """The command prefix that runs a program in a new network namespace."""
        return ["unshare", "-rn", "--"] if self.user_namespace else ["unshare", "--net", "--"]

    def nsenter_argv(self, pid: int) -> list[str]:
        """The command prefix that runs a program in the namespace of process `pid`."""
        flags = ["-U", "-n", "--preserve-credentials"] if self.user_namespace else ["-n"]
        return ["nsenter", "-t", str(pid), *flags, "--"]


@functools.cache
def probe_netns() -> NetnsMode | None:
    """Find a way to run processes in a private network namespace here, or None.

    Runs the whole path (agent in a new namespace, a process joining it), because containers
    and unprivileged users fail at different steps; once per process, the answer is cached.
    """
    if not sys.platform.startswith("linux") or not shutil.which("unshare"):
        return None
    if not shutil.which("nsenter"):
        return None
    candidates = [NetnsMode(False), NetnsMode(True)] if os.geteuid() == 0 else [NetnsMode(True)]
    for mode in candidates:
        with tempfile.TemporaryDirectory(prefix="osb-probe-") as tmp:
            try:
                agent = NetnsAgent.start(mode, Path(tmp), os.environ.copy())
            except (OSError, RuntimeError):
                continue
            try:
                argv = [*mode.nsenter_argv(agent.pid), sys.executable, "-c", "pass"]
                done = subprocess.run(argv, capture_output=True, timeout=AGENT_START_TIMEOUT)
                if done.returncode == 0:
                    return mode
            except (OSError, subprocess.SubprocessError):
                pass
            finally:
                agent.stop()
    return None


class NetnsAgent:
    """The process that owns a sandbox's network namespace (see the module docstring)."""

    def __init__(self, proc: subprocess.Popen[bytes], socket_path: Path) -> None:
        self._proc = proc
        self.pid = proc.pid
        self.socket_path = socket_path
        # Connecting through an open descriptor of the directory keeps the path short, however
        # long the temporary directory's name (a socket path is limited to about 107 bytes).
        self._dir_fd = os.open(socket_path.parent, os.O_RDONLY | os.O_DIRECTORY)
        self._connect_path = f"/proc/self/fd/{self._dir_fd}/{socket_path.name}"

    @classmethod
    def start(cls, mode: NetnsMode, run_dir: Path, env: dict[str, str]) -> NetnsAgent:
        """Start an agent in a new namespace; RuntimeError when it does not report ready."""
        socket_path = run_dir / "agent.sock"
        argv = [
            *mode.unshare_argv(),
            sys.executable,
            "-u",
            AGENT_SCRIPT,
            str(socket_path),
            str(JUPYTER_PORT_IN_NETNS),
        ]
        # stdin stays open: the agent exits when the server goes away and it reads EOF.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        agent = cls(proc, socket_path)
        assert proc.stdout is not None
        timer = threading.Timer(AGENT_START_TIMEOUT, proc.kill)
        timer.start()
        try:
            line = proc.stdout.readline()
        finally:
            timer.cancel()
        if line.strip() != b"ready":
            agent.stop()
            raise RuntimeError(f"network namespace agent did not start: {line!r}")
        return agent

    def connect(self, port: int, timeout: float) -> socket.socket:
        """A socket connected to 127.0.0.1:`port` inside the namespace."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(self._connect_path)
            sock.sendall(b"%d\n" % port)
            answer = b""
            while not answer.endswith(b"\n"):
                byte = sock.recv(1)
                if not byte:
                    break
                answer += byte
            if not answer.startswith(b"ok"):
                raise ConnectionRefusedError(answer.decode(errors="replace").strip())
            sock.settimeout(None)
            return sock
        except BaseException:
            sock.close()
            raise

    def stop(self) -> None:
        """Kill the agent (the namespace disappears with its last process)."""
        kill_group(self.pid, signal.SIGKILL)
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()
        self._proc.wait()


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


class PortSink:
    """A loopback listener that accepts and drops connections: the sandboxes' JUPYTER_PORT.

    The official code interpreter probes `/dev/tcp/127.0.0.1/$JUPYTER_PORT` before it runs
    anything, so the port has to accept connections; nothing is ever served on it.
    """

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, name="osb-local-jupyter-port", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        """Stop listening."""
        self._sock.close()


class SandboxRuntime:
    """The directory, environment and processes of one sandbox."""

    def __init__(
        self,
        sandbox_id: str,
        root: Path,
        env: dict[str, str],
        jupyter_port: int,
        netns: NetnsMode | None,
    ) -> None:
        self.dir = root / sandbox_id
        self.run_dir = root / f"{sandbox_id}.run"
        self.dir.mkdir(parents=True)
        self.run_dir.mkdir()
        base = {key: os.environ[key] for key in BASE_ENV_KEYS if key in os.environ}
        base.update({"HOME": str(self.dir), "SHELL": "/bin/bash", "PWD": str(self.dir)})
        base["JUPYTER_PORT"] = str(JUPYTER_PORT_IN_NETNS if netns else jupyter_port)
        self.env = {**base, **env}
        self._lock = threading.Lock()
        self._procs: dict[int, subprocess.Popen[Any]] = {}
        self._closed = False
        self._netns = netns
        try:
            self._agent = NetnsAgent.start(netns, self.run_dir, self.env) if netns else None
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise

    @property
    def isolated(self) -> bool:
        """True when the sandbox's processes run in a private network namespace."""
        return self._agent is not None

    def resolve(self, path: str) -> Path:
        """A sandbox path on disk: relative paths are inside the sandbox directory.

        Absolute paths are used as they are: the sandbox shares the host's file system.
        """
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
        """Start `argv` in its own process group inside this sandbox; OSError if it cannot."""
        if self._agent is not None and self._netns is not None:
            argv = [*self._netns.nsenter_argv(self._agent.pid), *argv]
        with self._lock:
            if self._closed:
                raise OSError("sandbox is being deleted")
            self._forget_finished()
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
            )
            self._procs[proc.pid] = proc
        return proc

    def _forget_finished(self) -> None:
        # A group outlives its leader while any member lives (`cmd &` in bash), so an entry
        # is dropped only once the whole group is gone.
        for pgid, proc in list(self._procs.items()):
            if proc.poll() is not None and not group_exists(pgid):
                del self._procs[pgid]

    def connect(self, port: int, timeout: float = 10.0) -> socket.socket:
        """A socket connected to `port` on the sandbox's loopback; OSError on failure."""
        if self._agent is not None:
            return self._agent.connect(port, timeout)
        return socket.create_connection(("127.0.0.1", port), timeout=timeout)

    def signal_all(self, sig: int) -> None:
        """Send `sig` to every process group of the sandbox (pause, resume)."""
        with self._lock:
            groups = list(self._procs)
        for pgid in groups:
            kill_group(pgid, sig)

    def close(self) -> None:
        """Kill every process of the sandbox and remove its directories; idempotent."""
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
        if self._agent is not None:
            self._agent.stop()
            self._agent = None
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)
