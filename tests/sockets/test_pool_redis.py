"""SandboxPool over a real Redis (RedisStore) and the local server: one pool, many processes.

Two SandboxPool objects with the same name and store in one process are two members of the
pool (each its own owner), which is how most of these tests share it; the crash tests use
subprocesses (``redis_pool_worker.py``).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from osb_sync import (
    Client,
    ConfigurationError,
    OpenSandboxError,
    RedisStore,
    SandboxPool,
    TransportError,
    _pool_redis,
)
from osb_sync.local import LocalServer
from tests.redisserver import RedisServer, own_redis, redis_server

__all__ = ["redis_server"]  # the fixture, imported for pytest

POOL_KEY = "osb_sync.pool"
OWNER_KEY = "osb_sync.pool-owner"
WORKER = Path(__file__).with_name("redis_pool_worker.py")
ROOT = Path(__file__).resolve().parents[2]
LEASES = {"leader_lease": 1.5, "borrow_lease": 3.0}  # short, so that takeovers are quick


@pytest.fixture(scope="module")
def local() -> Iterator[LocalServer]:
    with LocalServer(ping_interval=0.5, command_grace=0, unenforced_network_policy="accept") as srv:
        yield srv


@pytest.fixture
def client(local: LocalServer) -> Iterator[Client]:
    with Client(local.api_base) as c:
        yield c


@pytest.fixture
def name() -> str:
    return f"t-{secrets.token_hex(4)}"


def store(server: RedisServer, **kwargs: Any) -> RedisStore:
    return RedisStore(server.url, **{**LEASES, **kwargs})


def tagged(client: Client, name: str) -> set[str]:
    return {info.id for info in client.list_sandboxes(metadata={POOL_KEY: name})}


def key(name: str, part: str) -> str:
    return f"osb_sync:pool:{{{name}}}:{part}"


def wait_for(predicate: Any, timeout: float = 60.0) -> bool:
    # Generous: under four copies of the suite on 2 cores, two creates once took over 15 s.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_bad_store_arguments() -> None:
    for kwargs in (
        {},
        {"url": "http://x"},
        {"url": "redis://x", "leader_lease": 0},
        {"url": "redis://x", "on_redis_down": "hang"},
    ):
        with pytest.raises(ConfigurationError):
            RedisStore(**kwargs)


def test_repr_and_redis_hold_no_secret(
    client: Client, redis_server: RedisServer, name: str
) -> None:
    assert "hunter2" not in repr(RedisStore("redis://:hunter2@127.0.0.1:1/0"))
    env = {"TOKEN": "s3cret-value"}
    with SandboxPool(client, size=1, name=name, store=store(redis_server), env_vars=env) as pool:
        with pool.sandbox(timeout=30):
            r = redis_server.client()
            dump = " ".join(f"{k} {r.dump(k)!r}" for k in r.scan_iter(match=f"*{name}*"))
            assert "s3cret" not in dump and "127.0.0.1" not in dump
            assert "idle" in dump or "lent" in dump


def test_two_processes_share_one_warm_pool(
    client: Client, redis_server: RedisServer, name: str
) -> None:
    shared = store(redis_server, leader_lease=6.0)  # one leader throughout: no takeover here
    with SandboxPool(client, size=2, max_size=3, name=name, store=shared) as one:
        two = SandboxPool(client, size=2, max_size=3, name=name, store=shared)
        r = redis_server.client()
        assert wait_for(lambda: r.zcard(key(name, "idle")) == 2)
        time.sleep(1.0)  # two members, one leader: still two warm, not four
        assert len(tagged(client, name)) == 2
        started = time.monotonic()
        a, b = one.acquire(timeout=30), two.acquire(timeout=30)
        assert time.monotonic() - started < 2.0  # warm ones
        assert a.id != b.id
        assert a.run_code("print(1)").stdout == "1\n"
        infos = {i.id: i for i in client.list_sandboxes(metadata={POOL_KEY: name})}
        assert infos[a.id].metadata[OWNER_KEY]  # the creator, for a reconcile
        with pytest.raises(ConfigurationError, match="not lent"):
            one.release(b)  # each process gives back its own
        one.release(a)
        two.release(b)
        assert wait_for(lambda: len(tagged(client, name) - {a.id, b.id}) == 2)
        assert wait_for(lambda: not {a.id, b.id} & tagged(client, name))
        two.close()
        assert len(tagged(client, name)) == 2  # the idle ones stay for the other process
    assert wait_for(lambda: tagged(client, name) == set())  # the last one out deleted them


def test_slow_pings_do_not_cost_the_leader_its_lease(
    client: Client, redis_server: RedisServer, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's upkeep pings each idle sandbox; three pings of 0.8 s take longer than the
    1.5 s lease. The lease is renewed between them, so the other member never takes over (it
    did: a flake hunt's copy saw three sandboxes of a size-2 pool after such a takeover)."""
    real_ping = _pool_redis.answers_ping
    pings: list[float] = []

    def slow_ping(sandbox: Any, read_timeout: float) -> bool:
        pings.append(time.monotonic())
        time.sleep(0.8)
        return real_ping(sandbox, read_timeout)

    shared = store(redis_server)
    with SandboxPool(client, size=3, max_size=3, name=name, store=shared):
        r = redis_server.client()
        assert wait_for(lambda: r.zcard(key(name, "idle")) == 3)
        monkeypatch.setattr(_pool_redis, "answers_ping", slow_ping)
        leader, epoch = r.get(key(name, "leader")), r.get(key(name, "epoch"))
        with SandboxPool(client, size=3, max_size=3, name=name, store=shared):
            assert wait_for(lambda: len(pings) >= 6, timeout=60)  # two upkeeps at least
            assert (r.get(key(name, "leader")), r.get(key(name, "epoch"))) == (leader, epoch)
            assert len(tagged(client, name)) == 3


def test_other_options_under_the_same_name_are_refused(
    client: Client, redis_server: RedisServer, name: str
) -> None:
    with SandboxPool(client, size=0, name=name, store=store(redis_server)):
        with pytest.raises(ConfigurationError, match="other options"):
            SandboxPool(client, size=0, name=name, store=store(redis_server), env_vars={"A": "1"})
        with pytest.raises(ConfigurationError, match="other options"):
            SandboxPool(client, size=1, name=name, store=store(redis_server))


def test_reset_reuse_lends_the_same_sandbox_cleaned(
    client: Client, redis_server: RedisServer, name: str
) -> None:
    shared = store(redis_server)
    with SandboxPool(client, size=1, max_size=1, reuse="reset", name=name, store=shared) as one:
        two = SandboxPool(client, size=1, max_size=1, reuse="reset", name=name, store=shared)
        with one.sandbox(timeout=30) as first:
            first.files.write("left.txt", "x")
        with two.sandbox(timeout=30) as second:  # another process gets it, cleaned
            assert second.id == first.id
            assert not second.files.exists("left.txt")
        two.close()


def test_destroy_ends_the_pool_everywhere(
    client: Client, redis_server: RedisServer, name: str
) -> None:
    shared = store(redis_server)
    one = SandboxPool(client, size=2, name=name, store=shared)
    two = SandboxPool(client, size=2, name=name, store=shared)
    assert wait_for(lambda: len(tagged(client, name)) == 2)
    one.destroy()
    assert tagged(client, name) == set()
    time.sleep(1.0)
    assert tagged(client, name) == set()  # nobody refilled
    with pytest.raises(OpenSandboxError, match="destroyed"):
        two.acquire(timeout=5)
    two.close()


def test_redis_down_acquire_creates_outside_the_pool_once_logged(
    client: Client, tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with own_redis(tmp_path) as server:
        with SandboxPool(client, size=0, max_size=1, name=name, store=store(server)) as pool:
            server.stop()
            caplog.set_level(logging.WARNING, "osb_sync")
            started = time.monotonic()
            a, b = pool.acquire(timeout=10), pool.acquire(timeout=10)  # past max_size: outside
            assert time.monotonic() - started < 10
            assert sum("does not answer" in r.getMessage() for r in caplog.records) == 1
            assert {a.id, b.id} <= tagged(client, name)
            pool.release(a)
            assert wait_for(lambda: a.id not in tagged(client, name))
        assert b.id not in tagged(client, name)  # close() deleted what it held


def test_redis_down_acquire_raises_if_so_configured(
    client: Client, tmp_path: Path, name: str
) -> None:
    with own_redis(tmp_path) as server:
        shared = store(server, on_redis_down="raise")
        with SandboxPool(client, size=0, name=name, store=shared) as pool:
            server.stop()
            started = time.monotonic()
            with pytest.raises(TransportError, match="on_redis_down='create'"):
                pool.acquire(timeout=5)
            assert time.monotonic() - started < 5


def test_auth(client: Client, tmp_path: Path, name: str) -> None:
    with own_redis(tmp_path, password="pw-" + secrets.token_hex(4)) as server:
        with SandboxPool(client, size=0, name=name, store=store(server)) as pool:
            with pool.sandbox(timeout=30) as sb:
                assert sb.id in tagged(client, name)
        wrong = RedisStore(server.url.replace(server.password or "", "wrong"), **LEASES)
        with SandboxPool(client, size=0, name=name, store=wrong) as pool:  # AUTH refused
            pool.acquire(timeout=10)  # falls back to a plain create


def test_a_fenced_old_leader_cannot_pool_its_create(
    client: Client, redis_server: RedisServer, name: str
) -> None:
    shared = store(redis_server)
    r = redis_server.client()
    with SandboxPool(client, size=0, name=name, store=shared) as one:
        old = one._lender
        # Redis names the leader inside the script; the epoch reaches the
        # attribute a moment later, so wait for both.
        assert wait_for(lambda: r.get(key(name, "leader")) == old._owner and old._epoch)
        epoch = old._epoch
        r.delete(key(name, "leader"))  # as if its lease ran out while it was paused
        with SandboxPool(client, size=0, name=name, store=shared) as two:
            assert wait_for(lambda: r.get(key(name, "leader")) == two._lender._owner)
            args = ("tok", "stale-id", "idle", old._owner, "", "", epoch)
            assert old._run("commit", *args) == "fenced"
            assert old._run("reserve", old._owner, epoch, 1, 1, "tok", 5, 0) == 0
            assert r.zcard(key(name, "idle")) == 0


def spawn(local: LocalServer, server: RedisServer, name: str, mode: str, **options: Any) -> Any:
    options.setdefault("store", LEASES)
    return subprocess.Popen(
        [sys.executable, str(WORKER), local.api_base, server.url, name, mode, json.dumps(options)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def first_line(proc: Any) -> dict[str, Any]:
    line = proc.stdout.readline()
    assert line, "the worker died before answering"
    answer: dict[str, Any] = json.loads(line)
    return answer


def test_kill_9_of_the_leader_another_takes_over_within_its_lease(
    local: LocalServer, client: Client, redis_server: RedisServer, name: str
) -> None:
    r = redis_server.client()
    procs = [spawn(local, redis_server, name, "idle", pool={"size": 1}) for _ in range(2)]
    try:
        owners = {first_line(p)["owner"]: p for p in procs}
        assert wait_for(lambda: r.get(key(name, "leader")) in owners)
        leader = r.get(key(name, "leader"))
        owners[leader].send_signal(signal.SIGKILL)
        owners[leader].wait(10)
        killed = time.monotonic()
        (survivor,) = set(owners) - {leader}
        assert wait_for(lambda: r.get(key(name, "leader")) == survivor, timeout=10)
        took = time.monotonic() - killed
        assert took < LEASES["leader_lease"] + 1.5, took  # its lease plus a tick, with slack
        assert wait_for(lambda: r.zcard(key(name, "idle")) == 1)  # it keeps the pool warm
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    time.sleep(LEASES["borrow_lease"])  # the killed processes' heartbeats run out, so ...
    with SandboxPool(client, size=1, name=name, store=store(redis_server)):
        pass  # ... this one is the last one out: it deletes what they left (committed or not)
    assert wait_for(lambda: tagged(client, name) == set(), timeout=LEASES["borrow_lease"] + 10)


def test_kill_9_of_a_borrower_its_sandbox_is_deleted_after_the_lease(
    local: LocalServer, client: Client, redis_server: RedisServer, name: str
) -> None:
    with SandboxPool(client, size=0, name=name, store=store(redis_server)):
        proc = spawn(local, redis_server, name, "hold", pool={"size": 0})
        try:
            held = first_line(proc)["id"]
            assert held in tagged(client, name)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            killed = time.monotonic()
            bound = LEASES["borrow_lease"] + LEASES["leader_lease"] + 5
            assert wait_for(lambda: held not in tagged(client, name), timeout=bound)
            assert time.monotonic() - killed > LEASES["borrow_lease"] / 3  # not at once
        finally:
            proc.kill()
            proc.wait(10)


def test_restart_of_redis_leaks_nothing_and_the_pool_recovers(
    client: Client, tmp_path: Path, name: str
) -> None:
    with own_redis(tmp_path) as server:
        with SandboxPool(client, size=2, max_size=3, name=name, store=store(server)) as pool:
            r = server.client()
            held = pool.acquire(timeout=30)
            assert wait_for(lambda: r.zcard(key(name, "idle")) == 2)
            server.restart()  # empty: Redis lost every key
            r = server.client()

            def consistent() -> bool:
                known = set(r.zrange(key(name, "idle"), 0, -1))
                lent = set(r.zrange(key(name, "lent"), 0, -1))
                return held.id in lent and tagged(client, name) == known | lent

            assert wait_for(consistent, timeout=LEASES["borrow_lease"] * 2 + 15)
            assert len(tagged(client, name)) <= 3
            with pool.sandbox(timeout=30) as sb:
                assert sb.run_code("print(2)").stdout == "2\n"
            pool.release(held)
        assert wait_for(lambda: tagged(client, name) == set())


def overlaps(borrows: list[dict[str, Any]]) -> list[str]:
    """Sandboxes lent to two borrowers at once."""
    by_id: dict[str, list[tuple[float, float]]] = {}
    for b in borrows:
        by_id.setdefault(b["id"], []).append((b["start"], b["end"]))
    bad = []
    for sandbox_id, spans in by_id.items():
        spans.sort()
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)):
            bad.append(sandbox_id)
    return bad


SOAK_SECONDS = float(os.environ.get("OSB_POOL_SOAK_SECONDS", "20"))  # the 60: benchmark


@pytest.mark.slow
@pytest.mark.parametrize("reuse", ["never", "reset"])
def test_four_processes_of_eight_threads_share_one_pool(
    local: LocalServer, client: Client, redis_server: RedisServer, name: str, reuse: str
) -> None:
    size, max_size = 4, 8
    r = redis_server.client()
    options = {"pool": {"size": size, "max_size": max_size, "reuse": reuse},
               "seconds": SOAK_SECONDS, "threads": 8}  # fmt: skip
    samples: list[tuple[int, int]] = []
    procs = [spawn(local, redis_server, name, "borrow", **options) for _ in range(4)]
    try:
        while any(p.poll() is None for p in procs):
            snapshot = r.pipeline(transaction=True)  # MULTI: one consistent look
            for part in ("idle", "lent", "creating"):
                snapshot.zcard(key(name, part))
            idle, lent, creating = snapshot.execute()
            samples.append((idle, idle + lent + creating))
            time.sleep(0.1)
        outputs = [p.communicate(timeout=60)[0].splitlines() for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    borrows = [json.loads(line) for out in outputs for line in out[:-1]]
    totals = [json.loads(out[-1]) for out in outputs]
    assert [t["errors"] for t in totals] == [[]] * 4
    assert len(borrows) >= 8  # it did lend
    assert overlaps(borrows) == []
    assert max(idle for idle, _ in samples) <= max_size
    assert max(counted for _, counted in samples) <= max_size
    creates = sum(t["creates"] for t in totals)
    if reuse == "never":
        assert len({b["id"] for b in borrows}) == len(borrows)  # each lent once
        assert creates <= len(borrows) + size + 4
    else:
        replaced = sum(t["deletes"] for t in totals)
        assert creates <= max_size + replaced, (creates, replaced)
    assert wait_for(lambda: tagged(client, name) == set())  # the last one out deleted the rest


def test_a_sandbox_taken_again_mid_give_back_can_be_released(
    client: Client, redis_server: RedisServer, name: str
) -> None:
    # The race the 4x8 soak met: a give-back has put the sandbox back in Redis's idle set
    # and not yet ended when another thread of this process takes it and returns it again.
    pool = SandboxPool(client, size=0, max_size=1, reuse="reset", name=name,
                       store=store(redis_server))  # fmt: skip
    lender: Any = pool._lender
    real_run, seen = lender._run, []

    def run(script: str, *args: object) -> Any:
        answer = real_run(script, *args)
        if script == "give_back" and not seen:
            again = pool.acquire(timeout=30)  # what another thread does in that window
            try:
                pool.release(again)
                seen.append(None)
            except Exception as exc:
                seen.append(exc)
        return answer

    lender._run = run
    try:
        first = pool.acquire(timeout=30)
        pool.release(first)
        assert wait_for(lambda: seen, timeout=60)
        assert seen == [None]
        assert wait_for(lambda: not lender._lent and not lender._returning, timeout=30)
        with pool.sandbox(timeout=30) as third:
            assert third.id == first.id
    finally:
        pool.close()
    assert wait_for(lambda: not tagged(client, name))


def test_a_sandbox_outside_the_pool_written_into_redis_is_never_lent(
    client: Client, redis_server: RedisServer, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "osb_sync")
    with client.create_sandbox() as victim:  # someone else's, not the pool's
        victim.files.write("secret.txt", "not for the borrower")
        with SandboxPool(client, size=0, max_size=1, name=name, store=store(redis_server)) as pool:
            r = redis_server.client()
            r.zadd(key(name, "idle"), {victim.id: "+inf"})  # a Redis writer
            with pool.sandbox(timeout=30) as lent:
                assert lent.id != victim.id
            r.zadd(key(name, "lent"), {victim.id: 0})  # a borrow long run out: the leader's
            assert wait_for(lambda: r.zscore(key(name, "lent"), victim.id) is None)
        assert victim.files.read_text("secret.txt") == "not for the borrower"  # not deleted
    assert any(victim.id in r.getMessage() and name in r.getMessage() for r in caplog.records)


def test_a_sandbox_redis_names_is_not_deleted_when_the_server_cannot_say_whose_it_is(
    client: Client,
    redis_server: RedisServer,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server's answer about an id Redis names fails once (a timeout, a 503): that proves
    nothing about whose sandbox it is. The id leaves Redis, logged; the sandbox stays, in the
    leader's upkeep of the idle ones and when a borrower takes it."""
    caplog.set_level(logging.INFO, "osb_sync")
    real_get, failing = client.get_sandbox, set()

    def get_sandbox(sandbox_id: str, *args: Any, **kwargs: Any) -> Any:
        if sandbox_id in failing:
            failing.discard(sandbox_id)
            raise TransportError(f"GET /sandboxes/{sandbox_id} timed out (simulated)")
        return real_get(sandbox_id, *args, **kwargs)

    def list_sandboxes(*args: Any, **kwargs: Any) -> Any:
        # The leader's reconcile would forget the untagged id (dropped, not deleted: right too)
        # before the upkeep or the borrower asks about it; its list fails, so only they can.
        raise TransportError("GET /sandboxes timed out (simulated)")

    monkeypatch.setattr(client, "get_sandbox", get_sandbox)
    with client.create_sandbox() as victim:  # someone else's, not the pool's
        monkeypatch.setattr(client, "list_sandboxes", list_sandboxes)
        with SandboxPool(client, size=0, max_size=1, name=name, store=store(redis_server)) as pool:
            r = redis_server.client()
            failing.add(victim.id)
            r.zadd(key(name, "idle"), {victim.id: "+inf"})  # a Redis writer
            assert wait_for(lambda: victim.id not in failing)  # the leader's upkeep asked
            assert wait_for(lambda: r.zscore(key(name, "idle"), victim.id) is None)
            assert client.get_sandbox(victim.id).state == "Running"  # not deleted
            failing.add(victim.id)
            r.zadd(key(name, "idle"), {victim.id: "+inf"})
            with pool.sandbox(timeout=30) as lent:  # (or the upkeep, if it asks first)
                assert lent.id != victim.id and victim.id not in failing
            assert client.get_sandbox(victim.id).state == "Running"
    logged = [r.getMessage() for r in caplog.records if victim.id in r.getMessage()]
    assert logged and not any("deleting" in line for line in logged), logged


def test_two_pools_of_one_name_keep_to_their_own(
    client: Client, redis_server: RedisServer, name: str
) -> None:
    """Two deployments, each its own Redis (here its own prefix), name their pools alike on one
    server: each pool has an id of its own in its Redis, tags its sandboxes with it, and lends,
    keeps or deletes only those; neither's leader deletes the other's, which its Redis never
    knew, and a writer of one's Redis cannot lend it the other's."""
    short = {"leader_lease": 0.6, "borrow_lease": 1.2}  # the reconcile's wait, shortened
    one = SandboxPool(client, size=1, max_size=2, name=name, store=store(redis_server, **short))
    other_store = store(redis_server, prefix="other:", **short)
    other = SandboxPool(client, size=1, name=name, store=other_store)
    try:
        r = redis_server.client()
        idle = {p: f"{p}{{{name}}}:idle" for p in ("osb_sync:pool:", "other:")}
        assert wait_for(lambda: all(r.zcard(k) == 1 for k in idle.values()))
        first = {p: r.zrange(k, 0, -1)[0] for p, k in idle.items()}
        time.sleep(3 * short["borrow_lease"])  # several reconciles of each leader
        assert set(first.values()) <= tagged(client, name)
        ids = {p: r.get(f"{p}{{{name}}}:id") for p in idle}
        assert None not in ids.values() and ids["osb_sync:pool:"] != ids["other:"]
        infos = {i.id: i for i in client.list_sandboxes(metadata={POOL_KEY: name})}
        for prefix, sandbox_id in first.items():
            assert infos[sandbox_id].metadata["osb_sync.pool-id"] == ids[prefix]
        r.zadd(idle["osb_sync:pool:"], {first["other:"]: "+inf"})  # a writer of one's Redis
        lent = [one.acquire(timeout=30) for _ in range(2)]
        assert first["other:"] not in {sandbox.id for sandbox in lent}
        for sandbox in lent:
            one.release(sandbox)
        assert first["other:"] in tagged(client, name)
    finally:
        one.close()
        other.close()
    assert wait_for(lambda: tagged(client, name) == set())
