"""``osb-sync exec -it`` driven on a pseudo-terminal against the local server: its sandboxes'
terminals (a real pty inside the bubblewrap container), reached through the server's proxy.

The CLI runs as a real process whose standard input and output are the slave side of a pty
this test holds the master of, as a person's terminal would: what it types is written to the
master, a window size set on it reaches the CLI as SIGWINCH.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from osb_sync import ApiError, Client, Sandbox
from osb_sync.local import LocalServer
from tests.conformance.execds import real_execd_dir, skip_or_fail, unusable_reason
from tests.local.support import host_pids_with, sleep_marker, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with LocalServer(command_grace=0, unenforced_network_policy="accept") as srv:
        yield srv


@pytest.fixture(scope="module")
def sandbox(server: LocalServer) -> Iterator[Sandbox]:
    with Client(server.api_base) as client, client.create_sandbox() as made:
        yield made


class Terminal:
    """A program on a pseudo-terminal: type into it, read what it shows, wait for its end."""

    def __init__(self, argv: list[str], cols: int = 80, rows: int = 24) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
        env.update(PYTHONPATH=str(REPO), TERM="xterm")
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the terminal is its standard input and output
            try:
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.resize(cols, rows)
        self.shown = b""

    def resize(self, cols: int, rows: int) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, pattern: bytes, timeout: float = 20) -> bytes:
        """Read until ``pattern`` (a regex) shows after what was matched before."""
        deadline = time.monotonic() + timeout
        while (found := re.search(pattern, self.shown)) is None:
            left = deadline - time.monotonic()
            assert left > 0, f"{pattern!r} not shown within {timeout} s: {self.shown[-800:]!r}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:  # EIO: the program ended
                    data = b""
                assert data, f"ended before {pattern!r}: {self.shown[-800:]!r}"
                self.shown += data
        matched = self.shown[: found.end()]
        self.shown = self.shown[found.end() :]
        return matched

    def wait(self, timeout: float = 20) -> int:
        """The program's exit status (draining what it shows meanwhile)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            if select.select([self.fd], [], [], 0.05)[0]:
                try:
                    self.shown += os.read(self.fd, 65536)
                except OSError:
                    pass
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"still running after {timeout} s: {self.shown[-800:]!r}")

    def close(self) -> None:
        os.close(self.fd)


STTY = rb"[0-9a-f]+(?::[0-9a-f]+){10,}\r\n"  # what `stty -g` prints


def stty_line(shown: bytes) -> bytes:
    found = re.search(STTY, shown)
    assert found is not None
    return found[0]


def sleeping(marker: str) -> list[int]:
    """The host pids of `sleep MARKER` (the CLI and its guardian carry the marker too)."""
    found = []
    for pid in host_pids_with(marker):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                found.append(pid)
        except OSError:
            pass
    return found


def cli(server: LocalServer, *args: str) -> list[str]:
    return [sys.executable, "-m", "osb_sync", "--api-base", server.api_base, *args]


def test_exec_it_is_a_terminal(server: LocalServer, sandbox: Sandbox) -> None:
    # `stty -g` before and after: the CLI leaves this terminal as it found it
    command = " ".join(cli(server, "exec", "-it", sandbox.id, "bash"))
    script = f"stty -g; {command}; echo status=$?; stty -g"
    term = Terminal(["/bin/sh", "-c", script], cols=100, rows=30)
    try:
        before = stty_line(term.expect(STTY))
        term.expect(rb"[#$] ")  # the sandbox's prompt
        term.type("echo $((6*7))\r")
        term.expect(rb"\r42\r\n")  # after the bracketed-paste mode switch
        term.type("tty\r")
        term.expect(rb"\r/dev/pts/[0-9]+\r\n")
        term.type("stty size\r")
        term.expect(rb"\r30 100\r\n")  # the size it started with
        term.resize(150, 50)  # SIGWINCH to the CLI, a resize to the sandbox
        time.sleep(0.3)
        term.type("stty size\r")
        term.expect(rb"\r50 150\r\n")
        term.type("sleep 30; echo slept\r")
        term.expect(rb"sleep 30; echo slept\r\n")
        time.sleep(0.5)
        started = time.monotonic()
        term.type("\x03")  # Ctrl-C: the sandbox's terminal makes it SIGINT, to the sleep
        term.type("echo al''ive\r")
        shown = term.expect(rb"\ralive\r\n", timeout=10)
        assert time.monotonic() - started < 10 and b"\nslept" not in shown
        term.type("sleep 31\r")
        term.expect(rb"sleep 31\r\n")
        time.sleep(0.3)
        term.type("\x1a")  # Ctrl-Z: job control, the sandbox's terminal is bash's own
        term.expect(rb"Stopped +sleep 31")
        term.type("fg\r")  # back in the foreground, where Ctrl-C ends it
        term.expect(rb"fg\r\n.*sleep 31\r\n")
        time.sleep(0.3)
        term.type("\x03")
        term.type("echo ba''ck\r")
        term.expect(rb"\rback\r\n")
        term.type("\x04")  # Ctrl-D: EOF to bash, which exits 0
        term.expect(rb"status=0\r\n")
        after = stty_line(term.expect(STTY))
        assert term.wait() == 0  # the sh script's status: its last stty
        assert after == before
    finally:
        term.close()


def test_exec_it_exits_with_the_remote_status(server: LocalServer, sandbox: Sandbox) -> None:
    term = Terminal(cli(server, "exec", "-it", sandbox.id))
    try:
        term.expect(rb"[#$] ")
        term.type("exit 3\r")
        assert term.wait() == 3
    finally:
        term.close()


def test_a_killed_cli_leaves_nothing_running(server: LocalServer, sandbox: Sandbox) -> None:
    marker = sleep_marker(600)
    term = Terminal(cli(server, "exec", "-it", sandbox.id, "sleep", marker))
    try:
        assert wait_for(lambda: sleeping(marker), timeout=20), term.shown[-500:]
        os.kill(term.pid, signal.SIGKILL)
        killed = time.monotonic()
        os.waitpid(term.pid, 0)
        # the CLI's guardian sees its pipe end, and deletes the session: execd kills its group
        # execd keeps a session whose client went away: the CLI's guardian deletes it
        assert wait_for(lambda: not sleeping(marker), timeout=15)
        print(f"session reaped {time.monotonic() - killed:.2f} s after SIGKILL")
    finally:
        term.close()


def test_run_it_is_a_terminal_in_a_new_sandbox_it_deletes(server: LocalServer) -> None:
    with Client(server.api_base) as client:
        before = {s.id for s in client.list_sandboxes()}
        term = Terminal(cli(server, "run", "-it"))
        try:
            term.expect(rb"[#$] ")
            term.type("echo $((6*7)); exit 4\r")
            term.expect(rb"\r42\r\n")
            assert term.wait() == 4
        finally:
            term.close()
        assert {s.id for s in client.list_sandboxes()} == before


def the_cli(parent: int, marker: str) -> int | None:
    """The pid of the CLI started by `parent` with `marker` in its argv (not its guardian)."""
    for pid in host_pids_with(marker):
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == parent:
            return pid
    return None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_leaves_the_terminal_as_it_was(
    server: LocalServer, sandbox: Sandbox, signum: int
) -> None:
    marker = sleep_marker(600)
    command = " ".join(cli(server, "exec", "-it", sandbox.id, "sleep", marker))
    term = Terminal(["/bin/sh", "-c", f"stty -g; {command}; echo status=$?; stty -g"])
    try:
        before = stty_line(term.expect(STTY))
        assert wait_for(lambda: sleeping(marker), timeout=20), term.shown[-500:]
        pid = the_cli(term.pid, marker)
        assert pid is not None
        os.kill(pid, signum)
        term.expect(rb"status=%d\r?\n" % (128 + signum))
        assert stty_line(term.expect(STTY)) == before
        assert term.wait() == 0
        assert wait_for(lambda: not sleeping(marker), timeout=15)  # the session was deleted
    finally:
        term.close()


def test_a_broken_pipe_on_output_ends_the_cli_cleanly(
    server: LocalServer, sandbox: Sandbox
) -> None:
    marker = sleep_marker(600)
    command = " ".join(cli(server, "exec", "-it", sandbox.id, f"'sleep {marker} & yes'"))
    script = f"stty -g; {command} | head -c 5 >/dev/null; echo done; stty -g"
    term = Terminal(["/bin/sh", "-c", script])
    try:
        before = stty_line(term.expect(STTY))
        shown = term.expect(rb"done\r?\n")
        assert stty_line(term.expect(STTY)) == before
        assert b"Traceback" not in shown, shown
        assert term.wait() == 0
        assert wait_for(lambda: not sleeping(marker), timeout=15)  # the session was deleted
    finally:
        term.close()


def test_a_killed_run_it_leaves_no_sandbox(server: LocalServer) -> None:
    # run -it made the sandbox: its guardian deletes it too when the CLI is killed
    with Client(server.api_base) as client:
        before = {s.id for s in client.list_sandboxes()}
        term = Terminal(cli(server, "run", "-it"))
        try:
            term.expect(rb"[#$] ")
            assert {s.id for s in client.list_sandboxes()} != before
            os.kill(term.pid, signal.SIGKILL)
            os.waitpid(term.pid, 0)
        finally:
            term.close()
        assert wait_for(lambda: {s.id for s in client.list_sandboxes()} == before, timeout=20)


def test_the_proxy_relays_a_terminal_with_its_refusals(
    server: LocalServer, sandbox: Sandbox
) -> None:
    with sandbox.pty.open("echo hi; sleep 30") as first:
        assert b"hi" in (first.read(timeout=20) or b"")
        with pytest.raises(ApiError) as caught:
            sandbox.pty.connect(first.session_id)
        assert (caught.value.status_code, caught.value.code) == (409, "ALREADY_CONNECTED")
        second = sandbox.pty.connect(first.session_id, takeover=True)
        assert first.read_all(10) == b"" and first.ended == "taken over"
        second.close()
    wrong = Sandbox.from_execd(sandbox.execd_url, headers={"X-EXECD-ACCESS-TOKEN": "wrong"})
    with wrong, pytest.raises(ApiError) as refused:
        wrong.pty.connect("any", timeout=10)
    assert refused.value.status_code == 401


# A process of the sandbox that answers a WebSocket handshake with an endless head, on 8081.
ENDLESS_HEAD = """
import socket
server = socket.create_server(("127.0.0.1", 8081))
while True:
    conn, _ = server.accept()
    try:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\\r\\n" + b"X-Filler: " + b"a" * 200000)
    except OSError:
        pass
"""


def test_the_proxy_bounds_a_hostile_handshake_answer(server: LocalServer, sandbox: Sandbox) -> None:
    sandbox.files.write("/tmp/endless.py", ENDLESS_HEAD)
    sandbox.commands.start("python3 /tmp/endless.py")
    url = sandbox.execd_url.rsplit("/", 1)[0] + "/8081/ws"
    headers = {
        **sandbox.execd_headers,
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    deadline = time.monotonic() + 20
    while True:
        answer = requests.get(url, headers=headers, timeout=20)
        if answer.status_code != 502 or "Connection refused" not in answer.text:
            break  # not the port still closed
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.1)
    assert answer.status_code == 502 and "over 16384 bytes" in answer.text


def test_the_real_execd_in_a_sandbox_through_the_proxy() -> None:
    folder = real_execd_dir()
    reason = unusable_reason(folder)
    if reason is not None:
        skip_or_fail(reason)
    assert folder is not None
    execd = str(folder / "execd")
    with LocalServer(command_grace=0, execd=execd, unenforced_network_policy="accept") as srv:
        with Client(srv.api_base) as client, client.create_sandbox() as made:
            with made.pty.open() as term:
                term.send("echo $((6*7)); tty\n")
                shown = b""
                deadline = time.monotonic() + 20
                while not re.search(rb"\r\n42\r\n/dev/pts/[0-9]+\r\n", shown):
                    assert time.monotonic() < deadline, shown
                    shown += term.read(timeout=1) or b""
                # the real execd may send exit before a process's last output: none is checked
                term.send("exit 3\n")
                term.read_all(20)
            assert (term.exit_code, term.ended) == (3, "exited")
            session = made.pty.create("sleep 30")
            first = made.pty.connect(session)
            with pytest.raises(ApiError) as caught:
                made.pty.connect(session)
            assert caught.value.status_code == 409
            made.pty.connect(session, takeover=True).close()
            assert first.read_all(10) == b"" and first.ended in ("taken over", "dropped")
            made.pty.delete(session)
