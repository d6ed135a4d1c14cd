"""The Python worker of a code context: one persistent `_worker.py` process per context.

Output is forwarded live from the worker's stdout and stderr; the reply (result or error) comes
on a pipe of its own, as one JSON line, bounded by REPLY_LIMIT.
"""

from __future__ import annotations

import codecs
import json
import os
import selectors
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from .runner import SandboxRuntime, kill_group
from .workers import READ_SIZE, Emit, Pipes, complete

COALESCE_WINDOW = 0.005
# The worker replaces a larger reply (a huge repr) with an error; anything bigger on the reply
# pipe was written there by the sandbox's code, and the worker is killed.
REPLY_LIMIT = 4 << 20
DEAD_WORKER = {"ename": "DeadKernelError", "evalue": "the Python worker exited", "traceback": []}
BROKEN: dict[str, Any] = {}  # stands for what the worker wrote when it is not a reply
BROKEN_WORKER = {
    "ename": "DeadKernelError",
    "evalue": "the Python worker wrote an invalid reply and was restarted",
    "traceback": [],
}


def _coalesce(fd: int) -> bytes:
    """What follows on `fd` within a few ms: `print(1)` writes "1" and "\\n" separately."""
    more = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while len(more) < READ_SIZE and sel.select(COALESCE_WINDOW):
            data = os.read(fd, READ_SIZE)
            if not data:
                break  # EOF: the main loop sees it again and unregisters the pipe
            more += data
    return more


def _parse_reply(line: bytes) -> dict[str, Any]:
    """The reply object in `line`, or BROKEN (sandbox code may write to the reply pipe)."""
    try:
        reply = json.loads(line)
    except ValueError:
        return BROKEN
    return reply if isinstance(reply, dict) else BROKEN


def _worker_script() -> str:
    return str(Path(__file__).with_name("_worker.py"))


class PythonWorker:
    """One persistent Python process (`_worker.py`) holding a code context's state."""

    def __init__(self, runtime: SandboxRuntime, cwd: Path) -> None:
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        try:
            self._proc = runtime.spawn(
                # found at each start: a forked execd names its files as the container sees them
                [runtime.python, "-u", _worker_script(), str(requests_r), str(replies_w)],
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(requests_r, replies_w),
            )
        except BaseException:
            for fd in (requests_w, replies_r):
                os.close(fd)
            raise
        finally:
            os.close(requests_r)
            os.close(replies_w)
        # File objects, not bare descriptors: a worker killed while a run still reads its
        # pipes must not have them closed (and their numbers reused) under that run.
        self._requests = os.fdopen(requests_w, "wb", buffering=0)
        self._replies = os.fdopen(replies_r, "rb", buffering=0)
        self._pipes = Pipes(self._requests, self._replies, self._proc.stdout, self._proc.stderr)
        self.death_reported = False  # a run was told that the worker died (DeadKernelError)

    @property
    def alive(self) -> bool:
        """False once the worker process has exited."""
        return self._proc.poll() is None

    def ending(self) -> str:
        """How the ended worker process ended ("was killed by SIGKILL", "exited with code 1")."""
        code = self._proc.poll()
        if code is None:
            return "is running"
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def run(self, code: str, emit: Emit) -> None:
        """Run `code`, emitting output live and then result/error and execution_complete."""
        with self._pipes.reading():
            self._run(code, emit)

    def _run(self, code: str, emit: Emit) -> None:
        started = time.monotonic()
        assert self._proc.stdout is not None and self._proc.stderr is not None
        streams = {self._proc.stdout.fileno(): "stdout", self._proc.stderr.fileno(): "stderr"}
        decoders: dict[int, codecs.IncrementalDecoder] = {
            fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in streams
        }
        if self._replies.closed:  # killed (context deleted) before this run began
            self._report({"error": DEAD_WORKER}, emit, started)
            return
        try:
            self._requests.write(json.dumps({"code": code}).encode() + b"\n")
        except OSError:
            pass  # a dead worker shows up below as EOF on the reply pipe
        with selectors.DefaultSelector() as sel:
            for fd in (*streams, self._replies.fileno()):
                sel.register(fd, selectors.EVENT_READ)
            reply = self._pump(sel, streams, decoders, emit)
            if self._replies.fileno() in sel.get_map():
                sel.unregister(self._replies.fileno())
            # Output written before the reply is already in the pipes: send it first.
            while sel.get_map() and sel.select(0):
                self._pump(sel, streams, decoders, emit, drain=True)
        if reply is None:
            self._proc.wait()
            reply = {"error": DEAD_WORKER}
            self.death_reported = True
        elif reply is BROKEN:
            self.kill()
            reply = {"error": BROKEN_WORKER}
            self.death_reported = True
        self._report(reply, emit, started)

    def _pump(
        self,
        sel: selectors.BaseSelector,
        streams: dict[int, str],
        decoders: dict[int, codecs.IncrementalDecoder],
        emit: Emit,
        drain: bool = False,
    ) -> dict[str, Any] | None:
        """Forward output until the reply arrives (or one round of ready data when `drain`).

        The reply is None when the worker died, BROKEN when what it wrote is not a reply.
        """
        reply = bytearray()
        while True:
            for key, _ in sel.select(0 if drain else None):
                fd = int(key.fd)
                data = os.read(fd, READ_SIZE)
                if fd == self._replies.fileno():
                    reply += data
                    if not data:
                        return None
                    if len(reply) > REPLY_LIMIT + READ_SIZE:
                        return BROKEN
                    if reply.endswith(b"\n"):
                        return _parse_reply(bytes(reply))
                elif data:
                    text = decoders[fd].decode(data + _coalesce(fd))
                    if text:
                        emit({"type": streams[fd], "text": text})
                else:
                    sel.unregister(fd)
            if drain or not sel.get_map():
                return None

    @staticmethod
    def _report(reply: dict[str, Any], emit: Emit, started: float) -> None:
        if reply.get("error"):
            emit({"type": "status", "text": "error"})
            emit({"type": "error", "error": reply["error"]})
        elif reply.get("result") is not None:
            emit({"type": "execution_count", "execution_count": reply["execution_count"]})
            emit({"type": "result", "results": reply["result"]})
        emit(complete(started))

    def interrupt(self) -> None:
        """Send SIGINT to the worker's process group (KeyboardInterrupt in running code)."""
        kill_group(self._proc.pid, signal.SIGINT)

    def kill(self) -> None:
        """Kill the worker (its pipes close when the last run using them lets go)."""
        kill_group(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._pipes.killed()
