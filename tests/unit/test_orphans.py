"""The background lookup of a failed create's sandbox: when it stops, and when it goes on."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
import responses

from osb_sync import NO_TIMEOUT, ApiError, Client, TransportError
from osb_sync import _orphans as orphans
from tests.helpers import API, add_delete, body_of

CREATE_ID_KEY = "osb-sync/create-id"  # the documented tag of every create


@pytest.fixture
def client() -> Iterator[Client]:
    with Client(API) as c:
        yield c


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def listing(rsps: responses.RequestsMock, found_on_call: int | None) -> list[float]:
    """Answer the lookups, empty until call number ``found_on_call``; returns their times."""
    seen: list[float] = []

    def answer(request: requests.PreparedRequest) -> tuple[int, dict[str, str], str]:
        seen.append(time.monotonic())
        tag = body_of(rsps.calls[0])["metadata"][CREATE_ID_KEY]
        items = []
        if found_on_call is not None and len(seen) >= found_on_call:
            items = [{"id": "orphan", "metadata": {CREATE_ID_KEY: tag}}]
        return 200, {}, json.dumps({"items": items})

    rsps.add_callback("GET", f"{API}/sandboxes", callback=answer)
    return seen


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_after_an_error_status_the_first_answered_lookup_decides(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.post(f"{API}/sandboxes", status=500, json={"code": "E", "message": "boom"})
    seen = listing(rsps, found_on_call=None)
    with pytest.raises(ApiError):
        client.create_sandbox()
    assert orphans.searches_pending() == 0 and len(seen) == 1


def test_after_no_answer_an_empty_lookup_is_not_the_end(
    client: Client, rsps: responses.RequestsMock
) -> None:
    rsps.post(f"{API}/sandboxes", body=requests.ReadTimeout("read timed out"))
    seen = listing(rsps, found_on_call=3)  # the server was still making it
    add_delete(rsps, sid="orphan")
    with pytest.raises(TransportError):
        client.create_sandbox()
    assert orphans.searches_pending() == 1
    assert wait_for(lambda: orphans.searches_pending() == 0, 10)
    assert len(seen) == 3 and ("DELETE", f"{API}/sandboxes/orphan") in [
        (c.request.method, c.request.url) for c in rsps.calls
    ]
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(seen)]
    assert gaps[0] >= 0.4 and gaps[1] >= 0.9, gaps  # the transport's backoff: 0.5 s, 1 s


@pytest.mark.parametrize(("timeout", "still_looking"), [(NO_TIMEOUT, False), (60, True)])
def test_a_search_lasts_the_sandbox_lifetime_and_a_cap_without_one(
    client: Client,
    rsps: responses.RequestsMock,
    monkeypatch: pytest.MonkeyPatch,
    timeout: Any,
    still_looking: bool,
) -> None:
    monkeypatch.setattr(orphans, "SEARCH_CAP", 0.3)
    rsps.post(f"{API}/sandboxes", body=requests.ConnectionError("connection reset"))
    listing(rsps, found_on_call=None)
    with pytest.raises(TransportError):
        client.create_sandbox(timeout=timeout)
    # Capped, the search ends after its second lookup (0.5 s); a lifetime keeps it going.
    ended = wait_for(lambda: orphans.searches_pending() == 0, 1.5 if still_looking else 5)
    assert ended is not still_looking
