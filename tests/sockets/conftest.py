"""Under ``OSB_TEST_EXECD`` (tox -e realexecd) the client suites run on a real execd binary:
tests of our execd's own behaviour are skipped (marker ``ours_only(reason)``), and every
lossy retry is listed at the end (see tests/realexecd.py).

The command-line and everyday suites (test_cli, test_cli_verbs, test_everyday) share one local
server and one sandbox for the whole session: each of their tests labels the sandboxes it makes
(and lists or deletes by label), or uses the shared one without depending on what others did
in it. A test about a server of its own (an API key, ``rm --all``, the embedded one) makes it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from osb_sync import Client, Sandbox
from osb_sync.local import LocalServer
from tests import realexecd


@pytest.fixture(scope="session")
def shared_server() -> Iterator[LocalServer]:
    with LocalServer(unenforced_network_policy="accept", command_grace=0) as server:
        yield server


@pytest.fixture(scope="session")
def shared_sandbox(shared_server: LocalServer) -> Iterator[Sandbox]:
    with Client(shared_server.api_base) as client, client.create_sandbox() as sandbox:
        yield sandbox


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not realexecd.in_use():
        return
    for item in items:
        marker = item.get_closest_marker("ours_only")
        if marker is not None:
            item.add_marker(pytest.mark.skip(reason=f"our execd only: {marker.args[0]}"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not realexecd.in_use():
        return
    retries = realexecd.RETRIES
    terminalreporter.write_line(
        f"real execd: {len(retries)} retries of runs that lost trailing /code events"
    )
    for line in retries:
        terminalreporter.write_line(f"  {line}")
