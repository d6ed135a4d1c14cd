"""CPU of the installed-package check a local server makes at every create (issue 50).

`host/package.py`'s `warn_if_changed` (the server's first call of it copies the package), then
``--calls`` more calls, each timed with ``time.process_time``, in a fresh interpreter per tree
and round (this tree, and with ``--baseline DIR`` that source tree, first on ``PYTHONPATH``,
the order alternating); ``--gap`` seconds between two calls, a create's pace. Per call: mean,
p50, p99 and max CPU in microseconds; over ``--rounds``: min / median / max of the means.

    python benchmarks/bench_package_check.py [--calls 300] [--gap 0.01] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import percentile, report, spread

HERE = Path(__file__).resolve().parents[1]
PROBE = """
import json, sys, time
from osb_sync.local.host import package
calls, gap = int(sys.argv[1]), float(sys.argv[2])
package.warn_if_changed()  # the first copies the package
spent = []
for _ in range(calls):
    time.sleep(gap)
    start = time.process_time()
    package.warn_if_changed()
    spent.append((time.process_time() - start) * 1e6)
print(json.dumps({"files": len(package.snapshot().marks), "us": spent}))
"""


def one(tree: Path, calls: int, gap: float) -> dict[str, Any]:
    """One interpreter of `tree`: its per-call CPU (us)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(calls), str(gap)],
        env=env,
        cwd="/",
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    got = json.loads(out)
    spent = got["us"]
    return {
        "files": got["files"],
        "mean_us": round(sum(spent) / len(spent), 1),
        "p50_us": round(percentile(spent, 50), 1),
        "p99_us": round(percentile(spent, 99), 1),
        "max_us": round(max(spent), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--gap", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another source tree, e.g. main's")
    parser.add_argument("--json")
    args = parser.parse_args()
    trees = {"this": HERE}
    if args.baseline:
        trees["baseline"] = args.baseline.resolve()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for index in range(args.rounds):
        order = list(trees) if index % 2 == 0 else list(trees)[::-1]
        for name in order:
            runs[name].append(one(trees[name], args.calls, args.gap))
            print(f"round {index} {name}: {runs[name][-1]}", flush=True)
    report(
        "package_check",
        {
            "settings": vars(args) | {"baseline": str(args.baseline)},
            "runs": runs,
            "mean_us_over_rounds": {n: spread([r["mean_us"] for r in v]) for n, v in runs.items()},
        },
        args.json,
    )


if __name__ == "__main__":
    main()
