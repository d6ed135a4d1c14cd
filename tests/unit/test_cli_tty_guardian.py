"""The ``exec -it`` guardian (``_cli_tty.start_guardian``): a forked process that deletes the
terminal session (and with ``run -it`` the sandbox) when the CLI dies, and never outlives
that by more than ``GUARD_LIMIT`` seconds, even when the delete never returns (a server that
does not answer, or a lock some thread of the CLI held when it forked)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from osb_sync import _cli_tty

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the guardian needs fork")


class Recorder:
    """A stand-in sandbox whose deletes write to a pipe (the guardian is another process)."""

    def __init__(self, hang: bool = False) -> None:
        self.read_end, self.write_end = os.pipe()
        self.hang = hang
        self.pty = self

    def delete(self, session_id: str | None = None) -> bool:
        os.write(self.write_end, f"{session_id or 'sandbox'}\n".encode())
        while self.hang:
            time.sleep(60)
        return True

    def said(self) -> str:
        os.close(self.write_end)
        data = b""
        while chunk := os.read(self.read_end, 100):
            data += chunk
        os.close(self.read_end)
        return data.decode()


def exit_within(pid: int, seconds: float) -> int | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.02)
    return None


def start(sandbox: Any, owned: bool) -> tuple[int, int]:
    write_end = _cli_tty.start_guardian(sandbox, "s1", owned)
    assert write_end is not None
    return write_end, _cli_tty._guardians.pop(write_end)


def test_a_dead_cli_has_its_session_and_its_own_sandbox_deleted() -> None:
    sandbox = Recorder()
    write_end, pid = start(sandbox, owned=True)
    os.close(write_end)  # what the CLI's death does
    assert exit_within(pid, 10) is not None
    assert sandbox.said() == "s1\nsandbox\n"


def test_a_cli_that_dealt_with_it_has_nothing_deleted() -> None:
    sandbox = Recorder()
    write_end, pid = start(sandbox, owned=False)
    _cli_tty._guardians[write_end] = pid
    _cli_tty.stop_guardian(write_end)
    assert sandbox.said() == ""


def test_a_guardian_whose_delete_never_returns_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cli_tty, "GUARD_LIMIT", 1)
    sandbox = Recorder(hang=True)
    write_end, pid = start(sandbox, owned=False)
    os.close(write_end)
    status = exit_within(pid, 10)
    if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert status is not None, "the guardian outlived the CLI with its delete hanging"
    assert sandbox.said() == "s1\n"
