"""Flask extension: a warm SandboxPool per app and a pooled sandbox per request, on demand.

.. code-block:: python

    from osb_sync.integrations.flask import OpenSandbox

    sandboxes = OpenSandbox(app)            # or OpenSandbox() and later init_app(app)

    @app.post("/run")
    def run():
        result = sandboxes.sandbox.run_code(request.get_data(as_text=True), timeout=10)
        return {"stdout": result.stdout}

``sandboxes.sandbox`` (or :func:`get_sandbox`) borrows a sandbox from the app's pool the first
time a request asks for one and gives it back when the request's app context ends, also when
the view raised. A request that never asks borrows nothing.

Configuration (``app.config``):

- ``OPENSANDBOX_API_BASE``, ``OPENSANDBOX_API_KEY``: default ``OPEN_SANDBOX_API_BASE`` and
  ``OPEN_SANDBOX_API_KEY`` from the environment, as for :class:`~osb_sync.Client`.
- ``OPENSANDBOX_CLIENT``: other ``Client`` keywords (``execd_scheme``, ``read_timeout``...).
- ``OPENSANDBOX_POOL_SIZE`` (2), ``OPENSANDBOX_POOL_MAX_SIZE`` (None: the size),
  ``OPENSANDBOX_REUSE`` (``"never"`` or ``"reset"``), ``OPENSANDBOX_POOL_NAME``.
- ``OPENSANDBOX_CREATE``: ``create_sandbox`` keywords for the pooled sandboxes.
- ``OPENSANDBOX_POOL_REDIS_URL`` (None): share one pool between every worker process and host
  through Redis (:class:`~osb_sync.RedisStore`; give ``OPENSANDBOX_POOL_NAME`` too, the same
  in every process); None keeps a pool per process.
- ``OPENSANDBOX_ACQUIRE_TIMEOUT`` (30): seconds a request waits for a free sandbox before
  ``SandboxTimeoutError``.

Every setting may also be spelled ``OPEN_SANDBOX_*``, like the client's environment
variables.

The pool is made on first use in each process (call :meth:`OpenSandbox.get_pool` at start-up
to have it warm before the first request); it is closed at interpreter exit or by
:meth:`OpenSandbox.close`. Forked workers (gunicorn ``--preload``) get pools of their own.
"""

from __future__ import annotations

import threading
from typing import Any

from flask import Flask, current_app, g

from .._client import Client
from .._errors import ConfigurationError
from .._pool import SandboxPool
from .._sandbox import Sandbox
from .settings import pool_store, read

EXTENSION_KEY = "opensandbox"
DEFAULTS: dict[str, Any] = {
    "OPENSANDBOX_API_BASE": None,
    "OPENSANDBOX_API_KEY": None,
    "OPENSANDBOX_CLIENT": {},
    "OPENSANDBOX_POOL_SIZE": 2,
    "OPENSANDBOX_POOL_MAX_SIZE": None,
    "OPENSANDBOX_REUSE": "never",
    "OPENSANDBOX_POOL_NAME": None,
    "OPENSANDBOX_CREATE": {},
    "OPENSANDBOX_ACQUIRE_TIMEOUT": 30.0,
    "OPENSANDBOX_POOL_REDIS_URL": None,
}
_LENT = "_opensandbox_lent"


class _AppState:
    """One app's client and pool, made on first use."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.store = pool_store(config["OPENSANDBOX_POOL_REDIS_URL"], "OPENSANDBOX_POOL_REDIS_URL")
        self.lock = threading.Lock()
        self.client: Client | None = None
        self.pool: SandboxPool | None = None

    def get_pool(self) -> SandboxPool:
        with self.lock:
            if self.pool is None:
                self.client = Client(
                    self.config["OPENSANDBOX_API_BASE"],
                    self.config["OPENSANDBOX_API_KEY"],
                    **self.config["OPENSANDBOX_CLIENT"],
                )
                self.pool = SandboxPool(
                    self.client,
                    size=self.config["OPENSANDBOX_POOL_SIZE"],
                    max_size=self.config["OPENSANDBOX_POOL_MAX_SIZE"],
                    reuse=self.config["OPENSANDBOX_REUSE"],
                    name=self.config["OPENSANDBOX_POOL_NAME"],
                    store=self.store,
                    **self.config["OPENSANDBOX_CREATE"],
                )
            return self.pool

    def close(self) -> None:
        with self.lock:
            pool, client, self.pool, self.client = self.pool, self.client, None, None
        if pool is not None:
            pool.close()
        if client is not None:
            client.close()


class OpenSandbox:
    """The Flask extension; one instance may serve several apps (``init_app`` each).

    Args:
        app: the app to set up now, or None to call :meth:`init_app` later.
    """

    def __init__(self, app: Flask | None = None):
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Read the ``OPENSANDBOX_*`` (or ``OPEN_SANDBOX_*``) settings and return lent
        sandboxes at teardown.

        Nothing is created here: the pool is made when first needed.

        Raises:
            ConfigurationError: a setting has the wrong type, or is set in both spellings.
        """
        config = {name: read(app.config, name, default) for name, default in DEFAULTS.items()}
        for name in ("OPENSANDBOX_CLIENT", "OPENSANDBOX_CREATE"):
            if not isinstance(config[name], dict):
                raise ConfigurationError(f"{name} must be a dict of keyword arguments")
        app.extensions[EXTENSION_KEY] = _AppState(config)
        app.teardown_appcontext(_give_back)

    @property
    def sandbox(self) -> Sandbox:
        """The current request's sandbox (borrowed on first access, returned at teardown)."""
        return get_sandbox()

    def get_pool(self, app: Flask | None = None) -> SandboxPool:
        """The pool of ``app`` (default: the current app), made and started on first use."""
        return _state(app).get_pool()

    def close(self, app: Flask | None = None) -> None:
        """Delete every sandbox of the app's pool and close its client (a later use makes
        new ones)."""
        _state(app).close()


def get_sandbox() -> Sandbox:
    """The current request's sandbox (see :attr:`OpenSandbox.sandbox`).

    Raises:
        SandboxTimeoutError: no sandbox was free within ``OPENSANDBOX_ACQUIRE_TIMEOUT``.
        RuntimeError: no app context, or the app has no ``OpenSandbox`` extension.
    """
    lent: tuple[SandboxPool, Sandbox] | None = g.get(_LENT)
    if lent is None:
        state = _state(None)
        pool = state.get_pool()
        lent = (pool, pool.acquire(timeout=state.config["OPENSANDBOX_ACQUIRE_TIMEOUT"]))
        setattr(g, _LENT, lent)
    return lent[1]


def _give_back(exc: BaseException | None) -> None:
    """Teardown: return the context's sandbox to the pool it came from."""
    lent: tuple[SandboxPool, Sandbox] | None = g.pop(_LENT, None)
    if lent is not None:
        pool, sandbox = lent
        pool.release(sandbox)


def _state(app: Flask | None) -> _AppState:
    app = app if app is not None else current_app
    state = app.extensions.get(EXTENSION_KEY)
    if not isinstance(state, _AppState):
        raise RuntimeError("OpenSandbox is not set up for this app: call OpenSandbox(app)")
    return state
