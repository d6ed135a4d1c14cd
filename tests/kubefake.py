"""OpenSandbox on Kubernetes, faked at the contract level (as the server's own tests mock the
cluster): a loopback server that answers the lifecycle API and the server proxy with the
released 1.1.1 server's state sequences, codes and headers, scripted per test.

What it plays (reference: ../shared/reference/opensandbox-1.1.1.md §6 and §7):

- ``POST /v1/sandboxes``: each create takes the next of ``creates`` (default: accepted).
  ``Accept()`` answers 202 ``Running`` (the server rewrites ``Allocated`` so), ``Refuse(...)``
  an error with its code and headers (429 + ``Retry-After``, 403, 504), and with ``leak``
  leaves the sandbox behind, tagged as asked (a rollback that failed on the server).
- ``GET /v1/sandboxes/{id}``: the next of the sandbox's ``states`` (the last one repeats),
  e.g. ``Pending`` -> ``Allocated`` -> ``Running``.
- ``GET /v1/sandboxes/{id}/endpoints/{port}``: ``not_ready`` times 404
  ``KUBERNETES::POD_IP_NOT_AVAILABLE``, then the server-proxy endpoint.
- ``GET /v1/sandboxes`` with ``metadata`` and ``state`` filters (the orphan search, the CLI's
  list: each sandbox in its current state, not moving it on), and ``DELETE``.
- ``/v1/sandboxes/{id}/proxy/44772/...``: execd behind the server proxy: ``/ping``, and
  ``POST /command`` as a healthy ``echo ok`` run unless ``proxy_faults`` names an answer for
  it (502 ``BACKEND_*``, 504 ``BACKEND_TIMEOUT``).
- ``POST /v1/pools``: records the body, answers 201.

Every request is recorded (``server.seen``); :meth:`KubeFake.live` lists the sandboxes that
exist (neither deleted nor refused without a leak), so a test can say none leaked.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from tests.fakeserver import FakeServer, Request

CREATE_ID_KEY = "osb-sync/create-id"
CAPACITY_MESSAGE = "No Pool capacity became available before the acquisition timeout."
_SANDBOX = re.compile(r"^/v1/sandboxes/(?P<id>[^/]+)$")
_ENDPOINT = re.compile(r"^/v1/sandboxes/(?P<id>[^/]+)/endpoints/(?P<port>\d+)$")
_PROXY = re.compile(r"^/v1/sandboxes/(?P<id>[^/]+)/proxy/44772(?P<rest>/.*)$")


@dataclass
class Accept:
    """A create the server accepts: 202 with the create response's state."""

    state: str = "Running"


@dataclass
class Refuse:
    """A create the server refuses: ``status``, ``code``, its message and headers; with
    ``leak``, a sandbox is left behind anyway, tagged as the request was."""

    status: int
    code: str
    message: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    leak: bool = False


def capacity_exhausted(retry_after: str = "30", leak: bool = False) -> Refuse:
    """The released server's pool back-pressure: 429 with ``Retry-After``."""
    headers = {"Retry-After": retry_after}
    return Refuse(429, "KUBERNETES::POOL_CAPACITY_EXHAUSTED", CAPACITY_MESSAGE, headers, leak)


@dataclass
class Box:
    """One sandbox of the fake cluster."""

    id: str
    metadata: dict[str, str]
    states: deque[str]
    not_ready: int = 0
    deleted: bool = False

    def state(self) -> str:
        if len(self.states) > 1:
            return self.states.popleft()
        return self.states[0]


class KubeFake:
    """The fake cluster's API (see the module docstring), on a started FakeServer."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.creates: deque[Accept | Refuse] = deque()
        self.states: list[str] = ["Running"]  # each new sandbox's GET sequence
        self.not_ready = 0  # each new sandbox's 404 POD_IP_NOT_AVAILABLE answers
        self.proxy_faults: dict[tuple[str, str], tuple[int, str]] = {}
        self.boxes: dict[str, Box] = {}
        self.pools: list[Any] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        for method in ("GET", "POST", "DELETE"):
            server.routes[(method, "*")] = self._dispatch

    @property
    def api_base(self) -> str:
        return self.server.api_base

    def live(self) -> list[str]:
        """Ids of the sandboxes that exist now."""
        with self._lock:
            return [b.id for b in self.boxes.values() if not b.deleted]

    def posts(self, path: str) -> list[Any]:
        """The JSON bodies of the POSTs to ``path``."""
        return [json.loads(r.body) for r in self.server.seen("POST", path)]

    # -- the routes ------------------------------------------------------------------------

    def _dispatch(self, req: Request) -> None:
        path = req.route_path
        if req.command == "POST" and path == "/v1/sandboxes":
            return self._create(req)
        if req.command == "GET" and path == "/v1/sandboxes":
            return self._list(req)
        if req.command == "POST" and path == "/v1/pools":
            self.pools.append(req.json)
            body = {"name": req.json.get("name"), "capacitySpec": req.json.get("capacitySpec")}
            return req.send_json(201, body)
        match = _PROXY.match(path)
        if match:
            return self._proxy(req, match["id"], match["rest"])
        match = _ENDPOINT.match(path)
        if match and req.command == "GET":
            return self._endpoint(req, match["id"])
        match = _SANDBOX.match(path)
        if match:
            return self._sandbox(req, match["id"])
        req.send_json(404, {"code": "NOT_FOUND", "message": f"no route {path}"})

    def _new_box(self, metadata: dict[str, str]) -> Box:
        with self._lock:
            box = Box(f"sbx-{next(self._ids)}", dict(metadata), deque(self.states), self.not_ready)
            self.boxes[box.id] = box
        return box

    def _create(self, req: Request) -> None:
        script = self.creates.popleft() if self.creates else Accept()
        metadata = req.json.get("metadata") or {}
        if isinstance(script, Refuse):
            if script.leak:
                self._new_box(metadata)
            body = {"code": script.code, "message": script.message}
            return req.send_json(script.status, body, script.headers)
        box = self._new_box(metadata)
        state = "Running" if script.state == "Allocated" else script.state  # the rewrite
        req.send_json(202, {"id": box.id, "status": {"state": state}, "metadata": metadata})

    def _list(self, req: Request) -> None:
        wanted = {k: v[0] for k, v in parse_qs((req.query.get("metadata") or [""])[0]).items()}
        states = req.query.get("state") or []
        with self._lock:
            items = [
                {"id": b.id, "status": {"state": b.states[0]}, "metadata": b.metadata}
                for b in self.boxes.values()
                if not b.deleted
                and all(b.metadata.get(k) == v for k, v in wanted.items())
                and (not states or b.states[0] in states)
            ]
        pagination = {"page": 1, "pageSize": 200, "totalItems": len(items), "hasNextPage": False}
        req.send_json(200, {"items": items, "pagination": pagination})

    def _known(self, req: Request, sandbox_id: str) -> Box | None:
        box = self.boxes.get(sandbox_id)
        if box is None or box.deleted:
            message = f"Sandbox {sandbox_id} not found"
            req.send_json(404, {"code": "KUBERNETES::SANDBOX_NOT_FOUND", "message": message})
            return None
        return box

    def _sandbox(self, req: Request, sandbox_id: str) -> None:
        box = self._known(req, sandbox_id)
        if box is None:
            return
        if req.command == "DELETE":
            box.deleted = True
            return req.send_raw(204, b"")
        state = box.state()
        status = {"state": state}
        if state == "Allocated":
            status.update(reason="IP_ASSIGNED", message="Pod has IP assigned but not ready")
        req.send_json(200, {"id": box.id, "status": status, "metadata": box.metadata})

    def _endpoint(self, req: Request, sandbox_id: str) -> None:
        box = self._known(req, sandbox_id)
        if box is None:
            return
        if box.not_ready > 0:
            box.not_ready -= 1
            message = "Pod IP is not yet available. The Pod may still be starting."
            body = {"code": "KUBERNETES::POD_IP_NOT_AVAILABLE", "message": message}
            return req.send_json(404, body)
        endpoint = f"127.0.0.1:{self.server.server_address[1]}/v1/sandboxes/{box.id}/proxy/44772"
        req.send_json(200, {"endpoint": endpoint, "headers": {}})

    def _proxy(self, req: Request, sandbox_id: str, rest: str) -> None:
        if self._known(req, sandbox_id) is None:
            return
        fault = self.proxy_faults.get((req.command, rest))
        if fault is not None:
            status, code = fault
            message = f"The backend sandbox 10.0.0.7:44772 failed ({code})"
            return req.send_json(status, {"code": code, "message": message})
        if rest == "/ping":
            return req.send_raw(200, b"")
        if req.command == "POST" and rest == "/command":
            req.start_stream()
            for event in (
                {"type": "init", "text": "cmd-1"},
                {"type": "stdout", "text": "ok"},
                {"type": "execution_complete", "execution_time": 2},
            ):
                req.event(**event)
            return req.end_stream()
        req.send_json(404, {"code": "NOT_FOUND", "message": f"execd has no {rest}"})
