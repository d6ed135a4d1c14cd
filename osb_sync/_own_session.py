"""The client's own session: built once, requests prepared with requests' documented steps.

``Session.request`` does per call what a client that never changes its session need only do
once: it scans the environment for proxies (twice), the CA bundle variables and ``~/.netrc``,
and merges the session's cookies, params and auth into each request. Here a request is built
with ``Request(...).prepare()``, the session's headers merged as ``prepare_request`` merges
them, and sent with ``Session.send`` with the settings ``Session.merge_environment_settings``
gave for its origin, read again when a variable of ``ENVIRONMENT_VARIABLES`` changes or the
client is told to (``Client.reload_environment()``). The session's params, auth, hooks and
cookies are requests' defaults and never change (cookies are refused), so what reaches the
wire is what ``Session.request`` would send (pinned by tests/sockets/test_own_session.py).
"""

from __future__ import annotations

import os
from http.cookiejar import DefaultCookiePolicy
from typing import Any, Mapping, NamedTuple
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict
from requests.utils import get_netrc_auth
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from ._constants import VERSION

# The variables requests documents for proxies, CA bundles and netrc (urllib reads both cases).
ENVIRONMENT_VARIABLES = (
    "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
    "NO_PROXY", "no_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NETRC",
)  # fmt: skip
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, with the default port filled in."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


class _WaitingPool(HTTPConnectionPool):
    """A blocking pool whose wait for a free connection is bounded by the call's connect
    timeout (urllib3 waits forever: requests passes no ``pool_timeout``)."""

    def urlopen(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("pool_timeout") is None:
            timeout = kwargs.get("timeout")
            wait = getattr(timeout, "connect_timeout", timeout)
            if isinstance(wait, (int, float)):
                kwargs["pool_timeout"] = wait
        return super().urlopen(method, url, *args, **kwargs)


class _WaitingHTTPSPool(_WaitingPool, HTTPSConnectionPool):
    pass


_WAITING = {"http": _WaitingPool, "https": _WaitingHTTPSPool}


class _Adapter(HTTPAdapter):
    """requests' adapter, whose proxy pools also wait within the connect timeout when
    ``pool_block`` is set."""

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if self._pool_block:  # type: ignore[attr-defined]
            manager.pool_classes_by_scheme = _WAITING
        return manager


def new_session(pool_maxsize: int, pool_block: bool = False) -> requests.Session:
    """A session with ``pool_maxsize`` connections per host, no retries and no cookies; with
    ``pool_block`` a call waits (within its connect timeout) for a free connection rather than
    opening one more."""
    session = requests.Session()
    adapter = _Adapter(
        pool_connections=pool_maxsize,
        pool_maxsize=pool_maxsize,
        max_retries=0,
        pool_block=pool_block,
    )
    if pool_block:
        adapter.poolmanager.pool_classes_by_scheme = _WAITING  # type: ignore[assignment]
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))
    session.headers["User-Agent"] = f"osb-sync/{VERSION}"
    return session


class Settings(NamedTuple):
    """What ``Session.request`` would take from the environment for one origin."""

    proxies: Mapping[str, str]
    verify: Any
    cert: Any
    auth: tuple[str, str] | None


class Environment:
    """The environment's proxies, CA bundle and netrc per origin, read again only when one of
    ``ENVIRONMENT_VARIABLES`` changes or :meth:`forget` is called (thread-safe: a race at
    worst reads the same settings twice)."""

    def __init__(self, session: requests.Session):
        self._session = session
        self._snapshot: tuple[str | None, ...] | None = None
        self._by_origin: dict[tuple[str, str, int | None], Settings] = {}

    def forget(self) -> None:
        self._snapshot = None

    def settings(self, url: str) -> Settings:
        snapshot = tuple(map(os.environ.get, ENVIRONMENT_VARIABLES))
        if snapshot != self._snapshot:
            self._by_origin = {}
            self._snapshot = snapshot
        key = origin(url)
        found = self._by_origin.get(key)
        if found is None:
            merged = self._session.merge_environment_settings(url, {}, True, None, None)
            auth = get_netrc_auth(url) if self._session.trust_env else None
            found = Settings(merged["proxies"], merged["verify"], merged["cert"], auth)
            self._by_origin[key] = found
        return found


def send_prepared(
    session: requests.Session,
    environment: Environment,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str],
    json: Any,
    params: Any,
    data: Any,
    timeout: tuple[float, float],
) -> requests.Response:
    """What ``session.request(..., stream=True, allow_redirects=False)`` would send and return.

    Raises:
        requests.RequestException: as ``Session.request`` would.
    """
    prepared = requests.Request(
        method.upper(),
        url,
        headers=_merged_headers(session.headers, headers),
        data=data or {},
        json=json,
        # b"" is requests' documented "no query" without its Protocol isinstance checks.
        params=params or b"",
    ).prepare()
    settings = environment.settings(prepared.url or url)
    if settings.auth is not None:
        prepared.prepare_auth(settings.auth)
    return session.send(
        prepared,
        timeout=timeout,
        allow_redirects=False,
        stream=True,
        verify=settings.verify,
        cert=settings.cert,
        proxies=dict(settings.proxies),
    )


def _merged_headers(
    defaults: Mapping[str, str | bytes], headers: Mapping[str, str]
) -> CaseInsensitiveDict[str | bytes]:
    """The session's headers overridden by the call's, None dropping one: what
    ``Session.prepare_request`` merges (``merge_setting``), minus requests' Protocol checks."""
    merged: CaseInsensitiveDict[str | bytes] = CaseInsensitiveDict(defaults)
    merged.update(headers)
    for name in [name for name, value in merged.items() if value is None]:
        del merged[name]
    return merged
