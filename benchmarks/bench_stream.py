"""Streaming: 50 MB of stdout through run_code, against two baselines on the same execd stream.

Three consumers read the same ``POST /code`` stream of the same sandbox on the same local server
(a separate process, so its CPU is not counted), interleaved, ``--reps`` times each:

- ``osb_sync``: ``sandbox.run_code(...)`` with the cap raised;
- ``raw``: plain ``requests`` ``iter_content`` with no parsing (the transport limit);
- ``minimal``: split lines and ``json.loads`` each event, joining stdout (the parsing limit).

Reported: wall throughput (MB of stdout per second) and client CPU seconds per 50 MB, medians,
and the ratios the goals are about. ``--profile`` adds a cProfile of one osb_sync run.
``--corpus small-events`` streams a recorded-style corpus of ~50k mostly small events from a
replay execd instead (``_replay.py``), where per-event costs dominate.

    python benchmarks/bench_stream.py
    python benchmarks/bench_stream.py --corpus small-events
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
from collections.abc import Callable, Iterator

import requests
from _common import local_server, measured, median, report, verdict

from osb_sync import Client, Sandbox

CHUNK = 65536
PIECE = 64 * 1024  # the program writes its output in pieces of this size


def program(total: int) -> str:
    """Python code that writes exactly ``total`` bytes to stdout."""
    full, rest = divmod(total, PIECE)
    return (
        "import sys\n"
        f"piece = 'x' * {PIECE - 1} + '\\n'\n"
        f"for _ in range({full}):\n"
        "    sys.stdout.write(piece)\n"
        f"sys.stdout.write('y' * {rest})\n"
    )


def via_osb_sync(sandbox: Sandbox, code: str, total: int) -> int:
    result = sandbox.run_code(code, max_output_bytes=4 * total + (1 << 20))
    assert len(result.stdout) == total, len(result.stdout)
    return total


@contextlib.contextmanager
def replay_server(mb: float) -> Iterator[tuple[str, int]]:
    """``_replay.py`` in its own process: (execd endpoint, stdout bytes of its corpus)."""
    script = os.path.join(os.path.dirname(__file__), "_replay.py")
    proc = subprocess.Popen([sys.executable, script, str(mb)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    _, url, stdout = proc.stdout.readline().split()
    try:
        yield url.removeprefix("http://"), int(stdout)
    finally:
        proc.terminate()
        proc.wait()


@contextlib.contextmanager
def target(args: argparse.Namespace) -> Iterator[tuple[Client, Sandbox, int]]:
    """The client, the sandbox to stream from, and the stdout bytes one run yields."""
    if args.corpus == "small-events":
        with (
            replay_server(args.mb) as (endpoint, total),
            Client("http://127.0.0.1:9/v1", read_timeout=120) as client,
        ):
            yield client, Sandbox.from_execd(f"http://{endpoint}", read_timeout=120), total
        return
    with (
        local_server() as server,
        Client(server.api_base, read_timeout=120) as client,
        client.create_sandbox(allow_internet_access=True) as sandbox,
    ):
        yield client, sandbox, int(args.mb * 1_000_000)


def open_stream(session: requests.Session, sandbox: Sandbox, code: str) -> requests.Response:
    body = {"code": code, "context": {"language": "python"}}
    headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
    response = session.post(
        sandbox.execd_url + "/code",
        json=body,
        headers={**headers, **sandbox.execd_headers},
        stream=True,
        timeout=(10, 120),
    )
    response.raise_for_status()
    return response


def via_raw(session: requests.Session, sandbox: Sandbox, code: str, total: int) -> int:
    """The transport limit: read the bytes, parse nothing."""
    received = 0
    with open_stream(session, sandbox, code) as response:
        for chunk in response.iter_content(CHUNK):
            received += len(chunk)
    assert received > total
    return total


def via_minimal(session: requests.Session, sandbox: Sandbox, code: str, total: int) -> int:
    """The parsing limit: split lines, json.loads each event, join the stdout text."""
    stdout: list[str] = []
    tail = b""
    with open_stream(session, sandbox, code) as response:
        for chunk in response.iter_content(CHUNK):
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            for line in lines:
                if line:
                    event = json.loads(line)
                    if event.get("type") == "stdout":
                        stdout.append(event["text"])
    text = "".join(stdout)
    assert len(text) == total, len(text)
    return total


def profile_once(run: Callable[[], int], top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0, help="stdout per run, in MB (10^6)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--corpus",
        choices=["local", "small-events"],
        default="local",
        help="local: the local server runs Python that prints (large coalesced events); "
        "small-events: a replay execd sends ~50k mostly small events, one HTTP chunk each",
    )
    parser.add_argument("--json")
    args = parser.parse_args()

    with target(args) as (_client, sandbox, total), requests.Session() as session:
        code = program(total)
        variants: dict[str, Callable[[], int]] = {
            "osb_sync": lambda: via_osb_sync(sandbox, code, total),
            "raw": lambda: via_raw(session, sandbox, code, total),
            "minimal": lambda: via_minimal(session, sandbox, code, total),
        }
        for run in variants.values():  # warm up: worker, pools, caches
            run()
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        names = list(variants)
        for rep in range(args.reps):
            for name in names[rep % 3 :] + names[: rep % 3]:  # rotate the order
                with measured() as m:
                    variants[name]()
                samples[name].append(m)
        profile = profile_once(variants["osb_sync"], 25) if args.profile else None

    per_50mb = 50_000_000 / total
    results = {}
    for name, runs in samples.items():
        wall = median([r["wall"] for r in runs])
        cpu = median([r["cpu"] for r in runs])
        results[name] = {
            "wall_s": round(wall, 3),
            "stdout_MB_per_s": round(total / 1e6 / wall, 1),
            "client_cpu_s_per_50MB": round(cpu * per_50mb, 3),
            "all_cpu_s": [round(r["cpu"], 3) for r in runs],
            "all_wall_s": [round(r["wall"], 3) for r in runs],
        }
    cpu_ratio = results["osb_sync"]["client_cpu_s_per_50MB"] / max(
        results["minimal"]["client_cpu_s_per_50MB"], 1e-9
    )
    wall_ratio = results["osb_sync"]["stdout_MB_per_s"] / results["minimal"]["stdout_MB_per_s"]
    data = {
        "corpus": args.corpus,
        "stdout_bytes": total,
        "reps": args.reps,
        "results": results,
        "cpu_osb_over_minimal": round(cpu_ratio, 2),
        "throughput_osb_over_minimal": round(wall_ratio, 2),
        "goals": {
            "client CPU <= 1.5x minimal": verdict(cpu_ratio <= 1.5),
            "wall throughput >= 0.9x minimal": verdict(wall_ratio >= 0.9),
        },
    }
    report("stream", data, args.json)
    if profile:
        print(profile)


if __name__ == "__main__":
    main()
