"""A replay execd for the streaming benchmark: every ``POST .../code`` gets the same corpus.

Three corpora, each event its own HTTP chunk, as execd flushes per event:

- synthetic (``_replay.py MEGABYTES``): what a Jupyter-backed execd sends for chatty output,
  mostly small stdout events, some medium ones and a few large ones (proportions from
  ``shared/reference/dependencies.md`` section 6a);
- one event (``_replay.py MEGABYTES one-event``): a single stdout event of MEGABYTES (here
  MiB-sized: ``8.388608`` is 8 MiB) in one HTTP chunk, between ``init`` and
  ``execution_complete``;
- a capture of the real execd (``_replay.py MEGABYTES CAPTURE``): the HTTP chunks one real
  ``POST /code`` answered, exactly as sent (``capture`` records them), repeated whole until
  MEGABYTES of stdout (each repetition repeats its ``init``, pings and ``execution_complete``).

The whole answer is encoded once; serving it costs this process little. Prints
``replaying http://127.0.0.1:PORT STDOUT_BYTES`` on stdout.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def corpus(total: int) -> tuple[bytes, int]:
    """(chunked body, stdout bytes) of events adding up to about ``total`` stdout bytes."""
    rng = random.Random(6)
    events = [json.dumps({"type": "init", "text": "replay", "timestamp": 1}).encode()]
    stdout = 0
    while stdout < total:
        roll = rng.random()
        size = rng.randint(20, 200) if roll < 0.8 else rng.randint(200, 4096)
        if roll > 0.9947:
            size = 65536
        text = "".join(rng.choice('abcdefghij \n"\\\t') for _ in range(min(size, 64))) * (
            size // 64 + 1
        )
        text = text[:size]
        stdout += len(text)
        events.append(json.dumps({"type": "stdout", "text": text, "timestamp": 2}).encode())
    events.append(json.dumps({"type": "execution_complete", "timestamp": 3}).encode())
    return chunked([e + b"\n\n" for e in events]), stdout


def one_event(total: int) -> tuple[bytes, int]:
    """(chunked body, stdout bytes) of one stdout event of ``total`` characters."""
    events = [
        {"type": "init", "text": "replay", "timestamp": 1},
        {"type": "stdout", "text": "x" * (total - 1) + "\n", "timestamp": 2},
        {"type": "execution_complete", "timestamp": 3},
    ]
    return chunked([json.dumps(e).encode() + b"\n\n" for e in events]), total


def chunked(chunks: Iterable[bytes]) -> bytes:
    """An HTTP/1.1 chunked body sending each of ``chunks`` as one chunk."""
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c) + b"0\r\n\r\n"


def unchunked(body: bytes) -> list[bytes]:
    """The chunks of a chunked body (no extensions or trailers: ours and execd's)."""
    chunks, at = [], 0
    while True:
        end = body.index(b"\r\n", at)
        size = int(body[at:end], 16)
        if not size:
            return chunks
        chunks.append(body[end + 2 : end + 2 + size])
        at = end + 4 + size


def stdout_bytes(chunks: list[bytes]) -> int:
    """Characters of stdout text the events of ``chunks`` carry."""
    lines = b"".join(chunks).split(b"\n")
    events = [json.loads(line) for line in lines if line.strip()]
    return sum(len(e.get("text", "")) for e in events if e.get("type") == "stdout")


def replayed(capture: bytes, total: int) -> tuple[bytes, int]:
    """(chunked body, stdout characters) of a captured answer repeated to ``total`` stdout."""
    chunks = unchunked(capture)
    once = stdout_bytes(chunks)
    times = max(1, -(-total // once))
    return chunked(chunks * times), once * times


class Replay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ReplayServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        body = self.server.body
        for i in range(0, len(body), 1 << 18):
            self.wfile.write(body[i : i + (1 << 18)])

    def do_DELETE(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


class ReplayServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, body: bytes):
        super().__init__(("127.0.0.1", 0), Replay)
        self.body = body


if __name__ == "__main__":
    wanted = int(float(sys.argv[1]) * 1_000_000)
    if sys.argv[2:] == ["one-event"]:
        body, stdout = one_event(wanted)
    elif len(sys.argv) > 2:
        with open(sys.argv[2], "rb") as handle:
            body, stdout = replayed(handle.read(), wanted)
    else:
        body, stdout = corpus(wanted)
    server = ReplayServer(body)
    print(f"replaying http://127.0.0.1:{server.server_address[1]} {stdout}", flush=True)
    server.serve_forever()
