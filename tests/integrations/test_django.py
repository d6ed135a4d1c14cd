"""The Django integration, through Django's test client against the local server."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

django = pytest.importorskip("django")

from django.conf import settings  # noqa: E402

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="osb-sync-tests-" + "x" * 40,
        ALLOWED_HOSTS=["testserver"],
        ROOT_URLCONF=__name__,
        MIDDLEWARE=[],
        INSTALLED_APPS=[],
        DATABASES={},
    )
    django.setup()

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse  # noqa: E402
from django.test import Client as DjangoClient  # noqa: E402
from django.test import override_settings  # noqa: E402
from django.urls import path  # noqa: E402

from osb_sync import Client, ConfigurationError, RedisStore  # noqa: E402
from osb_sync.integrations import django as osb_django  # noqa: E402
from osb_sync.local import LocalServer  # noqa: E402
from tests.redisserver import RedisServer, redis_server  # noqa: E402

__all__ = ["redis_server"]  # the fixture, imported for pytest


def run(request: HttpRequest) -> HttpResponse:
    sandbox = osb_django.request_sandbox(request)
    result = sandbox.run_code(request.body.decode(), timeout=10)
    assert osb_django.request_sandbox(request) is sandbox  # one per request
    return JsonResponse({"stdout": result.stdout, "id": sandbox.id})


def boom(request: HttpRequest) -> HttpResponse:
    osb_django.request_sandbox(request).run_code("x = 1")
    raise RuntimeError("the view failed")


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("no sandbox needed")


def stream(request: HttpRequest) -> HttpResponse:
    sandbox = osb_django.request_sandbox(request)

    def lines() -> Iterator[str]:
        for n in range(3):  # the sandbox stays lent until the last chunk was sent
            yield sandbox.run_code(f"print({n})").stdout

    return StreamingHttpResponse(lines())


def block(request: HttpRequest) -> HttpResponse:
    with osb_django.sandbox() as sandbox:
        return HttpResponse(sandbox.commands.run("echo from-block").stdout)


urlpatterns = [
    path("run", run),
    path("boom", boom),
    path("plain", plain),
    path("stream", stream),
    path("block", block),
]


@pytest.fixture(scope="module")
def local() -> Iterator[LocalServer]:
    with LocalServer(command_grace=0, unenforced_network_policy="accept") as srv:
        yield srv


@pytest.fixture
def configured(local: LocalServer) -> Iterator[dict[str, Any]]:
    options = {"API_BASE": local.api_base, "POOL_SIZE": 1, "POOL_MAX_SIZE": 1}
    with override_settings(OPENSANDBOX=options):
        yield options
    # leaving override_settings closed the pool: nothing may be left on the server
    with Client(local.api_base) as client:
        assert list(client.list_sandboxes()) == []


def test_a_view_runs_code_and_gives_the_sandbox_back(configured: dict[str, Any]) -> None:
    client = DjangoClient()
    first = client.post("/run", "print(6 * 7)", content_type="text/plain")
    assert first.status_code == 200 and first.json()["stdout"] == "42\n"
    second = client.post("/run", "print(2)", content_type="text/plain")  # max_size=1
    assert second.json()["stdout"] == "2\n" and second.json()["id"] != first.json()["id"]


def test_the_sandbox_comes_back_when_the_view_raises(configured: dict[str, Any]) -> None:
    client = DjangoClient(raise_request_exception=False)
    assert client.get("/boom").status_code == 500
    after = client.post("/run", "print(1)", content_type="text/plain")
    assert after.status_code == 200 and after.json()["stdout"] == "1\n"


def test_a_streamed_response_keeps_its_sandbox_until_the_end(
    configured: dict[str, Any],
) -> None:
    response = DjangoClient().get("/stream")
    assert b"".join(response.streaming_content) == b"0\n1\n2\n"  # type: ignore[attr-defined]
    response.close()
    assert DjangoClient().get("/block").content == b"from-block\n"


def test_nothing_is_made_unless_a_view_asks(configured: dict[str, Any], local: LocalServer) -> None:
    assert DjangoClient().get("/plain").content == b"no sandbox needed"
    assert osb_django._process.pool is None
    with Client(local.api_base) as client:
        assert list(client.list_sandboxes()) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_process_builds_its_own_client_and_pool(configured: dict[str, Any]) -> None:
    parent_client, parent_pool = osb_django.get_client(), osb_django.get_pool()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            pool = osb_django.get_pool()
            fresh = pool is not parent_pool and osb_django.get_client() is not parent_client
            with osb_django.sandbox() as sb:
                code = 0 if fresh and sb.run_code("print(1)").stdout == "1\n" else 2
            osb_django.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert osb_django.get_pool() is parent_pool
    with osb_django.sandbox() as sb:
        assert sb.run_code("print(2)").stdout == "2\n"


def test_bad_settings_are_reported() -> None:
    for bad in ({"POOL_SZE": 2}, {"CREATE": ["x"]}, ["not", "a", "dict"]):
        with override_settings(OPENSANDBOX=bad), pytest.raises(ConfigurationError):
            osb_django.get_pool()


def test_open_sandbox_spelling_and_a_pool_shared_through_redis(
    local: LocalServer, redis_server: RedisServer
) -> None:
    options = {"API_BASE": local.api_base, "POOL_SIZE": 1, "POOL_NAME": "django-shared",
               "POOL_REDIS_URL": redis_server.url}  # fmt: skip
    with override_settings(OPEN_SANDBOX=options):
        pool = osb_django.get_pool()
        assert isinstance(pool.store, RedisStore) and pool.name == "django-shared"
        response = DjangoClient().post("/run", "print(3)", content_type="text/plain")
        assert response.json()["stdout"] == "3\n"
    with Client(local.api_base) as client:  # closed: the last one out deleted the warm one
        assert list(client.list_sandboxes()) == []
