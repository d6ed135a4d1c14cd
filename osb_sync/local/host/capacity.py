"""How many sandboxes the server can still hold: descriptors and memory, checked before a create.

Each live sandbox keeps fewer than `FDS_PER_SANDBOX` of the server's descriptors open (its relay
socket, its run directory, its init's pidfd, its network namespace, its main process's stdin,
its log's read end, execd's stdin and pidfd where the execd template forked it, on a root server
its disk's root (`disk.detach`); with internet access slirp4netns's exit pipe and the firewall's
own copy of the namespace's descriptor: 9 to 11; with egress rules its resolver's sockets (UDP,
TCP, nflog), selector and wake-up pipe too: about 17), and a create in progress holds a few more
for a moment (pipes, the spawn's error pipe). A create that would push the open descriptors past
the RLIMIT_NOFILE soft limit, less `FD_RESERVE` for connections and proxied streams, is refused
(`CapacityError`: the released server's 503) naming the limit before anything starts, so nothing
half-made is left and the sandboxes already running keep working. So is a create while less than
`MEMORY_RESERVE` of memory is available: with 1,000 idle sandboxes memory, not descriptors,
should be what runs out.

At start the server raises its own soft descriptor limit to the hard limit
(`raise_descriptor_limit`): a default soft limit of 1024 would hold some 150 sandboxes.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator

from .errors import CapacityError

COUNT_TTL = 1.0  # seconds a count of the open descriptors stands in for a new one (`_open`)
FDS_PER_SANDBOX = 20  # measured: 8 to 10, about 16 with egress rules (the docstring), and room
FDS_PER_CREATE = 16  # held for a moment by a create in progress, on top of the sandbox's own
FD_RESERVE = 128  # connections, proxied streams and logs of the server itself
MEMORY_RESERVE = 512 << 20  # bytes of MemAvailable a create leaves to what already runs


def raise_descriptor_limit() -> int:
    """Raise this process's RLIMIT_NOFILE soft limit to its hard limit; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open") as nr_open:
                wanted = int(nr_open.read())
        except (OSError, ValueError):
            wanted = soft
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (OSError, ValueError):
            pass  # a platform that refuses (macOS caps at OPEN_MAX): keep what we have
    return soft


def open_descriptors() -> int:
    """How many descriptors this process has open (-1 where /proc/self/fd cannot be read)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes, or None where it cannot be read."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class Capacity:
    """Admits creates while descriptors and memory allow (see the module docstring).

    Args:
        live: how many containers the server holds now (sandboxes and spares).
        fd_limit: the RLIMIT_NOFILE soft limit to stay under (default: the current one).
        memory_reserve: bytes of available memory a create must leave.
    """

    def __init__(
        self,
        live: Callable[[], int],
        fd_limit: int | None = None,
        memory_reserve: int = MEMORY_RESERVE,
    ) -> None:
        self._live = live
        self.fd_limit = fd_limit or resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.memory_reserve = memory_reserve
        self._lock = threading.Lock()
        self._starting = 0
        self._counted = (-COUNT_TTL, 0, 0)  # (when, descriptors counted, creates admitted since)

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Hold a create's share while it starts.

        Raises:
            CapacityError: naming the limit (descriptors or memory) the create would cross.
        """
        with self._lock:
            self._check()
            self._starting += 1
        try:
            yield
        finally:
            with self._lock:
                self._starting -= 1

    def _open(self, live: int) -> int:
        """The descriptors open now, or more: counted (`open_descriptors`, a listing of
        /proc/self/fd, 3 ms at 300 sandboxes) at most every `COUNT_TTL` seconds while far
        from the limit; in between, the last count plus `FDS_PER_SANDBOX` per create since."""
        now = time.monotonic()
        at, counted, since = self._counted
        bound = counted + (since + 1) * FDS_PER_SANDBOX + (self._starting + 1) * FDS_PER_CREATE
        if now - at < COUNT_TTL and bound + FD_RESERVE <= self.fd_limit // 2:
            self._counted = (at, counted, since + 1)
            return counted + since * FDS_PER_SANDBOX
        counted = open_descriptors()
        if counted < 0:
            counted = live * FDS_PER_SANDBOX + FD_RESERVE
        self._counted = (now, counted, 1)
        return counted

    def _check(self) -> None:
        live = self._live()
        counted = self._open(live)
        needed = counted + (self._starting + 1) * FDS_PER_CREATE + FDS_PER_SANDBOX
        if needed + FD_RESERVE > self.fd_limit:
            raise refused(
                f"the server holds {live} sandboxes and has {counted} of its"
                f" {self.fd_limit} descriptors (RLIMIT_NOFILE) open; each sandbox needs about"
                f" {FDS_PER_SANDBOX}. Delete sandboxes, or start the server with a higher"
                " limit (ulimit -n)"
            )
        free = available_memory()
        if free is not None and free < self.memory_reserve:
            raise refused(
                f"the server holds {live} sandboxes and only {free >> 20} MiB of memory is"
                f" available (a create leaves at least {self.memory_reserve >> 20} MiB)."
                " Delete sandboxes, or free memory"
            )


def refused(why: str) -> CapacityError:
    """The refusal of a create the server has no capacity for."""
    return CapacityError(f"No capacity for another sandbox: {why}.")
