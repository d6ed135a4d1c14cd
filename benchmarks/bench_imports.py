"""Footprint, part 1: import time of osb_sync against requests alone, opensandbox and litellm.

Each module is imported in a fresh interpreter (``python -c "import X"``), ``--reps`` times,
interleaved with the others and with ``python -c pass`` (interpreter start-up); medians. The
goal compares whole processes (what a user waits for): ``import osb_sync`` <= 1.2x ``import
requests`` (issue 29 goal 5; issue 16 had 1.3x). ``--baseline DIR`` also imports the osb_sync
of another source tree (e.g. a worktree of main), first on ``PYTHONPATH``, in the same
interleaved rounds. ``from osb_sync import Client`` is timed too: the package imports its
modules lazily, and the first use of ``Client`` pulls in requests. ``--peers`` adds
opensandbox and litellm. Run it with the benchmark virtualenv's interpreter so that every
module is importable. The script re-runs itself in a loopback-only network namespace (LiteLLM
fetches price maps at import).

    /tmp/bench-venv/bin/python benchmarks/bench_imports.py --baseline ../osb-base
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from _common import isolate_network, median, report, rotated, verdict

HERE = Path(__file__).resolve().parents[1]
MODULES = {
    "startup": "pass",
    "requests": "import requests",
    "osb_sync": "import osb_sync",
    # the package imports its modules lazily: the first use of Client pulls requests in
    "osb_sync_client": "from osb_sync import Client",
}
PEERS = {
    "opensandbox": "import opensandbox, code_interpreter",
    "litellm": "import litellm",
}


CPU: dict[tuple[str, str], list[float]] = {}  # CPU seconds of each run, per (statement, tree)


def once(statement: str, tree: Path = HERE) -> float:
    """Wall seconds of a fresh interpreter running ``statement`` with ``tree`` first on the path
    (its CPU seconds, user + system, go to ``CPU``)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True, cwd=tree, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    CPU.setdefault((statement, str(tree)), []).append(cpu)
    return wall


def spread(values: list[float]) -> list[float]:
    return [round(f(values), 3) for f in (min, median, max)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--baseline", type=Path, help="another source tree's osb_sync")
    parser.add_argument("--peers", action="store_true", help="also opensandbox and litellm")
    parser.add_argument("--json")
    args = parser.parse_args()
    runs = {name: (statement, HERE) for name, statement in MODULES.items()}
    if args.baseline:
        runs["osb_sync_baseline"] = ("import osb_sync", args.baseline.resolve())
        runs["osb_sync_client_baseline"] = (MODULES["osb_sync_client"], args.baseline.resolve())
    if args.peers:
        runs.update({name: (statement, HERE) for name, statement in PEERS.items()})
    for statement, tree in runs.values():  # compile the .pyc files once, outside the timing
        once(statement, tree)
    samples: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for rep in range(args.reps):
        for name in rotated(order, rep):
            samples[name].append(once(*runs[name]))
    wall = {name: median(times) for name, times in samples.items()}
    cpu = {
        name: [round(f(CPU[statement, str(tree)][1:]) * 1e3, 1) for f in (min, median, max)]
        for name, (statement, tree) in runs.items()
    }
    cost = {name: wall[name] - wall["startup"] for name in runs if name != "startup"}
    ratio = wall["osb_sync"] / wall["requests"]
    baseline = {}
    if args.baseline:
        baseline = {
            "baseline_tree": str(args.baseline),
            "wall_baseline_over_requests": round(wall["osb_sync_baseline"] / wall["requests"], 3),
            "per_round_baseline_over_requests": spread(
                [
                    a / b
                    for a, b in zip(samples["osb_sync_baseline"], samples["requests"], strict=True)
                ]
            ),
        }
    report(
        "imports",
        {
            "reps": args.reps,
            "python": sys.version.split()[0],
            "wall_ms": {name: round(v * 1e3, 1) for name, v in wall.items()},
            "cpu_ms_min_med_max": cpu,
            "cpu_osb_sync_over_requests": round(cpu["osb_sync"][1] / cpu["requests"][1], 3),
            "wall_ms_min_med_max": {
                name: [round(f(times) * 1e3, 1) for f in (min, median, max)]
                for name, times in samples.items()
            },
            # per round (the same moment of load): osb_sync / requests, min / median / max
            "per_round_osb_sync_over_requests": spread(
                [a / b for a, b in zip(samples["osb_sync"], samples["requests"], strict=True)]
            ),
            "import_ms_minus_startup": {name: round(v * 1e3, 1) for name, v in cost.items()},
            "load_average": os.getloadavg(),
            "import_osb_sync_over_requests_minus_startup": round(
                cost["osb_sync"] / cost["requests"], 3
            ),
            "wall_osb_sync_over_requests": round(ratio, 3),
            "wall_osb_sync_client_over_requests": round(
                wall["osb_sync_client"] / wall["requests"], 3
            ),
            **baseline,
            "goals": {
                "import osb_sync <= 1.2x import requests (whole processes)": verdict(ratio <= 1.2)
            },
        },
        args.json,
    )


if __name__ == "__main__":
    isolate_network()
    main()
