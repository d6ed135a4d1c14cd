"""``osb-sync cp`` of a large file out of a sandbox and into one: the client's peak RSS (issue 38,
item 1; issue 49, row 1).

The local server runs in its own process; each ``osb-sync cp`` runs in its own process too, and
its peak RSS is read from ``wait4`` (the kernel's ``ru_maxrss`` of that process alone). A
sandbox holds ``--mib`` MiB of random bytes in ``/tmp/bench/big.bin``; the copies:

- ``dir``: ``cp SB:/tmp/bench DEST`` (a directory: search, then the file through a directory
  descriptor);
- ``file``: ``cp SB:/tmp/bench/big.bin DEST``;
- ``tar``: ``cp SB:/tmp/bench -`` to ``/dev/null`` (a tar stream);
- ``small``: ``cp`` of a 6-byte file, the process's own baseline;
- ``in-file``: ``cp big.bin SB:/tmp/in/big.bin`` (the copy out, back in);
- ``in-dir``: ``cp DIR SB:/tmp/indir`` (a directory holding it);
- ``in-tar``: ``tar cf - -C DIR . | cp - SB:/tmp/intar`` (a tar stream on stdin).

The copies are compared with the sandbox's file (sha256 on both sides). Goal: a 2 GiB
file copies in under 64 MiB of client RSS, each way of copying. ``--tree DIR`` runs the cp of
another source tree (its ``osb_sync`` first on ``PYTHONPATH``), say the one before issue 38.

    python benchmarks/bench_cp.py [--mib 2048] [--tree DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import local_server, report, sha256, verdict

import osb_sync

GOAL_MIB = 64


def run_cp(
    api_base: str, src: str, dest: str, tree: str | None, tar_of: str | None = None
) -> dict[str, float]:
    """``python -m osb_sync cp SRC DEST`` in its own process (``tar_of``: a tar stream of that
    directory on its stdin): exit status, seconds, peak RSS."""
    started = time.monotonic()
    out = subprocess.DEVNULL if dest == "-" else None
    env = {**os.environ, "PYTHONPATH": tree} if tree else None
    tar = None
    if tar_of is not None:
        tar = subprocess.Popen(["tar", "cf", "-", "-C", tar_of, "."], stdout=subprocess.PIPE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "osb_sync", "cp", "--api-base", api_base, src, dest],
        stdin=tar.stdout if tar else None,
        stdout=out,
        env=env,
        cwd=tree,
    )
    if tar is not None:
        assert tar.stdout is not None
        tar.stdout.close()  # the cp's now
    _, status, usage = os.wait4(proc.pid, 0)
    if tar is not None:
        tar.wait()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "exit": proc.returncode,
        "seconds": round(time.monotonic() - started, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # KiB on Linux
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--tree", help="the osb_sync source tree whose cp runs (default: this)")
    parser.add_argument("--json")
    args = parser.parse_args()
    data: dict[str, Any] = {"file_mib": args.mib, "tree": args.tree or "this one"}
    with local_server() as server, osb_sync.Client(server.api_base) as client:
        # The local server's sandbox disk is a tmpfs, charged to its memory: room for the file
        # and its copy in.
        room = f"{2 * (args.mib // 1024) + 2}Gi"
        limits = {"cpu": "1", "memory": room, "ephemeral-storage": room}
        with client.create_sandbox(resource_limits=limits) as sandbox:
            made = sandbox.commands.run(
                "mkdir -p /tmp/bench && echo small > /tmp/small.txt && "
                f"head -c {args.mib}M /dev/urandom > /tmp/bench/big.bin && "
                "sha256sum /tmp/bench/big.bin",
                timeout=600,
            ).check()
            remote = made.stdout.split()[0]
            sid = sandbox.id
            with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
                for way, src, dest, copy in (
                    ("small", "/tmp/small.txt", "small", None),
                    ("dir", "/tmp/bench", "dir", "dir/big.bin"),
                    ("file", "/tmp/bench/big.bin", "f", "f"),
                    ("tar", "/tmp/bench", "-", None),
                ):
                    target = dest if dest == "-" else f"{tmp}/{dest}"
                    data[way] = run_cp(server.api_base, f"{sid}:{src}", target, args.tree)
                    if copy is not None:
                        data[way]["same"] = sha256(Path(tmp, copy)) == remote
                        if copy != "f":
                            Path(tmp, copy).unlink()
                Path(tmp, "in").mkdir()
                Path(tmp, "f").rename(Path(tmp, "in", "big.bin"))
                for way, src, dest, copy, tar_of in (
                    ("in-file", f"{tmp}/in/big.bin", "/tmp/in/big.bin", "/tmp/in/big.bin", None),
                    ("in-dir", f"{tmp}/in", "/tmp/indir", "/tmp/indir/big.bin", None),
                    ("in-tar", "-", "/tmp/intar", "/tmp/intar/big.bin", f"{tmp}/in"),
                ):
                    data[way] = run_cp(server.api_base, src, f"{sid}:{dest}", args.tree, tar_of)
                    summed = sandbox.commands.run(f"sha256sum {copy} && rm -f {copy}", timeout=600)
                    data[way]["same"] = summed.stdout.split()[:1] == [remote]
    ways = ("dir", "file", "tar", "in-file", "in-dir", "in-tar")
    met = all(
        data[w]["exit"] == 0 and data[w]["peak_rss_mib"] < GOAL_MIB and data[w].get("same", True)
        for w in ways
    )
    data["goal"] = f"each copy of {args.mib} MiB under {GOAL_MIB} MiB of client RSS"
    data["verdict"] = verdict(met)
    report("osb-sync cp out of a sandbox and into one", data, args.json)


if __name__ == "__main__":
    main()
