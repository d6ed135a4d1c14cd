"""Issue 45: the client's peak RSS while execd sends one 100 MiB line that is not an event.

A server process (so its memory is not the client's) answers ``POST /command`` and ``POST /code``
with ``init`` and then one line of ``x`` bytes (100 MiB by default), with or without a final
newline, in 64 KiB chunks. The client (this process) runs ``commands.run`` and ``run_code``
at the default cap (``MAX_OUTPUT_BYTES``, 10 MiB), expects ``OutputLimitExceeded``, and reports
its peak RSS (``VmHWM``) above the RSS it had before the case, each case in a fresh process.
Before issue 45 the line was buffered up to the wire guard (4 x the cap + 1 MiB) and, with a
newline, dropped without an error; ``--baseline DIR`` runs the same cases on another tree
(``git archive 7667201 | tar -x -C DIR``).

    flock /work/bench.lock python benchmarks/bench_long_line.py [--mib 100] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import proc_stats, reset_peak_rss

SERVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MIB, NEWLINE = int(sys.argv[1]), sys.argv[2] == "1"
BLOCK = b"x" * 65536

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self.chunk(b'{"type":"init","text":"run-1"}\n\n')
            for _ in range(MIB * 16):
                self.chunk(BLOCK)
            if NEWLINE:
                self.chunk(b"\n")
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass
        self.close_connection = True
    def do_DELETE(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def case(url: str, kind: str) -> dict[str, object]:
    from osb_sync import OutputLimitExceeded, Sandbox

    with Sandbox.from_execd(url) as sandbox:
        before = proc_stats()["rss_kib"]
        reset_peak_rss()
        started = time.monotonic()
        try:
            if kind == "command":
                sandbox.commands.run("true")
            else:
                sandbox.run_code("1")
            outcome = "no error"
        except OutputLimitExceeded as exc:
            outcome = f"OutputLimitExceeded: {str(exc)[:70]}..."
        peak = proc_stats()["peak_kib"]
    return {
        "outcome": outcome,
        "rss_before_mib": round(before / 1024, 1),
        "peak_mib": round(peak / 1024, 1),
        "peak_above_before_mib": round((peak - before) / 1024, 1),
        "seconds": round(time.monotonic() - started, 2),
    }


def worker(url: str, kind: str) -> None:
    import osb_sync  # noqa: F401 - imported before the baseline, as a user's process has it

    print(json.dumps(case(url, kind)))


def run_cases(mib: int, tree: str | None) -> dict[str, object]:
    results = {}
    env = {**os.environ, "PYTHONPATH": tree} if tree else None
    for newline in (False, True):
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(mib), "1" if newline else "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            url = f"http://127.0.0.1:{server.stdout.readline().strip()}"
            for kind in ("command", "code"):
                ran = subprocess.run(
                    [sys.executable, __file__, "--worker", url, kind],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                    timeout=600,
                )
                name = f"{kind}, {'with' if newline else 'without'} newline"
                results[name] = json.loads(ran.stdout)
        finally:
            server.kill()
            server.wait()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=100, help="the line's size in MiB")
    parser.add_argument("--baseline", help="another tree to run the same cases on")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    import osb_sync

    report = {"line_mib": args.mib, "cap_mib": osb_sync.MAX_OUTPUT_BYTES / (1 << 20)}
    report["this tree"] = run_cases(args.mib, None)
    if args.baseline:
        report["baseline"] = run_cases(args.mib, args.baseline)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
