"""Client overhead: client CPU per ``run_code("pass")``, ``commands.run("true")``, 1 KB upload
and ``get_sandbox`` (the SDK: ``files.write_file``, ``get_info``).

osb_sync against the official ``opensandbox`` sync SDK (+ ``opensandbox-code-interpreter``),
and against osb_sync of another source tree (``--baseline DIR``: e.g. a worktree of main), doing
the same calls on two servers:

- ``local``: the local server (``osb-sync serve``, a separate process);
- ``execd``: the real execd (``shared/opensandbox-execd``, a Go server) reached directly by
  every client through a stub lifecycle that answers create/get/endpoint with its address
  (``_real_execd.py``), so that what shows is the client's own cost.

Each client runs in a worker process of its own (``peers.py``), so CPU is
``time.process_time`` of that process alone, per call; medians of ``--reps`` repetitions whose
order rotates. The script re-runs itself in a loopback-only network namespace.

    /tmp/bench-venv/bin/python benchmarks/bench_overhead.py --baseline ../osb-base
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import WorkerProcess, isolate_network, local_server, median, report, rotated, verdict
from _real_execd import real_execd, stub_lifecycle
from peers import SKIP_SDK_HEALTH

HERE = str(Path(__file__).resolve().parents[1])
CALLS = ("runs", "commands", "uploads", "gets")


@contextlib.contextmanager
def target(name: str) -> Iterator[str]:
    """The api_base of a lifecycle whose sandboxes are the local server's or the real execd."""
    if name == "local":
        with local_server() as server:
            yield server.api_base
    else:
        os.environ[SKIP_SDK_HEALTH] = "1"
        try:
            with real_execd() as endpoint, stub_lifecycle(endpoint) as api_base:
                yield api_base
        finally:
            del os.environ[SKIP_SDK_HEALTH]


def count(op: str, args: argparse.Namespace) -> int:
    return int(args.calls if op == "runs" else args.command_calls)


def spread(values: list[float], n: int) -> list[float]:
    """[min, median, max] per call, in ms."""
    return [round(v / n * 1e3, 3) for v in (min(values), median(values), max(values))]


def measure(api_base: str, clients: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """Medians of CPU and wall per call, per client, and ratios to the official SDK."""
    workers: dict[str, WorkerProcess] = {}
    errors: dict[str, str] = {}
    samples: dict[str, dict[str, list[dict[str, float]]]] = {}
    try:
        for label, tree in clients.items():
            peer = "opensandbox" if label == "opensandbox" else "osb_sync"
            worker = WorkerProcess(peer, api_base, tree)
            try:
                worker.ask("open")
                for op in CALLS:  # warm up
                    worker.ask(op, n=20)
            except RuntimeError as exc:
                errors[label] = str(exc)
                worker.stop()
                continue
            workers[label] = worker
            samples[label] = {op: [] for op in CALLS}
        for rep in range(args.reps):
            for label in rotated(list(workers), rep):
                for op in CALLS:
                    samples[label][op].append(workers[label].ask(op, n=count(op, args)))
    finally:
        for worker in workers.values():
            worker.stop()
    results: dict[str, Any] = {}
    for label, by_op in samples.items():
        results[label] = {}
        for op, runs in by_op.items():
            n = count(op, args)
            results[label][f"{op}_cpu_ms"] = round(median([r["cpu"] for r in runs]) / n * 1e3, 3)
            results[label][f"{op}_wall_ms"] = round(median([r["wall"] for r in runs]) / n * 1e3, 3)
            results[label][f"{op}_cpu_ms_min_med_max"] = spread([r["cpu"] for r in runs], n)
    sdk = results.get("opensandbox")
    for label, values in results.items():
        if sdk and label != "opensandbox":
            for op in CALLS:
                values[f"{op}_cpu_vs_sdk"] = round(values[f"{op}_cpu_ms"] / sdk[f"{op}_cpu_ms"], 3)
                # per round (same moment of load): min / median / max of the ratio
                pairs = zip(samples[label][op], samples["opensandbox"][op], strict=True)
                per_round = [a["cpu"] / b["cpu"] for a, b in pairs]
                values[f"{op}_cpu_vs_sdk_per_round"] = [
                    round(v, 3) for v in (min(per_round), median(per_round), max(per_round))
                ]
    return {"results": results, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50, help="run_code calls per repetition")
    parser.add_argument(
        "--command-calls",
        type=int,
        default=20,
        help="commands.run, upload and get_sandbox calls per repetition",
    )
    parser.add_argument("--targets", default="local,execd")
    parser.add_argument("--baseline", help="another source tree's osb_sync, measured alongside")
    parser.add_argument("--json")
    args = parser.parse_args()
    clients = {"osb_sync": HERE, "opensandbox": HERE}
    if args.baseline:
        clients["osb_sync_baseline"] = str(Path(args.baseline).resolve())
    by_target: dict[str, Any] = {}
    goals: dict[str, str] = {}
    for name in args.targets.split(","):
        with target(name) as api_base:
            by_target[name] = measured = measure(api_base, clients, args)
        mine = measured["results"].get("osb_sync")
        sdk = measured["results"].get("opensandbox")
        for op in CALLS:
            met = bool(mine and sdk) and mine[f"{op}_cpu_ms"] <= 0.8 * sdk[f"{op}_cpu_ms"]
            goals[f"{name}: CPU per {op[:-1]} <= 0.8x the official SDK's"] = verdict(met)
    report(
        "overhead",
        {
            "reps": args.reps,
            "calls": {"runs": args.calls, "commands": args.command_calls},
            "load_average": os.getloadavg(),
            "targets": by_target,
            "goals": goals,
        },
        args.json,
    )


if __name__ == "__main__":
    isolate_network()
    main()
