"""SandboxPool against the local server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator

import pytest

from osb_sync import (
    ApiError,
    Client,
    ConfigurationError,
    PoolClosedError,
    SandboxPool,
    SandboxTimeoutError,
)
from osb_sync.local import LocalServer

POOL_KEY = "osb_sync.pool"  # the documented tag of every pooled sandbox


@pytest.fixture(scope="module")
def local() -> Iterator[LocalServer]:
    with LocalServer(ping_interval=0.5, command_grace=0, unenforced_network_policy="accept") as srv:
        yield srv


@pytest.fixture
def client(local: LocalServer) -> Iterator[Client]:
    with Client(local.api_base) as c:
        yield c


def tagged(client: Client, pool: SandboxPool) -> set[str]:
    return {info.id for info in client.list_sandboxes(metadata={POOL_KEY: pool.name})}


def wait_for(predicate: object, timeout: float = 60.0) -> bool:
    # Generous, as in test_pool_redis: under four copies of the suite and other work on
    # 2 cores, a refill of two sandboxes took over 10 s in the flake hunt.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_bad_arguments(client: Client) -> None:
    for kwargs in ({"size": -1}, {"size": 3, "max_size": 2}, {"reuse": "always"}, {"name": "a b"}):
        with pytest.raises(ConfigurationError):
            SandboxPool(client, **kwargs)  # type: ignore[arg-type]


def test_warm_pool_is_refilled_in_the_background(client: Client) -> None:
    with SandboxPool(client, size=2, max_size=3) as pool:
        assert wait_for(lambda: len(tagged(client, pool)) == 2)
        started = time.monotonic()
        with pool.sandbox() as sb:
            assert time.monotonic() - started < 1.0  # a warm one, not a create
            assert sb.run_code("print(1)").stdout == "1\n"
            assert sb.delete_on_exit is False
        assert wait_for(
            lambda: len(tagged(client, pool)) == 2 and sb.id not in tagged(client, pool)
        )
    assert tagged(client, pool) == set()


def test_never_reuse_gives_every_borrower_a_fresh_sandbox(client: Client) -> None:
    with SandboxPool(client, size=1) as pool:
        with pool.sandbox() as first:
            first.files.write("secret.txt", "mine")
            first.run_code("secret = 42")
        with pool.sandbox() as second:
            assert second.id != first.id
            assert not second.files.exists("secret.txt")


def test_reset_reuse_cleans_the_same_sandbox(client: Client) -> None:
    with SandboxPool(client, size=1, reuse="reset") as pool:
        with pool.sandbox() as first:
            first.files.write("left/over.txt", "x")
            first.run_code("leftover = 1")
            sleeper = first.commands.start("sleep 60")
        with pool.sandbox() as second:
            assert second.id == first.id
            assert not sleeper.wait(timeout=20).running  # the reset stopped it
            assert not second.files.exists("left")
            result = second.run_code("leftover")
            assert result.error is not None and result.error.name == "NameError"


def test_many_threads_never_exceed_max_size(client: Client) -> None:
    errors: list[BaseException] = []
    peak = 0
    lent = 0
    lock = threading.Lock()
    with SandboxPool(client, size=2, max_size=4) as pool:

        def work() -> None:
            nonlocal peak, lent
            try:
                with pool.sandbox(timeout=30) as sb:
                    with lock:
                        lent += 1
                        peak = max(peak, lent)
                    assert sb.run_code("1 + 1").results == [{"text": "2"}]
                    with lock:
                        lent -= 1
            except BaseException as exc:  # collected for the assertion
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(8)]  # twice max_size
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        assert 1 <= peak <= 4
        assert len(tagged(client, pool)) <= 4


def test_exhaustion_times_out(client: Client) -> None:
    with SandboxPool(client, size=0, max_size=1) as pool:
        held = pool.acquire()
        started = time.monotonic()
        with pytest.raises(SandboxTimeoutError, match=r"free within 0\.3"):
            pool.acquire(timeout=0.3)
        assert time.monotonic() - started < 2
        pool.release(held)
        assert pool.acquire(timeout=10).id != held.id


def test_a_sandbox_that_died_while_pooled_is_replaced(client: Client) -> None:
    with SandboxPool(client, size=1) as pool:
        assert wait_for(lambda: len(tagged(client, pool)) == 1)
        (dead,) = tagged(client, pool)
        client.delete_sandbox(dead)
        with pool.sandbox(timeout=30) as sb:
            assert sb.id != dead and sb.run_code("print('alive')").stdout == "alive\n"


def test_close_while_in_use_deletes_everything(client: Client) -> None:
    pool = SandboxPool(client, size=1, max_size=2)
    held = pool.acquire()
    assert wait_for(lambda: len(tagged(client, pool)) == 2)
    pool.close()
    assert tagged(client, pool) == set()
    pool.release(held)  # quiet: close() already deleted it
    with pytest.raises(PoolClosedError, match="closed"):
        pool.acquire()


def test_release_of_a_stranger_is_refused(client: Client) -> None:
    with SandboxPool(client, size=0) as pool, client.create_sandbox() as stranger:
        with pytest.raises(ConfigurationError, match="not lent"):
            pool.release(stranger)


def test_process_exit_deletes_the_pools_sandboxes(client: Client, local: LocalServer) -> None:
    code = (
        "import osb_sync, sys\n"
        f"client = osb_sync.Client({local.api_base!r})\n"
        "pool = osb_sync.SandboxPool(client, size=1, name='atexit-test')\n"
        "sb = pool.acquire(timeout=30)\n"
        "print(sb.id)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert {i.id for i in client.list_sandboxes(metadata={POOL_KEY: "atexit-test"})} == set()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_share_the_parents_sandboxes(client: Client) -> None:
    with SandboxPool(client, size=1) as pool:
        assert wait_for(lambda: len(tagged(client, pool)) == 1)
        parents = tagged(client, pool)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with pool.sandbox(timeout=30) as sb:
                    code = 0 if sb.id not in parents else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert parents <= tagged(client, pool)  # the child deleted only its own
        with pool.sandbox(timeout=30) as sb:
            assert sb.id in parents


def test_reset_pool_never_exceeds_max_size_and_release_is_immediate(client: Client) -> None:
    seen: list[int] = []
    stop = threading.Event()
    with SandboxPool(client, size=1, max_size=1, reuse="reset") as pool:

        def sample() -> None:
            while not stop.is_set():
                seen.append(len(tagged(client, pool)))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            for _ in range(4):
                sb = pool.acquire(timeout=30)
                sb.files.write("x.txt", "x")
                started = time.monotonic()
                pool.release(sb)
                assert time.monotonic() - started < 0.25  # a reset takes longer: it is not here
        finally:
            stop.set()
            sampler.join()
    assert seen and max(seen) == 1


def test_a_refused_create_is_raised_at_once_not_at_the_deadline(client: Client) -> None:
    with SandboxPool(client, size=0, timeout=1) as pool:  # below the server's minimum lifetime
        started = time.monotonic()
        with pytest.raises(ApiError) as info:
            pool.acquire(timeout=30)
        assert info.value.status_code == 422
        assert time.monotonic() - started < 10
