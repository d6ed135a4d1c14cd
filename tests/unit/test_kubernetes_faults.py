"""The released server's Kubernetes answers, with `responses` and a fake clock: the typed
faults of the one funnel, the hostile ``Retry-After`` values, and the 429 create's retry
within ``create_timeout`` (the socket-level fake of the same cases: tests/sockets/
test_kubernetes.py)."""

from __future__ import annotations

import email.utils
import json
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import responses

from osb_sync import (
    ApiError,
    CapacityError,
    Client,
    EndpointNotReadyError,
    NotFoundError,
    ProxyConnectError,
    ProxyError,
    ProxyResponseError,
    ProxyTimeoutError,
    QuotaExceededError,
    SandboxTimeoutError,
    StartTimeoutError,
)
from osb_sync._errors import error_from_response, parse_retry_after, with_suffix
from tests.helpers import API, KEY, SID, Clock, add_endpoint, add_ping, sandbox_body

CREATE_ID_KEY = "osb-sync/create-id"
NOW = 1_800_000_000.0  # a Unix time to count HTTP dates from


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        add_ping(mock)
        add_endpoint(mock)
        mock.get(f"{API}/sandboxes", json={"items": []})  # the refused attempts' lookups
        yield mock


def http_date(unix: float) -> str:
    return email.utils.formatdate(unix, usegmt=True)


# -- Retry-After: the server's value is untrusted ------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("30", 30.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("1.5", 1.5),
        ("-1", None),  # negative: not a delay
        ("-0", 0.0),
        ("NaN", None),
        ("nan", None),
        ("inf", None),
        ("-inf", None),
        ("1e400", None),  # overflows to infinity
        ("9" * 400, sys.float_info.max),  # valid delay-seconds, too long for a float: huge
        ("1e12", 1e12),  # huge but a number: the caller decides (cap or refusal)
        ("soon", None),
        ("0x1e", None),
        ("30 seconds", None),
        ("\x00", None),
        ("Mon, 99 Foo 2026 99:99:99 GMT", None),
        (http_date(NOW - 3600), 0.0),  # a date in the past: now
        (http_date(NOW + 90), 90.0),
        (http_date(NOW + 10 * 365 * 86400), 10 * 365 * 86400.0),
        ("Fri, 31 Dec 9999 23:59:59 GMT", 253402300799.0 - NOW),
    ],
)
def test_retry_after_values_hostile_or_not(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == expected


def test_a_date_without_a_zone_is_utc() -> None:
    assert parse_retry_after("Thu, 01 Jan 2027 00:00:30 -0000", now=1798761600.0) == 30.0


# -- the typed faults: class by status and code, the server's code and message kept ---------


def answer(status: int, code: str | None, message: str, **headers: str) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    body = {"message": message} if code is None else {"code": code, "message": message}
    response._content = json.dumps(body).encode()
    response.headers.update({"Content-Type": "application/json", **headers})
    return response


FAULTS = [
    (429, "KUBERNETES::POOL_CAPACITY_EXHAUSTED", CapacityError),
    (429, "FSB::API_ERROR", CapacityError),
    (429, None, CapacityError),  # a gateway's rate limit: no code
    (403, "KUBERNETES::QUOTA_EXCEEDED", QuotaExceededError),
    (504, "KUBERNETES::POD_READY_TIMEOUT", StartTimeoutError),
    (404, "KUBERNETES::POD_IP_NOT_AVAILABLE", EndpointNotReadyError),
    (502, "BACKEND_CONNECTION_FAILED", ProxyConnectError),
    (502, "BACKEND_RESPONSE_FAILED", ProxyResponseError),
    (504, "BACKEND_TIMEOUT", ProxyTimeoutError),
    # the same statuses with other codes stay what they were
    (403, "SANDBOX::FORBIDDEN", ApiError),
    (504, None, ApiError),
    (502, "SOMETHING_ELSE", ApiError),
    (404, "SANDBOX::NOT_FOUND", NotFoundError),
]


@pytest.mark.parametrize(("status", "code", "cls"), FAULTS)
def test_each_fault_is_its_class_with_the_servers_code_and_message(
    status: int, code: str | None, cls: type[ApiError]
) -> None:
    message = f"the server's words for {code}"
    exc = error_from_response(answer(status, code, message), "POST", "/v1/x", ())
    assert type(exc) is cls
    assert (exc.status_code, exc.code, exc.message) == (status, code, message)
    assert message in str(exc) and (code or "") in str(exc)
    assert isinstance(exc, requests.HTTPError)


def test_the_fault_classes_sit_where_callers_catch_them() -> None:
    assert issubclass(StartTimeoutError, SandboxTimeoutError)  # "not ready in time"
    assert issubclass(StartTimeoutError, TimeoutError)
    assert issubclass(EndpointNotReadyError, NotFoundError)
    for cls in (ProxyConnectError, ProxyResponseError, ProxyTimeoutError):
        assert issubclass(cls, ProxyError)


def test_a_429_carries_the_servers_retry_after() -> None:
    exc = error_from_response(
        answer(429, "KUBERNETES::POOL_CAPACITY_EXHAUSTED", "full", **{"Retry-After": "30"}),
        "POST",
        "/v1/sandboxes",
    )
    assert isinstance(exc, CapacityError) and exc.retry_after == 30.0
    assert "retry after 30 s" in str(exc)
    garbage = error_from_response(answer(429, None, "", **{"Retry-After": "NaN"}), "GET", "/")
    assert isinstance(garbage, CapacityError) and garbage.retry_after is None


def test_a_suffix_keeps_the_class_and_its_fields() -> None:
    exc = error_from_response(answer(429, None, "full", **{"Retry-After": "5"}), "POST", "/x")
    longer = with_suffix(exc, "(more)")
    assert type(longer) is CapacityError and longer.retry_after == 5.0  # type: ignore[attr-defined]
    assert str(longer).endswith("(more)") and longer.response is exc.response


# -- the 429 create: retried within create_timeout, never duplicated ------------------------


def refused(
    retry_after: str | None = "30", code: str = "KUBERNETES::POOL_CAPACITY_EXHAUSTED"
) -> dict[str, Any]:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    message = "No Pool capacity became available before the acquisition timeout."
    return {"status": 429, "json": {"code": code, "message": message}, "headers": headers}


def posts(rsps: responses.RequestsMock) -> list[dict[str, Any]]:
    return [
        json.loads(c.request.body or b"{}")
        for c in rsps.calls
        if c.request.method == "POST" and urlsplit(c.request.url or "").path == "/v1/sandboxes"
    ]


def lookups(rsps: responses.RequestsMock) -> list[str]:
    """The create-id tags the orphan searches looked up."""
    found = []
    for c in rsps.calls:
        url = urlsplit(c.request.url or "")
        if c.request.method == "GET" and url.path == "/v1/sandboxes":
            metadata = parse_qs(parse_qs(url.query)["metadata"][0])
            found.append(metadata[CREATE_ID_KEY][0])
    return found


def test_a_429_create_waits_and_is_retried_with_a_fresh_tag(
    rsps: responses.RequestsMock, clock: Clock
) -> None:
    rsps.post(f"{API}/sandboxes", **refused("30"))
    rsps.post(f"{API}/sandboxes", json=sandbox_body(), status=202)
    with Client(API, KEY, create_timeout=300) as client:
        sandbox = client.create_sandbox()
    assert sandbox.id == SID
    first, second = posts(rsps)
    assert clock.sleeps[0] == 30.0
    tags = [first["metadata"].pop(CREATE_ID_KEY), second["metadata"].pop(CREATE_ID_KEY)]
    assert first == second and tags[0] != tags[1]  # the same request, its own tag
    # the refused attempt's tag is searched for (its sandbox, had the server left one, would
    # be deleted), never the retried one's
    assert lookups(rsps) == [tags[0]]


def test_a_wait_longer_than_the_budget_fails_fast(
    rsps: responses.RequestsMock, clock: Clock
) -> None:
    rsps.post(f"{API}/sandboxes", **refused("30"))
    with Client(API, KEY, create_timeout=20) as client:
        with pytest.raises(CapacityError) as info:
            client.create_sandbox()
    assert len(posts(rsps)) == 1 and clock.sleeps == []
    assert info.value.retry_after == 30.0 and info.value.code == (
        "KUBERNETES::POOL_CAPACITY_EXHAUSTED"
    )
    assert "create_timeout=20" in str(info.value) and "not retried" in str(info.value)


@pytest.mark.parametrize(
    ("value", "first_wait"),
    [
        ("NaN", 0.5),  # unusable: the transport's backoff
        ("-5", 0.5),
        ("garbage", 0.5),
        ("0", 0.5),  # never a busy loop: at least the backoff
        (None, 0.5),
        (http_date(time.time() - 60), 0.5),
        ("3", 3.0),
    ],
)
def test_an_unusable_retry_after_waits_the_backoff(
    rsps: responses.RequestsMock, clock: Clock, value: str | None, first_wait: float
) -> None:
    rsps.post(f"{API}/sandboxes", **refused(value))
    rsps.post(f"{API}/sandboxes", json=sandbox_body(), status=202)
    with Client(API, KEY) as client:
        client.create_sandbox()
    assert len(posts(rsps)) == 2 and clock.sleeps[0] == first_wait


@pytest.mark.parametrize("value", ["1e12", "9" * 400, "Fri, 31 Dec 9999 23:59:59 GMT"])
def test_a_huge_retry_after_fails_fast(
    rsps: responses.RequestsMock, clock: Clock, value: str
) -> None:
    rsps.post(f"{API}/sandboxes", **refused(value))
    with Client(API, KEY) as client, pytest.raises(CapacityError):
        client.create_sandbox()
    assert len(posts(rsps)) == 1 and clock.sleeps == []


def test_a_server_that_always_refuses_is_retried_only_within_the_budget(
    rsps: responses.RequestsMock, clock: Clock
) -> None:
    rsps.post(f"{API}/sandboxes", **refused("0"))  # hostile: "retry at once", forever
    with Client(API, KEY, create_timeout=30) as client, pytest.raises(CapacityError):
        client.create_sandbox()
    assert sum(clock.sleeps) <= 30 and 3 <= len(posts(rsps)) <= 10
    tags = [body["metadata"][CREATE_ID_KEY] for body in posts(rsps)]
    assert len(set(tags)) == len(tags)  # each attempt its own tag
    assert sorted(lookups(rsps)) == sorted(tags)  # each refused attempt searched for


@pytest.mark.parametrize(
    "failure",
    [
        {"status": 403, "json": {"code": "KUBERNETES::QUOTA_EXCEEDED", "message": "quota"}},
        {"status": 504, "json": {"code": "KUBERNETES::POD_READY_TIMEOUT", "message": "slow"}},
    ],
)
def test_other_create_faults_are_typed_searched_for_and_not_retried(
    rsps: responses.RequestsMock, clock: Clock, failure: dict[str, Any]
) -> None:
    rsps.post(f"{API}/sandboxes", **failure)
    with Client(API, KEY) as client, pytest.raises(ApiError) as info:
        client.create_sandbox()
    assert type(info.value) in (QuotaExceededError, StartTimeoutError)
    assert info.value.message == failure["json"]["message"]
    assert len(posts(rsps)) == 1
    assert lookups(rsps) == [posts(rsps)[0]["metadata"][CREATE_ID_KEY]]


def test_a_429_create_logs_no_secret_the_server_echoes_in_its_code(
    rsps: responses.RequestsMock, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # a hostile (or careless) server echoes the API key in the code of its 429: the retry's
    # log line and the error's fields must not carry it
    echoed = {"status": 429, "json": {"code": f"RATE::{KEY}", "message": KEY}}
    rsps.post(f"{API}/sandboxes", **echoed)
    rsps.post(f"{API}/sandboxes", **echoed)
    with caplog.at_level("DEBUG", logger="osb_sync"), Client(API, KEY, create_timeout=3) as client:
        with pytest.raises(CapacityError) as info:
            client.create_sandbox()
    assert len(posts(rsps)) >= 2  # it was retried, so the retry's line was logged
    assert "retrying" in caplog.text and KEY not in caplog.text
    assert KEY not in str(info.value) and KEY not in (info.value.code or "")
