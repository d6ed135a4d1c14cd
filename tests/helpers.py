"""Shared builders for request-shape tests with `responses`."""

from __future__ import annotations

import json
from typing import Any

import responses

import osb_sync

API = "http://osb.test/v1"
SID = "sbx-1"
ENDPOINT = "execd.test:9000/proxy/44772"
TOKEN = "execd-token-0123456789"
KEY = "api-key-0123456789"


def sandbox_body(state: str = "Running", sid: str = SID, **extra: Any) -> dict[str, Any]:
    return {"id": sid, "status": {"state": state}, **extra}


def stream_body(*events: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n\n" for e in events)


RUN_EVENTS = (
    {"type": "init", "text": "ctx-1", "timestamp": 1},
    {"type": "stdout", "text": "42\n", "timestamp": 2},
    {"type": "execution_complete", "timestamp": 3},
)


def add_create(rsps: responses.RequestsMock, state: str = "Running", **kw: Any) -> None:
    rsps.post(f"{API}/sandboxes", json=sandbox_body(state), status=202, **kw)


def add_endpoint(rsps: responses.RequestsMock, sid: str = SID, **kw: Any) -> None:
    if "body" not in kw:
        kw.setdefault("json", {"endpoint": ENDPOINT, "headers": {"X-EXECD-ACCESS-TOKEN": TOKEN}})
    rsps.get(f"{API}/sandboxes/{sid}/endpoints/44772", **kw)


def add_run(rsps: responses.RequestsMock, *events: dict[str, Any], **kw: Any) -> None:
    if "json" not in kw:
        kw.update(body=stream_body(*(events or RUN_EVENTS)), content_type="text/event-stream")
    rsps.post("http://execd.test:9000/proxy/44772/code", **kw)


def add_delete(rsps: responses.RequestsMock, sid: str = SID, status: int = 204) -> None:
    rsps.delete(f"{API}/sandboxes/{sid}", status=status)


def body_of(call: Any) -> Any:
    return json.loads(call.request.body)


def add_ping(rsps: responses.RequestsMock, **kw: Any) -> None:
    kw.setdefault("body", b"")
    rsps.get("http://execd.test:9000/proxy/44772/ping", **kw)


def created_body(**options: Any) -> dict[str, Any]:
    """The ``POST /sandboxes`` body ``create_sandbox(**options)`` sends, less its create-id tag."""
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        add_create(rsps)
        add_endpoint(rsps)
        add_ping(rsps)
        if options.get("snapshot_id"):  # a create from a snapshot waits until it is Ready
            rsps.get(
                f"{API}/snapshots/{options['snapshot_id']}",
                json={"id": options["snapshot_id"], "sandboxId": SID,
                      "status": {"state": "Ready"}, "createdAt": "2026-01-01T00:00:00Z"},
            )  # fmt: skip
        with osb_sync.Client(API) as client:
            client.create_sandbox(**options)
        body: dict[str, Any] = body_of(
            next(call for call in rsps.calls if call.request.method == "POST")
        )
    labels = body["metadata"]
    del labels["osb-sync/create-id"]
    if not labels:
        del body["metadata"]
    return body


class Clock:
    """time.monotonic and time.sleep, faked: a sleep moves the clock (the `clock` fixture of
    tests/unit/conftest.py installs one)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
