"""``sandbox.pty`` against our execd's ``/pty`` routes on loopback (its routes served in this
process, its shells on real pseudo-terminals of this machine), and against fake execds that
lie: a redirect to another origin, frames that break the rules, a certificate nobody trusts.

What the terminal must do is the issue's list: ``echo $((6*7))`` prints 42, ``tty`` a
``/dev/pts`` path, ``exit 3`` is exit status 3, a resize reaches ``stty size``, Ctrl-C stops a
``sleep`` but not the shell; output has no gap and no repeat across a reattach; a second
client gets 409, then takes over.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from osb_sync import (
    MAX_OUTPUT_BYTES,
    ApiError,
    OutputLimitExceeded,
    Sandbox,
    SandboxTimeoutError,
    TransportError,
)
from osb_sync import _websocket as ws
from osb_sync._pty import PtyConnection
from osb_sync.local.execd.router import ExecdApp
from osb_sync.local.execd.runner import SandboxRuntime
from osb_sync.local.http import httpd
from osb_sync.local.http.exchange import Exchange, HttpError
from tests.conformance.execds import free_port, real_execd_dir, skip_or_fail, unusable_reason

pytestmark = pytest.mark.ours_only("our execd and the real one are both started here")

TOKEN = "pty-test-token"
HEADERS = {"X-EXECD-ACCESS-TOKEN": TOKEN}


@pytest.fixture(scope="module", params=["ours", "real"])
def execd_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """An execd on 127.0.0.1 behind a token: ours (its routes served in this process) or the
    real one (shared/opensandbox-execd's binary, which has served /pty since 1.0.10)."""
    home = tmp_path_factory.mktemp("pty")
    if request.param == "real":
        yield from real_execd(home)
        return
    yield from our_execd(home)


@pytest.fixture(scope="module")
def ours_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Our execd only: for what it does with hostile input (the real one may differ)."""
    yield from our_execd(tmp_path_factory.mktemp("pty"))


def our_execd(home: Path) -> Iterator[str]:
    """Our execd's routes served in this process on 127.0.0.1, behind the token."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C"}
    runtime = SandboxRuntime(home, home, env)
    app = ExecdApp(runtime, ping_interval=3.0, command_grace=0.0)

    def route(ex: Exchange) -> None:
        if ex.headers.get("X-EXECD-ACCESS-TOKEN") != TOKEN:
            raise HttpError(401, {"error": "Unauthorized"})
        app.handle(ex, ex.path)

    hosts = httpd.host_names("127.0.0.1", ())
    server = httpd.HTTPServer(("127.0.0.1", 0), route, httpd.Limits(), hosts)
    thread = threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    app.close()
    runtime.close()
    server.shutdown()
    server.server_close()


def real_execd(home: Path) -> Iterator[str]:
    """The real execd binary on a free port (no Jupyter: terminals need none)."""
    folder = real_execd_dir()
    reason = unusable_reason(folder)
    if reason is not None:
        skip_or_fail(reason)
    assert folder is not None
    port = free_port()
    proc = subprocess.Popen(
        [str(folder / "execd"), "--port", str(port), "--access-token", TOKEN],
        cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(url + "/ping", headers=HEADERS, timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "execd did not start"
            time.sleep(0.05)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def sandbox(execd_url: str) -> Iterator[Sandbox]:
    with Sandbox.from_execd(execd_url, headers=HEADERS, read_timeout=10) as handle:
        yield handle


def read_until(conn: PtyConnection, done: Callable[[bytes], bool], timeout: float = 15) -> bytes:
    """Output until ``done(all so far)``; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    seen = b""
    while not done(seen):
        left = deadline - time.monotonic()
        assert left > 0, f"not seen within {timeout} s: {seen[-500:]!r}"
        data = conn.read(left)
        assert data, f"the connection ended ({conn.ended}): {seen[-500:]!r}"
        seen += data
    return seen


def connect(sandbox: Sandbox, session: str, **options: Any) -> PtyConnection:
    """``sandbox.pty.connect``, again on 409 for up to 5 s: execd lets go of a client that
    went away once it notices (the real one once the client's close came back)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return sandbox.pty.connect(session, **options)
        except ApiError as exc:
            if exc.status_code != 409 or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# The real execd may send `exit` before the last output of a process that ends at once (its
# output reader races its waiter): commands whose output is checked end with a sleep.
LINGER = "; sleep 0.3"


def test_a_shell_on_a_real_terminal(sandbox: Sandbox) -> None:
    with sandbox.pty.open() as conn:
        conn.send("echo $((6*7)); tty\n")
        # the typed line is echoed too: the answer is 42 on a line of its own, then the tty
        # (after "\r\n", or after a "\r" that ends bash's bracketed-paste switch where it has one)
        read_until(conn, lambda s: re.search(rb"[\r\n]42\r\n/dev/pts/[0-9]+\r\n", s) is not None)
        conn.send("exit 3\n")
        conn.read_all(15)
        assert (conn.exit_code, conn.ended) == (3, "exited")


def test_a_resize_reaches_stty_size(sandbox: Sandbox) -> None:
    with sandbox.pty.open(size=(132, 43)) as conn:
        conn.send("stty size\n")
        read_until(conn, lambda s: b"43 132" in s)
        conn.resize(100, 30)
        conn.send("stty size\n")
        read_until(conn, lambda s: b"30 100" in s)


def test_ctrl_c_interrupts_a_sleep_not_the_shell(sandbox: Sandbox) -> None:
    with sandbox.pty.open() as conn:
        conn.send("sleep 30; echo slept\n")
        read_until(conn, lambda s: b"sleep 30" in s)
        time.sleep(0.3)
        started = time.monotonic()
        conn.send("\x03")
        conn.send("echo al''ive\n")
        seen = read_until(conn, lambda s: b"alive" in s)
        assert time.monotonic() - started < 10
        assert not re.search(rb"[\r\n]slept\r\n", seen) and conn.ended is None


def test_a_command_environment_and_directory(sandbox: Sandbox) -> None:
    command = "echo $GREETING; pwd" + LINGER
    with sandbox.pty.open(command, cwd="made/here", env={"GREETING": "hi there"}) as conn:
        seen = conn.read_all(15)
    assert b"hi there" in seen and b"/made/here" in seen, (seen, conn.ended, conn.error)
    assert conn.exit_code == 0


def test_pipe_mode_has_no_terminal(sandbox: Sandbox) -> None:
    with sandbox.pty.open("tty; echo err >&2" + LINGER, pipe=True) as conn:
        seen = conn.read_all(15)
    assert b"not a tty" in seen and b"err" in seen
    assert conn.exit_code == 0  # the last command's


def test_output_has_no_gap_and_no_repeat_across_a_reattach(sandbox: Sandbox) -> None:
    lines = 400
    script = f"for i in $(seq 1 {lines}); do echo line$i; sleep 0.002; done; sleep 0.5"
    expected = b"".join(b"line%d\n" % i for i in range(1, lines + 1))
    with sandbox.pty.open(script, pipe=True) as conn:
        first = read_until(conn, lambda s: b"line50\n" in s)
        # the connection drops (no close handshake) while output goes on
        conn._ws.abort()  # type: ignore[union-attr]
        while data := conn.read(5):
            first += data  # what was in flight before the drop
        assert conn.ended == "dropped"
        time.sleep(0.3)
        deadline = time.monotonic() + 5
        while True:  # execd lets go of a holder whose TCP closed once it notices
            try:
                conn.reconnect()
                break
            except ApiError as exc:
                assert exc.status_code == 409 and time.monotonic() < deadline
                time.sleep(0.05)
        rest = conn.read_all(20)
    assert first + rest == expected
    assert conn.lost == 0 and conn.offset == len(expected)


def test_a_second_client_gets_409_then_takes_over(sandbox: Sandbox) -> None:
    with sandbox.pty.open() as first:
        first.send("echo one\n")
        read_until(first, lambda s: b"one\r\n" in s)
        with pytest.raises(ApiError) as caught:
            sandbox.pty.connect(first.session_id)
        assert (caught.value.status_code, caught.value.code) == (409, "ALREADY_CONNECTED")
        second = sandbox.pty.connect(first.session_id, takeover=True)
        try:
            assert first.read_all(10) is not None
            assert first.ended == "taken over"
            second.send("echo two\n")
            seen = read_until(second, lambda s: b"two\r\n" in s)
            assert b"one" in seen  # the replay from offset 0
        finally:
            second.close()


def test_status_and_delete(sandbox: Sandbox) -> None:
    session = sandbox.pty.create("sleep 30")
    assert sandbox.pty.status(session) == (session, False, 0)  # dormant until connected
    conn = sandbox.pty.connect(session)
    assert sandbox.pty.status(session).running
    assert sandbox.pty.delete(session) is True
    assert conn.read_all(10) == b""
    assert sandbox.pty.delete(session) is False
    with pytest.raises(ApiError) as caught:
        sandbox.pty.connect(session)
    assert caught.value.status_code == 404


def test_a_process_that_exited_is_launched_again_and_offsets_go_on(sandbox: Sandbox) -> None:
    session = sandbox.pty.create("echo run" + LINGER)
    try:
        first = sandbox.pty.connect(session, pipe=True)
        assert first.read_all(10) == b"run\n"
        again = connect(sandbox, session, since=first.offset, pipe=True)
        assert again.read_all(10) == b"run\n" and again.offset == 8
    finally:
        sandbox.pty.delete(session)


def test_a_wrong_token_is_refused_before_the_upgrade(execd_url: str) -> None:
    with Sandbox.from_execd(execd_url, headers={"X-EXECD-ACCESS-TOKEN": "wrong"}) as handle:
        conn = PtyConnection(handle._execd, "x")  # type: ignore[attr-defined]
        with pytest.raises(ApiError) as caught:
            conn.attach(timeout=5)
    assert caught.value.status_code == 401


# -- fake execds ---------------------------------------------------------------------------------


class FakeExecd:
    """A loopback server that answers each connection with ``answer(head) -> bytes``."""

    def __init__(self, answer: Callable[[bytes], bytes], tls: ssl.SSLContext | None = None):
        self.answer = answer
        self.heads: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.tls = tls
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            try:
                if self.tls is not None:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                conn.settimeout(5)
                head = b""
                while b"\r\n\r\n" not in head:
                    data = conn.recv(4096)
                    if not data:
                        break
                    head += data
                self.heads.append(head)
                conn.sendall(self.answer(head))
                time.sleep(0.5)
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self.listener.close()


def upgraded(head: bytes, *frames: bytes) -> bytes:
    key = re.search(rb"Sec-WebSocket-Key: (\S+)", head)
    assert key is not None
    accept = ws.accept_key(key[1].decode()).encode()
    return (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n" + b"".join(frames)
    )


CONNECTED = ws.encode_frame(ws.OP_TEXT, b'{"type":"connected","session_id":"s","mode":"pty"}\n')


def test_the_token_goes_only_to_execds_origin() -> None:
    elsewhere = FakeExecd(lambda head: b"HTTP/1.1 500 X\r\nContent-Length: 0\r\n\r\n")
    redirect = (
        f"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:{elsewhere.port}/pty/s/ws"
        "\r\nContent-Length: 0\r\n\r\n"
    ).encode()
    execd = FakeExecd(lambda head: redirect)
    try:
        with Sandbox.from_execd(f"http://127.0.0.1:{execd.port}", headers=HEADERS) as handle:
            with pytest.raises(ApiError) as caught:
                handle.pty.connect("s", timeout=5)
        assert caught.value.status_code == 307 and "not followed" in str(caught.value)
        assert TOKEN not in str(caught.value)
        assert TOKEN.encode() in execd.heads[0]  # execd's origin has it
        time.sleep(0.2)
        assert elsewhere.heads == []  # nothing else was even connected to
    finally:
        execd.close()
        elsewhere.close()


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        (bytes([0x82, 0x7F]) + (1 << 40).to_bytes(8, "big"), "(at most"),  # 1 TiB announced
        (bytes([0x82, 0x82, 1, 2, 3, 4, 5, 6]), "masked"),  # a server must not mask
        (ws.encode_frame(ws.OP_BINARY, b"\x03\x00"), "replay"),
        (ws.encode_frame(ws.OP_TEXT, b'{"type":"exit","exit_code":"0"}'), "exit_code"),
    ],
)
def test_a_lying_execd_ends_the_connection_with_an_error(frame: bytes, words: str) -> None:
    execd = FakeExecd(lambda head: upgraded(head, CONNECTED, frame))
    try:
        with Sandbox.from_execd(f"http://127.0.0.1:{execd.port}", headers=HEADERS) as handle:
            conn = handle.pty.connect("s", timeout=5)
            assert conn.read_all(5) == b""
        assert conn.ended == "error" and conn.exit_code is None
        assert words in (conn.error or ""), conn.error
    finally:
        execd.close()


def test_a_reattach_asks_execd_for_the_next_byte() -> None:
    output = ws.encode_frame(ws.OP_BINARY, b"\x03" + (7).to_bytes(8, "big") + b"hello")
    execd = FakeExecd(lambda head: upgraded(head, output, CONNECTED))
    try:
        with Sandbox.from_execd(f"http://127.0.0.1:{execd.port}", headers=HEADERS) as handle:
            conn = handle.pty.connect("s", since=7, pipe=True)
            assert conn.read(5) == b"hello" and conn.offset == 12
            assert conn.read_all(5) == b"" and conn.ended == "dropped"
            conn.reconnect(takeover=True)
        first, second = (head.split(b"\r\n", 1)[0] for head in execd.heads)
        assert first == b"GET /pty/s/ws?pty=0&since=7 HTTP/1.1"
        assert second == b"GET /pty/s/ws?pty=0&since=12&takeover=1 HTTP/1.1"
    finally:
        execd.close()


def test_a_server_proxy_that_closes_with_1008_gets_a_hint() -> None:
    # the released server proxy turns execd's 409 on the handshake into an accepted socket
    # closed with 1008 and no reason (opensandbox-1.1.1.md 2.2)
    close = ws.encode_frame(ws.OP_CLOSE, ws.close_payload(1008))
    execd = FakeExecd(lambda head: upgraded(head, close))
    try:
        with Sandbox.from_execd(f"http://127.0.0.1:{execd.port}", headers=HEADERS) as handle:
            with pytest.raises(TransportError, match="takeover=True") as caught:
                handle.pty.connect("s", timeout=5)
        assert "1008" in str(caught.value)
    finally:
        execd.close()


def test_a_connect_with_no_connected_frame_times_out() -> None:
    execd = FakeExecd(lambda head: upgraded(head))
    try:
        with Sandbox.from_execd(f"http://127.0.0.1:{execd.port}", headers=HEADERS) as handle:
            started = time.monotonic()
            with pytest.raises((SandboxTimeoutError, TransportError)):
                handle.pty.connect("s", timeout=0.3)
            assert time.monotonic() - started < 5
    finally:
        execd.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed (tests/run.py installs it)")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_tls_is_verified_as_the_clients_http_calls_are(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    execd = FakeExecd(lambda head: upgraded(head, CONNECTED), tls=context)
    url = f"https://127.0.0.1:{execd.port}"
    try:
        with Sandbox.from_execd(url, headers=HEADERS) as handle:
            with pytest.raises(TransportError, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
                handle.pty.connect("s", timeout=5)
        assert execd.heads == [] or TOKEN.encode() not in b"".join(execd.heads)
        session = requests.Session()
        session.verify = str(cert)
        session.trust_env = False  # REQUESTS_CA_BUNDLE would win over verify, as in requests
        with Sandbox.from_execd(url, headers=HEADERS, session=session) as handle:
            conn = handle.pty.connect("s", timeout=5)
            conn.close()
        assert TOKEN.encode() in execd.heads[-1]
    finally:
        execd.close()


# -- what a client sends our execd is hostile too ----------------------------------------------


def raw_socket(url: str, path: str) -> tuple[socket.socket, ws.WebSocket]:
    """A handshake made by hand: the socket and a client WebSocket over it."""
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = ws.new_key()
    sock.sendall(ws.handshake_request(f"127.0.0.1:{port}", path, key, HEADERS))
    answer = ws.read_answer(sock.recv)
    assert answer.status == 101, answer
    ws.check_upgrade(answer, key)
    reader = ws.prefixed(answer.rest, sock.recv)
    return sock, ws.WebSocket(sock, reader, client=True, max_message=1 << 21)


def messages_until(client: ws.WebSocket, want: bytes) -> list[bytes]:
    seen = []
    while not any(want in m for m in seen):
        seen.append(client.recv()[1])
    return seen


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (bytes([0x82, 0xFF]) + (1 << 40).to_bytes(8, "big") + b"mask", 1009),  # 1 TiB announced
        (ws.encode_frame(ws.OP_BINARY, b"\x00ls\n"), 1002),  # unmasked from a client
        (bytes([0xC2, 0x80]) + b"mask", 1002),  # RSV bits
    ],
)
def test_our_execd_closes_on_a_frame_that_breaks_the_rules(
    ours_url: str, frame: bytes, code: int
) -> None:
    sandbox = Sandbox.from_execd(ours_url, headers=HEADERS)
    session = sandbox.pty.create("sleep 30")
    try:
        sock, client = raw_socket(ours_url, f"/pty/{session}/ws")
        with sock:
            messages_until(client, b'"connected"')
            sock.sendall(frame)
            with pytest.raises(ws.Closed) as caught:
                while True:
                    client.recv()
            assert caught.value.code == code
        assert sandbox.pty.status(session).running  # the session is still there
    finally:
        sandbox.pty.delete(session)


def test_our_execd_ignores_bad_control_messages(ours_url: str) -> None:
    sandbox = Sandbox.from_execd(ours_url, headers=HEADERS)
    session = sandbox.pty.create()
    try:
        sock, client = raw_socket(ours_url, f"/pty/{session}/ws")
        with sock:
            messages_until(client, b'"connected"')
            for text in (
                '{"type":"resize","cols":-1,"rows":5}',
                '{"type":"resize","cols":true,"rows":5}',
                '{"type":"resize","cols":99999999999,"rows":5}',
                '{"type":"signal","signal":"SIGSTOP"}',
                '{"type":"stdin","data":7}',
                "not json",
                "[" * 100000,
                '{"type":"nope"}',
            ):
                client.send_text(text)
            assert b"INVALID_FRAME" in b"".join(messages_until(client, b"INVALID_FRAME"))
            client.send_binary(b"\x00stty size\n")
            assert b"24 80" in b"".join(messages_until(client, b"24 80"))
            client.send_text('{"type":"ping"}')
            assert b'{"type":"pong"}\n' in messages_until(client, b"pong")
    finally:
        sandbox.pty.delete(session)


def test_our_execd_makes_a_cwd_beneath_the_sandboxs_home(ours_url: str) -> None:
    sandbox = Sandbox.from_execd(ours_url, headers=HEADERS)
    with sandbox.pty.open("pwd", cwd="~/deep/er", pipe=True) as conn:
        shown = conn.read_all(15)
    assert shown.endswith(b"/deep/er\n") and conn.exit_code == 0
    home = shown[: -len(b"/deep/er\n")].decode()
    assert home != os.path.expanduser("~") and os.path.isdir(home + "/deep/er")


# -- attacks (issue 46's review) ---------------------------------------------------------------


def gone(pid: int) -> bool:
    """Whether process `pid` is gone (or a zombie: dead, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_delete_kills_the_shells_background_jobs_too(ours_url: str) -> None:
    # an interactive shell on a terminal has job control: each job is a process group of its
    # own, so killing the shell's group alone left `sleep &` running after the delete
    sandbox = Sandbox.from_execd(ours_url, headers=HEADERS)
    session = sandbox.pty.create()
    conn = sandbox.pty.connect(session)
    conn.send("sleep 1000 & echo pid=$!; (trap '' HUP; exec sleep 1001) & echo pid=$!\n")
    seen = read_until(conn, lambda seen: len(re.findall(rb"pid=(\d+)", seen)) >= 2)
    pids = [int(pid) for pid in re.findall(rb"pid=(\d+)", seen)]
    conn.close()
    assert not any(gone(pid) for pid in pids)
    assert sandbox.pty.delete(session)
    deadline = time.monotonic() + 5
    while not all(gone(pid) for pid in pids):
        if time.monotonic() > deadline:
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            pytest.fail(f"left running after the delete: {[p for p in pids if not gone(p)]}")
        time.sleep(0.05)


def test_a_client_that_stops_reading_does_not_hold_up_delete_or_takeover(ours_url: str) -> None:
    sandbox = Sandbox.from_execd(ours_url, headers=HEADERS, read_timeout=20)
    session = sandbox.pty.create("yes")
    sock, _client = raw_socket(ours_url, f"/pty/{session}/ws")
    try:
        time.sleep(0.5)  # execd's send to this client now blocks: its buffers are full
        started = time.monotonic()
        taker = sandbox.pty.connect(session, takeover=True, timeout=15)
        assert time.monotonic() - started < 10  # execd waits 60 s on a stalled client
        taker.close()
        sock2, _client2 = raw_socket(ours_url, f"/pty/{session}/ws?takeover=1")
        with sock2:
            time.sleep(1)
            started = time.monotonic()
            assert sandbox.pty.delete(session)
            assert time.monotonic() - started < 10
    finally:
        sock.close()
        with contextlib.suppress(OSError):
            sandbox.pty.delete(session)


class FloodingExecd:
    """After the handshake and `connected`, output frames of 64 KiB for as long as the client
    takes them (a send blocked for 2 s ends it); `sent` counts the bytes taken."""

    def __init__(self, limit: int) -> None:
        self.sent = 0
        self.limit = limit
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(2)
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            conn.sendall(upgraded(head, CONNECTED))
            frame = ws.encode_frame(ws.OP_BINARY, b"\x01" + bytes(65536))
            try:
                while self.sent < self.limit:
                    conn.sendall(frame)
                    self.sent += len(frame)
                time.sleep(5)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


def test_output_nobody_reads_is_held_in_bounded_memory() -> None:
    # a sandbox's execd (any code in it may replace it) sends output faster than it is read:
    # the connection reads it only as fast as the caller does (TCP pushes back on execd)
    execd = FloodingExecd(limit=256 << 20)
    try:
        with Sandbox.from_execd(f"http://127.0.0.1:{execd.port}", headers=HEADERS) as handle:
            conn = handle.pty.connect("s", timeout=5)
            time.sleep(1.5)
            assert execd.sent < 64 << 20, f"{execd.sent >> 20} MiB taken, none of it read"
            shown = 0
            while shown < 8 << 20:
                data = conn.read(5)
                assert data, conn.ended
                shown += len(data)
            conn.close()
    finally:
        execd.close()


def test_a_handshake_answer_that_drips_times_out_in_time() -> None:
    # a byte every 0.2 s never lets one read time out: the deadline is for the whole answer
    def serve(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            for byte in upgraded(head, CONNECTED):
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.2)

    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with Sandbox.from_execd(url, headers=HEADERS) as handle:
            started = time.monotonic()
            with pytest.raises(SandboxTimeoutError):
                handle.pty.connect("s", timeout=1)
            assert time.monotonic() - started < 4
    finally:
        listener.close()


# -- the local server's proxy relaying an upgrade, facing a hostile sandbox ---------------------


class Upstream:
    """What a sandbox's port answers (any code in it may listen there): `answer(head)`, then
    the connection stays open 2 s."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.heads: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    head = b""
                    while b"\r\n\r\n" not in head:
                        head += conn.recv(4096)
                    self.heads.append(head)
                    conn.sendall(self.answer)
                    while conn.recv(4096):
                        pass
                except OSError:
                    pass

    def connect(self, port: int, timeout: float = 10.0) -> socket.socket:
        """As `SandboxContainer.connect`: a socket to the sandbox's `port`."""
        return socket.create_connection(self.listener.getsockname(), timeout=timeout)


@pytest.fixture
def proxied() -> Iterator[Callable[[bytes], tuple[str, Upstream]]]:
    """A local server's proxy route (`proxy.forward`) to a hostile upstream answering `answer`."""
    from osb_sync.local.host import proxy

    servers = []

    def make(answer: bytes) -> tuple[str, Upstream]:
        upstream = Upstream(answer)

        def route(ex: Exchange) -> None:
            proxy.forward(ex, upstream, "sbx", proxy.EXECD_PORT, ex.path, {})  # type: ignore[arg-type]

        hosts = httpd.host_names("127.0.0.1", ())
        server = httpd.HTTPServer(("127.0.0.1", 0), route, httpd.Limits(), hosts)
        threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True).start()
        servers.append((server, upstream))
        return f"http://127.0.0.1:{server.server_address[1]}", upstream

    yield make
    for server, upstream in servers:
        server.shutdown()
        server.server_close()
        upstream.listener.close()


def test_the_proxy_relays_no_1xx_to_a_plain_request(
    proxied: Callable[[bytes], tuple[str, Upstream]],
) -> None:
    # a 101 nobody asked for (or a 100 as the answer) has no body, so whatever the proxy sent
    # after it would be read as the answer to the client's next request on that connection
    for answer in (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        b"HTTP/1.1 102 Processing\r\n\r\n",
    ):
        url, _ = proxied(answer)
        with requests.Session() as session:
            first = session.get(url + "/files/info?path=/x", timeout=10)
            assert first.status_code == 502, (first.status_code, first.content)


def test_the_proxy_relays_no_1xx_as_a_refused_handshake(
    proxied: Callable[[bytes], tuple[str, Upstream]],
) -> None:
    url, _ = proxied(b"HTTP/1.1 100 Continue\r\nContent-Length: 5\r\n\r\nhello")
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(ws.handshake_request(f"127.0.0.1:{port}", "/pty/s/ws", ws.new_key(), {}))
        answer = ws.read_answer(sock.recv)
    assert answer.status == 502, answer


def test_the_proxy_refuses_an_upgrade_with_a_body(
    proxied: Callable[[bytes], tuple[str, Upstream]],
) -> None:
    # the body would go up as the first bytes of the WebSocket: frames execd never saw asked
    url, upstream = proxied(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")
    port = int(url.rsplit(":", 1)[1])
    request = ws.handshake_request(f"127.0.0.1:{port}", "/pty/s/ws", ws.new_key(), {})
    bodies = (b"Content-Length: 5\r\n\r\nhello", b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    for extra in bodies:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(request[:-2] + extra)
            answer = ws.read_answer(sock.recv)
        assert answer.status == 400, answer
    assert upstream.heads == []


def test_the_proxy_closes_the_connection_after_a_refused_handshake(
    proxied: Callable[[bytes], tuple[str, Upstream]],
) -> None:
    # a request after a refused handshake on the same connection would be read after bytes
    # meant for the WebSocket: the connection ends with the refusal
    body = b'{"code":"ALREADY_CONNECTED"}'
    url, upstream = proxied(
        b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    port = int(url.rsplit(":", 1)[1])
    request = ws.handshake_request(f"127.0.0.1:{port}", "/pty/s/ws", ws.new_key(), {})
    after = b"GET /files/info?path=/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request + after)
        received = b""
        while data := sock.recv(65536):
            received += data
    assert received.startswith(b"HTTP/1.1 409 ") and received.count(b"HTTP/1.1") == 1
    assert received.endswith(body) and len(upstream.heads) == 1


def echoed(head: bytes) -> bytes:
    body = b'{"code":"BAD","message":"' + head.replace(b"\r\n", b" ").replace(b'"', b"") + b'"}'
    return b"HTTP/1.1 400 Bad\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@pytest.mark.parametrize(
    "answer",
    [
        lambda head: upgraded(head).replace(b"Upgrade: websocket\r\n", b""),
        lambda head: upgraded(head).replace(b"Sec-WebSocket-Accept: ", b"Sec-WebSocket-Accept: x"),
        lambda head: upgraded(head).replace(
            b"\r\n\r\n", b"\r\nSec-WebSocket-Extensions: z\r\n\r\n"
        ),
        lambda head: upgraded(head, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
        lambda head: b"HTTP/1.1 101 Switching Protocols\r\n" + b"X: " + b"a" * 70000,
        lambda head: b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        echoed,  # an error that quotes the request, token and all
    ],
)
def test_a_hostile_handshake_answer_is_a_clean_error(answer: Callable[[bytes], bytes]) -> None:
    execd = FakeExecd(answer)
    try:
        with Sandbox.from_execd(f"http://127.0.0.1:{execd.port}", headers=HEADERS) as handle:
            started = time.monotonic()
            with pytest.raises((ApiError, TransportError)) as caught:
                handle.pty.connect("s", timeout=5)
            assert time.monotonic() - started < 5
        assert TOKEN not in str(caught.value) and TOKEN not in repr(caught.value.__dict__)
    finally:
        execd.close()


def test_close_does_not_wait_on_an_execd_that_stopped_reading() -> None:
    stop = threading.Event()

    def serve(listener: socket.socket) -> None:  # answers, then reads nothing more
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            conn.sendall(upgraded(head, CONNECTED))
            stop.wait(30)

    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with Sandbox.from_execd(url, headers=HEADERS) as handle:
            conn = handle.pty.connect("s", timeout=5)

            def type_forever() -> None:
                with contextlib.suppress(TransportError):
                    while True:
                        conn.send(b"x" * 65536)

            typist = threading.Thread(target=type_forever, daemon=True)
            typist.start()
            time.sleep(0.5)  # the socket's buffers are full: the typist's send blocks
            started = time.monotonic()
            conn.close()
            assert time.monotonic() - started < 5
            typist.join(5)
            assert not typist.is_alive()
    finally:
        stop.set()
        listener.close()


def test_read_all_stops_at_its_byte_cap() -> None:
    # the terminal's analog of a run's max_output_bytes: `yes` for the whole timeout is not
    # gigabytes in memory
    execd = FloodingExecd(limit=64 << 20)
    try:
        with Sandbox.from_execd(f"http://127.0.0.1:{execd.port}", headers=HEADERS) as handle:
            conn = handle.pty.connect("s", timeout=5)
            with pytest.raises(OutputLimitExceeded) as caught:
                conn.read_all(30)
            assert caught.value.limit == MAX_OUTPUT_BYTES
            assert 0 < len(caught.value.partial) <= MAX_OUTPUT_BYTES
            with pytest.raises(OutputLimitExceeded, match="1000 bytes"):
                conn.read_all(30, max_bytes=1000)
            conn.close()
    finally:
        execd.close()


def test_a_large_input_goes_in_frames_execd_takes(execd_url: str) -> None:
    # one send of 3 MiB (a paste, a file piped in) as one frame passed our execd's 1 MiB
    # message cap: it closed the connection with 1009
    with Sandbox.from_execd(execd_url, headers=HEADERS, read_timeout=10) as sandbox:
        with sandbox.pty.open("head -c 3145728 | wc -c; sleep 0.3", pipe=True) as conn:
            conn.send(b"x" * (3 << 20))
            shown = conn.read_all(30)
    assert shown.strip() == b"3145728", (shown, conn.ended, conn.close_code)


def output_frame(data: bytes) -> bytes:
    return ws.encode_frame(ws.OP_BINARY, b"\x01" + data)


def test_a_reconnect_keeps_what_the_dropped_connection_brought_and_was_not_read() -> None:
    # the offset counts what the reader took from execd, not what the caller read: output
    # still waiting for the caller when it reconnects is no less part of the stream (and a
    # full buffer of it must not keep the reconnect's replay and `connected` out)
    big = bytes(range(256)) * (5 << 12)  # 5 MiB: more than the unread output held
    frames = [output_frame(big[i : i + 65536]) for i in range(0, len(big), 65536)]

    def answer(head: bytes) -> bytes:
        since = re.search(rb"since=(\d+)", head)
        if since is None:
            return upgraded(head, CONNECTED, *frames)
        offset = int(since[1])
        replay = b"\x03" + offset.to_bytes(8, "big") + big[offset:] + b"two"
        return upgraded(head, ws.encode_frame(ws.OP_BINARY, replay), CONNECTED)

    execd = FakeExecd(answer)
    try:
        with Sandbox.from_execd(f"http://127.0.0.1:{execd.port}", headers=HEADERS) as handle:
            conn = handle.pty.connect("s", timeout=5)
            assert wait_for_state(lambda: conn.offset >= 4 << 20), conn.offset
            conn.reconnect(timeout=5)
            shown = conn.read_all(10)
        assert len(shown) == len(big) + 3 and shown == big + b"two" and conn.lost == 0
    finally:
        execd.close()


def wait_for_state(predicate: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_input_is_never_written_to_a_reused_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # input is written without the session's lock (a write may block); the terminal's master
    # closed meanwhile (its process exited) frees its number for the next open file: the rest
    # of the input went there (another session's terminal, a file being uploaded)
    from osb_sync.local.execd import pty as execd_pty

    runtime = SandboxRuntime(tmp_path, tmp_path, {"PATH": os.environ.get("PATH", "/bin")})
    session = execd_pty.Session(runtime, tmp_path, "sleep 30")
    other = tmp_path / "other-file"
    real_write = os.write
    opened: list[int] = []

    def write_once_then_reuse(fd: int, data: Any) -> int:
        if not opened:  # the process exits, its pump closes the master, a file is opened
            assert proc is not None
            proc.kill()
            assert wait_for_state(lambda: session.master == -1)
            opened.append(os.open(other, os.O_WRONLY | os.O_CREAT))
            return 1
        return real_write(fd, data)

    with session.lock:
        session.launch()
    proc = session.proc
    assert proc is not None
    master = session.master
    monkeypatch.setattr(execd_pty.os, "write", write_once_then_reuse)
    try:
        with contextlib.suppress(OSError):
            session.write_stdin(b"secret input")
    finally:
        monkeypatch.undo()
        for fd in opened:
            os.close(fd)
        session.kill()
        proc.wait()
        runtime.close()
    assert opened == [master]  # the number was reused: the case this test is about
    assert other.read_bytes() == b""


def test_a_delete_after_the_shell_was_reaped_spares_a_new_owner_of_its_number(
    tmp_path: Path,
) -> None:
    # once the shell was reaped and its session is empty, its number may go to a new session
    # leader (every process execd starts is one): a delete must not kill that one
    from osb_sync.local.execd import pty as execd_pty

    runtime = SandboxRuntime(tmp_path, tmp_path, {"PATH": os.environ.get("PATH", "/bin")})
    session = execd_pty.Session(runtime, tmp_path, "true")
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        with session.lock:
            session.launch()
        proc = session.proc
        assert proc is not None
        assert wait_for_state(lambda: proc.returncode is not None)  # the pump reaped it
        proc.pid = stranger.pid  # the number, given to a new session's leader
        session.kill()
        time.sleep(0.2)
        assert stranger.poll() is None, "a delete killed a process that was not the session's"
    finally:
        stranger.kill()
        stranger.wait()
        runtime.close()
