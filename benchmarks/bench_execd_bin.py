"""Bring your own execd: the real execd (+ Jupyter) in each sandbox against our execd, same run.

Figures, for `LocalServer()` and `LocalServer(execd=..., jupyter=...)` (isolated sandboxes):

- create + run `print(1)` + delete of one sandbox over HTTP (median of `--runs`, >= 5; the
  two servers interleaved, order alternating);
- memory per idle sandbox: (growth of this process's RSS, which hosts the server, plus the RSS
  of every process of the sandboxes: bwrap outside, the PID namespace, slirp4netns) divided by
  `--idle` sandboxes, right after create and again after one `print(1)` each (the real execd
  starts its Python kernel on the first run). RSS counts shared pages in full.

    PYTHONPATH=. python benchmarks/bench_execd_bin.py [--runs 7] [--idle 3] [--execd PATH]
        [--jupyter PATH] [--json out.json]

Defaults: shared/opensandbox-execd/execd beside the repository, run-execd's Jupyter venv.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path
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


def shared_execd() -> str | None:
    """`$OSB_REAL_EXECD_DIR/execd`, else shared/opensandbox-execd/execd beside a parent."""
    if os.environ.get("OSB_REAL_EXECD_DIR"):
        return str(Path(os.environ["OSB_REAL_EXECD_DIR"]) / "execd")
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "shared" / "opensandbox-execd" / "execd"
        if candidate.is_file():
            return str(candidate)
    return None


def run_execd_venv() -> Path:
    """run-execd's Jupyter venv (`$OSB_EXECD_JUPYTER_VENV`, else the cache folder)."""
    if os.environ.get("OSB_EXECD_JUPYTER_VENV"):
        return Path(os.environ["OSB_EXECD_JUPYTER_VENV"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache) / "osb-execd-jupyter"


def rss_kib(pid: int | str) -> int:
    """Resident set of `pid` in KiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE // 1024
    except OSError:
        return 0


def run_print(http: requests.Session, server: LocalServer, sandbox_id: str) -> bool:
    """Run `print(1)`; whether its whole output came (real execd loses late events now and
    then: counted, not fatal)."""
    endpoint = http.get(f"{server.api_base}/sandboxes/{sandbox_id}/endpoints/44772").json()
    ran = http.post(
        f"http://{endpoint['endpoint']}/code",
        json={"code": "print(1)", "context": {"language": "python"}},
        headers=endpoint["headers"],
    )
    events = [json.loads(block) for block in ran.content.split(b"\n\n") if block.strip()]
    stdout = "".join(e.get("text", "") for e in events if e.get("type") == "stdout")
    assert ran.status_code == 200 and stdout in ("", "1", "1\n"), ran.content
    return stdout == "1\n"


def create_run_delete(server: LocalServer, http: requests.Session) -> tuple[float, bool]:
    """Seconds for one sandbox's create, one `print(1)` and its delete; whole output?"""
    started = time.perf_counter()
    created = http.post(f"{server.api_base}/sandboxes", json=CREATE)
    assert created.status_code == 202, created.text
    sandbox_id = created.json()["id"]
    whole = run_print(http, server, sandbox_id)
    assert http.delete(f"{server.api_base}/sandboxes/{sandbox_id}").status_code == 204
    return time.perf_counter() - started, whole


def sandbox_rss(server: LocalServer, sandbox_id: str) -> tuple[int, int]:
    """(processes, KiB) of one sandbox: its PID namespace, bwrap outside, slirp4netns."""
    container = server._registry.find(sandbox_id).container  # type: ignore[union-attr]
    pids = container.members()
    if container._proc is not None:
        pids.append(container._proc.pid)
    if container._slirp is not None:
        pids.append(container._slirp.pid)
    return len(pids), sum(rss_kib(pid) for pid in pids)


def idle_memory(server: LocalServer, http: requests.Session, count: int) -> dict[str, Any]:
    """KiB per idle sandbox (server growth + sandbox processes), before and after one run."""
    before = rss_kib("self")
    ids = [
        http.post(f"{server.api_base}/sandboxes", json=CREATE).json()["id"] for _ in range(count)
    ]
    figures: dict[str, Any] = {}
    try:
        for label in ("after_create", "after_one_run"):
            if label == "after_one_run":
                for sandbox_id in ids:
                    run_print(http, server, sandbox_id)
            time.sleep(2.0)  # let start-up settle
            sizes = [sandbox_rss(server, sandbox_id) for sandbox_id in ids]
            growth = rss_kib("self") - before
            figures[label] = {
                "processes_per_sandbox": sizes[0][0],
                "kib_per_sandbox": round((growth + sum(kib for _, kib in sizes)) / count),
                "server_growth_kib_per_sandbox": round(growth / count),
            }
    finally:
        for sandbox_id in ids:
            http.delete(f"{server.api_base}/sandboxes/{sandbox_id}")
    return figures


def measure(options: dict[str, dict[str, Any]], runs: int, idle: int) -> dict[str, Any]:
    """Both servers side by side: create+run+delete interleaved (order alternating), then the
    idle memory of each in turn."""
    walls: dict[str, list[float]] = {name: [] for name in options}
    lost = dict.fromkeys(options, 0)
    with requests.Session() as http, contextlib.ExitStack() as stack:
        servers = {
            name: stack.enter_context(LocalServer(isolation=True, **extra))
            for name, extra in options.items()
        }
        for server in servers.values():
            create_run_delete(server, http)  # warm-up: probes, imports, page cache
        for run in range(runs):
            order = list(servers) if run % 2 == 0 else list(reversed(servers))
            for name in order:
                wall, whole = create_run_delete(servers[name], http)
                walls[name].append(wall)
                lost[name] += not whole
        return {
            name: {
                "create_run_delete_s_median": round(median(walls[name]), 3),
                "create_run_delete_s_all": [round(w, 3) for w in walls[name]],
                "runs_that_lost_output": lost[name],
                "idle": idle_memory(server, http, idle),
            }
            for name, server in servers.items()
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--idle", type=int, default=3)
    parser.add_argument("--execd", default=shared_execd())
    parser.add_argument("--jupyter", default=str(run_execd_venv() / "bin" / "jupyter"))
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.runs < 5 or not args.execd:
        parser.error("--runs must be at least 5, and --execd is needed where no build is found")
    data: dict[str, Any] = {"runs": args.runs, "idle_sandboxes": args.idle}
    binary = {"execd": args.execd, "jupyter": args.jupyter}
    data.update(measure({"our_execd": {}, "execd_binary": binary}, args.runs, args.idle))
    ours, theirs = data["our_execd"], data["execd_binary"]
    data["create_run_delete_ratio"] = round(
        theirs["create_run_delete_s_median"] / ours["create_run_delete_s_median"], 2
    )
    report("bring your own execd", data, args.json)


if __name__ == "__main__":
    main()
