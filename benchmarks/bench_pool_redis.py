"""Per-process pools versus one pool shared through Redis: 4 processes x 8 threads borrowing.

    python benchmarks/bench_pool_redis.py [--seconds 60] [--processes 4] [--threads 8]
        [--reuse never|reset]

Starts a LocalServer and a redis-server (loopback port from bind(0), nothing saved), then runs
tests/sockets/redis_pool_worker.py in each process twice: with a pool of ``--size`` per process
(InProcessStore) and with one shared pool of ``--size`` (RedisStore). Reports, for each: borrows,
creates, the wait for a sandbox (p50/p99, ms), sandboxes alive on the server (peak and
median, sampled every 0.1 s), and whether any sandbox was lent twice at once.

What one lend of an idle sandbox costs (issue 39 added a ``GET /sandboxes/{id}`` to it): one
borrower, sandboxes reset and lent again, ``--processes 1 --threads 1 --size 4 --max-size 4
--reuse reset``; the shared pool's wait p50 is then a lend's own time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median, quantiles

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from osb_sync import Client  # noqa: E402
from osb_sync.local import LocalServer  # noqa: E402
from tests.redisserver import own_redis  # noqa: E402

WORKER = ROOT / "tests" / "sockets" / "redis_pool_worker.py"


def run(api_base: str, url: str, args: argparse.Namespace) -> dict[str, object]:
    name = f"bench-{secrets.token_hex(3)}"
    pool = {"size": args.size, "max_size": args.max_size, "reuse": args.reuse}
    options = {"pool": pool, "seconds": args.seconds, "threads": args.threads}
    command = [sys.executable, str(WORKER), api_base, url, name, "borrow", json.dumps(options)]
    # Each borrow is a line: files, not pipes, which a fast borrower fills (and blocks on).
    outs = [tempfile.TemporaryFile("w+") for _ in range(args.processes)]
    procs = [subprocess.Popen(command, stdout=out, text=True, cwd=ROOT) for out in outs]
    alive: list[int] = []
    with Client(api_base) as client:
        while any(p.poll() is None for p in procs):
            alive.append(len(list(client.list_sandboxes(metadata={"osb_sync.pool": name}))))
            time.sleep(0.1)
    lines = []
    for out in outs:
        with out:
            out.seek(0)
            lines += out.read().splitlines()
    borrows = [json.loads(line) for line in lines if '"asked"' in line]
    totals = [json.loads(line) for line in lines if '"creates"' in line]
    waits = sorted((b["start"] - b["asked"]) * 1000 for b in borrows)
    spans: dict[str, list[tuple[float, float]]] = {}
    for b in borrows:
        spans.setdefault(b["id"], []).append((b["start"], b["end"]))
    twice = sum(
        any(later[0] < earlier[1] for earlier, later in itertools.pairwise(s))
        for s in (sorted(v) for v in spans.values())
    )
    cuts = quantiles(waits, n=100)
    return {
        "borrows": len(borrows),
        "creates": sum(t["creates"] for t in totals),
        "wait_p50_ms": round(cuts[49], 1),
        "wait_p99_ms": round(cuts[98], 1),
        "alive_peak": max(alive),
        "alive_median": median(alive),
        "lent_twice": twice,
        "errors": sum(len(t["errors"]) for t in totals),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--size", type=int, default=4)
    parser.add_argument("--max-size", type=int, default=8)
    parser.add_argument("--reuse", choices=("never", "reset"), default="never")
    args = parser.parse_args()
    with (
        LocalServer(ping_interval=0.5, command_grace=0) as local,
        own_redis(Path(tempfile.mkdtemp())) as redis,
    ):
        for label, url in (("per-process pools", "in-process"), ("shared pool", redis.url)):
            print(label, json.dumps(run(local.api_base, url, args)), flush=True)


if __name__ == "__main__":
    main()
