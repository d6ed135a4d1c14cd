"""Where a create's time goes at 1 live sandbox and at ``--live`` (issue 50, item 2).

An in-process ``LocalServer`` (no spares, the default template; one idle sandbox kept so the
execd template stays up), its start steps wrapped from outside as ``bench_ready.py`` does.
At one live sandbox, at ``--live`` (``--settle`` seconds after the ramp, 30) and at one again:
``--creates`` creates + deletes, and per stage

- each step's mean (ms): directories, cgroups, bwrap's options, the fork of bwrap, bwrap's
  clone into its namespaces until the child's pid, the rest until ready, the claim;
- a cProfile of the handler's ``create`` (the thread that serves the request; the spawner
  thread's fork shows as its wait), top ``--top`` functions by cumulative time;
- the kernel side, from the server's own mount namespace: ``unshare -m true`` and bwrap on
  ``true`` with the server's usual namespaces (median ms of 15), and the lines of
  ``/proc/self/mountinfo``; the server's memory maps, threads and descriptors (what a fork of
  it copies).

    python benchmarks/profile_start.py [--live 300] [--creates 20] [--top 25]

``--repro 0,100,300,1000,3000`` is the same kernel side outside any server: in a private mount
namespace of its own (``unshare -m --propagation private``, root; gone with the process, so
nothing stays mounted) it mounts that many small tmpfs, step by step, and times both commands
at each count (also with 30 more binds, and those from a namespace made before the mounts:
a process that unshared at the start, entered with nsenter).
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench_ready import _instrument

import osb_sync
from osb_sync.local import LocalServer
from osb_sync.local.host import registry

BWRAP = ["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin"]
BWRAP += ["--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64"]
BWRAP += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
# A default sandbox ends with 52 mounts; bwrap 0.8 reads the whole mount table after each bind.
BINDS = [arg for index in range(30) for arg in ("--ro-bind", "/usr/share", f"/tmp/{index}")]


def kernel_side(runs: int = 15, holder: int | None = None) -> dict[str, float]:
    """Median ms of `unshare -m true` and of bwrap on `true` (with 30 more binds, and, given a
    `holder` process, the same entered into its mount namespace); the mount table's lines."""
    commands = {
        "unshare -m true": ["unshare", "-m", "true"],
        "bwrap --unshare-all true": [*BWRAP, "true"],
        "the same + 30 binds": [*BWRAP, *BINDS, "true"],
    }
    if holder is not None:
        name = "the same + 30 binds, from a mount namespace made before the extra mounts"
        commands[name] = ["nsenter", f"--mount=/proc/{holder}/ns/mnt", *BWRAP, *BINDS, "true"]
    figures: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            started = time.perf_counter()
            subprocess.run(argv, check=True)
            figures[name].append((time.perf_counter() - started) * 1000)
    out = {k: round(statistics.median(v), 2) for k, v in figures.items()}
    with open("/proc/self/mountinfo", "rb") as table:
        out["mountinfo_lines"] = table.read().count(b"\n")
    with open("/proc/self/maps", "rb") as maps:  # what a fork copies
        out["memory_maps"] = maps.read().count(b"\n")
    out["threads"] = len(os.listdir("/proc/self/task"))
    out["descriptors"] = len(os.listdir("/proc/self/fd"))
    return out


def repro(counts: list[int]) -> None:
    """In a private mount namespace: `kernel_side` with each of `counts` extra tmpfs mounted."""
    if os.environ.get("OSB_REPRO_NS") != "1":
        argv = ["unshare", "-m", "--propagation", "private", sys.executable, *sys.argv]
        sys.exit(subprocess.run(argv, env={**os.environ, "OSB_REPRO_NS": "1"}).returncode)
    libc = ctypes.CDLL(None, use_errno=True)
    top = tempfile.mkdtemp(prefix="osb-repro-")
    made = 0
    holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "infinity"])
    try:
        for count in counts:
            while made < count:
                target = os.path.join(top, str(made))
                os.mkdir(target)
                if libc.mount(b"repro", target.encode(), b"tmpfs", 0, b"size=64k") != 0:
                    raise OSError(ctypes.get_errno(), f"mount {target}")
                made += 1
            print(json.dumps({"extra_mounts": count, **kernel_side(holder=holder.pid)}), flush=True)
    finally:
        holder.kill()
        holder.wait()
        for index in range(made):
            libc.umount2(os.path.join(top, str(index)).encode(), 2)  # MNT_DETACH
        shutil.rmtree(top)


PROFILE: list[cProfile.Profile | None] = [None]  # the stage's (None: not profiled)


def profiled_creates() -> None:
    """Profile every `Registry.create` into the current stage's profile (before the server
    is made: its route table binds the method once)."""
    create = registry.Registry.create

    def profiled(self: Any, ex: Any) -> None:
        profile = PROFILE[0]
        if profile is None:
            return create(self, ex)
        profile.enable()
        try:
            create(self, ex)
        finally:
            profile.disable()

    registry.Registry.create = profiled  # type: ignore[method-assign]


def stage(
    client: osb_sync.Client, spent: dict[str, list[float]], creates: int, top: int
) -> dict[str, Any]:
    """`creates` creates + deletes under cProfile; steps' means, the profile, the kernel side."""
    profile = PROFILE[0] = cProfile.Profile()
    spent.clear()
    walls = []
    for _ in range(creates):
        started = time.perf_counter()
        sandbox = client.create_sandbox()
        walls.append((time.perf_counter() - started) * 1000)
        sandbox.delete()
    PROFILE[0] = None
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(top)
    return {
        "create_ms_p50": round(statistics.median(walls), 1),
        "steps_mean_ms": {k: round(sum(v) / len(v) * 1000, 2) for k, v in sorted(spent.items())},
        "kernel": kernel_side(),
        "profile": text.getvalue(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=300)
    parser.add_argument("--creates", type=int, default=20)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--settle", type=float, default=30, help="seconds after each ramp")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--repro", help="counts of extra mounts, e.g. 0,100,300,1000,3000")
    args = parser.parse_args()
    if args.repro:
        repro([int(c) for c in args.repro.split(",")])
        return
    spent = _instrument()
    profiled_creates()
    results: dict[str, Any] = {"load_average_1min": [os.getloadavg()[0]]}
    with (
        LocalServer(spare_containers=0) as server,
        osb_sync.Client(api_base=server.api_base, create_timeout=600, pool_maxsize=16) as client,
    ):
        keeper = client.create_sandbox()
        client.create_sandbox().delete()  # warm
        live: list[Any] = []
        try:
            results["one live"] = stage(client, spent, args.creates, args.top)
            with ThreadPoolExecutor(4) as pool:
                live = list(pool.map(lambda _: client.create_sandbox(), range(args.live - 1)))
            time.sleep(args.settle)  # the ramp's own load
            results["load_average_1min"].append(os.getloadavg()[0])
            results[f"{args.live} live"] = stage(client, spent, args.creates, args.top)
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda s: s.delete(), live))
            live = []
            time.sleep(args.settle)
            results["load_average_1min"].append(os.getloadavg()[0])
            results["one live again"] = stage(client, spent, args.creates, args.top)
        finally:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda s: s.delete(), live))
            keeper.delete()
    results["load_average_1min"].append(os.getloadavg()[0])
    for name in ("one live", f"{args.live} live", "one live again"):
        print(f"=== {name}: create p50 {results[name]['create_ms_p50']} ms")
        print(json.dumps(results[name]["steps_mean_ms"], indent=1))
        print(json.dumps(results[name]["kernel"]))
        print(results[name]["profile"])
    print("load", results["load_average_1min"])
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
