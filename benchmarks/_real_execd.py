"""The real execd (a Go server) behind a stub lifecycle, so that clients reach it directly.

``real_execd()`` starts ``shared/opensandbox-execd``'s build with ``run-execd`` (Jupyter from its
cached venv) on a free loopback port with an access token, and stops it afterwards.
``stub_lifecycle()`` is a tiny loopback HTTP server that answers what a client asks the
lifecycle API before its first run (create, get, endpoint, delete) with that execd's address
and token: every sandbox a client creates is the same execd, and what a benchmark measures
after that is the client against a server whose own cost is small.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SHARED = Path(os.environ.get("OSB_REAL_EXECD_DIR", "/work/shared/opensandbox-execd"))
TOKEN = "bench-token-" + uuid.uuid4().hex[:8]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def real_execd(token: str = TOKEN) -> Iterator[str]:
    """Run the real execd until the block ends; yields its ``127.0.0.1:PORT``."""
    folder = Path(tempfile.mkdtemp(prefix="osb-bench-execd-"))
    port = free_port()
    run = str(SHARED / "run-execd")
    subprocess.run([run, "start", str(folder), str(port), token], check=True)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([run, "stop", str(folder)], check=False)
        shutil.rmtree(folder, ignore_errors=True)


def create_contexts(endpoint: str, count: int, token: str = TOKEN) -> list[str]:
    """``count`` Python contexts (Jupyter kernels) on execd, made with plain urllib."""
    ids = []
    for _ in range(count):
        request = urllib.request.Request(
            f"http://{endpoint}/code/context",
            data=b'{"language": "python"}',
            headers={"Content-Type": "application/json", "X-EXECD-ACCESS-TOKEN": token},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            ids.append(json.loads(answer.read())["id"])
    return ids


class _Lifecycle(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _StubServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sandbox(self, sandbox_id: str) -> dict[str, Any]:
        moment = datetime.now(timezone.utc)
        now = moment.isoformat().replace("+00:00", "Z")
        later = (moment + timedelta(days=1)).isoformat().replace("+00:00", "Z")
        return {
            "id": sandbox_id,
            "status": {"state": "Running", "reason": "", "message": "", "lastTransitionAt": now},
            "metadata": {},
            "entrypoint": ["/opt/code-interpreter/code-interpreter.sh"],
            "image": {"uri": "opensandbox/code-interpreter:v1.1.0"},
            "createdAt": now,
            "expiresAt": later,
        }

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/") == "/v1/sandboxes":
            self._send(202, self._sandbox(uuid.uuid4().hex))
        else:  # renew and the like
            self._send(200, {"expiresAt": "2999-01-01T00:00:00Z"})

    def do_GET(self) -> None:
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) == 5 and parts[3] == "endpoints":
            body = {
                "endpoint": self.server.endpoint,
                "headers": {"X-EXECD-ACCESS-TOKEN": self.server.token},
            }
            self._send(200, body)
        elif len(parts) == 3:
            self._send(200, self._sandbox(parts[2]))
        else:
            self._send(404, {"code": "NOT_FOUND", "message": self.path})

    def do_DELETE(self) -> None:
        self._send(204)


class _StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, endpoint: str, token: str):
        super().__init__(("127.0.0.1", 0), _Lifecycle)
        self.endpoint = endpoint
        self.token = token


@contextlib.contextmanager
def stub_lifecycle(endpoint: str, token: str = TOKEN) -> Iterator[str]:
    """A lifecycle API on loopback whose every sandbox is ``endpoint``; yields its api_base."""
    server = _StubServer(endpoint, token)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
