"""Deadlines of waits (``osb_sync/_wait.py``) and how the transport applies them to a request:
connect and read timeouts bounded by the time left, no retry past the deadline."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import responses

from osb_sync import SandboxTimeoutError, TransportError
from osb_sync._transport import Transport
from osb_sync._wait import Wait, time_left

URL = "http://osb.test/v1/sandboxes"


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def transport(max_retries: int = 3) -> Transport:
    return Transport(
        session=None,
        connect_timeout=10.0,
        read_timeout=60.0,
        pool_maxsize=2,
        max_retries=max_retries,
    )


def sent_timeout(rsps: responses.RequestsMock) -> tuple[float, float]:
    timeout = rsps.calls[-1].request.req_kwargs["timeout"]
    return float(timeout[0]), float(timeout[1])


def test_without_a_deadline_the_connect_and_read_timeouts_are_the_clients(
    rsps: responses.RequestsMock,
) -> None:
    rsps.get(URL, json={})
    transport().request("GET", URL)
    assert sent_timeout(rsps) == (10.0, 60.0)


def test_a_deadline_bounds_both_timeouts_by_the_time_left(rsps: responses.RequestsMock) -> None:
    rsps.get(URL, json={})
    transport().request("GET", URL, deadline=time.monotonic() + 2)
    connect, read = sent_timeout(rsps)
    assert 1.5 < connect <= 2 and 1.5 < read <= 2


def test_a_deadline_further_than_the_timeouts_leaves_them_as_they_are(
    rsps: responses.RequestsMock,
) -> None:
    rsps.get(URL, json={})
    transport().request("GET", URL, read_timeout=5, deadline=time.monotonic() + 30)
    connect, read = sent_timeout(rsps)
    assert (connect, read) == (10.0, 5.0)


def test_a_passed_deadline_sends_nothing(rsps: responses.RequestsMock) -> None:
    with pytest.raises(TransportError, match="not sent, its deadline had passed"):
        transport().request("GET", URL, deadline=time.monotonic() - 1)
    assert len(rsps.calls) == 0


def test_no_retry_is_made_whose_backoff_passes_the_deadline(
    rsps: responses.RequestsMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr("time.sleep", slept.append)
    rsps.get(URL, status=503, headers={"Retry-After": "5"})
    response = transport().request("GET", URL, idempotent=True, deadline=time.monotonic() + 2)
    assert response.status_code == 503 and len(rsps.calls) == 1 and slept == []


def test_a_wait_turns_a_transport_error_at_its_deadline_into_its_own_timeout() -> None:
    wait = Wait("execd did not answer", 0.0)
    with pytest.raises(
        SandboxTimeoutError, match=r"execd did not answer within 0.0 seconds \(x\)"
    ) as info:
        with wait.bounding(" (x)"):
            raise TransportError("no answer")
    assert isinstance(info.value.__cause__, TransportError)


def test_a_wait_keeps_a_transport_error_met_before_its_deadline() -> None:
    with pytest.raises(TransportError, match="refused"):
        with Wait("execd did not answer", 30).bounding():
            raise TransportError("refused")


def test_a_wait_never_sleeps_past_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("time.sleep", slept.append)
    Wait("x", 0.5).sleep(10)
    assert len(slept) == 1 and slept[0] <= 0.5
    assert time_left(None) is None and time_left(time.monotonic() - 1) == 0.0
