"""Fixtures for the local server tests: a server on 127.0.0.1 port 0 and sandbox handles,
made from `support.py`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from osb_sync.local import LocalServer
from tests.local.support import CREATE_BODY, Box, local_server, require_isolation


@pytest.fixture
def local() -> Iterator[LocalServer]:
    """A started server of the suite (`support.local_server`)."""
    with local_server() as srv:
        yield srv


@pytest.fixture
def client_server() -> Iterator[LocalServer]:
    """A server for `osb_sync.Client` sandboxes: it accepts their default deny-all policy also
    where it cannot enforce it (without bubblewrap), as the client suites' servers do."""
    with local_server(command_grace=0, unenforced_network_policy="accept") as srv:
        yield srv


@pytest.fixture
def isolated_server() -> Iterator[LocalServer]:
    """Like `local`, but sure to isolate its sandboxes (else skip, or fail in CI)."""
    require_isolation()
    with local_server(isolation=True) as srv:
        yield srv


@pytest.fixture
def http() -> Iterator[requests.Session]:
    """A requests session, closed after the test."""
    with requests.Session() as session:
        yield session


@pytest.fixture
def box(local: LocalServer, http: requests.Session) -> Box:
    """A fresh sandbox on the `local` server."""
    return Box(local, http, CREATE_BODY)


@pytest.fixture
def make_box(http: requests.Session) -> Any:
    """A factory: `make_box(server, **body_overrides)` creates a sandbox on `server`."""

    def make(server: LocalServer, **overrides: Any) -> Box:
        return Box(server, http, {**CREATE_BODY, **overrides})

    return make
