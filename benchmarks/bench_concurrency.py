"""Concurrency: 64 threads x 20 run_code calls against the real execd, one context per thread.

The real execd (``shared/opensandbox-execd``, a Go server) behind a stub lifecycle
(``_real_execd.py``; ``--target local`` uses the local server instead). execd answers "session is
busy" to two runs in one context, so ``--threads`` contexts are made first, outside the timing,
and thread i of every client runs in context i. Each client runs in a worker process of its own
(``peers.py``): osb_sync with one Client of ``pool_maxsize=threads`` shared by every thread (a
sandbox object per thread), the official SDK with a ``SandboxSync`` + ``CodeInterpreterSync``
per thread (its documented pattern), and with ``--baseline DIR`` the osb_sync of another tree.
Each repetition starts the threads at a barrier; medians of ``--reps`` repetitions whose order
rotates: throughput, client CPU per call, p50/p99 latency, and TCP connections opened
(``socket.connect`` of the worker) during set-up plus a warm-up round, per measured round, and
per host over the whole run (the pool holds ``pool_maxsize`` per host: lifecycle and execd are
two hosts here).
The script re-runs itself in a loopback-only network namespace.

    /tmp/bench-venv/bin/python benchmarks/bench_concurrency.py --baseline ../osb-base
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import WorkerProcess, isolate_network, local_server, median, report, rotated, verdict
from _real_execd import create_contexts, real_execd, stub_lifecycle
from peers import SKIP_SDK_HEALTH

HERE = str(Path(__file__).resolve().parents[1])
KEYS = ("throughput", "cpu_ms_per_call", "p50_ms", "p99_ms", "sockets")


@contextlib.contextmanager
def target(name: str, threads: int) -> Iterator[tuple[str, list[str]]]:
    """(api_base, one context id per thread) on the real execd or the local server."""
    if name == "local":
        with local_server() as server:
            yield server.api_base, [""] * threads  # "": each thread's own sandbox's default
        return
    os.environ[SKIP_SDK_HEALTH] = "1"
    try:
        with real_execd() as endpoint, stub_lifecycle(endpoint) as api_base:
            yield api_base, create_contexts(endpoint, threads)
    finally:
        del os.environ[SKIP_SDK_HEALTH]


def summary(rounds: list[dict[str, Any]], setup: int) -> dict[str, Any]:
    out: dict[str, Any] = {key: round(median([r[key] for r in rounds]), 2) for key in KEYS}
    out["all_throughput"] = [round(r["throughput"], 1) for r in rounds]
    out["failures"] = sum(r["failures"] for r in rounds)
    out["failure_example"] = next((r["failure_example"] for r in rounds if r["failures"]), [])
    out["connections_setup_and_warmup"] = setup
    out["connections_total"] = setup + sum(r["sockets"] for r in rounds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--target", default="execd", choices=["execd", "local"])
    parser.add_argument("--baseline", help="another source tree's osb_sync, measured alongside")
    parser.add_argument("--json")
    args = parser.parse_args()
    clients = {"osb_sync": HERE, "opensandbox": HERE}
    if args.baseline:
        clients["osb_sync_baseline"] = str(Path(args.baseline).resolve())
    rounds: dict[str, list[dict[str, Any]]] = {}
    setup: dict[str, int] = {}
    errors: dict[str, str] = {}
    per_host: dict[str, dict[str, int]] = {}
    with target(args.target, args.threads) as (api_base, contexts):
        workers: dict[str, WorkerProcess] = {}
        try:
            for label, tree in clients.items():
                peer = "opensandbox" if label == "opensandbox" else "osb_sync"
                worker = WorkerProcess(peer, api_base, tree, pool_maxsize=args.threads)
                try:
                    setup[label] = worker.ask("threads", contexts=contexts)["connections_setup"]
                except RuntimeError as exc:
                    errors[label] = str(exc)
                    worker.stop()
                    continue
                workers[label] = worker
                rounds[label] = []
            for rep in range(args.reps):
                for label in rotated(list(workers), rep):
                    rounds[label].append(workers[label].ask("round", n=args.calls))
            for label, worker in workers.items():
                per_host[label] = worker.ask("connections")["by_address"]
        finally:
            for worker in workers.values():
                worker.stop()
    results = {label: summary(runs, setup[label]) for label, runs in rounds.items()}
    for label, values in results.items():
        values["connections_per_host"] = per_host.get(label, {})
        values["most_connections_to_one_host"] = max(per_host.get(label, {}).values(), default=0)
    mine, sdk = results.get("osb_sync"), results.get("opensandbox")
    goals = {}
    if mine:
        goals["connections per host <= pool size"] = verdict(
            mine["most_connections_to_one_host"] <= args.threads
        )
    if mine and sdk:
        goals["throughput at least the official SDK's"] = verdict(
            mine["throughput"] >= sdk["throughput"]
        )
        for values in results.values():
            values["throughput_vs_sdk"] = round(values["throughput"] / sdk["throughput"], 3)
            values["cpu_vs_sdk"] = round(values["cpu_ms_per_call"] / sdk["cpu_ms_per_call"], 3)
    report(
        "concurrency",
        {
            "target": args.target,
            "threads": args.threads,
            "calls_per_thread": args.calls,
            "reps": args.reps,
            "load_average": os.getloadavg(),
            "results": results,
            "errors": errors,
            "goals": goals,
        },
        args.json,
    )


if __name__ == "__main__":
    isolate_network()
    main()
