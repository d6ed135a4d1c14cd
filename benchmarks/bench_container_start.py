"""Start-up cost of local sandboxes: isolated (bubblewrap) against unisolated, same run.

Figures (median of ``--runs``):

- create + run ``print(1)`` + delete of one sandbox, over HTTP against an in-process
  LocalServer: isolated with one warm spare container (``spare_containers=1``, the default)
  back to back (a create may wait for the spare still starting) and with the spare ready
  before each create, isolated without spares (every create a cold start), and unisolated;
- ``osb-sync run "print(1)"`` wall, a fresh process each time (embedded server, default
  isolation: a container where this host allows it);
- the RSS of an idle sandbox's processes (bwrap, its init, our execd, slirp4netns), and of the
  idle server's spare container (what ``spare_containers=1`` costs); RSS counts the
  interpreter's shared pages in full (PSS of the execd is about 60% of its RSS).

    python benchmarks/bench_container_start.py [--runs 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import requests
from _common import median, report

from osb_sync.local import LocalServer

CREATE = {
    "image": {"uri": "opensandbox/code-interpreter:v1.1.0"},
    "entrypoint": ["/bin/sh"],
    "resourceLimits": {},
}
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_kib(pid: int) -> int:
    """Resident set of `pid` in KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE // 1024
    except OSError:
        return 0


def create_run_delete(server: LocalServer, http: requests.Session) -> float:
    """Seconds for one sandbox's create, one `print(1)` and its delete."""
    started = time.perf_counter()
    sandbox = http.post(f"{server.api_base}/sandboxes", json=CREATE).json()
    endpoint = http.get(f"{server.api_base}/sandboxes/{sandbox['id']}/endpoints/44772").json()
    ran = http.post(
        f"http://{endpoint['endpoint']}/code",
        json={"code": "print(1)", "context": {"language": "python"}},
        headers=endpoint["headers"],
    )
    events = [json.loads(block) for block in ran.content.split(b"\n\n") if block.strip()]
    out = "".join(e["text"] for e in events if e.get("type") == "stdout")
    assert out == "1\n", ran.content
    assert http.delete(f"{server.api_base}/sandboxes/{sandbox['id']}").status_code == 204
    return time.perf_counter() - started


def idle_rss(server: LocalServer, http: requests.Session) -> dict[str, Any]:
    """The KiB resident in an idle sandbox's processes (with bwrap outside, slirp4netns)."""
    sandbox_id = http.post(f"{server.api_base}/sandboxes", json=CREATE).json()["id"]
    time.sleep(1.0)
    container = server._registry.find(sandbox_id).container  # type: ignore[union-attr]
    pids = container.members()
    if container.init_pid is not None and container._proc is not None:
        pids.append(container._proc.pid)  # the bwrap that waits outside
    if container._slirp is not None:
        pids.append(container._slirp.pid)  # the network of a sandbox without a policy
    sizes = {pid: rss_kib(pid) for pid in pids}
    http.delete(f"{server.api_base}/sandboxes/{sandbox_id}")
    return {"processes": len(sizes), "rss_kib": sum(sizes.values())}


def spare_ready(server: LocalServer) -> Any:
    """The server's spare container, once it is launched (None without spares)."""
    spares = server._registry.spares  # type: ignore[union-attr]
    if not spares.count:
        return None
    deadline = time.monotonic() + 60
    while not spares.ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    return spares.ready()[0]


def spare_rss(server: LocalServer) -> dict[str, Any]:
    """The KiB resident in the idle server's spare container (bwrap outside included)."""
    container = spare_ready(server)
    pids = [*container.members(), container._proc.pid]
    return {"processes": len(pids), "rss_kib": sum(rss_kib(pid) for pid in pids)}


def cli_run_wall(runs: int) -> float:
    """Median seconds of `osb-sync run "print(1)"` in a fresh process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "osb_sync", "run", "print(1)"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        walls.append(time.perf_counter() - started)
        assert done.stdout == "1\n", done.stderr
    return median(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    data: dict[str, Any] = {"runs": args.runs}
    setups = (("isolated_spare", True, 1), ("isolated_cold", True, 0), ("unisolated", False, 0))
    with requests.Session() as http:
        for name, isolation, spares in setups:
            with LocalServer(isolation=isolation, spare_containers=spares) as server:
                create_run_delete(server, http)  # warm-up: probes, imports
                walls = [create_run_delete(server, http) for _ in range(args.runs)]
                data[f"create_run_delete_s_{name}"] = round(median(walls), 3)
                if spares:
                    walls = []
                    for _ in range(args.runs):
                        spare_ready(server)
                        walls.append(create_run_delete(server, http))
                    data[f"create_run_delete_s_{name}_ready"] = round(median(walls), 3)
                    data["idle_spare_container"] = spare_rss(server)
                data[f"idle_sandbox_{name}"] = idle_rss(server, http)
    data["osb_sync_run_print_1_s"] = round(cli_run_wall(args.runs), 3)
    report("container start", data, args.json)


if __name__ == "__main__":
    main()
