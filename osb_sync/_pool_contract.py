"""The contract between ``SandboxPool`` and the stores that keep its sandboxes.

``SandboxPool`` (``_pool``) checks its arguments once into a :class:`PoolSpec` and hands it to a
:class:`PoolStore`, whose ``open`` answers with a :class:`Lender`: the running half that lends
and takes back. Three stores keep that contract, each in a module of its own:

- ``InProcessStore`` (``_pool_in_process``): this process's memory, creates in threads of their
  own, a refill thread;
- ``ServerPoolStore`` (``_pool_server``): a pool the server keeps warm; the lender only tracks
  what it lent;
- ``RedisStore`` (``_pool_redis``, with its leader in ``_pool_leader``): shared by every process
  and host using the pool's name.

What every lender keeps to:

- it is thread-safe: any number of threads acquire and release at once;
- ``acquire(timeout)`` bounds its whole wait by ``timeout`` (plus at most ``PING_FLOOR``
  seconds for each call made for a sandbox taken at the last moment: :func:`call_timeout`) and
  raises :func:`timeout_error`'s ``SandboxTimeoutError`` past it; a create error that waiting
  would not cure (:func:`hopeless`) is raised at once; a closed pool raises
  ``PoolClosedError``;
- ``release`` of a sandbox it did not lend raises ``ConfigurationError``; after ``close()``
  it is a no-op (close deleted the sandbox);
- a sandbox is pinged before it is lent (:func:`answers_ping`), and reset for its next user
  with :func:`reset_for_next_user` when the pool reuses sandboxes;
- every sandbox it creates carries ``POOL_KEY=<name>`` in its metadata (``PoolSpec``'s
  ``create_kwargs`` have it), and is not deleted by the borrower's ``with`` block;
- ``close()`` deletes what this process created and holds and joins its threads within
  ``CLOSE_WAIT`` seconds; ``after_fork()`` forgets the parent's sandboxes and threads (the
  facade calls it in a forked child).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ._errors import ApiError, ConfigurationError, OpenSandboxError, SandboxTimeoutError
from ._options import CreateOptions

if TYPE_CHECKING:
    from ._client import Client
    from ._sandbox import Sandbox

logger = logging.getLogger("osb_sync")

POOL_KEY = "osb_sync.pool"
MAX_CREATE_BACKOFF = 30.0
PING_FLOOR = 1.0
CLOSE_WAIT = 10.0


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


def call_timeout(read_timeout: float, deadline: float | None) -> float:
    """The read timeout of a call made for acquire(): what is left before ``deadline``, at
    least ``PING_FLOOR``, at most the client's ``read_timeout``."""
    if deadline is None:
        return read_timeout
    return min(read_timeout, max(deadline - time.monotonic(), PING_FLOOR))


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
