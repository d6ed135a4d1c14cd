"""Memory: the client's peak RSS while a run floods output into the default 10 MiB cap.

The code in the sandbox writes stdout forever; the client must stop at ``MAX_OUTPUT_BYTES``
with OutputLimitExceeded (keeping what fit as ``partial``). Peak RSS (VmHWM, reset before each
run) minus the RSS before the first flood (so memory kept between floods counts), read twice:
when the run has raised (the run's own peak: issue 29 goal 4, <= 1.3x the cap) and after the
caller read ``exc.partial.stdout`` (which joins the kept output into one string; issue 16:
under 3x the cap). Min / median / max of ``--reps``.

    python benchmarks/bench_memory.py [--baseline DIR]

``--baseline DIR`` runs the same floods with the osb_sync of another source tree (a worker
process per tree, first on ``PYTHONPATH``), the trees alternating every round.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import local_server, median, proc_stats, report, reset_peak_rss, verdict

from osb_sync import MAX_OUTPUT_BYTES, Client, OutputLimitExceeded

FLOOD = "import sys\nwhile True:\n    sys.stdout.write('x' * 65535 + '\\n')\n"


def one_flood(sandbox: object, baseline: int) -> tuple[int, int, int]:
    """(peak KiB above ``baseline`` when the run raised, the same after reading the partial
    result, bytes kept in it) of one capped flood."""
    gc.collect()
    reset_peak_rss()
    try:
        sandbox.run_code(FLOOD)  # type: ignore[attr-defined]
    except OutputLimitExceeded as exc:
        at_raise = proc_stats()["peak_kib"]
        kept = len(exc.partial.stdout) if exc.partial is not None else 0
        peak = proc_stats()["peak_kib"]
        del exc
        return at_raise - baseline, peak - baseline, kept
    raise AssertionError("the flood was not capped")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("--baseline", help="another source tree, measured alongside")
    parser.add_argument("--rounds", type=int, default=5, help="with --baseline")
    args = parser.parse_args()
    if args.baseline:
        compare(args)
        return

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
    at_raise = [g for g, _, _ in runs]
    growth = [g for _, g, _ in runs]

    def spread(values: list[int]) -> list[float]:
        return [round(f(values) / 1024, 1) for f in (min, median, max)]

    report(
        "memory",
        {
            "cap_bytes": MAX_OUTPUT_BYTES,
            "client_rss_before_kib": baseline,
            "peak_at_raise_MiB_min_med_max": spread(at_raise),
            "peak_at_raise_over_cap_median": round(median(at_raise) / cap_kib, 2),
            "peak_after_reading_partial_MiB_min_med_max": spread(growth),
            "peak_after_reading_over_cap_median": round(median(growth) / cap_kib, 2),
            "peak_at_raise_kib": at_raise,
            "peak_growth_kib": growth,
            "peak_growth_median_MiB": round(median(growth) / 1024, 1),
            "peak_growth_max_MiB": round(max(growth) / 1024, 1),
            "partial_stdout_bytes": [k for _, _, k in runs],
            "goals": {
                "the run's peak (at the raise) <= 1.3x cap (median)": verdict(
                    median(at_raise) <= 1.3 * cap_kib
                ),
                "peak after reading the partial < baseline + 3x cap": verdict(
                    max(growth) < 3 * cap_kib
                ),
            },
        },
        args.json,
    )


def compare(args: argparse.Namespace) -> None:
    """This tree and ``--baseline``, a process each per round (``--reps`` floods), alternating."""
    trees = {"this": Path(__file__).resolve().parents[1], "baseline": Path(args.baseline)}
    seen: dict[str, dict[str, list[int]]] = {name: {"at": [], "after": []} for name in trees}
    for round_ in range(args.rounds):
        for name in list(trees) if round_ % 2 == 0 else list(reversed(trees)):
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                env = {**os.environ, "PYTHONPATH": str(trees[name].resolve())}
                command = [sys.executable, __file__, "--reps", str(args.reps), "--json", out.name]
                subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
                data = json.load(open(out.name))
            seen[name]["at"].append(median(data["peak_at_raise_kib"]))
            seen[name]["after"].append(median(data["peak_growth_kib"]))
    cap_kib = MAX_OUTPUT_BYTES // 1024

    def spread(values: list[int]) -> list[float]:
        return [round(f(values) / cap_kib, 2) for f in (min, median, max)]

    report(
        "memory",
        {
            "trees": {name: str(tree) for name, tree in trees.items()},
            "rounds": args.rounds,
            "floods_per_round": args.reps,
            "load_average": os.getloadavg(),
            "x_cap_min_med_max_of_round_medians": {
                name: {"at_raise": spread(v["at"]), "after_reading_partial": spread(v["after"])}
                for name, v in seen.items()
            },
        },
        args.json,
    )


if __name__ == "__main__":
    main()
