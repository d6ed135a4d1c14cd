"""Client cost per call in instructions, not seconds: ``run_code("pass")``, ``commands.run``,
a 1 KB upload and ``get_sandbox``, for osb_sync, another tree's osb_sync (``--baseline DIR``)
and the official SDK, against one local server.

On a shared virtual machine a call's CPU time swings by 30-50% between rounds (the same code
measured 0.64x and 1.06x the SDK in one run of ``bench_overhead.py``), and it has no hardware
counters. Valgrind's callgrind counts the user-space instructions a process executes, the same
on every run: each client runs in a process of its own under ``valgrind --tool=callgrind``
twice, once with ``--calls`` calls and once with none (both after the same warm-up), and the
difference divided by ``--calls`` is the cost of one call. It leaves out the kernel's share
(the system calls, the same for both clients within a few per call) and runs about 50x slower.

    python benchmarks/bench_instructions.py --baseline ../osb-base --calls 200
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import isolate_network, local_server, report, verdict
from bench_overhead import CALLS as OPS
from peers import Worker

HERE = Path(__file__).resolve()
TREE = str(HERE.parents[1])
WARM_UP = 30
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def child(peer: str, api_base: str, op: str, calls: int) -> None:
    """The measured process: a ``peers.Worker`` opens a sandbox, warms up, makes ``calls``
    calls of ``op`` and closes."""
    worker = Worker(peer, api_base, 32)
    for step, n in (("open", 0), (op, WARM_UP), (op, calls), ("close", 0)):
        worker.handle(step, n=n)


def instructions(peer: str, tree: str, api_base: str, op: str, calls: int) -> int:
    """User-space instructions of one child process under callgrind."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
           str(HERE), "--child", peer, api_base, op, str(calls)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": tree}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    found = _REFS.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{peer} {op} {calls}: {done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--baseline", help="another source tree's osb_sync, measured alongside")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json")
    parser.add_argument("--child", nargs=4, metavar=("PEER", "API", "OP", "CALLS"))
    args = parser.parse_args()
    if args.child:
        peer, api_base, op, calls = args.child
        child(peer, api_base, op, int(calls))
        return
    clients = {"osb_sync": ("osb_sync", TREE), "opensandbox": ("opensandbox", TREE)}
    if args.baseline:
        clients["osb_sync_baseline"] = ("osb_sync", str(Path(args.baseline).resolve()))
    with local_server() as server, ThreadPoolExecutor(args.jobs) as pool:
        jobs = {
            (label, op, n): pool.submit(instructions, peer, tree, server.api_base, op, n)
            for label, (peer, tree) in clients.items()
            for op in OPS
            for n in (0, args.calls)
        }
        counts = {key: job.result() for key, job in jobs.items()}
    per_call = {
        label: {
            op: round((counts[label, op, args.calls] - counts[label, op, 0]) / args.calls)
            for op in OPS
        }
        for label in clients
    }
    sdk = per_call["opensandbox"]
    ratios = {
        label: {op: round(values[op] / sdk[op], 3) for op in OPS}
        for label, values in per_call.items()
        if label != "opensandbox"
    }
    goals = {
        f"instructions per {op[:-1]} <= 0.8x the official SDK's": verdict(
            ratios["osb_sync"][op] <= 0.8
        )
        for op in OPS
    }
    report(
        "instructions",
        {"calls": args.calls, "per_call": per_call, "vs_sdk": ratios, "goals": goals},
        args.json,
    )


if __name__ == "__main__":
    if "--child" not in sys.argv:
        isolate_network()
    main()
