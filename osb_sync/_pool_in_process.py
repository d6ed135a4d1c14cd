"""InProcessStore: a pool's bookkeeping in this process's memory (the default store).

Its lender keeps the idle queue, the lent set and the counts under one condition variable;
each create runs in a thread of its own (for a caller, or for the refill), so a caller's wait
is bounded by its timeout whatever the server does; one worker thread per pool refills to
``size`` one create at a time, deletes returned sandboxes and resets reused ones. The worker
holds the lender only weakly: an abandoned pool is collected. The contract it keeps is
``_pool_contract``'s.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from typing import TYPE_CHECKING

from ._errors import ConfigurationError, OpenSandboxError, PoolClosedError
from ._pool_contract import (
    CLOSE_WAIT,
    MAX_CREATE_BACKOFF,
    Lender,
    Order,
    PoolSpec,
    answers_ping,
    call_timeout,
    hopeless,
    reset_for_next_user,
    timeout_error,
)
from ._transport import backoff_seconds

if TYPE_CHECKING:
    from ._sandbox import Sandbox

logger = logging.getLogger("osb_sync")

MAINTENANCE_INTERVAL = 1.0


class InProcessStore:
    """The pool's bookkeeping in this process's memory (the default store)."""

    def __repr__(self) -> str:
        return "InProcessStore()"

    def open(self, spec: PoolSpec) -> Lender:
        """Start an in-process lender for ``spec``."""
        return InProcessLender(spec)


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
        if not answers_ping(sandbox, call_timeout(self._client.read_timeout, deadline)):
            logger.info("pooled sandbox %s does not answer; replacing it", sandbox.id)
            return False
        expires = self._expires.get(sandbox.id)
        if expires is None or self._lifetime is None:
            return True
        if expires - time.monotonic() > self._lifetime / 2:
            return True
        try:
            sandbox.renew(self._lifetime, timeout=call_timeout(self._client.read_timeout, deadline))
        except OpenSandboxError as exc:
            logger.info("could not renew pooled sandbox %s (%s); replacing it", sandbox.id, exc)
            return False
        self._expires[sandbox.id] = time.monotonic() + self._lifetime
        return True

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
