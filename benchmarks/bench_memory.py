"""Memory: the client's peak RSS while a run floods output into the default 10 MiB cap.

The code in the sandbox writes stdout forever; the client must stop at ``MAX_OUTPUT_BYTES``
with OutputLimitExceeded (keeping what fit as ``partial``). Peak RSS (VmHWM, reset before each
run) minus the RSS before the first flood (so memory kept between floods counts); goal: under
3x the cap. Medians and maxima of ``--reps``.

    python benchmarks/bench_memory.py
"""

from __future__ import annotations

import argparse
import gc

from _common import local_server, median, proc_stats, report, reset_peak_rss, verdict

from osb_sync import MAX_OUTPUT_BYTES, Client, OutputLimitExceeded

FLOOD = "import sys\nwhile True:\n    sys.stdout.write('x' * 65535 + '\\n')\n"


def one_flood(sandbox: object, baseline: int) -> tuple[int, int]:
    """(peak KiB above ``baseline``, bytes kept in the partial result) of one capped flood."""
    gc.collect()
    reset_peak_rss()
    try:
        sandbox.run_code(FLOOD)  # type: ignore[attr-defined]
    except OutputLimitExceeded as exc:
        kept = len(exc.partial.stdout) if exc.partial is not None else 0
        peak = proc_stats()["peak_kib"]
        del exc
        return peak - baseline, kept
    raise AssertionError("the flood was not capped")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()

    with local_server() as server:
        client = Client(server.api_base, read_timeout=60)
        with client.create_sandbox(allow_internet_access=True) as sandbox:
            for _ in range(20):  # warm up with small runs: worker, pools, caches; no flood yet
                sandbox.run_code("print('x' * 1000)")
            gc.collect()
            baseline = proc_stats()["rss_kib"]  # before any flood: retained memory counts
            runs = [one_flood(sandbox, baseline) for _ in range(args.reps)]
        client.close()

    cap_kib = MAX_OUTPUT_BYTES // 1024
    growth = [g for g, _ in runs]
    report(
        "memory",
        {
            "cap_bytes": MAX_OUTPUT_BYTES,
            "client_rss_before_kib": baseline,
            "peak_growth_kib": growth,
            "peak_growth_median_MiB": round(median(growth) / 1024, 1),
            "peak_growth_max_MiB": round(max(growth) / 1024, 1),
            "partial_stdout_bytes": [k for _, k in runs],
            "goals": {"peak < baseline + 3x cap": verdict(max(growth) < 3 * cap_kib)},
        },
        args.json,
    )


if __name__ == "__main__":
    main()
