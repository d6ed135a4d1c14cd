"""The create's entrypoint runs (issue 25, item 3): after execd, inside the sandbox, its output
in the container log, and the sandbox ends with it as the real server's Docker runtime reports.

The real server, measured in issue 24: entrypoint `sh -c 'exit 7'` read `Failed` ("exited with
code 7") 0.3 s after `Running`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from osb_sync.local import LocalServer
from tests.local.support import (
    CREATE_BODY,
    Box,
    host_pids_with,
    local_server,
    require_isolation,
    sandbox_of,
    wait_for,
)


@pytest.fixture(params=["cold", "spare"])
def server(request: pytest.FixtureRequest) -> Iterator[LocalServer]:
    """An isolating server, without spares and with one (a spare starts its claim's entrypoint)."""
    require_isolation()
    spares = 1 if request.param == "spare" else 0
    with local_server(
        ping_interval=0.2, command_grace=0, min_timeout=1, isolation=True, spare_containers=spares
    ) as srv:
        yield srv


def _state(server: LocalServer, http: requests.Session, sandbox_id: str) -> dict[str, Any]:
    got = http.get(f"{server.api_base}/sandboxes/{sandbox_id}")
    assert got.status_code == 200, got.text
    status: dict[str, Any] = got.json()["status"]
    return status


def _ended(
    server: LocalServer, http: requests.Session, sandbox_id: str, state: str
) -> dict[str, Any]:
    """The sandbox's status once it reads `state` (within 5 s: its entrypoint has ended)."""
    assert wait_for(lambda: _state(server, http, sandbox_id)["state"] == state, 5)
    return _state(server, http, sandbox_id)


def _create(server: LocalServer, http: requests.Session, entrypoint: list[str]) -> str:
    created = http.post(
        f"{server.api_base}/sandboxes", json={**CREATE_BODY, "entrypoint": entrypoint}
    )
    assert created.status_code == 202, created.text
    sandbox_id: str = created.json()["id"]
    return sandbox_id


def test_the_entrypoint_runs_after_execd_and_writes_where_execd_reads(
    server: LocalServer, http: requests.Session
) -> None:
    """It finds execd listening; a file it writes is seen through the files API; what it
    prints is in the log; it runs until the sandbox is deleted."""
    marker = "entrypoint-ran-4711"
    probe = (
        "import socket\n"
        "try:\n socket.create_connection(('127.0.0.1', 44772), 2).close(); said = 'execd up'\n"
        "except OSError as exc:\n said = f'execd down: {exc}'\n"
        "open('entrypoint.part', 'w').write(said)\n"
        "import os; os.rename('entrypoint.part', 'from-entrypoint.txt')\n"  # whole or not at all
    )
    script = f'echo {marker} >&2; cd $HOME && python3 -c "$0" && exec sleep 600.5'
    box = Box(server, http, {**CREATE_BODY, "entrypoint": ["sh", "-c", script, probe]})
    got: list[bytes] = []

    def written() -> bool:
        answer = box.call("GET", "/files/download", params={"path": "from-entrypoint.txt"})
        got[:] = [answer.content] if answer.status_code == 200 else []
        return bool(got)

    assert wait_for(written, 10), "the entrypoint's file never appeared"
    assert got == [b"execd up"]
    logs = http.get(f"{server.api_base}/sandboxes/{box.id}/diagnostics/logs").text
    assert marker in logs
    assert _state(server, http, box.id)["state"] == "Running"
    assert wait_for(lambda: bool(host_pids_with("600.5")), 5)
    assert http.delete(f"{server.api_base}/sandboxes/{box.id}").status_code == 204
    assert wait_for(lambda: not host_pids_with("600.5"), 5), "the entrypoint outlived its sandbox"


def test_an_entrypoint_that_exits_7_makes_the_sandbox_failed(
    server: LocalServer, http: requests.Session
) -> None:
    sandbox_id = _create(server, http, ["sh", "-c", "echo bye >&2; exit 7"])
    status = _ended(server, http, sandbox_id, "Failed")
    assert status["reason"] == "CONTAINER_EXITED_ERROR"
    assert "exited with code 7" in status["message"]
    logs = http.get(f"{server.api_base}/sandboxes/{sandbox_id}/diagnostics/logs").text
    assert "bye" in logs
    assert http.delete(f"{server.api_base}/sandboxes/{sandbox_id}").status_code == 204


def test_an_entrypoint_whose_program_is_missing_fails_with_the_reason(
    server: LocalServer, http: requests.Session
) -> None:
    sandbox_id = _create(server, http, ["/no/such/program", "--flag"])
    message = _ended(server, http, sandbox_id, "Failed")["message"]
    assert "exited with code 127" in message and "not found" in message
    assert "/no/such/program" in message
    assert http.delete(f"{server.api_base}/sandboxes/{sandbox_id}").status_code == 204


def test_an_entrypoint_that_exits_0_makes_the_sandbox_terminated(
    server: LocalServer, http: requests.Session
) -> None:
    """The Docker runtime maps a container that exited 0 to Terminated."""
    sandbox_id = _create(server, http, ["true"])
    assert "exited with code 0" in _ended(server, http, sandbox_id, "Terminated")["message"]
    assert http.delete(f"{server.api_base}/sandboxes/{sandbox_id}").status_code == 204


def test_a_one_string_entrypoint_is_split_as_a_shell_would(
    server: LocalServer, http: requests.Session
) -> None:
    sandbox_id = _create(server, http, ["sh -c 'exit 9'"])
    assert "exited with code 9" in _ended(server, http, sandbox_id, "Failed")["message"]


@pytest.mark.parametrize(
    "entrypoint",
    [["tail", "-f", "/dev/null"], ["/opt/code-interpreter/code-interpreter.sh"]],
)
def test_the_host_views_own_entrypoints_start_no_process(
    local: LocalServer, http: requests.Session, entrypoint: list[str]
) -> None:
    """execd stands in for them: the sandbox runs, and nothing but execd was started."""
    box = Box(local, http, {**CREATE_BODY, "entrypoint": entrypoint})
    assert box.call("GET", "/ping").status_code == 200
    assert _state(local, http, box.id)["state"] == "Running"
    started = [c for c in _cmdlines(local, box) if "tail" in c or "code-interpreter" in c]
    assert started == []


def _cmdlines(server: LocalServer, box: Box) -> list[str]:
    """The command lines of the sandbox's processes but bwrap's (its container's members)."""
    sandbox = sandbox_of(server, box.id)
    assert sandbox is not None
    found = []
    for pid in sandbox.container.members():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                text = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if not text.startswith("bwrap"):
            found.append(text)
    return found
