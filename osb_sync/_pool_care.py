"""What SandboxPool does besides bookkeeping: creates in threads, checks, resets, process hooks."""

from __future__ import annotations

import atexit
import logging
import os
import re
import secrets
import weakref
from typing import TYPE_CHECKING, Protocol

from ._errors import ApiError, ConfigurationError, OpenSandboxError, SandboxTimeoutError

if TYPE_CHECKING:
    from ._pool import SandboxPool
    from ._sandbox import Sandbox

logger = logging.getLogger("osb_sync")


REUSE_MODES = ("never", "reset")
_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def checked_pool_arguments(
    size: object, max_size: object, reuse: object, name: str | None
) -> tuple[int, str]:
    """SandboxPool's ``max_size`` (defaulted) and ``name`` (random when None), once checked.

    Raises:
        ConfigurationError: naming the first bad argument.
    """
    if not isinstance(size, int) or size < 0:
        raise ConfigurationError("size must be an int >= 0")
    max_size = max(size, 1) if max_size is None else max_size
    if not isinstance(max_size, int) or max_size < max(size, 1):
        raise ConfigurationError("max_size must be an int >= size and >= 1")
    if reuse not in REUSE_MODES:
        raise ConfigurationError(f"reuse must be one of {REUSE_MODES}")
    name = name or f"pool-{secrets.token_hex(4)}"
    if not _LABEL.match(name):
        raise ConfigurationError("name must be label-safe: letters, digits, '-', '_', '.'")
    return max_size, name


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
    pool: SandboxPool,
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
        reasons.append(f"all {pool.max_size} sandboxes (max_size) are in use")
        advice.append("raise max_size or pass a longer timeout")
    return SandboxTimeoutError(
        f"no sandbox of {pool!r} was free within {timeout} seconds: "
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

    atexit.register(close)


def after_fork_in_child(pool: _Closable) -> None:
    """A child process forgets the parent's sandboxes (they are the parent's to delete)."""
    if not hasattr(os, "register_at_fork"):
        return
    pool_ref = weakref.ref(pool)

    def forget() -> None:
        child_pool = pool_ref()
        if child_pool is not None:
            child_pool._reset_state()
            close_at_exit_of_this_process(child_pool)

    os.register_at_fork(after_in_child=forget)
