"""Ready sandboxes per second on the local server, warm spares, and where a start's time goes.

A sandbox is *ready* when its create returned Running and its first ``run_code("1")`` was
answered. Figures, for this tree and for ``--baseline DIR`` (a worktree of another commit),
side by side in one run, the trees' rounds interleaved (the order alternates every round),
min / median / max of ``--rounds``:

- ready sandboxes per second: ``--creators`` threads (16) each making ``--per-creator``
  sandboxes (create + ``run_code("1")``, kept alive until the round ends, then deleted), no
  spares, over one ``osb_sync.Client`` of *this* tree; the server's CPU (its own plus its
  reaped children's) per ready sandbox, which a loaded machine disturbs less than the rate;
  the machine's CPU per ready sandbox (``/proc/stat``, busy time over the creates: client,
  server, sandboxes and kernel, and whatever else runs), and the CPU of the sandboxes' live
  processes by kind (bwrap, the placeholder, execd, the code worker), read before the deletes;
- ``--image``: the same for a cached registry image (Debian bullseye from ``tests/imagekit``,
  pushed to a loopback registry and pulled once into a store both trees' servers share);
- warm spare: create-to-Running of a sandbox served from a ready spare (``spare_containers=1``,
  the spare given time to start before each create), p50, and + first ``run_code("1")``;
- where the time goes: the server runs in a worker process that wraps, from outside the
  product code, the steps a start goes through (directories and id ownership, cgroups, bwrap's
  options, the fork of bwrap, bwrap setting up its namespaces and mounts up to the child's pid,
  the id maps, execd's start, the claim) and reports the mean per start; the seccomp filter's
  load is not a step the server sees (bwrap does it): ``--micro`` times bwrap with and without
  ``--seccomp`` on one trivial command, and the overlay (an image's root) ``rootfs.Layer``.

    python benchmarks/bench_ready.py [--baseline /work/perf29-base] [--rounds 5] [--image]

``--as-user NAME`` (root; this tree readable by every user, e.g. a copy under ``/tmp``) makes
the baseline this tree's server run as that user (``runuser``, ``--user-python``, default the
system's): the ratios are then root's over the user's, rounds interleaved as with a tree.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import spread

HERE = Path(__file__).resolve().parent
TREE = HERE.parent


# --- the worker: one server of one tree, instrumented from outside ------------------------------


def _instrument() -> dict[str, list[float]]:
    """Wrap the start steps of this process's local server; seconds per step, per call."""
    from osb_sync.local.host import cgroup, container, identity

    spent: dict[str, list[float]] = defaultdict(list)
    lock = threading.Lock()

    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                with lock:
                    spent[name].append(time.perf_counter() - started)

        return wrapper

    box = container.SandboxContainer
    box.__init__ = timed("dirs + id ownership", box.__init__)  # type: ignore[method-assign]
    box._options = timed("bwrap options (memfds, staging)", box._options)  # type: ignore[method-assign]
    box._make_cgroups = timed("cgroups made", box._make_cgroups)  # type: ignore[method-assign]
    box.launch = timed("launch (total)", box.launch)  # type: ignore[method-assign]
    box.claim = timed("claim (env, token, serving)", box.claim)  # type: ignore[method-assign]
    identity.write_maps = timed("id mapping (uid/gid maps)", identity.write_maps)
    cgroup.Cgroup.join = timed("cgroups joined", cgroup.Cgroup.join)  # type: ignore[method-assign]
    for name in ("execd_template", "zygote"):  # a tree with the execd template (zygote: before 40)
        try:
            template = importlib.import_module(f"osb_sync.local.host.{name}").TEMPLATE
        except ImportError:
            continue
        template.fork = timed(
            "template: fork into the namespaces, until execd's pid", template.fork
        )
        break
    spawner = container.SPAWNER
    spawner.run = timed("fork + exec of bwrap (spawner)", spawner.run)  # type: ignore[method-assign]
    read_until = container.read_until
    in_launch = threading.local()

    def read(fd: int, end: bytes, deadline: float) -> bytes:
        started = time.perf_counter()
        got = b""
        try:
            got = read_until(fd, end, deadline)
            return got
        finally:
            if end == b"}":
                name = "bwrap: clone into new namespaces, until the child's pid"
            elif got == b"up\n":  # the execd template's placeholder
                name = "after the maps: bwrap mounts + seccomp load, exec sh (template), up"
            elif getattr(in_launch, "on", False):
                name = (
                    "until ready: bwrap mounts + seccomp load, exec python, execd imports"
                    " (template: the forked execd's start)"
                )
            else:
                name = "execd serving (wait inside claim)"
            with lock:
                spent[name].append(time.perf_counter() - started)

    container.read_until = read  # type: ignore[assignment]
    launch = box.launch

    def flagged(self: Any, *args: Any) -> Any:
        in_launch.on = True
        try:
            return launch(self, *args)
        finally:
            in_launch.on = False

    box.launch = flagged  # type: ignore[method-assign]
    return spent


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy so far (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


KINDS = (  # (what a process is, a mark of its command line), first match wins
    ("bwrap (outside and the namespace's init)", "bwrap"),
    ("placeholder sh (template)", "echo up;"),
    ("execd, forked by the template", "runpy.run_path"),
    ("execd, a new python (main.py)", "main.py"),
    ("code worker (_worker.py)", "_worker.py"),
)


def cpu_by_kind(root: int) -> dict[str, float]:
    """CPU seconds of each kind of live process below `root` (its own, not its children's).

    The template itself (a child of the server, not of a sandbox) is counted with the execds
    it forked, and the execds' own; a process that already ended (the template's middle
    child, a command) is in no kind but in the machine's figure.
    """
    from bench_sandbox_memory import children

    spent: dict[str, float] = defaultdict(float)
    for pid in children(root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as raw:
                line = raw.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        for kind, mark in KINDS:
            if mark in line[:200]:
                spent[kind] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
                break
    return spent


def worker(settings: dict[str, Any]) -> None:
    """Serve until stdin closes; print the api base first and the step timings last (JSON)."""
    from osb_sync.local import LocalServer

    spent = _instrument()
    with LocalServer(**settings) as server:
        print(json.dumps({"api_base": server.api_base}), flush=True)
        for line in sys.stdin:
            if line.strip() == "mark":  # the measured part starts now
                spent.clear()
                cpu = _cpu_seconds()
                print(json.dumps({"marked": True}), flush=True)
            elif line.strip() == "report":
                used = _cpu_seconds() - cpu
                steps = {k: [len(v), sum(v)] for k, v in spent.items()}
                print(json.dumps({"cpu": used, "steps": steps}), flush=True)
            elif line.strip() == "spares":
                pool = server._registry.spares  # type: ignore[union-attr]
                deadline = time.monotonic() + 60
                while not pool.ready() and time.monotonic() < deadline:
                    time.sleep(0.02)
                print(json.dumps({"spares": len(pool.ready())}), flush=True)


@dataclass(frozen=True)
class Side:
    """What a round's server runs: a tree's code, as this process's user or as `user` (with
    `python`, from a world-readable tree: `runuser`, root only)."""

    tree: Path
    user: str | None = None
    python: str = sys.executable


class Worker:
    """A worker process of one tree (its code through PYTHONPATH)."""

    def __init__(self, side: Side, settings: dict[str, Any]) -> None:
        env = {**os.environ, "PYTHONPATH": str(side.tree)}
        cmd = [side.python, __file__, "--worker", json.dumps(settings, default=str)]
        if side.user is not None:
            path = f"PYTHONPATH={side.tree}"
            cmd = ["runuser", "-u", side.user, "--", "env", "PATH=/usr/bin:/bin", path, *cmd]
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=side.tree
        )
        self.api_base = self.ask(None)["api_base"]

    def ask(self, line: str | None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError("the worker ended")
        return json.loads(answer)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


# --- the parent: this tree's client drives both trees' servers -----------------------------------


def ready_round(
    side: Side, settings: dict[str, Any], creators: int, per: int, template: str | None
) -> dict[str, Any]:
    """One round: `creators` threads each make `per` ready sandboxes; rate, CPU, steps."""
    import osb_sync

    server = Worker(side, settings)
    try:
        client = osb_sync.Client(api_base=server.api_base, create_timeout=300, pool_maxsize=64)
        options = {"template": template} if template else {}
        server.ask("mark")
        sandboxes: list[Any] = []
        lock = threading.Lock()

        created: list[float] = []
        first_run: list[float] = []

        def make(_: int) -> None:
            for _ in range(per):
                started = time.perf_counter()
                sandbox = client.create_sandbox(**options)
                running = time.perf_counter()
                got = sandbox.run_code("1")
                assert got.error is None and got.results, got
                with lock:
                    sandboxes.append(sandbox)
                    created.append(running - started)
                    first_run.append(time.perf_counter() - running)

        started, busy = time.perf_counter(), machine_busy()
        with ThreadPoolExecutor(creators) as pool:
            list(pool.map(make, range(creators)))
        wall = time.perf_counter() - started
        machine = machine_busy() - busy
        kinds = cpu_by_kind(server.proc.pid)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda s: s.delete(), sandboxes))
        measured = server.ask("report")  # after the deletes: the containers' CPU is reaped
        client.close()
    finally:
        server.close()
    count = creators * per
    return {
        "rate": count / wall,
        "server_cpu_ms": measured["cpu"] / count * 1000,
        "machine_cpu_ms": machine / count * 1000,
        "cpu_ms_by_kind": {k: v / count * 1000 for k, v in kinds.items()},
        "steps": {
            **measured["steps"],
            "client: create until Running": [len(created), sum(created)],
            'client: first run_code("1") (kernel start + run)': [len(first_run), sum(first_run)],
        },
        "count": count,
    }


def warm_round(side: Side, runs: int) -> dict[str, Any]:
    """Create-to-Running (and + first run) from a ready spare, `runs` times; p50s in ms."""
    import osb_sync

    server = Worker(side, {"spare_containers": 1})
    created, ready = [], []
    try:
        client = osb_sync.Client(api_base=server.api_base, create_timeout=300)
        for _ in range(runs):
            assert server.ask("spares")["spares"] == 1
            started = time.perf_counter()
            sandbox = client.create_sandbox()
            created.append(time.perf_counter() - started)
            got = sandbox.run_code("1")
            assert got.error is None and got.results, got
            ready.append(time.perf_counter() - started)
            sandbox.delete()
        client.close()
    finally:
        server.close()
    return {
        "create_p50_ms": statistics.median(created) * 1000,
        "ready_p50_ms": statistics.median(ready) * 1000,
    }


def micro(runs: int) -> dict[str, float]:
    """bwrap with and without a seccomp filter on `true`, ms (median of `runs`)."""
    from osb_sync.local.host import seccomp

    program = seccomp.host_program() or b""
    base = ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    figures: dict[str, list[float]] = {"bwrap_true_ms": [], "bwrap_true_seccomp_ms": []}
    for _ in range(runs):
        for key in figures:
            fd = os.memfd_create("seccomp", 0)
            os.write(fd, program)
            os.lseek(fd, 0, os.SEEK_SET)
            extra = ["--seccomp", str(fd)] if key.endswith("seccomp_ms") else []
            started = time.perf_counter()
            subprocess.run([*base, *extra, "true"], pass_fds=(fd,), check=True)
            figures[key].append((time.perf_counter() - started) * 1000)
            os.close(fd)
    return {k: statistics.median(v) for k, v in figures.items()}


def cached_image(work: Path) -> tuple[Any, str, Path]:
    """A loopback registry holding bullseye, and a store with it pulled: (registry, ref, store)."""
    sys.path.insert(0, str(TREE))
    import osb_sync
    from osb_sync.local import LocalServer
    from tests import imagekit

    image = imagekit.Image(
        [imagekit.rootfs_layer(imagekit.bullseye_tar())],
        env=["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
    )
    imagekit.write_layout(work / "layout", "v1", [image])
    registry = imagekit.LoopbackRegistry(work / "registry").start()
    ref = registry.push(work / "layout", "v1", "bullseye")
    store = work / "store"
    with LocalServer(image_store=store, spare_containers=0) as server:
        with osb_sync.Client(api_base=server.api_base, create_timeout=600) as client:
            client.create_sandbox(template=ref).delete()
    return registry, ref, store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", type=Path, help="a worktree of the commit to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--creators", type=int, default=16)
    parser.add_argument("--per-creator", type=int, default=2)
    parser.add_argument("--warm-runs", type=int, default=15)
    parser.add_argument("--image", action="store_true", help="also a cached registry image")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--as-user",
        help="the baseline is this tree's server run as this user (root only; a tree every"
        " user reads, e.g. a copy under /tmp): root's figures over a user's",
    )
    parser.add_argument("--user-python", default="/usr/bin/python3", help="with --as-user")
    args = parser.parse_args()
    if args.worker is not None:
        worker(json.loads(args.worker))
        return
    sides = {"this": Side(TREE)}
    if args.baseline:
        sides["baseline"] = Side(args.baseline.resolve())
    elif args.as_user:
        sides["baseline"] = Side(TREE, args.as_user, args.user_python)
    trees = {name: side.tree for name, side in sides.items()}
    load = [os.getloadavg()[0]]
    results: dict[str, Any] = {
        "load_average_1min": load,
        "trees": {k: str(v) for k, v in trees.items()},
        "users": {k: side.user or "this process's" for k, side in sides.items()},
    }
    with tempfile.TemporaryDirectory() as folder:
        registry = None
        kinds: dict[str, tuple[dict[str, Any], str | None]] = {
            "default": ({"spare_containers": 0}, None)
        }
        if args.image:
            registry, ref, store = cached_image(Path(folder))
            kinds["image"] = ({"spare_containers": 0, "image_store": str(store)}, ref)
        try:
            rounds: dict[str, dict[str, list[dict[str, Any]]]] = {
                k: {t: [] for t in trees} for k in kinds
            }
            warm: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
            for index in range(args.rounds):
                order = list(trees) if index % 2 == 0 else list(reversed(trees))
                for name in order:
                    for kind, (settings, template) in kinds.items():
                        got = ready_round(
                            sides[name], settings, args.creators, args.per_creator, template
                        )
                        rounds[kind][name].append(got)
                        print(f"round {index} {name} {kind}: {got['rate']:.2f}/s", flush=True)
                    warm[name].append(warm_round(sides[name], args.warm_runs))
                load.append(os.getloadavg()[0])
        finally:
            if registry is not None:
                registry.stop()
    for kind, per_tree in rounds.items():
        results[kind] = {}
        for name, got in per_tree.items():
            steps: dict[str, list[float]] = defaultdict(list)
            for one in got:
                for step, (calls, total) in one["steps"].items():
                    steps[step].append(total / max(calls, 1) * 1000)
            results[kind][name] = {
                "ready_per_second": spread([g["rate"] for g in got]),
                "server_cpu_ms_per_ready": spread([g["server_cpu_ms"] for g in got]),
                "machine_cpu_ms_per_ready": spread([g["machine_cpu_ms"] for g in got]),
                "cpu_ms_per_ready_by_kind_median": {
                    kind: round(statistics.median(g["cpu_ms_by_kind"].get(kind, 0) for g in got), 1)
                    for kind, _ in KINDS
                },
                "step_mean_ms_median_of_rounds": {
                    k: round(statistics.median(v), 2) for k, v in sorted(steps.items())
                },
            }
        if "baseline" in per_tree:
            rate = [
                a["rate"] / b["rate"]
                for a, b in zip(per_tree["this"], per_tree["baseline"], strict=True)
            ]
            cpu = [
                a["server_cpu_ms"] / b["server_cpu_ms"]
                for a, b in zip(per_tree["this"], per_tree["baseline"], strict=True)
            ]
            machine = [
                a["machine_cpu_ms"] / b["machine_cpu_ms"]
                for a, b in zip(per_tree["this"], per_tree["baseline"], strict=True)
            ]
            results[kind]["ratio_this_over_baseline"] = {
                "rate": spread(rate),
                "cpu": spread(cpu),
                "machine_cpu": spread(machine),
            }
    results["warm_spare"] = {
        name: {
            "create_p50_ms": spread([g["create_p50_ms"] for g in got]),
            "ready_p50_ms": spread([g["ready_p50_ms"] for g in got]),
        }
        for name, got in warm.items()
    }
    results["micro"] = micro(15)
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
