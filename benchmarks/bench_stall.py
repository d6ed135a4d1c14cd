"""Stopped runs: how long a stalled stream takes to fail, and how soon a context is free again.

Three measurements:

- ``stall``: a fake execd on 127.0.0.1 sends ``init`` and then nothing, and its interrupt
  route stalls too (a wedged execd). Reported: the time ``run_code`` takes to raise, divided by
  the client's ``read_timeout`` (goal: one read timeout, ratio < 1.2), for several timeouts.
- ``floods``: twelve runs that flood stdout with 8 KiB lines into the output cap, each followed
  by ``run_code("print('after')")`` in the same context; how many print ``after`` (goal: 12).
- ``deadline``: ``run_code("...time.sleep(20)", context=ctx, timeout=2)`` then
  ``run_code("print('alive')", context=ctx)``; the time from the deadline to ``alive``.

``floods`` and ``deadline`` run against the local server (a separate process) and, with
``--run-execd PATH``, against the real OpenSandbox execd started by that ``run-execd`` script
(``start DIR PORT`` on a port from ``bind(0)``, stopped at the end).

    python benchmarks/bench_stall.py
    python benchmarks/bench_stall.py --run-execd ../shared/opensandbox-execd/run-execd
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from _common import local_server, median, report, verdict

from osb_sync import Client, OpenSandboxError, OutputLimitExceeded, Sandbox, SandboxTimeoutError

FLOOD = "while True:\n    print('x' * 8192)"
# Jupyter's IOPub rate limit (1 MB/s over 3 s windows, notebook's default) drops the output of a
# faster flood, so on the real execd the cap may never be reached: flood just under it there.
PACED_FLOOD = "import time\nwhile True:\n    print('x' * 8192)\n    time.sleep(0.01)"
FLOOD_TIMEOUT = 60.0  # a flood whose output is dropped ends here, not never
CHECK_TIMEOUT = 30.0  # the follow-up runs ("after", "alive") never wait longer


def check_run(sandbox: Sandbox, code: str, context: str) -> str:
    """The stdout of a follow-up run, or what went wrong with it."""
    try:
        result = sandbox.run_code(code, context=context, timeout=CHECK_TIMEOUT)
    except OpenSandboxError as exc:
        return f"{type(exc).__name__}: {exc}"
    return result.stdout if result.error is None else f"stdout={result.stdout!r} {result.error}"


SLEEPER = "import time\nprint('start', flush=True)\ntime.sleep(20)"


class WedgedExecd(BaseHTTPRequestHandler):
    """``POST /code``: headers and ``init``, then silence; ``DELETE /code``: silence."""

    protocol_version = "HTTP/1.1"
    release = threading.Event()

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        event = json.dumps({"type": "init", "text": "ctx-1"}).encode() + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.flush()
        self.release.wait(60)

    def do_DELETE(self) -> None:
        self.release.wait(60)


def bare_handle(endpoint: str, read_timeout: float = 60.0) -> Sandbox:
    """A Sandbox on an execd endpoint itself, with no lifecycle API behind it."""
    return Sandbox.from_execd(f"http://{endpoint}", read_timeout=read_timeout)


def measure_stall(read_timeouts: list[float], reps: int) -> dict[str, object]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), WedgedExecd)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    results: dict[str, object] = {}
    try:
        for read_timeout in read_timeouts:
            sandbox = bare_handle(f"127.0.0.1:{server.server_address[1]}", read_timeout)
            times = []
            for _ in range(reps):
                started = time.monotonic()
                with contextlib.suppress(OpenSandboxError):
                    sandbox.run_code("1")
                times.append(time.monotonic() - started)
            ratio = median(times) / read_timeout
            results[f"read_timeout={read_timeout:g}s"] = {
                "error_after_s_median": round(median(times), 3),
                "error_after_s_max": round(max(times), 3),
                "ratio_median": round(ratio, 3),
                "verdict": verdict(ratio < 1.2),
            }
    finally:
        WedgedExecd.release.set()
        server.shutdown()
        server.server_close()
    return results


def measure_floods(sandbox: Sandbox, flood: str, cap: int, context: str) -> dict[str, object]:
    afters, stop_times, messages = 0, [], set()
    for _ in range(12):
        started = time.monotonic()
        try:
            sandbox.run_code(flood, context=context, max_output_bytes=cap, timeout=FLOOD_TIMEOUT)
            messages.add("no error")
        except (OutputLimitExceeded, SandboxTimeoutError) as exc:
            messages.add(f"{type(exc).__name__}: {str(exc).rsplit('; ', 1)[-1]}")
        stop_times.append(time.monotonic() - started)
        outcome = check_run(sandbox, "print('after')", context)
        afters += outcome == "after\n"
        if outcome != "after\n":
            messages.add(f"after: {outcome}")
        print(f"flood: {stop_times[-1]:.3f} s, then {outcome!r}", file=sys.stderr)
    return {
        "flood": flood,
        "cap_bytes": cap,
        "after_printed": f"{afters}/12",
        "flood_call_s_median": round(median(stop_times), 3),
        "outcomes": sorted(messages),
        "verdict": verdict(afters == 12),
    }


def measure_deadline(sandbox: Sandbox, context: str, reps: int) -> dict[str, object]:
    raise_after, alive_after, other = [], [], []
    for _ in range(reps):
        started = time.monotonic()
        with contextlib.suppress(SandboxTimeoutError):
            sandbox.run_code(SLEEPER, context=context, timeout=2)
        deadline = started + 2
        raise_after.append(time.monotonic() - deadline)
        outcome = check_run(sandbox, "print('alive')", context)
        print(f"deadline: then {outcome!r}", file=sys.stderr)
        if outcome == "alive\n":
            alive_after.append(time.monotonic() - deadline)
        else:  # busy, or real execd lost the stdout event (it drops late events now and then)
            other.append(outcome)
    busy = [text for text in other if "busy" in text]
    return {
        "timeout_raised_after_deadline_s_median": round(median(raise_after), 3),
        "alive_printed": f"{len(alive_after)}/{reps}",
        "alive_after_deadline_s_median": round(median(alive_after), 3) if alive_after else None,
        "alive_after_deadline_s_max": round(max(alive_after), 3) if alive_after else None,
        "not_alive": other,
        "verdict": verdict(not busy and bool(alive_after) and max(alive_after) < 5),
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def real_execd(run_execd: str) -> Iterator[str]:
    """The real execd on 127.0.0.1 (``run-execd start``), as an endpoint string."""
    with tempfile.TemporaryDirectory(prefix="osb-real-execd-") as state:
        port = free_port()
        subprocess.run([run_execd, "start", state, str(port)], check=True, capture_output=True)
        try:
            yield f"127.0.0.1:{port}"
        finally:
            subprocess.run([run_execd, "stop", state], check=False, capture_output=True)


def measure_execd(sandbox: Sandbox, flood: str, cap: int, reps: int) -> dict[str, object]:
    context = sandbox.contexts.create("python").id
    return {
        "floods": measure_floods(sandbox, flood, cap, context),
        "deadline": measure_deadline(sandbox, context, reps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--run-execd", help="run-execd script: also measure the real execd")
    parser.add_argument("--real-cap", type=int, default=64 * 1024, help="cap on the real execd")
    parser.add_argument("--json")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-ups (execd, server)
    data: dict[str, object] = {"stall": measure_stall([0.5, 1.0, 2.0], args.reps)}
    with local_server() as server, Client(server.api_base) as client:
        with client.create_sandbox() as sandbox:
            data["local_server"] = measure_execd(sandbox, FLOOD, 256 * 1024, args.reps)
    if args.run_execd:
        with real_execd(args.run_execd) as endpoint:
            sandbox = bare_handle(endpoint)
            data["real_execd"] = measure_execd(sandbox, PACED_FLOOD, args.real_cap, args.reps)
    report("stopped runs: stall vs read_timeout, context free after an interrupt", data, args.json)


if __name__ == "__main__":
    main()
