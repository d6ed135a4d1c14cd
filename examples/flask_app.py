"""A Flask app that runs user-submitted Python in pooled OpenSandbox sandboxes.

    python examples/flask_app.py
    curl -s http://127.0.0.1:5000/run --data-binary 'print(6 * 7)'

With ``OPEN_SANDBOX_API_BASE`` (and ``OPEN_SANDBOX_API_KEY``) set it uses that server; otherwise
it starts an embedded local server (a development server, not a security boundary). ``PORT``
(default 5000), ``POOL_SIZE`` (default 4) and ``OPENSANDBOX_POOL_REDIS_URL`` (one pool shared
by every worker process through Redis, under gunicorn; default none) are read from the
environment.

``POST /run`` takes the code as the request body and answers
``{"stdout", "stderr", "results", "error", "execution_count"}``. Code that raises, runs longer
than ``RUN_TIMEOUT`` or prints more than ``MAX_OUTPUT_BYTES`` gets an ``error``; an empty body
gets 400; when every sandbox is busy for ``OPENSANDBOX_ACQUIRE_TIMEOUT`` seconds the answer
is 503.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from osb_sync import OutputLimitExceeded, SandboxTimeoutError
from osb_sync.integrations.flask import OpenSandbox

RUN_TIMEOUT = 10.0  # seconds one submission may run
MAX_OUTPUT_BYTES = 64 * 1024  # output kept per run; more interrupts the run
MAX_CODE_BYTES = 64 * 1024
EMPTY_BODY = "the request body is empty: send the code to run"

sandboxes = OpenSandbox()


def create_app(api_base: str | None = None, api_key: str | None = None, **config: Any) -> Flask:
    """The app, pooling sandboxes on ``api_base`` (default: ``OPEN_SANDBOX_API_BASE``).

    ``config``: more ``app.config`` settings, applied last.

    Raises:
        RuntimeError: no server: neither ``api_base`` nor ``OPEN_SANDBOX_API_BASE`` (fail
            here, at start-up, not with a 500 on the first request).
    """
    api_base = api_base or os.environ.get("OPEN_SANDBOX_API_BASE")
    if not api_base:
        raise RuntimeError(
            "create_app needs an OpenSandbox server: set OPEN_SANDBOX_API_BASE (or pass "
            "api_base=); `python examples/flask_app.py` starts an embedded local one"
        )
    app = Flask(__name__)
    app.config.update(
        MAX_CONTENT_LENGTH=MAX_CODE_BYTES,
        OPENSANDBOX_API_BASE=api_base,
        OPENSANDBOX_API_KEY=api_key,
        OPENSANDBOX_POOL_SIZE=int(os.environ.get("POOL_SIZE", "4")),
        OPENSANDBOX_POOL_REDIS_URL=os.environ.get("OPENSANDBOX_POOL_REDIS_URL") or None,
        OPENSANDBOX_REUSE="never",  # each submission gets a sandbox no one has used
        OPENSANDBOX_CREATE={"timeout": 900},  # sandboxes expire if this process dies
        OPENSANDBOX_ACQUIRE_TIMEOUT=5.0,
    )
    app.config.update(config)
    sandboxes.init_app(app)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:
        """Every error answer is JSON, as the API's own (a 413 body too large, a 400)."""
        if exc.code == 413:  # Flask's own text names no limit
            return jsonify(error=f"the code is over the {MAX_CODE_BYTES}-byte limit"), 413
        return jsonify(error=exc.description), exc.code or 500

    @app.post("/run")
    def run() -> Any:
        """Run the body as Python in the request's pooled sandbox."""
        code = request.get_data(as_text=True)
        if not code.strip():
            return jsonify(error=EMPTY_BODY), 400
        try:
            sandbox = sandboxes.sandbox
        except SandboxTimeoutError:
            return jsonify(error="all sandboxes are busy, try again"), 503, {"Retry-After": "1"}
        try:
            result = sandbox.run_code(code, timeout=RUN_TIMEOUT, max_output_bytes=MAX_OUTPUT_BYTES)
        except SandboxTimeoutError:
            return jsonify(_stopped("TimeoutError", f"stopped after {RUN_TIMEOUT:g} seconds"))
        except OutputLimitExceeded:
            return jsonify(_stopped("OutputLimitExceeded", f"over {MAX_OUTPUT_BYTES} bytes"))
        return jsonify(result.to_dict())

    return app


def _stopped(name: str, why: str) -> dict[str, Any]:
    """The answer for a run that was interrupted (its sandbox is then discarded)."""
    error = {"name": name, "value": why, "traceback": []}
    return {"stdout": "", "stderr": "", "results": [], "error": error, "execution_count": None}


def main() -> None:
    """Serve on 127.0.0.1:$PORT, with an embedded local server unless one is configured."""
    local = None
    api_base = os.environ.get("OPEN_SANDBOX_API_BASE")
    if not api_base:
        from osb_sync.local import LocalServer

        local = LocalServer(unenforced_network_policy="accept").start()
        api_base = local.api_base
        print(f"embedded local OpenSandbox server on {api_base}", file=sys.stderr)
        if not local.network_policy_enforced:
            print("warning: this machine cannot enforce the deny-all policy", file=sys.stderr)
    app = create_app(api_base)
    sandboxes.get_pool(app)  # start filling the pool before the first request
    try:
        app.run(host="127.0.0.1", port=int(os.environ.get("PORT", "5000")), threaded=True)
    finally:
        sandboxes.close(app)
        if local is not None:
            local.stop()


if __name__ == "__main__":
    main()
