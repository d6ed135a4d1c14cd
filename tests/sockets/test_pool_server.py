"""SandboxPool(server_pool=...) on the local server's pools (named warm spares): the server
keeps the sandboxes warm, the SandboxPool only tracks what it lent and deletes it on release."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import requests

from osb_sync import (
    DEFAULT_TEMPLATE,
    ApiError,
    Client,
    ConfigurationError,
    NotFoundError,
    PoolCapacity,
    PoolClosedError,
    RedisStore,
    SandboxPool,
    SandboxTimeoutError,
)
from osb_sync.local import LocalServer

POOL_KEY = "osb_sync.pool"
TEMPLATE = {"image": {"uri": DEFAULT_TEMPLATE}, "entrypoint": ["/bin/sh"]}


@pytest.fixture(scope="module")
def local() -> Iterator[LocalServer]:
    with LocalServer(ping_interval=0.5, command_grace=0, unenforced_network_policy="accept") as srv:
        yield srv


@pytest.fixture
def client(local: LocalServer) -> Iterator[Client]:
    with Client(local.api_base) as c:
        yield c


@pytest.fixture
def warm(client: Client) -> Iterator[str]:
    """A server pool of at most 2 sandboxes, 1 kept warm."""
    name = f"warm-{secrets.token_hex(3)}"
    client.pools.create(name, TEMPLATE, PoolCapacity(pool_min=0, pool_max=2, buffer_min=1,
                                                     buffer_max=1))  # fmt: skip
    yield name
    client.pools.delete(name)


def alive(client: Client, pool_name: str) -> set[str]:
    return {info.id for info in client.list_sandboxes(metadata={POOL_KEY: pool_name})}


def test_it_lends_from_the_server_pool_and_deletes_on_release(client: Client, warm: str) -> None:
    with SandboxPool(client, server_pool=warm, name="srv") as pool:
        with pool.sandbox() as sandbox:
            assert sandbox.commands.run("echo hi").stdout == "hi\n"
            assert client.pools.get(warm).allocated == 1  # made with extensions.poolRef
            assert alive(client, "srv") == {sandbox.id}  # and tagged with the pool's name
            sandbox_id = sandbox.id
        with pytest.raises(NotFoundError):
            client.get_sandbox(sandbox_id)  # release deleted it: no idle queue here
        assert client.pools.get(warm).allocated == 0
        with pytest.raises(ConfigurationError, match="not lent"):
            pool.release(sandbox)


@pytest.mark.parametrize(
    "field",
    [
        {"networkPolicy": {"defaultAction": "deny"}},
        {"volumes": [{"name": "v", "mountPath": "/data", "host": {"path": "/tmp"}}]},
        {"platform": {"os": "linux", "arch": "amd64"}},
    ],
    ids=lambda field: next(iter(field)),
)
def test_a_create_from_a_pool_refuses_what_its_sandbox_cannot_take(
    local: LocalServer, client: Client, warm: str, field: dict[str, object]
) -> None:
    """As the released server: a pool's sandbox exists already, so a create with
    `extensions.poolRef` and volumes, a platform or a network policy is refused (400, naming
    the field); volumes were dropped in silence (202, a sandbox without them)."""
    name = next(iter(field))
    body = {"extensions": {"poolRef": warm}, **field}
    answer = requests.post(f"{local.api_base}/sandboxes", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "SANDBOX::INVALID_PARAMETER"
    assert f"{name} is not supported together with extensions.poolRef" in answer.text
    assert client.pools.get(warm).allocated == 0  # its reservation given back
    without = requests.post(f"{local.api_base}/sandboxes", json={**body, name: None}, timeout=60)
    assert without.status_code == 202, without.text  # the field alone was refused
    client.delete_sandbox(without.json()["id"])


def test_max_size_bounds_what_this_process_holds(client: Client, warm: str) -> None:
    with SandboxPool(client, server_pool=warm, max_size=1) as pool:
        first = pool.acquire()
        with pytest.raises(SandboxTimeoutError, match=r"max_size"):
            pool.acquire(timeout=0.3)
        pool.release(first)
        pool.release(pool.acquire(timeout=30))


def test_an_exhausted_server_pool_is_waited_for_then_a_timeout_naming_the_fix(
    client: Client, warm: str
) -> None:
    with SandboxPool(client, server_pool=warm, name="full") as pool:
        held = [pool.acquire(), pool.acquire()]  # the server pool's poolMax
        with pytest.raises(ApiError) as info:
            pool.acquire()  # no timeout: the 409 is raised
        assert info.value.status_code == 409
        with pytest.raises(SandboxTimeoutError, match=r"client\.pools\.update"):
            pool.acquire(timeout=1.0)
        pool.release(held.pop())
        held.append(pool.acquire(timeout=30))
    assert alive(client, "full") == set()  # close() deleted what it held
    with pytest.raises(PoolClosedError, match="closed"):
        pool.acquire()


def test_what_cannot_go_with_a_server_pool_is_refused(client: Client, warm: str) -> None:
    with pytest.raises(ConfigurationError, match=r"client\.pools\.create\('nope'"):
        SandboxPool(client, server_pool="nope")
    with pytest.raises(ConfigurationError, match="reuse='reset'"):
        SandboxPool(client, server_pool=warm, reuse="reset")
    with pytest.raises(ConfigurationError, match="not both"):
        SandboxPool(client, server_pool=warm, store=RedisStore("redis://127.0.0.1:1"))
    with pytest.raises(ConfigurationError, match="as server_pool"):
        SandboxPool(client, server_pool=warm, pool=warm)
