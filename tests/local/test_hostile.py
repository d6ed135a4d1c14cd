"""Hostile clients against the HTTP layer: head deadline and cap, slow bodies, the connection cap.

Issue 23's measurements, each as a test: a flood of slow bodies to `/metrics/events` (no key
needed) kept every client out; heads of megabytes were read whole.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from osb_sync.local import LocalServer
from osb_sync.local.http.httpd import Limits
from tests.local.rawhttp import exchange, read_answer, request
from tests.local.support import local_server


@pytest.fixture
def capped() -> Iterator[LocalServer]:
    """A server with a small connection cap (defaults otherwise)."""
    with local_server(limits=Limits(max_connections=16), command_grace=0) as server:
        yield server


@pytest.fixture
def quick_bodies() -> Iterator[LocalServer]:
    """A server that judges a body's rate after 1 s (defaults otherwise)."""
    with local_server(limits=Limits(body_grace=1.0), command_grace=0) as server:
        yield server


def slow_body(port: int, stop: threading.Event) -> None:
    """POST /metrics/events, then a byte of its body every 0.3 s until `stop` or cut off."""
    head = request("POST", "/metrics/events", port, {"Content-Type": "application/json"})
    head = head.replace(b"Content-Length: 0", b"Content-Length: 10000")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(head)
            while not stop.wait(0.3):
                sock.sendall(b" ")
    except OSError:
        pass  # evicted or cut: what the server should do to it


def test_a_flood_of_slow_bodies_does_not_keep_a_prompt_client_out(capped: LocalServer) -> None:
    stop = threading.Event()
    flood = [
        threading.Thread(target=slow_body, args=(capped.port, stop), daemon=True)
        for _ in range(24)  # more than the cap of 16
    ]
    try:
        for thread in flood:
            thread.start()
            time.sleep(0.02)
        time.sleep(2)  # every slow body has waited more than a second
        statuses = [
            requests.get(f"{capped.base_url}/health", timeout=10).status_code for _ in range(5)
        ]
        assert statuses == [200] * 5
    finally:
        stop.set()
        for thread in flood:
            thread.join(30)


def test_a_body_slower_than_the_minimum_rate_is_cut_with_408(quick_bodies: LocalServer) -> None:
    head = request("POST", "/metrics/events", quick_bodies.port, {"Content-Type": "x/y"})
    head = head.replace(b"Content-Length: 0", b"Content-Length: 10000")
    with socket.create_connection(("127.0.0.1", quick_bodies.port), timeout=20) as sock:
        started = time.monotonic()
        sock.sendall(head + b"x" * 100)
        answer = read_answer(sock)
        assert answer.status == 408 and "bytes/s" in answer.json()["message"]
        assert answer.headers["connection"] == "close"
        assert time.monotonic() - started < 10  # grace 1 s, watcher every 0.25 s
        assert sock.recv(1) == b""


def test_a_body_at_a_decent_rate_is_not_cut(quick_bodies: LocalServer) -> None:
    body = b"{}" + b" " * 4998
    head = request("POST", "/metrics/events", quick_bodies.port, {"Content-Type": "x/y"})
    head = head.replace(b"Content-Length: 0", f"Content-Length: {len(body)}".encode())
    with socket.create_connection(("127.0.0.1", quick_bodies.port), timeout=20) as sock:
        sock.sendall(head)
        for start in range(0, len(body), 1000):  # about 5 KiB/s for one second
            sock.sendall(body[start : start + 1000])
            time.sleep(0.2)
        assert read_answer(sock).status == 200


def test_metrics_events_takes_only_a_small_body(local: LocalServer) -> None:
    raw = request("POST", "/metrics/events", local.port, {"Content-Type": "x/y"}, b"1" * 20_000)
    answer = exchange(local.port, raw)
    assert answer.status == 413


@pytest.mark.parametrize(
    "headers",
    [
        {"X-A": "a" * 40_000, "X-B": "b" * 40_000},  # two lines, each under 64 KiB
        {f"X-{i}": "v" * 700 for i in range(99)},  # under 100 lines
    ],
)
def test_a_head_over_64_kib_in_all_is_431(local: LocalServer, headers: dict[str, str]) -> None:
    answer = exchange(local.port, request("GET", "/health", local.port, headers))
    assert answer.status == 431 and answer.headers["connection"] == "close"
    assert "65536" in answer.json()["message"]


def test_a_head_just_under_the_cap_is_served(local: LocalServer) -> None:
    answer = exchange(local.port, request("GET", "/health", local.port, {"X-A": "a" * 60_000}))
    assert answer.status == 200


def test_a_head_cut_short_by_its_deadline_is_408() -> None:
    with local_server(limits=Limits(header_timeout=1.0), command_grace=0) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
            started = time.monotonic()
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            answer = read_answer(sock)
            assert answer.status == 408 and time.monotonic() - started < 8


def test_idle_keep_alive_connections_close_after_30_s_by_default() -> None:
    assert Limits().idle_timeout == 30.0
    assert (Limits().header_timeout, Limits().max_head_bytes) == (10.0, 65536)
    assert (Limits().body_grace, Limits().min_body_rate) == (10.0, 1024.0)
    with pytest.raises(ValueError, match="idle_timeout"):
        Limits(idle_timeout=0)


def test_a_keyed_route_answers_401_before_asking_for_the_body() -> None:
    # With Expect: 100-continue, the 100 would invite the body; a key check comes first.
    with local_server(api_key="k", command_grace=0) as server:
        raw = request(
            "POST",
            "/v1/sandboxes",
            server.port,
            {"Content-Type": "application/json", "Expect": "100-continue"},
        ).replace(b"Content-Length: 0", b"Content-Length: 500000")
        answer = exchange(server.port, raw)
        assert answer.status == 401 and answer.headers["connection"] == "close"


def test_100_continue_comes_when_a_route_reads_the_body(local: LocalServer) -> None:
    raw = request(
        "POST", "/metrics/events", local.port, {"Content-Type": "x/y", "Expect": "100-continue"}
    ).replace(b"Content-Length: 0", b"Content-Length: 2")
    with socket.create_connection(("127.0.0.1", local.port), timeout=10) as sock:
        sock.sendall(raw)
        assert read_answer(sock).status == 100
        sock.sendall(b"{}")
        assert read_answer(sock).status == 200
