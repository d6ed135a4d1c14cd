"""Processes of local sandboxes: cleanup, the port proxy, JUPYTER_PORT and network namespaces."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import CREATE_BODY, Box, alive, texts, wait_for

from osb_sync.local import LocalServer
from osb_sync.local.runner import probe_netns

DENY_ALL = {"defaultAction": "deny", "egress": []}
NETNS_WORKS = probe_netns() is not None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def start_pids(box: Box) -> list[int]:
    """Start a background sleeper, a python worker and a foreground child; their pids."""
    background = box.command("sleep 60 & echo $!", background=False)
    worker = box.code("import os\nos.getpid()")
    result = next(e for e in worker if e["type"] == "result")
    return [int(texts(background)[0]), int(result["results"]["text"])]


def test_delete_kills_every_process(box: Box, http: requests.Session) -> None:
    pids = start_pids(box)
    bg = box.command("sleep 60", background=True)[0]["text"]
    assert all(alive(pid) for pid in pids)
    assert box.call("GET", f"/command/status/{bg}").json()["running"]
    assert http.delete(f"{box.server.api_base}/sandboxes/{box.id}").status_code == 204
    assert wait_for(lambda: not any(alive(pid) for pid in pids))
    assert not os.path.exists(box.dir)


def test_stop_kills_everything_and_is_idempotent(make_box: Any) -> None:
    server = LocalServer(ping_interval=0.2, command_grace=0).start()
    box = make_box(server)
    pids = start_pids(box)
    root = server.root_dir
    server.stop()
    server.stop()
    assert wait_for(lambda: not any(alive(pid) for pid in pids))
    assert root is not None and not root.exists()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{server.base_url}/health", timeout=2)


def test_port_proxy_to_web_server(box: Box, local: LocalServer, http: requests.Session) -> None:
    port = free_port()
    box.call("POST", "/directories", json={"site": {}})
    with open(f"{box.dir}/site/hello.txt", "w") as out:
        out.write("hello from the sandbox")
    box.command(
        f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory site", background=True
    )
    endpoint = http.get(f"{local.api_base}/sandboxes/{box.id}/endpoints/{port}").json()
    url = f"http://{endpoint['endpoint']}/hello.txt"
    assert wait_for(lambda: http.get(url, headers=endpoint["headers"]).status_code == 200)
    answer = http.get(url, headers=endpoint["headers"])
    assert answer.text == "hello from the sandbox"
    assert http.get(url).status_code == 401
    posted = http.post(url, headers=endpoint["headers"], data=b"x" * 1000)
    assert posted.status_code == 501  # http.server does not do POST: the answer is relayed
    closed = http.get(
        f"http://{endpoint['endpoint'].replace(str(port), str(free_port()))}/",
        headers=endpoint["headers"],
    )
    assert closed.status_code == 502
    assert closed.json()["message"].startswith("Could not connect to the backend sandbox")


def test_jupyter_port_accepts_connections(box: Box) -> None:
    events = box.command("echo > /dev/tcp/127.0.0.1/$JUPYTER_PORT && echo reachable")
    assert texts(events) == ["reachable"]


def test_network_policy_refused_without_netns(http: requests.Session) -> None:
    with LocalServer(netns=False) as srv:
        assert srv.network_policy_enforced is False
        body = {**CREATE_BODY, "networkPolicy": DENY_ALL}
        refused = http.post(f"{srv.api_base}/sandboxes", json=body)
        assert refused.status_code == 400
        assert refused.json()["code"] == "SANDBOX::INVALID_PARAMETER"
        assert "unenforced_network_policy" in refused.json()["message"]
        allow_all = http.post(
            f"{srv.api_base}/sandboxes", json={**CREATE_BODY, "networkPolicy": {}}
        )
        assert allow_all.status_code == 202  # nothing to enforce


def test_network_policy_accepted_but_flagged(http: requests.Session) -> None:
    with LocalServer(netns=False, unenforced_network_policy="accept") as srv:
        created = http.post(
            f"{srv.api_base}/sandboxes", json={**CREATE_BODY, "networkPolicy": DENY_ALL}
        )
        assert created.status_code == 202
        assert "NOT enforced" in created.json()["status"]["message"]


def test_per_host_rules_are_never_enforced(http: requests.Session) -> None:
    rules = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]}
    with LocalServer(netns=True) as srv:
        refused = http.post(
            f"{srv.api_base}/sandboxes", json={**CREATE_BODY, "networkPolicy": rules}
        )
        assert refused.status_code == 400


@pytest.mark.skipif(not NETNS_WORKS, reason="network namespaces are not available here")
def test_deny_all_runs_in_private_namespace(http: requests.Session, make_box: Any) -> None:
    with LocalServer(netns=True, ping_interval=0.2, command_grace=0) as srv:
        assert srv.network_policy_enforced is True
        box = make_box(srv, networkPolicy=DENY_ALL)
        assert "enforced" in box.created["status"]["message"]
        host_port = srv.port  # listening on the host's loopback, invisible from the namespace
        probe = box.command(
            f"echo > /dev/tcp/127.0.0.1/{host_port} 2>/dev/null && echo leak || echo isolated"
        )
        assert texts(probe) == ["isolated"]
        assert texts(box.command("echo > /dev/tcp/127.0.0.1/$JUPYTER_PORT && echo ok")) == ["ok"]
        code = box.code(f"import socket\nsocket.create_connection(('127.0.0.1', {host_port}), 1)")
        assert any(e["type"] == "error" for e in code)
        port = free_port()
        box.command(f"{sys.executable} -m http.server {port} --bind 127.0.0.1", background=True)
        endpoint = http.get(f"{srv.api_base}/sandboxes/{box.id}/endpoints/{port}").json()
        url = f"http://{endpoint['endpoint']}/"
        assert wait_for(lambda: http.get(url, headers=endpoint["headers"]).status_code == 200)
        pids = start_pids(box)
    assert wait_for(lambda: not any(alive(pid) for pid in pids))


def test_forced_netns_without_support_fails_cleanly(
    http: requests.Session, monkeypatch: Any
) -> None:
    monkeypatch.setattr(
        "osb_sync.local.runner.NetnsMode.unshare_argv", lambda self: ["false", "--"]
    )
    with LocalServer(netns=True) as srv:
        failed = http.post(
            f"{srv.api_base}/sandboxes", json={**CREATE_BODY, "networkPolicy": DENY_ALL}
        )
        assert (failed.status_code, failed.json()["code"]) == (500, "DOCKER::SANDBOX_START_FAILED")
        assert http.post(f"{srv.api_base}/sandboxes", json=CREATE_BODY).status_code == 202


@pytest.mark.skipif(not NETNS_WORKS, reason="network namespaces are not available here")
def test_isolation_works_under_a_long_temporary_directory(tmp_path: Path) -> None:
    # A Unix socket path holds about 107 bytes; the namespace agent's must not depend on it.
    root = tmp_path / ("long-directory-name-" * 5)
    with LocalServer(root_dir=root, command_grace=0) as server, requests.Session() as http:
        box = Box(server, http, {**CREATE_BODY, "networkPolicy": DENY_ALL})
        assert len(str(root / box.id / "agent.sock")) > 110
        assert texts(box.command("echo inside")) == ["inside"]
