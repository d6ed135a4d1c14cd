"""Transport and stream behaviour over real loopback sockets (tests/fakeserver.py)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from osb_sync import (
    Client,
    OutputLimitExceeded,
    SandboxTimeoutError,
    StreamError,
    TransportError,
)
from tests.fakeserver import FakeServer, Request

SID = "sbx-1"
TOKEN = "execd-token-abcdef"
KEY = "api-key-abcdef"
EXECD_PATH = f"/sandboxes/{SID}/proxy/44772"


def serve_endpoint(server: FakeServer) -> None:
    """Lifecycle endpoint lookup that points execd at the same server (server-proxy style)."""

    @server.route("GET", f"/v1/sandboxes/{SID}/endpoints/44772")
    def endpoint(req: Request) -> None:
        req.send_json(
            200,
            {
                "endpoint": f"127.0.0.1:{server.server_address[1]}{EXECD_PATH}",
                "headers": {"X-EXECD-ACCESS-TOKEN": TOKEN},
            },
        )

    @server.route("DELETE", f"{EXECD_PATH}/code")
    def interrupt(req: Request) -> None:
        server.interrupted.set()
        req.send_raw(200, b"")

    @server.route("GET", f"{EXECD_PATH}/ping")
    def ping(req: Request) -> None:
        req.send_raw(200, b"")


def serve_run(server: FakeServer, body: callable) -> None:  # type: ignore[valid-type]
    server.routes[("POST", f"{EXECD_PATH}/code")] = body


def ok_run(req: Request) -> None:
    req.start_stream()
    req.event(type="init", text="ctx-1")
    req.event(type="stdout", text="42\n")
    req.event(type="execution_complete")
    req.end_stream()


@pytest.fixture
def client(server: FakeServer) -> Iterator[Client]:
    serve_endpoint(server)
    with Client(server.api_base, KEY, read_timeout=5.0, connect_timeout=2.0) as c:
        yield c


def interrupts(server: FakeServer) -> list[list[str]]:
    return [r.query.get("id", []) for r in server.seen("DELETE", f"{EXECD_PATH}/code")]


def wait_for(predicate: callable, timeout: float = 3.0) -> bool:  # type: ignore[valid-type]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


# -- threads --------------------------------------------------------------------------------


def test_32_threads_share_one_client_within_the_pool(server: FakeServer, client: Client) -> None:
    serve_run(server, ok_run)
    sandbox = client.connect(SID)
    errors: list[BaseException] = []
    barrier = threading.Barrier(32)

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(5):
                assert sandbox.run_code("print(42)").stdout == "42\n"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(server.seen("POST", f"{EXECD_PATH}/code")) == 160
    print(f"TCP connections opened by 32 threads x 5 runs: {server.connections}")
    assert 1 <= server.connections <= 32


def test_connections_are_reused_between_calls(server: FakeServer, client: Client) -> None:
    serve_run(server, ok_run)
    sandbox = client.connect(SID)
    for _ in range(5):
        sandbox.run_code("1")
    assert server.connections == 1


# -- redirects ------------------------------------------------------------------------------


def test_cross_origin_redirect_is_refused_and_nothing_leaks(server: FakeServer) -> None:
    with FakeServer() as other:

        @other.route("GET", "*")
        def anything(req: Request) -> None:
            req.send_json(200, {"endpoint": "x"})

        @server.route("GET", f"/v1/sandboxes/{SID}/endpoints/44772")
        def moved(req: Request) -> None:
            req.send_raw(307, b"", {"Location": f"{other.url}/steal?sig=SECRET123"})

        with Client(server.api_base, KEY) as c, pytest.raises(TransportError) as info:
            c.connect(SID)
        assert other.requests == []
        assert other.url in str(info.value) and "another origin" in str(info.value)
        assert "SECRET123" not in str(info.value) and KEY not in str(info.value)


def test_a_redirect_of_a_run_is_refused(server: FakeServer, client: Client) -> None:
    """execd's redirects are never followed, to another origin or its own (which behind a
    server proxy is the lifecycle API's: tests/faults/test_hostile_execd.py)."""
    with FakeServer() as other:
        for location in (f"{other.url}/code", "/v1/sandboxes"):
            serve_run(server, lambda req, to=location: req.send_raw(307, b"", {"Location": to}))
            with pytest.raises(TransportError, match="follows no redirect"):
                client.run_code(SID, "print(1)")
        assert other.requests == [] and server.seen("POST", "/v1/sandboxes") == []


def test_same_origin_redirect_is_followed_with_credentials(server: FakeServer) -> None:
    @server.route("DELETE", f"/v1/sandboxes/{SID}")
    def moved(req: Request) -> None:
        req.send_raw(308, b"", {"Location": f"/v2/sandboxes/{SID}"})

    @server.route("DELETE", f"/v2/sandboxes/{SID}")
    def deleted(req: Request) -> None:
        req.send_raw(204, b"")

    with Client(server.api_base, KEY) as c:
        assert c.delete_sandbox(SID) is True
    (final,) = server.seen("DELETE", f"/v2/sandboxes/{SID}")
    assert final.headers["OPEN-SANDBOX-API-KEY"] == KEY


def test_same_origin_redirect_that_changes_method_is_refused(
    server: FakeServer, client: Client
) -> None:
    @server.route("DELETE", f"/v1/sandboxes/{SID}")
    def moved(req: Request) -> None:
        req.send_raw(302, b"", {"Location": "/elsewhere"})

    with pytest.raises(TransportError, match="would change the method"):
        client.delete_sandbox(SID)


@pytest.mark.parametrize("location", ["http://[oops/", "http://127.0.0.1:99999/x", "http://h:x/"])
def test_an_unusable_location_is_a_transport_error(
    location: str, server: FakeServer, client: Client
) -> None:
    """urllib raises ValueError for a host or port it cannot read: a typed error instead."""

    @server.route("GET", f"/v1/sandboxes/{SID}")
    def moved(req: Request) -> None:
        req.send_raw(302, b"", {"Location": location})

    with pytest.raises(TransportError, match="unusable Location") as info:
        client.get_sandbox(SID)
    assert repr(location) in str(info.value)


# -- stream faults ----------------------------------------------------------------------------


def test_reset_mid_stream_raises_stream_error_with_partial_and_interrupts(
    server: FakeServer, client: Client
) -> None:
    def reset(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-7")
        req.event(type="stdout", text="before\n")
        time.sleep(0.05)
        req.reset()

    serve_run(server, reset)
    with pytest.raises(StreamError, match="broke") as info:
        client.run_code(SID, "1")
    assert info.value.partial is not None and info.value.partial.stdout == "before\n"
    assert interrupts(server) == [["ctx-7"]]
    serve_run(server, ok_run)
    assert client.run_code(SID, "1").stdout == "42\n"


def test_fin_in_the_middle_of_an_event_raises_stream_error(
    server: FakeServer, client: Client
) -> None:
    def cut(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-1")
        req.wfile.write(b'40\r\n{"type": "stdout", "te')
        req.wfile.flush()
        req.fin()

    serve_run(server, cut)
    with pytest.raises(StreamError):
        client.run_code(SID, "1")


def test_clean_end_in_the_middle_of_a_line_raises_stream_error(
    server: FakeServer, client: Client
) -> None:
    def truncated(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-1")
        req.chunk(b'{"type": "stdout", "te')
        req.end_stream()

    serve_run(server, truncated)
    with pytest.raises(StreamError, match="middle of an event"):
        client.run_code(SID, "1")


def test_bare_error_at_eof_is_a_normal_error(server: FakeServer, client: Client) -> None:
    def busy(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-1")
        req.chunk(b'{"code":"RUNTIME_ERROR","message":"error running codes session is busy"}')
        req.end_stream()

    serve_run(server, busy)
    result = client.run_code(SID, "1")
    assert result.error is not None and result.error.value.endswith("session is busy")


def test_lying_content_length_raises_stream_error(server: FakeServer, client: Client) -> None:
    def lying(req: Request) -> None:
        body = json.dumps({"type": "init", "text": "c"}).encode() + b"\n\n"
        req.send_response(200)
        req.send_header("Content-Type", "text/event-stream")
        req.send_header("Content-Length", str(len(body) + 100))
        req.end_headers()
        req.wfile.write(body)
        req.wfile.flush()
        req.fin()

    serve_run(server, lying)
    with pytest.raises(StreamError):
        client.run_code(SID, "1")


def test_stall_past_read_timeout_raises_stream_error(server: FakeServer) -> None:
    serve_endpoint(server)
    release = threading.Event()

    def stall(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-1")
        release.wait(5)

    serve_run(server, stall)
    with Client(server.api_base, read_timeout=0.5) as c:
        started = time.monotonic()
        with pytest.raises(StreamError, match="broke"):
            c.run_code(SID, "1")
        assert time.monotonic() - started < 3
    release.set()


def test_no_response_headers_within_read_timeout_is_transport_error(server: FakeServer) -> None:
    serve_endpoint(server)
    release = threading.Event()
    serve_run(server, lambda req: release.wait(5))
    with (
        Client(server.api_base, read_timeout=0.5) as c,
        pytest.raises(TransportError, match=r"no answer within 0\.5 s"),
    ):
        c.run_code(SID, "1")
    release.set()


def test_drip_under_read_timeout_is_cut_at_the_run_deadline(
    server: FakeServer, client: Client
) -> None:
    def drip(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-3")
        while not server.interrupted.wait(0.05):
            req.chunk(b" ")
        req.end_stream()

    serve_run(server, drip)
    started = time.monotonic()
    with pytest.raises(SandboxTimeoutError, match=r"within 0\.5 seconds"):
        client.run_code(SID, "1", timeout=0.5)
    assert time.monotonic() - started < 2.5
    assert interrupts(server) == [["ctx-3"]]


def test_watchdog_cuts_a_silent_stream_at_the_deadline(server: FakeServer, client: Client) -> None:
    def silent(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-4")
        server.interrupted.wait(5)
        req.end_stream()

    serve_run(server, silent)
    started = time.monotonic()
    with pytest.raises(SandboxTimeoutError):
        client.run_code(SID, "1", timeout=0.5)
    elapsed = time.monotonic() - started
    assert elapsed < 2.0  # read_timeout is 5 s: only the watchdog can end it this early
    assert interrupts(server) == [["ctx-4"]]


def test_output_flood_is_capped_interrupted_and_not_reused(
    server: FakeServer, client: Client
) -> None:
    def flood(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-5")
        line = json.dumps({"type": "stdout", "text": "x" * 4000}).encode() + b"\n\n"
        try:
            for _ in range(10_000):
                if server.interrupted.is_set():
                    req.end_stream()
                    return
                req.chunk(line)
        except OSError:
            pass

    serve_run(server, flood)
    with pytest.raises(OutputLimitExceeded, match="exceeded 100000 bytes") as info:
        client.run_code(SID, "1", max_output_bytes=100_000)
    assert info.value.partial is not None and len(info.value.partial.stdout) == 100_000  # exact
    assert interrupts(server) == [["ctx-5"]]
    serve_run(server, ok_run)
    assert client.run_code(SID, "1").stdout == "42\n"


def test_the_cap_counts_output_not_framing(server: FakeServer, client: Client) -> None:
    """60 000 one-byte events: 60 kB of output, over 2.5 MB on the wire (past the 4 x cap + 1 MiB
    a total of the wire would allow), pass whole under a 100 kB cap."""
    lines = [json.dumps({"type": "stdout", "text": "y", "timestamp": 1}).encode()] * 60_000
    burst = b"\n\n".join(lines) + b"\n\n"
    assert len(burst) > 4 * 100_000 + (1 << 20)

    def many_small(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-s")
        for start in range(0, len(burst), 65536):
            req.chunk(burst[start : start + 65536])
        req.event(type="execution_complete")
        req.end_stream()

    serve_run(server, many_small)
    assert client.run_code(SID, "1", max_output_bytes=100_000).stdout == "y" * 60_000
    assert interrupts(server) == []


def test_result_payloads_count_against_the_cap(server: FakeServer, client: Client) -> None:
    def big_result(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-r")
        req.event(type="stdout", text="before\n")
        req.event(type="result", results={"text/plain": "x" * 5000})
        server.interrupted.wait(5)
        req.end_stream()

    serve_run(server, big_result)
    with pytest.raises(OutputLimitExceeded, match="the run's output exceeded 1000 bytes") as info:
        client.run_code(SID, "1", max_output_bytes=1000)
    assert info.value.partial.stdout == "before\n" and info.value.partial.results == []
    assert interrupts(server) == [["ctx-r"]]


def test_a_line_past_the_cap_fails_without_its_newline(server: FakeServer, client: Client) -> None:
    """One line that never ends: it counts as it arrives (the cap plus one frame's allowance)
    and is stopped there, the run interrupted."""

    def endless_line(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-l")
        req.chunk(b'{"type":"stdout","text":"')
        try:
            for _ in range(40):  # 2.6 MB, no newline
                if server.interrupted.is_set():
                    break
                req.chunk(b"x" * 65536)
            server.interrupted.wait(5)
            req.end_stream()
        except OSError:
            pass

    serve_run(server, endless_line)
    with pytest.raises(OutputLimitExceeded, match=r"exceeded 1000 bytes.*before it ended"):
        client.run_code(SID, "1", max_output_bytes=1000)
    assert interrupts(server) == [["ctx-l"]]


def test_leaving_a_stream_early_closes_and_interrupts(server: FakeServer, client: Client) -> None:
    def endless(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-6")
        try:
            while not server.interrupted.wait(0.02):
                req.event(type="stdout", text="tick\n")
            req.end_stream()
        except OSError:
            pass

    serve_run(server, endless)
    with client.stream_code(SID, "loop") as stream:
        for event in stream:
            if event.type == "stdout":
                break
    assert interrupts(server) == [["ctx-6"]]
    with pytest.raises(StreamError, match="closed"):
        stream.result()


def test_close_from_another_thread_releases_a_blocked_reader(
    server: FakeServer, client: Client
) -> None:
    release = threading.Event()

    def silent(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="ctx-8")
        release.wait(5)

    serve_run(server, silent)
    stream = client.stream_code(SID, "1")
    assert next(stream).type == "init"
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            list(stream)
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.2)
    started = time.monotonic()
    stream.close()
    reader.join(3)
    release.set()
    assert not reader.is_alive() and time.monotonic() - started < 2
    assert len(outcome) == 1 and isinstance(outcome[0], StreamError)
    assert interrupts(server) == [["ctx-8"]]


def test_stream_result_after_exhaustion(server: FakeServer, client: Client) -> None:
    serve_run(server, ok_run)
    with client.stream_code(SID, "print(42)") as stream:
        types = [e.type for e in stream]
        assert stream.execution_id == "ctx-1"
    assert types == ["init", "stdout", "execution_complete"]
    assert stream.result().stdout == "42\n"
    assert interrupts(server) == []


def test_callback_exception_propagates_and_interrupts(server: FakeServer, client: Client) -> None:
    serve_run(server, ok_run)

    def boom(event: object) -> None:
        raise KeyError("from the callback")

    with pytest.raises(KeyError):
        client.run_code(SID, "1", on_event=boom)
    assert interrupts(server) == [["ctx-1"]]


# -- connection failures ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connection_refused_is_transport_error_and_create_retries_connect(
    sleeps: list[float],
) -> None:
    with Client(f"http://127.0.0.1:{free_port()}/v1", KEY, max_retries=2) as c:
        with pytest.raises(TransportError, match=r"connection refused .*osb-sync serve") as info:
            c.create_sandbox()
    assert KEY not in str(info.value)
    # Nothing was sent, so even the create POST may be retried; then the leak lookup retries too.
    assert sleeps[:2] == [0.5, 1.0]


# -- fork -------------------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_child_process_opens_fresh_connections(server: FakeServer, client: Client) -> None:
    serve_run(server, ok_run)
    sandbox = client.connect(SID)
    sandbox.run_code("1")
    parent_session = client._transport.session
    assert server.connections == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fresh = client._transport.session is not parent_session
            code = 0 if fresh and sandbox.run_code("1").stdout == "42\n" else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert server.connections == 2
    sandbox.run_code("1")
    assert server.connections == 2
    assert client._transport.session is parent_session


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_child_drops_inherited_pool_of_a_callers_session(server: FakeServer) -> None:
    import requests

    serve_endpoint(server)
    serve_run(server, ok_run)
    session = requests.Session()
    with Client(server.api_base, session=session) as c:
        c.run_code(SID, "1")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                same = c._transport.session is session
                code = 0 if same and c.run_code(SID, "1").stdout == "42\n" else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    assert server.connections == 2


def test_a_callers_session_gets_the_same_safety_and_is_left_untouched(server: FakeServer) -> None:
    import requests

    session = requests.Session()
    closed: list[bool] = []
    session.close = lambda: closed.append(True)  # type: ignore[method-assign]
    before = (dict(session.headers), dict(session.adapters), session.cookies.get_policy())
    with FakeServer() as other:

        @server.route("GET", f"/v1/sandboxes/{SID}/endpoints/44772")
        def moved(req: Request) -> None:
            req.send_raw(302, b"", {"Location": f"{other.url}/v1/elsewhere"})

        with Client(server.api_base, KEY, session=session) as c, pytest.raises(TransportError):
            c.connect(SID)
        assert other.requests == []
    assert (dict(session.headers), dict(session.adapters), session.cookies.get_policy()) == before
    assert closed == []  # the caller's session is the caller's to close


def test_environment_is_read_once_per_origin_and_again_when_a_variable_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import requests
    import responses

    reads: list[str] = []
    original = requests.Session.merge_environment_settings

    def counted(self: requests.Session, url: str, *args: Any) -> Any:
        reads.append(url)
        return original(self, url, *args)

    monkeypatch.setattr(requests.Session, "merge_environment_settings", counted)
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    with responses.RequestsMock() as rsps, Client("http://a.test/v1", "") as c:
        rsps.get("http://a.test/x")
        rsps.get("http://b.test/x")
        for url in ("http://a.test/x", "http://a.test/x", "http://b.test/x", "http://a.test/x"):
            c._transport.request("GET", url).close()
        assert reads == ["http://a.test/x", "http://b.test/x"]
        monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
        c._transport.request("GET", "http://a.test/x").close()
        c._transport.request("GET", "http://a.test/x").close()
        c.reload_environment()
        c._transport.request("GET", "http://a.test/x").close()
    assert reads == ["http://a.test/x", "http://b.test/x", "http://a.test/x", "http://a.test/x"]
