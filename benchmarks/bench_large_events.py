"""Large events: one 8 MiB event must cost at most 10x one 1 MiB event (linear, not quadratic).

End to end: ``run_code("'x' * N")`` returns its value as a single ``result`` event of about N
bytes; client CPU seconds per run, medians of ``--reps``, sizes interleaved. The pure parser is
also timed in process on the same event bytes cut into 64 KiB and 4 KiB chunks (smaller chunks
are where a quadratic buffer shows).

    python benchmarks/bench_large_events.py
"""

from __future__ import annotations

import argparse
import json
import time

from _common import local_server, measured, median, report, verdict

from osb_sync import Client
from osb_sync._stream import iter_events

SIZES = {"1MiB": 1 << 20, "8MiB": 8 << 20}


def parse_cost(size: int, chunk: int, reps: int) -> float:
    """Median CPU seconds of iter_events on one event of ``size`` bytes cut into ``chunk``s."""
    event = json.dumps({"type": "result", "results": {"text": "x" * size}}).encode() + b"\n\n"
    chunks = [event[i : i + chunk] for i in range(0, len(event), chunk)]
    costs = []
    for rep in range(reps + 1):  # the first one warms the allocator up for this size
        started = time.process_time()
        (parsed,) = iter_events(chunks)
        if rep:
            costs.append(time.process_time() - started)
        assert len(parsed.data["results"]["text"]) == size
    return median(costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()

    samples: dict[str, list[dict[str, float]]] = {name: [] for name in SIZES}
    with local_server() as server:
        client = Client(server.api_base, read_timeout=120)
        with client.create_sandbox(allow_internet_access=True) as sandbox:
            for size in SIZES.values():
                sandbox.run_code(f"'x' * {size}", max_output_bytes=4 * size)  # warm up
            for _ in range(args.reps):
                for name, size in SIZES.items():
                    with measured() as m:
                        result = sandbox.run_code(f"'x' * {size}", max_output_bytes=4 * size)
                    assert len(result.results[0]["text"]) == size + 2  # repr adds the quotes
                    samples[name].append(m)
        client.close()

    end_to_end = {
        name: {
            "client_cpu_s": round(median([r["cpu"] for r in runs]), 4),
            "wall_s": round(median([r["wall"] for r in runs]), 4),
        }
        for name, runs in samples.items()
    }
    ratio = end_to_end["8MiB"]["client_cpu_s"] / end_to_end["1MiB"]["client_cpu_s"]
    parser_only = {
        f"{mib}MiB@{chunk // 1024}KiB": parse_cost(mib << 20, chunk, args.reps)
        for chunk in (64 * 1024, 4 * 1024)
        for mib in (1, 2, 4, 8, 16)
    }
    parse_ratio_4k = parser_only["8MiB@4KiB"] / parser_only["1MiB@4KiB"]
    ns_per_byte = {
        key: round(cost / (int(key.split("MiB")[0]) << 20) * 1e9, 2)
        for key, cost in parser_only.items()
    }
    report(
        "large_events",
        {
            "end_to_end": end_to_end,
            "cpu_8MiB_over_1MiB": round(ratio, 2),
            "parser_only_cpu_s": {k: round(v, 4) for k, v in parser_only.items()},
            "parser_only_ns_per_byte": ns_per_byte,
            "parser_8MiB_over_1MiB_at_4KiB_chunks": round(parse_ratio_4k, 2),
            "goals": {"8 MiB event <= 10x the 1 MiB one (end to end)": verdict(ratio <= 10)},
        },
        args.json,
    )


if __name__ == "__main__":
    main()
