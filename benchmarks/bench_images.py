"""Creates that run an image: first pull, cold and warm creates on a cached image, the default.

Figures (median of ``--runs``; each create is create + ``echo`` + delete over the client):

- first pull: create of a Debian bullseye image (Python 3.9, built with mmdebstrap, pushed to a
  loopback ``docker-registry``) into an empty store: pull, unpack, start;
- cold create on a cached image: the first create of a new server over the filled store;
- warm create: the next ones;
- default image (today's host view) without spares, the same work: the goal is a cached-image
  create within 1.5x of it.

With ``--baseline DIR`` (a worktree of another commit) it measures instead the pull and the
unpack of that image by both trees, side by side, ``--rounds`` rounds whose order alternates
(min / median / max of the wall time and of the CPU time, the process's and skopeo's, and the
ratio of the medians, with the load average): ``pull + unpack``
is a store's ``get`` into an empty store (skopeo's copy from the registry, the unpack, the
store's bookkeeping), ``unpack`` the unpacker alone on a ``dir:`` copy made once, with the
owners a root server gives. Each tree runs in a process of its own (its code through
PYTHONPATH). The layer has no device nodes: trees before issue 37 refuse them.

    python benchmarks/bench_images.py [--runs 5]
    python benchmarks/bench_images.py --baseline /work/base [--rounds 7]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

if "--worker" not in sys.argv:  # a worker imports its own tree's (PYTHONPATH)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import osb_sync
from osb_sync.local import LocalServer
from tests import imagekit


def once(client: osb_sync.Client, template: str | None) -> float:
    started = time.perf_counter()
    with client.create_sandbox(**({"template": template} if template else {})) as sandbox:
        sandbox.commands.run("echo 1")
    return time.perf_counter() - started


def worker(job: dict[str, Any]) -> None:
    """In a tree's process: time its store's pull + unpack, or its unpacker alone; print s."""
    from osb_sync.local.host.images import pull, store, unpack

    owner = unpack.in_range(100000, 100000, 65536) if os.geteuid() == 0 else unpack.server_owned
    work = Path(job["work"])
    started, cpu = time.perf_counter(), _cpu()
    if job["kind"] == "pull + unpack":
        puller = pull.Puller(work / "scratch")
        images = store.ImageStore(work / "store", puller, owner=owner)
        images.get(job["ref"], pull.host_platform())
    else:
        unpack.unpack(Path(job["layout"]), work / "rootfs", owner)
    seconds, cpu = time.perf_counter() - started, _cpu() - cpu
    print(json.dumps({"seconds": seconds, "cpu": cpu, "module": unpack.__file__}))


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (skopeo), user and system."""
    mine, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


def _without_devices(tar_path: Path) -> bytes:
    """The rootfs tarball as a layer, without its device nodes (older trees refuse them)."""
    out = io.BytesIO()
    with tarfile.open(tar_path) as source, tarfile.open(fileobj=out, mode="w") as tar:
        for member in source:
            if not (member.ischr() or member.isblk()):
                tar.addfile(member, source.extractfile(member) if member.isfile() else None)
    return out.getvalue()


def compare(baseline: Path, rounds: int, where: Path | None = None) -> None:
    """Pull + unpack and unpack alone, this tree and `baseline`, interleaved (see above)."""
    from _common import spread

    from osb_sync.local.host.images import pull

    trees = {"this": Path(__file__).resolve().parents[1], "baseline": baseline.resolve()}
    load = [os.getloadavg()[0]]
    got: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(dir=where) as folder:
        work = Path(folder)
        env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        image = imagekit.Image([_without_devices(imagekit.bullseye_tar())], env=env)
        imagekit.write_layout(work / "layout", "v1", [image])
        registry = imagekit.LoopbackRegistry(work / "registry").start()
        try:
            ref = registry.push(work / "layout", "v1", "bullseye")
            copy = work / "copy"
            pull.Puller(work / "scratch").copy(pull.parse(ref), copy, pull.host_platform())
            for index in range(rounds):
                order = list(trees) if index % 2 == 0 else list(reversed(trees))
                for name in order:
                    for kind in ("pull + unpack", "unpack"):
                        job = {"kind": kind, "ref": ref, "layout": str(copy)}
                        job["work"] = tempfile.mkdtemp(dir=folder)
                        done = subprocess.run(
                            [sys.executable, __file__, "--worker", json.dumps(job)],
                            env={**os.environ, "PYTHONPATH": str(trees[name])},
                            cwd=trees[name],
                            capture_output=True,
                            text=True,
                            check=True,
                        )
                        answer = json.loads(done.stdout)
                        assert answer["module"].startswith(str(trees[name])), answer
                        for unit in ("seconds", "cpu"):
                            per_kind = got.setdefault(f"{kind} ({unit})", {})
                            per_kind.setdefault(name, []).append(answer[unit])
                        shutil.rmtree(job["work"])
                        print(
                            f"round {index} {name} {kind}: {answer['seconds']:.2f} s,"
                            f" {answer['cpu']:.2f} s of CPU",
                            flush=True,
                        )
                load.append(os.getloadavg()[0])
        finally:
            registry.stop()
    results: dict[str, Any] = {
        "load_average_1min": load,
        "trees": {k: str(v) for k, v in trees.items()},
    }
    for kind, per_tree in got.items():
        results[kind] = {name: spread(values) for name, values in per_tree.items()}
        results[kind]["ratio_of_medians"] = round(
            statistics.median(per_tree["this"]) / statistics.median(per_tree["baseline"]), 3
        )
    print(json.dumps(results, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="a worktree of the commit to compare")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--work", type=Path, help="where to pull and unpack (default: $TMPDIR)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(json.loads(args.worker))
        return
    if args.baseline is not None:
        compare(args.baseline, args.rounds, args.work)
        return
    runs = args.runs
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        image = imagekit.Image(
            [imagekit.rootfs_layer(imagekit.bullseye_tar())],
            env=["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        )
        imagekit.write_layout(work / "layout", "v1", [image])
        registry = imagekit.LoopbackRegistry(work / "registry").start()
        try:
            ref = registry.push(work / "layout", "v1", "bullseye")
            settings = {"image_store": work / "store", "spare_containers": 0}
            with LocalServer(**settings) as server:  # type: ignore[arg-type]
                client = osb_sync.Client(api_base=server.api_base, create_timeout=600)
                first = once(client, ref)
            with LocalServer(**settings) as server:  # type: ignore[arg-type]
                client = osb_sync.Client(api_base=server.api_base, create_timeout=600)
                cold = once(client, ref)
                warm = statistics.median(once(client, ref) for _ in range(runs))
                default = statistics.median(once(client, None) for _ in range(runs))
        finally:
            registry.stop()
    print(f"first pull (pull, unpack, start): {first:.2f} s")
    print(f"cold create on the cached image:  {cold:.3f} s")
    print(f"warm create on the cached image:  {warm:.3f} s (median of {runs})")
    print(f"default image, no spares:         {default:.3f} s (median of {runs})")
    print(f"cached image / default:           {warm / default:.2f}x (goal: at most 1.5x)")


if __name__ == "__main__":
    main()
