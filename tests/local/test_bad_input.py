"""Bad numbers and strings get a 400/416/422 with a message, before anything is started."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import requests

from osb_sync.local import LocalServer
from osb_sync.local.host.recovery import LOCK_NAME
from osb_sync.local.host.spares import SPARES_DIR
from tests.leftovers import processes_under
from tests.local.support import CREATE_BODY, Box, parse_events

JSON = {"Content-Type": "application/json"}
PYTHON_NAMES = ("Traceback", "Error:", "Exception", "embedded null")


def refused(answer: requests.Response, *statuses: int) -> None:
    """`answer` is one of `statuses`, JSON, with no Python exception text."""
    assert answer.status_code in statuses, (answer.status_code, answer.text[:300])
    assert answer.headers["Content-Type"] == "application/json"
    assert not any(name in answer.text for name in PYTHON_NAMES), answer.text[:300]


def entries(local: LocalServer) -> list[str]:
    assert local.root_dir is not None
    return sorted(e for e in os.listdir(local.root_dir) if e not in (SPARES_DIR, LOCK_NAME))


@pytest.mark.parametrize(
    "timeout",
    [b"NaN", b"Infinity", b"-Infinity", b"1e300", b"1e400", b"1" + b"0" * 30, b"9" * 5000],
)
def test_create_refuses_absurd_timeouts_and_leaves_nothing(
    local: LocalServer, http: requests.Session, timeout: bytes
) -> None:
    raw = json.dumps(CREATE_BODY)[:-1].encode() + b', "timeout": ' + timeout + b"}"
    refused(http.post(f"{local.api_base}/sandboxes", data=raw, headers=JSON), 400, 422)
    assert entries(local) == []


def test_the_timeout_maximum_is_stated(local: LocalServer, http: requests.Session) -> None:
    answer = http.post(f"{local.api_base}/sandboxes", json={**CREATE_BODY, "timeout": 86401})
    refused(answer, 400)
    assert "86400" in answer.json()["message"] and entries(local) == []
    assert http.post(f"{local.api_base}/sandboxes", json={**CREATE_BODY, "timeout": 86400}).ok


@pytest.mark.parametrize(
    "body",
    [
        {"env": {"A\u0000B": "1"}},
        {"env": {"A": "x\u0000y"}},
        {"env": {"A=B": "1"}},
        {"metadata": {"k": "v\u0000"}},
        {"entrypoint": ["/bin/sh\u0000"]},  # was a 500 with execd's traceback and host paths
        {"entrypoint": ["/bin/sh", "-c", "a\u0000b"]},
        {"extensions": "x"},  # was a 500, then (issue 40) accepted
        {"extensions": ["poolRef"]},
        {"extensions": {"k": 1}},
    ],
)
def test_create_refuses_bad_strings(local: LocalServer, http: requests.Session, body: Any) -> None:
    refused(http.post(f"{local.api_base}/sandboxes", json={**CREATE_BODY, **body}), 400, 422)
    assert entries(local) == []


def test_deeply_nested_json_is_refused(local: LocalServer, box: Box) -> None:
    nested = b"[" * 30_000 + b"]" * 30_000  # small enough to reach the parser
    answer = box.http.post(f"{local.api_base}/sandboxes", data=nested, headers=JSON)
    refused(answer, 422)
    refused(box.call("POST", "/code", data=nested, headers=JSON), 400)


@pytest.mark.parametrize("port", ["9" * 5000, "70000", "0"])
def test_endpoint_ports_are_checked(box: Box, port: str) -> None:
    answer = box.http.get(f"{box.server.api_base}/sandboxes/{box.id}/endpoints/{port}")
    refused(answer, 400, 422)


def test_renewal_is_bounded(local: LocalServer, http: requests.Session) -> None:
    body = {**CREATE_BODY, "timeout": 60}
    created = http.post(f"{local.api_base}/sandboxes", json=body).json()
    url = f"{local.api_base}/sandboxes/{created['id']}/renew-expiration"
    refused(http.post(url, json={"expiresAt": "9999-12-31T23:59:59Z"}), 400)
    assert http.post(url, json={"expiresAt": "2999-01-01T00:00:00Z"}).status_code == 400
    soon = (datetime.now(timezone.utc) + timedelta(hours=2)).isoformat()
    assert http.post(url, json={"expiresAt": soon}).status_code == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/command", {"command": "echo a\u0000b"}),
        ("/command", {"command": "true", "cwd": "/tmp\u0000x"}),
        ("/command", {"command": "true", "envs": {"A": "\u0000"}}),
        ("/command", {"command": "true", "uid": 10**30}),
        ("/command", {"command": "true", "uid": -1}),
        ("/command", {"command": "true", "timeout": 10**30}),
        ("/command", {"command": "true", "timeout": 1.5}),
        ("/code", {"code": "echo a\u0000b"}),
        ("/code", {"code": "echo a\u0000b", "context": {"language": "bash"}}),
        ("/code/context", {"language": "python", "cwd": "a\u0000"}),
        ("/code/context", {"language": ["python"]}),
    ],
)
def test_execd_refuses_bad_values_before_streaming(box: Box, path: str, body: Any) -> None:
    refused(box.call("POST", path, json=body), 400)


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("GET", "/files/info", {"params": {"path": "a\u0000b"}}),
        ("GET", "/files/download", {"params": {"path": "a\u0000b"}}),
        ("DELETE", "/files", {"params": {"path": "a\u0000b"}}),
        ("GET", "/directories/list", {"params": {"path": ".", "depth": "9" * 5000}}),
        ("POST", "/directories", {"json": {"d\u0000": {}}}),
        ("POST", "/directories", {"json": {"d": {"mode": 99999999}}}),
        ("POST", "/directories", {"json": {"d": {"mode": 10**40}}}),
        ("POST", "/directories", {"json": {"d": {"mode": -7}}}),
        ("POST", "/directories", {"json": {"d": {"mode": "8"}}}),
        ("POST", "/files/permissions", {"json": {"f.txt": {"mode": 10**40}}}),
        ("POST", "/files/mv", {"json": [{"src": "f.txt", "dest": "x\u0000"}]}),
        ("POST", "/files/replace", {"json": {"f.txt": {"old": "\ud800", "new": "x"}}}),
        ("GET", "/command/abc/logs", {"params": {"cursor": "9" * 5000}}),
    ],
)
def test_file_routes_refuse_bad_values(
    box: Box, method: str, path: str, kwargs: dict[str, Any]
) -> None:
    with open(os.path.join(box.dir, "f.txt"), "w") as handle:
        handle.write("x")
    refused(box.call(method, path, **kwargs), 400, 404)
    assert sorted(os.listdir(box.dir)) == ["f.txt"]


def test_a_range_of_5000_digits_is_416(box: Box) -> None:
    with open(os.path.join(box.dir, "f.txt"), "w") as handle:
        handle.write("hello")
    answer = box.call("GET", "/files/download", params={"path": "f.txt"}, headers={
        "Range": "bytes=" + "9" * 5000 + "-"
    })  # fmt: skip
    assert answer.status_code == 416


def test_an_interrupt_right_after_init_finds_the_command(box: Box) -> None:
    # Real execd records the process before `init`; the official SDK's test relies on it.
    for _ in range(15):
        with box.call("POST", "/command", json={"command": "sleep 30"}, stream=True) as stream:
            lines = stream.iter_lines()
            first = next(lines)
            command_id = json.loads(first)["text"]
            stopped = box.call("DELETE", "/command", params={"id": command_id})
            assert stopped.status_code == 200, stopped.text
            events = parse_events(b"\n\n".join([first, *lines]))
        assert events[-1]["type"] == "error"


def multipart(entries: list[tuple[dict[str, Any], bytes]]) -> tuple[bytes, str]:
    boundary = "osbtestboundary"
    parts = []
    for meta, data in entries:
        for name, content in (("metadata", json.dumps(meta).encode()), ("file", data)):
            parts.append(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
                f'filename="{name}"\r\n\r\n'.encode()
                + content
                + b"\r\n"
            )
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


@pytest.mark.parametrize(
    "bad",
    [
        {"path": "c.txt", "mode": 99999},
        {"path": "c\u0000.txt"},
        {"path": ""},
        {"path": "plain/c.txt"},  # its parent is a file
        {"path": "somedir"},  # a directory
        {"path": "c.txt", "owner": "no-such-user-osb"},
    ],
)
def test_write_many_writes_all_files_or_none(box: Box, bad: dict[str, Any]) -> None:
    for name in ("plain", "somedir/keep"):
        os.makedirs(os.path.join(box.dir, os.path.dirname(name)), exist_ok=True)
        with open(os.path.join(box.dir, name), "w") as handle:
            handle.write("before")
    before = sorted(os.listdir(box.dir))
    body, content_type = multipart(
        [
            ({"path": "a.txt"}, b"1"),
            ({"path": "new/b.txt"}, b"2"),
            (bad, b"3"),
            ({"path": "d.txt"}, b"4"),
        ]
    )
    answer = box.call("POST", "/files/upload", data=body, headers={"Content-Type": content_type})
    assert answer.status_code in (400, 500), answer.text
    assert sorted(os.listdir(box.dir)) == before
    assert os.listdir(os.path.join(box.dir, "somedir")) == ["keep"]


def test_a_refused_create_starts_no_process(local: LocalServer) -> None:
    # A deny-all policy starts a namespace agent: a late refusal used to leave it running.
    body = {**CREATE_BODY, "timeout": 10**30, "networkPolicy": {"defaultAction": "deny"}}
    refused(requests.post(f"{local.api_base}/sandboxes", json=body, timeout=30), 400)
    assert local.root_dir is not None
    assert entries(local) == [] and processes_under(local.root_dir) == []
