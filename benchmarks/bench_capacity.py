"""How many idle sandboxes one local server holds, and what a create costs as they pile up.

Creates idle isolated sandboxes (deny-all network, no spares) one after another against an
in-process LocalServer until the first refusal (503 ``SANDBOX::CAPACITY_EXCEEDED``, which names
the limit: descriptors or memory) or ``--max``; reports the count, the refusal's message,
create latency p50/p99 around 1, 100 and 1,000 live sandboxes (the 20 creates from each mark
on), the server's open descriptors and the machine's available memory at the end, and the
time to delete them all (8 threads).

Heavy (1,000 sandboxes take ~10 GB and minutes on 2 cores): on a shared machine run it with a
smaller ``--max``.

    python benchmarks/bench_capacity.py [--max 1200] [--json out.json]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests
from _common import median, percentile, report

from osb_sync.local import LocalServer
from osb_sync.local.host import capacity

BODY: dict[str, Any] = {
    "image": {"uri": "opensandbox/code-interpreter:v1.1.0"},  # the host view: no pull
    "entrypoint": ["tail", "-f", "/dev/null"],  # idle: execd alone, no entrypoint process
    "resourceLimits": {},
    "networkPolicy": {"defaultAction": "deny"},
}
MARKS = (1, 100, 1000)
WINDOW = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=1200, help="stop after this many")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    timings: list[float] = []
    ids: list[str] = []
    refusal = ""
    with LocalServer(spare_containers=0, isolation=True) as server, requests.Session() as http:
        while len(ids) < args.max:
            started = time.perf_counter()
            answer = http.post(f"{server.api_base}/sandboxes", json=BODY, timeout=120)
            if answer.status_code != 202:
                refusal = f"{answer.status_code} {answer.text[:300]}"
                break
            timings.append(time.perf_counter() - started)
            ids.append(answer.json()["id"])
            if len(ids) % 100 == 0:
                print(f"{len(ids)} live, last create {timings[-1] * 1000:.0f} ms", flush=True)
        at_end = {
            "open_descriptors": capacity.open_descriptors(),
            "descriptor_limit": server._registry.capacity.fd_limit if server._registry else 0,
            "available_memory_mib": (capacity.available_memory() or 0) >> 20,
        }
        started = time.perf_counter()

        def delete(sandbox_id: str) -> int:
            with requests.Session() as own:
                return own.delete(f"{server.api_base}/sandboxes/{sandbox_id}").status_code

        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(delete, ids))
        deleted_in = time.perf_counter() - started
    latency = {}
    for mark in MARKS:
        window = timings[mark - 1 : mark - 1 + WINDOW]
        if window:
            latency[f"at_{mark}_live_ms"] = {
                "p50": round(median(window) * 1000, 1),
                "p99": round(percentile(window, 99) * 1000, 1),
                "creates": len(window),
            }
    report(
        "capacity",
        {
            "created": len(ids),
            "stopped_by": refusal or f"--max {args.max}",
            "create_latency": latency,
            "at_end": at_end,
            "delete_all_seconds": round(deleted_in, 2),
            "deletes_ok": codes.count(204),
        },
        args.json,
    )


if __name__ == "__main__":
    main()
