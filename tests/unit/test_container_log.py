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
    log = logs.ContainerLog(limit=100)
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
    log = logs.ContainerLog(limit=4096)
    try:
        os.write(log.writer, b"first\nsecond\n")
        assert log.tail(4096) == "first\nsecond\n"
        assert log.tail(8) == "second\n"
        log.release_writer()
        assert log.tail(4096) == "first\nsecond\n"  # EOF keeps what was read
    finally:
        log.close()


def test_the_reader_drains_a_flood_into_a_bounded_log(reader: None) -> None:
    log = logs.ContainerLog(limit=64 * 1024)
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
    log = logs.ContainerLog(limit=1 << 20)
    try:
        fcntl.fcntl(log.writer, fcntl.F_SETPIPE_SZ, 1 << 20)
        os.write(log.writer, b"y\n" * (1 << 17))  # 256 KiB, four reads
        log.drain(1)
        assert len(log._open_chunk) + sum(map(len, log._chunks)) == logs.READ_SIZE
        assert log.tail(1 << 20) == "y\n" * (1 << 17)
    finally:
        log.close()
