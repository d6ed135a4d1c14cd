"""A real Redis for the shared-pool tests: Debian's ``redis-server`` on a loopback port.

Started like the real execd: a port from ``bind(0)``, a directory of its own, nothing saved
(``--save '' --appendonly no``: a restart is a Redis that lost its state). Without
``redis-server`` (or redis-py) the tests skip, saying why, unless ``OSB_REQUIRE_REDIS=1`` (CI):
then they fail.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REQUIRE_ENV = "OSB_REQUIRE_REDIS"


def skip_or_fail(reason: str) -> None:
    """Skip, unless the environment demands Redis (CI): then fail."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until_up(url: str, timeout: float, process: subprocess.Popen[bytes], log: Path) -> None:
    """Poll ``GET url`` until it answers 2xx; raise (with the service's log) if the process
    exits first or ``timeout`` seconds pass. For the loopback services the tests start."""
    import requests  # here: redis-py users of this module need no requests at import

    deadline = time.monotonic() + timeout
    while True:
        try:
            if requests.get(url, timeout=5).ok:
                return
        except (requests.ConnectionError, requests.Timeout):
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(f"{url} did not come up (exit {process.poll()}):\n{log.read_text()}")
        time.sleep(0.1)


class RedisServer:
    """One redis-server process; ``restart()`` brings it back empty on the same port."""

    def __init__(self, directory: Path, password: str | None = None):
        self.directory, self.password = directory, password
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", str(self.directory),
        ]  # fmt: skip
        if self.password:
            command += ["--requirepass", self.password]
        log = (self.directory / "redis.log").open("ab")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64)[:1] in (b"+", b"-"):  # PONG, or NOAUTH: it answers
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start: see {self.directory / 'redis.log'}")

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None:
            self.process.send_signal(sig)
            self.process.wait(10)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self) -> Any:
        """A redis-py client for the test's own looks at the keys."""
        import redis

        return redis.Redis.from_url(self.url, decode_responses=True)


def started_redis(directory: Path, password: str | None = None) -> Iterator[RedisServer]:
    """A running RedisServer, stopped afterwards; skips (or fails) without Redis."""
    if shutil.which("redis-server") is None:
        skip_or_fail("redis-server is not installed (Debian: apt-get install redis-server)")
    try:
        import redis  # noqa: F401
    except ImportError:
        skip_or_fail("redis-py is not installed (pip install 'osb-sync[redis]')")
    server = RedisServer(directory, password)
    server.start()
    try:
        yield server
    finally:
        server.stop()


own_redis = contextmanager(started_redis)  # a Redis of a test's own (to stop or restart)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A Redis for the module's tests (each test uses its own pool name)."""
    yield from started_redis(tmp_path_factory.mktemp("redis"))
