"""Warm spare containers: started ahead with the server's settings, claimed by a create.

A container's start (bwrap, the interpreter, execd's imports) is most of a create's time. The
pool keeps `count` isolated containers launched up to their claim (`SandboxContainer.launch`),
in a directory of their own; a create whose needs a spare can take later (`fits`) claims the
oldest one, waiting for it if it is still starting, and a replacement starts in the
background. What is given at claim: the sandbox's id (the spare's; its directories move into
the server's root), env, token and network (slirp4netns attaches to the running namespace);
`ContainerSource.on_claim` runs then too (e.g. writing cgroup limit files), and the
create's entrypoint starts then (`entrypoint.py`): a spare is made before any entrypoint is
known, so it starts the one its claim names, whatever it is. Anything fixed when bwrap starts
(extra binds such as volumes, an image) makes a cold start instead.

Spares are no sandboxes: the registry never lists them. A spare that died is dropped and
replaced (`replace_dead`, from the server's reaper); `close` kills every spare, including the
ones still starting.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import logs
from .bwrap import Support
from .container import START_ATTEMPTS, Assignment, Launch, SandboxContainer
from .recovery import SPARES_DIR

logger = logging.getLogger("osb_sync.local")

# Fields of a create body fixed when a container starts: a spare has none of them.
FIXED_AT_START: tuple[str, ...] = ("volumes",)
CLAIM_WAIT = 60.0
CLOSE_WAIT = 10.0  # server stop waits this long for spares still starting


def fits(body: dict[str, Any]) -> bool:
    """True when a spare can become the sandbox `body` asks for (it needs nothing at start)."""
    return not any(body.get(name) for name in FIXED_AT_START)


def _close_launched(future: Future[SandboxContainer]) -> None:
    if future.exception() is None:
        future.result().close()


def launch_container(
    sandbox_id: str,
    root: Path,
    support: Support,
    timing: tuple[float, float],
    settings: Launch,
    log_budget: logs.LogBudget | None = None,
) -> SandboxContainer:
    """A launched container (see `SandboxContainer.launch`); nothing is left behind on failure.

    bwrap now and then fails to set up a new namespace's loopback under load ("loopback:
    Failed RTM_NEWADDR"): a failure of bwrap itself is retried a few times.
    """
    for attempt in range(1, START_ATTEMPTS + 1):
        container = SandboxContainer(sandbox_id, root, support, log_budget)
        try:
            container.launch(*timing, settings)
            return container
        except BaseException as exc:
            container.close()
            if attempt == START_ATTEMPTS or "bwrap:" not in str(exc):
                raise
    raise AssertionError("unreachable")


class SparePool:
    """Up to `count` containers launched ahead (see the module docstring).

    Args:
        count: how many spares to keep (0: none, every create is a cold start).
        launch: starts one container up to its claim, given its sandbox id (blocking).
    """

    def __init__(self, count: int, launch: Callable[[str], SandboxContainer]) -> None:
        self.count = count
        self.claimed = 0  # spares handed to creates, for tests and figures
        self._launch = launch
        self._lock = threading.Lock()
        self._spares: list[Future[SandboxContainer]] = []
        self._threads: list[threading.Thread] = []
        self._closed = False

    def fill(self) -> None:
        """Start spares in the background until `count` are ready or starting."""
        with self._lock:
            while not self._closed and len(self._spares) < self.count:
                future: Future[SandboxContainer] = Future()
                self._spares.append(future)
                thread = threading.Thread(
                    target=self._start,
                    args=(future, str(uuid.uuid4())),
                    name="osb-local-spare",
                    daemon=True,
                )
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
                thread.start()

    def _start(self, future: Future[SandboxContainer], sandbox_id: str) -> None:
        try:
            future.set_result(self._launch(sandbox_id))
        except BaseException as exc:  # noqa: BLE001 (the claim falls back to a cold start)
            logger.warning("local server: a spare container did not start: %s", exc)
            future.set_exception(exc)
            with self._lock:
                if future in self._spares:
                    self._spares.remove(future)

    def claim(self, body: dict[str, Any]) -> SandboxContainer | None:
        """A launched container for the create `body`, or None (then: a cold start)."""
        if not fits(body):
            return None
        with self._lock:
            future = self._spares.pop(0) if self._spares else None
        self.fill()
        if future is None:
            return None
        try:
            container = future.result(CLAIM_WAIT)
        except FutureTimeout:
            future.add_done_callback(_close_launched)  # whenever it starts, nobody wants it
            return None
        except Exception:  # noqa: BLE001 (logged by _start; a cold start follows)
            return None
        if not container.alive():
            container.close()
            return None
        with self._lock:
            self.claimed += 1
        return container

    def ready(self) -> list[SandboxContainer]:
        """The spares launched and waiting for a claim (not those still starting)."""
        with self._lock:
            return [f.result() for f in self._spares if f.done() and f.exception() is None]

    def replace_dead(self) -> None:
        """Drop every ready spare whose container died, and start replacements."""
        dead = [container for container in self.ready() if not container.alive()]
        with self._lock:
            self._spares = [
                f
                for f in self._spares
                if not (f.done() and f.exception() is None) or f.result() not in dead
            ]
        for container in dead:
            container.close()
        if dead:
            self.fill()

    def close(self) -> None:
        """Kill every spare; one still starting after `CLOSE_WAIT` seconds is killed once it has."""
        with self._lock:
            self._closed = True
            spares, self._spares = self._spares, []
            threads = list(self._threads)
        deadline = time.monotonic() + CLOSE_WAIT
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for future in spares:
            future.add_done_callback(_close_launched)  # now, or when a slow launch ends


class ContainerSource:
    """Where a create's container comes from: a claimed spare when one fits, else a cold start.

    Args:
        root: the server's root directory (sandboxes; spares wait in `SPARES_DIR` below it).
        support: what this host allows; spares only where containers are isolated.
        timing: execd's heartbeat interval and /command grace, seconds.
        spares: how many spares to keep.
        spare_settings: what every spare starts with.
        log_budget: what the containers' logs keep (`logs.LogBudget`).
    """

    def __init__(
        self,
        root: Path,
        support: Support,
        timing: tuple[float, float],
        spares: int,
        spare_settings: Launch | None = None,
        log_budget: logs.LogBudget | None = None,
    ) -> None:
        self.root, self.support, self.timing = root, support, timing
        self.log_budget = log_budget or logs.LogBudget()
        self.spare_settings = spare_settings or Launch()
        self.pool = SparePool(spares if support.bwrap is not None else 0, self._launch_spare)

    def new_pool(self, count: int) -> SparePool:
        """Another SparePool of this source's spares (a named pool's), `count` kept; none
        where containers are not isolated."""
        return SparePool(count if self.support.bwrap is not None else 0, self._launch_spare)

    def _launch_spare(self, sandbox_id: str) -> SandboxContainer:
        root = self.root / SPARES_DIR
        return launch_container(
            sandbox_id, root, self.support, self.timing, self.spare_settings, self.log_budget
        )

    def claimed(
        self,
        body: dict[str, Any],
        assignment: Assignment,
        launch: Launch,
        spares: SparePool | None = None,
        fill: Callable[[SandboxContainer], None] | None = None,
    ) -> SandboxContainer:
        """A container serving the sandbox `body` asks for; nothing is left on failure.

        Args:
            body: the checked create request.
            assignment: what the sandbox gives its container at claim.
            launch: what its container starts with; a spare serves only where that is what
                every spare starts with, but for the limits (they are written at claim).
            spares: the SparePool to claim from (a named pool's); default the server's.
            fill: called with the container before its claim, while nothing of the sandbox's
                has run in it (a snapshot's restore, which writes as the server).

        Raises:
            RuntimeError, OSError: no container could be started.
        """
        spare = None
        if replace(launch, plan=None) == self.spare_settings:
            spare = (spares or self.pool).claim(body)
        if spare is not None:
            try:
                spare.move_to(self.root)
                return self._claim(spare, assignment, fill)
            except (OSError, RuntimeError) as exc:  # a cold start, as without spares
                logger.info("local server: a claimed spare failed (%s): cold start", exc)
        cold = launch_container(
            str(uuid.uuid4()), self.root, self.support, self.timing, launch, self.log_budget
        )
        return self._claim(cold, assignment, fill)

    def _claim(
        self,
        container: SandboxContainer,
        assignment: Assignment,
        fill: Callable[[SandboxContainer], None] | None,
    ) -> SandboxContainer:
        try:
            self.on_claim(container, assignment)
            if fill is not None:
                fill(container)
            container.claim(assignment)
        except BaseException:
            container.close()
            raise
        return container

    def on_claim(self, container: SandboxContainer, assignment: Assignment) -> None:
        """Apply what a running container can still take, before its execd serves.

        Runs for spares and cold starts alike, between launch and claim: a spare's cgroup
        limits are written here (a cold start's were, before its processes joined).

        Raises:
            RuntimeError: the limits could not be written (see `apply_limits`).
        """
        container.apply_limits(assignment.limits)
