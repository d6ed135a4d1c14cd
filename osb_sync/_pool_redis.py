"""RedisStore: one pool of warm sandboxes shared by every process and host, through Redis.

Keys, under ``prefix + "{" + name + "}:"`` (one hash tag: a Redis Cluster keeps them in one slot):

- ``options``: the pool's sizes, reuse and a SHA-256 of its create options (JSON);
- ``idle``: sorted set, sandbox id -> its expiry (Redis time, seconds; ``inf`` for none);
- ``lent``: sorted set, sandbox id -> the end of its borrow lease; ``owners``: id -> borrower;
- ``creating``: sorted set, create token -> the end of its reservation;
- ``leader``: the leader's owner id, its TTL the leader lease; ``epoch``: a counter bumped for
  each new leader (the fencing token);
- ``members``: sorted set, owner -> the end of its heartbeat;
- ``closed``: set by ``destroy()`` for two borrow leases;
- ``id``: the pool's random id, made by its first process and kept for good (a process that
  holds it writes it again if Redis lost it): two pools of one name in two Redis instances, or
  under two prefixes, are two pools.

Rules:

- Every change is one Lua script, so it is atomic across processes and hosts, and its times
  are Redis's own (``TIME``): the hosts' clocks need not agree.
- Nothing secret goes to Redis: ids, random owner ids, times, sizes, a hash of the create
  options. Endpoints and tokens are resolved through the lifecycle API (``client.connect``).
- A sandbox counts towards ``max_size`` from its reservation (``creating``) to its deletion: a
  returned one stays lent until it is deleted or back in ``idle``.
- Every process takes idle sandboxes, creates when the pool may grow, and renews its borrow
  leases and its heartbeat every third of ``borrow_lease`` (registering them again if Redis
  lost them). Owner ids are per process (a fork gets a new one).
- One leader at a time (``_pool_leader``: a part each process's lender holds; a lease renewed
  every third of ``leader_lease``, between the slow steps of its round too) refills to ``size``;
  its creates are committed only if its epoch is still the leader's, so a paused and resumed
  old leader's sandbox is deleted, not pooled. It deletes the sandboxes whose borrow lease
  ran out (crashed borrowers), renews idle sandboxes before they expire and pings them
  (replacing dead ones), and reconciles with ``list_sandboxes``: a sandbox tagged with the
  pool that Redis has not known for a whole borrow lease is deleted (Redis lost its state, or
  its creator died before committing it); an id Redis knows and the server does not is
  forgotten. Every pooled sandbox carries ``osb_sync.pool=<name>``, ``osb_sync.pool-id=<id>``
  and ``osb_sync.pool-owner=<creator>`` in its metadata; the pool's are those with its name
  and its id.
- Redis keeps the pool's books, not the server's sandboxes: a sandbox Redis names is lent
  only if the server says its metadata names the pool (``osb_sync.pool`` and
  ``osb_sync.pool-id``) and it is Running (one more request per lend, ``GET
  /sandboxes/{id}``), and kept idle, renewed or deleted only if it is the pool's; any other
  is dropped from Redis and logged, never touched, and so is one the server could not say
  about (a failed GET; if it was the pool's, the reconcile deletes it a borrow lease later).
  A Redis writer can still hand one borrower's sandbox to another (an id moved from ``lent``
  to ``idle``: both then use it and read each other's files), have the pool's own sandboxes
  deleted or left unlent, stop the pool, or set its ``id`` to another pool's (not a secret:
  any client of the server reads it in the metadata) for the processes that start afterwards:
  whoever can write to that Redis is trusted as a borrower is.
- Redis down: ``acquire`` creates a sandbox outside the pool (logged once) or raises
  ``TransportError`` (``on_redis_down="raise"``); such a sandbox stays this process's, is
  registered as lent when Redis is back, and is deleted when returned.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlsplit, urlunsplit

from ._errors import ConfigurationError, OpenSandboxError, PoolClosedError, TransportError
from ._pool_contract import (
    CLOSE_WAIT,
    MAX_CREATE_BACKOFF,
    POOL_KEY,
    Lender,
    Order,
    PoolSpec,
    answers_ping,
    call_timeout,
    hopeless,
    reset_for_next_user,
    timeout_error,
)
from ._pool_leader import RedisLeader
from ._pool_scripts import KEY_NAMES, PREAMBLE, SCRIPTS, number, text
from ._transport import backoff_seconds
from ._validators import positive_seconds

if TYPE_CHECKING:
    from ._models import SandboxInfo
    from ._options import CreateOptions
    from ._sandbox import Sandbox

logger = logging.getLogger("osb_sync")

OWNER_KEY = "osb_sync.pool-owner"
ID_KEY = "osb_sync.pool-id"
ON_REDIS_DOWN = ("create", "raise")
URL_SCHEMES = ("redis", "rediss", "unix")
POLL_FIRST, POLL_MAX = 0.02, 0.2  # acquire's waits for a sandbox another process returns


def redacted_url(url: str | None) -> str | None:
    """The URL without its password (for reprs, logs and messages)."""
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


@dataclass(frozen=True, eq=False)
class RedisStore:
    """A pool's bookkeeping in Redis, shared by every process and host using the pool's name.

    Needs redis-py (``pip install redis``; from a checkout ``pip install '.[redis]'``).
    Give ``url`` (``redis://``, ``rediss://`` for TLS, ``unix://``; a password in the URL is
    sent as AUTH and never shown) or ``client``, a ``redis.Redis`` of your own (its timeouts
    are then yours: without them a hung Redis can hang ``acquire``).

    Args:
        url: the Redis URL.
        client: a ``redis.Redis`` instead of ``url``.
        prefix: the start of every key.
        leader_lease: seconds a leader holds its lease (renewed every third); another process
            takes over within it when the leader dies.
        borrow_lease: seconds a borrow is held without renewal (renewed every third by the
            borrower's process); a crashed borrower's sandbox is deleted after it.
        on_redis_down: ``"create"`` (acquire creates a sandbox outside the pool, logged once)
            or ``"raise"`` (acquire raises ``TransportError``).
        redis_timeout: connect and read timeout of each Redis call, with ``url``; acquire may
            run this much past its own timeout when Redis stops answering.

    Raises:
        ConfigurationError: a bad argument, naming it.
    """

    url: str | None = None
    client: Any = field(default=None, repr=False)
    prefix: str = "osb_sync:pool:"
    leader_lease: float = 15.0
    borrow_lease: float = 60.0
    on_redis_down: str = "create"
    redis_timeout: float = 1.0

    def __post_init__(self) -> None:
        if (self.url is None) == (self.client is None):
            raise ConfigurationError("RedisStore needs url or client (one of them)")
        if self.url is not None and (
            not isinstance(self.url, str) or urlsplit(self.url).scheme not in URL_SCHEMES
        ):
            raise ConfigurationError(f"url must be a Redis URL ({', '.join(URL_SCHEMES)})")
        if not isinstance(self.prefix, str):
            raise ConfigurationError("prefix must be a str")
        for name in ("leader_lease", "borrow_lease", "redis_timeout"):
            positive_seconds(name, getattr(self, name))
        if self.on_redis_down not in ON_REDIS_DOWN:
            raise ConfigurationError(f"on_redis_down must be one of {ON_REDIS_DOWN}")

    def __repr__(self) -> str:
        where = f"url={redacted_url(self.url)!r}" if self.url else "client=..."
        return f"RedisStore({where}, prefix={self.prefix!r})"

    def connection(self) -> Any:
        """The ``redis.Redis`` to use: ``client``, or one made from ``url``.

        Raises:
            ConfigurationError: redis-py is not installed.
        """
        if self.client is not None:
            return self.client
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:
            raise ConfigurationError(
                "RedisStore needs redis-py: pip install redis (from a checkout of osb-sync: "
                "pip install '.[redis]')"
            ) from exc
        assert self.url is not None  # __post_init__: url or client
        return redis.Redis.from_url(
            self.url,
            socket_timeout=self.redis_timeout,
            socket_connect_timeout=self.redis_timeout,
            retry=Retry(NoBackoff(), 0),  # acquire's timeout decides how long to try
        )

    def open(self, spec: PoolSpec) -> Lender:
        """Start serving ``spec``'s pool from Redis.

        Raises:
            ConfigurationError: redis-py is missing, or the pool's name is in use with other
                options (or is being destroyed).
        """
        return RedisLender(self, spec)

    def keys(self, name: str) -> list[str]:
        """The pool's keys, in the order the scripts take them."""
        return [f"{self.prefix}{{{name}}}:{key}" for key in KEY_NAMES]


def fingerprint(spec: PoolSpec) -> str:
    """What processes sharing a pool must agree on, as JSON (create options hashed)."""
    options = json.dumps(spec.create_kwargs, sort_keys=True, default=repr)
    digest = hashlib.sha256(options.encode()).hexdigest()
    return json.dumps(
        {"size": spec.size, "max_size": spec.max_size, "reuse": spec.reuse, "create": digest},
        sort_keys=True,
    )


class RedisBooks:
    """The pool's books in Redis and what is trusted of them: the scripts, run on the pool's
    keys, and the server's word on each sandbox Redis names (the module's rules). The lender and
    its leader share one.

    Attributes:
        id: the pool's id, from Redis (the ``options`` script); kept by a forked child.
        error: redis-py's ``RedisError``, which every script call may raise.
    """

    def __init__(self, store: RedisStore, spec: PoolSpec):
        self.store, self.spec = store, spec
        self._client = spec.client
        connection = store.connection()
        import redis.exceptions

        self.error: type[Exception] = redis.exceptions.RedisError
        self._scripts = {name: connection.register_script(PREAMBLE + body)
                         for name, body in SCRIPTS.items()}  # fmt: skip
        self._keys = store.keys(spec.name)
        self.id = ""
        self.down = False  # Redis did not answer the last call (logged once)

    def run(self, script: str, *args: object) -> Any:
        """Run one of SCRIPTS on the pool's keys. Raises redis-py's RedisError."""
        return text(self._scripts[script](keys=self._keys, args=[str(a) for a in args]))

    def quietly(self, script: str, *args: object) -> Any:
        """A script whose failure the next renewal or reconcile mends; logged, not raised."""
        try:
            return self.run(script, *args)
        except self.error as exc:
            self.lost(exc)
            return None

    def lost(self, exc: BaseException) -> None:
        """Redis did not answer: logged once, until it answers again (:meth:`back`)."""
        if not self.down:
            self.down = True
            logger.warning(
                "pool %s: Redis (%r) does not answer (%s); %s",
                self.spec.name,
                self.store,
                exc,
                "acquire creates sandboxes outside the pool"
                if self.store.on_redis_down == "create"
                else "acquire raises",
            )

    def back(self) -> None:
        """Redis answered: logged once after it did not."""
        if self.down:
            self.down = False
            logger.warning("pool %s: Redis answers again", self.spec.name)

    def checked(self, sandbox_id: str, doing: str) -> SandboxInfo | None:
        """The server's record of a sandbox Redis named, if it is this pool's (`_ours`), before
        it is `doing`; else None, logged. A failed GET proves nothing about whose it is: None
        too, and it is never deleted on that (the leader's reconcile deletes a sandbox of the
        pool that Redis dropped, once Redis has not known it for a borrow lease)."""
        try:
            info = self._client.get_sandbox(sandbox_id)
        except OpenSandboxError as exc:
            logger.info("pool %s: sandbox %s not %s: the server did not say whose it is (%s)",
                        self.spec.name, sandbox_id, doing, exc)  # fmt: skip
            return None
        return info if self._ours(sandbox_id, info.metadata, doing) else None

    def _ours(self, sandbox_id: str, metadata: dict[str, str], doing: str) -> bool:
        """Whether a sandbox Redis named is this pool's (its metadata names the pool), before
        it is `doing` ("lent", "deleted"); one that is not is logged and left alone.

        Redis holds ids only: whoever can write to it could name any sandbox of the server,
        another user's, for the next borrower to read or for the leader to delete.
        """
        if self.id and metadata.get(ID_KEY) == self.id and metadata.get(POOL_KEY) == self.spec.name:
            return True
        logger.warning(
            "pool %s: Redis named sandbox %s, which is not the pool's (%s=%r, %s=%r; the pool's"
            " id is %r): not %s (whoever can write to this Redis named it)",
            self.spec.name,
            sandbox_id,
            POOL_KEY,
            metadata.get(POOL_KEY),
            ID_KEY,
            metadata.get(ID_KEY),
            self.id,
            doing,
        )
        return False

    def tagged(self) -> list[SandboxInfo]:
        """The server's sandboxes tagged with the pool: its name and its id."""
        if not self.id:
            return []
        return list(
            self._client.list_sandboxes(metadata={POOL_KEY: self.spec.name, ID_KEY: self.id})
        )

    def delete_pooled(self, sandbox_id: str) -> None:
        """Delete a sandbox Redis named, if it is this pool's (:meth:`checked`); quietly."""
        if self.checked(sandbox_id, "deleted") is not None:
            self._client.delete_quietly(sandbox_id)


class RedisLender:
    """A process's part in a Redis-shared pool: lends and takes back. It holds the pool's books
    and a leader (``_pool_leader``), which keeps the pool while this process holds the lease."""

    def __init__(self, store: RedisStore, spec: PoolSpec):
        self.store, self.spec = store, spec
        self._client = spec.client
        self._books = RedisBooks(store, spec)
        self._redis_error = self._books.error
        self._fingerprint = fingerprint(spec)
        self._renew_every = store.borrow_lease / 3
        self._tick = min(1.0, store.leader_lease / 5)
        self._reset_state()
        try:
            self._check_options()
            self._books.run("renew", self._owner, store.borrow_lease, 0)  # a member before any
        except self._redis_error as exc:  # create
            self._books.lost(exc)  # checked again by the worker once Redis answers
        self._start_worker()

    def __repr__(self) -> str:
        return repr(self.spec)

    def _reset_state(self) -> None:
        self._owner = f"p{os.getpid()}-{secrets.token_hex(4)}"
        self._cond = threading.Condition()
        self._registry = threading.Lock()  # a renewal's snapshot vs. a give-back
        self._lent: dict[str, Sandbox] = {}
        self._returning: dict[str, Sandbox] = {}  # the handle whose give-back runs, by id
        self._outside: set[str] = set()  # created while Redis was down
        self._pending: set[str] = set()  # created for a caller, its commit to come
        self._tokens: set[str] = set()  # the reservations of this process's running creates
        self._expires: dict[str, float] = {}  # monotonic
        self._commands_stopped: dict[str, int] = {}
        self._threads: set[threading.Thread] = set()
        self._worker: threading.Thread | None = None
        self._closed = False
        self._stop = threading.Event()
        self._refused: OpenSandboxError | None = None  # raised again by every acquire
        self._failures = 0
        self._books.down = False
        self._next_renew = 0.0
        self._leader = RedisLeader(
            self._books,
            self.spec,
            self._owner,
            (self.store.leader_lease, self.store.borrow_lease),
            self._start_refill,
            self._lent_ids,
            self._stop,
        )

    def after_fork(self) -> None:
        """In a forked child: a new owner, no sandboxes, the worker started on first use."""
        self._reset_state()

    def _check_options(self) -> None:
        """Redis's record of the pool's options against this pool's (the first one sets it).

        Raises:
            ConfigurationError: they differ, or the pool is being destroyed.
        """
        answer, pool_id = self._books.run(
            "options", self._fingerprint, self._books.id or secrets.token_hex(8)
        )
        self._books.id = (
            self._books.id or pool_id
        )  # its own for good: Redis's may change, not the pool's
        if answer == "closed":
            self._refused = ConfigurationError(
                f"pool {self.spec.name!r} was destroyed (for {self.store.borrow_lease * 2:g} s "
                f"after destroy() its name is refused); give this pool another name"
            )
        elif answer != "ok":
            self._refused = ConfigurationError(
                f"pool {self.spec.name!r} is in use in Redis with other options "
                f"(theirs: {answer}; yours: {self._fingerprint}): give this pool another name, "
                f"or destroy() the other"
            )
        if self._refused is not None:
            raise self._refused

    # -- lending --------------------------------------------------------------------------

    def acquire(self, timeout: float | None = None) -> Sandbox:
        """See SandboxPool.acquire; with Redis, waits by polling for a sandbox to come back."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last_error: BaseException | None = None
        poll = POLL_FIRST
        with self._cond:
            if self._worker is None:
                self._start_worker()  # first use in a forked child
        while True:
            self._check_usable()
            token = secrets.token_hex(8)
            try:
                answer = self._books.run(
                    "take",
                    self._owner,
                    self.store.borrow_lease,
                    self.spec.max_size,
                    token,
                    self.store.borrow_lease,
                )
            except self._redis_error as exc:
                return self._acquire_outside(exc, deadline, timeout)
            self._books.back()
            if answer[0] == "closed":
                self._refused = PoolClosedError(f"{self!r} was destroyed")
                continue
            if answer[0] == "lent":
                sandbox = self._reach(answer[1], number(answer[2]) - number(answer[3]), deadline)
                if sandbox is not None:
                    return sandbox
                continue
            running = False
            if answer[0] == "create":
                try:
                    created = self._create_for_caller(token, deadline)
                except Exception as exc:
                    if deadline is None or hopeless(exc):
                        raise
                    last_error = exc
                    self._failures += 1
                    pause = backoff_seconds(self._failures, cap=MAX_CREATE_BACKOFF)
                    time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
                    continue
                if created is not None:
                    return created
                running = True
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise timeout_error(
                    self.spec,
                    timeout,
                    running=running,
                    last_error=last_error,
                    api_base=self._client.api_base,
                ) from last_error
            time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - now)))
            poll = min(poll * 1.5, POLL_MAX)

    def _check_usable(self) -> None:
        if self._closed:
            raise PoolClosedError(f"{self!r} is closed")
        if self._refused is not None:
            raise type(self._refused)(str(self._refused))

    def _reach(
        self, sandbox_id: str, seconds_left: float, deadline: float | None
    ) -> Sandbox | None:
        """The taken sandbox, checked (the pool's, Running, answering /ping) and renewed if
        close to expiry; None if it is not fit to lend: the pool's is deleted, any other, and
        one the server could not say whose it is, only dropped from Redis (the books'
        ``checked``)."""
        timeout = call_timeout(self._client.read_timeout, deadline)
        lifetime = self.spec.lifetime
        info = self._books.checked(sandbox_id, "lent")
        if info is None:
            self._books.quietly("give_back", sandbox_id, "drop", "")
            return None
        try:
            fit = info.state == "Running"
            if fit:
                sandbox = self._client.connect(
                    sandbox_id, health_check=False, ready_timeout=timeout
                )
                sandbox.delete_on_exit = False
                fit = answers_ping(sandbox, timeout)
            if fit and lifetime is not None and seconds_left < lifetime / 2:
                sandbox.renew(lifetime, timeout=timeout)
                seconds_left = lifetime
        except OpenSandboxError as exc:
            logger.info("pooled sandbox %s cannot be reached (%s); replacing it", sandbox_id, exc)
            fit = False
        if not fit:
            self._client.delete_quietly(sandbox_id)
            self._books.quietly("give_back", sandbox_id, "drop", "")
            return None
        with self._cond:
            self._lent[sandbox_id] = sandbox
            if lifetime is not None:
                self._expires[sandbox_id] = time.monotonic() + seconds_left
        return sandbox

    def _acquire_outside(
        self, exc: BaseException, deadline: float | None, timeout: float | None
    ) -> Sandbox:
        """Redis is down: a sandbox outside the pool, or TransportError, as configured."""
        self._books.lost(exc)
        if self.store.on_redis_down == "raise":
            raise TransportError(
                f"{self!r}: Redis ({self.store!r}) does not answer ({exc}). To fix: check "
                f"Redis, or pass RedisStore(on_redis_down='create') to create without it"
            ) from exc
        sandbox = self._create_for_caller(None, deadline)
        if sandbox is None:
            raise timeout_error(
                self.spec, timeout, running=True, last_error=exc, api_base=self._client.api_base
            ) from exc
        with self._cond:
            self._outside.add(sandbox.id)
        return sandbox

    def _create_for_caller(self, token: str | None, deadline: float | None) -> Sandbox | None:
        """A sandbox created for this caller and lent to it, or None at the deadline; the
        create runs in a thread of its own, and one still running at the deadline goes on (its
        sandbox joins the idle ones, or is deleted without a reservation ``token``).

        Raises:
            The create's error.
        """
        order = Order(for_caller=True)
        self._spawn(self._fulfil, order, token, "")
        with self._cond:
            while not order.done:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    order.abandoned = True
                    return None
                self._cond.wait(left)
        if order.error is not None:
            raise order.error
        assert order.sandbox is not None
        self._failures = 0
        if token is not None:
            self._books.quietly(
                "commit", token, order.sandbox.id, "lent", self._owner, self.store.borrow_lease,
                "", "",
            )  # fmt: skip
            with self._cond:
                self._pending.discard(order.sandbox.id)  # the next renewal registers it if lost
        return order.sandbox

    def _fulfil(self, order: Order, token: str | None, epoch: str) -> None:
        """A create's thread: the sandbox goes to its waiting caller, else to the idle ones
        (committed with the leader's ``epoch`` for a refill), else it is deleted."""
        if token is not None:
            with self._cond:
                self._tokens.add(token)
        try:
            self._create_and_hand_over(order, token, epoch)
        finally:
            with self._cond:
                self._tokens.discard(token or "")

    def _create_and_hand_over(self, order: Order, token: str | None, epoch: str) -> None:
        try:
            metadata = {**(self.spec.create_kwargs.get("metadata") or {}), OWNER_KEY: self._owner}
            if (
                self._books.id
            ):  # unknown only while Redis has not answered: such a one stays outside
                metadata[ID_KEY] = self._books.id
            options: CreateOptions = {**self.spec.create_kwargs, "metadata": metadata}
            sandbox = self._client.create_sandbox(**options)
        except Exception as exc:  # noqa: BLE001 - handed to the waiting caller, or logged
            if token is not None:
                self._books.quietly("unreserve", token)
            with self._cond:
                order.error, order.done = exc, True
                abandoned = order.abandoned
                self._cond.notify_all()
            if abandoned:
                logger.warning("pool %s could not create a sandbox (%s)", self.spec.name, exc)
            return
        sandbox.delete_on_exit = False
        with self._cond:
            order.done = True
            closed, abandoned = self._closed, order.abandoned
            if not closed and not abandoned:
                order.sandbox = sandbox
                self._lent[sandbox.id] = sandbox  # before any commit: never untracked
                if token is not None:
                    self._pending.add(sandbox.id)  # its reservation counts it until then
                if self.spec.lifetime is not None:
                    self._expires[sandbox.id] = time.monotonic() + self.spec.lifetime
            self._cond.notify_all()
        if closed or (abandoned and token is None):
            self._client.delete_quietly(sandbox.id)
        elif abandoned:
            lifetime = "" if self.spec.lifetime is None else self.spec.lifetime
            try:
                answer = self._books.run(
                    "commit", token, sandbox.id, "idle", self._owner, "", lifetime, epoch
                )
            except self._redis_error as exc:
                self._books.lost(exc)
                answer = "unreachable"
            if answer != "idle":
                logger.info("pool %s: sandbox %s not pooled (%s); deleting it",
                            self.spec.name, sandbox.id, answer)  # fmt: skip
                self._client.delete_quietly(sandbox.id)

    def _start_refill(self, token: str, epoch: str, done: Callable[[], None]) -> None:
        """The leader's create, reserved under ``token``: committed idle with ``epoch``, then
        ``done()``."""

        def refill() -> None:
            try:
                self._fulfil(Order(for_caller=False), token, epoch)
            finally:
                done()

        self._spawn(refill)

    def _lent_ids(self) -> set[str]:
        with self._cond:
            return set(self._lent)

    def release(self, sandbox: Sandbox) -> None:
        """See SandboxPool.release."""
        with self._cond:
            if self._closed:
                return  # close() deleted it
            # By handle, not id: once a give-back has put the sandbox in Redis's idle set,
            # another thread of this process may take it again (a new handle under the same
            # id) and return it before that give-back has ended.
            lent = self._lent.get(sandbox.id)
            if lent is not sandbox or self._returning.get(sandbox.id) is sandbox:
                raise ConfigurationError(f"sandbox {sandbox.id} was not lent by {self!r}")
            self._returning[sandbox.id] = sandbox
        self._spawn(self._give_back, sandbox)

    def _give_back(self, sandbox: Sandbox) -> None:
        """A returned sandbox's thread: reset and back to idle, or deleted; lent until then."""
        keep = self.spec.reuse == "reset" and sandbox.id not in self._outside
        if keep:
            stopped = reset_for_next_user(sandbox, self._commands_stopped.get(sandbox.id, 0))
            keep = stopped is not None
            if stopped is not None:
                self._commands_stopped[sandbox.id] = stopped
        if not keep:
            self._client.delete_quietly(sandbox.id)
        expires = self._expires.get(sandbox.id)
        left = "" if expires is None else max(1.0, expires - time.monotonic())
        with self._registry:
            try:
                answer = self._books.run("give_back", sandbox.id, "idle" if keep else "drop", left)
            except self._redis_error as exc:
                self._books.lost(exc)
                answer = "unreachable"
            with self._cond:
                # Once idle in Redis, another thread of this process may already have taken it
                # again (a new handle under the same id): only this borrow's entry goes.
                if self._lent.get(sandbox.id) is sandbox:
                    del self._lent[sandbox.id]
                if self._returning.get(sandbox.id) is sandbox:
                    del self._returning[sandbox.id]
                self._outside.discard(sandbox.id)
                self._cond.notify_all()
        if keep and answer != "idle":
            self._client.delete_quietly(sandbox.id)  # closed, or Redis cannot take it back

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._cond:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=f"osb-pool-{self.spec.name}", daemon=True)
        with self._cond:
            self._threads.add(thread)
        thread.start()

    # -- ending ---------------------------------------------------------------------------

    def close(self) -> None:
        """See SandboxPool.close: this process's sandboxes deleted, its place given up."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            self._cond.notify_all()
            threads = [self._worker, *self._threads]
        deadline = time.monotonic() + CLOSE_WAIT
        for thread in threads:
            if thread is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            mine, self._lent = list(self._lent), {}
        for sandbox_id in mine:
            self._client.delete_quietly(sandbox_id)
        if mine:
            self._books.quietly("forget", *mine)
        answer = self._books.quietly("leave", self._owner) or ["stay"]
        if answer[0] == "last":
            self._turn_off_the_light(answer[1:])

    def _turn_off_the_light(self, known: list[str]) -> None:
        """The last process out deletes what Redis knew, and every sandbox tagged with the
        pool whose creator is not a member (one that died before committing it); a process
        that joined meanwhile is a member, and its sandboxes are spared."""
        for sandbox_id in known:
            self._books.delete_pooled(sandbox_id)
        try:
            members = set(self._books.run("members"))
            tagged = self._books.tagged()
        except (OpenSandboxError, self._redis_error) as exc:
            logger.info("pool %s: not searched for leftovers (%s)", self.spec.name, exc)
            return
        for info in tagged:
            if info.metadata.get(OWNER_KEY) not in members and info.id not in known:
                self._client.delete_quietly(info.id)

    def destroy(self) -> None:
        """See SandboxPool.destroy: closed everywhere, idle sandboxes deleted."""
        ids = self._books.run("destroy", int(self.store.borrow_lease * 2000))
        for sandbox_id in ids:
            self._books.delete_pooled(sandbox_id)

    # -- the worker -----------------------------------------------------------------------

    def _start_worker(self) -> None:
        self._worker = threading.Thread(
            target=_maintain,
            args=(weakref.ref(self),),
            name=f"osb-pool-{self.spec.name}",
            daemon=True,
        )
        self._worker.start()

    def _wait_tick(self) -> bool:
        """Sleep one tick; False when the pool is closed."""
        return not self._stop.wait(self._tick)

    def _work_once(self) -> None:
        """One round: renewals for everyone, then the leader's round if this process leads."""
        now = time.monotonic()
        try:
            if now >= self._next_renew:
                with self._registry:
                    with self._cond:
                        busy = self._returning.keys() | self._pending
                        lent = [i for i in self._lent if i not in busy]
                        tokens = list(self._tokens)
                    lease = self.store.borrow_lease
                    self._books.run("renew", self._owner, lease, len(lent), *lent, *tokens)
                if self._refused is None:
                    try:
                        self._check_options()
                    except ConfigurationError as exc:
                        logger.error("%s", exc)
                self._next_renew = now + self._renew_every
            self._leader.round(now)
            if self._leader.destroyed:
                self._refused = PoolClosedError(f"{self!r} was destroyed")
            self._books.back()
        except self._redis_error as exc:
            self._books.lost(exc)
            self._leader.step_down()


def _maintain(lender_ref: weakref.ref[RedisLender]) -> None:
    """The worker thread: holds the lender only weakly, so an abandoned pool can be collected."""
    while True:
        lender = lender_ref()
        if lender is None:
            return
        try:
            lender._work_once()
        except OpenSandboxError as exc:  # the server failed a call: the next round retries
            logger.info("pool %s: %s", lender.spec.name, exc)
        if not lender._wait_tick():
            return
        del lender
