"""``exec -it``'s relay (``_cli_tty._relay``): a window-size change (SIGWINCH) while a send is
under way. The handler runs in the main thread, wherever that thread is: a resize sent from it
would wait for the send lock the interrupted send holds, for ever (the CLI hung in raw mode,
Ctrl-C being a byte for the sandbox)."""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import termios
import threading
import time

from osb_sync import _cli_tty


class SlowConnection:
    """A stand-in PtyConnection: `send` holds the send lock until told to finish."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # as the WebSocket's send lock
        self.in_send = threading.Event()
        self.finish_send = threading.Event()
        self.over = threading.Event()
        self.sent: list[bytes] = []
        self.resizes: list[tuple[int, int]] = []
        self.stuck = False
        self.ended: str | None = None

    def send(self, data: bytes) -> None:
        with self.lock:
            self.in_send.set()
            self.finish_send.wait(10)
            self.sent.append(data)

    def resize(self, cols: int, rows: int) -> None:
        if not self.lock.acquire(timeout=3):  # a real lock would wait for ever
            self.stuck = True
            return
        try:
            self.resizes.append((cols, rows))
        finally:
            self.lock.release()

    def read(self, timeout: float | None = None) -> bytes | None:
        self.over.wait()
        self.ended = "exited"
        return b""

    def close(self) -> None:
        self.over.set()


def test_a_resize_during_a_send_neither_hangs_nor_is_lost() -> None:
    conn = SlowConnection()
    stdin_r, stdin_w = os.pipe()
    master, slave = os.openpty()  # the CLI's output terminal, whose size is sent
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 150, 0, 0))

    def user() -> None:
        os.write(stdin_w, b"typed")
        assert conn.in_send.wait(10)
        os.kill(os.getpid(), signal.SIGWINCH)  # the window changes while the send is stuck
        time.sleep(0.3)
        conn.finish_send.set()
        deadline = time.monotonic() + 10
        while not conn.resizes and not conn.stuck and time.monotonic() < deadline:
            time.sleep(0.02)
        conn.over.set()

    helper = threading.Thread(target=user, daemon=True)
    helper.start()
    try:
        _cli_tty._relay(conn, stdin_r, slave)  # type: ignore[arg-type]
    finally:
        helper.join(20)
        for fd in (stdin_r, stdin_w, master, slave):
            os.close(fd)
    assert not conn.stuck, "the resize waited for the lock the interrupted send held"
    assert conn.sent == [b"typed"] and conn.resizes == [(150, 50)]
