"""The client's own session: built once, each request prepared here and sent by its adapter.

``Session.request`` does per call what a client that never changes its session need only do
once: it scans the environment for proxies (twice), the CA bundle variables and ``~/.netrc``,
and merges the session's cookies, params and auth into each request. Here the settings
``Session.merge_environment_settings`` gives are read once per origin, and again when a variable
of ``ENVIRONMENT_VARIABLES`` changes or the client is told to (``Client.reload_environment()``);
a request's URL is prepared once per URL and query (cached), its headers merged and its body
encoded as ``Request.prepare`` would (a body it would not send as is, a URL with credentials, a
header requests would refuse: ``Request.prepare`` itself). The prepared request goes to the
session's adapter through ``HTTPAdapter.send``, the adapter's documented entry: requests'
own steps (its connection and TLS hooks, the proxy, the headers) and its mapping of urllib3's
errors, called from inside the adapter. ``Session.send`` is not taken: what it adds (response
hooks, cookies, the next request of a redirect, ``elapsed``) does nothing for a session whose
hooks and cookies are requests' defaults and never change (cookies are refused) and whose
redirects are the transport's. So what reaches the wire, and what a failure raises, is what
``Session.request`` would send and raise (pinned by tests/sockets/test_own_session.py), and
``responses`` (which patches ``HTTPAdapter.send``) sees every request.

What this relies on beyond requests' ``Session`` API: the subclass hooks of ``HTTPAdapter``
(``send``, ``proxy_manager_for``, ``close``; its ``poolmanager``), ``PreparedRequest``'s
documented attributes and ``prepare_url``/``prepare_auth``; of urllib3, the pool classes a
``PoolManager`` makes (``pool_classes_by_scheme``), a pool's ``ConnectionCls`` and ``urlopen``,
and a connection's ``getresponse``.

Its adapter remembers each connection an answer came on, weakly, and closes those still alive
on ``close()``: urllib3 2.x drops its pools on ``PoolManager.clear()`` without closing them
(their sockets would wait for garbage collection). Its connections start the whole-call bound
of the request being sent (``sending``) when they begin to read its answer: the bound then
covers the headers too, which for a caller's session it can cover only once they are in
(``Transport``).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from http.cookiejar import DefaultCookiePolicy
from typing import Any, Mapping, NamedTuple
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.models import PreparedRequest
from requests.structures import CaseInsensitiveDict
from requests.utils import get_netrc_auth
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from ._constants import VERSION
from ._watchdog import Cutoff

logger = logging.getLogger("osb_sync")
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


# The whole-call bound of the request this thread is sending (``Transport``), if any.
_SENDING = threading.local()


def sending(cutoff: Cutoff | None) -> None:
    """Arm ``cutoff`` when this thread's next request on the own session has been sent (its
    connection starts reading the answer); None once the request is over."""
    _SENDING.cutoff = cutoff


class _Connection(HTTPConnection):
    """urllib3's connection, whose wait for an answer starts the call's whole-call bound on its
    socket: only a cut of that socket ends a read that bytes trickle into (the read timeout
    bounds each silence, not their sum)."""

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        cutoff = getattr(_SENDING, "cutoff", None)
        if cutoff is not None:
            cutoff.start(self.sock)
        return super().getresponse(*args, **kwargs)


class _HTTPSConnection(_Connection, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _Pool, "https": _HTTPSPool}


class _WaitingPool(_Pool):
    """A blocking pool whose wait for a free connection is bounded by the call's connect
    timeout (urllib3 waits forever: requests passes no ``pool_timeout``)."""

    def urlopen(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("pool_timeout") is None:
            timeout = kwargs.get("timeout")
            wait = getattr(timeout, "connect_timeout", timeout)
            if isinstance(wait, (int, float)):
                kwargs["pool_timeout"] = wait
        return super().urlopen(method, url, *args, **kwargs)


class _WaitingHTTPSPool(_WaitingPool, _HTTPSPool):
    ConnectionCls = _HTTPSConnection


_WAITING = {"http": _WaitingPool, "https": _WaitingHTTPSPool}


class _Adapter(HTTPAdapter):
    """requests' adapter, whose pools (through a proxy too) have the connections above, and
    wait within the connect timeout when ``pool_block`` is set; it remembers the connections
    its answers came on, and closes them on ``close()``."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._connections_lock = threading.Lock()

    def send(  # type: ignore[override]  # requests' inline and types-requests' signatures differ
        self,
        request: PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> requests.Response:
        """``HTTPAdapter.send``; the connection of the answer is remembered for ``close()``."""
        response = super().send(
            request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies
        )
        connection = getattr(response.raw, "connection", None)  # urllib3's public property
        if connection is not None:
            with self._connections_lock:
                self._connections.add(connection)
        return response

    def __setstate__(self, state: dict[str, Any]) -> None:
        """An unpickled copy: requests keeps only its ``__attrs__`` (and makes a new pool
        manager), so this adapter's own state and pool classes are made again here."""
        super().__setstate__(state)  # type: ignore[misc]  # not in types-requests
        self._connections = weakref.WeakSet()
        self._connections_lock = threading.Lock()
        self.poolmanager.pool_classes_by_scheme = _WAITING if self._pool_block else _POOLS  # type: ignore[attr-defined,assignment]

    def close(self) -> None:
        """Close the pools and every connection an answer came on that is still alive."""
        super().close()
        with self._connections_lock:
            connections = list(self._connections)
            self._connections.clear()
        for connection in connections:
            try:
                connection.close()
            except OSError:
                logger.debug("closing a pooled connection failed", exc_info=True)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        manager.pool_classes_by_scheme = _WAITING if self._pool_block else _POOLS  # type: ignore[attr-defined]
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
    adapter.poolmanager.pool_classes_by_scheme = _WAITING if pool_block else _POOLS  # type: ignore[assignment]
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
    request = _prepared(session, method, url, headers, json, params, data)
    assert request.url is not None  # prepared
    settings = environment.settings(request.url)
    if settings.auth is not None:
        request.prepare_auth(settings.auth)
    return session.get_adapter(request.url).send(
        request,
        stream=True,
        timeout=timeout,
        verify=settings.verify,
        cert=settings.cert,
        proxies=dict(settings.proxies),
    )


def _prepared(
    session: requests.Session,
    method: str,
    url: str,
    headers: Mapping[str, str],
    json: Any,
    params: Any,
    data: Any,
) -> PreparedRequest:
    """The request ``Request(...).prepare()`` would make: built here from its parts (the URL
    prepared once per URL and query), or by ``prepare()`` itself when it is unusual."""
    merged = _merged_headers(session.headers, headers)
    full_url, has_credentials = _url_of(url, params)
    method = method.upper()
    body = _SLOW
    if not has_credentials and all(_valid_header(k, v) for k, v in merged.items()):
        body = _body(method, json, data, merged)
    if body is _SLOW:
        return requests.Request(
            method,
            url,
            headers=_merged_headers(session.headers, headers),
            data=data or {},
            json=json,
            # b"" is requests' documented "no query" without its Protocol isinstance checks.
            params=params or b"",
        ).prepare()
    request = PreparedRequest()
    # requests' inline annotations and types-requests type these attributes differently.
    prepared: Any = request
    prepared.method, prepared.url, prepared.headers, prepared.body = method, full_url, merged, body
    return request


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


def _prepare_url(url: str, params: Any) -> tuple[str, bool]:
    """``PreparedRequest.prepare_url`` of a URL and its query, and whether the URL carries
    credentials (which ``prepare_auth`` would turn into a header)."""
    request = PreparedRequest()
    request.prepare_url(url, params or b"")
    assert request.url is not None
    return request.url, "@" in urlsplit(request.url).netloc


@functools.lru_cache(maxsize=256)
def _cached_url(url: str, items: tuple[Any, ...]) -> tuple[str, bool]:
    return _prepare_url(url, list(items))


def _url_of(url: str, params: Any) -> tuple[str, bool]:
    """:func:`_prepare_url`, cached when the query is hashable."""
    items = params.items() if isinstance(params, Mapping) else params or ()
    try:
        return _cached_url(url, tuple(items))
    except TypeError:  # an unhashable value (a list of values): prepared, not cached
        return _prepare_url(url, params)


def _valid_header(name: Any, value: Any) -> bool:
    """What ``check_header_validity`` accepts, for str names and values (else: the slow path,
    whose error is requests')."""
    if not (isinstance(name, str) and isinstance(value, str) and name):
        return False
    both = name + value
    return not (
        name[0].isspace() or ":" in name or value[:1].isspace() or "\r" in both or "\n" in both
    )


def _body(method: str, json: Any, data: Any, headers: CaseInsensitiveDict[Any]) -> Any:
    """The body as ``prepare_body`` makes it, its Content-Length (and Content-Type for JSON)
    set in ``headers``; ``_SLOW`` when only requests' own preparation should handle it."""
    if not data and json is not None:
        try:
            body: Any = _JSON.dumps(json, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError):
            return _SLOW  # requests raises InvalidJSONError for it
        headers["Content-Length"] = str(len(body))
        if "content-type" not in headers:
            headers["Content-Type"] = "application/json"
        return body
    if not data:
        if method not in ("GET", "HEAD") and headers.get("Content-Length") is None:
            headers["Content-Length"] = "0"
        return None
    if isinstance(data, bytes) or (
        hasattr(data, "__iter__")
        and hasattr(data, "__len__")
        and not isinstance(data, (str, list, tuple, Mapping))
    ):
        length = len(data)
        if length:
            headers["Content-Length"] = str(length)
            return data
    return _SLOW


_SLOW = object()
# The json module requests encodes bodies with (simplejson when installed).
_JSON: Any = vars(requests.compat)["json"]
