"""How long ``osb-sync --version`` takes, against a bare ``python -c pass`` (goal: < 0.15 s).

Run: ``python benchmarks/cli_startup.py [ROUNDS] [--baseline DIR]``. Each command runs ROUNDS
times in a fresh interpreter, interleaved (the order rotating every round) so that the
machine's load hits all alike. Printed: min / median / max of the wall time and of the
process's CPU time (user + system, ``getrusage``: what load does not inflate much), what
osb-sync adds to Python's own start-up, and the modules ``--version`` loaded (requests must
not be among them). ``--baseline DIR`` also runs the ``osb_sync`` of another source tree
(first on ``PYTHONPATH``) in the same rounds. Issue 28 set the goal; issue 29 (goal 5)
measures it again.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import rotated

HERE = Path(__file__).resolve().parents[1]


CPU: dict[str, list[float]] = {}  # CPU seconds (user + system) of each run, per command


def timed(argv: list[str], tree: Path, name: str = "") -> float:
    """Wall seconds of one run; its CPU seconds go to ``CPU[name]``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env=env, cwd=tree)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    CPU.setdefault(name, []).append(cpu)
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", type=int, nargs="?", default=20)
    parser.add_argument("--baseline", type=Path, help="another source tree's osb_sync")
    args = parser.parse_args()
    version = [sys.executable, "-m", "osb_sync", "--version"]
    runs = {
        "osb-sync --version": (version, HERE),
        "python -c pass": ([sys.executable, "-c", "pass"], HERE),
    }
    if args.baseline:
        runs["baseline --version"] = (version, args.baseline.resolve())
    for argv, tree in runs.values():  # compile the .pyc files once, outside the timing
        timed(argv, tree)
    samples: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for rep in range(args.rounds):
        for name in rotated(order, rep):
            samples[name].append(timed(*runs[name], name))
    probe = (
        "import sys, runpy\nsys.argv = ['osb-sync', '--version']\n"
        "try:\n    runpy.run_module('osb_sync', run_name='__main__')\nexcept SystemExit:\n"
        "    print(sorted(m for m in sys.modules if m.startswith(('osb_sync', 'requests'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, cwd=HERE
    ).stdout.strip()
    bare = statistics.median(samples["python -c pass"])
    print(f"{args.rounds} rounds, load average {os.getloadavg()[0]:.1f}; min / median / max")
    for name, times in samples.items():
        low, mid, high = min(times), statistics.median(times), max(times)
        print(f"{name:20} {low:.3f} / {mid:.3f} / {high:.3f} s  (+{mid - bare:.3f} s over python)")
    print("CPU (user + system) of the process, min / median / max (steadier under load):")
    for name in runs:
        cpu = CPU[name]
        print(f"{name:20} {min(cpu):.3f} / {statistics.median(cpu):.3f} / {max(cpu):.3f} s")
    met = statistics.median(samples["osb-sync --version"]) < 0.15
    print(f"goal osb-sync --version < 0.15 s (median): {'met' if met else 'NOT met'}")
    print(f"modules loaded: {loaded.splitlines()[-1] if loaded else '?'}")


if __name__ == "__main__":
    main()
