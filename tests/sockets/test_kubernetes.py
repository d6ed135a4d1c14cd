"""The client against OpenSandbox on Kubernetes, faked at the contract level
(``tests/kubefake.py``): back-pressure, the typed faults, a pod that starts (404
``POD_IP_NOT_AVAILABLE``, ``Allocated``), and a pool template that travels."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from osb_sync import (
    CapacityError,
    Client,
    EndpointNotReadyError,
    PoolCapacity,
    ProxyConnectError,
    ProxyError,
    ProxyResponseError,
    ProxyTimeoutError,
    QuotaExceededError,
    SandboxPool,
    SandboxTimeoutError,
    StartTimeoutError,
)
from tests.fakeserver import FakeServer
from tests.kubefake import CREATE_ID_KEY, Accept, KubeFake, Refuse, capacity_exhausted
from tests.sockets.test_cli import osb

POOL_TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "pool-template.json"
FAST = {"poll_interval": 0.02, "ready_timeout": 5}


@pytest.fixture
def kube() -> Iterator[KubeFake]:
    with FakeServer() as server:
        yield KubeFake(server)


def wait_until(check: Any, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return bool(check())


def test_a_429_create_is_retried_after_retry_after_and_leaks_nothing(kube: KubeFake) -> None:
    # the refused attempt leaves a sandbox (a rollback that failed on the server)
    kube.creates.extend([capacity_exhausted("1", leak=True), Accept()])
    started = time.monotonic()
    with Client(kube.api_base) as client:
        sandbox = client.create_sandbox(**FAST)  # type: ignore[arg-type]
        assert time.monotonic() - started >= 0.9  # it waited the server's Retry-After
        first, second = kube.posts("/v1/sandboxes")
        assert first["metadata"][CREATE_ID_KEY] != second["metadata"][CREATE_ID_KEY]
        # the left one is found by its own tag and deleted; the retried one is the caller's
        assert wait_until(lambda: kube.live() == [sandbox.id])
        sandbox.delete()
    assert kube.live() == []


def test_a_429_whose_wait_passes_the_budget_fails_fast(kube: KubeFake) -> None:
    kube.creates.append(capacity_exhausted("30"))
    started = time.monotonic()
    with Client(kube.api_base, create_timeout=5) as client, pytest.raises(CapacityError) as info:
        client.create_sandbox(**FAST)  # type: ignore[arg-type]
    assert time.monotonic() - started < 4  # not the 30 s asked for, nor the 5 s budget
    assert info.value.retry_after == 30 and info.value.code == "KUBERNETES::POOL_CAPACITY_EXHAUSTED"
    assert len(kube.posts("/v1/sandboxes")) == 1 and kube.live() == []


@pytest.mark.parametrize(
    ("refusal", "cls"),
    [
        (Refuse(403, "KUBERNETES::QUOTA_EXCEEDED", "Namespace ResourceQuota exceeded: x"),
         QuotaExceededError),
        (Refuse(504, "KUBERNETES::POD_READY_TIMEOUT", "Timeout waiting for sandbox sbx-1"),
         StartTimeoutError),
    ],
)  # fmt: skip
def test_create_faults_are_typed_and_not_retried(
    kube: KubeFake, refusal: Refuse, cls: type[Exception]
) -> None:
    kube.creates.append(refusal)
    with Client(kube.api_base) as client, pytest.raises(cls) as info:
        client.create_sandbox(**FAST)  # type: ignore[arg-type]
    assert info.value.code == refusal.code and info.value.message == refusal.message  # type: ignore[attr-defined]
    assert len(kube.posts("/v1/sandboxes")) == 1 and kube.live() == []


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (502, "BACKEND_CONNECTION_FAILED", ProxyConnectError),
        (502, "BACKEND_RESPONSE_FAILED", ProxyResponseError),
        (504, "BACKEND_TIMEOUT", ProxyTimeoutError),
    ],
)
def test_a_proxy_fault_on_a_command_is_typed_and_the_post_never_sent_twice(
    kube: KubeFake, status: int, code: str, cls: type[ProxyError]
) -> None:
    kube.proxy_faults[("POST", "/command")] = (status, code)
    with Client(kube.api_base) as client, client.create_sandbox(**FAST) as sandbox:  # type: ignore[arg-type]
        with pytest.raises(cls) as info:
            sandbox.commands.run("echo ok")
        assert (info.value.status_code, info.value.code) == (status, code)
        assert code in info.value.message
        path = f"/v1/sandboxes/{sandbox.id}/proxy/44772/command"
        assert len(kube.server.seen("POST", path)) == 1
        del kube.proxy_faults[("POST", "/command")]
        assert sandbox.commands.run("echo ok").stdout == "ok\n"
        assert len(kube.server.seen("POST", path)) == 2


def test_a_starting_pod_is_waited_through_404_and_allocated(kube: KubeFake) -> None:
    kube.creates.append(Accept("Allocated"))  # answered Running: the server's rewrite
    kube.states = ["Allocated", "Allocated", "Running"]
    kube.not_ready = 3
    with Client(kube.api_base) as client:
        with client.create_sandbox(**FAST) as sandbox:  # type: ignore[arg-type]
            assert sandbox.commands.run("echo ok").stdout == "ok\n"
            endpoint = f"/v1/sandboxes/{sandbox.id}/endpoints/44772"
            assert len(kube.server.seen("GET", endpoint)) == 4  # three 404s, then the address
            assert sandbox.info().state == "Allocated"  # a GET may still show it
            assert client.get_sandbox(sandbox.id).state == "Allocated"
            assert client.get_sandbox(sandbox.id).state == "Running"
    assert kube.live() == []


def test_a_create_answered_allocated_waits_until_running(kube: KubeFake) -> None:
    kube.creates.append(Accept("Pending"))
    kube.states = ["Pending", "Allocated", "Allocated", "Running"]
    with Client(kube.api_base) as client, client.create_sandbox(**FAST) as sandbox:  # type: ignore[arg-type]
        gets = kube.server.seen("GET", f"/v1/sandboxes/{sandbox.id}")
        assert len(gets) == 4  # Pending, Allocated twice, then Running


def test_allocated_past_ready_timeout_names_it(kube: KubeFake) -> None:
    kube.creates.append(Accept("Pending"))
    kube.states = ["Allocated"]
    with Client(kube.api_base) as client, pytest.raises(SandboxTimeoutError) as info:
        client.create_sandbox(poll_interval=0.05, ready_timeout=0.5)
    assert "Allocated" in str(info.value) and "IP_ASSIGNED" in str(info.value)
    assert kube.live() == []  # deleted before the error


def test_the_cli_lists_allocated_sandboxes(kube: KubeFake) -> None:
    kube.states = ["Allocated"]  # the create answers Running; the list shows Allocated
    with Client(kube.api_base) as client, client.create_sandbox(**FAST) as sandbox:  # type: ignore[arg-type]
        ran = osb("list", "--api-base", kube.api_base, "--state", "allocated")
        assert ran.returncode == 0, ran.stderr
        assert sandbox.id in ran.stdout and "Allocated" in ran.stdout
        running = osb("list", "--api-base", kube.api_base, "--state", "running")
        assert sandbox.id not in running.stdout


def test_an_address_that_never_comes_names_the_last_answer(kube: KubeFake) -> None:
    kube.not_ready = 1000
    with Client(kube.api_base) as client, pytest.raises(SandboxTimeoutError) as info:
        client.create_sandbox(poll_interval=0.05, ready_timeout=0.5)
    assert "POD_IP_NOT_AVAILABLE" in str(info.value)
    assert isinstance(info.value.__cause__, EndpointNotReadyError)
    assert kube.live() == []


def test_the_pool_template_is_sent_as_the_spec_shapes_it(kube: KubeFake) -> None:
    template = json.loads(POOL_TEMPLATE.read_text())
    capacity = PoolCapacity(pool_min=0, pool_max=5, buffer_min=1, buffer_max=3)
    with Client(kube.api_base) as client:
        client.pools.create("pool-a", template, capacity)
    (sent,) = kube.pools
    assert sent == {
        "name": "pool-a",
        "template": template,
        "capacitySpec": {"bufferMax": 3, "bufferMin": 1, "poolMax": 5, "poolMin": 0},
    }


def test_a_server_pools_acquire_timeout_bounds_the_429_resends(kube: KubeFake) -> None:
    # SandboxPool(server_pool=...) creates in the caller's thread: a 429's resends must end by
    # acquire's timeout, not by create_timeout (they held acquire(timeout=1) for ~18 s)
    full = {"total": 1, "allocated": 1, "available": 0, "revision": "1"}
    capacity = {"bufferMax": 1, "bufferMin": 0, "poolMax": 1, "poolMin": 0}
    kube.server.routes[("GET", "/v1/pools/p")] = lambda req: req.send_json(
        200, {"name": "p", "capacitySpec": capacity, "status": full}
    )
    kube.creates.extend(capacity_exhausted("0") for _ in range(50))
    with Client(kube.api_base, create_timeout=20) as client:
        with SandboxPool(client, server_pool="p") as pool:
            started = time.monotonic()
            with pytest.raises(SandboxTimeoutError, match="within 1 seconds"):
                pool.acquire(timeout=1)
            assert time.monotonic() - started < 4  # not the 20 s of create_timeout
    assert kube.live() == []
