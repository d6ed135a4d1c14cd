"""A container's log (`osb_sync/local/host/logs.py`): bounded, the oldest bytes dropped and the
drop noted, drained as it fills (a flooding sandbox is tested in tests/local/test_liveness.py)."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator

import pytest

from osb_sync.local.host import logs


@pytest.fixture
def reader() -> Iterator[None]:
    logs.READER.hold()
    yield
    logs.READER.release()


def test_it_keeps_its_last_bytes_and_notes_the_drop() -> None:
    log = logs.ContainerLog(logs.LogBudget(100))
    try:
        os.write(log.writer, b"".join(b"line %03d\n" % n for n in range(25)))  # 225 bytes
        kept = log.tail(1000)
        assert kept.splitlines()[0] == (
            "osb-sync: 125 bytes of this log dropped (it keeps its last 100 bytes)"
        )
        # the last 100 bytes start in line 13: the first whole line is 014
        assert kept.splitlines()[1:] == [f"line {n:03d}" for n in range(14, 25)]
        assert log.tail(20) == "line 023\nline 024\n"  # shorter than the log: no note
    finally:
        log.close()
        log.close()


def test_a_short_log_is_whole() -> None:
    log = logs.ContainerLog(logs.LogBudget(4096))
    try:
        os.write(log.writer, b"first\nsecond\n")
        assert log.tail(4096) == "first\nsecond\n"
        assert log.tail(8) == "second\n"
        log.release_writer()
        assert log.tail(4096) == "first\nsecond\n"  # EOF keeps what was read
    finally:
        log.close()


def test_the_reader_drains_a_flood_into_a_bounded_log(reader: None) -> None:
    log = logs.ContainerLog(logs.LogBudget(64 * 1024))
    line = b"0123456789abcdef\n"
    done = threading.Event()

    def flood() -> None:  # blocks on the full pipe unless the reader drains it
        for _ in range(64):
            os.write(log.writer, line * 4096)
        os.write(log.writer, b"done\n")
        done.set()

    writer = threading.Thread(target=flood)
    writer.start()
    try:
        assert done.wait(30)
        deadline = time.monotonic() + 10
        while not log.tail(100).endswith("done\n") and time.monotonic() < deadline:
            time.sleep(0.01)
        kept = log.tail(1 << 30)
        assert kept.endswith(line.decode() + "done\n")
        assert len(kept.encode()) <= 64 * 1024 + 100
        assert f"{64 * 4096 * len(line) + 5 - 64 * 1024} bytes" in kept.splitlines()[0]
        assert len(log._chunks) <= 2  # gathered into chunks, not one object per write
    finally:
        writer.join()
        log.close()


@pytest.mark.skipif(not hasattr(fcntl, "F_SETPIPE_SZ"), reason="Linux's pipe sizes")
def test_a_drain_reads_a_bounded_amount() -> None:
    """The reader thread reads one pipe-ful of a ready log at a time (a flooding sandbox's pipe
    is never empty, and the other logs wait for their turn), and `tail` at most 16."""
    log = logs.ContainerLog(logs.LogBudget(1 << 20))
    # Only this test's drain reads it: a server the session keeps (the CLI suites' shared one)
    # runs the reader thread, which would drain it too.
    logs.READER.forget(log)
    try:
        fcntl.fcntl(log.writer, fcntl.F_SETPIPE_SZ, 1 << 20)
        os.write(log.writer, b"y\n" * (1 << 17))  # 256 KiB, four reads
        log.drain(1)
        assert len(log._open_chunk) + sum(map(len, log._chunks)) == logs.READ_SIZE
        assert log.tail(1 << 20) == "y\n" * (1 << 17)
    finally:
        log.close()


def fill(log: logs.ContainerLog, size: int) -> None:
    for _ in range(size // logs.READ_SIZE):
        os.write(log.writer, b"z" * (logs.READ_SIZE - 1) + b"\n")
        log.drain()


def kept(log: logs.ContainerLog) -> int:
    return len(log._open_chunk) + sum(map(len, log._chunks))


def test_a_server_s_logs_share_its_total() -> None:
    budget = logs.LogBudget(per_log=1 << 20, total=2 << 20)
    first = logs.ContainerLog(budget)
    others: list[logs.ContainerLog] = []
    try:
        fill(first, 1 << 20)
        assert kept(first) == 1 << 20  # alone: its own limit
        others = [logs.ContainerLog(budget) for _ in range(3)]
        assert kept(first) <= (2 << 20) // 4  # the others came: it gave up its share
        for log in others:
            fill(log, 1 << 20)
        assert sum(kept(log) for log in [first, *others]) <= 2 << 20
        assert "bytes of this log dropped (it keeps its last 524288 bytes)" in first.tail(1 << 20)
        many = [logs.ContainerLog(budget) for _ in range(60)]  # 2 MiB / 64 is below the floor
        assert budget.limit() == logs.FLOOR
        for log in many:
            log.close()
        assert budget.limit() == (2 << 20) // 4  # the gone ones count no more
    finally:
        for log in [first, *others]:
            log.close()


def counted(log: logs.ContainerLog) -> list[float]:
    """When the reader drains `log` from now on."""
    times: list[float] = []
    drain = log.drain

    def counting(reads: int = 16) -> None:
        times.append(time.monotonic())
        drain(reads)

    log.drain = counting  # type: ignore[method-assign]
    return times


def packet_writer(log: logs.ContainerLog) -> int:
    """A non-blocking writer of `log`'s pipe in packet mode (O_DIRECT): a read takes one write."""
    writer = os.open(f"/proc/self/fd/{log.writer}", os.O_WRONLY | os.O_NONBLOCK)
    fcntl.fcntl(writer, fcntl.F_SETFL, fcntl.fcntl(writer, fcntl.F_GETFL) | os.O_DIRECT)
    return writer


def write_bytes(writers: list[int], seconds: float) -> None:
    """One byte a write into each of `writers`, for `seconds` (a full pipe waits its turn)."""
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        for writer in writers:
            try:
                os.write(writer, b"x")
            except BlockingIOError:
                pass


def test_a_log_costs_the_reader_a_bounded_number_of_reads(reader: None) -> None:
    """However a sandbox writes, here one byte a write into a pipe in packet mode, the reader
    reads its log at most 1,000 times a second."""
    log = logs.ContainerLog()
    drains = counted(log)
    writer = packet_writer(log)
    try:
        write_bytes([writer], 0.5)
        seconds = drains[-1] - drains[0]
        assert len(drains) <= 1000 * seconds * 1.2 + 10, (len(drains), seconds)
        assert len(drains) >= 10  # it was read all along
    finally:
        os.close(writer)
        log.close()


def test_the_logs_together_cost_the_reader_a_bounded_number_of_reads(
    reader: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight sandboxes writing so get at most `READS_PER_SECOND` reads together (here 800:
    at 1,000 a second each, they would get thousands), every one of them its turn."""
    monkeypatch.setattr(logs, "READS_PER_SECOND", 800)
    many = [logs.ContainerLog() for _ in range(8)]
    drains = [counted(log) for log in many]
    writers = [packet_writer(log) for log in many]
    try:
        write_bytes(writers, 0.5)
        every = sorted(t for times in drains for t in times)
        seconds = every[-1] - every[0]
        assert len(every) <= logs.READS_PER_SECOND * seconds * 1.2 + 10, (len(every), seconds)
        assert all(len(times) >= 10 for times in drains), [len(times) for times in drains]
    finally:
        for writer in writers:
            os.close(writer)
        for log in many:
            log.close()
