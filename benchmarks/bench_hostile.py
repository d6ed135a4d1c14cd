"""Hostile clients against the local server (issue 23): a prompt client's latency, head memory.

The server runs in its own process (``python -m osb_sync serve``). Figures:

- under a flood of ``--slow-clients`` (500) connections each sending ``POST /metrics/events``
  (no key needed) and then its body one byte per second, reconnecting whenever the server
  cuts or evicts them: the p50/p99 of ``GET /health`` and of ``sandbox.run_code("1")`` from a
  well-behaved client (goal: p99 under 1 s each);
- the server's RSS above idle while 32 clients each hold a maximal head (just under the
  64 KiB cap, never finished), and its peak while 32 clients each try to send 6.3 MB of
  headers (the issue's attack; the cap answers 431); goal: under 64 MiB above idle.

The connection cap (``Limits.max_connections``, at most half the server's open-file limit)
and both processes' open-file limits are in the report.

    python benchmarks/bench_hostile.py [--slow-clients 500] [--seconds 25] [--json out.json]
"""

from __future__ import annotations

import argparse
import resource
import socket
import threading
import time
from typing import Any

import requests
from _common import local_server, median, percentile, proc_stats, report, verdict

import osb_sync
from osb_sync.local.http.httpd import Limits

GOAL_P99_MS = 1000
GOAL_MB = 64
HEAD_CAP = Limits().max_head_bytes


def open_file_limit(pid: int | str = "self") -> int:
    """The soft open-file limit of a process, from /proc."""
    with open(f"/proc/{pid}/limits") as limits:
        for line in limits:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    return -1


class SlowFlood:
    """`count` connections that trickle a body one byte a second, reconnecting when cut."""

    def __init__(self, host: str, port: int, count: int) -> None:
        self.address = (host, port)
        self.count = count
        self.reconnects = 0
        self.head = (
            f"POST /metrics/events HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 10000\r\n\r\n"
        ).encode()
        self._socks: list[socket.socket | None] = [None] * count
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _connect(self, index: int) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=5)
            sock.setblocking(False)
            sock.send(self.head)
            self._socks[index] = sock
        except OSError:
            self._socks[index] = None

    def start(self) -> None:
        for index in range(self.count):
            self._connect(index)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for index, sock in enumerate(self._socks):
                try:
                    if sock is None:
                        raise OSError
                    try:
                        if sock.recv(65536) == b"":
                            raise OSError  # closed by the server
                        raise OSError  # answered (408 or 503): the server is done with it
                    except BlockingIOError:
                        pass
                    sock.send(b" ")
                except OSError:
                    if sock is not None:
                        sock.close()
                    self.reconnects += 1
                    self._connect(index)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self._socks:
            if sock is not None:
                sock.close()


def latencies(call: Any, count: int) -> dict[str, float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": round(median(times), 1), "p99_ms": round(percentile(times, 99), 1)}


def under_flood(health: Any, code: Any, seconds: float, pid: int) -> dict[str, Any]:
    """Time `health` and `code` in turn for `seconds` (past the 10 s body grace)."""
    times: dict[str, list[float]] = {"health": [], "run_code": []}
    most_fds = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for name, call in (("health", health), ("run_code", code)):
            started = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - started) * 1000)
        most_fds = max(most_fds, proc_stats(pid)["fds"])
        time.sleep(0.05)
    out: dict[str, Any] = {
        name: {
            "count": len(values),
            "p50_ms": round(median(values), 1),
            "p99_ms": round(percentile(values, 99), 1),
        }
        for name, values in times.items()
    }
    out["server_fds_at_most"] = most_fds
    return out


def rss_mib(pid: int) -> float:
    return proc_stats(pid)["rss_kib"] / 1024


def held_heads(host: str, port: int, pid: int, clients: int) -> dict[str, float]:
    """RSS above idle while `clients` each hold a head just under the cap, unfinished."""
    idle = rss_mib(pid)
    line = b"X-Fill: " + b"a" * 1000 + b"\r\n"
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + line * ((HEAD_CAP - 200) // len(line))
    socks = []
    for _ in range(clients):
        sock = socket.create_connection((host, port), timeout=10)
        sock.sendall(head)
        socks.append(sock)
    time.sleep(1.0)
    held = rss_mib(pid)
    for sock in socks:
        sock.close()
    return {"idle_mib": round(idle, 1), "held_mib_over_idle": round(held - idle, 1)}


def oversized_heads(host: str, port: int, pid: int, clients: int) -> dict[str, Any]:
    """Peak RSS above idle while `clients` each try to send 6.3 MB of headers."""
    with open(f"/proc/{pid}/clear_refs", "w") as handle:
        handle.write("5")
    idle = rss_mib(pid)
    line = b"X-Fill: " + b"a" * 63_000 + b"\r\n"
    statuses: list[bytes] = []

    def attack() -> None:
        try:
            with socket.create_connection((host, port), timeout=20) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
                for _ in range(100):
                    sock.sendall(line)
        except OSError:
            pass  # cut off once over the cap: the expected outcome
        statuses.append(b"done")

    threads = [threading.Thread(target=attack) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    peak = proc_stats(pid)["peak_kib"] / 1024
    return {"idle_mib": round(idle, 1), "peak_mib_over_idle": round(peak - idle, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slow-clients", type=int, default=500)
    parser.add_argument("--requests", type=int, default=100, help="requests timed alone")
    parser.add_argument("--seconds", type=float, default=25, help="seconds timed under flood")
    parser.add_argument("--head-clients", type=int, default=32)
    parser.add_argument("--json")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4096)), hard))
    with local_server() as server:
        host, port = server.api_base.split("//")[1].split("/")[0].split(":")
        base = server.api_base.rsplit("/v1", 1)[0]
        server_files = open_file_limit(server.pid)
        cap = min(Limits().max_connections, server_files // 2)
        with osb_sync.Client(server.api_base) as client, requests.Session() as http:
            sandbox = client.create_sandbox()
            sandbox.run_code("1")  # the interpreter is warm before timing

            def health() -> None:
                assert http.get(f"{base}/health", timeout=30).status_code == 200

            def code() -> None:
                sandbox.run_code("1")

            alone = {"health": latencies(health, args.requests), "run_code": latencies(code, 20)}
            flood = SlowFlood(host, int(port), args.slow_clients)
            flood.start()
            time.sleep(2)
            try:
                flooded = under_flood(health, code, args.seconds, server.pid)
            finally:
                flood.stop()
            flooded["flood_reconnects_after_cut_or_eviction"] = flood.reconnects
            sandbox.delete()
        time.sleep(1)
        heads = held_heads(host, int(port), server.pid, args.head_clients)
        big = oversized_heads(host, int(port), server.pid, args.head_clients)
    met_latency = max(flooded["health"]["p99_ms"], flooded["run_code"]["p99_ms"]) < GOAL_P99_MS
    met_memory = max(heads["held_mib_over_idle"], big["peak_mib_over_idle"]) < GOAL_MB
    report(
        "hostile clients (issue 23)",
        {
            "connection_cap": cap,
            "open_file_limit": {"server": server_files, "benchmark": open_file_limit()},
            "slow_clients": args.slow_clients,
            "alone": alone,
            "under_slow_flood": flooded,
            "latency_goal": f"p99 < {GOAL_P99_MS} ms: {verdict(met_latency)}",
            f"{args.head_clients}_held_maximal_heads": heads,
            f"{args.head_clients}_oversized_heads_6.3MB": big,
            "memory_goal": f"< {GOAL_MB} MiB above idle: {verdict(met_memory)}",
        },
        args.json,
    )


if __name__ == "__main__":
    main()
