"""How long ``osb-sync --version`` takes, against a bare ``python -c pass`` (issue 28: < 0.15 s).

Run: ``python benchmarks/cli_startup.py [ROUNDS]``. Each command runs ROUNDS times in a fresh
interpreter, interleaved so that the machine's load hits both alike; the medians and the
difference (what osb-sync adds to Python's own start-up) are printed, with the modules
``--version`` loaded (requests must not be among them).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    version = [sys.executable, "-m", "osb_sync", "--version"]
    bare = [sys.executable, "-c", "pass"]
    ours, python = [], []
    for _ in range(rounds):
        ours.append(timed(version))
        python.append(timed(bare))
    probe = (
        "import sys, runpy\nsys.argv = ['osb-sync', '--version']\n"
        "try:\n    runpy.run_module('osb_sync', run_name='__main__')\nexcept SystemExit:\n"
        "    print(sorted(m for m in sys.modules if m.startswith(('osb_sync', 'requests'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"osb-sync --version: median {statistics.median(ours):.3f} s, min {min(ours):.3f} s")
    print(f"python -c pass:     median {statistics.median(python):.3f} s, min {min(python):.3f} s")
    print(f"added by osb-sync:  median {statistics.median(ours) - statistics.median(python):.3f} s")
    print(f"modules loaded: {loaded.splitlines()[-1] if loaded else '?'}")


if __name__ == "__main__":
    main()
