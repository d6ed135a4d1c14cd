"""Concurrency: 64 threads x 20 run_code calls, each thread in its own sandbox.

osb_sync: one Client with ``pool_maxsize=64`` shared by all threads. The official SDK: one
``SandboxSync`` + ``CodeInterpreterSync`` per thread (its documented pattern). Sandboxes are
made once per client; each repetition starts the threads at a barrier. Reported, medians of
``--reps`` interleaved repetitions: throughput, p50/p99 latency, and TCP connections opened
during set-up plus a concurrent warm-up round, and during the measured rounds
(``socket.connect`` calls, whatever the library; for osb_sync also urllib3's
``create_connection``). The script re-runs itself in a loopback-only namespace.

    /tmp/bench-venv/bin/python benchmarks/bench_concurrency.py
"""

from __future__ import annotations

import argparse
import threading
import time
import traceback
from typing import Any

from _common import (
    ConnectionCounter,
    isolate_network,
    local_server,
    median,
    percentile,
    report,
    verdict,
)
from peers import OpenSandboxSdk, OsbSync


def make_workers(name: str, api_base: str, threads: int) -> list[Any]:
    """One object per thread with a ``run_once()``: sandboxes made, warmed up."""
    if name == "osb_sync":
        shared = OsbSync(api_base, pool_maxsize=threads)
        workers = []
        for _ in range(threads):
            worker = OsbSync.__new__(OsbSync)
            worker.client = shared.client
            worker.open()
            workers.append(worker)
    else:
        workers = [OpenSandboxSdk(api_base) for _ in range(threads)]
        for worker in workers:
            worker.open()
    for worker in workers:
        worker.run_once()
    return workers


def one_round(workers: list[Any], calls: int, counter: ConnectionCounter) -> dict[str, Any]:
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(workers) + 1)

    def work(worker: Any) -> None:
        barrier.wait()
        mine = []
        for _ in range(calls):
            started = time.perf_counter()
            try:
                worker.run_once()
            except Exception as exc:
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    before = counter.sockets, counter.urllib3
    barrier.wait()
    started, cpu = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.join()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "throughput": len(latencies) / wall,
        "client_cpu_ms_per_call": cpu / len(latencies) * 1e3,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "sockets": counter.sockets - before[0],
        "urllib3": counter.urllib3 - before[1],
        "failures": len(failures),
        "failure_example": failures[:1],
    }


def close_all(name: str, workers: list[Any]) -> None:
    for worker in workers:
        if name == "osb_sync":
            worker.sandbox.delete()
        else:
            worker.close()
    if name == "osb_sync" and workers:
        workers[0].client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()

    rounds: dict[str, list[dict[str, Any]]] = {}
    errors: dict[str, str] = {}
    opened: dict[str, int] = {}
    with local_server() as server, ConnectionCounter() as counter:
        workers: dict[str, list[Any]] = {}
        for name in ("osb_sync", "opensandbox"):
            counter.reset()
            try:
                workers[name] = make_workers(name, server.api_base, args.threads)
                one_round(workers[name], 2, counter)  # warm up concurrently
                rounds[name] = []
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc} | {traceback.format_exc(-1)}"
            opened[name] = counter.sockets  # set-up and warm-up: every connection it needed
        names = list(workers)
        for rep in range(args.reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                rounds[name].append(one_round(workers[name], args.calls, counter))
        for name, group in workers.items():
            close_all(name, group)

    results: dict[str, Any] = {}
    for name, runs in rounds.items():
        results[name] = {
            key: round(median([r[key] for r in runs]), 2)
            for key in (
                "throughput",
                "client_cpu_ms_per_call",
                "p50_ms",
                "p99_ms",
                "sockets",
                "urllib3",
            )
        }
        results[name]["failures"] = sum(r["failures"] for r in runs)
        results[name]["failure_example"] = next(
            (r["failure_example"] for r in runs if r["failure_example"]), []
        )
        results[name]["all_throughput"] = [round(r["throughput"], 1) for r in runs]
        results[name]["connections_setup_and_warmup"] = opened[name]
    mine, sdk = results.get("osb_sync"), results.get("opensandbox")
    goals = {}
    if mine:
        goals["connections <= pool size"] = verdict(
            opened["osb_sync"] + sum(r["sockets"] for r in rounds["osb_sync"]) <= args.threads
        )
    if mine and sdk:
        goals["higher throughput than the official SDK"] = verdict(
            mine["throughput"] > sdk["throughput"]
        )
    report(
        "concurrency",
        {
            "threads": args.threads,
            "calls_per_thread": args.calls,
            "reps": args.reps,
            "results": results,
            "errors": errors,
            "goals": goals,
        },
        args.json,
    )


if __name__ == "__main__":
    isolate_network()
    main()
