"""Issue 50's start figures in one run: image vs default, N live vs one, PSS, ready/s.

Each of ``--runs`` runs starts a fresh ``osb-sync serve --spare-containers 0`` (its own
process, an image store of its own in a temporary directory) and measures, in this order:

1. PSS per idle sandbox, for each kind (the default template, then the image; the order
   alternates every run): from no sandbox, ``--pss-count`` (20) idle sandboxes are created and
   the growth of the server's RSS plus the PSS of every process below it is divided by their
   number, so a template started for them is counted over them (``bench_sandbox_memory``'s
   measure, from zero sandboxes instead of from a spare);
2. time to first output with one idle sandbox kept alive (so the execd template stays up):
   ``--rounds`` interleaved rounds (the kinds' order alternates every round) of create +
   ``commands.run("echo hi")`` + delete, the default template vs the image; per op the
   create, the first output and the whole, wall and the client's CPU;
3. the default kind's same op with ``--live`` idle sandboxes alive vs one, measured around the
   ramp as 1 -> N -> 1 (``--rounds`` ops each; "after" shows the drift of the run; the N-live
   stage ``--settle`` seconds after the ramp, default 0), with the
   server's mount table size (lines of ``/proc/<server>/mountinfo``) at each stage;
4. ready sandboxes per second for the (cached) image: ``--creators`` threads (16) each making
   ``--per-creator`` (2) sandboxes (create + ``run_code("1")``, kept until all are made).

The image is Debian bullseye with python3 (``tests/imagekit``'s mmdebstrap build, cached),
written as a local OCI layout and given as ``oci:DIR:v1`` (``--allow-image-path``); the first
create of every run pulls it into the run's store before anything is measured. Per run, a
phase's p50 / p90 (ms) and CPU per op (p50, p90 and mean; client: ``time.process_time``;
server: its own and its reaped children's, ``/proc/<pid>/stat``; machine: ``/proc/stat`` busy
time, everything on the machine); over runs, min / median / max of each run's figure, and
the ratios the issue's goals name, per run. The 1-minute load average is printed at every stage.

    python benchmarks/bench_start.py [--runs 3] [--rounds 30] [--live 300] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import local_server, percentile, report, spread
from bench_ready import machine_busy
from bench_sandbox_memory import per_sandbox, settle

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import osb_sync
from tests import imagekit

TICK = os.sysconf("SC_CLK_TCK")


def load() -> float:
    """The 1-minute load average, printed as it is read."""
    now = round(os.getloadavg()[0], 2)
    print(f"  load average (1 min): {now}", flush=True)
    return now


def server_cpu(pid: int) -> float:
    """CPU seconds of the server process and of its reaped children, user and system."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return sum(int(v) for v in fields[11:15]) / TICK


def mount_lines(pid: int) -> int:
    """Lines of the server's /proc/<pid>/mountinfo: the mounts its namespace holds."""
    with open(f"/proc/{pid}/mountinfo", "rb") as table:
        return table.read().count(b"\n")


class Meter:
    """Wall, client, server and machine CPU of a stretch of ops, per op, in ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.wall, self.client = time.perf_counter(), time.process_time()
        self.server, self.machine = server_cpu(pid), machine_busy()

    def per_op(self, ops: int) -> dict[str, float]:
        return {
            "wall_ms": (time.perf_counter() - self.wall) / ops * 1000,
            "client_cpu_ms": (time.process_time() - self.client) / ops * 1000,
            "server_cpu_ms": (server_cpu(self.pid) - self.server) / ops * 1000,
            "machine_cpu_ms": (machine_busy() - self.machine) / ops * 1000,
        }


def first_output(client: osb_sync.Client, pid: int, template: str | None) -> dict[str, float]:
    """create + commands.run("echo hi") + delete: each step's wall ms; the op's CPU ms (the
    client's, the server's with its reaped children, the machine's)."""
    options = {"template": template} if template else {}
    meter = Meter(pid)
    started = meter.wall
    sandbox = client.create_sandbox(**options)
    created = time.perf_counter()
    got = sandbox.commands.run("echo hi")
    output = time.perf_counter()
    sandbox.delete()
    assert got.stdout == "hi\n" and got.exit_code == 0, got
    cpu = meter.per_op(1)
    return {
        "create_ms": (created - started) * 1000,
        "first_output_ms": (output - started) * 1000,
        "total_ms": cpu.pop("wall_ms"),
        **cpu,
    }


def summary(ops: list[dict[str, float]]) -> dict[str, Any]:
    """p50 / p90 of each op figure (and the mean of the CPU figures: the server's and the
    machine's come in clock ticks)."""
    out: dict[str, Any] = {"ops": len(ops)}
    for key in ops[0]:
        values = [op[key] for op in ops]
        out[key] = {
            "p50": round(statistics.median(values), 1),
            "p90": round(percentile(values, 90), 1),
        }
        if key.endswith("cpu_ms"):
            out[key]["mean"] = round(statistics.fmean(values), 1)
    return out


def interleaved(
    client: osb_sync.Client, pid: int, kinds: dict[str, str | None], rounds: int
) -> dict[str, Any]:
    """`rounds` rounds, one op of each kind per round, the order alternating."""
    ops: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for index in range(rounds):
        for kind in list(kinds) if index % 2 == 0 else list(reversed(kinds)):
            ops[kind].append(first_output(client, pid, kinds[kind]))
    return {kind: summary(got) for kind, got in ops.items()}


def pss(client: osb_sync.Client, pid: int, template: str | None, count: int) -> dict[str, Any]:
    """Per idle sandbox of `template`, from no sandbox to `count` (bench_sandbox_memory's)."""
    before = settle(pid)
    options = {"template": template} if template else {}
    sandboxes = [client.create_sandbox(**options) for _ in range(count)]
    idle = settle(pid)
    parallel(lambda s: s.delete(), sandboxes)
    settle(pid)
    return per_sandbox(before, idle, count)


def parallel(job: Callable[[Any], Any], items: list[Any], threads: int = 8) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(job, items))


def ready_rate(
    client: osb_sync.Client, pid: int, template: str, creators: int, per: int
) -> dict[str, Any]:
    """`creators` threads each make `per` ready sandboxes (create + run_code("1"))."""
    made: list[Any] = []
    lock = threading.Lock()

    def make(_: int) -> None:
        for _ in range(per):
            sandbox = client.create_sandbox(template=template)
            with lock:
                made.append(sandbox)
            got = sandbox.run_code("1")
            assert got.error is None and got.results, got

    meter = Meter(pid)
    try:
        parallel(make, list(range(creators)), creators)
        cpu = meter.per_op(creators * per)
    finally:
        parallel(lambda s: s.delete(), made)
    return {
        "ready_per_second": round(1000 / cpu["wall_ms"], 2),
        "per_ready": {k: round(v, 1) for k, v in cpu.items()},
    }


def one_run(index: int, args: argparse.Namespace, work: Path, image: str) -> dict[str, Any]:
    flags = ("--spare-containers", "0", "--image-store", str(work / f"store{index}"))
    flags += ("--allow-image-path", str(work / "layouts"))
    kinds: dict[str, str | None] = {"default": None, "image": image}
    if index % 2:
        kinds = dict(reversed(kinds.items()))
    got: dict[str, Any] = {"load": [load()]}
    with (
        local_server(flags=flags) as server,
        osb_sync.Client(api_base=server.api_base, create_timeout=600, pool_maxsize=64) as client,
    ):
        pid = server.pid
        for template in kinds.values():  # warm-up: code paths, the pull into the store
            first_output(client, pid, template)
        got["pss_per_idle_sandbox_mib"] = {
            kind: pss(client, pid, template, args.pss_count) for kind, template in kinds.items()
        }
        print(f"  pss: { {k: v['total_mib'] for k, v in got['pss_per_idle_sandbox_mib'].items()} }")
        got["load"].append(load())
        keeper = client.create_sandbox()  # the template stays up
        live: list[Any] = []
        try:
            got["mount_lines"] = {"one live": mount_lines(pid)}
            got["image_vs_default"] = interleaved(client, pid, kinds, args.rounds)
            got["load"].append(load())
            got["one_live_before"] = interleaved(client, pid, {"default": None}, args.rounds)[
                "default"
            ]
            started = time.perf_counter()
            live = parallel(lambda _: client.create_sandbox(), [None] * (args.live - 1), 4)
            got["ramp_seconds"] = round(time.perf_counter() - started, 1)
            got["mount_lines"][f"{args.live} live"] = mount_lines(pid)
            time.sleep(args.settle)  # the ramp's own tail (0: measured at once, as the baseline)
            got["load"].append(load())
            got["n_live"] = interleaved(client, pid, {"default": None}, args.rounds)["default"]
            parallel(lambda s: s.delete(), live)
            live = []
            got["mount_lines"]["one live again"] = mount_lines(pid)
            got["one_live_after"] = interleaved(client, pid, {"default": None}, args.rounds)[
                "default"
            ]
            got["load"].append(load())
            got["image_ready"] = ready_rate(client, pid, image, args.creators, args.per_creator)
        finally:
            parallel(lambda s: s.delete(), live)
            keeper.delete()
    got["load"].append(load())
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--live", type=int, default=300, help="idle sandboxes of the N-live stage")
    parser.add_argument("--settle", type=float, default=0, help="seconds after the ramp")
    parser.add_argument("--pss-count", type=int, default=20)
    parser.add_argument("--creators", type=int, default=16)
    parser.add_argument("--per-creator", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        layout = imagekit.write_layout(
            work / "layouts" / "bullseye",
            "v1",
            [imagekit.Image([imagekit.rootfs_layer(imagekit.bullseye_tar())], env=env)],
        )
        os.chmod(work, 0o755)
        for index in range(args.runs):
            print(f"run {index}", flush=True)
            runs.append(one_run(index, args, work, f"oci:{layout}:v1"))
    results: dict[str, Any] = {
        "settings": vars(args),
        "runs": runs,
        "over_runs": over_runs(runs, args.live),
    }
    report("start", results, args.json)


def over_runs(runs: list[dict[str, Any]], live: int) -> dict[str, Any]:
    """Min / median / max over the runs of each run's p50s and of the goals' ratios."""

    def of(path: Callable[[dict[str, Any]], float]) -> dict[str, float]:
        return spread([path(run) for run in runs])

    first = "first_output_ms"
    return {
        "load_average_1min": of(lambda r: max(r["load"])),
        "default_total_p50_ms": of(lambda r: r["image_vs_default"]["default"]["total_ms"]["p50"]),
        "image_total_p50_ms": of(lambda r: r["image_vs_default"]["image"]["total_ms"]["p50"]),
        "image_over_default_total_p50 (goal <= 1.2)": of(
            lambda r: (
                r["image_vs_default"]["image"]["total_ms"]["p50"]
                / r["image_vs_default"]["default"]["total_ms"]["p50"]
            )
        ),
        "image_over_default_first_output_p50": of(
            lambda r: (
                r["image_vs_default"]["image"][first]["p50"]
                / r["image_vs_default"]["default"][first]["p50"]
            )
        ),
        f"{live}_live_total_p50_ms": of(lambda r: r["n_live"]["total_ms"]["p50"]),
        f"{live}_live_create_p50_ms": of(lambda r: r["n_live"]["create_ms"]["p50"]),
        "one_live_create_p50_ms (before)": of(lambda r: r["one_live_before"]["create_ms"]["p50"]),
        f"{live}_live_over_one_total_p50 (goal <= 1.3 at 300)": of(
            lambda r: r["n_live"]["total_ms"]["p50"] / r["one_live_before"]["total_ms"]["p50"]
        ),
        "one_live_after_over_before_total_p50 (drift)": of(
            lambda r: (
                r["one_live_after"]["total_ms"]["p50"] / r["one_live_before"]["total_ms"]["p50"]
            )
        ),
        f"{live}_live_over_one_server_cpu_per_op": of(
            lambda r: (
                r["n_live"]["server_cpu_ms"]["mean"] / r["one_live_before"]["server_cpu_ms"]["mean"]
            )
        ),
        "pss_default_mib (goal <= 6.8)": of(
            lambda r: r["pss_per_idle_sandbox_mib"]["default"]["total_mib"]
        ),
        "pss_image_mib (goal <= 6.8)": of(
            lambda r: r["pss_per_idle_sandbox_mib"]["image"]["total_mib"]
        ),
        "default_server_cpu_ms_per_op_mean": of(
            lambda r: r["image_vs_default"]["default"]["server_cpu_ms"]["mean"]
        ),
        "image_server_cpu_ms_per_op_mean": of(
            lambda r: r["image_vs_default"]["image"]["server_cpu_ms"]["mean"]
        ),
        "image_ready_per_second": of(lambda r: r["image_ready"]["ready_per_second"]),
        "image_ready_machine_cpu_ms": of(lambda r: r["image_ready"]["per_ready"]["machine_cpu_ms"]),
    }


if __name__ == "__main__":
    main()
