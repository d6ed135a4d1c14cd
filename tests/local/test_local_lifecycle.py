"""Lifecycle API of the local server: status codes, validation, auth, TTL and states."""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from osb_sync.local import LocalServer
from tests.local.support import (
    CREATE_BODY,
    Box,
    host_pids_with,
    local_server,
    sleep_marker,
    wait_for,
)

JSON_TYPE = {"Content-Type": "application/json"}


def create(local: LocalServer, http: requests.Session, **body: Any) -> requests.Response:
    return http.post(f"{local.api_base}/sandboxes", json={**CREATE_BODY, **body})


def test_create_get_list_delete(local: LocalServer, http: requests.Session) -> None:
    created = create(local, http, metadata={"team": "ml"}, timeout=600, unknownField=1)
    assert created.status_code == 202
    body = created.json()
    assert uuid.UUID(body["id"]).version == 4
    assert body["status"]["state"] == "Running"
    assert body["metadata"] == {"team": "ml"}
    assert "image" not in body and "expiresAt" in body
    got = http.get(f"{local.api_base}/sandboxes/{body['id']}").json()
    assert got["image"] == {"uri": "opensandbox/code-interpreter:v1.1.0"}
    assert got["entrypoint"] == ["/bin/sh"]
    assert set(got["status"]) == {"state", "reason", "message", "lastTransitionAt"}
    assert http.get(f"{local.base_url}/sandboxes/{body['id']}").status_code == 200  # no /v1
    deleted = http.delete(f"{local.api_base}/sandboxes/{body['id']}")
    assert deleted.status_code == 204 and deleted.content == b""
    missing = http.get(f"{local.api_base}/sandboxes/{body['id']}")
    assert missing.status_code == 404
    assert missing.json() == {
        "code": "DOCKER::SANDBOX_NOT_FOUND",
        "message": f"Sandbox {body['id']} not found.",
    }
    assert http.delete(f"{local.api_base}/sandboxes/{body['id']}").status_code == 404


def test_no_timeout_means_no_expiry_and_snapshot_create(
    local: LocalServer, http: requests.Session
) -> None:
    source = create(local, http).json()["id"]
    made = http.post(f"{local.api_base}/sandboxes/{source}/snapshots", json={})
    assert made.status_code == 202 and made.headers["Location"].startswith("/v1/snapshots/")
    snapshot = made.json()["id"]
    ready = lambda: http.get(f"{local.api_base}/snapshots/{snapshot}").json()["status"]["state"]  # noqa: E731
    assert wait_for(lambda: ready() == "Ready", 30)
    body = {"snapshotId": snapshot, "resourceLimits": {}}
    created = http.post(f"{local.api_base}/sandboxes", json=body)
    assert created.status_code == 202
    assert "expiresAt" not in created.json()
    got = http.get(f"{local.api_base}/sandboxes/{created.json()['id']}").json()
    assert got["snapshotId"] == snapshot and "image" not in got


@pytest.mark.parametrize(
    ("body", "loc", "kind"),
    [
        ({"image": {"uri": "x"}, "entrypoint": ["a"]}, ["body", "resourceLimits"], "missing"),
        ({"entrypoint": ["a"], "resourceLimits": {}}, ["body"], "value_error"),
        (
            {"image": {"uri": "x"}, "snapshotId": "s", "entrypoint": ["a"], "resourceLimits": {}},
            ["body"],
            "value_error",
        ),
        ({"image": {"uri": "x"}, "resourceLimits": {}}, ["body"], "value_error"),
        ({**CREATE_BODY, "timeout": 0}, ["body", "timeout"], "greater_than_equal"),
        ({**CREATE_BODY, "timeout": "soon"}, ["body", "timeout"], "int_type"),
        ({**CREATE_BODY, "entrypoint": []}, ["body", "entrypoint"], "too_short"),
        ({**CREATE_BODY, "metadata": {"a": 1}}, ["body", "metadata", "a"], "string_type"),
        ([1, 2], ["body"], "model_attributes_type"),
    ],
)
def test_create_validation_422(
    local: LocalServer, http: requests.Session, body: Any, loc: list[str], kind: str
) -> None:
    answer = http.post(f"{local.api_base}/sandboxes", json=body)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert {"type", "loc", "msg", "input"} <= set(detail[0])
    assert (detail[0]["type"], detail[0]["loc"]) == (kind, loc)


def test_min_timeout_default_is_60(http: requests.Session) -> None:
    with LocalServer() as srv:
        assert create(srv, http, timeout=59).status_code == 422
        assert create(srv, http, timeout=60).status_code == 202


def test_invalid_json_is_422(local: LocalServer, http: requests.Session) -> None:
    answer = http.post(f"{local.api_base}/sandboxes", data=b"{nope", headers=JSON_TYPE)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["type"] == "json_invalid"


@pytest.mark.parametrize(
    "metadata",
    [{"opensandbox.io/x": "1"}, {"k": "-bad"}, {"k": "x" * 64}, {"bad key": "v"}],
)
def test_metadata_labels_400(
    local: LocalServer, http: requests.Session, metadata: dict[str, str]
) -> None:
    answer = create(local, http, metadata=metadata)
    assert answer.status_code == 400
    assert answer.json()["code"] == "SANDBOX::INVALID_METADATA_LABEL"


def test_list_filters_and_pagination(local: LocalServer, http: requests.Session) -> None:
    ids = [create(local, http, metadata={"n": str(i), "team": "a"}).json()["id"] for i in range(3)]
    http.post(f"{local.api_base}/sandboxes/{ids[0]}/pause")
    listed = http.get(f"{local.api_base}/sandboxes").json()
    assert [s["id"] for s in listed["items"]] == ids[::-1]
    assert listed["pagination"] == {
        "page": 1,
        "pageSize": 20,
        "totalItems": 3,
        "totalPages": 1,
        "hasNextPage": False,
    }
    paused = http.get(f"{local.api_base}/sandboxes", params={"state": "paused"}).json()
    assert [s["id"] for s in paused["items"]] == [ids[0]]
    both = http.get(
        f"{local.api_base}/sandboxes", params=[("state", "PAUSED"), ("state", "running")]
    )
    assert both.json()["pagination"]["totalItems"] == 3
    by_meta = http.get(f"{local.api_base}/sandboxes", params={"metadata": "n=1&team=a"}).json()
    assert [s["id"] for s in by_meta["items"]] == [ids[1]]
    page = http.get(f"{local.api_base}/sandboxes", params={"page": 2, "pageSize": 2}).json()
    assert [s["id"] for s in page["items"]] == [ids[0]]
    assert page["pagination"]["totalPages"] == 2 and not page["pagination"]["hasNextPage"]
    bad = http.get(f"{local.api_base}/sandboxes", params={"metadata": "novalue"})
    assert bad.status_code == 400 and bad.json()["code"] == "INVALID_METADATA_FORMAT"
    for params in ({"pageSize": 201}, {"pageSize": 0}, {"page": 0}, {"page": "x"}):
        assert http.get(f"{local.api_base}/sandboxes", params=params).status_code == 422


def test_api_key(http: requests.Session) -> None:
    with local_server(api_key="s3cret") as srv:
        missing = http.get(f"{srv.api_base}/sandboxes")
        assert missing.status_code == 401
        assert missing.json() == {
            "code": "MISSING_API_KEY",
            "message": "Authentication credentials are missing. "
            "Provide API key via OPEN-SANDBOX-API-KEY header.",
        }
        assert "X-Request-ID" in missing.headers
        wrong = http.get(f"{srv.api_base}/sandboxes", headers={"OPEN-SANDBOX-API-KEY": "nope"})
        assert (wrong.status_code, wrong.json()["code"]) == (401, "INVALID_API_KEY")
        assert http.get(f"{srv.base_url}/health").json() == {"status": "healthy"}
        key = {"OPEN-SANDBOX-API-KEY": "s3cret"}
        created = http.post(f"{srv.api_base}/sandboxes", json=CREATE_BODY, headers=key)
        assert created.status_code == 202
        sandbox_id = created.json()["id"]
        endpoint = http.get(f"{srv.api_base}/sandboxes/{sandbox_id}/endpoints/44772", headers=key)
        token = endpoint.json()["headers"]
        # The proxy route needs no API key, only the execd token.
        ping = http.get(f"http://{endpoint.json()['endpoint']}/ping", headers=token)
        assert ping.status_code == 200


def test_request_id(local: LocalServer, http: requests.Session) -> None:
    echoed = http.get(f"{local.base_url}/health", headers={"X-Request-ID": "abc-123"})
    assert echoed.headers["X-Request-ID"] == "abc-123"
    generated = http.get(f"{local.api_base}/sandboxes/nope")
    assert re.fullmatch(r"[0-9a-f]{32}", generated.headers["X-Request-ID"])


def test_endpoints(local: LocalServer, box: Box, http: requests.Session) -> None:
    for flag in ("true", "false"):
        url = f"{local.api_base}/sandboxes/{box.id}/endpoints/8080?use_server_proxy={flag}"
        body = http.get(url).json()
        assert body["endpoint"] == f"127.0.0.1:{local.port}/sandboxes/{box.id}/proxy/8080"
        assert body["headers"] == box.headers
    for port in ("0", "65536"):
        bad = http.get(f"{local.api_base}/sandboxes/{box.id}/endpoints/{port}")
        assert (bad.status_code, bad.json()["code"]) == (400, "DOCKER::INVALID_PORT")
    assert http.get(f"{local.api_base}/sandboxes/{box.id}/endpoints/http").status_code == 422
    assert http.get(f"{local.api_base}/sandboxes/nope/endpoints/80").status_code == 404


def test_pause_resume(local: LocalServer, box: Box, http: requests.Session) -> None:
    pause = http.post(f"{local.api_base}/sandboxes/{box.id}/pause")
    assert pause.status_code == 202 and pause.content == b""
    again = http.post(f"{local.api_base}/sandboxes/{box.id}/pause")
    assert (again.status_code, again.json()["code"]) == (409, "DOCKER::SANDBOX_NOT_RUNNING")
    assert http.get(f"{local.api_base}/sandboxes/{box.id}").json()["status"]["state"] == "Paused"
    refused = box.call("POST", "/command", json={"command": "echo hi"})
    assert refused.status_code == 502
    assert refused.json()["code"] == "GENERAL::UNKNOWN_ERROR"
    assert refused.json()["message"].startswith("Could not connect to the backend sandbox")
    assert http.post(f"{local.api_base}/sandboxes/{box.id}/resume").status_code == 202
    again = http.post(f"{local.api_base}/sandboxes/{box.id}/resume")
    assert (again.status_code, again.json()["code"]) == (409, "DOCKER::SANDBOX_NOT_PAUSED")
    assert box.call("GET", "/ping").status_code == 200


def test_pause_stops_processes(local: LocalServer, box: Box, http: requests.Session) -> None:
    box.command("sh -c 'while :; do date +%s%N >> tick; sleep 0.05; done'", background=True)
    tick = f"{box.dir}/tick"
    assert wait_for(lambda: os.path.exists(tick) and Path(tick).read_text().count("\n") > 2)
    http.post(f"{local.api_base}/sandboxes/{box.id}/pause")
    time.sleep(0.2)
    frozen = Path(tick).read_text()
    time.sleep(0.4)
    assert Path(tick).read_text() == frozen
    http.post(f"{local.api_base}/sandboxes/{box.id}/resume")
    assert wait_for(lambda: Path(tick).read_text() != frozen)


def test_renew_expiration(local: LocalServer, http: requests.Session) -> None:
    sandbox_id = create(local, http, timeout=60).json()["id"]
    url = f"{local.api_base}/sandboxes/{sandbox_id}/renew-expiration"
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    renewed = http.post(url, json={"expiresAt": later})
    assert renewed.status_code == 200
    assert renewed.json()["expiresAt"].startswith(later[:19])
    got = http.get(f"{local.api_base}/sandboxes/{sandbox_id}").json()
    assert got["expiresAt"] == renewed.json()["expiresAt"]
    past = http.post(url, json={"expiresAt": "2000-01-01T00:00:00Z"})
    assert (past.status_code, past.json()["code"]) == (400, "DOCKER::INVALID_EXPIRATION")
    assert http.post(url, json={"expiresAt": "tomorrow"}).status_code == 422
    assert http.post(url, json={"expiresAt": later, "extra": 1}).status_code == 422
    no_ttl = create(local, http).json()["id"]
    conflict = http.post(
        f"{local.api_base}/sandboxes/{no_ttl}/renew-expiration", json={"expiresAt": later}
    )
    assert conflict.status_code == 409


def test_patch_metadata(local: LocalServer, http: requests.Session) -> None:
    sandbox_id = create(local, http, metadata={"a": "1", "b": "2"}).json()["id"]
    url = f"{local.api_base}/sandboxes/{sandbox_id}/metadata"
    patched = http.patch(url, json={"b": None, "c": "3", "gone": None})
    assert patched.status_code == 200
    assert patched.json()["metadata"] == {"a": "1", "c": "3"}
    assert patched.json()["id"] == sandbox_id
    reserved = http.patch(url, json={"opensandbox.io/owner": "me"})
    assert (reserved.status_code, reserved.json()["code"]) == (
        400,
        "SANDBOX::INVALID_METADATA_LABEL",
    )
    assert http.patch(url, json={"a": 5}).status_code == 422


def test_ttl_expiry_reaps_sandbox(local: LocalServer, http: requests.Session) -> None:
    box = Box(local, http, {**CREATE_BODY, "timeout": 3})  # 3 s: time to see the sleeper
    # Found from the host by its command line: `echo $!` would print its pid in the sandbox's
    # PID namespace, which on the host numbers some other process.
    marker = sleep_marker(30)
    box.command(f"sleep {marker} >/dev/null 2>&1 &")
    assert wait_for(lambda: host_pids_with(marker))
    url = f"{local.api_base}/sandboxes/{box.id}"
    assert wait_for(lambda: http.get(url).status_code == 404, timeout=10)
    assert wait_for(lambda: not host_pids_with(marker))
    assert not os.path.exists(box.dir)


def test_pending_then_running(http: requests.Session) -> None:
    with local_server(pending_seconds=0.5, ping_interval=0.2) as srv:
        created = http.post(f"{srv.api_base}/sandboxes", json=CREATE_BODY)
        assert created.status_code == 202
        assert created.json()["status"]["state"] == "Pending"
        sandbox_id = created.json()["id"]
        endpoint = http.get(f"{srv.api_base}/sandboxes/{sandbox_id}/endpoints/44772").json()
        ping = f"http://{endpoint['endpoint']}/ping"
        assert http.get(ping, headers=endpoint["headers"]).status_code == 502
        url = f"{srv.api_base}/sandboxes/{sandbox_id}"
        assert wait_for(lambda: http.get(url).json()["status"]["state"] == "Running")
        assert http.get(ping, headers=endpoint["headers"]).status_code == 200


def test_chunked_request_body(local: LocalServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", local.port, timeout=10)
    payload = json.dumps(CREATE_BODY).encode()

    def pieces() -> Any:
        yield payload[:7]
        yield payload[7:]

    conn.request(
        "POST",
        "/v1/sandboxes",
        body=pieces(),
        headers={"Content-Type": "application/json"},
        encode_chunked=True,
    )
    answer = conn.getresponse()
    assert answer.status == 202, answer.read()
    answer.read()
    # The connection stays usable: the chunked body was consumed exactly.
    conn.request("GET", "/health")
    assert json.loads(conn.getresponse().read()) == {"status": "healthy"}
    conn.close()


def test_unknown_routes_and_telemetry(local: LocalServer, http: requests.Session) -> None:
    assert http.get(f"{local.api_base}/nothing").status_code == 404
    assert http.put(f"{local.api_base}/sandboxes").status_code == 405
    assert http.post(f"{local.api_base}/metrics/events", json={"e": 1}).status_code == 200


def test_serve_forever_returns_after_stop(http: requests.Session) -> None:
    srv = LocalServer()
    thread = threading.Thread(target=srv.serve_forever)
    thread.start()
    assert wait_for(lambda: srv.port != 0 and _healthy(http, srv))
    srv.stop()
    thread.join(5)
    assert not thread.is_alive()


def _healthy(http: requests.Session, srv: LocalServer) -> bool:
    try:
        return http.get(f"{srv.base_url}/health", timeout=1).status_code == 200
    except requests.ConnectionError:
        return False
