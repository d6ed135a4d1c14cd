"""``Client.close()`` leaves nothing behind: no open socket, no background search (issue 24).

urllib3 2.x drops its pools on ``PoolManager.clear()`` without closing them, so before the
fix the sockets of a client that had served many threads stayed open until the garbage
collector found them; the tests below count the client's sockets with the collector off.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Iterator

import pytest

from osb_sync import Client, TransportError
from osb_sync import _orphans as orphans
from tests.fakeserver import FakeServer, Request

SID = "sbx-1"
THREADS = 16


def client_sockets(port: int) -> int:
    """This process's TCP sockets connected to ``port`` (from /proc: no psutil)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                    if remote_port == port and fields[9] in inodes:
                        count += 1
        except FileNotFoundError:
            continue
    return count


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")


def serve_a_sandbox(server: FakeServer) -> None:
    port = server.server_address[1]
    routes = {
        ("GET", f"/v1/sandboxes/{SID}/endpoints/44772"): lambda req: req.send_json(
            200, {"endpoint": f"127.0.0.1:{port}/execd"}
        ),
        ("GET", "/execd/ping"): lambda req: req.send_raw(200, b""),
    }
    server.routes.update(routes)

    @server.route("POST", "/execd/command")
    def command(req: Request) -> None:
        req.start_stream()
        req.event(type="init", text="cmd-1")
        req.event(type="stdout", text="ok")
        req.event(type="execution_complete", execution_time=1)
        req.end_stream()


def test_close_closes_every_socket_after_traffic_from_many_threads(
    server: FakeServer, no_gc: None
) -> None:
    serve_a_sandbox(server)
    port = server.server_address[1]
    client = Client(server.api_base)
    sandbox = client.connect(SID)

    def work() -> None:
        for _ in range(5):
            assert sandbox.commands.run("echo ok").stdout == "ok\n"
            assert sandbox.ping()

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert client_sockets(port) > 0, "the pool kept no connection: nothing to test"
    client.close()
    assert client_sockets(port) == 0


def test_a_caller_session_keeps_its_connections(server: FakeServer) -> None:
    import requests

    serve_a_sandbox(server)
    with requests.Session() as session:
        client = Client(server.api_base, session=session)
        assert client.connect(SID).ping()
        client.close()
        assert client_sockets(server.server_address[1]) == 1  # theirs, still pooled


def failing_create(server: FakeServer, release: threading.Event) -> None:
    @server.route("POST", "/v1/sandboxes")
    def create(req: Request) -> None:
        release.wait(10)  # past create_timeout: the answer is lost, a search starts
        req.fin()


def test_close_ends_the_search_of_a_failed_create_after_one_last_lookup(
    server: FakeServer,
) -> None:
    release = threading.Event()
    failing_create(server, release)
    server.routes[("GET", "/v1/sandboxes")] = lambda req: req.send_json(200, {"items": []})
    client = Client(server.api_base, create_timeout=0.3, max_retries=0)
    try:
        with pytest.raises(TransportError):
            client.create_sandbox()
        assert orphans.searches_pending() == 1  # no answer: it would look for 300 s
        started = time.monotonic()
        client.close()
        assert time.monotonic() - started < orphans.EXIT_WAIT + 1
        assert orphans.searches_pending() == 0
        lookups = len(server.seen("GET", "/v1/sandboxes"))
        time.sleep(1.0)  # past the first backoff of a search that went on
        assert len(server.seen("GET", "/v1/sandboxes")) == lookups
    finally:
        release.set()


def test_close_waits_a_short_bound_for_a_stalled_lookup_and_says_what_to_look_for(
    server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="osb_sync")
    release = threading.Event()
    failing_create(server, release)

    @server.route("GET", "/v1/sandboxes")
    def stalled_lookup(req: Request) -> None:
        release.wait(10)
        req.fin()

    client = Client(server.api_base, create_timeout=0.3, read_timeout=30, max_retries=0)
    try:
        with pytest.raises(TransportError):
            client.create_sandbox()
        started = time.monotonic()
        client.close()
        assert time.monotonic() - started < orphans.EXIT_WAIT + 1
        assert "at close, the lookup" in caplog.text and "osb-sync/create-id=" in caplog.text
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while orphans.searches_pending() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert orphans.searches_pending() == 0
