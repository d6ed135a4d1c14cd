"""SandboxPool: a thread-safe pool of warm sandboxes for request handlers and workers.

``SandboxPool`` is a facade over a store (composition): a :class:`PoolStore` is told the pool's
:class:`PoolSpec` once and answers with a :class:`Lender`, which lends and takes back. Two
stores implement the protocol: :class:`InProcessStore` (here: the idle queue, the lent set and
the size in this process's memory, creates in threads of their own, the refill thread) and
``RedisStore`` (``_pool_redis``: shared by every process using the pool's name). A third,
:class:`ServerPoolStore` (``SandboxPool(server_pool=...)``), keeps no idle sandboxes at all:
the server's own pool keeps them warm, and the lender only tracks what it lent. What all
use lives here too: the argument checks, health checks, resets between borrowers, the
timeout error, and the fork and exit hooks.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
import time
import weakref
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Protocol

from ._errors import (
    ApiError,
    ConfigurationError,
    NotFoundError,
    NotSupportedError,
    OpenSandboxError,
    PoolClosedError,
    SandboxTimeoutError,
)
from ._hooks import at_exit, in_forked_child
from ._options import CreateOptions, check_options, lifetime_seconds
from ._transport import backoff_seconds
from ._validators import whole

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Unpack

    from ._client import Client
    from ._sandbox import Sandbox

logger = logging.getLogger("osb_sync")

POOL_KEY = "osb_sync.pool"
MAINTENANCE_INTERVAL = 1.0
MAX_CREATE_BACKOFF = 30.0
PING_FLOOR = 1.0
CLOSE_WAIT = 10.0


REUSE_MODES = ("never", "reset")
_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def checked_pool_arguments(
    size: object, max_size: object, reuse: object, name: str | None
) -> tuple[int, str]:
    """SandboxPool's ``max_size`` (defaulted) and ``name`` (random when None), once checked.

    Raises:
        ConfigurationError: naming the first bad argument.
    """
    least = max(whole("size", size, 0), 1)
    most = whole(
        "max_size", least if max_size is None else max_size, least, what="an int >= size and >= 1"
    )
    if reuse not in REUSE_MODES:
        raise ConfigurationError(f"reuse must be one of {REUSE_MODES}")
    name = name or f"pool-{secrets.token_hex(4)}"
    if not _LABEL.match(name):
        raise ConfigurationError("name must be label-safe: letters, digits, '-', '_', '.'")
    return most, name


class Order:
    """One create running in a thread of its own, for an acquire() call or for the refill."""

    def __init__(self, *, for_caller: bool) -> None:
        self.done = False
        self.abandoned = not for_caller  # nobody waits for it: its sandbox joins the pool
        self.sandbox: Sandbox | None = None
        self.error: BaseException | None = None


def hopeless(error: BaseException) -> bool:
    """A create error that waiting and retrying would not cure (a 4xx, a bad argument)."""
    if isinstance(error, ApiError):
        return error.status_code < 500 and error.status_code != 429
    return isinstance(error, ConfigurationError) or not isinstance(error, OpenSandboxError)


def timeout_error(
    spec: PoolSpec,
    timeout: float | None,
    *,
    running: bool,
    last_error: BaseException | None,
    api_base: str,
) -> SandboxTimeoutError:
    """Why acquire() found no sandbox in time, and what to do about it."""
    reasons, advice = [], []
    if running:
        reasons.append("a create is still running (its sandbox will join the pool)")
        advice.append("pass a longer timeout or keep sandboxes warm with size")
    if last_error is not None:
        reasons.append(f"a create failed: {last_error}")
        advice.append(f"check that the server at {api_base} is reachable")
    if not reasons:
        reasons.append(f"all {spec.max_size} sandboxes (max_size) are in use")
        advice.append("raise max_size or pass a longer timeout")
    return SandboxTimeoutError(
        f"no sandbox of {spec!r} was free within {timeout} seconds: "
        f"{'; '.join(reasons)}. To fix: {', or '.join(advice)}"
    )


def answers_ping(sandbox: Sandbox, read_timeout: float) -> bool:
    """Whether execd answers ``/ping`` within ``read_timeout`` seconds; never raises."""
    try:
        return sandbox.ping(timeout=read_timeout)
    except OpenSandboxError:
        return False


def reset_for_next_user(sandbox: Sandbox, stopped: int) -> int | None:
    """Clean a sandbox for its next user through execd.

    ``stopped``: how many of ``sandbox.commands.started`` earlier resets already stopped.

    Returns:
        How many are stopped now, or None if the sandbox could not be reset.
    """
    started = sandbox.commands.started
    try:
        for context in sandbox.contexts.list():
            sandbox.contexts.delete(context)
        for command in started[stopped:]:
            try:
                command.kill()
            except OpenSandboxError:
                pass  # it had ended
        # What the sandbox says its home is goes into a command run in that same sandbox:
        # a lie there harms only the sandbox that told it.
        home = sandbox.commands.run("pwd", timeout=30).check().stdout.strip()
        if home in ("", "/"):
            return None  # never empty a root directory: replace the sandbox instead
        sandbox.commands.run(f"find '{home}' -mindepth 1 -delete", timeout=60).check()
    except OpenSandboxError as exc:
        logger.info("could not reset sandbox %s (%s); replacing it", sandbox.id, exc)
        return None
    return len(started)


class _Closable(Protocol):
    def close(self) -> None: ...

    def _reset_state(self) -> None: ...


def close_at_exit_of_this_process(pool: _Closable) -> None:
    """At exit of this process (only), close the pool: the hook is inherited across fork."""
    pool_ref, pid = weakref.ref(pool), os.getpid()

    def close() -> None:
        alive = pool_ref()
        if alive is not None and os.getpid() == pid:
            alive.close()

    at_exit(close)


def after_fork_in_child(pool: _Closable) -> None:
    """A child process forgets the parent's sandboxes (they are the parent's to delete)."""
    pool_ref = weakref.ref(pool)

    def forget() -> None:
        child_pool = pool_ref()
        if child_pool is not None:
            child_pool._reset_state()
            close_at_exit_of_this_process(child_pool)

    in_forked_child(forget)


@dataclass(frozen=True, eq=False, repr=False)
class PoolSpec:
    """What every store is told about the pool it serves, checked once by SandboxPool.

    Attributes:
        client: creates, reaches and deletes the sandboxes.
        name: the pool's tag value (label-safe).
        size, max_size, reuse: as for SandboxPool.
        create_kwargs: ``create_sandbox`` keywords, the pool's tag included in ``metadata``.
        lifetime: seconds each sandbox lives (None: no expiry).
    """

    client: Client
    name: str
    size: int
    max_size: int
    reuse: str
    create_kwargs: CreateOptions
    lifetime: float | None

    def __repr__(self) -> str:
        return f"SandboxPool(name={self.name!r}, size={self.size}, max_size={self.max_size})"


class Lender(Protocol):
    """The running half of a store: lends the pool's sandboxes and takes them back."""

    def acquire(self, timeout: float | None) -> Sandbox:
        """A ready sandbox (see :meth:`SandboxPool.acquire`)."""

    def release(self, sandbox: Sandbox) -> None:
        """Take a lent sandbox back (see :meth:`SandboxPool.release`)."""

    def close(self) -> None:
        """This process stops using the pool; what it created and holds is deleted."""

    def destroy(self) -> None:
        """The pool ends everywhere: idle sandboxes deleted, replenishing stopped."""

    def after_fork(self) -> None:
        """In a forked child: forget the parent's sandboxes and threads."""


class PoolStore(Protocol):
    """Where a pool keeps its idle and lent sandboxes: :class:`InProcessStore` (this
    process only, the default) or :class:`~osb_sync.RedisStore` (every process and host
    that uses the same pool name)."""

    def open(self, spec: PoolSpec) -> Lender:
        """Start serving the pool ``spec`` describes.

        Raises:
            ConfigurationError: the store refuses the pool (e.g. its name is taken by a pool
                with other options).
        """


class InProcessStore:
    """The pool's bookkeeping in this process's memory (the default store)."""

    def __repr__(self) -> str:
        return "InProcessStore()"

    def open(self, spec: PoolSpec) -> Lender:
        """Start an in-process lender for ``spec``."""
        return InProcessLender(spec)


class SandboxPool:
    """Lends ready sandboxes to threads and takes them back.

    ``with pool.sandbox() as sb:`` lends one and takes it back on exit, even when the block
    raised. A returned sandbox is deleted and replaced (``reuse="never"``, the default: the next
    user must not see the last one's files or variables) or, with ``reuse="reset"``, cleaned
    (code contexts deleted, background commands it started killed, working directory emptied)
    and lent again. A background thread keeps ``size`` sandboxes ready, deletes returned ones,
    and retries failed creates with backoff. Before lending, a sandbox is pinged (a dead one is
    replaced) and renewed when close to expiry. Every pooled sandbox carries the metadata tag
    ``osb_sync.pool=<name>``, so ``client.delete_all(metadata={"osb_sync.pool": name})``
    cleans up after a crash. ``close()`` (also run at exit, in the creating process only)
    deletes everything the pool created. A forked child starts with an empty pool of its own.

    The bookkeeping is the ``store``'s: this process's memory by default, or a
    :class:`~osb_sync.RedisStore`, which every process and host using the same ``name``
    shares (one warm pool for all the workers of a deployment).

    ``server_pool="name"`` uses a pool the server keeps (``client.pools``; OpenSandbox's
    Kubernetes runtime, or osb-sync serve): each acquire creates with ``extensions.poolRef``,
    which the server answers from its warm sandboxes, and release deletes the sandbox (the
    server replenishes). This pool keeps no idle sandboxes and creates none in the
    background, so ``size`` is not used; ``max_size``, if given, bounds the sandboxes this
    process holds at once (else the server pool's ``poolMax`` does). ``reuse="reset"`` is
    refused: a reset sandbox would have to wait here, idle, which is what the server's pool
    is for.

    Args:
        client: the client that creates the sandboxes.
        size: sandboxes kept ready.
        max_size: most sandboxes alive at once, lent ones included (default ``size``, at least 1).
        reuse: ``"never"`` or ``"reset"``.
        name: the pool's tag value (label-safe); random by default (give one with a shared
            store: it is what the processes share).
        store: where the bookkeeping lives (default :class:`InProcessStore`).
        server_pool: the name of a server-side pool to take sandboxes from (not with
            ``store``).
        **create_kwargs: passed to ``client.create_sandbox``.

    Raises:
        ConfigurationError: a bad argument, or the store refuses the pool; with
            ``server_pool``, a server without pools or no pool of that name.
        OpenSandboxError: with ``server_pool``, the server could not be asked for its pool.
    """

    def __init__(
        self,
        client: Client,
        *,
        size: int = 4,
        max_size: int | None = None,
        reuse: str = "never",
        name: str | None = None,
        store: PoolStore | None = None,
        server_pool: str | None = None,
        **create_kwargs: Unpack[CreateOptions],
    ):
        if server_pool is not None:
            store = server_pool_store(server_pool, store, reuse, max_size, create_kwargs)
            size = 0  # the server keeps them warm
        max_size, self.name = checked_pool_arguments(size, max_size, reuse, name)
        check_options(create_kwargs, "SandboxPool")
        self.size, self.max_size, self.reuse = size, max_size, reuse
        metadata = {**(create_kwargs.get("metadata") or {}), POOL_KEY: self.name}
        spec = PoolSpec(
            client,
            self.name,
            size,
            max_size,
            reuse,
            {**create_kwargs, "metadata": metadata},
            lifetime_seconds(create_kwargs),
        )
        self.store: PoolStore = InProcessStore() if store is None else store
        self._lender = self.store.open(spec)
        close_at_exit_of_this_process(self)
        after_fork_in_child(self)

    def __repr__(self) -> str:
        return f"SandboxPool(name={self.name!r}, size={self.size}, max_size={self.max_size})"

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def sandbox(self, timeout: float | None = None) -> Iterator[Sandbox]:
        """Lend a sandbox for a ``with`` block; it comes back even when the block raises.

        Raises:
            The errors of :meth:`acquire`.
        """
        sandbox = self.acquire(timeout)
        try:
            yield sandbox
        finally:
            self.release(sandbox)

    def acquire(self, timeout: float | None = None) -> Sandbox:
        """Take a ready sandbox, creating one if the pool may grow; give it back with release().

        ``timeout`` bounds the whole call (plus at most ``PING_FLOOR`` seconds for each of the
        ``/ping`` and the renewal of a sandbox taken at the last moment). Creates run in threads
        of their own: a create still running at the deadline goes on, and its sandbox joins the
        pool (or is deleted if the pool is closed). With a ``timeout``, a failed create is
        retried with the pool's backoff until the deadline; without one, its error is raised.

        Raises:
            SandboxTimeoutError: none ready within ``timeout`` seconds (chained from the last
                failed create, if any).
            ApiError: a create was refused with a 4xx status (waiting would not help).
            ConfigurationError: the store refused the pool (see :class:`~osb_sync.RedisStore`).
            TransportError: the store cannot be reached and is configured to raise then.
            PoolClosedError: the pool is closed (or, shared, destroyed).
            OpenSandboxError: (without ``timeout``) the error of a failed create.
        """
        return self._lender.acquire(timeout)

    def release(self, sandbox: Sandbox) -> None:
        """Give a lent sandbox back: deleted and replaced, or reset and kept, in the background.

        Raises:
            ConfigurationError: the sandbox was not lent by this pool.
        """
        self._lender.release(sandbox)

    def close(self) -> None:
        """This process is done with the pool: delete what it created and holds, stop its
        threads. With a shared store the idle sandboxes stay for the other processes (the last
        process to close deletes them); :meth:`destroy` ends the pool everywhere."""
        self._lender.close()

    def destroy(self) -> None:
        """End the pool for every process that shares it: delete its idle sandboxes, stop
        replenishing everywhere (their ``acquire`` raises), then :meth:`close`. The same as
        ``close()`` with the in-process store."""
        self._lender.destroy()
        self._lender.close()

    def _reset_state(self) -> None:
        """After fork, in the child: the lender forgets the parent's sandboxes."""
        self._lender.after_fork()


def server_pool_store(
    server_pool: str, store: PoolStore | None, reuse: str, max_size: int | None, options: object
) -> ServerPoolStore:
    """SandboxPool's store for ``server_pool=``, once the arguments that conflict are refused.

    Raises:
        ConfigurationError: naming the argument that cannot go with ``server_pool``.
    """
    if store is not None:
        raise ConfigurationError("pass server_pool or store, not both (the server keeps the pool)")
    if reuse == "reset":
        raise ConfigurationError(
            "reuse='reset' cannot go with server_pool: a reset sandbox would wait idle in this "
            "process, and the server's pool keeps sandboxes warm already; drop reuse"
        )
    if isinstance(options, dict) and options.get("pool") is not None:
        raise ConfigurationError("pass the server's pool as server_pool, not pool")
    return ServerPoolStore(
        server_pool, max_lent=None if max_size is None else whole("max_size", max_size, 1)
    )


class ServerPoolStore:
    """A pool the server keeps (``client.pools``): this process only tracks what it lent.

    Args:
        pool: the server pool's name.
        max_lent: most sandboxes lent at once by this process (None: the server's bound).
    """

    def __init__(self, pool: str, *, max_lent: int | None = None):
        self.pool, self.max_lent = pool, max_lent

    def __repr__(self) -> str:
        return f"ServerPoolStore(pool={self.pool!r})"

    def open(self, spec: PoolSpec) -> Lender:
        """Check that the server has the pool, then lend from it.

        Raises:
            ConfigurationError: the server has no pools, or none named ``pool``.
            OpenSandboxError: the server could not be asked.
        """
        client = spec.client
        try:
            client.pools.get(self.pool)
        except NotSupportedError as exc:
            raise ConfigurationError(
                f"server_pool={self.pool!r}: the server at {client.api_base} keeps no pools "
                f"({exc}). To fix: drop server_pool (this process's pool, or store=RedisStore"
                "(...) to share one), or use a server with pools"
            ) from exc
        except NotFoundError as exc:
            raise ConfigurationError(
                f"server_pool={self.pool!r}: the server at {client.api_base} has no such pool. "
                f"To fix: create it with client.pools.create({self.pool!r}, ...)"
            ) from exc
        return ServerPoolLender(spec, self.pool, self.max_lent)


class ServerPoolLender:
    """Creates from the server's pool on acquire, deletes on release; no idle queue."""

    def __init__(self, spec: PoolSpec, pool: str, max_lent: int | None):
        self.spec, self.pool, self.max_lent = spec, pool, max_lent
        self._create_kwargs: CreateOptions = {**spec.create_kwargs, "pool": pool}
        self._reset_state()

    def __repr__(self) -> str:
        return f"SandboxPool(name={self.spec.name!r}, server_pool={self.pool!r})"

    def _reset_state(self) -> None:
        self._cond = threading.Condition()
        self._lent: dict[str, Sandbox] = {}
        self._creating = 0
        self._closed = False

    def after_fork(self) -> None:
        """In a forked child: the parent's lent sandboxes are the parent's."""
        self._reset_state()

    def acquire(self, timeout: float | None) -> Sandbox:
        """A sandbox made from the server's pool (see SandboxPool.acquire).

        With a ``timeout``, an exhausted server pool (409) or a failed create is retried with
        backoff until the deadline; without one, its error is raised.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        failures = 0
        while True:
            self._wait_for_room(deadline, timeout)
            try:
                sandbox = self.spec.client.create_sandbox(**self._create_kwargs)
            except Exception as exc:
                with self._cond:
                    self._creating -= 1
                    self._cond.notify_all()
                exhausted = isinstance(exc, ApiError) and exc.status_code == 409
                if deadline is None or (hopeless(exc) and not exhausted):
                    raise
                failures += 1
                wait = backoff_seconds(failures, cap=MAX_CREATE_BACKOFF)
                if time.monotonic() + wait >= deadline:
                    raise SandboxTimeoutError(
                        f"no sandbox from the server's pool {self.pool!r} within {timeout} "
                        f"seconds: {exc}. To fix: pass a longer timeout, or raise the pool's "
                        f"capacity with client.pools.update({self.pool!r}, ...)"
                    ) from exc
                time.sleep(wait)
                continue
            sandbox.delete_on_exit = False  # the pool owns it, not the borrower's ``with``
            with self._cond:
                self._creating -= 1
                closed = self._closed
                if not closed:
                    self._lent[sandbox.id] = sandbox
            if closed:
                self.spec.client.delete_quietly(sandbox.id)
                raise PoolClosedError(f"{self!r} is closed")
            return sandbox

    def _wait_for_room(self, deadline: float | None, timeout: float | None) -> None:
        """Until fewer than ``max_lent`` are lent or being made; counts this create."""
        with self._cond:
            while True:
                if self._closed:
                    raise PoolClosedError(f"{self!r} is closed")
                if self.max_lent is None or len(self._lent) + self._creating < self.max_lent:
                    self._creating += 1
                    return
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise SandboxTimeoutError(
                        f"no sandbox of {self!r} was free within {timeout} seconds: all "
                        f"{self.max_lent} (max_size) are in use. To fix: raise max_size or "
                        "pass a longer timeout"
                    )
                self._cond.wait(None if deadline is None else deadline - now)

    def release(self, sandbox: Sandbox) -> None:
        """Delete a lent sandbox, in the caller's thread (the server keeps its pool warm).

        Raises:
            ConfigurationError: the sandbox was not lent by this pool.
        """
        with self._cond:
            if self._closed:
                return  # close() deleted it
            if self._lent.pop(sandbox.id, None) is None:
                raise ConfigurationError(f"sandbox {sandbox.id} was not lent by {self!r}")
            self._cond.notify_all()
        self.spec.client.delete_quietly(sandbox.id)

    def close(self) -> None:
        """Delete the sandboxes this process holds; the server's pool stays."""
        with self._cond:
            self._closed = True
            lent = list(self._lent.values())
            self._lent.clear()
            self._cond.notify_all()
        for sandbox in lent:
            self.spec.client.delete_quietly(sandbox.id)

    def destroy(self) -> None:
        """The server's pool is the server's (``client.pools.delete``): close() only."""
        self.close()


class InProcessLender:
    """The in-process store's lender: idle queue, lent set, creates in threads, refill thread."""

    def __init__(self, spec: PoolSpec):
        self.spec = spec
        self.name, self.size, self.max_size, self.reuse = (
            spec.name, spec.size, spec.max_size, spec.reuse
        )  # fmt: skip
        self._client = spec.client
        self._create_kwargs = spec.create_kwargs
        self._lifetime = spec.lifetime
        self._reset_state()
        self._start_worker()

    def __repr__(self) -> str:
        return repr(self.spec)

    def after_fork(self) -> None:
        """In a forked child: an empty pool, its worker started on first use."""
        self._reset_state()

    def destroy(self) -> None:
        """One process holds the whole pool: close() is all there is to do."""
        self.close()

    def _reset_state(self) -> None:
        self._cond = threading.Condition()
        self._idle: deque[Sandbox] = deque()
        self._lent: dict[str, Sandbox] = {}
        self._doomed: list[Sandbox] = []
        self._to_reset: list[Sandbox] = []
        self._expires: dict[str, float] = {}
        self._commands_stopped: dict[str, int] = {}  # by sandbox: background commands reset
        self._creating = 0
        self._in_flight = 0  # being checked before lending, reset, or deleted
        self._failures = 0
        self._retry_at = 0.0  # no create starts before, after a failure (the caller's first may)
        self._refill: Order | None = None
        self._closed = False
        self._worker: threading.Thread | None = None
        self._creators: set[threading.Thread] = set()

    def acquire(self, timeout: float | None = None) -> Sandbox:
        """See SandboxPool.acquire."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            sandbox = self._take_or_create(deadline, timeout)
            if not self._fit_to_lend(sandbox, deadline):
                self._settle(sandbox, doomed=True)
                continue
            with self._cond:
                self._in_flight -= 1
                if self._closed:
                    self._doomed.append(sandbox)
                    raise PoolClosedError(f"{self!r} is closed")
                self._lent[sandbox.id] = sandbox
            return sandbox

    def release(self, sandbox: Sandbox) -> None:
        """See SandboxPool.release."""
        with self._cond:
            if self._closed:
                return  # close() deleted it
            if self._lent.pop(sandbox.id, None) is None:
                raise ConfigurationError(f"sandbox {sandbox.id} was not lent by {self!r}")
            (self._doomed if self.reuse == "never" else self._to_reset).append(sandbox)
            self._cond.notify_all()

    def close(self) -> None:
        """Delete every sandbox the pool created (lent ones too) and stop the worker."""
        with self._cond:
            self._closed = True
            doomed = [*self._idle, *self._lent.values(), *self._doomed, *self._to_reset]
            self._idle.clear()
            self._lent.clear()
            self._doomed.clear()
            self._to_reset.clear()
            self._cond.notify_all()
            threads = [self._worker, *self._creators]
        for sandbox in doomed:
            self._client.delete_quietly(sandbox.id)
        deadline = time.monotonic() + CLOSE_WAIT
        for thread in threads:
            if thread is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    # -- internals ------------------------------------------------------------------------------

    def _alive(self) -> int:
        """Every sandbox of the pool that exists or is being created, wherever it is."""
        return (
            len(self._idle) + len(self._lent) + len(self._doomed) + len(self._to_reset)
            + self._creating + self._in_flight
        )  # fmt: skip

    def _take_or_create(self, deadline: float | None, timeout: float | None) -> Sandbox:
        """An idle sandbox, or one created for this call; waits for either until the deadline.

        Either way the sandbox counts as in flight until it is lent or settled. A create still
        running when this call leaves (deadline, closed pool, an idle one came first) is
        abandoned: its sandbox joins the pool.
        """
        order: Order | None = None
        last_error: BaseException | None = None
        with self._cond:
            if self._worker is None:
                self._start_worker()  # first use in a forked child
            try:
                while True:
                    if self._closed:
                        raise PoolClosedError(f"{self!r} is closed")
                    if order is not None and order.done:
                        if order.sandbox is not None:
                            sandbox, order = order.sandbox, None
                            return sandbox
                        last_error, order = order.error, None
                        assert last_error is not None
                        if deadline is None or hopeless(last_error):
                            raise last_error
                    if self._idle:
                        self._in_flight += 1
                        return self._idle.popleft()
                    now = time.monotonic()
                    may_retry = last_error is None or now >= self._retry_at
                    if order is None and may_retry and self._alive() < self.max_size:
                        order = self._start_create(for_caller=True)
                        continue
                    if deadline is not None and now >= deadline:
                        raise timeout_error(
                            self.spec,
                            timeout,
                            running=self._creating > 0,
                            last_error=last_error,
                            api_base=self._client.api_base,
                        ) from last_error
                    wake = [t for t in (deadline, self._retry_at) if t is not None and t > now]
                    self._cond.wait(min(wake) - now if wake else None)
            finally:
                if order is not None:
                    order.abandoned = True

    def _start_create(self, *, for_caller: bool) -> Order:
        """Under the lock: start a create in a thread of its own."""
        order = Order(for_caller=for_caller)
        self._creating += 1
        thread = threading.Thread(
            target=self._fulfil, args=(order,), name=f"osb-pool-{self.name}-create", daemon=True
        )
        self._creators.add(thread)
        thread.start()
        return order

    def _fulfil(self, order: Order) -> None:
        """The thread of one create: the sandbox goes to its caller, else to the pool."""
        try:
            sandbox = self._new_sandbox()
        except Exception as exc:  # noqa: BLE001 - handed to the waiting caller, or logged
            with self._cond:
                self._creating -= 1
                self._creators.discard(threading.current_thread())
                self._failures += 1
                delay = backoff_seconds(self._failures, cap=MAX_CREATE_BACKOFF)
                self._retry_at = time.monotonic() + delay
                order.error, order.done = exc, True
                abandoned = order.abandoned
                self._cond.notify_all()
            if abandoned:
                logger.warning("pool %s could not create a sandbox (%s); next create in %.1f s",
                               self.name, exc, delay)  # fmt: skip
            return
        with self._cond:
            self._creating -= 1
            self._creators.discard(threading.current_thread())
            self._failures = 0
            order.done = True
            closed = self._closed
            if not closed and order.abandoned:
                self._idle.append(sandbox)
            elif not closed:
                order.sandbox = sandbox
                self._in_flight += 1
            self._cond.notify_all()
        if closed:
            self._expires.pop(sandbox.id, None)
            self._client.delete_quietly(sandbox.id)

    def _new_sandbox(self) -> Sandbox:
        sandbox = self._client.create_sandbox(**self._create_kwargs)
        sandbox.delete_on_exit = False  # the pool owns it, not the borrower's ``with``
        if self._lifetime is not None:
            self._expires[sandbox.id] = time.monotonic() + self._lifetime
        return sandbox

    def _settle(self, sandbox: Sandbox, *, doomed: bool) -> None:
        """An in-flight sandbox goes to the idle queue or to deletion."""
        with self._cond:
            self._in_flight -= 1
            if doomed or self._closed:
                self._doomed.append(sandbox)
            else:
                self._idle.append(sandbox)
            self._cond.notify_all()

    def _fit_to_lend(self, sandbox: Sandbox, deadline: float | None) -> bool:
        """Alive (answers /ping) and not about to expire (renewed if it is), by the deadline."""
        if not answers_ping(sandbox, self._call_timeout(deadline)):
            logger.info("pooled sandbox %s does not answer; replacing it", sandbox.id)
            return False
        expires = self._expires.get(sandbox.id)
        if expires is None or self._lifetime is None:
            return True
        if expires - time.monotonic() > self._lifetime / 2:
            return True
        try:
            sandbox.renew(self._lifetime, timeout=self._call_timeout(deadline))
        except OpenSandboxError as exc:
            logger.info("could not renew pooled sandbox %s (%s); replacing it", sandbox.id, exc)
            return False
        self._expires[sandbox.id] = time.monotonic() + self._lifetime
        return True

    def _call_timeout(self, deadline: float | None) -> float:
        """The read timeout of a call made for acquire(): what is left, at least PING_FLOOR."""
        read_timeout = self._client.read_timeout
        if deadline is None:
            return read_timeout
        return min(read_timeout, max(deadline - time.monotonic(), PING_FLOOR))

    def _start_worker(self) -> None:
        self._worker = threading.Thread(
            target=_maintain, args=(weakref.ref(self),), name=f"osb-pool-{self.name}", daemon=True
        )
        self._worker.start()

    def _next_chore(self) -> tuple[list[Sandbox], list[Sandbox]] | None:
        """Under the lock: start the refill's create if due; what to delete and reset.

        None when the pool is closed. The refill creates one sandbox at a time.
        """
        with self._cond:
            while True:
                if self._closed:
                    return None
                refilling = self._refill is not None and not self._refill.done
                if (
                    not refilling
                    and len(self._idle) + self._creating < self.size
                    and self._alive() < self.max_size
                    and time.monotonic() >= self._retry_at
                ):
                    self._refill = self._start_create(for_caller=False)
                doomed, self._doomed = self._doomed, []
                to_reset, self._to_reset = self._to_reset, []
                self._in_flight += len(doomed) + len(to_reset)
                if doomed or to_reset:
                    return doomed, to_reset
                self._cond.wait(MAINTENANCE_INTERVAL)

    def _refill_once(self) -> bool:
        """One round of background work; False when the pool is closed."""
        chore = self._next_chore()
        if chore is None:
            return False
        doomed, to_reset = chore
        for sandbox in doomed:
            self._expires.pop(sandbox.id, None)
            self._commands_stopped.pop(sandbox.id, None)
            self._client.delete_quietly(sandbox.id)
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()
        for sandbox in to_reset:
            stopped = reset_for_next_user(sandbox, self._commands_stopped.get(sandbox.id, 0))
            if stopped is not None:
                self._commands_stopped[sandbox.id] = stopped
            self._settle(sandbox, doomed=stopped is None)
        if self._closed:
            self.close()  # delete what was settled after close() had run
        return True


def _maintain(pool_ref: weakref.ref[InProcessLender]) -> None:
    """The worker thread: holds the pool only weakly, so an abandoned pool can be collected."""
    while True:
        pool = pool_ref()
        if pool is None or not pool._refill_once():
            return
        del pool
