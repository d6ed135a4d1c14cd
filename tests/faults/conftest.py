"""The fault server for the modules that use it: one World per module, reset for each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.faultserver import World


@pytest.fixture(scope="module")
def servers() -> Iterator[World]:
    with World() as world:
        yield world


@pytest.fixture
def world(servers: World) -> Iterator[World]:
    servers.reset()
    yield servers
    servers.heal()
