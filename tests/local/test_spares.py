"""Warm spare containers: claimed by creates, private to their sandbox, never listed or leaked."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from osb_sync.local import LocalServer
from osb_sync.local.host import spares
from osb_sync.local.host.container import SandboxContainer
from osb_sync.local.host.spares import SparePool
from tests.leftovers import processes_under
from tests.local.support import (
    CREATE_BODY,
    Box,
    alive,
    local_server,
    parse_events,
    registry_of,
    require_isolation,
    sandbox_of,
    texts,
    wait_for,
)

START_WAIT = 60.0


@pytest.fixture
def spare_server() -> Iterator[LocalServer]:
    """An isolating server that keeps one spare container."""
    require_isolation()
    with local_server(
        ping_interval=0.2, command_grace=0, min_timeout=1, isolation=True, spare_containers=1
    ) as srv:
        yield srv


def pool(server: LocalServer) -> SparePool:
    return registry_of(server).spares


def ready_spare(server: LocalServer) -> SandboxContainer:
    """The server's spare, once it is launched."""
    assert wait_for(lambda: pool(server).ready(), START_WAIT), "no spare became ready"
    return pool(server).ready()[0]


def container_of(server: LocalServer, box: Box) -> SandboxContainer:
    sandbox = sandbox_of(server, box.id)
    assert sandbox is not None
    return sandbox.container


def run(box: Box, code: str) -> str:
    answer = box.call("POST", "/code", json={"code": code, "context": {"language": "python"}})
    assert answer.status_code == 200, answer.text
    return "".join(texts(parse_events(answer.content)))


def test_a_create_claims_the_spare_started_before_it(
    spare_server: LocalServer, make_box: Any
) -> None:
    spare = ready_spare(spare_server)
    asked_at = time.monotonic()
    box = make_box(spare_server)
    container = container_of(spare_server, box)
    assert container is spare and container.launched_at < asked_at
    assert pool(spare_server).claimed == 1
    assert box.id == container.home.name and os.path.isdir(box.dir)
    assert run(box, "print(6 * 7)") == "42\n"
    # A replacement is started for the next create.
    assert wait_for(lambda: pool(spare_server).ready(), START_WAIT)
    assert pool(spare_server).ready()[0] is not spare


def test_a_claimed_spare_gets_its_env_and_token_and_nobody_elses(
    spare_server: LocalServer, make_box: Any, http: requests.Session
) -> None:
    ready_spare(spare_server)
    first = make_box(spare_server, env={"WHO": "first"})
    ready_spare(spare_server)
    second = make_box(spare_server, env={"WHO": "second", "ONLY_SECOND": "1"})
    assert pool(spare_server).claimed == 2
    show = "import os; print(os.environ.get('WHO'), os.environ.get('ONLY_SECOND'))"
    assert run(first, show) == "first None\n"
    assert run(second, show) == "second 1\n"
    mine, theirs = first.headers["X-EXECD-ACCESS-TOKEN"], second.headers["X-EXECD-ACCESS-TOKEN"]
    assert mine != theirs
    # Through the server's proxy, and straight to the execd inside the container.
    stolen = http.get(second.base + "/ping", headers={"X-EXECD-ACCESS-TOKEN": mine})
    assert stolen.status_code == 401
    for token, status in ((mine, b"401"), (theirs, b"200")):
        sock = container_of(spare_server, second).connect(44772)
        with sock:
            request = f"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nX-EXECD-ACCESS-TOKEN: {token}"
            sock.sendall(request.encode() + b"\r\nConnection: close\r\n\r\n")
            assert sock.recv(64).split()[1] == status


def test_spares_are_not_listed(spare_server: LocalServer, make_box: Any) -> None:
    ready_spare(spare_server)
    listed = requests.get(f"{spare_server.api_base}/sandboxes", timeout=30).json()
    assert listed["items"] == [] and listed["pagination"]["totalItems"] == 0
    box = make_box(spare_server)
    assert wait_for(lambda: pool(spare_server).ready(), START_WAIT)  # the replacement
    listed = requests.get(f"{spare_server.api_base}/sandboxes", timeout=30).json()
    assert [item["id"] for item in listed["items"]] == [box.id]


def test_server_stop_leaves_no_spare_process(make_box: Any) -> None:
    require_isolation()
    with local_server(isolation=True, spare_containers=2) as server:
        make_box(server)
        assert wait_for(lambda: len(pool(server).ready()) == 2, START_WAIT)
        assert server.root_dir is not None
        pids = processes_under(server.root_dir, spares=True)
        inits = [spare.init_pid for spare in pool(server).ready()]
        assert len(pids) >= 3 and None not in inits
    assert not [pid for pid in pids + inits if pid is not None and alive(pid)]


def test_a_spare_that_died_is_replaced(spare_server: LocalServer, make_box: Any) -> None:
    spare = ready_spare(spare_server)
    assert spare.init_pid is not None
    os.kill(spare.init_pid, signal.SIGKILL)
    replaced = wait_for(
        lambda: [s for s in pool(spare_server).ready() if s is not spare], START_WAIT
    )
    assert replaced and not spare.home.exists() and not spare.run_dir.exists()
    box = make_box(spare_server)
    assert container_of(spare_server, box) is not spare
    assert run(box, "print(1)") == "1\n"


def test_a_create_that_needs_a_start_setting_cold_starts(
    spare_server: LocalServer, make_box: Any, monkeypatch: Any
) -> None:
    # Volumes (extra binds) are fixed when bwrap starts: stand in with a field every create has.
    monkeypatch.setattr(spares, "FIXED_AT_START", ("image",))
    spare = ready_spare(spare_server)
    asked_at = time.monotonic()
    box = make_box(spare_server)
    container = container_of(spare_server, box)
    assert container is not spare and container.launched_at > asked_at
    assert pool(spare_server).claimed == 0 and pool(spare_server).ready() == [spare]
    assert run(box, "print(1)") == "1\n"


def test_no_spares_with_zero(make_box: Any) -> None:
    require_isolation()
    with local_server(isolation=True, spare_containers=0) as server:
        asked_at = time.monotonic()
        box = make_box(server)
        assert container_of(server, box).launched_at > asked_at
        assert pool(server).ready() == [] and pool(server).claimed == 0


def test_spares_fit_only_creates_without_start_settings() -> None:
    assert spares.fits(CREATE_BODY)
    assert not spares.fits({**CREATE_BODY, "volumes": [{"name": "data"}]})


def test_a_spare_too_slow_for_its_claim_is_closed_once_it_starts(monkeypatch: Any) -> None:
    class Slow:
        closed = False

        def alive(self) -> bool:
            return True

        def close(self) -> None:
            self.closed = True

    go = threading.Event()
    made: list[Slow] = []

    def launch(sandbox_id: str) -> Any:
        go.wait(30)
        made.append(Slow())
        return made[-1]

    monkeypatch.setattr(spares, "CLAIM_WAIT", 0.05)
    slow = SparePool(1, launch)
    slow.fill()
    assert slow.claim(CREATE_BODY) is None  # a cold start follows
    go.set()
    # both launches wait on `go`: either may finish first
    assert wait_for(lambda: len(made) == 2 and sum(s.closed for s in made) == 1, 10)
    slow.close()
    assert all(s.closed for s in made)
