"""Streaming: osb_sync against a minimal consumer of the same execd stream, on five corpora.

Goal 1 of issue 16: client CPU <= 1.2x and wall throughput >= 0.9x of a minimal consumer
(requests ``iter_content(65536)``, split on ``\\n`` (an unfinished line's pieces are joined
once its end arrives, so one 8 MiB line costs linear time), strip an optional ``data:``,
``json.loads``), for

- ``stream_code``: iterating the stream's events, against the minimal consumer summing the
  stdout text (``min_sum``);
- ``run_code``: against the minimal consumer that also builds the stdout string (``min_join``).

Corpora (``--corpus``, default all), about ``--mb`` MB of stdout each:

- ``large``: the local server runs Python writing 64 KiB pieces (large coalesced events);
- ``lines8k``: the local server runs ``sys.stdout.write('x' * 8191 + '\\n')`` in a loop;
- ``small-events``: a replay execd (``_replay.py``) sends ~57k mostly small events, one HTTP
  chunk each;
- ``execd-capture``: the same replay execd sends the HTTP chunks one ``POST /code`` of the
  real execd answered (4000 flushed prints, then 100 000 unflushed lines: small events, then
  Jupyter's coalesced ones), captured once (``--capture``, made with
  ``shared/opensandbox-execd/run-execd`` when missing) and repeated to ``--mb``;
- ``event8m``: the replay execd sends one stdout event of 8 MiB (``--mb`` does not apply).

``--mb`` may list sizes (``--mb 0.001,1,10,100``: how the cost grows, issue 29 goal 6): each
size of each corpus is measured on its own, the trees interleaved. ``--variants`` picks a subset
(``run_code,min_join``: the client against the minimal consumer that joins, issue 29 goal 3).

Servers run in their own processes. The clients run in worker processes, one per source tree:
this checkout and, with ``--baseline DIR``, another one (e.g. a worktree of ``main``), so
before and after are measured in the same run. Every (tree, variant) pair runs once to warm
up, then ``--reps`` times, the order rotating every repetition; medians are reported, and each
tree's ratios are against the minimal consumers measured in its own worker. ``--profile``
adds a cProfile of one ``run_code`` and one ``stream_code`` of this checkout per corpus.

    python benchmarks/bench_stream.py --baseline ../osb-base --reps 7
    python benchmarks/bench_stream.py --corpus small-events --profile
    python benchmarks/bench_stream.py --corpus large --mb 0.001,1,10,100 \
        --variants run_code,min_join
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHUNK = 65536
PIECE = 64 * 1024  # the large corpus writes its output in pieces of this size
CORPORA = ("large", "lines8k", "small-events", "execd-capture", "event8m")
VARIANTS = ("run_code", "min_join", "stream_code", "min_sum")
STREAM_HEADERS = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
CAPTURE_CODE = (
    "for i in range(4000):\n"
    "    print('step', i, 'x' * (i % 90), flush=True)\n"
    "for i in range(100000):\n"
    "    print('line', i, 'y' * (i % 90))\n"
)
CPU_GOAL, WALL_GOAL = 1.2, 0.9


def large_program(total: int) -> str:
    """Python code that writes exactly ``total`` bytes to stdout, in 64 KiB pieces."""
    full, rest = divmod(total, PIECE)
    return (
        "import sys\n"
        f"piece = 'x' * {PIECE - 1} + '\\n'\n"
        f"for _ in range({full}):\n"
        "    sys.stdout.write(piece)\n"
        f"sys.stdout.write('y' * {rest})\n"
    )


def lines8k_program(total: int) -> tuple[str, int]:
    """Python code writing 8 KiB lines (``'x' * 8191 + '\\n'``), and the bytes it writes."""
    count = max(1, total // 8192)
    code = f"import sys\nfor _ in range({count}):\n    sys.stdout.write('x' * 8191 + '\\n')\n"
    return code, count * 8192


# -- the worker: one process per source tree, driven over stdin/stdout ------------------------


def worker() -> None:
    """Run the variants the driver asks for; answer one JSON line per request."""
    import requests

    import osb_sync

    setup = json.loads(sys.stdin.readline())
    sandbox = osb_sync.Sandbox.from_execd(setup["url"], headers=setup["headers"], read_timeout=120)
    session = requests.Session()
    code, total = setup["code"], setup["total"]
    cap = 4 * total + (1 << 20)

    def open_stream() -> requests.Response:
        body = {"code": code, "context": {"language": "python"}}
        headers = {**STREAM_HEADERS, **setup["headers"]}
        response = session.post(
            setup["url"] + "/code", json=body, headers=headers, stream=True, timeout=(10, 120)
        )
        response.raise_for_status()
        return response

    def minimal(texts: Callable[[str], object]) -> None:
        pending: list[bytes] = []  # the unfinished line's pieces (joined once: linear)
        with open_stream() as response:
            for chunk in response.iter_content(CHUNK):
                if b"\n" not in chunk:
                    pending.append(chunk)
                    continue
                if pending:
                    pending.append(chunk)
                    chunk, pending = b"".join(pending), []
                lines = chunk.split(b"\n")
                tail = lines.pop()
                if tail:
                    pending.append(tail)
                for line in lines:
                    if line.startswith(b"data:"):
                        line = line[5:]
                    if line.strip():
                        event = json.loads(line)
                        if event.get("type") == "stdout":
                            texts(event["text"])

    def min_join() -> int:
        parts: list[str] = []
        minimal(parts.append)
        return len("".join(parts))

    def min_sum() -> int:
        size = [0]

        def add(text: str) -> None:
            size[0] += len(text)

        minimal(add)
        return size[0]

    def run_code() -> int:
        return len(sandbox.run_code(code, max_output_bytes=cap).stdout)

    def stream_code() -> int:
        size = 0
        with sandbox.stream_code(code, max_output_bytes=cap) as stream:
            for event in stream:
                if event.type == "stdout" and event.text:
                    size += len(event.text)
        return size

    variants: dict[str, Callable[[], int]] = {
        "run_code": run_code,
        "min_join": min_join,
        "stream_code": stream_code,
        "min_sum": min_sum,
    }
    print(json.dumps({"osb_sync": osb_sync.__file__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        run = variants[request["variant"]]
        if request.get("profile"):
            print(json.dumps({"profile": profiled(run)}), flush=True)
            continue
        wall, cpu = time.perf_counter(), time.process_time()
        got = run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert got == total, (request["variant"], got, total)
        print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)


def profiled(run: Callable[[], object], top: int = 18) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("tottime").print_stats(top)
    return out.getvalue()


class Worker:
    """A worker process importing osb_sync from ``tree``."""

    def __init__(self, tree: Path, setup: dict[str, Any]):
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.imported = self.ask(setup)["osb_sync"]
        expected = str(tree.resolve() / "osb_sync" / "__init__.py")
        assert self.imported == expected, (self.imported, expected)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the worker died (exit {self.proc.wait()})")
        result: dict[str, Any] = json.loads(answer)
        return result

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


# -- the driver ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def real_execd_dir() -> Path | None:
    """run-execd's folder: ``$OSB_REAL_EXECD_DIR``, else ``shared/opensandbox-execd`` above."""
    if os.environ.get("OSB_REAL_EXECD_DIR"):
        return Path(os.environ["OSB_REAL_EXECD_DIR"])
    for parent in HERE.parents:
        if (parent / "shared" / "opensandbox-execd" / "run-execd").is_file():
            return parent / "shared" / "opensandbox-execd"
    return None


def capture_real_execd(path: Path) -> None:
    """Record, as a chunked body, the HTTP chunks the real execd answers ``CAPTURE_CODE`` with."""
    import requests
    from _replay import chunked

    folder = real_execd_dir()
    if folder is None:
        raise SystemExit("no shared/opensandbox-execd: set OSB_REAL_EXECD_DIR or --capture")
    run_execd, port = str(folder / "run-execd"), free_port()
    with tempfile.TemporaryDirectory(prefix="osb-bench-execd-") as state:
        subprocess.run([run_execd, "start", state, str(port)], check=True)
        try:
            url = f"http://127.0.0.1:{port}"
            with requests.Session() as session:
                context = session.post(f"{url}/code/context", json={"language": "python"})
                body = {"code": CAPTURE_CODE, "context": {**context.json(), "language": "python"}}
                response = session.post(
                    f"{url}/code", json=body, headers=STREAM_HEADERS, stream=True, timeout=120
                )
                with response:
                    chunks = list(response.iter_content(None))  # one item per HTTP chunk
        finally:
            subprocess.run([run_execd, "stop", state], check=False)
    path.write_bytes(chunked(chunks))


@contextlib.contextmanager
def replay_server(mb: float, capture: Path | str | None = None) -> Iterator[tuple[str, int]]:
    """``_replay.py`` in its own process: (execd URL, stdout characters of one answer)."""
    command = [sys.executable, str(HERE / "_replay.py"), str(mb)]
    if capture is not None:
        command.append(str(capture))  # a file, or "one-event"
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    _, url, stdout = proc.stdout.readline().split()
    try:
        yield url, int(stdout)
    finally:
        proc.terminate()
        proc.wait()


@contextlib.contextmanager
def source(corpus: str, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """What the workers stream from: execd URL and headers, the code, the stdout it yields."""
    total = int(args.mb * 1_000_000)
    if corpus in ("small-events", "execd-capture", "event8m"):
        capture: Path | str | None = None
        mb = args.mb
        if corpus == "event8m":
            capture, mb = "one-event", (8 << 20) / 1e6
        if corpus == "execd-capture":
            capture = Path(args.capture)
            if not capture.exists():
                capture_real_execd(capture)
        with replay_server(mb, capture) as (url, stdout):
            yield {"url": url, "headers": {}, "code": "replayed", "total": stdout}
        return
    from _common import local_server

    from osb_sync import Client

    if corpus == "large":
        code = large_program(total)
    else:
        code, total = lines8k_program(total)
    with (
        local_server() as server,
        Client(server.api_base, read_timeout=120) as client,
        client.create_sandbox(allow_internet_access=True) as sandbox,
    ):
        yield {
            "url": sandbox.execd_url,
            "headers": sandbox.execd_headers,
            "code": code,
            "total": total,
        }


def measure(corpus: str, trees: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    """Samples of every (tree, variant) pair, interleaved; medians, ratios and verdicts."""
    with source(corpus, args) as setup:
        workers = {name: Worker(tree, setup) for name, tree in trees.items()}
        try:
            pairs = [(name, variant) for name in workers for variant in args.variants]
            for name, variant in pairs:  # warm up: connections, caches, the kernel's state
                workers[name].ask({"variant": variant})
            samples: dict[tuple[str, str], list[dict[str, float]]] = {p: [] for p in pairs}
            for rep in range(args.reps):
                shift = rep % len(pairs)
                for pair in pairs[shift:] + pairs[:shift]:
                    samples[pair].append(workers[pair[0]].ask({"variant": pair[1]}))
            profiles = {}
            if args.profile:
                for variant in ("run_code", "stream_code"):
                    answer = workers["after"].ask({"variant": variant, "profile": True})
                    profiles[variant] = answer["profile"]
        finally:
            for each in workers.values():
                each.close()
    return summarize(corpus, setup["total"], samples, profiles, args.variants)


def summarize(
    corpus: str,
    total: int,
    samples: dict[tuple[str, str], list[dict[str, float]]],
    profiles: dict[str, str],
    variants: tuple[str, ...] = VARIANTS,
) -> dict[str, Any]:
    from _common import median, verdict

    out: dict[str, Any] = {"corpus": corpus, "stdout_bytes": total}
    kinds = [k for k, m in (("run_code", "min_join"), ("stream_code", "min_sum")) if k in variants]
    for name in dict.fromkeys(tree for tree, _ in samples):
        cpu = {v: median([s["cpu"] for s in samples[name, v]]) for v in variants}
        wall = {v: median([s["wall"] for s in samples[name, v]]) for v in variants}
        ratios = {}
        for kind, minimal in (("run_code", "min_join"), ("stream_code", "min_sum")):
            if kind in kinds:
                ratios[f"{kind}_cpu"] = cpu[kind] / cpu[minimal]
                ratios[f"{kind}_throughput"] = wall[minimal] / wall[kind]
                # min / median / max over the rounds of the per-round ratios (same round)
                per_round = [
                    (a["cpu"] / b["cpu"], b["wall"] / a["wall"])
                    for a, b in zip(samples[name, kind], samples[name, minimal], strict=True)
                ]
                out.setdefault("per_round", {})[f"{name}_{kind}"] = {
                    "cpu_ratio_min_med_max": spread([c for c, _ in per_round]),
                    "throughput_ratio_min_med_max": spread([w for _, w in per_round]),
                }
        out[name] = {
            "cpu_s": {v: round(c, 3) for v, c in cpu.items()},
            "wall_s": {v: round(w, 3) for v, w in wall.items()},
            "MB_per_s": {v: round(total / 1e6 / w, 1) for v, w in wall.items()},
            "ratios": {k: round(r, 2) for k, r in ratios.items()},
            "goals": {
                f"{kind} CPU <= {CPU_GOAL}x, throughput >= {WALL_GOAL}x": verdict(
                    ratios[f"{kind}_cpu"] <= CPU_GOAL and ratios[f"{kind}_throughput"] >= WALL_GOAL
                )
                for kind in kinds
            },
            "cpu_s_min_med_max": {
                v: spread([s["cpu"] for s in samples[name, v]]) for v in variants
            },
            "wall_s_min_med_max": {
                v: spread([s["wall"] for s in samples[name, v]]) for v in variants
            },
        }
    if profiles:
        out["profile"] = profiles
    return out


def spread(values: list[float]) -> list[float]:
    """[min, median, max], rounded."""
    from _common import median

    return [round(min(values), 4), round(median(values), 4), round(max(values), 4)]


def main() -> None:
    if sys.argv[1:] == ["--worker"]:
        worker()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="all", help="all, or a list of " + ",".join(CORPORA))
    parser.add_argument("--mb", default="50", help="stdout per run, in MB (10^6); or a list: 1,10")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="a subset of " + ",".join(VARIANTS)
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--baseline", help="another source tree to measure in the same run")
    parser.add_argument(
        "--capture",
        default=os.path.join(tempfile.gettempdir(), "osb-bench-execd-capture.bin"),
        help="the real-execd capture (made with run-execd when missing)",
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()

    # the driver's osb_sync (local server, sandbox set-up) is this checkout's
    sys.path.insert(0, str(HERE.parent))
    paths = [str(HERE.parent), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    from _common import report

    trees = {"after": HERE.parent}
    if args.baseline:
        trees["before"] = Path(args.baseline)
    corpora = CORPORA if args.corpus == "all" else tuple(args.corpus.split(","))
    args.variants = tuple(args.variants.split(","))
    assert set(args.variants) <= set(VARIANTS), args.variants
    sizes = [float(mb) for mb in args.mb.split(",")]
    load_before = os.getloadavg()
    results = []
    for corpus in corpora:
        for mb in sizes if corpus != "event8m" else sizes[:1]:
            args.mb = mb
            results.append(measure(corpus, trees, args))
    data = {
        "trees": {name: str(tree) for name, tree in trees.items()},
        "reps": args.reps,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "corpora": [{k: v for k, v in r.items() if k != "profile"} for r in results],
    }
    report("stream", data, args.json)
    print(f"{'corpus':14} {'tree':7} run_code CPU / thru   stream_code CPU / thru   (vs minimal)")
    for result in results:
        for name in trees:
            r = result[name]["ratios"]
            run = stream = "-"
            if "run_code_cpu" in r:
                run = f"{r['run_code_cpu']:.2f}x / {r['run_code_throughput']:.2f}x"
            if "stream_code_cpu" in r:
                stream = f"{r['stream_code_cpu']:.2f}x / {r['stream_code_throughput']:.2f}x"
            label = f"{result['corpus']}@{result['stdout_bytes'] / 1e6:g}MB"
            print(f"{label:22} {name:7} {run:>21} {stream:>24}")
    for result in results:
        for variant, text in result.get("profile", {}).items():
            print(f"--- profile: {result['corpus']}, {variant}\n{text}")


if __name__ == "__main__":
    main()
