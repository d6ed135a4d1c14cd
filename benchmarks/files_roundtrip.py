"""Upload and download a 100 MB file through osb_sync; report the client's peak memory.

Usage: python benchmarks/files_roundtrip.py [--mb 100]

The local server runs in its own process (``osb-sync serve``), so the client's RSS is its own.
Goal (issue 4): the round trip works with the client's peak memory under 50 MB above its
baseline, i.e. nothing holds the file in memory.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import sha256

import osb_sync


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "osb_sync", "serve", "--port", str(port),
         "--allow-unenforced-network-policy"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as tmp:
            source, target = Path(tmp) / "src.bin", Path(tmp) / "back.bin"
            with source.open("wb") as handle:
                for _ in range(args.mb):
                    handle.write(os.urandom(1 << 20))
            client = osb_sync.Client(f"http://127.0.0.1:{port}/v1")
            deadline = time.monotonic() + 10
            while True:
                try:
                    sandbox = client.create_sandbox()
                    break
                except osb_sync.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            with sandbox:
                baseline = peak_rss_mb()
                started = time.monotonic()
                sandbox.files.upload(source, "big.bin")
                uploaded = time.monotonic()
                written = sandbox.files.download("big.bin", target)
                done = time.monotonic()
                peak = peak_rss_mb()
            same = sha256(source) == sha256(target) and written == source.stat().st_size
    finally:
        server.terminate()
        server.wait(10)
    print(f"file: {args.mb} MB, round trip identical: {same}")
    print(f"upload {uploaded - started:.2f} s, download {done - uploaded:.2f} s")
    print(f"client peak RSS: {peak:.1f} MB (baseline before the transfer {baseline:.1f} MB, "
          f"increase {peak - baseline:.1f} MB); goal: increase under 50 MB -> "
          f"{'met' if peak - baseline < 50 and same else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
