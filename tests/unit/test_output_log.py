"""The in-memory log of a background command's output: bounded, with a marker, by cursor."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from osb_sync.local.execd import workers
from osb_sync.local.execd.output import CHUNK, LogBudget, OutputLog, dropped_marker


def read(log: OutputLog, cursor: int = 0) -> tuple[bytes, int]:
    pieces, next_cursor = log.read(cursor)
    return b"".join(pieces), next_cursor


def test_a_log_under_its_limit_reads_whole_from_any_cursor() -> None:
    log = OutputLog(limit=100)
    log.write(b"one\n")
    log.write(b"two\n")
    assert read(log) == (b"one\ntwo\n", 8)
    assert read(log, 4) == (b"two\n", 8)
    assert read(log, 8) == (b"", 8)
    assert read(log, 50) == (b"", 50)  # past the end: nothing, the cursor as it was
    assert read(OutputLog()) == (b"", 0)


def test_past_its_limit_the_oldest_bytes_go_and_a_marker_says_how_many() -> None:
    log = OutputLog(limit=10)
    log.write(b"0123456789")
    log.write(b"abcde")
    assert (log.total, log.kept) == (15, 10)
    assert read(log) == (dropped_marker(5) + b"56789abcde", 15)
    assert dropped_marker(5) == b"[5 bytes dropped]\n"


def test_a_cursor_into_dropped_output_resumes_at_the_oldest_kept_byte() -> None:
    log = OutputLog(limit=10)
    log.write(b"x" * 20 + b"0123456789")
    assert read(log, 12) == (b"[8 bytes dropped]\n0123456789", 30)
    assert read(log, 20) == (b"0123456789", 30)  # the oldest kept byte: no marker
    assert read(log, 25) == (b"56789", 30)


def test_memory_stays_bounded_under_many_small_and_large_writes() -> None:
    log = OutputLog(limit=3 * CHUNK + 7)
    written = bytearray()
    for index in range(20_000):
        piece = bytes([65 + index % 26]) * (1 + index % 50)
        if index % 997 == 0:
            piece = b"#" * (2 * CHUNK + 3)
        log.write(piece)
        written += piece
        assert log.kept <= log.limit
    data, cursor = read(log)
    assert cursor == len(written) == log.total
    marker = dropped_marker(len(written) - log.limit)
    assert data == marker + bytes(written[-log.limit :])
    assert read(log, len(written) - 100) == (bytes(written[-100:]), len(written))


def test_a_sandbox_budget_takes_from_ended_logs_first_then_the_oldest() -> None:
    budget = LogBudget(limit=25)
    old, running, new = budget.new_log(10), budget.new_log(10), budget.new_log(10)
    old.write(b"o" * 10)
    running.write(b"r" * 10)
    old.close()
    new.write(b"n" * 10)  # 30 > 25: five of the ended log's bytes go
    assert (old.kept, running.kept, new.kept, budget.kept) == (5, 10, 10, 25)
    assert read(old) == (dropped_marker(5) + b"ooooo", 10)
    another = budget.new_log(10)
    another.write(b"a" * 10)  # the ended log gives its last 5, then the oldest running one
    assert (old.kept, running.kept, new.kept, another.kept) == (0, 5, 10, 10)
    assert read(old) == (dropped_marker(10), 10)
    assert read(running, 5) == (b"rrrrr", 10)
    assert budget.kept == 25


def test_a_reader_and_a_writer_at_once_see_consistent_output() -> None:
    log = OutputLog(limit=1 << 20)
    line = b"0123456789abcdef\n"
    done = threading.Event()

    def writer() -> None:
        for _ in range(20_000):
            log.write(line)
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    cursor, got = 0, bytearray()
    while True:
        finished = done.is_set()
        data, cursor = read(log, cursor)
        got += data
        if finished:
            break
    thread.join()
    assert bytes(got) == line * 20_000


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        OutputLog(limit=-1)
    with pytest.raises(ValueError, match="cursor"):
        OutputLog().read(-1)


@pytest.fixture(params=["pidfd", "polled"])
def exit_seen_by(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "polled":

        def no_pidfd(pid: int) -> int:
            raise OSError("no pidfd here")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    return str(request.param)


def collect(
    command: str, deadline: float | None = None, pause: float = 0.0
) -> tuple[OutputLog, list[bytes]]:
    """Run `command` as a background command is run; the log and its content at the exit.

    `pause`: seconds each write into the log takes (a reader slower than the command).
    """
    proc = subprocess.Popen(
        ["sh", "-c", command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    log, at_exit = OutputLog(), []

    def write(data: bytes) -> None:
        time.sleep(pause)
        log.write(data)

    workers.collect_output(proc, proc.stdout, write, deadline, lambda: at_exit.append(read(log)[0]))
    return log, at_exit


def test_the_output_is_all_read_before_the_exit_is_reported(exit_seen_by: str) -> None:
    # A 1 MiB pipe (F_SETPIPE_SZ) and a slow reader: at the exit, more than one read is left.
    fill = "import fcntl, os; fcntl.fcntl(1, 1031, 1 << 20); os.write(1, b'x' * (1 << 20))"
    log, at_exit = collect(f'{sys.executable} -c "{fill}"; echo end >&2', pause=0.02)
    assert at_exit == [b"x" * (1 << 20) + b"end\n"]
    assert log.total == (1 << 20) + 4


def test_a_child_holding_the_pipe_delays_nothing_and_is_still_read(exit_seen_by: str) -> None:
    started = time.monotonic()
    log, at_exit = collect("echo a; (sleep 0.5; echo b) &")
    assert at_exit == [b"a\n"]
    assert read(log)[0] == b"a\nb\n"  # collect_output returns at EOF, after the child
    assert time.monotonic() - started < 10


def test_the_deadline_kills_the_command(exit_seen_by: str) -> None:
    started = time.monotonic()
    log, at_exit = collect("echo a; sleep 30", deadline=time.monotonic() + 0.3)
    assert at_exit == [b"a\n"] and log.total == 2
    assert time.monotonic() - started < 10
