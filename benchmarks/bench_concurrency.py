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
``--share`` puts every thread of a client on the one sandbox it opened (local server):
``--call get`` makes ``get_sandbox`` calls (the lifecycle server, cheap: the pool and the
client's own cost show), ``--call run`` ``run_code`` in ``--contexts`` code contexts of that
sandbox, thread i in context i % contexts, the threads of one context taking turns.
``--threads`` may list counts (``1,8,64,256``), each measured on its own; ``--pool-maxsize``
sets the osb_sync pool (default: the thread count), ``--pool-block`` makes it
``Client(pool_block=True)`` (a tree without it fails: reported under ``errors``); ``--no-sdk``
leaves the official SDK out.
Each round also reports the worker's threads after it (Python's and the OS's: leaks show).
The script re-runs itself in a loopback-only network namespace.

    /tmp/bench-venv/bin/python benchmarks/bench_concurrency.py --baseline ../osb-base
    python benchmarks/bench_concurrency.py --target local --share --call get --threads 256 \
        --pool-maxsize 32 --no-sdk --baseline ../osb-base
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
from peers import POOL_BLOCK, SKIP_SDK_HEALTH

HERE = str(Path(__file__).resolve().parents[1])
KEYS = ("throughput", "cpu_ms_per_call", "p50_ms", "p99_ms", "sockets")
SPREAD = ("throughput", "cpu_ms_per_call", "sockets", "threads_after", "os_threads_after")


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
    for key in SPREAD:  # min / median / max over the rounds
        values = [r[key] for r in rounds]
        out[f"{key}_min_med_max"] = [round(min(values), 2), round(median(values), 2), max(values)]
    out["failures"] = sum(r["failures"] for r in rounds)
    out["failure_example"] = next((r["failure_example"] for r in rounds if r["failures"]), [])
    out["connections_setup_and_warmup"] = setup
    out["connections_total"] = setup + sum(r["sockets"] for r in rounds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="64", help="a count, or a list: 1,8,64,256")
    parser.add_argument("--share", action="store_true", help="every thread on one sandbox")
    parser.add_argument("--call", default="run", choices=["run", "get"], help="with --share")
    parser.add_argument("--contexts", type=int, default=16, help="--share --call run: contexts")
    parser.add_argument("--pool-maxsize", type=int, help="osb_sync's pool (default: threads)")
    parser.add_argument("--no-sdk", action="store_true", help="osb_sync trees only")
    parser.add_argument("--pool-block", action="store_true", help="Client(pool_block=True)")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--target", default="execd", choices=["execd", "local"])
    parser.add_argument("--baseline", help="another source tree's osb_sync, measured alongside")
    parser.add_argument("--json")
    args = parser.parse_args()
    clients = {"osb_sync": HERE, "opensandbox": HERE}
    if args.no_sdk:
        del clients["opensandbox"]
    if args.baseline:
        clients["osb_sync_baseline"] = str(Path(args.baseline).resolve())
    if args.pool_block:
        os.environ[POOL_BLOCK] = "1"  # the workers' osb_sync: Client(pool_block=True)
    counts = [int(n) for n in args.threads.split(",")]
    runs = []
    for threads in counts:
        args.threads = threads
        runs.append(measure(args, clients))
    if len(runs) == 1:
        report("concurrency", runs[0], args.json)
    else:
        report("concurrency", {"by_threads": runs}, args.json)


def measure(args: argparse.Namespace, clients: dict[str, str]) -> dict[str, Any]:
    """One thread count: set-up, warm-up and ``--reps`` rounds of every client, interleaved."""
    pool = args.pool_maxsize or args.threads
    rounds: dict[str, list[dict[str, Any]]] = {}
    setup: dict[str, int] = {}
    errors: dict[str, str] = {}
    per_host: dict[str, dict[str, int]] = {}
    with target(args.target, args.threads) as (api_base, contexts):
        workers: dict[str, WorkerProcess] = {}
        try:
            for label, tree in clients.items():
                peer = "opensandbox" if label == "opensandbox" else "osb_sync"
                worker = WorkerProcess(peer, api_base, tree, pool_maxsize=pool)
                try:
                    if args.share:
                        worker.ask("open")
                        answer = worker.ask(
                            "shared_threads",
                            n=args.threads,
                            call=args.call,
                            n_contexts=args.contexts,
                        )
                    else:
                        answer = worker.ask("threads", contexts=contexts)
                    setup[label] = answer["connections_setup"]
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
    for label, values in results.items():
        if label.startswith("osb_sync"):
            key = f"{label}: connections per host <= pool_maxsize ({pool})"
            goals[key] = verdict(values["most_connections_to_one_host"] <= pool)
            key = f"{label}: no new connection in the measured rounds (pool warm)"
            goals[key] = verdict(
                values["connections_total"] == values["connections_setup_and_warmup"]
            )
    if mine and sdk:
        goals["throughput at least the official SDK's"] = verdict(
            mine["throughput"] >= sdk["throughput"]
        )
        for values in results.values():
            values["throughput_vs_sdk"] = round(values["throughput"] / sdk["throughput"], 3)
            values["cpu_vs_sdk"] = round(values["cpu_ms_per_call"] / sdk["cpu_ms_per_call"], 3)
    return {
        "target": args.target,
        "share": args.share,
        "call": args.call if args.share else "run",
        "pool_maxsize": pool,
        "pool_block": args.pool_block,
        "threads": args.threads,
        "calls_per_thread": args.calls,
        "reps": args.reps,
        "load_average": os.getloadavg(),
        "results": results,
        "errors": errors,
        "goals": goals,
    }


if __name__ == "__main__":
    isolate_network()
    main()
