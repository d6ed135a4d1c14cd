"""The Flask extension, through Flask's test client against the local server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

flask = pytest.importorskip("flask")

from osb_sync import Client, ConfigurationError, RedisStore, SandboxTimeoutError  # noqa: E402
from osb_sync.integrations.flask import OpenSandbox, get_sandbox  # noqa: E402
from osb_sync.local import LocalServer  # noqa: E402
from tests.redisserver import RedisServer, redis_server  # noqa: E402

__all__ = ["redis_server"]  # the fixture, imported for pytest


@pytest.fixture(scope="module")
def local() -> Iterator[LocalServer]:
    with LocalServer(command_grace=0, unenforced_network_policy="accept") as srv:
        yield srv


def make_app(local: LocalServer, **config: Any) -> tuple[Any, OpenSandbox]:
    app = flask.Flask(__name__)
    app.config.update(
        {
            "TESTING": True,
            "OPENSANDBOX_API_BASE": local.api_base,
            "OPENSANDBOX_POOL_SIZE": 1,
            "OPENSANDBOX_POOL_MAX_SIZE": 1,
            "OPENSANDBOX_ACQUIRE_TIMEOUT": 10,
            **config,
        }
    )
    ext = OpenSandbox()
    ext.init_app(app)

    @app.post("/run")
    def run() -> Any:
        result = ext.sandbox.run_code(flask.request.get_data(as_text=True), timeout=10)
        return {"stdout": result.stdout, "id": get_sandbox().id}

    @app.get("/boom")
    def boom() -> Any:
        ext.sandbox.run_code("x = 1")
        raise RuntimeError("the view failed")

    @app.get("/plain")
    def plain() -> Any:
        return "no sandbox needed"

    return app, ext


@pytest.fixture
def apps(local: LocalServer) -> Iterator[list[tuple[Any, OpenSandbox]]]:
    made: list[tuple[Any, OpenSandbox]] = []
    yield made
    for app, ext in made:
        ext.close(app)
    with Client(local.api_base) as client:
        assert list(client.list_sandboxes()) == []


def test_a_view_runs_code_in_a_pooled_sandbox(local: LocalServer, apps: list[Any]) -> None:
    app, ext = make_app(local)
    apps.append((app, ext))
    client = app.test_client()
    first = client.post("/run", data="print(6 * 7)")
    assert first.status_code == 200 and first.json["stdout"] == "42\n"
    # max_size=1: the second request gets a sandbox only if the first gave its back
    second = client.post("/run", data="print('again')")
    assert second.json["stdout"] == "again\n"
    assert second.json["id"] != first.json["id"]  # reuse="never": a fresh one


def test_the_sandbox_comes_back_when_the_view_raises(local: LocalServer, apps: list[Any]) -> None:
    app, ext = make_app(local, OPENSANDBOX_REUSE="reset")
    apps.append((app, ext))
    app.config["PROPAGATE_EXCEPTIONS"] = False
    client = app.test_client()
    assert client.get("/boom").status_code == 500
    after = client.post("/run", data="print('x' in dir())")
    assert after.status_code == 200 and after.json["stdout"] == "False\n"  # reset: clean state


def test_nothing_is_borrowed_or_created_unless_a_view_asks(
    local: LocalServer, apps: list[Any]
) -> None:
    app, ext = make_app(local)
    apps.append((app, ext))
    assert app.test_client().get("/plain").data == b"no sandbox needed"
    assert app.extensions["opensandbox"].pool is None
    with Client(local.api_base) as client:
        assert list(client.list_sandboxes()) == []


def test_a_request_waits_for_a_free_sandbox_then_times_out(
    local: LocalServer, apps: list[Any]
) -> None:
    app, ext = make_app(local, OPENSANDBOX_ACQUIRE_TIMEOUT=0.5)
    apps.append((app, ext))
    pool = ext.get_pool(app)
    held = pool.acquire(timeout=10)
    try:
        with pytest.raises(SandboxTimeoutError):
            app.test_client().post("/run", data="1")
    finally:
        pool.release(held)
    # The pool replaces the returned sandbox (reuse="never"); under load that may take longer
    # than the 0.5 s a request waits: a request gets one once the replacement is ready.
    deadline = time.monotonic() + 30
    while True:
        try:
            response = app.test_client().post("/run", data="print(1)")
            break
        except SandboxTimeoutError:
            assert time.monotonic() < deadline, "no sandbox came back to the pool within 30 s"
    assert response.json["stdout"] == "1\n"


def test_concurrent_requests_share_the_pool(local: LocalServer, apps: list[Any]) -> None:
    app, ext = make_app(local, OPENSANDBOX_POOL_SIZE=2, OPENSANDBOX_POOL_MAX_SIZE=3)
    apps.append((app, ext))
    outputs: list[str] = []
    errors: list[BaseException] = []

    def request(n: int) -> None:
        try:
            response = app.test_client().post("/run", data=f"print({n})")
            outputs.append(response.json["stdout"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=request, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and sorted(outputs) == [f"{n}\n" for n in range(6)]


def test_settings_are_checked_and_the_extension_is_required(local: LocalServer) -> None:
    app = flask.Flask(__name__)
    app.config["OPENSANDBOX_CREATE"] = ["not", "a", "dict"]
    with pytest.raises(ConfigurationError):
        OpenSandbox(app)
    with flask.Flask(__name__).app_context():
        with pytest.raises(RuntimeError, match="OpenSandbox is not set up"):
            get_sandbox()


def test_open_sandbox_spellings_and_a_pool_shared_through_redis(
    local: LocalServer, apps: list[tuple[Any, OpenSandbox]], redis_server: RedisServer
) -> None:
    name = "flask-shared"
    shared = {"OPEN_SANDBOX_POOL_REDIS_URL": redis_server.url, "OPEN_SANDBOX_POOL_NAME": name}
    workers = [make_app(local, OPENSANDBOX_POOL_MAX_SIZE=2, **shared) for _ in range(2)]
    apps.extend(workers)  # two apps: two worker processes' pools, one pool in Redis
    pools = [ext.get_pool(app) for app, ext in workers]
    assert all(isinstance(pool.store, RedisStore) for pool in pools)
    with Client(local.api_base) as client:
        tagged = lambda: list(client.list_sandboxes(metadata={"osb_sync.pool": name}))  # noqa: E731
        deadline = time.monotonic() + 15
        while len(tagged()) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        assert len(tagged()) == 1  # one warm sandbox for both, not one each
        ids = [app.test_client().post("/run", data="print(1)").get_json()["id"]
               for app, _ in workers]  # fmt: skip
        assert len(set(ids)) == 2


def test_both_spellings_of_one_setting_must_agree(local: LocalServer) -> None:
    with pytest.raises(ConfigurationError, match="both set"):
        make_app(local, OPEN_SANDBOX_POOL_SIZE=3)  # make_app sets OPENSANDBOX_POOL_SIZE=1
