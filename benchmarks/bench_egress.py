"""Egress by name (issue 44): what a policy with rules costs beside allow-all, both through
slirp4netns, in the tests' fake internet (`tests/local/fakenet.py`: namespaces, a fake DNS
server and HTTP hosts; never the real network). Root only.

- create time: ``--creates`` creates of each kind, alternating, POST to its answer (the
  sandbox Running), median; the goal is at most 10% more with a policy.
- memory: ``--count`` idle sandboxes of each kind at once; the server's RSS growth plus the
  PSS of every process below it, per sandbox; the goal is at most 1 MiB more with a policy.
  (The nft sets live in kernel memory, counted in neither.)
- connection latency to a name: in a sandbox, ``--connects`` times a name resolved and a TCP
  connection made to it (glibc caches nothing: each resolves anew), median, allow-all (its
  resolver reached through slirp4netns) against a policy (the server's resolver on the
  namespace's loopback, the sets); the goal is under 5 ms more at the median. Also by
  address only (the sets' lookup alone).
- patch to effect: ``--patches`` times, a PATCH that adds a name, then the first fetch of it
  in the sandbox succeeds (the PATCH's own time is when it takes effect: it answers once
  the resolver's rules changed); and a DELETE, after which the address is refused.

    sudo PYTHONPATH=$PWD python benchmarks/bench_egress.py [--creates 15] [--count 10]
        [--connects 300] [--patches 10] [--json F]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_sandbox_memory import children, pss_kib, rss_kib

from tests.local.fakenet import ZONE, FakeInternet, Relay, fetch_code, parse_result
from tests.local.serverproc import ServerProcess
from tests.local.support import CREATE_BODY, Box, texts

POLICY = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "allowed.test"}]}
CONNECT = r"""
import json, socket, sys, time
name, count = sys.argv[1], int(sys.argv[2])
def once(target):
    start = time.perf_counter()
    address = socket.gethostbyname(target)
    socket.create_connection((address, 80), timeout=5).close()
    return (time.perf_counter() - start) * 1000
[once(name) for _ in range(5)]
by_name = sorted(once(name) for _ in range(count))
address = socket.gethostbyname(name)
by_address = sorted(once(address) for _ in range(count))
print("RESULT" + json.dumps({"name": by_name[count // 2], "address": by_address[count // 2]}))
"""


def body(policy: dict[str, Any] | None) -> dict[str, Any]:
    """A create body: the default image, `policy` (None: allow-all)."""
    return {**CREATE_BODY, "timeout": 600, "networkPolicy": policy if policy else {}}


def create(
    net: SimpleNamespace, http: requests.Session, policy: dict[str, Any] | None
) -> tuple[Box, float]:
    """A sandbox and its create's seconds."""
    start = time.perf_counter()
    box = Box(net, http, body(policy))  # type: ignore[arg-type]
    return box, time.perf_counter() - start


def remove(net: SimpleNamespace, http: requests.Session, box: Box) -> None:
    """Delete it."""
    http.delete(f"{net.api_base}/sandboxes/{box.id}")


def python(box: Box, code: str, *args: str) -> str:
    """`code` run in the sandbox, its stdout."""
    argv = shlex.join(["python3", "-I", "-c", code, *args])
    return "".join(texts(box.command(argv)))


def footprint(pid: int) -> int:
    """The server's RSS plus the PSS of every process below it (KiB)."""
    return rss_kib(pid) + sum(pss_kib(child) for child in children(pid))


def main() -> int:
    """Run the measures; print and optionally write them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creates", type=int, default=15)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--connects", type=int, default=300)
    parser.add_argument("--patches", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    internet = FakeInternet()
    results: dict[str, Any] = {}
    try:
        server = ServerProcess(wrap=internet.wrap())
        relay = Relay(internet.server, server.port)
        net = SimpleNamespace(
            api_base=f"http://127.0.0.1:{relay.port}/v1", root_dir=str(server.root), isolated=True
        )
        http = requests.Session()
        # warm: the spare, the template, the caches
        for policy in (None, POLICY, None, POLICY):
            box, _ = create(net, http, policy)
            remove(net, http, box)

        times: dict[str, list[float]] = {"allow-all": [], "policy": []}
        kinds: list[tuple[str, dict[str, Any] | None]] = [("allow-all", None), ("policy", POLICY)]
        for round_ in range(args.creates):  # the order alternates: neither follows the other
            for kind, policy in kinds if round_ % 2 else kinds[::-1]:
                box, seconds = create(net, http, policy)
                times[kind].append(seconds)
                remove(net, http, box)
        create_ms = {k: statistics.median(v) * 1000 for k, v in times.items()}
        results["create_ms_median"] = create_ms
        results["create_extra_percent"] = 100 * (create_ms["policy"] / create_ms["allow-all"] - 1)

        memory: dict[str, float] = {}
        for kind, policy in (("allow-all", None), ("policy", POLICY)):
            time.sleep(2)
            before = footprint(server.pid)
            boxes = [create(net, http, policy)[0] for _ in range(args.count)]
            for box in boxes:  # each resolves once (its resolver has done its work), both kinds
                python(box, fetch_code(["allowed.test"]))
            time.sleep(2)
            memory[kind] = (footprint(server.pid) - before) / args.count
            for box in boxes:
                remove(net, http, box)
        results["memory_kib_per_sandbox"] = memory
        results["memory_extra_kib"] = memory["policy"] - memory["allow-all"]

        latency: dict[str, Any] = {}
        for kind, policy in (("allow-all", None), ("policy", POLICY)):
            box, _ = create(net, http, policy)
            latency[kind] = parse_result(python(box, CONNECT, "allowed.test", str(args.connects)))
            remove(net, http, box)
        results["connect_ms_median"] = latency
        results["connect_extra_ms"] = {
            k: latency["policy"][k] - latency["allow-all"][k] for k in ("name", "address")
        }

        box, _ = create(net, http, POLICY)
        url = f"{net.api_base}/sandboxes/{box.id}/networkpolicy"
        patched, effect, deleted = [], [], []
        for _ in range(args.patches):
            start = time.perf_counter()
            answer = http.patch(url, json=[{"action": "allow", "target": "also.test"}])
            patched.append(time.perf_counter() - start)
            assert answer.status_code == 200, answer.text
            got = parse_result(python(box, fetch_code(["also.test"])))
            effect.append(time.perf_counter() - start)
            assert got == {"also.test": "ok:also.test"}, got
            start = time.perf_counter()
            answer = http.delete(url, json=["also.test"])
            deleted.append(time.perf_counter() - start)
            got = parse_result(python(box, fetch_code([ZONE["also.test"]])))
            assert got == {ZONE["also.test"]: "net"}, got
        remove(net, http, box)
        results["patch_ms_median"] = statistics.median(patched) * 1000
        results["patch_to_first_fetch_ms_median"] = statistics.median(effect) * 1000
        results["delete_ms_median"] = statistics.median(deleted) * 1000
        relay.close()
        server.stop()
    finally:
        internet.close()
    for key, value in results.items():
        print(f"{key}: {value}")
    if args.json:
        import json

        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
