"""The output cap's cost per event: ``ExecutionStream`` over in-memory chunks, no sockets.

Issue 28, item 1 moved ``max_output_bytes`` from the bytes of the event stream to the output
as read (the folder counts the text it keeps) and added a guard on one line of the wire. This
measures what that costs per event where it shows most: execd's usual chunk, one small event
each, parsed, folded and counted, without the HTTP and scheduler noise of ``bench_stream.py``.

Each tree (this checkout, and ``--baseline DIR``) runs in its own worker process, the workers
alternating ``--rounds`` times; each worker reports the fastest of ``--reps`` passes, in CPU
time (``time.process_time``) per event; the figures are the median and the fastest over the
rounds (on a loaded machine the fastest is the steadier of the two).

    python benchmarks/bench_output_cap.py --baseline /tmp/osb-base
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EVENTS = 57_000

WORKER = r"""
import json, sys, time
from osb_sync._execution import ExecutionStream
from osb_sync._command_stream import CommandFolder

def chunks(kind):
    if kind == "code":  # /code: small stdout events, one chunk each, as execd sends them
        texts = ["line %d\n" % i for i in range(EVENTS)]
    else:  # /command: `yes`, one "y" line per event
        texts = ["y"] * EVENTS
    head = [b'{"type":"init","text":"run-1","timestamp":1}\n\n']
    body = [
        json.dumps({"type": "stdout", "text": t, "timestamp": 1712345678901}).encode() + b"\n\n"
        for t in texts
    ]
    return head + body

class Response:
    raw = object()  # no shutdown(): no watchdog
    def __init__(self, data):
        self.data = data
    def iter_content(self, size):
        return iter(self.data)
    def close(self):
        pass

out = {}
for kind in ("code", "command"):
    data = chunks(kind)
    best = float("inf")
    for _ in range(REPS):
        folder = CommandFolder() if kind == "command" else None
        started = time.process_time()
        with ExecutionStream(Response(data), max_output_bytes=10 << 20, folder=folder) as s:
            for _ in s:
                pass
        best = min(best, time.process_time() - started)
    out[kind] = best * 1e9 / EVENTS
print(json.dumps(out))
"""


def run_worker(tree: Path, reps: int) -> dict[str, float]:
    """One worker's fastest pass per kind, in ns of CPU per event."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = f"EVENTS = {EVENTS}\nREPS = {reps}\n{WORKER}"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="another source tree to measure in the same run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    trees = {"after": HERE.parent}
    if args.baseline:
        trees["before"] = Path(args.baseline)
    seen: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    for round_ in range(args.rounds):
        names = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        for name in names:
            for kind, ns in run_worker(trees[name], args.reps).items():
                seen[name].setdefault(kind, []).append(ns)
    load = os.getloadavg()
    print(f"ns of CPU per event over {args.rounds} rounds (load {load[0]:.1f}): median / fastest")
    for name, kinds in seen.items():
        cells = ", ".join(
            f"{k}: {statistics.median(v):.0f} / {min(v):.0f}" for k, v in kinds.items()
        )
        print(f"  {name:7} {cells}")
    if "before" in seen:
        for kind in seen["after"]:
            for how, pick in (("median", statistics.median), ("fastest", min)):
                after, before = pick(seen["after"][kind]), pick(seen["before"][kind])
                change = f"{after - before:+.0f} ns/event ({after / before - 1:+.1%})"
                print(f"  {kind}, {how}: {change}")


if __name__ == "__main__":
    main()
