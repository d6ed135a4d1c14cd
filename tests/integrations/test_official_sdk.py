"""The official sync SDK (``opensandbox==1.1.1``) against the local server: its snapshot,
diagnostics, network-policy (the egress sidecar's ``/policy``) and pool calls.

Run by ``tox -e sdk`` (the SDK is a test-only dependency, never one of osb_sync's); skipped
where the SDK is not installed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

opensandbox = pytest.importorskip("opensandbox")

from opensandbox.config.connection_sync import ConnectionConfigSync  # noqa: E402
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule, SnapshotFilter  # noqa: E402
from opensandbox.sync import SandboxManagerSync, SandboxSync  # noqa: E402

from osb_sync import DEFAULT_TEMPLATE, Client, PoolCapacity  # noqa: E402
from osb_sync.local import LocalServer  # noqa: E402
from osb_sync.local.host.bwrap import probe  # noqa: E402

# the client's default template: the local server runs its host view for it, pulling nothing
IMAGE = DEFAULT_TEMPLATE
SHAPE: dict[str, Any] = {"entrypoint": ["/bin/sh"], "resource": {"cpu": "1"}}


@pytest.fixture(scope="module")
def local() -> Iterator[LocalServer]:
    # where sandboxes cannot be isolated, a deny-all policy is accepted unenforced
    # (else the default, refuse, as the real server does what it cannot enforce)
    accept = "accept" if probe().bwrap is None else "refuse"
    with LocalServer(command_grace=0, unenforced_network_policy=accept) as srv:
        yield srv


@pytest.fixture
def config(local: LocalServer) -> ConnectionConfigSync:
    return ConnectionConfigSync(
        domain=f"127.0.0.1:{local.port}", request_timeout=timedelta(seconds=30)
    )


@pytest.fixture
def manager(config: ConnectionConfigSync) -> Iterator[Any]:
    manager = SandboxManagerSync.create(config)
    yield manager
    manager.close()


@pytest.fixture
def sandbox(config: ConnectionConfigSync) -> Iterator[Any]:
    deny_all = NetworkPolicy(default_action="deny", egress=[])
    made = SandboxSync.create(IMAGE, connection_config=config, network_policy=deny_all, **SHAPE)
    yield made
    made.kill()


def ready(manager: Any, snapshot_id: str) -> Any:
    deadline = time.monotonic() + 60
    while True:
        info = manager.get_snapshot(snapshot_id)
        if info.status.state in ("Ready", "Failed") or time.monotonic() > deadline:
            return info
        time.sleep(0.2)


def test_snapshot_calls(sandbox: Any, manager: Any, config: ConnectionConfigSync) -> None:
    sandbox.files.write_file("/home/sandbox/kept.txt", "written before the snapshot")
    made = sandbox.create_snapshot("before")
    assert made.sandbox_id == sandbox.id and made.name == "before"
    assert ready(manager, made.id).status.state == "Ready"
    listed = manager.list_snapshots(SnapshotFilter(sandbox_id=sandbox.id))
    assert [s.id for s in listed.snapshot_infos] == [made.id]
    restored = SandboxSync.create(snapshot_id=made.id, connection_config=config, **SHAPE)
    try:
        assert restored.files.read_file("/home/sandbox/kept.txt") == "written before the snapshot"
    finally:
        restored.kill()
    manager.delete_snapshot(made.id)
    assert manager.list_snapshots(SnapshotFilter(sandbox_id=sandbox.id)).snapshot_infos == []


def test_diagnostics_calls(sandbox: Any, manager: Any) -> None:
    events = sandbox.get_diagnostic_events("lifecycle")
    assert events.kind == "events" and events.scope == "lifecycle"
    assert f"created from image {IMAGE}" in events.content
    logs = manager.get_diagnostic_logs(sandbox.id, "all")
    assert logs.kind == "logs" and logs.delivery == "inline" and "started" in logs.content


def test_network_policy_calls(sandbox: Any, local: LocalServer) -> None:
    policy = sandbox.get_egress_policy()
    assert policy.default_action == "deny" and policy.egress == []
    # what a namespace can enforce: rules that agree with the default
    sandbox.patch_egress_rules([NetworkRule(action="deny", target="evil.test")])
    assert [r.target for r in sandbox.get_egress_policy().egress] == ["evil.test"]
    sandbox.delete_egress_rules(["evil.test"])
    assert sandbox.get_egress_policy().egress == []
    if not local.network_policy_enforced:
        return  # nothing is enforced here, so nothing is refused either
    # IP targets are refused with the create's 400, as the egress sidecar refuses them
    with pytest.raises(Exception, match="IP and CIDR targets"):
        sandbox.patch_egress_rules([NetworkRule(action="allow", target="192.0.2.1")])
    assert sandbox.get_egress_policy().default_action == "deny"
    # a name: enforced (the server's resolver and sets), through the SDK's sidecar call
    sandbox.patch_egress_rules([NetworkRule(action="allow", target="pypi.org")])
    policy = sandbox.get_egress_policy()
    assert policy.default_action == "deny"
    assert [(r.action, r.target) for r in policy.egress] == [("allow", "pypi.org")]
    sandbox.delete_egress_rules(["pypi.org"])
    assert sandbox.get_egress_policy().egress == []


def test_pool_calls(local: LocalServer, config: ConnectionConfigSync) -> None:
    from opensandbox import SandboxPoolSync
    from opensandbox._pool_store import InMemoryPoolStateStore
    from opensandbox.pool_types import PoolCreationSpec

    # the SDK's own pool, on the lifecycle API
    pool = SandboxPoolSync(
        pool_name="sdk-pool",
        max_idle=1,
        state_store=InMemoryPoolStateStore(),
        connection_config=config,
        creation_spec=PoolCreationSpec(image=IMAGE, **SHAPE),
    )
    pool.start()
    try:
        lent = pool.acquire(sandbox_timeout=timedelta(minutes=5))
        try:
            # execd 1.1.1's form (the local execd's since issue 45): texts keep their line ends
            assert "".join(m.text for m in lent.commands.run("echo pooled").logs.stdout) == (
                "pooled\n"
            )
        finally:
            lent.kill()
    finally:
        pool.shutdown(graceful=False)
    # a server-side pool (made with our client: the SDK has no /pools calls), used by the SDK
    # through extensions.poolRef
    with Client(local.api_base) as client:
        client.pools.create("warm", {"image": {"uri": IMAGE}}, PoolCapacity(0, 2, 1, 1))
        try:
            pooled = SandboxSync.create(
                IMAGE, connection_config=config, extensions={"poolRef": "warm"}, **SHAPE
            )
            try:
                assert client.pools.get("warm").allocated == 1
                ran = pooled.commands.run("echo warm").logs.stdout
                assert "".join(m.text for m in ran) == "warm\n"
            finally:
                pooled.kill()
        finally:
            client.pools.delete("warm")
