"""A replay execd for the streaming benchmark: every ``POST .../code`` gets the same corpus.

The corpus mimics what a Jupyter-backed execd sends for chatty output: mostly small stdout
events, some medium ones and a few large ones (about 50 MB in all, proportions from
``shared/reference/dependencies.md`` section 6a), each event its own HTTP chunk, as execd
flushes per event. The whole answer is encoded once; serving it costs this process little.
Usage: ``_replay.py MEGABYTES``; prints ``replaying http://127.0.0.1:PORT`` on stdout.
"""

from __future__ import annotations

import json
import random
import sys
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
    frames = [e + b"\n\n" for e in events]
    body = b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames) + b"0\r\n\r\n"
    return body, stdout


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
    body, stdout = corpus(int(float(sys.argv[1]) * 1_000_000))
    server = ReplayServer(body)
    print(f"replaying http://127.0.0.1:{server.server_address[1]} {stdout}", flush=True)
    server.serve_forever()
