"""Which modules of the local server's host one create goes through, and how often each.

One create (POST /sandboxes with ``resourceLimits``) on a started LocalServer, traced with
``sys.setprofile`` on the thread that runs ``Registry.create``: every call whose function lives
under ``osb_sync.local.host`` is recorded with the module of its caller. A module is *entered*
when a call lands in it from another module; a return to a caller is no call, so not counted.
Prints, per module, how often it was entered and from where (caller module -> callee function),
and the order of entries. The threads a create starts (a container's launch helpers, say) run
untraced: the count is of the create's own thread, the one that answers the request.

    python benchmarks/trace_create.py [--json]
    PYTHONPATH=/work/base2 python benchmarks/trace_create.py   # the tree of another commit
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from types import FrameType
from typing import Any

import requests

import osb_sync
from osb_sync.local import LocalServer
from osb_sync.local.host import registry

HOST = "osb_sync.local.host"
BODY: dict[str, Any] = {
    "image": {"uri": "opensandbox/code-interpreter:v1.1.0"},
    "entrypoint": ["/bin/sh"],
    "resourceLimits": {"cpu": "500m", "memory": "512Mi"},
}


def module_of(frame: FrameType | None) -> str:
    """The module a frame's code belongs to ('' for none)."""
    return "" if frame is None else str(frame.f_globals.get("__name__", ""))


def short(module: str) -> str:
    """`osb_sync.local.host.validation` -> `validation`."""
    return module[len(HOST) + 1 :] if module.startswith(HOST + ".") else module


def trace_one_create() -> list[tuple[str, str, str]]:
    """(caller module, callee module, callee function) of each entry into a host module."""
    entries: list[tuple[str, str, str]] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        callee = module_of(frame)
        if not callee.startswith(HOST):
            return
        caller = module_of(frame.f_back)
        if caller != callee:
            entries.append((short(caller), short(callee), frame.f_code.co_name))

    original = registry.Registry.create

    def traced(self: registry.Registry, ex: Any) -> None:
        sys.setprofile(profile)
        try:
            original(self, ex)
        finally:
            sys.setprofile(None)

    registry.Registry.create = traced  # type: ignore[method-assign]
    try:
        server = LocalServer(ping_interval=0.2, command_grace=0, min_timeout=1)
        with server, requests.Session() as http:
            created = http.post(f"{server.api_base}/sandboxes", json=BODY, timeout=60)
            assert created.status_code == 202, created.text
            http.delete(f"{server.api_base}/sandboxes/{created.json()['id']}", timeout=60)
    finally:
        registry.Registry.create = original  # type: ignore[method-assign]
    return entries


def main() -> None:
    """Trace one create; print the entries per module and the order."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the entries as JSON")
    args = parser.parse_args()
    entries = trace_one_create()
    if args.json:
        print(json.dumps(entries))
        return
    print(f"tree: {osb_sync.__file__}")
    counts = Counter(callee for _, callee, _ in entries)
    sources: dict[str, Counter[str]] = defaultdict(Counter)
    for caller, callee, function in entries:
        sources[callee][f"{caller} -> {function}"] += 1
    print(f"{len(entries)} entries into {len(counts)} host modules during Registry.create\n")
    for module, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        print(f"{count:4d}  {module}")
        for source, times in sorted(sources[module].items()):
            print(f"        {times:3d}x {source}")
    print("\norder:", " | ".join(f"{caller}>{callee}.{fn}" for caller, callee, fn in entries))


if __name__ == "__main__":
    main()
