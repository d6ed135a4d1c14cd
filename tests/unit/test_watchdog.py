"""The shared run-timeout watchdog: one thread for every deadline, callbacks on their own."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from osb_sync._watchdog import Watchdog


def test_a_callback_fires_at_its_deadline_on_a_thread_of_its_own() -> None:
    watchdog = Watchdog(name="test-watchdog-fires")
    fired: list[tuple[float, str]] = []
    done = threading.Event()
    started = time.monotonic()

    def callback() -> None:
        fired.append((time.monotonic() - started, threading.current_thread().name))
        done.set()

    watchdog.schedule(0.2, callback)
    assert done.wait(10)
    elapsed, thread = fired[0]
    assert 0.2 <= elapsed < 5
    assert thread == "test-watchdog-fires"
    assert watchdog.pending() == 0


def test_a_cancelled_callback_never_fires() -> None:
    watchdog = Watchdog()
    fired = threading.Event()
    handle = watchdog.schedule(0.1, fired.set)
    handle.cancel()
    later = threading.Event()
    watchdog.schedule(0.3, later.set)
    assert later.wait(10)
    assert not fired.is_set()


def test_many_deadlines_share_one_thread() -> None:
    watchdog = Watchdog(name="test-watchdog-shared")
    handles = [watchdog.schedule(60, lambda: None) for _ in range(50)]
    named = [t for t in threading.enumerate() if t.name == "test-watchdog-shared"]
    assert len(named) == 1
    assert watchdog.pending() == 50
    for handle in handles:
        handle.cancel()
    assert watchdog.pending() == 0


def test_an_earlier_deadline_scheduled_later_fires_first() -> None:
    watchdog = Watchdog()
    order: list[str] = []
    both = threading.Barrier(3)

    def note(name: str) -> None:
        order.append(name)
        both.wait(10)

    watchdog.schedule(0.6, lambda: note("late"))
    time.sleep(0.05)  # let the thread sleep toward the late deadline first
    watchdog.schedule(0.1, lambda: note("early"))
    both.wait(10)
    assert order == ["early", "late"]


def test_a_slow_callback_does_not_delay_another_deadline() -> None:
    watchdog = Watchdog()
    release = threading.Event()
    second = threading.Event()
    watchdog.schedule(0.05, lambda: release.wait(10))
    watchdog.schedule(0.1, second.set)
    assert second.wait(5)  # fired while the first callback still blocks
    release.set()


def test_cancelled_entries_do_not_pile_up() -> None:
    watchdog = Watchdog()
    keep = watchdog.schedule(3600, lambda: None)
    for _ in range(2000):
        watchdog.schedule(3600, lambda: None).cancel()
    assert watchdog.pending() == 1
    assert len(watchdog._heap) <= 200
    keep.cancel()


def test_a_later_deadline_does_not_wake_the_thread() -> None:
    """A call schedules its bound and cancels it at once, as nearly every call does: the
    thread, asleep toward an earlier deadline, is not woken for it (a wake-up per call would
    cost every call a context switch)."""
    watchdog = Watchdog()
    keep = watchdog.schedule(3600, lambda: None)
    time.sleep(0.05)  # the thread sleeps toward the hour
    woken: list[int] = []
    notify = watchdog._cond.notify
    watchdog._cond.notify = lambda n=1: (woken.append(n), notify(n))  # type: ignore[method-assign]
    for _ in range(100):
        watchdog.schedule(7200, lambda: None).cancel()
    assert woken == []
    fired = threading.Event()
    watchdog.schedule(0.05, fired.set)
    assert woken == [1] and fired.wait(10)
    keep.cancel()


AT_EXIT = """
import atexit, sys, threading
from osb_sync._watchdog import Watchdog
started, fresh = Watchdog(), Watchdog()
started.schedule(0, lambda: None)  # its thread runs before the interpreter exits
go, done, results = threading.Event(), threading.Event(), []

def at_exit_in_a_thread():  # as the last lookup for a failed create's sandbox is made
    go.wait()
    try:
        fired = threading.Event()
        started.schedule(0.05, fired.set)
        results.append("fired" if fired.wait(5) else "not fired")
        fresh.schedule(0.05, lambda: None)  # its thread would be the first
        results.append("scheduled")
    except BaseException as exc:
        results.append(repr(exc))
    done.set()

threading.Thread(target=at_exit_in_a_thread, daemon=True).start()

def last_chance():
    go.set()
    done.wait(10)
    print(" ".join(results), flush=True)

atexit.register(last_chance)
"""


def test_a_deadline_at_interpreter_exit_still_fires_and_scheduling_never_raises() -> None:
    """Python 3.12 refuses a new thread once the interpreter exits, where the last lookup for a
    failed create's sandbox runs: a due callback then fires on the watchdog's own thread, and a
    watchdog whose thread never started schedules without raising (the call keeps its read
    timeout)."""
    proc = subprocess.run(
        [sys.executable, "-c", AT_EXIT], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["fired", "scheduled"], (proc.stdout, proc.stderr)
