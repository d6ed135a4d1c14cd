"""Capacity (issue 24, item 5): no select() limit, the descriptor limit raised, a 503 first."""

from __future__ import annotations

import os
import resource
import time

import pytest
import requests

from osb_sync.local.host import capacity
from osb_sync.local.host.spawn import read_until
from tests.local.serverproc import ServerProcess, descendants
from tests.local.support import CREATE_BODY, Box, local_server, require_isolation, require_slirp


def test_read_until_watches_a_descriptor_above_fd_setsize() -> None:
    # The 255th sandbox's pipes are numbered above 1024, where select() raises ValueError.
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= 2000:
        pytest.skip(f"RLIMIT_NOFILE {soft} is too low to open descriptor 2000")
    read_end, write_end = os.pipe()
    high = os.dup2(read_end, 2000)
    try:
        os.write(write_end, b"ready\n")
        assert read_until(high, b"\n", time.monotonic() + 5) == b"ready\n"
    finally:
        for fd in (read_end, write_end, high):
            os.close(fd)


def test_the_server_raises_its_soft_descriptor_limit_to_the_hard_one() -> None:
    server = ServerProcess(nofile=(256, 4096), isolation=False)
    try:
        with open(f"/proc/{server.pid}/limits") as limits:
            line = next(row for row in limits if row.startswith("Max open files"))
        assert line.split()[3:5] == ["4096", "4096"], line
    finally:
        assert server.stop() == 0


def test_a_sandbox_holds_fewer_descriptors_than_the_capacity_counts(
    http: requests.Session,
) -> None:
    """`FDS_PER_SANDBOX` counts what a live sandbox holds of the server's descriptors, with
    room to spare (2), for one with internet access, which holds the most."""
    require_isolation()
    require_slirp()
    with local_server(command_grace=0, spare_containers=0, isolation=True) as server:
        Box(server, http, CREATE_BODY)  # the first starts the execd template
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            Box(server, http, CREATE_BODY)
        per_sandbox = (len(os.listdir("/proc/self/fd")) - before) / 3
    assert per_sandbox + 2 <= capacity.FDS_PER_SANDBOX, per_sandbox


def test_a_create_past_the_descriptor_limit_is_refused_with_503_and_leaks_nothing() -> None:
    require_isolation()
    server = ServerProcess(nofile=(320, 320), spare_containers=0)
    http = requests.Session()
    created: list[str] = []
    try:
        refusal = None
        for _ in range(80):
            answer = http.post(f"{server.api_base}/sandboxes", json=CREATE_BODY, timeout=120)
            if answer.status_code != 202:
                refusal = answer
                break
            created.append(answer.json()["id"])
        assert refusal is not None, f"{len(created)} sandboxes and no refusal"
        assert refusal.status_code == 503, refusal.text
        assert refusal.json()["code"] == "SANDBOX::CAPACITY_EXCEEDED"
        assert "capacity" in refusal.json()["message"]
        assert "RLIMIT_NOFILE" in refusal.json()["message"]
        assert len(created) >= 5
        # Nothing was started for a refusal: the same processes before and after one. (At
        # the edge a create may fit again as the last answer's connection closes.)
        for _ in range(5):
            before = descendants(server.pid)
            again = http.post(f"{server.api_base}/sandboxes", json=CREATE_BODY, timeout=120)
            if again.status_code == 503:
                break
            created.append(again.json()["id"])
        assert again.status_code == 503, again.text
        time.sleep(0.5)
        assert descendants(server.pid) == before
        # The sandboxes already there still work, and a delete makes room again.
        assert http.get(f"{server.api_base}/sandboxes/{created[0]}").status_code == 200
        assert http.delete(f"{server.api_base}/sandboxes/{created.pop()}").status_code == 204
        assert http.delete(f"{server.api_base}/sandboxes/{created.pop()}").status_code == 204
        answer = http.post(f"{server.api_base}/sandboxes", json=CREATE_BODY, timeout=120)
        assert answer.status_code == 202, answer.text
        created.append(answer.json()["id"])
    finally:
        http.close()
        assert server.stop() == 0
