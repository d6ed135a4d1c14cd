"""Inside a container: start a Jupyter server and an execd binary (see `execd_binary.py`).

Run by `main.py` when the server was given `execd=`; standard library only. Both
run as children of the container's main process, each in its own process group, with their
output in log files of execd's state directory; on a failed start the tail of those logs goes
to the main's standard error (the container's log, which the failed create quotes), tokens
replaced by `***`.
"""

from __future__ import annotations

import http.client
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

from ..protocol import Claim, Start

JUPYTER_START_TIMEOUT = 60.0
EXECD_START_TIMEOUT = 20.0
STOP_TIMEOUT = 3.0
LOG_TAIL = 1500


class ExecdStartError(RuntimeError):
    """The Jupyter server or the execd binary did not come up; the message has their logs."""


class ExecdChildren:
    """The Jupyter server (optional) and the execd binary of one container."""

    def __init__(self, start: Start, claim: Claim) -> None:
        self.home = start.home
        self.state = Path(start.run_dir)
        self.jupyter_port = start.jupyter_port
        self.env = {**claim.env, "JUPYTER_PORT": str(self.jupyter_port)}
        self.execd_token = claim.token
        self.jupyter_token = secrets.token_hex(16)
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, execd: str, jupyter: str | None, execd_port: int) -> None:
        """Start Jupyter (if given) and execd; return once execd answers /ping.

        Raises:
            ExecdStartError: one of them exited or did not answer in time.
        """
        env = dict(self.env)
        try:
            if jupyter is not None:
                self._start_jupyter(jupyter)
                env["JUPYTER_HOST"] = f"http://127.0.0.1:{self.jupyter_port}"
                env["JUPYTER_TOKEN"] = self.jupyter_token
            (self.state / "execd.env").touch()
            env["EXECD_ENVS"] = str(self.state / "execd.env")
            env["EXECD_ACCESS_TOKEN"] = self.execd_token
            self._spawn("execd", [execd, "--port", str(execd_port)], env)
            headers = {"X-EXECD-ACCESS-TOKEN": self.execd_token}
            self._wait_http("execd", execd_port, "/ping", headers, EXECD_START_TIMEOUT)
        except (OSError, ExecdStartError) as exc:
            self.stop()
            raise ExecdStartError(f"{exc}\n{self.log_tails()}") from None

    def _start_jupyter(self, jupyter: str) -> None:
        argv = [
            jupyter,
            "notebook",
            "--ip=127.0.0.1",
            f"--port={self.jupyter_port}",
            "--allow-root",
            "--no-browser",
            f"--NotebookApp.token={self.jupyter_token}",
        ]
        # Jupyter's runtime files go to the state directory, not the sandbox's home.
        env = {**self.env, "JUPYTER_RUNTIME_DIR": str(self.state / "jupyter-runtime")}
        self._spawn("jupyter", argv, env)
        path = f"/api/kernelspecs?token={self.jupyter_token}"
        self._wait_http("jupyter", self.jupyter_port, path, {}, JUPYTER_START_TIMEOUT)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self.state / f"{name}.log", "wb") as log:
            self.procs.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.home,
                    env=env,
                    start_new_session=True,
                )
            )

    def _wait_http(
        self, name: str, port: int, path: str, headers: dict[str, str], timeout: float
    ) -> None:
        deadline = time.monotonic() + timeout
        proc = self.procs[-1]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ExecdStartError(f"{name} exited with status {proc.returncode}")
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                conn.request("GET", path, headers=headers)
                if conn.getresponse().status == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()
            time.sleep(0.1)
        raise ExecdStartError(f"{name} did not answer within {timeout:.0f} s")

    def log_tails(self) -> str:
        """The end of each log, tokens replaced by `***`."""
        parts = []
        for name in ("jupyter", "execd"):
            try:
                text = (self.state / f"{name}.log").read_text(errors="replace")
            except OSError:
                continue
            for token in (self.execd_token, self.jupyter_token):
                text = text.replace(token, "***")
            parts.append(f"--- {name}.log ---\n{text[-LOG_TAIL:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Terminate both process groups (kill what does not end in time)."""
        for proc in self.procs:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
