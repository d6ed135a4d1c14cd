"""The two targets (real execd, local server's execd) and the count of retries."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from osb_sync import Client, Sandbox
from osb_sync.local import LocalServer

from .execds import TOKEN_HEADER, Target, real_execd

READ_TIMEOUT = 30.0


@dataclass
class RetryLog:
    """Every retry of a real-side run that lost its trailing events; printed at the end."""

    entries: list[str] = field(default_factory=list)
    ran: bool = False

    def record(self, scenario: str, attempt: int, paths: list[str]) -> None:
        line = f"{scenario}: retry {attempt}, real execd lacked trailing output in {paths}"
        self.entries.append(line)
        print(f"conformance retry: {line}")


RETRIES = RetryLog()


@pytest.fixture(scope="session")
def retries() -> RetryLog:
    RETRIES.ran = True
    return RETRIES


@pytest.fixture(scope="session")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    with (
        real_execd(tmp_path_factory.mktemp("real-execd")) as (endpoint, token),
        Sandbox.from_execd(
            f"http://{endpoint}", headers={TOKEN_HEADER: token}, read_timeout=READ_TIMEOUT
        ) as sandbox,
    ):
        yield Target("real", sandbox, tmp_path_factory.mktemp("real-files"))


@pytest.fixture(scope="session")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    with (
        LocalServer() as server,
        Client(server.api_base, read_timeout=READ_TIMEOUT) as client,
        client.create_sandbox() as sandbox,
    ):
        yield Target("local", sandbox, tmp_path_factory.mktemp("local-files"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RETRIES.ran:
        return
    terminalreporter.write_line(
        f"conformance: {len(RETRIES.entries)} retries of real-execd runs that lost trailing "
        "/code events"
    )
    for line in RETRIES.entries:
        terminalreporter.write_line(f"  {line}")
