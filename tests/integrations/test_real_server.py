"""Our client against the released ``opensandbox-server==1.1.1`` with its Docker runtime:
the features that runtime serves (snapshots, diagnostics, network policy at run time,
``/version``), and the ones it does not (pools, templates, scoped diagnostics) raised as
NotSupportedError.

Opt-in (``tox -e realserver``, recipe in ``docs/guides/real-server.rst``): it needs a Docker
daemon and a running server, named by ``OSB_REAL_SERVER`` (its ``/v1`` base URL) and
``OSB_REAL_SERVER_API_KEY``; skipped otherwise (CI machines have no Docker daemon).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from osb_sync import Client, NetworkPolicy, NetworkRule, NotSupportedError, PoolCapacity

API_BASE = os.environ.get("OSB_REAL_SERVER", "")
pytestmark = pytest.mark.skipif(not API_BASE, reason="OSB_REAL_SERVER is not set (no server)")
IMAGE = "python:3.12-slim"
SHAPE = {"template": IMAGE, "entrypoint": ["sleep", "infinity"]}


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with Client(API_BASE, os.environ.get("OSB_REAL_SERVER_API_KEY")) as c:
        yield c


def test_version(client: Client) -> None:
    assert client.server_version().startswith("1.")


def test_snapshot_and_restore(client: Client) -> None:
    with client.create_sandbox(allow_internet_access=True, **SHAPE) as source:
        source.files.write("/root/kept.txt", "written before the snapshot")
        snapshot = source.snapshot("osb-sync-check", wait=True)
    try:
        with client.create_sandbox(
            snapshot_id=snapshot.id, entrypoint=["sleep", "infinity"], allow_internet_access=True
        ) as restored:
            assert restored.files.read_text("/root/kept.txt") == "written before the snapshot"
    finally:
        client.snapshots.delete(snapshot.id)


def test_diagnostics(client: Client) -> None:
    with client.create_sandbox(allow_internet_access=True, **SHAPE) as sandbox:
        assert sandbox.diagnostics.logs(tail=10).scope is None
        assert sandbox.diagnostics.inspect()
        assert sandbox.diagnostics.summary(tail=5)
        with pytest.raises(NotSupportedError, match="scoped diagnostics"):
            sandbox.diagnostics.events("runtime")


def test_network_policy(client: Client) -> None:
    # needs the server's egress.image (see the recipe)
    with client.create_sandbox(**SHAPE) as sandbox:
        assert sandbox.network_policy.get().default_action == "deny"
        sandbox.network_policy.patch_rules([NetworkRule("allow", "pypi.org")])
        assert NetworkRule("allow", "pypi.org") in sandbox.network_policy.get().egress
        sandbox.network_policy.delete_rules(["pypi.org"])
        sandbox.network_policy.replace(NetworkPolicy("deny"))


def test_what_the_docker_runtime_does_not_serve(client: Client) -> None:
    with pytest.raises(NotSupportedError, match="Kubernetes runtime"):
        client.pools.create("osb-sync-check", {}, PoolCapacity())
    with pytest.raises(NotSupportedError, match="Kubernetes runtime"):
        list(client.templates.list())
