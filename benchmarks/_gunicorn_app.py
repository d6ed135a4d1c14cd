"""The Flask app that ``bench_gunicorn_pool.py`` serves with gunicorn (one pool per mode).

Read from the environment: ``B_API_BASE``, ``B_POOL_NAME``, ``B_POOL_SIZE``,
``B_POOL_MAX_SIZE`` (empty: the default, the size), ``B_REDIS_URL`` (empty: a pool per worker
process, in its memory; a URL: one pool shared through Redis) and ``B_COUNTS`` (a directory:
every ``create_sandbox`` of a worker appends one line to its file there, so the benchmark
counts the creates exactly, whichever process made them).
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask

import osb_sync
from osb_sync.integrations.flask import OpenSandbox

_create = osb_sync.Client.create_sandbox


def _counted_create(self: osb_sync.Client, **options: Any) -> osb_sync.Sandbox:
    """``Client.create_sandbox``, recorded first (benchmark instrumentation only)."""
    path = os.path.join(os.environ["B_COUNTS"], str(os.getpid()))
    with open(path, "a") as handle:
        handle.write("create\n")
    return _create(self, **options)


osb_sync.Client.create_sandbox = _counted_create  # type: ignore[assignment,method-assign]

app = Flask(__name__)
app.config.update(
    OPENSANDBOX_API_BASE=os.environ["B_API_BASE"],
    OPENSANDBOX_POOL_REDIS_URL=os.environ["B_REDIS_URL"] or None,
    OPENSANDBOX_POOL_NAME=os.environ["B_POOL_NAME"],
    OPENSANDBOX_POOL_SIZE=int(os.environ["B_POOL_SIZE"]),
    OPENSANDBOX_POOL_MAX_SIZE=int(os.environ["B_POOL_MAX_SIZE"] or 0) or None,
    OPENSANDBOX_ACQUIRE_TIMEOUT=60,
)
sandboxes = OpenSandbox(app)


@app.post("/run")
def run() -> dict[str, str]:
    """Run ``print(6 * 7)`` in the request's pooled sandbox."""
    return {"stdout": sandboxes.sandbox.run_code("print(6 * 7)", timeout=30).stdout}


@app.get("/up")
def up() -> str:
    """Readiness probe (touches no sandbox)."""
    return "up"
