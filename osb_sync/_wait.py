"""A wait with its own deadline: what each request inside it may take, and how it ends.

Rules of every wait of the client (Running, the endpoint, ``/ping``, a run's ``timeout``):

- The deadline starts when the wait starts, not when a first answer arrives.
- Each request inside the wait is sent with that deadline (``Transport.request``): its connect
  and read timeouts are at most the time left, so no request outlasts the wait because of the
  client's ``read_timeout`` or ``connect_timeout``, which are unrelated defaults.
- A request that failed because the time ran out ends the wait with its own
  ``SandboxTimeoutError`` (naming the wait and its seconds), chained from the TransportError;
  a request that failed before the deadline keeps its own error.
- The sleep between two polls never passes the deadline.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from ._errors import SandboxTimeoutError, TransportError


def time_left(deadline: float | None) -> float | None:
    """Seconds until the ``time.monotonic()`` instant ``deadline`` (never negative); None for
    no deadline."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class Wait:
    """One wait of ``seconds``, from now: its deadline, the time left, its timeout error.

    Args:
        what: what did not happen, for the error: ``"sandbox sbx-1 was not Running"``.
        seconds: how long the wait may take.
        deadline: the ``time.monotonic()`` instant it ends, when it started earlier (default:
            ``seconds`` from now).
    """

    def __init__(self, what: str, seconds: float, deadline: float | None = None):
        self.what = what
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds if deadline is None else deadline

    def left(self) -> float:
        """Seconds left (0 once the deadline has passed)."""
        return max(0.0, self.deadline - time.monotonic())

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return time.monotonic() >= self.deadline

    def error(self, detail: str = "") -> SandboxTimeoutError:
        """``{what} within {seconds} seconds{detail}``."""
        return SandboxTimeoutError(f"{self.what} within {self.seconds} seconds{detail}")

    def sleep(self, interval: float) -> None:
        """Sleep ``interval`` seconds, or until the deadline if that comes first."""
        time.sleep(min(interval, self.left()))

    @contextmanager
    def bounding(self, detail: str = "") -> Iterator[None]:
        """Turn a TransportError met once the deadline has passed into this wait's error.

        Raises:
            SandboxTimeoutError: a request of the block failed at (or after) the deadline.
        """
        try:
            yield
        except TransportError as exc:
            if self.expired():
                raise self.error(detail) from exc
            raise
