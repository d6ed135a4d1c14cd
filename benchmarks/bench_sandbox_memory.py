"""Memory per idle local sandbox: the server's RSS growth plus the sandbox's own processes' PSS.

Starts ``osb-sync serve`` in its own process (default settings: one warm spare), waits for it
to settle, then creates ``--count`` sandboxes (default image, idle) and measures:

- the server's RSS growth (``/proc/<pid>/status`` VmRSS, after minus before), per sandbox;
- the PSS of every process below the server (bwrap, the sandbox's init, execd, its workers,
  slirp4netns) from ``/proc/<pid>/smaps_rollup``, after minus before (before holds the spare,
  after holds the sandboxes and a refilled spare), per sandbox; PSS splits a shared page among
  the processes that map it, so the sum over all of them counts each page once;
- the same after one ``run_code("1")`` in each (its Python worker started).

The goal (issue 29 goal 2) is at most 6.8 MiB per idle sandbox, the two figures summed.
With ``--baseline DIR`` (a worktree of another commit) each of ``--rounds`` rounds measures
this tree's server and that tree's (the order alternating), min / median / max.

    python benchmarks/bench_sandbox_memory.py [--count 20] [--baseline DIR --rounds 5] [--json F]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from _common import local_server, report, spread

import osb_sync


def children(pid: int) -> list[int]:
    """Every process below `pid` (from /proc/<pid>/task/*/children, recursively)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as listing:
                    kids = [int(k) for k in listing.read().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def pss_kib(pid: int) -> int:
    """The proportional set size of `pid` in KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kib(pid: int) -> int:
    """VmRSS of `pid` in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def name_of(pid: int) -> str:
    """The process's command name (/proc/<pid>/comm), '?' once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return "?"


def snapshot(server_pid: int) -> dict[str, Any]:
    """The server's RSS and the summed PSS of every process below it (and by name), KiB."""
    below = children(server_pid)
    by_name: dict[str, int] = {}
    total = 0
    for pid in below:
        size = pss_kib(pid)
        total += size
        by_name[name_of(pid)] = by_name.get(name_of(pid), 0) + size
    return {
        "server_rss_kib": rss_kib(server_pid),
        "below_pss_kib": total,
        "processes_below": len(below),
        "below_pss_kib_by_name": by_name,
    }


def settle(server_pid: int, seconds: float = 2.0) -> dict[str, Any]:
    """A snapshot once the process count below the server stopped changing for `seconds`."""
    last = snapshot(server_pid)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(seconds)
        now = snapshot(server_pid)
        if now["processes_below"] == last["processes_below"]:
            return now
        last = now
    return last


def per_sandbox(before: dict[str, Any], after: dict[str, Any], count: int) -> dict[str, Any]:
    rss = (after["server_rss_kib"] - before["server_rss_kib"]) / count / 1024
    pss = (after["below_pss_kib"] - before["below_pss_kib"]) / count / 1024
    return {
        "server_rss_growth_mib": round(rss, 2),
        "sandbox_pss_mib": round(pss, 2),
        "total_mib": round(rss + pss, 2),
        "pss_mib_by_name": {
            name: round((size - before["below_pss_kib_by_name"].get(name, 0)) / count / 1024, 2)
            for name, size in after["below_pss_kib_by_name"].items()
        },
        "processes_per_sandbox": round(
            (after["processes_below"] - before["processes_below"]) / count, 2
        ),
    }


def measure(count: int, tree: str | None = None) -> dict[str, Any]:
    """One server (of `tree`, else the installed osb_sync): `count` idle sandboxes, then a run."""
    with local_server(tree=tree) as server:
        client = osb_sync.Client(api_base=server.api_base, create_timeout=300)
        warm = client.create_sandbox()  # the server's first create warms its code paths
        warm.run_code("1")
        warm.delete()
        before = settle(server.pid)
        sandboxes = [client.create_sandbox() for _ in range(count)]
        idle = settle(server.pid)
        for sandbox in sandboxes:
            got = sandbox.run_code("1")
            assert got.error is None and got.results, got
        ran = settle(server.pid)
        for sandbox in sandboxes:
            sandbox.delete()
        client.close()
    return {
        "before": before,
        "idle": idle,
        "after_one_run": ran,
        "per_idle_sandbox": per_sandbox(before, idle, count),
        "per_sandbox_after_one_run": per_sandbox(before, ran, count),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--baseline", help="a worktree of the commit to compare")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    load = [os.getloadavg()[0]]
    if not args.baseline:
        got = measure(args.count)
        got.update(count=args.count, load_average_1min=round(load[0], 2), goal_mib=6.8)
        report("sandbox_memory", got, args.json)
        return
    trees = {"this": str(Path(__file__).resolve().parents[1]), "baseline": args.baseline}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for index in range(args.rounds):
        for name in list(trees) if index % 2 == 0 else list(reversed(trees)):
            rounds[name].append(measure(args.count, trees[name]))
            total = rounds[name][-1]["per_idle_sandbox"]["total_mib"]
            print(f"round {index} {name}: {total} MiB per idle sandbox", flush=True)
        load.append(os.getloadavg()[0])
    results: dict[str, Any] = {"count": args.count, "load_average_1min": load, "goal_mib": 6.8}
    for name, got in rounds.items():
        results[name] = {
            key: {
                figure: spread([one[key][figure] for one in got])
                for figure in ("server_rss_growth_mib", "sandbox_pss_mib", "total_mib")
            }
            for key in ("per_idle_sandbox", "per_sandbox_after_one_run")
        }
        results[name]["pss_mib_by_name_last_round"] = got[-1]["per_idle_sandbox"]["pss_mib_by_name"]
    report("sandbox_memory", results, args.json)


if __name__ == "__main__":
    main()
