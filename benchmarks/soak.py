"""Soak: many sequential and concurrent run_code calls on one client; resources must stay flat.

Phases, against a local server in a separate process:

1. ``--sequential`` calls of ``print('ok')`` in one sandbox;
2. ``--threads`` threads x ``--per-thread`` calls, each thread in its own sandbox.

Reported: failures (goal 0), the client's open descriptors and RSS at start and end (goal: flat),
TCP connections opened (goal: within ``pool_maxsize``; counted by wrapping urllib3's
``create_connection``), and the server's RSS and descriptors.

    python benchmarks/soak.py                      # the full soak (10 000 + 32 x 500)
    python benchmarks/soak.py --sequential 500 --threads 8 --per-thread 50   # a quick run
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from _common import ConnectionCounter, local_server, proc_stats, report, verdict

from osb_sync import Client, Sandbox

CODE = "print('ok')"
RSS_SLACK_KIB = 8 * 1024  # allocator noise: flat means within this
FDS_SLACK = 2


class Tally:
    """Failures of many threads, with the first few messages kept."""

    def __init__(self) -> None:
        self.calls = 0
        self.failures = 0
        self.examples: list[str] = []
        self._lock = threading.Lock()

    def run(self, sandbox: Sandbox) -> None:
        try:
            ok = sandbox.run_code(CODE).stdout == "ok\n"
            error = "" if ok else "wrong output"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self.calls += 1
            if error:
                self.failures += 1
                if len(self.examples) < 5:
                    self.examples.append(error)


def sequential(client: Client, calls: int, tally: Tally, samples: list[dict[str, Any]]) -> float:
    started = time.perf_counter()
    with client.create_sandbox(allow_internet_access=True) as sandbox:
        for i in range(calls):
            tally.run(sandbox)
            if calls >= 10 and (i + 1) % (calls // 10) == 0:
                samples.append({"calls": i + 1, **proc_stats()})
    return time.perf_counter() - started


def concurrent(client: Client, threads: int, per_thread: int, tally: Tally) -> float:
    sandboxes = [client.create_sandbox(allow_internet_access=True) for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)

    def work(sandbox: Sandbox) -> None:
        barrier.wait()
        for _ in range(per_thread):
            tally.run(sandbox)

    workers = [threading.Thread(target=work, args=(s,)) for s in sandboxes]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    for sandbox in sandboxes:
        client.delete_sandbox(sandbox)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--per-thread", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=200, help="calls before the start sample")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    pool = max(32, args.threads)

    with local_server() as server, ConnectionCounter() as conns:
        stats: dict[str, Any] = {"before_client": proc_stats()}
        client = Client(server.api_base, pool_maxsize=pool)
        with client.create_sandbox(allow_internet_access=True) as sandbox:
            for _ in range(args.warmup):
                sandbox.run_code(CODE)
        stats["start"] = proc_stats()
        server_start = proc_stats(server.pid)
        opened_before = conns.urllib3
        tally = Tally()
        samples: list[dict[str, Any]] = []
        seq_s = sequential(client, args.sequential, tally, samples)
        seq_failures = tally.failures
        stats["after_sequential"] = proc_stats()
        conc_s = concurrent(client, args.threads, args.per_thread, tally)
        stats["after_concurrent"] = proc_stats()
        server_end = proc_stats(server.pid)
        opened = conns.urllib3 - opened_before
        client.close()
        stats["after_close"] = proc_stats()

    calls = args.threads * args.per_thread
    start, seq, conc = stats["start"], stats["after_sequential"], stats["after_concurrent"]
    report(
        "soak",
        {
            "sequential": {
                "calls": args.sequential,
                "seconds": round(seq_s, 2),
                "calls_per_s": round(args.sequential / seq_s, 1) if seq_s else None,
                "failures": seq_failures,
            },
            "concurrent": {
                "threads": args.threads,
                "calls": calls,
                "seconds": round(conc_s, 2),
                "calls_per_s": round(calls / conc_s, 1) if conc_s else None,
                "failures": tally.failures - seq_failures,
            },
            "failure_examples": tally.examples,
            "client": stats,
            "client_samples_sequential": samples,
            "server": {"start": server_start, "end": server_end},
            "tcp_connections_opened_after_warmup": opened,
            "pool_maxsize": pool,
            "goals": {
                "failures == 0": verdict(tally.failures == 0),
                f"fds flat over the sequential phase (+-{FDS_SLACK})": verdict(
                    abs(seq["fds"] - start["fds"]) <= FDS_SLACK
                ),
                "fds after concurrency <= start + pool (idle pooled sockets)": verdict(
                    conc["fds"] <= start["fds"] + pool
                ),
                "fds back to baseline after close": verdict(
                    stats["after_close"]["fds"] <= stats["before_client"]["fds"] + FDS_SLACK
                ),
                f"RSS flat start -> end (+-{RSS_SLACK_KIB // 1024} MiB)": verdict(
                    abs(conc["rss_kib"] - start["rss_kib"]) <= RSS_SLACK_KIB
                ),
                "connections <= pool_maxsize": verdict(opened <= pool),
            },
        },
        args.json,
    )


if __name__ == "__main__":
    main()
