"""Shared helpers of the benchmark and soak scripts: the server process, process stats, counters.

Every script talks to a local server in a separate process (``python -m osb_sync serve``) on
127.0.0.1, so the client's CPU time, RSS and descriptors are its own. Scripts that import
third-party clients first re-run themselves in a private network namespace that has only a
loopback interface (``isolate_network``), so nothing can leave the machine whatever those
packages try at import time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

SERVING = re.compile(r"serving (http://127\.0\.0\.1:\d+/v1)")
# Third-party clients must not fetch anything at import (LiteLLM's model price map).
OFFLINE_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_OFFLINE_MODE": "true"}


def isolate_network() -> None:
    """Re-run this script in a network namespace with only ``lo`` (Linux, root); else warn."""
    os.environ.update(OFFLINE_ENV)
    if os.environ.get("OSB_BENCH_ISOLATED"):
        return
    probe = ["unshare", "-n", "true"]
    if not shutil.which("unshare") or subprocess.run(probe, check=False).returncode != 0:
        print("note: no private network namespace; relying on offline settings", file=sys.stderr)
        return
    env = {**os.environ, "OSB_BENCH_ISOLATED": "1"}
    script = 'ip link set lo up && exec "$0" "$@"'
    cmd = ["unshare", "-n", "sh", "-c", script, sys.executable, *sys.argv]
    sys.exit(subprocess.run(cmd, env=env, check=False).returncode)


@dataclass
class ServerProcess:
    """The local OpenSandbox server running in its own process."""

    proc: subprocess.Popen[str]
    api_base: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc)


@contextlib.contextmanager
def local_server(
    python: str = sys.executable, tree: str | None = None, flags: tuple[str, ...] = ()
) -> Iterator[ServerProcess]:
    """``python -m osb_sync serve --port 0 [flags]`` on 127.0.0.1 until the block ends (the
    osb_sync of source tree `tree`, first on ``PYTHONPATH``, if given)."""
    cmd = [python, "-m", "osb_sync", "serve", "--host", "127.0.0.1", "--port", "0"]
    cmd += ["--allow-unenforced-network-policy", *flags]
    env = {**os.environ, "PYTHONPATH": tree} if tree else None
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=tree
    )
    assert proc.stderr is not None
    api_base = None
    deadline = time.monotonic() + 30
    while api_base is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        found = SERVING.search(line)
        api_base = found.group(1) if found else None
    if api_base is None:
        proc.kill()
        raise RuntimeError("the local server did not start")
    # Keep draining its stderr so that it never blocks on a full pipe.
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    server = ServerProcess(proc, api_base)
    try:
        yield server
    finally:
        server.stop()


def sha256(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of a file, read 1 MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def proc_stats(pid: int | str = "self") -> dict[str, int]:
    """RSS, peak RSS (KiB) and open descriptors of a process, from /proc."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0])
    return {
        "rss_kib": fields.get("VmRSS", 0),
        "peak_kib": fields.get("VmHWM", 0),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def reset_peak_rss() -> None:
    """Make VmHWM start again from the current RSS (Linux ``clear_refs`` 5)."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


class ConnectionCounter:
    """Counts TCP connections a client opens: urllib3's ``create_connection`` and socket connects.

    ``urllib3`` counts what requests (osb_sync) opens; ``sockets`` counts every
    ``socket.connect`` of the process, whatever library made it (httpx for the official SDK).
    """

    def __init__(self) -> None:
        self.urllib3 = 0
        self.sockets = 0
        self.by_address: dict[str, int] = {}  # socket connects per "host:port"
        self._lock = threading.Lock()
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> ConnectionCounter:
        import socket

        import urllib3.util.connection as u3conn

        original_create = u3conn.create_connection
        original_connect = socket.socket.connect

        def create_connection(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.urllib3 += 1
            return original_create(*args, **kwargs)

        def connect(sock: socket.socket, address: Any) -> None:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                where = f"{address[0]}:{address[1]}"
                with self._lock:
                    self.sockets += 1
                    self.by_address[where] = self.by_address.get(where, 0) + 1
            original_connect(sock, address)

        u3conn.create_connection = create_connection  # type: ignore[assignment]
        socket.socket.connect = connect  # type: ignore[method-assign]
        self._undo = [
            lambda: setattr(u3conn, "create_connection", original_create),
            lambda: setattr(socket.socket, "connect", original_connect),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for undo in self._undo:
            undo()

    def reset(self) -> None:
        with self._lock:
            self.urllib3 = self.sockets = 0
            self.by_address = {}


@contextlib.contextmanager
def measured() -> Iterator[dict[str, float]]:
    """Wall and client-process CPU seconds of the block."""
    out: dict[str, float] = {}
    wall, cpu = time.perf_counter(), time.process_time()
    yield out
    out["wall"] = time.perf_counter() - wall
    out["cpu"] = time.process_time() - cpu


class WorkerProcess:
    """A client in a process of its own (``peers.py`` worker mode), asked one op at a time.

    ``tree``: the source tree whose ``osb_sync`` it imports (first on ``PYTHONPATH``).
    """

    def __init__(self, name: str, api_base: str, tree: str, pool_maxsize: int = 32):
        here = os.path.dirname(os.path.abspath(__file__))
        env = {**os.environ, "PYTHONPATH": tree}
        cmd = [sys.executable, os.path.join(here, "peers.py"), name, api_base, str(pool_maxsize)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=here
        )

    def ask(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one op; its answer (RuntimeError if the worker failed it)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker died during {op}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.pop("ok"):
            raise RuntimeError(answer["error"])
        return answer

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.ask("close")
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 15 s; reaped either way."""
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def rotated(names: list[str], rep: int) -> list[str]:
    """``names`` starting at position ``rep`` (the order changes every repetition)."""
    shift = rep % len(names) if names else 0
    return names[shift:] + names[:shift]


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def spread(values: list[float]) -> dict[str, float]:
    """Min, median and max of `values`, rounded to 2 places."""
    return {
        "min": round(min(values), 2),
        "median": round(statistics.median(values), 2),
        "max": round(max(values), 2),
    }


def report(title: str, data: dict[str, Any], json_path: str | None) -> None:
    """Print results as indented JSON, and write them to ``json_path`` when given."""
    text = json.dumps({"benchmark": title, **data}, indent=2, default=str)
    print(text)
    if json_path:
        with open(json_path, "w") as handle:
            handle.write(text + "\n")


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"
