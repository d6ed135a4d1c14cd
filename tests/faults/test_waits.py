"""Every wait bounded by its own deadline, over real loopback sockets (issue 24).

A fake OpenSandbox (``tests/fakeserver.py``, one server for the lifecycle API and execd) whose
routes stall (accept the request, never answer) or report a state execd cannot answer in. The
client's ``read_timeout`` is 15 s, as in the measurement; every wait below is a few seconds,
and each test asserts that the call ended within its own wait (with a generous margin) and
said why. Marked slow like the rest of ``tests/faults`` (about 20 s in all).
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from osb_sync import Client, SandboxStateError, SandboxTimeoutError
from tests.fakeserver import FakeServer, Request

pytestmark = pytest.mark.slow

SID = "sbx-1"
READ_TIMEOUT = 15.0
MARGIN = 2.5  # seconds a call may take past its own wait on a busy machine
STALL_MAX = 30.0  # a stalled handler gives up on its own after this long


class FakeOpenSandbox:
    """One sandbox; its state and which routes stall are set by each test."""

    def __init__(self, server: FakeServer):
        self.server = server
        self.states = ["Running"]  # GET answers states[0], then the next one, ...
        self.reason: dict[str, str] = {}
        self.stalled: set[str] = set()
        self.release = threading.Event()
        self.execd_base = f"127.0.0.1:{server.server_address[1]}/execd"
        self.deleted = False
        routes = {
            ("POST", "/v1/sandboxes"): self.create,
            ("GET", f"/v1/sandboxes/{SID}"): self.get,
            ("DELETE", f"/v1/sandboxes/{SID}"): self.delete,
            ("POST", f"/v1/sandboxes/{SID}/resume"): self.ok,
            ("GET", f"/v1/sandboxes/{SID}/endpoints/44772"): self.endpoint,
            ("GET", "/execd/ping"): self.ok,
            ("POST", "/execd/code"): self.ok,
            ("POST", "/execd/command"): self.ok,
        }
        for (method, path), handler in routes.items():
            server.routes[(method, path)] = self.stalling(f"{method} {path}", handler)

    def stalling(self, name: str, handler: Any) -> Any:
        def serve(req: Request) -> None:
            if name in self.stalled:
                self.release.wait(STALL_MAX)
                req.fin()
                return
            handler(req)

        return serve

    def stall(self, *names: str) -> None:
        self.stalled.update(names)

    def status(self) -> dict[str, Any]:
        state = self.states[0] if len(self.states) == 1 else self.states.pop(0)
        return {"state": state, **(self.reason if state == self.states[-1] else {})}

    def create(self, req: Request) -> None:
        req.send_json(202, {"id": SID, "status": {"state": "Running"}})

    def get(self, req: Request) -> None:
        req.send_json(200, {"id": SID, "status": self.status()})

    def delete(self, req: Request) -> None:
        self.deleted = True
        req.send_raw(204, b"")

    def endpoint(self, req: Request) -> None:
        req.send_json(200, {"endpoint": self.execd_base})

    def ok(self, req: Request) -> None:
        req.send_raw(200, b"")


@pytest.fixture
def fake() -> Iterator[FakeOpenSandbox]:
    with FakeServer() as server:
        world = FakeOpenSandbox(server)
        try:
            yield world
        finally:
            world.release.set()


@pytest.fixture
def client(fake: FakeOpenSandbox) -> Iterator[Client]:
    with Client(fake.server.api_base, read_timeout=READ_TIMEOUT, max_retries=0) as c:
        yield c


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def timed(call: Any, *args: Any, **kwargs: Any) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        call(*args, **kwargs)
    return info.value, time.monotonic() - started


def test_connect_to_a_paused_sandbox_says_paused_within_ready_timeout(
    fake: FakeOpenSandbox, client: Client
) -> None:
    """The real server's proxy holds a paused sandbox's /ping unanswered (docker pause)."""
    fake.states = ["Paused"]
    fake.stall("GET /execd/ping")
    error, elapsed = timed(client.connect, SID, ready_timeout=5)
    assert isinstance(error, SandboxStateError), repr(error)
    assert "is Paused" in str(error) and "resume it first" in str(error)
    assert elapsed < 5 + MARGIN, f"connect(ready_timeout=5) took {elapsed:.1f} s"


def test_an_entrypoint_that_exits_fails_the_create_with_the_servers_reason(
    fake: FakeOpenSandbox, client: Client
) -> None:
    """Running, then Failed ("exited with code 7"); execd never listens."""
    fake.execd_base = f"127.0.0.1:{closed_port()}/execd"
    fake.states = ["Running", "Failed"]
    fake.reason = {"reason": "ContainerExited", "message": "exited with code 7"}
    error, elapsed = timed(client.create_sandbox, entrypoint=["sh", "-c", "exit 7"])
    assert isinstance(error, SandboxStateError), repr(error)
    assert "entered Failed (ContainerExited: exited with code 7)" in str(error)
    assert elapsed < MARGIN, f"the create took {elapsed:.1f} s to see Failed"
    assert fake.deleted


def test_wait_until_healthy_on_a_stalled_execd_ends_at_ready_timeout(
    fake: FakeOpenSandbox, client: Client
) -> None:
    sandbox = client.connect(SID)
    fake.stall("GET /execd/ping")
    error, elapsed = timed(sandbox.wait_until_healthy, ready_timeout=2, poll_interval=0.1)
    assert isinstance(error, SandboxTimeoutError), repr(error)
    assert re.search(r"did not answer /ping within 2(\.0)? seconds", str(error))
    assert elapsed < 2 + MARGIN, f"wait_until_healthy(ready_timeout=2) took {elapsed:.1f} s"


def test_run_code_on_a_stalled_execd_ends_at_its_timeout(
    fake: FakeOpenSandbox, client: Client
) -> None:
    sandbox = client.connect(SID)
    fake.stall("POST /execd/code")
    error, elapsed = timed(sandbox.run_code, "print(1)", timeout=2)
    assert isinstance(error, SandboxTimeoutError), repr(error)
    assert re.search(r"did not finish within 2(\.0)? seconds", str(error))
    assert "no interrupt was sent" in str(error)
    assert elapsed < 2 + MARGIN, f"run_code(timeout=2) took {elapsed:.1f} s"


def test_a_command_on_a_stalled_execd_ends_at_its_timeout(
    fake: FakeOpenSandbox, client: Client
) -> None:
    """The client waits a command's timeout plus DEADLINE_SLACK (2 s), so execd's kill wins."""
    sandbox = client.connect(SID)
    fake.stall("POST /execd/command")
    error, elapsed = timed(sandbox.commands.run, "sleep 60", timeout=2)
    assert isinstance(error, SandboxTimeoutError), repr(error)
    assert elapsed < 4 + MARGIN, f"commands.run(timeout=2) took {elapsed:.1f} s"


def test_a_run_by_id_counts_reaching_the_sandbox_in_its_timeout(
    fake: FakeOpenSandbox, client: Client
) -> None:
    fake.stall("GET /execd/ping")
    error, elapsed = timed(client.run_code, SID, "print(1)", timeout=2)
    assert isinstance(error, SandboxTimeoutError), repr(error)
    assert re.match(r"the run did not finish within 2(\.0)? seconds: sandbox sbx-1 was", str(error))
    assert elapsed < 2 + MARGIN, f"run_code(id, timeout=2) took {elapsed:.1f} s"


def test_resume_by_id_ends_at_its_ready_timeout_when_the_server_stalls(
    fake: FakeOpenSandbox, client: Client
) -> None:
    fake.stall(f"POST /v1/sandboxes/{SID}/resume")
    error, elapsed = timed(client.resume, SID, ready_timeout=2)
    assert isinstance(error, SandboxTimeoutError), repr(error)
    assert re.search(r"was not Running within 2(\.0)? seconds", str(error))
    assert elapsed < 2 + MARGIN, f"resume(ready_timeout=2) took {elapsed:.1f} s"


def test_the_wait_for_running_ends_at_ready_timeout_when_polls_stall(
    fake: FakeOpenSandbox, client: Client
) -> None:
    fake.states = ["Pending"]
    fake.server.routes[("POST", "/v1/sandboxes")] = lambda req: req.send_json(
        202, {"id": SID, "status": {"state": "Pending"}}
    )
    fake.stall(f"GET /v1/sandboxes/{SID}")
    error, elapsed = timed(client.create_sandbox, ready_timeout=2)
    assert isinstance(error, SandboxTimeoutError), repr(error)
    assert re.search(r"was not Running within 2(\.0)? seconds", str(error))
    assert elapsed < 2 + MARGIN, f"create_sandbox(ready_timeout=2) took {elapsed:.1f} s"


def test_a_stream_whose_headers_came_in_time_keeps_the_read_timeout_for_its_silence(
    fake: FakeOpenSandbox, client: Client
) -> None:
    """The deadline bounds the wait for the headers only: a run that is silent past it is
    interrupted by its watchdog, and its stream read until execd ends it (not cut short by a
    read timeout the size of the run's timeout)."""

    def silent_run(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-1")
        fake.server.interrupted.wait(10)
        time.sleep(1.0)  # the run takes a moment to stop, past the run's timeout of silence
        req.end_stream()

    def interrupt(req: Request) -> None:
        fake.server.interrupted.set()
        req.send_raw(200, b"")

    fake.server.routes[("POST", "/execd/code")] = silent_run
    fake.server.routes[("DELETE", "/execd/code")] = interrupt
    sandbox = client.connect(SID)
    error, elapsed = timed(sandbox.run_code, "import time; time.sleep(60)", timeout=0.5)
    assert isinstance(error, SandboxTimeoutError), repr(error)
    assert "it was interrupted and has ended" in str(error)
    assert elapsed < 0.5 + MARGIN
