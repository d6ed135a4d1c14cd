"""Django integration: a process-wide client and warm pool from ``settings.OPENSANDBOX``.

.. code-block:: python

    # settings.py
    OPENSANDBOX = {"API_BASE": "http://opensandbox:8080/v1", "POOL_SIZE": 4}

    # views.py
    from osb_sync.integrations.django import request_sandbox, sandbox

    def run(request):
        result = request_sandbox(request).run_code(request.body.decode(), timeout=10)
        return JsonResponse({"stdout": result.stdout})

    def run_twice(request):
        with sandbox() as sb:                 # lent for the block only
            ...

:func:`request_sandbox` borrows a sandbox the first time a request asks and gives it back when
Django sends ``request_finished`` (after the response, streamed ones included, has been sent),
also when the view raised. It relies on the view and ``request_finished`` running in the same
thread, as they do under WSGI; under ASGI, and outside requests (management commands, tasks),
use the :func:`sandbox` context manager.

``OPENSANDBOX`` keys (all optional): ``API_BASE`` and ``API_KEY`` (default: the
``OPEN_SANDBOX_*`` environment variables), ``CLIENT`` (other ``Client`` keywords),
``POOL_SIZE`` (2), ``POOL_MAX_SIZE``, ``REUSE`` (``"never"`` or ``"reset"``), ``POOL_NAME``,
``CREATE`` (``create_sandbox`` keywords), ``ACQUIRE_TIMEOUT`` (30 s), ``POOL_REDIS_URL`` (share
one pool between every worker process and host through Redis, :class:`~osb_sync.RedisStore`;
give ``POOL_NAME`` too, the same everywhere). ``settings.OPEN_SANDBOX`` is accepted for
``settings.OPENSANDBOX``, like the client's ``OPEN_SANDBOX_*`` environment variables.

The client and the pool are made on first use in each process; a process forked after that
(gunicorn ``--preload``, multiprocessing) makes its own instead of sharing its parent's. The
pool is closed at interpreter exit, or by :func:`close`.
"""

from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

from django.conf import settings
from django.core.signals import request_finished, setting_changed

from .._client import Client
from .._errors import ConfigurationError, OpenSandboxError
from .._pool import SandboxPool
from .settings import pool_store, read

if TYPE_CHECKING:
    from django.http import HttpRequest

    from .._sandbox import Sandbox

logger = logging.getLogger("osb_sync")

DEFAULTS: dict[str, Any] = {
    "API_BASE": None,
    "API_KEY": None,
    "CLIENT": {},
    "POOL_SIZE": 2,
    "POOL_MAX_SIZE": None,
    "REUSE": "never",
    "POOL_NAME": None,
    "CREATE": {},
    "ACQUIRE_TIMEOUT": 30.0,
    "POOL_REDIS_URL": None,
}
_REQUEST_ATTRIBUTE = "_opensandbox_sandbox"
_SPELLINGS = ("OPENSANDBOX", "OPEN_SANDBOX")


class _Process:
    """This process's client and pool, made on first use; a fork starts afresh."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = 0
        self.options: dict[str, Any] = {}
        self.client: Client | None = None
        self.pool: SandboxPool | None = None

    def get(self) -> tuple[Client, SandboxPool]:
        with self.lock:
            if self.client is None or self.pool is None or self.pid != os.getpid():
                # After a fork the parent's objects are left alone: they are the parent's.
                self.options = _options()
                self.client = Client(
                    self.options["API_BASE"], self.options["API_KEY"], **self.options["CLIENT"]
                )
                self.pool = SandboxPool(
                    self.client,
                    size=self.options["POOL_SIZE"],
                    max_size=self.options["POOL_MAX_SIZE"],
                    reuse=self.options["REUSE"],
                    name=self.options["POOL_NAME"],
                    store=pool_store(
                        self.options["POOL_REDIS_URL"], "OPENSANDBOX['POOL_REDIS_URL']"
                    ),
                    **self.options["CREATE"],
                )
                self.pid = os.getpid()
            return self.client, self.pool

    def close(self) -> None:
        with self.lock:
            mine = self.pid == os.getpid()
            pool, client, self.pool, self.client = self.pool, self.client, None, None
        if mine and pool is not None:
            pool.close()
        if mine and client is not None:
            client.close()


_process = _Process()
_lent = threading.local()


def _options() -> dict[str, Any]:
    configured = read({n: getattr(settings, n) for n in _SPELLINGS if hasattr(settings, n)},
                      "OPENSANDBOX", None) or {}  # fmt: skip
    if not isinstance(configured, dict):
        raise ConfigurationError("settings.OPENSANDBOX must be a dict")
    unknown = set(configured) - set(DEFAULTS)
    if unknown:
        raise ConfigurationError(f"unknown OPENSANDBOX keys: {sorted(unknown)}")
    options = {**DEFAULTS, **configured}
    for name in ("CLIENT", "CREATE"):
        if not isinstance(options[name], dict):
            raise ConfigurationError(f"OPENSANDBOX[{name!r}] must be a dict of keyword arguments")
    return options


def get_client() -> Client:
    """This process's client, made from ``settings.OPENSANDBOX`` on first use.

    Raises:
        ConfigurationError: bad settings, or no API base configured.
    """
    return _process.get()[0]


def get_pool() -> SandboxPool:
    """This process's sandbox pool, made and started on first use (call it at start-up to
    have it warm before the first request).

    Raises:
        ConfigurationError: bad settings, or no API base configured.
    """
    return _process.get()[1]


@contextmanager
def sandbox(timeout: float | None = None) -> Iterator[Sandbox]:
    """Borrow a pooled sandbox for a ``with`` block; it goes back even when the block raises.

    Args:
        timeout: seconds to wait for a free one (default ``ACQUIRE_TIMEOUT``).

    Raises:
        SandboxTimeoutError: none was free in time.
    """
    pool = get_pool()
    wait = _process.options["ACQUIRE_TIMEOUT"] if timeout is None else timeout
    with pool.sandbox(timeout=wait) as lent:
        yield lent


def request_sandbox(request: HttpRequest) -> Sandbox:
    """The request's sandbox: borrowed on first call, given back at ``request_finished``.

    Raises:
        SandboxTimeoutError: no sandbox was free within ``ACQUIRE_TIMEOUT``.
    """
    lent: tuple[SandboxPool, Sandbox] | None = getattr(request, _REQUEST_ATTRIBUTE, None)
    if lent is None:
        pool = get_pool()
        lent = (pool, pool.acquire(timeout=_process.options["ACQUIRE_TIMEOUT"]))
        setattr(request, _REQUEST_ATTRIBUTE, lent)
        if not hasattr(_lent, "items"):
            _lent.items = []
        _lent.items.append(lent)
    return lent[1]


def close() -> None:
    """Delete this process's pooled sandboxes and close its client (a later use makes new ones)."""
    _process.close()


def _give_back(**kwargs: Any) -> None:
    """``request_finished``: return what this thread's request borrowed."""
    items: list[tuple[SandboxPool, Sandbox]] = getattr(_lent, "items", [])
    while items:
        pool, lent = items.pop()
        try:
            pool.release(lent)
        except OpenSandboxError as exc:  # a signal receiver must not break the response
            logger.warning("could not give sandbox %s back to its pool: %s", lent.id, exc)


def _settings_changed(setting: str, **kwargs: Any) -> None:
    """``override_settings(OPENSANDBOX=...)`` in tests: start again with the new settings."""
    if setting in _SPELLINGS:
        close()


request_finished.connect(_give_back, dispatch_uid="osb_sync.integrations.django.give_back")
setting_changed.connect(_settings_changed, dispatch_uid="osb_sync.integrations.django.settings")
