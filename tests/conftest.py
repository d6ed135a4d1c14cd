from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from osb_sync import _orphans as orphans
from tests.fakeserver import FakeServer

# A shell that starts pytest in the background (`pytest &` in a script) ignores SIGINT, and the
# processes the tests start would inherit that: tests that press Ctrl-C on them would hang.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Suites marked by where they live (their own files stay as their owners wrote them).
MARKED_DIRECTORIES = {"conformance": "conformance", "local": "local", "nonroot": "nonroot"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the suites plain ``pytest`` leaves out (see ``addopts`` in setup.cfg)."""
    for item in items:
        path = item.path
        marker = MARKED_DIRECTORIES.get(path.parent.name)
        if marker is not None:
            item.add_marker(marker)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPEN_SANDBOX_API_BASE", "OPEN_SANDBOX_API_KEY", "OPEN_SANDBOX_DOMAIN"):
        monkeypatch.delenv(name, raising=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """Stop the background lookups of failed creates before any fixture is torn down.

    Before, not after: a lookup must not outlive the fake server or the ``responses`` mock it
    was meant for (and reach a later test's server, or DNS).
    """
    orphans._cancel_all(wait=5.0)
    yield


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
