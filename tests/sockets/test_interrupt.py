"""Stopping a run early interrupts it, and the client waits until the interrupt took effect.

A fake execd on a real loopback socket sends events in the order the real execd does:
``execution_complete`` arrives early, while the code still runs, and only the end of the
stream ends a ``/code`` run. Its runs end when interrupted, as real ones do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import osb_sync._execution
from osb_sync import (
    Client,
    OutputLimitExceeded,
    Sandbox,
    SandboxTimeoutError,
    StreamError,
)
from tests.fakeserver import FakeServer, Request

CTX = "ctx-real-order"
COMMAND_ID = "cmd-1"
GRACE = 1.0  # real execd keeps a /command stream open this long after its terminal event


class Execd:
    """The fake execd's state: how its /code run behaves and whether interrupts work."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.mode = "sleep"  # sleep | flood | stall (silent before execution_complete)
        self.honours_interrupts = True
        self.interrupt_stalls = False
        self.release = threading.Event()
        server.routes[("POST", "/code")] = self.run_code
        server.routes[("DELETE", "/code")] = self.interrupt
        server.routes[("POST", "/command")] = self.run_command
        server.routes[("DELETE", "/command")] = self.interrupt
        server.routes[("GET", f"/command/status/{COMMAND_ID}")] = self.status
        self.status_calls = 0

    def interrupts(self, path: str) -> list[list[str]]:
        return [r.query.get("id", []) for r in self.server.seen("DELETE", path)]

    def interrupt(self, req: Request) -> None:
        if self.interrupt_stalls:
            self.release.wait(10)
            return
        if self.honours_interrupts:
            self.server.interrupted.set()
        req.send_raw(200, b"")

    def status(self, req: Request) -> None:
        self.status_calls += 1
        if self.status_calls == 1:  # real execd records a background command a moment late
            req.send_json(404, {"code": "INVALID_REQUEST_BODY", "message": "not found"})
        else:
            req.send_json(200, {"id": COMMAND_ID, "running": True, "content": "sleep 30"})

    def run_code(self, req: Request) -> None:
        req.start_stream()
        req.event(type="init", text=CTX)
        req.event(type="ping", text="pong")
        if self.mode == "stall":
            self.release.wait(10)
            return
        req.event(type="stdout", text="start\n")
        req.event(type="execution_complete", execution_time=150)  # early, as real execd does
        try:
            if self.mode == "flood":
                while not self.server.interrupted.is_set() and not self.release.is_set():
                    req.event(type="stdout", text="x" * 8192 + "\n")
            else:
                self.server.interrupted.wait(10)
            if self.release.is_set():
                return
            req.event(type="status", text="error")
            req.event(type="error", error={"ename": "KeyboardInterrupt", "evalue": ""})
            req.end_stream()
        except OSError:
            pass

    def run_command(self, req: Request) -> None:
        background = b'"background": true' in req.body
        req.start_stream()
        req.event(type="init", text=COMMAND_ID)
        if not background:
            req.event(type="stdout", text="hi")
        if req.json.get("command") == "sleep 30" and not background:
            self.server.interrupted.wait(10)
            req.event(type="error", error={"ename": "CommandExecError", "evalue": "-1"})
        else:
            req.event(type="execution_complete")
        time.sleep(GRACE)
        req.end_stream()


@pytest.fixture
def execd(server: FakeServer) -> Iterator[Execd]:
    fake = Execd(server)
    yield fake
    fake.release.set()


def bare_handle(server: FakeServer, read_timeout: float = 5.0) -> Sandbox:
    """A Sandbox on the fake execd itself (no lifecycle API involved)."""
    return Sandbox.from_execd(
        f"http://127.0.0.1:{server.server_address[1]}",
        read_timeout=read_timeout,
        connect_timeout=2.0,
    )


def test_the_deadline_interrupts_a_run_whose_execution_complete_came_first(
    server: FakeServer, execd: Execd
) -> None:
    sandbox = bare_handle(server)
    started = time.monotonic()
    with pytest.raises(SandboxTimeoutError, match="interrupted and has ended") as info:
        sandbox.run_code("import time; time.sleep(20)", timeout=0.5)
    assert time.monotonic() - started < 3.0
    assert execd.interrupts("/code") == [[CTX]]
    assert "may still be busy" not in str(info.value)


def test_the_output_cap_interrupts_a_run_whose_execution_complete_came_first(
    server: FakeServer, execd: Execd
) -> None:
    execd.mode = "flood"
    sandbox = bare_handle(server)
    with pytest.raises(OutputLimitExceeded, match="interrupted and has ended") as info:
        sandbox.run_code("while True: print('x' * 8192)", max_output_bytes=200_000)
    assert execd.interrupts("/code") == [[CTX]]
    assert info.value.partial.stdout.startswith("start\n")


def test_leaving_a_stream_after_execution_complete_interrupts_the_run(
    server: FakeServer, execd: Execd
) -> None:
    sandbox = bare_handle(server)
    with sandbox.stream_code("import time; time.sleep(20)") as stream:
        for event in stream:
            if event.type == "execution_complete":
                break
    assert execd.interrupts("/code") == [[CTX]]
    with pytest.raises(StreamError, match="interrupted and has ended"):
        stream.result()


def test_closing_a_stream_before_reading_it_interrupts_the_run(
    server: FakeServer, execd: Execd
) -> None:
    sandbox = bare_handle(server)
    with sandbox.stream_code("import time; time.sleep(20)"):
        pass
    assert execd.interrupts("/code") == [[CTX]]


def test_an_exception_in_on_event_after_execution_complete_interrupts_the_run(
    server: FakeServer, execd: Execd
) -> None:
    def stop_at_complete(event: object) -> None:
        if getattr(event, "type", None) == "execution_complete":
            raise KeyError("stop")

    sandbox = bare_handle(server)
    with pytest.raises(KeyError):
        sandbox.run_code("import time; time.sleep(20)", on_event=stop_at_complete)
    assert execd.interrupts("/code") == [[CTX]]


def test_an_interrupt_that_does_not_take_effect_is_reported_as_such(
    server: FakeServer, execd: Execd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(osb_sync._execution, "INTERRUPT_WAIT", 0.5)
    execd.honours_interrupts = False
    sandbox = bare_handle(server)
    started = time.monotonic()
    with pytest.raises(SandboxTimeoutError, match="may still be busy"):
        sandbox.run_code("import time; time.sleep(20)", timeout=0.5)
    assert time.monotonic() - started < 3.0
    assert execd.interrupts("/code") == [[CTX]]


def test_a_stalled_stream_fails_after_one_read_timeout_and_interrupts_in_the_background(
    server: FakeServer, execd: Execd
) -> None:
    """A wedged execd stalls the interrupt too: the caller still waits one read timeout."""
    execd.mode = "stall"
    execd.interrupt_stalls = True
    read_timeout = 1.0
    sandbox = bare_handle(server, read_timeout=read_timeout)
    started = time.monotonic()
    with pytest.raises(StreamError, match="in the background"):
        sandbox.run_code("import time; time.sleep(20)")
    elapsed = time.monotonic() - started
    assert elapsed < 1.6 * read_timeout, f"{elapsed:.2f} s for a read timeout of {read_timeout} s"
    deadline = time.monotonic() + 3.0
    while not execd.interrupts("/code") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert execd.interrupts("/code") == [[CTX]]


def test_a_finished_command_is_neither_interrupted_nor_waited_for(
    server: FakeServer, execd: Execd
) -> None:
    sandbox = bare_handle(server)
    started = time.monotonic()
    result = sandbox.commands.run("echo hi")
    assert time.monotonic() - started < GRACE  # the stream ends at its terminal event
    assert (result.exit_code, result.stdout) == (0, "hi\n")
    assert execd.interrupts("/command") == []


def test_a_command_stopped_before_its_terminal_event_is_interrupted(
    server: FakeServer, execd: Execd
) -> None:
    sandbox = bare_handle(server)
    with sandbox.commands.stream("sleep 30") as stream:
        assert [next(stream).type, next(stream).type] == ["init", "stdout"]
    assert execd.interrupts("/command") == [[COMMAND_ID]]


def test_starting_a_background_command_never_interrupts_it(
    server: FakeServer, execd: Execd
) -> None:
    sandbox = bare_handle(server)
    assert sandbox.commands.start("sleep 30").id == COMMAND_ID
    assert execd.interrupts("/command") == []
    assert execd.status_calls == 2  # start returns once execd knows the command


def test_twelve_output_floods_each_leave_the_context_free_on_the_local_server() -> None:
    """The local server's execd, over real sockets: each run after a capped flood works."""
    from osb_sync.local import LocalServer

    with (
        LocalServer(unenforced_network_policy="accept") as local,
        Client(local.api_base) as client,
        client.create_sandbox(allow_internet_access=True) as sandbox,
    ):
        after = []
        for _ in range(12):
            with pytest.raises(OutputLimitExceeded, match="interrupted and has ended"):
                sandbox.run_code("while True:\n    print('x' * 8192)", max_output_bytes=256_000)
            after.append(sandbox.run_code("print('after')").stdout)
    assert after == ["after\n"] * 12
