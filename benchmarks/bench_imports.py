"""Footprint, part 1: import time of osb_sync against requests alone, opensandbox and litellm.

Each module is imported in a fresh interpreter (``python -c "import X"``), ``--reps`` times,
interleaved with the others and with ``python -c pass`` (interpreter start-up); medians. Run it
with the benchmark virtualenv's interpreter so that every module is importable. The script
re-runs itself in a loopback-only network namespace (LiteLLM fetches price maps at import).

    /tmp/bench-venv/bin/python benchmarks/bench_imports.py
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from _common import isolate_network, median, report, verdict

MODULES = {
    "startup": "pass",
    "requests": "import requests",
    "osb_sync": "import osb_sync",
    "opensandbox": "import opensandbox, code_interpreter",
    "litellm": "import litellm",
}


def once(statement: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    for statement in MODULES.values():  # compile the .pyc files once, outside the timing
        once(statement)
    samples: dict[str, list[float]] = {name: [] for name in MODULES}
    for _ in range(args.reps):
        for name, statement in MODULES.items():
            samples[name].append(once(statement))
    wall = {name: median(times) for name, times in samples.items()}
    cost = {name: wall[name] - wall["startup"] for name in MODULES if name != "startup"}
    ratio = cost["osb_sync"] / cost["requests"]
    report(
        "imports",
        {
            "reps": args.reps,
            "python": sys.version.split()[0],
            "wall_ms": {name: round(v * 1e3, 1) for name, v in wall.items()},
            "import_ms_minus_startup": {name: round(v * 1e3, 1) for name, v in cost.items()},
            "osb_sync_over_requests": round(ratio, 2),
            "wall_osb_sync_over_requests": round(wall["osb_sync"] / wall["requests"], 2),
            "goals": {"import osb_sync < 1.3x import requests": verdict(ratio < 1.3)},
        },
        args.json,
    )


if __name__ == "__main__":
    isolate_network()
    main()
