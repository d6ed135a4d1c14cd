"""The released server's other routes on the local server, through our client: snapshots,
diagnostics, network policy at run time (and the egress sidecar's /policy), pools,
templates, /version, and the create fields it refuses."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

import osb_sync
from osb_sync import (
    DEFAULT_TEMPLATE,
    Client,
    NetworkPolicy,
    NetworkRule,
    NotSupportedError,
    PoolCapacity,
)
from osb_sync.local import LocalServer
from tests.local.support import require_isolation, wait_for

# A short sandbox body for the client: the local server needs no real image.
FAST = {"template": DEFAULT_TEMPLATE, "entrypoint": ["/bin/sh"], "resource_limits": {"cpu": "1"}}


@pytest.fixture
def client(local: LocalServer) -> Iterator[Client]:
    with Client(local.api_base) as c:
        yield c


@pytest.fixture
def isolated_client(isolated_server: LocalServer) -> Iterator[Client]:
    with Client(isolated_server.api_base) as c:
        yield c


def test_version(client: Client) -> None:
    assert client.server_version() == osb_sync.__version__


def test_a_restored_sandbox_sees_the_files_its_source_wrote(client: Client) -> None:
    with client.create_sandbox(allow_internet_access=True, **FAST) as source:
        source.files.write("notes/kept.txt", "written before the snapshot\n")
        source.commands.run("echo scratch > /tmp/scratch.txt").check()
        snapshot = source.snapshot("before", wait=True)
        source.files.write("notes/later.txt", "written after\n")
    assert snapshot.ready and snapshot.sandbox_id == source.id and snapshot.name == "before"
    assert [s.id for s in client.snapshots.list(sandbox_id=source.id)] == [snapshot.id]
    assert [s.id for s in client.snapshots.list(states=["Failed"])] == []
    with client.create_sandbox(snapshot_id=snapshot.id, allow_internet_access=True) as restored:
        assert restored.files.read_text("notes/kept.txt") == "written before the snapshot\n"
        assert restored.commands.run("cat /tmp/scratch.txt").stdout == "scratch\n"
        assert not restored.files.exists("notes/later.txt")
        assert restored.info().state == "Running"
    assert client.snapshots.delete(snapshot.id) is True
    assert client.snapshots.delete(snapshot.id) is False
    with pytest.raises(osb_sync.NotFoundError):
        client.snapshots.get(snapshot.id)


def test_a_create_from_an_unknown_snapshot_is_a_404(client: Client) -> None:
    with pytest.raises(osb_sync.NotFoundError, match="SNAPSHOT::NOT_FOUND"):
        client.create_sandbox(snapshot_id="snap-nope", ready_timeout=2)


def test_diagnostics_tell_what_happened(client: Client) -> None:
    sandbox = client.create_sandbox(allow_internet_access=True, **FAST)
    sandbox.pause()
    sandbox.resume()
    events = sandbox.diagnostics.events().content or ""
    assert [line.split(" ", 1)[1].split(":")[0] for line in events.splitlines()][:4] == [
        "created from image opensandbox/code-interpreter", "started", "paused", "resumed",
    ]  # fmt: skip
    scoped = sandbox.diagnostics.events("lifecycle")
    assert scoped.scope == "lifecycle" and "paused" in (scoped.content or "")
    assert sandbox.diagnostics.logs(tail=5).kind == "logs"
    assert "State: Running" in sandbox.diagnostics.inspect()
    summary = sandbox.diagnostics.summary(tail=3, event_limit=2)
    assert "== inspect ==" in summary and "resumed" in summary
    with pytest.raises(osb_sync.ApiError, match="Unsupported diagnostics scope"):
        sandbox.diagnostics.logs("network")
    sandbox.delete()
    after = sandbox.diagnostics.events().content or ""  # kept once the sandbox is gone
    assert after.splitlines()[-1].endswith(" deleted")


def test_expiry_is_in_the_events(client: Client, local: LocalServer) -> None:
    with requests.Session() as http:
        created = http.post(
            f"{local.api_base}/sandboxes",
            json={"image": {"uri": DEFAULT_TEMPLATE}, "entrypoint": ["/bin/sh"],
                  "resourceLimits": {}, "timeout": 1},
        )  # fmt: skip
    sandbox_id = created.json()["id"]
    sandbox = client.connect(sandbox_id, health_check=False)
    seen = lambda: sandbox.diagnostics.events().content or ""  # noqa: E731
    assert wait_for(lambda: "expired" in seen(), 10), seen()


def test_templates_answer_as_a_server_without_their_runtime(client: Client) -> None:
    with pytest.raises(NotSupportedError, match="Kubernetes runtime") as info:
        client.templates.get("tpl-1")
    assert info.value.status_code == 501
    assert info.value.server_version == osb_sync.__version__
    with pytest.raises(NotSupportedError):
        list(client.templates.list())


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"secure_access": True}, "secureAccess"),
        ({"credential_proxy": True}, "credentialProxy"),
        ({"lifecycle": {"preStart": {"command": ["true"]}}}, "lifecycle"),
        ({"platform": {"os": "windows", "arch": "amd64"}}, "platform"),
        ({"template_id": "tpl-1", "template": None, "entrypoint": None}, "templateId"),
    ],
)
def test_create_fields_it_cannot_honour_are_a_400_naming_them(
    client: Client, options: dict[str, object], field: str
) -> None:
    body = {**FAST, **options}
    if "template_id" in options:
        body = {k: v for k, v in body.items() if k not in ("resource_limits",)}
    with pytest.raises(osb_sync.ApiError) as info:
        client.create_sandbox(allow_internet_access=True, **body)  # type: ignore[arg-type]
    assert info.value.status_code == 400 and field in str(info.value)


def test_pools_are_named_warm_spares(client: Client) -> None:
    template = {"image": {"uri": DEFAULT_TEMPLATE}, "entrypoint": ["/bin/sh"]}
    capacity = PoolCapacity(pool_min=0, pool_max=2, buffer_min=1, buffer_max=1)
    made = client.pools.create("warm", template, capacity)
    assert made.name == "warm" and made.capacity == capacity and made.allocated == 0
    assert [p.name for p in client.pools.list()] == ["warm"]
    first = client.create_sandbox(pool="warm", allow_internet_access=True)
    second = client.create_sandbox(pool="warm", allow_internet_access=True)
    assert client.pools.get("warm").allocated == 2
    with pytest.raises(osb_sync.ApiError, match="POOL::EXHAUSTED"):
        client.create_sandbox(pool="warm", allow_internet_access=True)
    assert first.run_code("6 * 7").results[0]["text"] == "42"
    first.delete()
    assert client.pools.get("warm").allocated == 1
    bigger = client.pools.update("warm", PoolCapacity(0, 4, 0, 2))
    assert bigger.capacity.pool_max == 4 and bigger.revision == "2"
    second.delete()
    assert client.pools.delete("warm") is True
    assert client.pools.delete("warm") is False
    with pytest.raises(osb_sync.NotFoundError):
        client.create_sandbox(pool="warm", allow_internet_access=True)


def test_a_pool_refuses_what_its_spares_cannot_take(client: Client) -> None:
    with pytest.raises(osb_sync.ApiError, match=r"template\.volumes"):
        client.pools.create("cold", {"volumes": []}, PoolCapacity())


def test_ip_targets_are_refused_like_at_create(client: Client) -> None:
    sandbox = client.create_sandbox(allow_internet_access=True, **FAST)
    with sandbox:
        assert sandbox.network_policy.get() == NetworkPolicy("allow")
        with pytest.raises(osb_sync.ApiError, match="IP and CIDR targets") as info:
            sandbox.network_policy.patch_rules([NetworkRule("deny", "192.0.2.0/24")])
        assert info.value.status_code == 400
        assert sandbox.network_policy.get() == NetworkPolicy("allow")  # unchanged
        sandbox.network_policy.patch_rules([NetworkRule("deny", "evil.test")])  # by name: taken
        assert sandbox.network_policy.get() == NetworkPolicy(
            "allow", (NetworkRule("deny", "evil.test"),)
        )


def routes_out(sandbox: osb_sync.Sandbox) -> list[str]:
    """The sandbox's network interfaces with a route (no packet is sent anywhere)."""
    table = sandbox.commands.run("cat /proc/net/route").stdout.splitlines()[1:]
    return sorted({line.split()[0] for line in table if line.strip()})


def test_deny_all_and_allow_all_switch_on_a_running_sandbox(isolated_client: Client) -> None:
    require_isolation()
    with isolated_client.create_sandbox(**FAST) as sandbox:  # deny-all by default
        assert sandbox.network_policy.get() == NetworkPolicy("deny")
        assert routes_out(sandbox) == []  # loopback only: no route anywhere
        sandbox.network_policy.replace(NetworkPolicy("allow"))
        assert sandbox.network_policy.get().default_action == "allow"
        assert routes_out(sandbox) == ["tap0"]  # slirp4netns attached to the running namespace
        sandbox.network_policy.replace(NetworkPolicy("deny"))
        assert wait_for(lambda: routes_out(sandbox) == [], 5)
        events = sandbox.diagnostics.events().content or ""
        assert "network policy changed: allow_all" in events
        assert "network policy changed: deny_all" in events


def test_code_inside_cannot_lift_its_own_deny_all(
    isolated_client: Client, isolated_server: LocalServer
) -> None:
    require_isolation()
    with isolated_client.create_sandbox(**FAST) as sandbox:
        port = isolated_server.port
        # the server's port, the egress port and any token are out of the sandbox's reach:
        # its loopback is its own, nothing listens on 18080 there, no egress token inside
        attempt = (
            "import socket, os\n"
            f"for port in ({port}, 18080):\n"
            "    s = socket.socket(); s.settimeout(2)\n"
            "    try:\n"
            "        s.connect(('127.0.0.1', port)); print('reached', port)\n"
            "    except OSError as e:\n"
            "        print('refused', port)\n"
            "env = open('/proc/self/environ', 'rb').read()\n"
            "print('egress token inside' if b'EGRESS' in env else 'no egress token')\n"
        )
        said = sandbox.run_code(attempt).stdout.split("\n")
        assert said[:3] == [f"refused {port}", "refused 18080", "no egress token"]
        egress = isolated_client.get_endpoint(sandbox.id, 18080)
        assert "X-EXECD-ACCESS-TOKEN" not in egress.headers
        # the execd token does not open the egress API
        wrong = requests.get(f"{egress.url}/policy", headers=sandbox.execd_headers, timeout=5)
        assert wrong.status_code == 401
        assert sandbox.network_policy.get() == NetworkPolicy("deny")


def test_the_egress_sidecar_api_is_served_behind_its_token(client: Client) -> None:
    with client.create_sandbox(allow_internet_access=True, **FAST) as sandbox:
        egress = client.get_endpoint(sandbox.id, 18080)
        got = requests.get(f"{egress.url}/policy", headers=egress.headers, timeout=5)
        assert got.status_code == 200 and got.json()["policy"]["defaultAction"] == "allow"
        assert requests.get(f"{egress.url}/policy", timeout=5).status_code == 401
        refused = requests.patch(
            f"{egress.url}/policy",
            headers=egress.headers,
            json=[{"action": "deny", "target": "192.0.2.1"}],
            timeout=5,
        )
        assert refused.status_code == 400 and "IP and CIDR" in refused.json()["message"]
        missing = requests.get(f"{egress.url}/other", headers=egress.headers, timeout=5)
        assert missing.status_code == 404


def test_snapshot_of_a_paused_sandbox_is_refused(client: Client) -> None:
    with client.create_sandbox(allow_internet_access=True, **FAST) as sandbox:
        sandbox.pause()
        with pytest.raises(osb_sync.ApiError, match="only a Running sandbox") as info:
            sandbox.snapshot()
        assert info.value.status_code == 409
        sandbox.resume()
        started = time.monotonic()
        snapshot = sandbox.snapshot(wait=True)
        assert snapshot.ready and time.monotonic() - started < 60


def test_an_oom_kill_is_in_the_events(isolated_client: Client) -> None:
    from osb_sync.local.host import limits

    if "memory" not in limits.writable_controllers():
        pytest.skip("the memory cgroup controller is not writable here")
    with isolated_client.create_sandbox(
        allow_internet_access=True, **{**FAST, "resource_limits": {"memory": "64Mi"}}
    ) as sandbox:
        grab = sandbox.commands.run("python3 -c 'b = bytearray(300 * 1024 * 1024)'")
        assert grab.exit_code != 0
        seen = lambda: sandbox.diagnostics.events().content or ""  # noqa: E731
        assert wait_for(lambda: "OOM-killed" in seen(), 5), seen()


def test_rules_deleted_and_what_the_local_server_refuses(client: Client) -> None:
    with client.create_sandbox(**FAST, network_policy={"defaultAction": "allow"}) as sandbox:
        sandbox.network_policy.patch_rules([NetworkRule("allow", "pypi.org")])  # agrees: fine
        assert sandbox.network_policy.get().egress == (NetworkRule("allow", "pypi.org"),)
        sandbox.network_policy.delete_rules(["pypi.org"])
        assert sandbox.network_policy.get() == NetworkPolicy("allow")
        with pytest.raises(NotSupportedError, match="signed endpoints"):
            sandbox.get_endpoint(8080, expires=int(time.time()) + 600)
    with pytest.raises(NotSupportedError, match="templates"):
        client.templates.create("python:3.12", "s3://bucket/path")
    with pytest.raises(NotSupportedError, match="templates"):
        client.templates.delete("tpl-1")
