"""Large inputs are streamed or capped: the server's memory stays flat (tight figures in
benchmarks/bench_local_hardening.py; the bounds here are generous)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import requests

from osb_sync.local import LocalServer
from osb_sync.local.execd.output import LOG_LIMIT, dropped_marker
from osb_sync.local.host import bwrap
from tests.local.rawhttp import read_answer
from tests.local.support import Box, texts, wait_for

MB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


@contextmanager
def peak_growth() -> Iterator[Callable[[], int]]:
    """Sample this process's RSS (the server runs in it) while the block runs."""
    base = rss()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield lambda: peak[0] - base
    finally:
        done.set()
        sampler.join()


def fill(path: str, size: int, line: bytes = b"old text here\n") -> None:
    with open(path, "wb") as handle:
        block = line * (MB // len(line))
        for _ in range(size // len(block)):
            handle.write(block)


def test_replace_in_a_large_file_is_streamed(box: Box) -> None:
    path = os.path.join(box.dir, "big.txt")
    fill(path, 96 * MB)
    ids = bwrap.probe().ids
    if ids is not None:  # written by the host: give it to the sandbox's root
        os.chown(path, ids.uid, ids.gid)
    with peak_growth() as growth:
        answer = box.call(
            "POST",
            "/files/replace",
            params={"verbose": "true"},
            json={"big.txt": {"old": "old", "new": "new!"}},
        )
    assert answer.status_code == 200, answer.text
    lines = 96 * MB // len(b"old text here\n") // (MB // 14) * (MB // 14)
    assert answer.json()["big.txt"]["replacedCount"] == lines
    with open(path, "rb") as handle:
        assert handle.read(30) == b"new! text here\n" * 2
    assert growth() < 40 * MB, growth()


def execd_peak(box: Box) -> int:
    """The peak RSS of the sandbox's execd (a command's parent), in bytes."""
    line = texts(box.command("grep VmHWM /proc/$PPID/status"))[0]
    return int(line.split()[1]) * 1024


def test_command_logs_are_bounded(box: Box) -> None:
    before = execd_peak(box)
    started = box.command("head -c 100000000 /dev/zero | tr '\\0' x > /dev/stdout", background=True)
    command_id = started[0]["text"]
    status = f"/command/status/{command_id}"
    with peak_growth() as growth:
        assert wait_for(lambda: not box.call("GET", status).json()["running"], timeout=60)
        with box.call("GET", f"/command/{command_id}/logs", stream=True) as answer:
            received = b"".join(answer.iter_content(1 << 16))
    # The newest LOG_LIMIT bytes, after the marker (the sandbox's execd holds them, not us).
    marker = dropped_marker(100_000_000 - LOG_LIMIT)
    assert received == marker + b"x" * LOG_LIMIT
    assert answer.headers["EXECD-COMMANDS-TAIL-CURSOR"] == "100000000"
    assert growth() < 40 * MB, growth()
    assert execd_peak(box) - before < 40 * MB, (before, execd_peak(box))


def test_a_part_header_without_end_is_refused_early(box: Box) -> None:
    host, port = box.base.split("//")[1].split("/")[0].split(":")
    path = "/" + box.base.split("//")[1].split("/", 1)[1] + "/files/upload"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"X-EXECD-ACCESS-TOKEN: {box.headers['X-EXECD-ACCESS-TOKEN']}\r\n"
        "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 200000000\r\n\r\n"
        "--b\r\nContent-Disposition: form-data; name=file; filename=f\r\nX-Junk: "
    )
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(head.encode() + b"y" * MB)  # and never the rest: the answer comes first
        answer = read_answer(sock)
    assert answer.status == 400 and "header" in answer.json()["message"]


def test_a_flood_on_the_reply_pipe_restarts_the_worker(box: Box) -> None:
    flood = "import os, sys\nos.write(int(sys.argv[2]), b'x' * (32 << 20))"
    started = time.monotonic()
    events = box.code(flood)
    assert time.monotonic() - started < 30
    errors = [e for e in events if e["type"] == "error"]
    assert errors and errors[0]["error"]["ename"] == "DeadKernelError"
    assert events[-1]["type"] == "execution_complete"
    assert "".join(texts(box.code("print(6 * 7)"))) == "42\n"


def test_a_huge_result_is_an_error_not_a_huge_event(box: Box) -> None:
    events = box.code("'x' * (8 << 20)")
    error = next(e for e in events if e["type"] == "error")["error"]
    assert error["ename"] == "WorkerError" and "print it instead" in error["evalue"]
    assert "".join(texts(box.code("print(1)"))) == "1\n"  # the same worker goes on


def test_large_json_bodies_do_not_multiply(local: LocalServer) -> None:
    many_values = b"[" + b"[]," * (300 * 1024) + b"[]]"  # 900 KiB: too many values
    long_strings = ("[" + ",".join(['"' + "x" * 50 + '"'] * 19_000) + "]").encode()
    url = f"{local.api_base}/sandboxes"
    headers = {"Content-Type": "application/json"}

    def post(body: bytes) -> requests.Response:
        return requests.post(url, data=body, headers=headers, timeout=60)

    with peak_growth() as growth, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, [many_values, long_strings] * 4))
    statuses = [a.status_code for a in answers]
    assert statuses == [413, 422] * 4
    assert all(len(a.content) < 4096 for a in answers)  # the body is not echoed back
    assert growth() < 64 * MB, growth()
    too_big = requests.post(url, data=b"[" + b"0," * MB + b"0]", headers=headers, timeout=60)
    assert too_big.status_code == 413
