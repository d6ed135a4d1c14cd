"""ServerPoolStore: a pool the server keeps (``SandboxPool(server_pool=...)``).

The server's own pool (``client.pools``: OpenSandbox's Kubernetes runtime, or osb-sync serve)
keeps sandboxes warm; this process keeps none idle and creates none in the background. Each
acquire creates with ``extensions.poolRef`` (the server answers from its warm sandboxes, 409
when the pool is exhausted), each release deletes (the server replenishes). The lender only
tracks what it lent, to bound it by ``max_size`` and to delete it on close. The contract it
keeps is ``_pool_contract``'s.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from ._errors import (
    ApiError,
    ConfigurationError,
    NotFoundError,
    NotSupportedError,
    PoolClosedError,
    SandboxTimeoutError,
)
from ._lifecycle import resends_by
from ._options import CreateOptions
from ._pool_contract import MAX_CREATE_BACKOFF, Lender, PoolSpec, PoolStore, hopeless
from ._transport import backoff_seconds
from ._validators import whole

if TYPE_CHECKING:
    from ._sandbox import Sandbox


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
                with resends_by(deadline):  # a 429's resends end by acquire's timeout
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
