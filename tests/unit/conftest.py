"""Fixtures of the unit tests."""

from __future__ import annotations

import pytest

from tests.helpers import Clock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A fake clock in place of time.monotonic and time.sleep."""
    fake = Clock()
    monkeypatch.setattr("time.monotonic", fake.monotonic)
    monkeypatch.setattr("time.sleep", fake.sleep)
    return fake
