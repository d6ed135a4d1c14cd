"""gunicorn, 4 workers, a pool of 4, 50 concurrent requests: per-process pools vs one shared pool.

    python benchmarks/bench_gunicorn_pool.py [--rounds 5] [--seconds 20] [--json FILE]

Starts the local server (its own process, ``osb-sync serve --port 0``) and a redis-server
(loopback port from ``bind(0)``, nothing saved; ``tests/redisserver.py``), then, every round,
for each mode (the order rotates every round): gunicorn serving ``_gunicorn_app.py`` with
``--workers`` sync workers, each with ``OPENSANDBOX_POOL_SIZE=--size``

- ``per-process``: the default in-memory store, one pool per worker (``max_size``: the size);
- ``shared``: ``OPENSANDBOX_POOL_REDIS_URL``, one pool for every worker (``max_size``: the
  size, so the sandboxes lent count against the 4);
- ``shared, max_size=size+workers``: the same with room for one lent sandbox per worker on
  top of the idle ones.

A round: wait for ``/up``, one untimed burst of ``--concurrency`` requests (every worker makes
its pool), wait until the server's count of the pool's sandboxes is steady, then
``--concurrency`` threads post ``/run`` (``print(6 * 7)``) back to back for ``--seconds``.
Figures per round: requests answered, their p50/p99 latency (sent until answered, gunicorn's
queue included), warm idle sandboxes kept afterwards (the pool's sandboxes on the server via
``list_sandboxes``, once steady with no request in flight), peak alive during the load
(sampled every 0.1 s), creates (each worker counts its ``create_sandbox`` calls in a file).
After SIGTERM to gunicorn no sandbox may remain on the server: the script exits 1 if one does.
Prints min/median/max over the rounds per mode, and each mode's medians over per-process's.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import local_server, median, percentile, report, rotated  # noqa: E402
from osb_sync import Client  # noqa: E402
from tests.redisserver import free_port, own_redis, wait_until_up  # noqa: E402

POOL_KEY = "osb_sync.pool"  # the documented tag of every pooled sandbox
WIDE = "shared, max_size=size+workers"
MODES = ("per-process", "shared", WIDE)


class Leak(RuntimeError):
    """Sandboxes left on the server after a round."""


def pooled(client: Client, name: str) -> int:
    """The pool's sandboxes alive on the server."""
    return len(list(client.list_sandboxes(metadata={POOL_KEY: name})))


def steady(client: Client, name: str, at_least: int, limit: float = 60) -> int:
    """Wait until the pool's count on the server is ``>= at_least`` and unchanged for 2 s."""
    deadline = time.monotonic() + limit
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = pooled(client, name)
        if now != last:
            last, since = now, time.monotonic()
        elif now >= at_least and time.monotonic() - since >= 2:
            return now
        time.sleep(0.1)
    raise RuntimeError(f"pool {name}: {last} sandboxes, not steady at >= {at_least} in {limit} s")


def creates(counts: Path) -> int:
    """Every worker's ``create_sandbox`` calls so far."""
    return sum(len(p.read_text().splitlines()) for p in counts.iterdir())


def post(http: requests.Session, url: str) -> float:
    """Seconds one ``/run`` took (the answer checked)."""
    started = time.perf_counter()
    answer = http.post(url, timeout=180)
    elapsed = time.perf_counter() - started
    if answer.status_code != 200 or answer.json().get("stdout") != "42\n":
        raise RuntimeError(f"/run answered {answer.status_code}: {answer.text[:200]}")
    return elapsed


def load(url: str, concurrency: int, seconds: float) -> tuple[list[float], list[str]]:
    """``concurrency`` threads posting back to back until ``seconds`` pass: latencies, errors."""
    stop_at = time.monotonic() + seconds
    latencies: list[float] = []
    errors: list[str] = []

    def client_thread() -> None:
        with requests.Session() as http:
            while time.monotonic() < stop_at:
                try:
                    latencies.append(post(http, url))
                except Exception as exc:  # reported, and the run fails below
                    errors.append(repr(exc)[:200])

    with ThreadPoolExecutor(concurrency) as executor:
        for future in [executor.submit(client_thread) for _ in range(concurrency)]:
            future.result()
    return latencies, errors


def round_of(mode: str, api_base: str, redis_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One mode, one round: gunicorn up, warm-up, load, idle count, SIGTERM, leak check."""
    name = f"bench-{MODES.index(mode)}-{secrets.token_hex(3)}"
    work = Path(tempfile.mkdtemp(prefix="bench-gunicorn-"))
    counts = work / "creates"
    counts.mkdir()
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
        "B_API_BASE": api_base,
        "B_REDIS_URL": "" if mode == "per-process" else redis_url,
        "B_POOL_NAME": name,
        "B_POOL_SIZE": str(args.size),
        "B_POOL_MAX_SIZE": str(args.size + args.workers) if mode == WIDE else "",
        "B_COUNTS": str(counts),
    }
    command = [sys.executable, "-m", "gunicorn", "-w", str(args.workers),
               "-b", f"127.0.0.1:{port}", "--timeout", "120", "--graceful-timeout", "30",
               "_gunicorn_app:app"]  # fmt: skip
    log_path = work / "gunicorn.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    peak, stop = [0], threading.Event()
    with Client(api_base) as client:

        def sample() -> None:
            while not stop.wait(0.1):
                peak[0] = max(peak[0], pooled(client, name))

        try:
            wait_until_up(f"{base}/up", 60, server, log_path)
            with ThreadPoolExecutor(args.concurrency) as executor, requests.Session() as http:
                list(executor.map(lambda _: post(http, f"{base}/run"), range(args.concurrency)))
            before = steady(client, name, args.size)
            created_before = creates(counts)
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            latencies, errors = load(f"{base}/run", args.concurrency, args.seconds)
            stop.set()
            sampler.join(10)
            created = creates(counts) - created_before
            kept = steady(client, name, args.size)
        finally:
            stop.set()
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(90)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        deadline = time.monotonic() + 30
        left = list(client.list_sandboxes())
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = list(client.list_sandboxes())
        if left:
            for info in left:
                client.delete_quietly(info.id)
            raise Leak(f"{mode}: {len(left)} sandboxes left after SIGTERM: {[i.id for i in left]}")
    if errors:
        raise RuntimeError(f"{mode}: {len(errors)} failed requests, first: {errors[0]}")
    ms = [s * 1000 for s in latencies]
    return {
        "requests": len(ms),
        "p50_ms": round(median(ms), 1),
        "p99_ms": round(percentile(ms, 99), 1),
        "warm_before": before,
        "warm_kept": kept,
        "alive_peak": peak[0],
        "creates_during_load": created,
        "creates_total": creates(counts),
    }


def spread(rounds: list[dict[str, Any]], key: str) -> list[float]:
    """min / median / max of one figure over the rounds."""
    values = [r[key] for r in rounds]
    return [min(values), median(values), max(values)]


def main() -> None:
    """Run the interleaved rounds, print the summary (exit 1 on a leak)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--size", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    load_start = os.getloadavg()
    try:
        with local_server() as local, own_redis(Path(tempfile.mkdtemp())) as redis:
            for n in range(args.rounds):
                for mode in rotated(list(MODES), n):
                    figures = round_of(mode, local.api_base, redis.url, args)
                    results[mode].append(figures)
                    print(f"round {n + 1} {mode}: {figures}", file=sys.stderr, flush=True)
    except Leak as leak:
        sys.exit(f"LEAK: {leak}")
    keys = list(results[MODES[0]][0])
    summary = {mode: {key: spread(rounds, key) for key in keys} for mode, rounds in results.items()}
    ratios = {
        mode: {
            key: round(summary[mode][key][1] / summary["per-process"][key][1], 2)
            for key in keys
            if summary["per-process"][key][1]
        }
        for mode in MODES[1:]
    }
    report(
        "gunicorn: per-process pools vs one shared pool",
        {
            "settings": vars(args),
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
            "min_median_max": summary,
            "over_per_process_medians": ratios,
            "rounds": results,
        },
        args.json,
    )


if __name__ == "__main__":
    main()
