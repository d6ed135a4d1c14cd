"""A Flask app under gunicorn, 4 worker processes sharing one pool of 4 through Redis.

50 concurrent requests, each running code in a pooled sandbox: the server never holds more
than the pool's 4 plus one per request in flight (a sync worker serves one at a time: 4),
once idle it keeps 4 warm (not 4 per worker), and after SIGTERM nothing of the pool is left
on the server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

pytest.importorskip("flask")
pytest.importorskip("gunicorn")

from osb_sync import Client
from osb_sync.local import LocalServer
from tests.redisserver import RedisServer, free_port, redis_server, wait_until_up

__all__ = ["redis_server"]  # the fixture, imported for pytest

WORKERS, POOL, REQUESTS = 4, 4, 50
NAME = "gunicorn-shared"
ROOT = Path(__file__).resolve().parents[2]
APP = """
import os
from flask import Flask
from osb_sync.integrations.flask import OpenSandbox

app = Flask(__name__)
app.config.update(
    OPENSANDBOX_API_BASE=os.environ["T_API_BASE"],
    OPENSANDBOX_POOL_REDIS_URL=os.environ["T_REDIS_URL"],
    OPENSANDBOX_POOL_NAME=os.environ["T_POOL_NAME"],
    OPENSANDBOX_POOL_SIZE=int(os.environ["T_POOL_SIZE"]),
    OPENSANDBOX_ACQUIRE_TIMEOUT=60,
    OPENSANDBOX_CREATE={"allow_internet_access": True},
)
sandboxes = OpenSandbox(app)


@app.post("/run")
def run():
    return {"stdout": sandboxes.sandbox.run_code("print(6 * 7)", timeout=30).stdout}


@app.get("/up")
def up():
    return "up"
"""


@pytest.fixture(scope="module")
def local() -> Iterator[LocalServer]:
    with LocalServer(command_grace=0, unenforced_network_policy="accept") as srv:
        yield srv


def alive(client: Client) -> int:
    return len(list(client.list_sandboxes(metadata={"osb_sync.pool": NAME})))


def test_four_workers_share_one_pool_of_four(
    local: LocalServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "gapp.py").write_text(APP)
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "T_API_BASE": local.api_base,
        "T_REDIS_URL": redis_server.url,
        "T_POOL_NAME": NAME,
        "T_POOL_SIZE": str(POOL),
    }
    command = [sys.executable, "-m", "gunicorn", "-w", str(WORKERS), "-b", f"127.0.0.1:{port}",
               "--graceful-timeout", "20", "gapp:app"]  # fmt: skip
    log = (tmp_path / "gunicorn.log").open("wb")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    most, stop = [0], threading.Event()
    with Client(local.api_base) as client:

        def count() -> None:
            while not stop.is_set():
                most[0] = max(most[0], alive(client))
                time.sleep(0.05)

        sampler = threading.Thread(target=count, daemon=True)
        try:
            wait_until_up(f"{base}/up", 60, server, tmp_path / "gunicorn.log")
            sampler.start()
            with ThreadPoolExecutor(REQUESTS) as executor:
                answers = list(executor.map(
                    lambda _: requests.post(f"{base}/run", timeout=120), range(REQUESTS)
                ))  # fmt: skip
            assert [a.status_code for a in answers] == [200] * REQUESTS
            assert {a.json()["stdout"] for a in answers} == {"42\n"}
            time.sleep(2.0)  # returned sandboxes deleted, the idle ones refilled
            warm = max(alive(client) for _ in range(10))
            assert warm <= POOL, f"{warm} warm sandboxes kept for a pool of {POOL}"
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
            stop.set()
            if sampler.is_alive():
                sampler.join(5)
        assert 0 < most[0] <= POOL + WORKERS, f"{most[0]} sandboxes alive at once"
        deadline = time.monotonic() + 20
        while alive(client) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive(client) == 0, "the pool's sandboxes outlived gunicorn"
