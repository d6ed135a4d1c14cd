"""``pool_block=True``: a call waits for a free pooled connection instead of opening one more,
so the connections to a host never exceed ``pool_maxsize``; the wait ends with the connect
timeout, in a TransportError that names the fix (issue 29 goal 4)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from osb_sync import Sandbox, TransportError


class _Server(ThreadingHTTPServer):
    """Answers every GET with ``hi`` on kept-alive connections; a path of ``slow`` waits 3 s,
    any other 20 ms. Counts the connections it accepted."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = parse_qs(urlsplit(self.path).query).get("path", [""])[0]
        time.sleep(3.0 if path.endswith("slow") else 0.02)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"hi")


@pytest.fixture
def server() -> _Server:
    server = _Server()
    yield server
    server.shutdown()
    server.server_close()


def _many_threads(sandbox: Sandbox, threads: int = 8, calls: int = 5) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def work() -> None:
        barrier.wait()
        for _ in range(calls):
            try:
                assert sandbox.files.read_bytes("/tmp/x") == b"hi"
            except BaseException as exc:  # reported below
                errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    return errors


@pytest.mark.parametrize("block", [True, False])
def test_a_blocking_pool_never_opens_more_than_pool_maxsize(server: _Server, block: bool) -> None:
    with Sandbox.from_execd(server.url, pool_maxsize=2, pool_block=block) as sandbox:
        assert _many_threads(sandbox) == []
    if block:
        assert server.connections <= 2
    else:  # the control: without it, 8 threads at once open more than the pool keeps
        assert server.connections > 2


def test_a_call_that_waits_past_the_connect_timeout_names_pool_maxsize(server: _Server) -> None:
    with Sandbox.from_execd(
        server.url, pool_maxsize=1, pool_block=True, connect_timeout=0.5
    ) as sandbox:
        holder = threading.Thread(target=sandbox.files.read_bytes, args=("/tmp/slow",))
        holder.start()
        time.sleep(0.5)  # the one connection is now busy for 3 s
        started = time.monotonic()
        with pytest.raises(TransportError, match="raise pool_maxsize"):
            sandbox.files.read_bytes("/tmp/x")
        assert time.monotonic() - started < 2.5
        holder.join(10)
    assert server.connections == 1
