"""Under ``OSB_TEST_EXECD`` (tox -e realexecd) the client suites run on a real execd binary:
tests of our execd's own behaviour are skipped (marker ``ours_only(reason)``), and every
lossy retry is listed at the end (see tests/realexecd.py)."""

from __future__ import annotations

import pytest

from tests import realexecd


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
