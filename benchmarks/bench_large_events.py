"""Large events: an 8x larger event must cost at most 10x as much (linear, not quadratic).

End to end: ``run_code("'x' * N")`` returns its value as a single ``result`` event of about N
bytes, for N = 448 KiB and 3.5 MiB (the local server refuses results over 4 MiB); client CPU
seconds per run, medians of ``--reps``, sizes interleaved. The pure parser is also timed in
process on the same event bytes cut into 64 KiB and 4 KiB chunks (smaller chunks are where a
quadratic buffer shows), framed both as execd does (a bare JSON line: the direct decoder) and
as SSE (``data:``: sseclient-py). Result building: folding 800 and 6400 8 KiB stdout events
into an ExecutionResult (the list of texts and the final join), next to the join alone (which
any consumer building the string pays; above glibc's 32 MiB mmap threshold every join of that
size takes page faults on a fresh mapping, so neither is proportional across that step).

    python benchmarks/bench_large_events.py
"""

from __future__ import annotations

import argparse
import json
import time

from _common import local_server, measured, median, report, verdict

from osb_sync import Client
from osb_sync._stream import ExecutionFolder, iter_events

SIZES = {"small": 448 << 10, "large": 3584 << 10}  # 8x; the local server's results stop at 4 MiB


def parse_cost(size: int, chunk: int, reps: int, prefix: bytes = b"") -> float:
    """Median CPU seconds of iter_events on one event of ``size`` bytes cut into ``chunk``s."""
    event = json.dumps({"type": "result", "results": {"text": "x" * size}}).encode() + b"\n\n"
    event = prefix + event
    chunks = [event[i : i + chunk] for i in range(0, len(event), chunk)]
    costs = []
    for rep in range(reps + 1):  # the first one warms the allocator up for this size
        started = time.process_time()
        (parsed,) = iter_events(chunks)
        if rep:
            costs.append(time.process_time() - started)
        assert len(parsed.data["results"]["text"]) == size
    return median(costs)


def fold_cost(events: int, reps: int) -> tuple[float, float]:
    """Median CPU seconds to fold ``events`` 8 KiB stdout events into an ExecutionResult, and
    to join their texts alone (the minimal consumer's string)."""
    lines = [
        json.dumps({"type": "stdout", "text": f"{i:8}" + "x" * 8183 + "\n"}) for i in range(events)
    ]
    parsed = list(iter_events([("\n\n".join(lines) + "\n\n").encode()]))
    texts = [str(event.text) for event in parsed]
    folds, joins = [], []
    for _ in range(reps):
        started = time.process_time()
        folder = ExecutionFolder()
        for event in parsed:
            folder.add(event)
        assert len(folder.result().stdout) == events * 8192
        folds.append(time.process_time() - started)
        started = time.process_time()
        assert len("".join(texts)) == events * 8192
        joins.append(time.process_time() - started)
    return median(folds), median(joins)


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
    ratio = end_to_end["large"]["client_cpu_s"] / end_to_end["small"]["client_cpu_s"]
    parser_only = {
        f"{mib}MiB@{chunk // 1024}KiB{name}": parse_cost(mib << 20, chunk, args.reps, prefix)
        for name, prefix in (("", b""), ("-sse", b"data: "))
        for chunk in (64 * 1024, 4 * 1024)
        for mib in (1, 2, 4, 8, 16)
    }
    parse_ratio_4k = parser_only["8MiB@4KiB"] / parser_only["1MiB@4KiB"]
    ns_per_byte = {
        key: round(cost / (int(key.split("MiB")[0]) << 20) * 1e9, 2)
        for key, cost in parser_only.items()
    }
    folding = {n: fold_cost(n, args.reps) for n in (800, 6400)}
    fold_over_join = folding[6400][0] / folding[6400][1]
    report(
        "large_events",
        {
            "end_to_end": end_to_end,
            "cpu_large_over_small": round(ratio, 2),
            "parser_only_cpu_s": {k: round(v, 4) for k, v in parser_only.items()},
            "parser_only_ns_per_byte": ns_per_byte,
            "parser_8MiB_over_1MiB_at_4KiB_chunks": round(parse_ratio_4k, 2),
            "result_building_cpu_s": {f"{n}x8KiB": round(c[0], 4) for n, c in folding.items()},
            "join_alone_cpu_s": {f"{n}x8KiB": round(c[1], 4) for n, c in folding.items()},
            "result_building_6400_over_800": round(folding[6400][0] / folding[800][0], 2),
            "join_alone_6400_over_800": round(folding[6400][1] / folding[800][1], 2),
            "goals": {
                "8x larger event <= 10x the CPU (end to end)": verdict(ratio <= 10),
                "result building of 52 MB <= 1.5x its join alone": verdict(fold_over_join <= 1.5),
            },
        },
        args.json,
    )


if __name__ == "__main__":
    main()
