"""Fault timings: a stopped (SIGSTOP) or absent lifecycle server, and the orphan lookup.

Against a local server in its own process, ``--reps`` times each:

- ``acquire_stopped``: ``SandboxPool.acquire(timeout=T)`` while the server is stopped;
- ``acquire_down``: the same against a port where nothing listens (connect refused);
- ``create_stopped``: ``create_sandbox()`` while the server is stopped, with
  ``create_timeout=C`` (and ``read_timeout=C``, like the issue's measurement);
- ``resume_to_deletion``: after that failed create, the time from the server's ``SIGCONT`` to
  the end of the background lookup that deleted the sandbox the server made from the buffered
  request (checked: a deletion was logged, and no sandbox carries the test tag afterwards).

    python benchmarks/bench_faults.py
    python benchmarks/bench_faults.py --reps 3 --acquire-timeout 3 --create-timeout 3

``--waits`` times instead the client's own waits (issue 24) against a loopback fake whose
routes accept a request and never answer, with the client's default ``read_timeout`` (60 s):

- ``connect_paused``: ``connect(id, ready_timeout=5)`` on a paused sandbox whose ``/ping``
  the server's proxy holds unanswered (what a paused Docker sandbox does);
- ``run_code_stalled``: ``run_code(timeout=2)`` on an execd that never answers ``/code``.

    python benchmarks/bench_faults.py --waits --reps 3
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ServerProcess, local_server, median, report
from osb_sync import Client, OpenSandboxError, SandboxPool, SandboxTimeoutError, TransportError
from osb_sync import _orphans as orphans  # no public way to wait for the background lookups


class DeletionLog(logging.Handler):
    """Counts the lookup's "deleting sandbox ... left by a failed create" lines."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.deleted = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "left by a failed create" in record.getMessage():
            self.deleted += 1


def closed_port_base() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def timed_acquire(client: Client, timeout: float) -> float:
    with SandboxPool(client, size=0, max_size=1) as pool:
        started = time.monotonic()
        try:
            pool.acquire(timeout=timeout)
        except SandboxTimeoutError:
            return time.monotonic() - started
        raise RuntimeError("acquire returned a sandbox from a server that cannot answer")


def acquire_stopped(server: ServerProcess, timeout: float, create_timeout: float) -> float:
    client = Client(server.api_base, read_timeout=create_timeout, create_timeout=create_timeout)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        return timed_acquire(client, timeout)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        wait_for_searches()


def create_then_resume(
    server: ServerProcess, create_timeout: float, deletions: DeletionLog, rep: int
) -> tuple[float, float]:
    """(create duration on the stopped server, SIGCONT -> lookup done)."""
    client = Client(server.api_base, read_timeout=create_timeout, create_timeout=create_timeout)
    tag = {"bench": f"stalled-{rep}"}
    before = deletions.deleted
    os.kill(server.pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        client.create_sandbox(metadata=tag)
    except TransportError:
        pass
    finally:
        failed = time.monotonic()
        os.kill(server.pid, signal.SIGCONT)
    resumed = time.monotonic()
    wait_for_searches()
    done = time.monotonic()
    if deletions.deleted != before + 1:
        raise RuntimeError("the lookup deleted nothing: the figure would be meaningless")
    with Client(server.api_base) as observer:
        if list(observer.list_sandboxes(metadata=tag)):
            raise RuntimeError("the sandbox of the failed create is still there")
    return failed - started, done - resumed


def wait_for_searches(limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while orphans.searches_pending():
        if time.monotonic() > deadline:
            raise RuntimeError("a lookup did not finish")
        time.sleep(0.005)


def stalled_fake() -> Any:
    """A fake OpenSandbox on loopback: sandbox ``sbx-1`` is Paused, and ``/ping`` and
    ``/code`` accept the request and never answer (until the returned event is set)."""
    from tests.fakeserver import FakeServer

    server = FakeServer()
    release = threading.Event()
    port = server.server_address[1]

    def stall(req: Any) -> None:
        release.wait(120)
        req.fin()

    server.routes.update(
        {
            ("GET", "/v1/sandboxes/sbx-1"): lambda req: req.send_json(
                200, {"id": "sbx-1", "status": {"state": "Paused", "reason": "Paused"}}
            ),
            ("GET", "/v1/sandboxes/sbx-1/endpoints/44772"): lambda req: req.send_json(
                200, {"endpoint": f"127.0.0.1:{port}/execd"}
            ),
            ("GET", "/execd/ping"): stall,
            ("POST", "/execd/code"): stall,
        }
    )
    return server, release


def timed_failure(call: Any) -> tuple[float, str]:
    started = time.monotonic()
    try:
        call()
    except OpenSandboxError as exc:
        return time.monotonic() - started, f"{type(exc).__name__}: {str(exc)[:100]}"
    raise RuntimeError("the call succeeded against a stalled server")


def waits(reps: int) -> dict[str, object]:
    server, release = stalled_fake()
    results: dict[str, list[float]] = {"connect_paused": [], "run_code_stalled": []}
    errors: dict[str, str] = {}
    with server:
        try:
            for _ in range(reps):
                with Client(server.api_base) as client:
                    took, errors["connect_paused"] = timed_failure(
                        functools.partial(client.connect, "sbx-1", ready_timeout=5)
                    )
                    results["connect_paused"].append(took)
                    sandbox = client.connect("sbx-1", health_check=False)
                    took, errors["run_code_stalled"] = timed_failure(
                        functools.partial(sandbox.run_code, "print(1)", timeout=2)
                    )
                    results["run_code_stalled"].append(took)
        finally:
            release.set()
    return {
        "read_timeout_s": 60.0,
        **{name: {**summary(values), "error": errors[name]} for name, values in results.items()},
    }


def summary(values: list[float]) -> dict[str, object]:
    return {"each": [round(v, 2) for v in values], "median": round(median(values), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--acquire-timeout", type=float, default=3.0)
    parser.add_argument("--create-timeout", type=float, default=3.0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--waits", action="store_true", help="time the client's waits instead")
    args = parser.parse_args()
    if args.waits:
        report("faults: client waits", waits(args.reps), args.json)
        return
    deletions = DeletionLog()
    logging.getLogger("osb_sync").addHandler(deletions)
    results: dict[str, list[float]] = {
        k: [] for k in ("acquire_stopped", "acquire_down", "create_stopped", "resume_to_deletion")
    }
    with local_server() as server:
        try:
            for rep in range(args.reps):
                results["acquire_stopped"].append(
                    acquire_stopped(server, args.acquire_timeout, args.create_timeout)
                )
                with Client(closed_port_base()) as down:
                    results["acquire_down"].append(timed_acquire(down, args.acquire_timeout))
                create, to_deletion = create_then_resume(
                    server, args.create_timeout, deletions, rep
                )
                results["create_stopped"].append(create)
                results["resume_to_deletion"].append(to_deletion)
        finally:
            os.kill(server.pid, signal.SIGCONT)
    report(
        "faults",
        {
            "acquire_timeout_s": args.acquire_timeout,
            "create_timeout_s": args.create_timeout,
            **{name: summary(values) for name, values in results.items()},
        },
        args.json,
    )


if __name__ == "__main__":
    main()
