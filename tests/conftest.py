from __future__ import annotations

from collections.abc import Iterator

import pytest

from osb_sync import orphans
from tests.fakeserver import FakeServer


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPEN_SANDBOX_API_BASE", "OPEN_SANDBOX_API_KEY", "OPEN_SANDBOX_DOMAIN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _no_search_outlives_its_test() -> Iterator[None]:
    """A failed create's background lookup must not reach a later test's server (or DNS)."""
    yield
    orphans._cancel_all(wait=5.0)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as srv:
        yield srv


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record time.sleep calls instead of sleeping."""
    calls: list[float] = []
    monkeypatch.setattr("time.sleep", calls.append)
    return calls
