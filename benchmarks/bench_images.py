"""Creates that run an image: first pull, cold and warm creates on a cached image, the default.

Figures (median of ``--runs``; each create is create + ``echo`` + delete over the client):

- first pull: create of a Debian bullseye image (Python 3.9, built with mmdebstrap, pushed to a
  loopback ``docker-registry``) into an empty store: pull, unpack, start;
- cold create on a cached image: the first create of a new server over the filled store;
- warm create: the next ones;
- default image (today's host view) without spares, the same work: the goal is a cached-image
  create within 1.5x of it.

    python benchmarks/bench_images.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import osb_sync
from osb_sync.local import LocalServer
from tests import imagekit


def once(client: osb_sync.Client, template: str | None) -> float:
    started = time.perf_counter()
    with client.create_sandbox(**({"template": template} if template else {})) as sandbox:
        sandbox.commands.run("echo 1")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
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
