"""A lifecycle server that stalls (SIGSTOP) or is down: bounded waits and no leaked sandbox.

The local server runs in a subprocess of its own so that it can be stopped and resumed like a
wedged real server. Every process started here is ended in a ``finally``, even on failure.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from osb_sync import Client, SandboxPool, SandboxTimeoutError, TransportError
from osb_sync._orphans import searches_pending

pytestmark = [
    pytest.mark.slow,  # about 30 s of stopped servers: `pytest -m slow`, and the tox py envs
    pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP"),
]

ROOT = Path(__file__).resolve().parents[2]
SERVE = (
    "import sys\n"
    "from osb_sync.local import LocalServer\n"
    "server = LocalServer(ping_interval=0.5, command_grace=0, unenforced_network_policy='accept')\n"
    "server.start()\n"
    "print(server.api_base, flush=True)\n"
    "server.serve_forever()\n"
)
STALL = 3.0  # create_timeout and read_timeout of the clients below


class ServerProcess:
    """``LocalServer`` in a child process (a session of its own) that can be stopped."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.api_base = self.proc.stdout.readline().strip()
        assert self.api_base.startswith("http://127.0.0.1:"), "the local server did not start"

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def end(self) -> None:
        """SIGCONT then SIGTERM (it deletes its sandboxes); SIGKILL to its group if it hangs."""
        if self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    srv = ServerProcess()
    try:
        yield srv
    finally:
        srv.end()


@pytest.fixture
def stalling_client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.api_base, read_timeout=STALL, create_timeout=STALL) as client:
        yield client


@pytest.fixture
def observer(server: ServerProcess) -> Iterator[Client]:
    """A second client, to look at the server without sharing the first one's connections."""
    with Client(server.api_base, read_timeout=10) as client:
        yield client


def closed_port_base() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there any more: connect is refused


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def tagged(client: Client, key: str, value: str) -> list[str]:
    return [info.id for info in client.list_sandboxes(metadata={key: value})]


@pytest.mark.parametrize("size", [0, 1])
def test_acquire_timeout_bounds_the_call_while_the_server_is_stopped(
    size: int, server: ServerProcess, stalling_client: Client, observer: Client
) -> None:
    """size=1: the refill is creating, or has made a sandbox whose /ping now stalls."""
    pool = SandboxPool(stalling_client, size=size, max_size=2, name="stalled-pool")
    try:
        server.stop()
        started = time.monotonic()
        with pytest.raises(SandboxTimeoutError, match="free within 3 seconds"):
            pool.acquire(timeout=3)
        elapsed = time.monotonic() - started
        assert elapsed < 6, f"acquire(timeout=3) took {elapsed:.1f} s"
        server.resume()
    finally:
        server.resume()
        pool.close()
    # The create went on in the background and failed (create_timeout); what the server made
    # of it once resumed is found by its tag and deleted.
    assert wait_for(lambda: tagged(observer, "osb_sync.pool", "stalled-pool") == [], 30)
    assert wait_for(lambda: searches_pending() == 0, 30)


def test_acquire_against_a_server_that_is_down_times_out(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="osb_sync")
    with Client(closed_port_base()) as client, SandboxPool(client, size=0) as pool:
        started = time.monotonic()
        with pytest.raises(SandboxTimeoutError, match="free within 3 seconds") as info:
            pool.acquire(timeout=3)
        elapsed = time.monotonic() - started
    assert elapsed < 6, f"acquire(timeout=3) took {elapsed:.1f} s"
    assert isinstance(info.value.__cause__, TransportError)
    assert "check that the server" in str(info.value)
    assert "failed create" not in caplog.text  # no create reached the server: nothing to find


def test_a_late_create_joins_the_pool(server: ServerProcess) -> None:
    with Client(server.api_base, create_timeout=60) as patient:
        with SandboxPool(patient, size=0, max_size=1) as pool:
            server.stop()
            with pytest.raises(SandboxTimeoutError):
                pool.acquire(timeout=1)
            server.resume()
            started = time.monotonic()
            with pool.sandbox(timeout=30) as sb:
                assert time.monotonic() - started < 20
                assert sb.run_code("print(6 * 7)").stdout == "42\n"


def test_a_create_on_a_stopped_server_raises_on_time_and_its_sandbox_is_deleted_later(
    server: ServerProcess,
    stalling_client: Client,
    observer: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="osb_sync")
    server.stop()
    started = time.monotonic()
    try:
        with pytest.raises(TransportError):
            stalling_client.create_sandbox(metadata={"test": "stalled-create"})
        elapsed = time.monotonic() - started
    finally:
        server.resume()
    assert elapsed < STALL + 3, f"create_timeout={STALL} but the call took {elapsed:.1f} s"
    # Resumed, the server makes the sandbox from the request it had buffered; the background
    # lookup finds it by its create-id tag and deletes it.
    assert wait_for(lambda: "left by a failed create" in caplog.text, 30), caplog.text
    assert wait_for(lambda: tagged(observer, "test", "stalled-create") == [], 10)
    assert wait_for(lambda: searches_pending() == 0, 30)


def test_a_create_that_never_reached_the_server_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="osb_sync")
    with Client(closed_port_base(), max_retries=0) as client:
        with pytest.raises(TransportError, match="connection refused"):
            client.create_sandbox()
    assert "failed create" not in caplog.text
    assert searches_pending() == 0


EXIT_SCRIPT = """
import logging, sys, time
import osb_sync, osb_sync._orphans as orphans
logging.basicConfig(level=logging.WARNING)
orphans.backoff_seconds = lambda attempt: 3600.0  # after a first failed lookup, only exit looks
client = osb_sync.Client(sys.argv[1], read_timeout=1, create_timeout=1, max_retries=0)
try:
    client.create_sandbox(metadata={"test": "exit-lookup"})
except osb_sync.TransportError:
    pass
while not all(job.attempts for job in list(orphans._searches)):
    time.sleep(0.05)
print("looked", flush=True)
sys.stdin.readline()  # the parent resumes the server, then lets this process exit
"""


def test_interpreter_exit_gives_the_lookup_a_last_chance(
    server: ServerProcess, observer: Client
) -> None:
    server.stop()
    child = subprocess.Popen(
        [sys.executable, "-c", EXIT_SCRIPT, server.api_base],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "looked"
        server.resume()
        assert wait_for(lambda: tagged(observer, "test", "exit-lookup") != [], 10), (
            "the resumed server never made the sandbox: nothing to test"
        )
        started = time.monotonic()
        _, stderr = child.communicate("\n", timeout=20)
        exited = time.monotonic() - started
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
    assert "left by a failed create" in stderr, stderr
    assert tagged(observer, "test", "exit-lookup") == []
    assert exited < 8, f"exit took {exited:.1f} s"


def test_exit_waits_a_short_bound_for_a_lookup_on_a_stalled_server(server: ServerProcess) -> None:
    server.stop()
    script = EXIT_SCRIPT.replace("sys.stdin.readline()", "pass")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", script, server.api_base],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert "did not finish within 3.0 s" in proc.stderr and "osb-sync/create-id=" in proc.stderr
    assert elapsed < 15, f"the process took {elapsed:.1f} s to exit"
