"""Configuration: the API base from arguments or environment, the client's settings, checks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from ._constants import API_BASE_ENV, DOMAIN_ENV, LANGUAGES
from ._errors import ConfigurationError


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
            f"or set {API_BASE_ENV} (or {DOMAIN_ENV})"
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
        create_timeout: seconds allowed for ``POST /sandboxes``.
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
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive number of seconds")
            object.__setattr__(self, name, float(value))  # frozen: set once, here
        size = self.pool_maxsize
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigurationError("pool_maxsize must be a positive int")
        if not isinstance(self.pool_block, bool):
            raise ConfigurationError("pool_block must be True or False")
        retries = self.max_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigurationError("max_retries must be an int >= 0")


DEFAULT_SETTINGS = ClientSettings()


def execd_url(endpoint: str, scheme: str) -> str:
    """``scheme://endpoint`` for a scheme-less endpoint (which may carry a path)."""
    endpoint = endpoint.strip().rstrip("/")
    if "://" in endpoint:
        return endpoint
    return f"{scheme}://{endpoint}"


def check_id(sandbox_id: object) -> str:
    """A sandbox id, checked to be a non-empty str."""
    if not isinstance(sandbox_id, str) or not sandbox_id.strip():
        raise ConfigurationError("a sandbox id must be a non-empty str")
    return sandbox_id


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
    if not isinstance(max_output_bytes, int) or max_output_bytes <= 0:
        raise ConfigurationError("max_output_bytes must be a positive int")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ConfigurationError("timeout must be a positive number of seconds, or None")
