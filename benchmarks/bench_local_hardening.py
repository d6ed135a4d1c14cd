"""Local server hardening: /health latency under slow clients, peak RSS under amplification.

The server runs in its own process (``python -m osb_sync serve``). Figures:

- ``/health`` p50/p99 over ``--requests`` sequential requests, alone and while 200 slow clients
  each hold a connection dribbling header bytes;
- the server's peak RSS above idle (VmHWM after ``clear_refs``) for each amplification case of
  issue 10: ``/files/replace`` on a 200 MB file, 200 MB of command logs (the sandbox's execd
  keeps the newest 4 MiB; its own peak RSS is shown too), a 200 MB multipart part header
  without terminator, 200 MB written by sandbox code to the worker's reply pipe, eight 16 MB
  JSON arrays at once; goal: below 64 MB each.

    python benchmarks/bench_local_hardening.py [--size-mb 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import requests
from _common import local_server, median, percentile, proc_stats, report, verdict

from osb_sync.local.execd.output import LOG_LIMIT, dropped_marker

GOAL_MB = 64
CREATE = {
    "image": {"uri": "opensandbox/code-interpreter:v1.1.0"},
    "entrypoint": ["/bin/sh"],
    "resourceLimits": {"cpu": "1", "memory": "1Gi"},
}


class Target:
    """The server process and one sandbox on it."""

    def __init__(self, pid: int, api_base: str) -> None:
        self.pid = pid
        self.api_base = api_base
        self.host, self.port = api_base.split("//")[1].split("/")[0].split(":")
        self.http = requests.Session()
        sandbox = self.http.post(f"{api_base}/sandboxes", json=CREATE, timeout=60).json()
        endpoint = self.http.get(
            f"{api_base}/sandboxes/{sandbox['id']}/endpoints/44772", timeout=60
        ).json()
        self.execd = f"http://{endpoint['endpoint']}"
        self.execd_path = "/" + endpoint["endpoint"].split("/", 1)[1]
        self.headers: dict[str, str] = endpoint["headers"]

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return self.http.request(method, self.execd + path, headers=headers, **kwargs)

    def run(self, command: str, timeout: float = 600) -> None:
        answer = self.call("POST", "/command", json={"command": command}, timeout=timeout)
        assert answer.status_code == 200 and b'"execution_complete"' in answer.content, answer.text

    def execd_peak_kib(self) -> int:
        """The peak RSS of the sandbox's execd (the parent of its commands)."""
        answer = self.call(
            "POST", "/command", json={"command": "grep VmHWM /proc/$PPID/status"}, timeout=60
        )
        line = next(e for e in answer.content.split(b"\n\n") if b"VmHWM" in e)
        return int(json.loads(line)["text"].split()[1])

    def rss_kib(self) -> int:
        return proc_stats(self.pid)["rss_kib"]

    @contextmanager
    def peak_above_idle(self) -> Iterator[dict[str, float]]:
        """The server's peak RSS (MB) above its RSS at the start of the block."""
        with open(f"/proc/{self.pid}/clear_refs", "w") as handle:
            handle.write("5")
        idle = self.rss_kib()
        out: dict[str, float] = {}
        started = time.perf_counter()
        yield out
        out["seconds"] = round(time.perf_counter() - started, 2)
        out["peak_mb_over_idle"] = round((proc_stats(self.pid)["peak_kib"] - idle) / 1024, 1)


def health_latencies(target: Target, count: int) -> dict[str, float]:
    url = f"{target.api_base.rsplit('/v1', 1)[0]}/health"
    times = []
    with requests.Session() as http:
        for _ in range(count):
            started = time.perf_counter()
            assert http.get(url, timeout=30).status_code == 200
            times.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": round(median(times), 2), "p99_ms": round(percentile(times, 99), 2)}


def with_slow_clients(target: Target, clients: int, body: Callable[[], Any]) -> Any:
    """Run `body` while `clients` connections send one header byte per second each."""
    socks = []
    for _ in range(clients):
        sock = socket.create_connection((target.host, int(target.port)))
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        socks.append(sock)
    stop = threading.Event()

    def dribble() -> None:
        while not stop.wait(1.0):
            for sock in socks:
                try:
                    sock.sendall(b"x")
                except OSError:
                    pass

    thread = threading.Thread(target=dribble, daemon=True)
    thread.start()
    try:
        return body()
    finally:
        stop.set()
        thread.join()
        for sock in socks:
            sock.close()


def case_replace(target: Target, size: int) -> dict[str, float]:
    target.run(f"yes 'old text here' | head -c {size} > big.txt")
    with target.peak_above_idle() as out:
        answer = target.call(
            "POST", "/files/replace", json={"big.txt": {"old": "old", "new": "new!"}}, timeout=600
        )
    assert answer.status_code == 200, answer.text
    target.run("rm big.txt")
    return out


def case_logs(target: Target, size: int) -> dict[str, float]:
    started = target.call(
        "POST",
        "/command",
        json={"command": f"head -c {size} /dev/zero | tr '\\0' x", "background": True},
        timeout=60,
    )
    command_id = json.loads(started.content.split(b"\n\n")[0])["text"]
    while target.call("GET", f"/command/status/{command_id}", timeout=60).json()["running"]:
        time.sleep(0.2)
    with target.peak_above_idle() as out:
        with target.call("GET", f"/command/{command_id}/logs", stream=True, timeout=600) as logs:
            received = sum(len(piece) for piece in logs.iter_content(1 << 16))
    # The sandbox's execd keeps the newest LOG_LIMIT bytes, after a marker.
    assert received == LOG_LIMIT + len(dropped_marker(size - LOG_LIMIT)), received
    out["execd_peak_mb"] = round(target.execd_peak_kib() / 1024, 1)
    return out


def case_part_header(target: Target, size: int) -> dict[str, float]:
    head = (
        f"POST {target.execd_path}/files/upload HTTP/1.1\r\nHost: 127.0.0.1:{target.port}\r\n"
        f"X-EXECD-ACCESS-TOKEN: {target.headers['X-EXECD-ACCESS-TOKEN']}\r\n"
        f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {size + 200}\r\n\r\n"
        "--b\r\nContent-Disposition: form-data; name=file; filename=f\r\nX-Junk: "
    ).encode()
    junk = b"y" * (1 << 20)
    with target.peak_above_idle() as out:
        with socket.create_connection((target.host, int(target.port)), timeout=60) as sock:
            sock.sendall(head)
            sent = 0
            try:
                while sent < size:
                    sock.sendall(junk)
                    sent += len(junk)
            except OSError:
                pass  # the server answered and closed
            status = sock.recv(100).split(b" ")[1]
    out["status"] = int(status)
    out["mb_sent_before_refusal"] = round(sent / (1 << 20), 1)
    return out


def case_reply_pipe(target: Target, size: int) -> dict[str, float]:
    code = f"import os, sys\nos.write(int(sys.argv[2]), b'x' * {size})"
    body = {"code": code, "context": {"language": "python"}}
    with target.peak_above_idle() as out:
        answer = target.call("POST", "/code", json=body, timeout=900)
    assert b"DeadKernelError" in answer.content, answer.content[-300:]
    return out


def case_json_arrays(target: Target) -> dict[str, float]:
    array = b"[" + b"1," * (8 << 20) + b"1]"  # 16 MB
    url = f"{target.api_base}/sandboxes"

    def post(_: int) -> tuple[int, int]:
        answer = requests.post(
            url, data=array, headers={"Content-Type": "application/json"}, timeout=120
        )
        return answer.status_code, len(answer.content)

    with target.peak_above_idle() as out, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, range(8)))
    out["statuses"] = sorted({status for status, _ in answers})  # type: ignore[assignment]
    out["largest_answer_bytes"] = max(size for _, size in answers)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--slow-clients", type=int, default=200)
    parser.add_argument("--json")
    args = parser.parse_args()
    size = args.size_mb * 1_000_000
    with local_server() as server:
        target = Target(server.pid, server.api_base)
        idle = round(target.rss_kib() / 1024, 1)
        health = {
            "alone": health_latencies(target, args.requests),
            f"with_{args.slow_clients}_slow_clients": with_slow_clients(
                target, args.slow_clients, lambda: health_latencies(target, args.requests)
            ),
        }
        cases = {
            "files_replace": case_replace(target, size),
            "command_logs": case_logs(target, size),
            "multipart_part_header": case_part_header(target, size),
            "worker_reply_pipe": case_reply_pipe(target, size),
            "eight_16mb_json_arrays": case_json_arrays(target),
        }
    worst = max(case["peak_mb_over_idle"] for case in cases.values())
    report(
        "local server hardening",
        {
            "server_idle_rss_mb": idle,
            "health": health,
            "amplification": cases,
            "goal": f"every case below {GOAL_MB} MB over idle: {verdict(worst < GOAL_MB)}",
        },
        args.json,
    )


if __name__ == "__main__":
    main()
