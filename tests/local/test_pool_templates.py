"""A pool template that travels: the reference's Kubernetes pool sample (tests/data/
pool-template.json, §7), as JSON, makes a pool on the local server unchanged, and a sandbox
from it runs (the same call against the Kubernetes fake: tests/sockets/test_kubernetes.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import osb_sync
from osb_sync import Client, PoolCapacity
from osb_sync.local import LocalServer

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "pool-template.json"


@pytest.fixture
def client(local: LocalServer) -> Iterator[Client]:
    with Client(local.api_base) as c:
        yield c


def test_the_kubernetes_pool_sample_runs_unchanged(client: Client) -> None:
    template = json.loads(SAMPLE.read_text())
    capacity = PoolCapacity(pool_min=0, pool_max=2, buffer_min=1, buffer_max=1)
    pool = client.pools.create("pool-a", template, capacity)
    assert pool.message is not None and "execd-installer" in pool.message
    assert client.pools.get("pool-a").message == pool.message
    with client.create_sandbox(pool="pool-a", allow_internet_access=True) as sandbox:
        assert sandbox.commands.run("echo ok").stdout == "ok\n"
        env = sandbox.commands.run("env").stdout.splitlines()
        assert "LANG=C.UTF-8" in env  # the container's env, honoured
        assert not any(line.startswith("EXECD=") for line in env)  # the template's plumbing
        # EXECD_ENVS names the local execd's own file (issue 45), never the template's
        assert "EXECD_ENVS=/opt/opensandbox/.env" not in env
        assert any(line.startswith("EXECD_ENVS=") for line in env)
    assert client.pools.delete("pool-a") is True


def test_a_template_with_a_host_path_is_refused_by_name(client: Client) -> None:
    template = json.loads(SAMPLE.read_text())
    template["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    with pytest.raises(osb_sync.ApiError, match=r"template\.spec\.volumes\[1\]") as info:
        client.pools.create("pool-b", template, PoolCapacity())
    assert info.value.status_code == 400 and info.value.code == "POOL::INVALID_TEMPLATE"
    assert [p.name for p in client.pools.list()] == []
