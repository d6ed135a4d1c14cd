"""The leader of a Redis-shared pool: the part of a process's lender that keeps the pool for all.

``RedisLender`` (``_pool_redis``) holds one ``RedisLeader``; its worker thread calls
:meth:`RedisLeader.round` once a tick. At most one process of the pool leads at a time: the
one holding the ``leader`` key's lease, renewed every third of ``leader_lease`` (between the
slow steps of a round too: each ping and list), whose epoch (the fencing token) a refill's
commit must still match. While it leads, a round:

1. deletes the sandboxes whose borrow lease ran out (a crashed borrower's);
2. reserves and starts creates up to ``size`` idle, ``REFILL_PARALLEL`` at once (the lender
   runs them: a create is the same code for a caller and for the refill);
3. every ``UPKEEP_INTERVAL`` seconds pings each idle sandbox (a dead one leaves the pool) and
   renews those close to expiry;
4. every third of ``borrow_lease`` reconciles with the server's list of the pool's sandboxes:
   an id Redis knows and the server does not is forgotten; a sandbox of the pool that Redis
   has not known for a whole borrow lease is deleted.

Every id it acts on was named by Redis, and is checked with the server first (``Books``: the
rules of ``_pool_redis``'s docstring). A Redis error ends the round; the lender steps it down
(:meth:`step_down`) until Redis answers.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ._errors import OpenSandboxError
from ._pool_contract import PoolSpec, answers_ping
from ._pool_scripts import number

if TYPE_CHECKING:
    from ._models import SandboxInfo

logger = logging.getLogger("osb_sync")

REFILL_PARALLEL = 2  # the leader's creates at once: enough to keep up, not a stampede
UPKEEP_INTERVAL = 10.0  # seconds between two health checks of the idle sandboxes


class Books(Protocol):
    """What the leader needs of the pool's books in Redis (``_pool_redis.RedisBooks``)."""

    def run(self, script: str, *args: object) -> Any:
        """Run one of the pool's scripts (raises redis-py's ``RedisError``)."""

    def checked(self, sandbox_id: str, doing: str) -> SandboxInfo | None:
        """The server's record of a sandbox Redis named, if it is the pool's; else None."""

    def delete_pooled(self, sandbox_id: str) -> None:
        """Delete a sandbox Redis named, if it is the pool's."""

    def tagged(self) -> list[SandboxInfo]:
        """The server's sandboxes tagged with the pool."""


class RedisLeader:
    """One process's claim to lead its pool, and the rounds it makes while it leads.

    Args:
        books: the pool's books in Redis.
        spec: the pool.
        owner: this process's owner id (the lease's holder).
        leases: ``(leader_lease, borrow_lease)`` in seconds.
        refill: ``refill(token, epoch, done)`` starts a create reserved under ``token``, to be
            committed idle with ``epoch``, and calls ``done()`` when it has ended.
        lent: the ids this process has lent (never unknown to the pool, even before a commit).
        stop: set when the pool closes: no more creates are started.
    """

    def __init__(
        self,
        books: Books,
        spec: PoolSpec,
        owner: str,
        leases: tuple[float, float],
        refill: Callable[[str, str, Callable[[], None]], None],
        lent: Callable[[], set[str]],
        stop: threading.Event,
    ):
        self._books, self._spec, self._owner = books, spec, owner
        self._client = spec.client
        self._leader_lease, self._borrow_lease = leases
        self._refill, self._lent, self._stop = refill, lent, stop
        self._lock = threading.Lock()
        self._refilling = 0
        self._unknown_since: dict[str, float] = {}
        self._next_lead = self._next_upkeep = self._next_reconcile = 0.0
        self.epoch = ""  # the epoch of this process's lease while it leads
        self.destroyed = False  # Redis said the pool was destroyed

    def round(self, now: float) -> None:
        """Take or keep the lease when due, and lead a round if this process holds it.

        Raises:
            redis-py's ``RedisError`` (the lender steps the leader down); an
            ``OpenSandboxError`` of a server call (the next round tries again).
        """
        if now >= self._next_lead or not self.epoch:
            self._renew_lead(now)
        if self.epoch:
            self._lead(now)

    def step_down(self) -> None:
        """Redis did not answer: lead no more until a lease is taken again."""
        self.epoch = ""

    def _renew_lead(self, now: float) -> None:
        """Take or keep the leader's lease; ``epoch`` is the epoch if this process leads."""
        answer = self._books.run("lead", self._owner, int(self._leader_lease * 1000))
        if answer == "closed":
            self.destroyed = True
        if answer != self.epoch and answer not in ("", "closed"):
            logger.info("pool %s: %s leads (epoch %s)", self._spec.name, self._owner, answer)
        self.epoch = "" if answer == "closed" else answer
        self._next_lead = now + self._leader_lease / 3

    def _still_leading(self) -> bool:
        """Renew the lease if it is due, between the slow steps of a round (a ping or a list
        can take seconds on a loaded server: the lease must not lapse behind them, or another
        process takes over and refills beside this one's creates); False once it is lost."""
        now = time.monotonic()
        if now >= self._next_lead:
            self._renew_lead(now)
        return bool(self.epoch)

    def _lead(self, now: float) -> None:
        """The leader's round: expired borrows, refill, idle upkeep, reconcile."""
        for sandbox_id in self._books.run("expired", self._owner, self.epoch):
            logger.info(
                "pool %s: the borrow of %s ran out; deleting it", self._spec.name, sandbox_id
            )
            self._books.delete_pooled(sandbox_id)
            self._still_leading()  # the script took them all: delete them all the same
        with self._lock:
            refilling = self._refilling
        while refilling < REFILL_PARALLEL and not self._stop.is_set():
            token = secrets.token_hex(8)
            args = (self._spec.size, self._spec.max_size, token, self._borrow_lease, refilling)
            if not self._books.run("reserve", self._owner, self.epoch, *args):
                break
            with self._lock:
                self._refilling += 1
                refilling = self._refilling
            self._refill(token, self.epoch, self._refilled)
        if now >= self._next_upkeep and self._still_leading():
            self._next_upkeep = now + min(UPKEEP_INTERVAL, self._leader_lease)
            self._upkeep()
        if now >= self._next_reconcile and self._still_leading():
            self._next_reconcile = now + self._borrow_lease / 3
            self._reconcile(now)

    def _refilled(self) -> None:
        """A refill's create has ended (committed, refused or failed)."""
        with self._lock:
            self._refilling -= 1

    def _upkeep(self) -> None:
        """Ping every idle sandbox (a dead one leaves the pool) and renew those close to expiry."""
        answer = self._books.run("idle")
        redis_now, pairs = number(answer[0]), answer[1:]
        lifetime = self._spec.lifetime
        for sandbox_id, score in zip(pairs[::2], pairs[1::2], strict=False):
            if not self._still_leading():
                return
            if self._books.checked(sandbox_id, "kept idle") is None:
                self._books.run("drop_idle", sandbox_id)
                continue
            try:
                sandbox = self._client.connect(sandbox_id, health_check=False)
                alive = answers_ping(sandbox, self._client.read_timeout)
                if alive and lifetime is not None and number(score) - redis_now < lifetime / 2:
                    sandbox.renew(lifetime)
                    self._books.run("renewed", sandbox_id, lifetime)
            except OpenSandboxError as exc:
                logger.info("idle sandbox %s of pool %s: %s", sandbox_id, self._spec.name, exc)
                alive = False
            if not alive and self._books.run("drop_idle", sandbox_id):
                logger.info("idle sandbox %s of pool %s is dead; replacing it",
                            sandbox_id, self._spec.name)  # fmt: skip
                self._client.delete_quietly(sandbox_id)

    def _reconcile(self, now: float) -> None:
        """The server's tagged sandboxes against Redis's (see the module's rules)."""
        before = set(self._books.run("known"))
        listed = {info.id for info in self._books.tagged()}
        if not self._still_leading():
            return
        after = set(self._books.run("known"))
        gone = sorted((before & after) - listed)
        if gone:
            self._books.run("forget", *gone)
        unknown = listed - before - after - self._lent()
        self._unknown_since = {i: self._unknown_since.get(i, now) for i in unknown}
        for sandbox_id, since in list(self._unknown_since.items()):
            if now - since >= self._borrow_lease:
                logger.info("pool %s: sandbox %s is unknown to Redis; deleting it",
                            self._spec.name, sandbox_id)  # fmt: skip
                self._client.delete_quietly(sandbox_id)
                del self._unknown_since[sandbox_id]
