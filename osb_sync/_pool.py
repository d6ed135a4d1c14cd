"""SandboxPool: a thread-safe pool of warm sandboxes for request handlers and workers.

``SandboxPool`` is a facade over a store (composition): it checks its arguments once into a
``PoolSpec``, opens its store with it and hands every call to the ``Lender`` the store
answered (``_pool_contract`` is the contract between them; each store is in a module of its
own). What is the facade's own: the argument checks, the pool's tag in the create options, and
the process hooks (close at exit in the creating process only, forget the parent's sandboxes
in a forked child).
"""

from __future__ import annotations

import os
import re
import secrets
import weakref
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Protocol

from ._errors import ConfigurationError
from ._hooks import at_exit, in_forked_child
from ._options import CreateOptions, check_options, lifetime_seconds
from ._pool_contract import POOL_KEY, PoolSpec, PoolStore
from ._pool_in_process import InProcessStore
from ._pool_server import server_pool_store
from ._validators import whole

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Unpack

    from ._client import Client
    from ._sandbox import Sandbox

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
