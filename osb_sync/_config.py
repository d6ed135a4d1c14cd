"""Configuration: the API base from arguments or environment, the client's settings, checks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from ._constants import API_BASE_ENV, DOMAIN_ENV, LANGUAGES
from ._errors import ConfigurationError
from ._validators import non_empty, positive_seconds, whole


def resolve_api_base(api_base: str | None) -> str:
    """The lifecycle base URL from the argument or the environment, without a trailing ``/``.

    Raises:
        ConfigurationError: nothing configured, or not an http(s) URL.
    """
    if api_base is None:
        api_base = os.environ.get(API_BASE_ENV) or _base_from_domain(os.environ.get(DOMAIN_ENV))
    if not api_base:
        raise ConfigurationError(
            f"api_base is required: pass api_base (e.g. 'http://127.0.0.1:8080/v1') "
            f"or set {API_BASE_ENV} (or {DOMAIN_ENV}); no server yet? start one with "
            "`osb-sync serve`, or in Python: with osb_sync.local.LocalServer() as server: "
            "Client(server.api_base)"
        )
    api_base = api_base.strip().rstrip("/")
    parts = urlsplit(api_base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"api_base must be an http:// or https:// URL such as 'http://127.0.0.1:8080/v1', "
            f"got {parts.scheme or 'no'} scheme"
        )
    return api_base


def _base_from_domain(domain: str | None) -> str | None:
    """The official SDK's OPEN_SANDBOX_DOMAIN: host[:port] or a URL, without ``/v1``."""
    if not domain:
        return None
    domain = domain.strip().rstrip("/")
    if "://" not in domain:
        domain = "http://" + domain
    return domain + "/v1"


@dataclass(frozen=True)
class ClientSettings:
    """A client's connection settings, checked once when built; their defaults are written
    here only (``Client``'s and ``Sandbox.from_execd``'s signatures read them off
    :data:`DEFAULT_SETTINGS`).

    Attributes:
        connect_timeout: seconds to open a connection.
        read_timeout: seconds of silence allowed on any response, streams included.
        call_timeout: seconds an execd call may take from its request sent to the end of its
            answer (of a streamed one: to its headers); None: twice ``read_timeout``. The
            read timeout bounds each silence, this their sum: a byte now and then keeps no
            call alive past it.
        create_timeout: seconds allowed for ``POST /sandboxes``, resends after a 429 included.
        pool_maxsize: connections kept per host.
        pool_block: when all ``pool_maxsize`` connections to a host are in use, wait for one
            (at most ``connect_timeout``) instead of opening one more for the call.
        max_retries: retries of idempotent lifecycle calls.
        execd_scheme: scheme for scheme-less execd endpoints (None: that of ``api_base``).

    Raises:
        ConfigurationError: naming the first bad setting.
    """

    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    call_timeout: float | None = None
    create_timeout: float = 300.0
    pool_maxsize: int = 32
    pool_block: bool = False
    max_retries: int = 2
    execd_scheme: str | None = None

    def __post_init__(self) -> None:
        if self.execd_scheme not in (None, "http", "https"):
            raise ConfigurationError("execd_scheme must be 'http', 'https' or None")
        for name in ("connect_timeout", "read_timeout", "call_timeout", "create_timeout"):
            value = getattr(self, name)
            if name == "call_timeout" and value is None:
                value = 2 * self.read_timeout  # checked the line before
            object.__setattr__(self, name, positive_seconds(name, value))  # frozen: set once
        whole("pool_maxsize", self.pool_maxsize, 1)
        if not isinstance(self.pool_block, bool):
            raise ConfigurationError(f"pool_block must be True or False, got {self.pool_block!r}")
        whole("max_retries", self.max_retries, 0)


DEFAULT_SETTINGS = ClientSettings()


def execd_url(endpoint: str, scheme: str) -> str:
    """``scheme://endpoint`` for a scheme-less endpoint (which may carry a path)."""
    endpoint = endpoint.strip().rstrip("/")
    if "://" in endpoint:
        return endpoint
    return f"{scheme}://{endpoint}"


def check_id(sandbox_id: object) -> str:
    """A sandbox id, checked to be a non-empty str."""
    return non_empty("a sandbox id", sandbox_id)


def check_run_arguments(
    code: object, language: object, max_output_bytes: object, timeout: object
) -> None:
    """Raise ConfigurationError naming the first bad argument of a code run."""
    if not isinstance(code, str):
        raise ConfigurationError(f"code must be a str, not {type(code).__name__}")
    if not code.strip():
        # Real execd never ends a run of blank code: its context would stay busy for good.
        raise ConfigurationError("code is empty or blank: there is nothing to run")
    if language not in LANGUAGES:
        raise ConfigurationError(
            f"unknown language {language!r}: execd runs {', '.join(LANGUAGES)} "
            "(which ones depend on the image)"
        )
    whole("max_output_bytes", max_output_bytes, 1)
    if timeout is not None:
        positive_seconds("timeout", timeout, "or None: no deadline")
