"""Sandboxes that failed creates may have left: found by their create-id tag and deleted.

Every create carries a random ``osb-sync/create-id`` metadata tag. When a create fails after
its request reached the server, a search looks the tag up and deletes what it finds. It runs
in a background thread and retries failed lookups with the transport's backoff:

- after an error status other than 504, the server is done with the request: the first
  lookup that gets an answer decides;
- after no answer (a read timeout, a broken connection) or a 504 (a gateway gave up, the
  server behind it may not have), the server may still be making the sandbox: lookups go on,
  even when they find nothing, until one finds it, or until the sandbox's requested lifetime
  has passed (the server deletes it then; ``SEARCH_CAP`` seconds for ``NO_TIMEOUT``).

The failed call waits for the first lookup, at most ``CALLER_WAIT`` seconds. At interpreter exit
every unfinished search gets a last chance, all of them together for at most ``EXIT_WAIT``
seconds, in which one answered lookup decides; ``Client.close()`` gives its own searches the
same last chance (:func:`finish`), then stops them, so none outlives its client. The lookups
of a last chance wait at most its time left. A create whose connection was never opened
reached no server: it starts no search and logs nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from ._constants import CREATE_ID_KEY
from ._errors import OpenSandboxError
from ._hooks import at_exit, in_forked_child
from ._transport import backoff_seconds

logger = logging.getLogger("osb_sync")

CALLER_WAIT = 1.0
EXIT_WAIT = 3.0
EXIT_RETRY_INTERVAL = 0.1
SEARCH_CAP = 3600.0


class Lifecycle(Protocol):
    """What a search needs of the lifecycle API (``_lifecycle.Lifecycle`` is one)."""

    def find_by_create_id(self, create_id: str, deadline: float | None = None) -> list[str]:
        """The ids of the sandboxes whose create carried ``create_id`` (each request answered
        by ``deadline``, a ``time.monotonic()`` instant, when given)."""

    def delete(self, sandbox_id: str) -> bool:
        """Delete the sandbox ``sandbox_id``: True if deleted, False if it was not found."""


_lock = threading.Lock()
_searches: set[_Search] = set()


class _Search:
    """One failed create's search: lookups with backoff until it is decided or too late."""

    def __init__(self, lifecycle: Lifecycle, create_id: str, *, answered: bool, lifetime: float):
        self.create_id = create_id
        self.attempts = 0
        self.looked = threading.Event()  # the first lookup is over, whatever it found
        self.done = threading.Event()
        self.decided = False  # a lookup found the sandbox, or answered when an answer decides
        self._lifecycle = lifecycle
        self._answered = answered
        self._deadline = time.monotonic() + lifetime
        self._reached = False  # some lookup got an answer
        self._wake = threading.Event()  # set at exit, or to cancel
        self._cancelled = False
        self._last_chance: float | None = None  # its deadline, once given one (close, exit)

    def run(self) -> None:
        try:
            while not self._cancelled and not self._decide():
                self.looked.set()
                if time.monotonic() >= self._deadline:
                    self._give_up()
                    return
                if self._last_chance is not None and time.monotonic() >= self._last_chance:
                    return  # the caller of the last chance logs what is left undecided
                if self._last_chance is not None:
                    time.sleep(EXIT_RETRY_INTERVAL)
                else:
                    self._wake.wait(backoff_seconds(self.attempts - 1))
        finally:
            with _lock:
                _searches.discard(self)
            self.looked.set()
            self.done.set()

    def _decide(self) -> bool:
        self.decided = self._attempt()
        return self.decided

    def _attempt(self) -> bool:
        """One lookup (and delete); True when the search is decided."""
        self.attempts += 1
        try:
            found = self._lifecycle.find_by_create_id(self.create_id, self._last_chance)
            for sandbox_id in found:
                logger.warning("deleting sandbox %s left by a failed create", sandbox_id)
                self._lifecycle.delete(sandbox_id)
        except OpenSandboxError as exc:
            logger.debug("lookup %d for tag %s failed: %s", self.attempts, self.tag, exc)
            return False
        self._reached = True
        return bool(found) or self._answered or self._last_chance is not None

    def _give_up(self) -> None:
        if not self._reached:
            logger.warning(
                "no lookup for a sandbox left by a failed create got an answer before its "
                "lifetime ended; if it exists, delete it with delete_all(metadata={%r: %r})",
                CREATE_ID_KEY,
                self.create_id,
            )

    def wake(self, *, cancel: bool = False) -> None:
        """End the backoff wait now; with ``cancel``, look no more."""
        self._cancelled = self._cancelled or cancel
        self._wake.set()

    def last_chance(self, deadline: float) -> None:
        """Look now, and again every EXIT_RETRY_INTERVAL until a lookup gets an answer, which
        decides; each lookup answered by ``deadline`` (the caller stops the search then)."""
        self._last_chance = deadline
        self.wake()

    def serves(self, lifecycle: Lifecycle) -> bool:
        """Whether this search looks through ``lifecycle``."""
        return self._lifecycle is lifecycle

    @property
    def tag(self) -> str:
        return f"{CREATE_ID_KEY}={self.create_id}"


def search(lifecycle: Lifecycle, create_id: str, *, answered: bool, lifetime: float | None) -> None:
    """Look for the sandbox of a failed create in the background.

    Returns after the first lookup, or after CALLER_WAIT seconds if it takes longer.

    Args:
        lifecycle: the API the create went to.
        create_id: the create's ``osb-sync/create-id`` tag.
        answered: the server answered the create (with an error status other than 504).
        lifetime: the sandbox's requested lifetime in seconds, None for no expiry.
    """
    job = _Search(lifecycle, create_id, answered=answered, lifetime=lifetime or SEARCH_CAP)
    with _lock:
        _searches.add(job)
    threading.Thread(target=job.run, name="osb-orphan-search", daemon=True).start()
    job.looked.wait(CALLER_WAIT)


def searches_pending() -> int:
    """Searches of this process that are not decided yet."""
    with _lock:
        return len(_searches)


def finish(lifecycle: Lifecycle, wait: float = EXIT_WAIT) -> None:
    """``Client.close()``: the last chance for the searches through ``lifecycle``, for ``wait``
    seconds in all; then they stop, decided or not (an undecided one is logged)."""
    with _lock:
        pending = [job for job in _searches if job.serves(lifecycle)]
    unfinished = _last_chance(pending, wait)
    for job in pending:
        job.wake(cancel=True)
    if unfinished:
        logger.warning(
            "at close, the lookup for sandboxes left by failed creates did not finish within "
            "%s s; look for them by metadata: %s",
            wait,
            ", ".join(unfinished),
        )


def _last_chance(pending: list[_Search], wait: float) -> list[str]:
    """Give ``pending`` their last chance together, for ``wait`` seconds; the tags of those
    still undecided then."""
    deadline = time.monotonic() + wait
    for job in pending:
        job.last_chance(deadline)
    for job in pending:
        job.done.wait(max(0.0, deadline - time.monotonic()))
    return [job.tag for job in pending if not job.decided]


def _last_chance_at_exit() -> None:
    """Let the unfinished searches look once more, for EXIT_WAIT seconds in all."""
    with _lock:
        pending = list(_searches)
    unfinished = _last_chance(pending, EXIT_WAIT)
    if unfinished:
        logger.warning(
            "at exit, the lookup for sandboxes left by failed creates did not finish within "
            "%s s; look for them by metadata: %s",
            EXIT_WAIT,
            ", ".join(unfinished),
        )


def _cancel_all(wait: float) -> None:
    """Tests: stop every search (their servers go away), waiting ``wait`` s for them to end."""
    with _lock:
        pending = list(_searches)
    for job in pending:
        job.wake(cancel=True)
    deadline = time.monotonic() + wait
    for job in pending:
        job.done.wait(max(0.0, deadline - time.monotonic()))


def _forget_in_child() -> None:
    """A forked child has none of the parent's threads: the parent's searches are its own."""
    global _lock
    _lock = threading.Lock()
    _searches.clear()


at_exit(_last_chance_at_exit)
in_forked_child(_forget_in_child)
