"""The released server's routes beyond sandboxes (snapshots, diagnostics, network policy,
pools, templates, signed endpoints, ``/version``): each call's exact request, checked
against ``tests/data/specs/opensandbox-server-1.1.1-openapi.json``, with ``responses``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import responses

import osb_sync
from osb_sync import (
    ApiError,
    Client,
    ConfigurationError,
    NetworkPolicy,
    NetworkRule,
    NotFoundError,
    NotSupportedError,
    PoolCapacity,
    SandboxStateError,
    SandboxTimeoutError,
)
from tests.helpers import API, SID, add_create, add_endpoint, add_ping, created_body
from tests.released_spec import check_request, problems

ROOT = API.removesuffix("/v1")
SNAP = "snap-1"
CREATED = "2026-10-01T10:00:00Z"


def snapshot_body(state: str = "Ready", **extra: Any) -> dict[str, Any]:
    return {"id": SNAP, "sandboxId": SID, "status": {"state": state}, "createdAt": CREATED, **extra}


def pool_body(name: str = "warm", **extra: Any) -> dict[str, Any]:
    capacity = {"bufferMax": 2, "bufferMin": 1, "poolMax": 4, "poolMin": 0}
    return {"name": name, "capacitySpec": capacity, **extra}


def template_body(**extra: Any) -> dict[str, Any]:
    return {
        "templateId": "tpl-1",
        "image": "python:3.12",
        "publish": "s3://b/p",
        "format": "overlaybd",
        "status": {"phase": "Succeeded", "manifestRef": "s3://b/p/m.json"},
        "createdAt": CREATED,
        "updatedAt": CREATED,
        **extra,
    }


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock() as mock:
        yield mock


@pytest.fixture
def client() -> Iterator[Client]:
    with Client(API) as c:
        yield c


def sent(rsps: responses.RequestsMock) -> list[str]:
    """Every request sent, each checked against the released spec: ``METHOD template``."""
    return [check_request(call.request) for call in rsps.calls]


def query(call: Any) -> dict[str, list[str]]:
    return parse_qs(urlsplit(call.request.url).query)


def body(call: Any) -> Any:
    return json.loads(call.request.body)


def sandbox(client: Client) -> osb_sync.Sandbox:
    """A handle on SID without the create's calls (they are tested elsewhere)."""
    return osb_sync.Sandbox(SID, lifecycle=client._lifecycle, execd=None)  # type: ignore[arg-type]


# -- the spec checker itself --------------------------------------------------------------


def test_the_spec_checker_refuses_what_the_released_server_would() -> None:
    schema = {"$ref": "#/components/schemas/CreatePoolRequest"}
    assert problems({"name": "Bad_Name", "template": {}, "capacitySpec": {}}, schema)
    assert problems({"name": "ok", "template": {}}, schema)  # no capacitySpec
    good = {"name": "ok", "template": {}, "capacitySpec": pool_body()["capacitySpec"]}
    assert problems(good, schema) == []
    assert problems({**good, "extra": 1}, schema)
    with pytest.raises(AssertionError, match="not a route"):
        check_request(requests.Request("GET", f"{API}/nothing").prepare())


# -- snapshots -----------------------------------------------------------------------------


def test_snapshot_create_get_delete(client: Client, rsps: responses.RequestsMock) -> None:
    rsps.post(f"{API}/sandboxes/{SID}/snapshots", json=snapshot_body("Creating"), status=202)
    rsps.get(f"{API}/snapshots/{SNAP}", json=snapshot_body(name="before-upgrade"))
    rsps.delete(f"{API}/snapshots/{SNAP}", status=204)
    rsps.delete(f"{API}/snapshots/gone", status=404, json={"code": "X::NOT_FOUND", "message": ""})
    made = client.snapshots.create(SID, "before-upgrade")
    assert (made.id, made.state, made.ready, made.sandbox_id) == (SNAP, "Creating", False, SID)
    assert body(rsps.calls[0]) == {"name": "before-upgrade"}
    got = client.snapshots.get(SNAP)
    assert got.ready and got.name == "before-upgrade" and got.created_at is not None
    assert client.snapshots.delete(SNAP) is True
    assert client.snapshots.delete("gone") is False
    assert sent(rsps) == [
        "POST /v1/sandboxes/{sandbox_id}/snapshots",
        "GET /v1/snapshots/{snapshot_id}",
        "DELETE /v1/snapshots/{snapshot_id}",
        "DELETE /v1/snapshots/{snapshot_id}",
    ]


def test_sandbox_snapshot_without_a_name_sends_an_empty_object(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.post(f"{API}/sandboxes/{SID}/snapshots", json=snapshot_body("Creating"), status=202)
    rsps.get(f"{API}/snapshots/{SNAP}", json=snapshot_body("Ready"))
    snapshot = sandbox(client).snapshot(wait=True)
    assert snapshot.ready and body(rsps.calls[0]) == {}
    sent(rsps)


def test_snapshot_list_filters_and_pages_lazily(
    client: Client, rsps: responses.RequestsMock
) -> None:
    def page(n: int, more: bool) -> dict[str, Any]:
        pagination = {"page": n, "pageSize": 1, "totalItems": 2, "totalPages": 2}
        return {
            "items": [snapshot_body(id=f"s{n}")],
            "pagination": {**pagination, "hasNextPage": more},
        }

    rsps.get(f"{API}/snapshots", json=page(1, True))
    rsps.get(f"{API}/snapshots", json=page(2, False))
    found = client.snapshots.list(sandbox_id=SID, name="n", states=["Ready", "Failed"], page_size=1)
    assert not rsps.calls  # lazily: nothing asked before the first item
    assert [s.id for s in found] == ["s1", "s2"]
    assert query(rsps.calls[0]) == {
        "sandboxId": [SID], "name": ["n"], "state": ["Ready", "Failed"],
        "pageSize": ["1"], "page": ["1"],
    }  # fmt: skip
    assert query(rsps.calls[1])["page"] == ["2"]
    assert sent(rsps) == ["GET /v1/snapshots"] * 2
    with pytest.raises(ConfigurationError):
        next(client.snapshots.list(page_size=201))


def test_wait_until_ready_polls_and_fails_on_failed(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.get(f"{API}/snapshots/{SNAP}", json=snapshot_body("Creating"))
    rsps.get(f"{API}/snapshots/{SNAP}", json=snapshot_body("Ready"))
    assert client.snapshots.wait_until_ready(SNAP, poll_interval=0).ready
    failed = snapshot_body("Failed")
    failed["status"]["reason"] = "DISK_FULL"
    rsps.get(f"{API}/snapshots/{SNAP}", json=failed)
    with pytest.raises(SandboxStateError, match=r"entered Failed.*DISK_FULL"):
        client.snapshots.wait_until_ready(SNAP, poll_interval=0)


def test_wait_until_ready_is_bounded(client: Client, rsps: responses.RequestsMock) -> None:
    rsps.get(f"{API}/snapshots/{SNAP}", json=snapshot_body("Creating"))
    started = time.monotonic()
    with pytest.raises(SandboxTimeoutError, match=r"snap-1 was not Ready within 0\.2 seconds"):
        client.snapshots.wait_until_ready(SNAP, timeout=0.2, poll_interval=0.05)
    assert time.monotonic() - started < 5


def test_create_from_a_snapshot_waits_until_it_is_ready(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.get(f"{API}/snapshots/{SNAP}", json=snapshot_body("Creating"))
    rsps.get(f"{API}/snapshots/{SNAP}", json=snapshot_body("Ready"))
    add_create(rsps)
    add_endpoint(rsps)
    add_ping(rsps)
    client.create_sandbox(snapshot_id=SNAP, poll_interval=0)
    assert [c.request.method for c in rsps.calls][:3] == ["GET", "GET", "POST"]
    assert body(rsps.calls[2])["snapshotId"] == SNAP
    assert [check_request(c.request) for c in rsps.calls[:3]] == [
        "GET /v1/snapshots/{snapshot_id}",
        "GET /v1/snapshots/{snapshot_id}",
        "POST /v1/sandboxes",
    ]


def test_create_from_a_snapshot_on_a_server_without_the_snapshot_api(
    client: Client, rsps: responses.RequestsMock
) -> None:
    # a server before 1.1: no /snapshots route (FastAPI's 404), and no /version either
    rsps.get(f"{API}/snapshots/{SNAP}", status=404, json={"detail": "Not Found"})
    rsps.get(f"{ROOT}/version", status=404, json={"detail": "Not Found"})
    add_create(rsps)
    add_endpoint(rsps)
    add_ping(rsps)
    client.create_sandbox(snapshot_id=SNAP)
    assert body(next(c for c in rsps.calls if c.request.method == "POST"))["snapshotId"] == SNAP


# -- NotSupportedError ---------------------------------------------------------------------


def test_a_501_names_the_feature_the_version_and_what_serves_it(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.get(
        f"{API}/pools",
        status=501,
        json={"code": "SANDBOX::API_NOT_SUPPORTED", "message": "Pool management is not supported"},
    )
    rsps.get(f"{ROOT}/version", json={"version": "1.1.1"})
    with pytest.raises(NotSupportedError) as info:
        client.pools.list()
    error = info.value
    assert isinstance(error, ApiError) and isinstance(error, requests.HTTPError)
    assert (error.feature, error.server_version, error.status_code) == ("pools", "1.1.1", 501)
    text = str(error)
    assert "pools" in text and "1.1.1" in text and "Kubernetes runtime" in text
    assert "Pool management is not supported" in text  # the server's own words are kept
    rsps.get(f"{API}/pools", status=405, json={"detail": "Method Not Allowed"})
    with pytest.raises(NotSupportedError, match="does not allow this method"):
        client.pools.list()
    assert len([c for c in rsps.calls if c.request.url.endswith("/version")]) == 1  # asked once


def test_a_404_for_the_route_is_not_supported_but_a_404_for_a_thing_is_not_found(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.get(f"{ROOT}/version", status=404, json={"detail": "Not Found"})
    rsps.get(f"{API}/templates/tpl-9", status=404, json={"detail": "Not Found"})
    with pytest.raises(NotSupportedError, match=r"templates.*server version unknown") as info:
        client.templates.get("tpl-9")
    assert info.value.server_version is None
    rsps.get(
        f"{API}/snapshots/nope",
        status=404,
        json={"code": "SNAPSHOT::NOT_FOUND", "message": "snapshot nope not found"},
    )
    with pytest.raises(NotFoundError) as missing:
        client.snapshots.get("nope")
    assert not isinstance(missing.value, NotSupportedError)


def test_server_version(client: Client, rsps: responses.RequestsMock) -> None:
    rsps.get(f"{ROOT}/version", json={"version": "1.1.1"})
    assert client.server_version() == "1.1.1"
    assert sent(rsps) == ["GET /version"]
    rsps.get(f"{ROOT}/version", status=404, json={"detail": "Not Found"})
    with pytest.raises(NotSupportedError, match=r"before 1.1|1.1 or later"):
        client.server_version()
    rsps.get(f"{ROOT}/version", json={"name": "x"})
    with pytest.raises(ApiError, match="no 'version'"):
        client.server_version()


# -- diagnostics ---------------------------------------------------------------------------


def test_plain_text_diagnostics(client: Client, rsps: responses.RequestsMock) -> None:
    base = f"{API}/sandboxes/{SID}/diagnostics"
    rsps.get(f"{base}/logs", body="line 1\nline 2\n", content_type="text/plain")
    rsps.get(f"{base}/events", body="created\nstarted\n", content_type="text/plain")
    rsps.get(f"{base}/inspect", body="State: running\n", content_type="text/plain")
    rsps.get(f"{base}/summary", body="== summary ==\n", content_type="text/plain")
    diagnostics = sandbox(client).diagnostics
    logs = diagnostics.logs(tail=10, since="10m", container="sandbox")
    assert (logs.kind, logs.scope, logs.content, logs.sandbox_id) == (
        "logs", None, "line 1\nline 2\n", SID
    )  # fmt: skip
    assert diagnostics.events(limit=5).content == "created\nstarted\n"
    assert diagnostics.inspect() == "State: running\n"
    assert diagnostics.summary(tail=3, event_limit=2) == "== summary ==\n"
    assert query(rsps.calls[0]) == {"tail": ["10"], "since": ["10m"], "container": ["sandbox"]}
    assert query(rsps.calls[1]) == {"limit": ["5"]}
    assert query(rsps.calls[3]) == {"tail": ["3"], "event_limit": ["2"]}
    assert sent(rsps) == [
        "GET /v1/sandboxes/{sandbox_id}/diagnostics/logs",
        "GET /v1/sandboxes/{sandbox_id}/diagnostics/events",
        "GET /v1/sandboxes/{sandbox_id}/diagnostics/inspect",
        "GET /v1/sandboxes/{sandbox_id}/diagnostics/summary",
    ]
    with pytest.raises(ConfigurationError):
        diagnostics.logs(tail=0)
    with pytest.raises(ConfigurationError, match="plain-text"):
        diagnostics.logs("container", tail=5)


def test_scoped_diagnostics(client: Client, rsps: responses.RequestsMock) -> None:
    descriptor = {
        "sandboxId": SID, "kind": "logs", "scope": "container", "delivery": "inline",
        "contentType": "text/plain; charset=utf-8", "content": "hello\n", "truncated": False,
    }  # fmt: skip
    rsps.get(f"{API}/sandboxes/{SID}/diagnostics/logs", json=descriptor)
    content = sandbox(client).diagnostics.logs("container")
    assert (content.scope, content.content, content.truncated) == ("container", "hello\n", False)
    assert query(rsps.calls[0]) == {"scope": ["container"]}
    sent(rsps)


def test_scoped_diagnostics_on_the_docker_runtime(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.get(
        f"{API}/sandboxes/{SID}/diagnostics/events",
        status=501,
        json={"code": "DIAGNOSTICS::NOT_IMPLEMENTED", "message": "not implemented"},
    )
    rsps.get(f"{ROOT}/version", json={"version": "1.1.1"})
    with pytest.raises(NotSupportedError, match=r"scoped diagnostics.*scope=None") as info:
        sandbox(client).diagnostics.events("runtime")
    assert info.value.server_version == "1.1.1"


# -- network policy ------------------------------------------------------------------------


def test_network_policy_routes(client: Client, rsps: responses.RequestsMock) -> None:
    path = f"{API}/sandboxes/{SID}/networkpolicy"
    status = {
        "status": "ok", "mode": "deny_all",
        "policy": {"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]},
    }  # fmt: skip
    rsps.get(path, json=status)
    rsps.put(path, json=status)
    rsps.patch(path, json=status)
    rsps.delete(path, json=status)
    network = sandbox(client).network_policy
    policy = network.get()
    assert policy == NetworkPolicy("deny", (NetworkRule("allow", "pypi.org"),))
    assert policy.mode == "deny_all"
    network.replace(NetworkPolicy("allow"))
    network.patch_rules([NetworkRule("deny", "evil.test"), {"action": "allow", "target": "*.x"}])
    network.delete_rules(["evil.test"])
    assert body(rsps.calls[1]) == {"defaultAction": "allow", "egress": []}
    assert body(rsps.calls[2]) == [
        {"action": "deny", "target": "evil.test"},
        {"action": "allow", "target": "*.x"},
    ]
    assert body(rsps.calls[3]) == ["evil.test"]
    assert sent(rsps) == [
        f"{m} /v1/sandboxes/{{sandbox_id}}/networkpolicy" for m in ("GET", "PUT", "PATCH", "DELETE")
    ]


def test_network_policy_arguments_are_checked(client: Client) -> None:
    network = sandbox(client).network_policy
    with pytest.raises(ConfigurationError, match="'allow' or 'deny'"):
        network.patch_rules([{"action": "permit", "target": "x"}])
    with pytest.raises(ConfigurationError):
        network.patch_rules([])
    with pytest.raises(ConfigurationError, match="not one str"):
        network.delete_rules("x.test")
    with pytest.raises(ConfigurationError, match="no"):
        network.replace({"defaultAction": "deny", "rules": []})


def test_network_policy_on_a_june_server(client: Client, rsps: responses.RequestsMock) -> None:
    rsps.get(f"{API}/sandboxes/{SID}/networkpolicy", status=404, json={"detail": "Not Found"})
    rsps.get(f"{ROOT}/version", status=404, json={"detail": "Not Found"})
    with pytest.raises(NotSupportedError, match=r"network policy changes.*egress"):
        sandbox(client).network_policy.get()


# -- pools ---------------------------------------------------------------------------------


def test_pool_routes(client: Client, rsps: responses.RequestsMock) -> None:
    status = {"total": 3, "allocated": 1, "available": 2, "revision": "r7"}
    rsps.post(f"{API}/pools", json=pool_body(), status=201)
    rsps.get(f"{API}/pools/warm", json=pool_body(status=status, createdAt=CREATED))
    rsps.get(f"{API}/pools", json={"items": [pool_body(), pool_body("other")]})
    rsps.put(f"{API}/pools/warm", json=pool_body())
    rsps.delete(f"{API}/pools/warm", status=204)
    capacity = PoolCapacity(pool_min=0, pool_max=4, buffer_min=1, buffer_max=2)
    template = {"spec": {"containers": [{"name": "sandbox", "image": "python:3.12"}]}}
    made = client.pools.create("warm", template, capacity)
    assert made.capacity == capacity and made.total is None
    got = client.pools.get("warm")
    assert (got.total, got.allocated, got.available, got.revision) == (3, 1, 2, "r7")
    assert [p.name for p in client.pools.list()] == ["warm", "other"]
    client.pools.update("warm", {"pool_min": 0, "pool_max": 8, "buffer_min": 2, "buffer_max": 4})
    assert client.pools.delete("warm") is True
    assert body(rsps.calls[0]) == {
        "name": "warm", "template": template,
        "capacitySpec": {"bufferMax": 2, "bufferMin": 1, "poolMax": 4, "poolMin": 0},
    }  # fmt: skip
    assert body(rsps.calls[3]) == {
        "capacitySpec": {"bufferMax": 4, "bufferMin": 2, "poolMax": 8, "poolMin": 0}
    }
    assert sent(rsps) == [
        "POST /v1/pools", "GET /v1/pools/{pool_name}", "GET /v1/pools",
        "PUT /v1/pools/{pool_name}", "DELETE /v1/pools/{pool_name}",
    ]  # fmt: skip


def test_pool_arguments_are_checked(client: Client) -> None:
    with pytest.raises(ConfigurationError, match="pool name"):
        client.pools.get("Warm_Pool")
    with pytest.raises(ConfigurationError, match="buffer_min must not exceed"):
        PoolCapacity(buffer_min=3, buffer_max=1)
    with pytest.raises(ConfigurationError):
        PoolCapacity(pool_max=-1)


def test_create_from_a_pool() -> None:
    body = created_body(pool="warm", extensions={"k": "v"})
    assert body["extensions"] == {"k": "v", "poolRef": "warm"}
    assert "networkPolicy" not in body and "resourceLimits" not in body
    assert problems(body, {"$ref": "#/components/schemas/CreateSandboxRequest"}) == []
    with pytest.raises(ConfigurationError, match=r"pool's network.*drop network_policy"):
        created_body(pool="warm", network_policy={"defaultAction": "deny"})
    volume = {"name": "v", "mountPath": "/data", "pvc": {"claimName": "c"}}
    with pytest.raises(ConfigurationError, match="drop volumes"):  # the released server: 400
        created_body(pool="warm", volumes=[volume])
    with pytest.raises(ConfigurationError, match="drop platform"):
        created_body(pool="warm", platform={"os": "linux", "arch": "amd64"})
    with pytest.raises(ConfigurationError, match="different pools"):
        created_body(pool="warm", extensions={"poolRef": "cold"})
    with pytest.raises(ConfigurationError, match="one of"):
        created_body(pool="warm", snapshot_id=SNAP)


# -- templates -----------------------------------------------------------------------------


def test_template_routes(client: Client, rsps: responses.RequestsMock) -> None:
    rsps.post(f"{API}/templates", json=template_body(status={"phase": "Pending"}), status=201)
    rsps.get(f"{API}/templates/tpl-1", json=template_body())
    pagination = {"page": 1, "pageSize": 20, "totalItems": 1, "totalPages": 1, "hasNextPage": False}
    rsps.get(f"{API}/templates", json={"items": [template_body()], "pagination": pagination})
    rsps.delete(f"{API}/templates/tpl-1", status=204)
    made = client.templates.create(
        "python:3.12",
        "s3://b/p",
        entrypoint=["python", "-m", "http.server"],
        env={"A": "1"},
        resource_limits={"cpu": "1"},
        readiness_probe="tcp://127.0.0.1:8000",
        warmup_seconds=30,
        format="native",
    )
    assert made.phase == "Pending" and made.id == "tpl-1"
    got = client.templates.get("tpl-1")
    assert got.phase == "Succeeded" and got.manifest_ref == "s3://b/p/m.json"
    assert [t.id for t in client.templates.list(metadata={"team": "a"})] == ["tpl-1"]
    assert client.templates.delete("tpl-1") is True
    assert body(rsps.calls[0]) == {
        "image": "python:3.12", "publish": "s3://b/p", "env": {"A": "1"},
        "resourceLimits": {"cpu": "1"}, "entrypoint": ["python", "-m", "http.server"],
        "readiness": {"probe": "tcp://127.0.0.1:8000", "warmupSeconds": 30}, "format": "native",
    }  # fmt: skip
    assert query(rsps.calls[2]) == {"metadata": ["team=a"], "pageSize": ["20"], "page": ["1"]}
    assert sent(rsps) == [
        "POST /v1/templates", "GET /v1/templates/{template_id}", "GET /v1/templates",
        "DELETE /v1/templates/{template_id}",
    ]  # fmt: skip


def test_create_from_a_template() -> None:
    body = created_body(template_id="tpl-1", metadata={"team": "a"})
    assert body["templateId"] == "tpl-1" and body["timeout"] == 300
    for absent in ("image", "entrypoint", "resourceLimits", "snapshotId"):
        assert absent not in body
    assert body["networkPolicy"] == {"defaultAction": "deny", "egress": []}
    assert problems(body, {"$ref": "#/components/schemas/CreateSandboxRequest"}) == []
    with pytest.raises(ConfigurationError, match="drop \\['entrypoint', 'platform'\\]"):
        created_body(template_id="tpl-1", entrypoint=["x"], platform={"os": "linux"})
    with pytest.raises(ConfigurationError, match="needs a timeout"):
        created_body(template_id="tpl-1", timeout=osb_sync.NO_TIMEOUT)


# -- create fields, signed endpoints -------------------------------------------------------


def test_new_create_fields_reach_the_body_as_the_released_server_names_them() -> None:
    hooks = {
        "preStart": {"command": ["pip", "install", "x"], "timeoutSeconds": 60},
        "periodic": [{"name": "gc", "schedule": "*/5 * * * *", "command": ["gc"]}],
    }
    body = created_body(
        platform={"os": "linux", "arch": "arm64"},
        lifecycle=hooks,
        credential_proxy=True,
        secure_access=True,
        extensions={"access.renew.extend.seconds": "600"},
    )
    assert body["lifecycle"] == hooks and body["credentialProxy"] == {"enabled": True}
    assert body["secureAccess"] is True and body["platform"] == {"os": "linux", "arch": "arm64"}
    assert body["extensions"] == {"access.renew.extend.seconds": "600"}
    assert problems(body, {"$ref": "#/components/schemas/CreateSandboxRequest"}) == []


def test_a_signed_endpoint(client: Client, rsps: responses.RequestsMock) -> None:
    rsps.get(
        f"{API}/sandboxes/{SID}/endpoints/8080",
        json={"endpoint": "gw.test/route", "headers": {"OpenSandbox-Secure-Access": "sig"}},
    )
    expires = int(time.time()) + 600
    endpoint = client.get_endpoint(SID, 8080, expires=expires)
    assert endpoint.headers == {"OpenSandbox-Secure-Access": "sig"}
    assert query(rsps.calls[0]) == {"use_server_proxy": ["false"], "expires": [str(expires)]}
    sandbox(client).get_endpoint(8080)
    assert "expires" not in query(rsps.calls[1])
    assert sent(rsps) == ["GET /v1/sandboxes/{sandbox_id}/endpoints/{port}"] * 2
    with pytest.raises(ConfigurationError, match="future"):
        client.get_endpoint(SID, 8080, expires=int(time.time()) - 1)


def test_a_runtime_that_refuses_signed_endpoints(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.get(
        f"{API}/sandboxes/{SID}/endpoints/8080",
        status=400,
        json={"code": "SANDBOX::API_NOT_SUPPORTED", "message": "no secure access"},
    )
    rsps.get(f"{ROOT}/version", json={"version": "1.1.1"})
    with pytest.raises(NotSupportedError, match=r"signed endpoints.*runtime refuses it"):
        client.get_endpoint(SID, 8080, expires=int(time.time()) + 60)
    rsps.get(
        f"{API}/sandboxes/{SID}/endpoints/8080",
        status=400,
        json={"code": "SANDBOX::INVALID_PARAMETER", "message": "bad port"},
    )
    with pytest.raises(ApiError) as plain:  # another 400 stays an ApiError
        client.get_endpoint(SID, 8080, expires=int(time.time()) + 60)
    assert not isinstance(plain.value, NotSupportedError)


def test_a_server_pool_on_a_server_without_pools_names_the_fix(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.get(
        f"{API}/pools/warm",
        status=501,
        json={"code": "SANDBOX::API_NOT_SUPPORTED", "message": "Pool management is not supported"},
    )
    rsps.get(f"{ROOT}/version", json={"version": "1.1.1"})
    with pytest.raises(ConfigurationError, match=r"keeps no pools.*drop server_pool") as info:
        osb_sync.SandboxPool(client, server_pool="warm")
    assert isinstance(info.value.__cause__, NotSupportedError)
