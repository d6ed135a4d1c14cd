"""Latency of one ``print(1)`` request through the Flask example: warm pool vs create per request.

Usage: python benchmarks/flask_latency.py [--requests 30] [--pool-size 2]

The local server runs in its own process (``osb-sync serve``); the Flask example app
(``examples/flask_app.py``) is served over loopback HTTP by werkzeug in a thread, plus a
``/run-fresh`` route that creates a sandbox, runs the code and deletes it inside the request
(``client.code_interpreter_tool``). Modes, each timed over sequential requests after three
untimed ones:

- ``pool (reuse=never)``: before each request the pool is full again (the used sandbox
  deleted and replaced), so every request finds a warm sandbox;
- ``pool (reuse=reset)``: the same sandbox, cleaned after each request;
- ``create per request``;
- ``one warm kernel``: the same sandbox every time, its kernel already started: the floor
  (what a pool that also started each sandbox's kernel ahead of time would approach).

Prints p50 and p90 in milliseconds for each mode.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import requests
from werkzeug.serving import make_server

import osb_sync

POOL_KEY = "osb_sync.pool"  # the documented tag of every pooled sandbox

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "flask_app.py"
WARMUP = 3


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_example() -> Any:
    """examples/flask_app.py as a module."""
    spec = importlib.util.spec_from_file_location("flask_app", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_for_server(api_base: str) -> None:
    """Wait until the local server answers /health."""
    deadline = time.monotonic() + 15
    while True:
        try:
            requests.get(api_base.removesuffix("/v1") + "/health", timeout=1)
            return
        except requests.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def serve(app: Any) -> tuple[str, Callable[[], None]]:
    """Serve a WSGI app on a free port in a thread; returns its URL and a stop function."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        thread.join(10)

    return f"http://127.0.0.1:{server.server_port}", stop


def timed(http: requests.Session, url: str) -> float:
    """Seconds one ``print(1)`` request takes (checked for the right answer)."""
    started = time.perf_counter()
    response = http.post(url, data="print(1)", timeout=60)
    elapsed = time.perf_counter() - started
    if response.status_code != 200 or response.json().get("stdout") != "1\n":
        raise RuntimeError(f"unexpected answer {response.status_code}: {response.text[:200]}")
    return elapsed


class PoolRefilled:
    """Called before each request: waits until the pool holds ``size`` sandboxes again and,
    with reuse="never", the sandbox of the previous request has been replaced."""

    def __init__(self, client: osb_sync.Client, name: str, size: int, replaced: bool):
        self.client, self.name, self.size, self.replaced = client, name, size, replaced
        self.previous: set[str] | None = None

    def __call__(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ids = {info.id for info in self.client.list_sandboxes(metadata={POOL_KEY: self.name})}
            fresh = self.previous is None or not self.replaced or ids != self.previous
            if len(ids) >= self.size and fresh:
                self.previous = ids
                return
            time.sleep(0.02)
        raise RuntimeError("the pool did not refill within 30 s")


def measure(
    http: requests.Session, url: str, count: int, before: Callable[[], None] = lambda: None
) -> list[float]:
    """``count`` timed requests after the untimed warm-up; ``before`` runs before each."""
    samples = []
    for n in range(WARMUP + count):
        before()
        elapsed = timed(http, url)
        if n >= WARMUP:
            samples.append(elapsed)
    return samples


def report(label: str, samples: list[float]) -> None:
    """Print p50 and p90 in milliseconds."""
    ms = sorted(s * 1000 for s in samples)
    p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
    print(f"{label:<22} p50 {statistics.median(ms):7.1f} ms   p90 {p90:7.1f} ms   n={len(ms)}")


def main() -> None:
    """Run every mode and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--pool-size", type=int, default=2)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    port = free_port()
    api_base = f"http://127.0.0.1:{port}/v1"
    server = subprocess.Popen(
        [sys.executable, "-m", "osb_sync", "serve", "--port", str(port),
         "--allow-unenforced-network-policy"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    example = load_example()
    results: dict[str, list[float]] = {}
    try:
        wait_for_server(api_base)
        with osb_sync.Client(api_base) as client, requests.Session() as http:
            for reuse in ("never", "reset"):
                app = example.create_app(
                    api_base, OPENSANDBOX_REUSE=reuse, OPENSANDBOX_POOL_SIZE=args.pool_size
                )
                pool = example.sandboxes.get_pool(app)
                url, stop = serve(app)
                refilled = PoolRefilled(client, pool.name, args.pool_size, reuse == "never")
                try:
                    results[f"pool (reuse={reuse})"] = measure(
                        http, f"{url}/run", args.requests, refilled
                    )
                finally:
                    stop()
                    example.sandboxes.close(app)

            app = example.create_app(api_base)
            warm = client.create_sandbox()
            warm.run_code("pass")  # its kernel is running

            @app.post("/run-fresh")
            def run_fresh() -> Any:
                return client.code_interpreter_tool("print(1)").to_dict()

            @app.post("/run-warm")
            def run_warm() -> Any:
                return warm.run_code("print(1)").to_dict()

            url, stop = serve(app)
            try:
                results["create per request"] = measure(http, f"{url}/run-fresh", args.requests)
                results["one warm kernel"] = measure(http, f"{url}/run-warm", args.requests)
            finally:
                stop()
                warm.delete()
    finally:
        server.terminate()
        server.wait(10)
    print(f"print(1) through the Flask example, {args.requests} sequential requests per mode")
    for label, samples in results.items():
        report(label, samples)


if __name__ == "__main__":
    main()
