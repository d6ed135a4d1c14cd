"""Liveness (issue 24, item 4): a dead container reads Failed with its reason, at once."""

from __future__ import annotations

import os
import signal
import time

import requests

from osb_sync.local import LocalServer
from osb_sync.local.host import cgroup, execd_template
from tests.local.support import CREATE_BODY, Box, sandbox_of, wait_for


def execd_pid(server: LocalServer, box: Box) -> int:
    """The host pid of the sandbox's execd (its container's main.py, or forked from the
    template: its command line)."""
    sandbox = sandbox_of(server, box.id)
    assert sandbox is not None
    for pid in sandbox.container.members():
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            line = cmdline.read()
            if b"main.py" in line or execd_template.BOOTSTRAP.encode() in line:
                return pid
    raise AssertionError("no execd process")


def test_a_killed_execd_makes_the_sandbox_failed_and_calls_fail_at_once(
    isolated_server: LocalServer, http: requests.Session, make_box: object
) -> None:
    box: Box = make_box(isolated_server)  # type: ignore[operator]
    assert box.call("POST", "/files/upload", files=_upload("a.txt", b"hi")).status_code == 200
    os.kill(execd_pid(isolated_server, box), signal.SIGKILL)
    url = f"{isolated_server.api_base}/sandboxes/{box.id}"
    assert wait_for(lambda: http.get(url).json()["status"]["state"] == "Failed", 5)
    status = http.get(url).json()["status"]
    assert status["reason"] == "CONTAINER_EXITED_ERROR"
    assert "killed by SIGKILL" in status["message"]
    for method, path, params in (
        ("GET", "/ping", None),
        ("GET", "/files/download", {"path": "a.txt"}),
    ):
        started = time.monotonic()
        answer = box.call(method, path, params=params, timeout=30)
        assert time.monotonic() - started < 2.0
        assert answer.status_code == 502
        assert "Failed" in answer.text and "killed by SIGKILL" in answer.text
    listed = http.get(f"{isolated_server.api_base}/sandboxes", params={"state": "Failed"}).json()
    assert [item["id"] for item in listed["items"]] == [box.id]
    assert http.delete(url).status_code == 204


def _upload(path: str, data: bytes) -> dict[str, tuple[str, bytes, str]]:
    return {
        "metadata": ("metadata", b'{"path": "%s"}' % path.encode(), "application/json"),
        "file": ("file", data, "application/octet-stream"),
    }


def test_a_python_worker_that_died_between_runs_is_reported_to_the_next_run(
    local: LocalServer, box: Box
) -> None:
    context = box.call("POST", "/code/context", json={"language": "python"}).json()["id"]
    ctx = {"id": context, "language": "python"}
    die_soon = "import os, threading\nx = 1\nthreading.Timer(0.3, os._exit, (3,)).start()"
    first = box.stream("/code", {"code": die_soon, "context": ctx})
    assert not [e for e in first if e["type"] == "error"]
    time.sleep(1.0)
    second = box.stream("/code", {"code": "print(x)", "context": ctx})
    (error,) = [e["error"] for e in second if e["type"] == "error"]
    assert error["ename"] == "DeadKernelError"
    assert "exited with code 3" in error["evalue"] and "restarted" in error["evalue"]
    assert second[-1]["type"] == "execution_complete"
    third = box.stream("/code", {"code": "print(2 + 2)", "context": ctx})
    # the text, however the worker's writes were split into events ("4" and "\n" once)
    assert "".join(e["text"] for e in third if e["type"] == "stdout") == "4\n"


def test_an_oom_killed_command_says_so(isolated_server: LocalServer, make_box: object) -> None:
    if not cgroup.usable("memory"):
        import pytest

        pytest.skip("no writable memory cgroup here")
    box: Box = make_box(isolated_server, resourceLimits={"memory": "64Mi"})  # type: ignore[operator]
    events = box.command("python3 -c \"x = b'x' * (300 << 20)\"")
    (error,) = [e["error"] for e in events if e["type"] == "error"]
    assert "out of memory" in error["traceback"][0], error
    # The sandbox itself lives on.
    alive = box.command("echo alive")
    assert "".join(e["text"] for e in alive if e["type"] == "stdout") == "alive\n"


def test_a_flooded_container_log_keeps_its_last_16_mib(
    isolated_server: LocalServer, http: requests.Session
) -> None:
    flood = "yes 0123456789abcdef | head -c 41943040 >&2; echo flood-done >&2; sleep 600"
    box = Box(isolated_server, http, {**CREATE_BODY, "entrypoint": ["/bin/sh", "-c", flood]})
    sandbox = sandbox_of(isolated_server, box.id)
    assert sandbox is not None
    assert wait_for(lambda: "flood-done" in sandbox.container.log_tail(4096), 60)
    kept = sandbox.container.log_tail(1 << 30)
    assert len(kept.encode()) <= 16 * 2**20 + 200, len(kept)
    assert kept.endswith("flood-done\n")
    assert kept.startswith("osb-sync: ") and "bytes of this log dropped" in kept.splitlines()[0]
