"""No 500 from any input (issue 23): values that reach a path, a header, an int or bwrap; Host.

Each case was a 500 (or a misleading 502) before: it is now a 400 that names the field.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from osb_sync.local import LocalServer
from tests.local.rawhttp import exchange, request
from tests.local.support import CREATE_BODY, Box
from tests.local.test_bad_input import entries, multipart, refused

JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    "tail",
    [b"/caf\xc3\xa9", b"/?q=caf\xc3\xa9", b"/a\x01b", b"/a\x7fb", b"/?q=\x7f", b"/\xff"],
)
def test_a_proxy_target_outside_visible_ascii_is_400(box: Box, tail: bytes) -> None:
    path = f"/sandboxes/{box.id}/proxy/44772".encode() + tail
    raw = request("GET", "/PATH", box.server.port, box.headers).replace(b"/PATH", path)
    answer = exchange(box.server.port, raw)
    assert answer.status == 400, answer.body[:300]
    assert "target" in answer.json()["message"] and answer.headers["connection"] == "close"


def test_a_percent_encoded_proxy_target_is_relayed(box: Box) -> None:
    answer = box.http.get(
        f"{box.server.base_url}/sandboxes/{box.id}/proxy/44772/ping?q=caf%C3%A9",
        headers=box.headers,
    )
    assert answer.status_code == 200


LONE = "\ud800"


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/command", {"command": f"echo {LONE}"}, "command"),
        ("POST", "/command", {"command": "true", "cwd": f"/tmp/{LONE}"}, "cwd"),
        ("POST", "/command", {"command": "true", "envs": {"A": LONE}}, "envs.A"),
        ("POST", "/command", {"command": "true", "envs": {LONE: "1"}}, "a key of envs"),
        ("POST", "/directories", {f"d{LONE}": {"mode": 755}}, "a key of the body"),
        ("POST", "/files/mv", [{"src": "f.txt", "dest": f"x{LONE}"}], "[0].dest"),
        ("POST", "/code", {"code": LONE}, "code"),
    ],
)
def test_lone_surrogates_are_400_naming_the_field(
    box: Box, method: str, path: str, body: Any, field: str
) -> None:
    with open(f"{box.dir}/f.txt", "w") as handle:
        handle.write("x")
    answer = box.call(method, path, data=json.dumps(body), headers=JSON)
    refused(answer, 400)
    assert field in answer.json()["message"] and "surrogate" in answer.json()["message"]


def test_lone_surrogates_in_upload_metadata_are_400(box: Box) -> None:
    body, content_type = multipart([({"path": f"a{LONE}.txt"}, b"1")])
    answer = box.call("POST", "/files/upload", data=body, headers={"Content-Type": content_type})
    refused(answer, 400)
    assert "path" in answer.json()["message"] and "surrogate" in answer.json()["message"]


def test_lone_surrogates_in_a_create_are_refused(
    local: LocalServer, http: requests.Session
) -> None:
    body = json.dumps({**CREATE_BODY, "metadata": {"k": LONE}})
    refused(http.post(f"{local.api_base}/sandboxes", data=body, headers=JSON), 400, 422)
    assert entries(local) == []


@pytest.mark.parametrize("memory", ["9" * 5000, "9" * 5000 + "Ei", "9" * 20 + "Ei"])
def test_memory_past_an_int64_is_400(
    local: LocalServer, http: requests.Session, memory: str
) -> None:
    body = {**CREATE_BODY, "resourceLimits": {"memory": memory}}
    answer = http.post(f"{local.api_base}/sandboxes", json=body)
    refused(answer, 400)
    assert "resourceLimits.memory" in answer.json()["message"]
    assert len(answer.content) < 1000 and entries(local) == []


@pytest.mark.parametrize(
    "mount", ["/mnt/" + "a" * 256, "/mnt/" + "/".join(["b" * 200] * 25), "/mnt/" + "é" * 128]
)
def test_an_overlong_mount_path_is_400(
    isolated_server: LocalServer, http: requests.Session, mount: str
) -> None:
    volume = {"name": "work", "pvc": {"claimName": "c"}, "mountPath": mount}
    answer = http.post(
        f"{isolated_server.api_base}/sandboxes", json={**CREATE_BODY, "volumes": [volume]}
    )
    refused(answer, 400)
    assert "mountPath" in answer.json()["message"] and "too long" in answer.json()["message"]


@pytest.mark.parametrize(
    "host",
    [
        "[::1].evil.example",
        "[::1]@evil.example",
        "[::1]:80.evil.example",
        "127.0.0.1@evil.example",
        "localhost:80:80",
        "localhost:99999",
        "[::1",
        "[zz::1]",
        "local host",
        "localhost/x",
    ],
)
def test_a_host_that_is_not_host_and_port_is_400(
    local: LocalServer, http: requests.Session, host: str
) -> None:
    created = http.post(f"{local.api_base}/sandboxes", json=CREATE_BODY)
    assert created.status_code == 202
    path = f"/v1/sandboxes/{created.json()['id']}/endpoints/44772"
    raw = request("GET", path, local.port).replace(
        f"Host: 127.0.0.1:{local.port}".encode(), f"Host: {host}".encode()
    )
    answer = exchange(local.port, raw)
    assert answer.status == 400 and "Host" in answer.json()["message"]
    assert b"X-EXECD-ACCESS-TOKEN" not in answer.body


@pytest.mark.parametrize("host", ["[0:0::1]:8080", "[::1]", "LocalHost", "127.0.0.1:"])
def test_loopback_spellings_are_served(local: LocalServer, host: str) -> None:
    raw = request("GET", "/health", local.port).replace(
        f"Host: 127.0.0.1:{local.port}".encode(), f"Host: {host}".encode()
    )
    assert exchange(local.port, raw).status == 200
