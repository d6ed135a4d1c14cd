"""Client overhead: client CPU per run_code("pass") round trip and per create+run+delete cycle.

osb_sync against the official ``opensandbox`` sync SDK (+ ``opensandbox-code-interpreter``) and
LiteLLM's async OpenSandbox provider, doing the same work on the same local server (a separate
process). CPU is ``time.process_time`` of this process (every thread of it), per call; medians
of ``--reps`` interleaved repetitions. Peers live in a separate virtualenv
(``benchmarks/requirements.txt``); one that cannot be imported or cannot talk to the server is
reported with its error text. The script re-runs itself in a loopback-only network namespace.

    /tmp/bench-venv/bin/python benchmarks/bench_overhead.py
"""

from __future__ import annotations

import argparse
import traceback
from typing import Any

from _common import isolate_network, local_server, measured, median, report, verdict
from peers import FACTORIES, Peer


def start(name: str, api_base: str) -> tuple[Peer | None, str | None]:
    """A warmed-up peer, or the error that prevented it."""
    try:
        peer: Peer = FACTORIES[name](api_base)
        peer.open()
        peer.run_many(20)
        peer.cycle_many(1)
        return peer, None
    except Exception as exc:
        tail = traceback.format_exc().strip().splitlines()[-3:]
        return None, f"{type(exc).__name__}: {exc} | " + " / ".join(tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--runs", type=int, default=100, help="run_code calls per repetition")
    parser.add_argument("--cycles", type=int, default=10, help="cycles per repetition")
    parser.add_argument("--json")
    args = parser.parse_args()

    with local_server() as server:
        peers: dict[str, Peer] = {}
        errors: dict[str, str] = {}
        for name in FACTORIES:
            peer, error = start(name, server.api_base)
            if peer is not None:
                peers[name] = peer
            else:
                errors[name] = str(error)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in peers}
        cycles: dict[str, list[dict[str, float]]] = {name: [] for name in peers}
        order = list(peers)
        for rep in range(args.reps):
            for name in order[rep % len(order) :] + order[: rep % len(order)]:
                with measured() as m:
                    peers[name].run_many(args.runs)
                runs[name].append(m)
                with measured() as m:
                    peers[name].cycle_many(args.cycles)
                cycles[name].append(m)
        for peer in peers.values():
            peer.close()

    results: dict[str, Any] = {}
    for name in peers:
        results[name] = {
            "cpu_ms_per_run": round(median([r["cpu"] for r in runs[name]]) / args.runs * 1e3, 3),
            "wall_ms_per_run": round(median([r["wall"] for r in runs[name]]) / args.runs * 1e3, 2),
            "cpu_ms_per_cycle": round(
                median([c["cpu"] for c in cycles[name]]) / args.cycles * 1e3, 2
            ),
            "wall_ms_per_cycle": round(
                median([c["wall"] for c in cycles[name]]) / args.cycles * 1e3, 1
            ),
        }
    mine = results.get("osb_sync", {})
    for name, values in results.items():
        if name != "osb_sync" and mine:
            values["cpu_per_run_vs_osb_sync"] = round(
                values["cpu_ms_per_run"] / mine["cpu_ms_per_run"], 2
            )
            values["cpu_per_cycle_vs_osb_sync"] = round(
                values["cpu_ms_per_cycle"] / mine["cpu_ms_per_cycle"], 2
            )
    lowest_run = min(results, key=lambda n: results[n]["cpu_ms_per_run"]) if results else None
    lowest_cycle = min(results, key=lambda n: results[n]["cpu_ms_per_cycle"]) if results else None
    report(
        "overhead",
        {
            "reps": args.reps,
            "results": results,
            "errors": errors,
            "goals": {
                "lowest CPU per run_code": verdict(lowest_run == "osb_sync" and not errors),
                "lowest CPU per cycle": verdict(lowest_cycle == "osb_sync" and not errors),
            },
        },
        args.json,
    )


if __name__ == "__main__":
    isolate_network()
    main()
