"""Transport policy: sessions, pools, timeouts, retries, redirects and per-call logging.

Rules that every request follows, whatever session it goes through:

- **Threads.** One client may be shared by any number of threads. Its own session is fully
  configured at construction and never mutated afterwards; per-call headers are arguments.
  The pool keeps ``pool_maxsize`` connections per host, so as many threads can stream at once
  without opening and discarding sockets; with ``pool_block`` a call past that waits for a free
  connection (within the connect timeout) instead of opening one more. Cookies are refused (the
  API uses none), which removes the only shared mutable state of a session.
- **Fork.** A child process (gunicorn, Celery prefork) must not share its parent's sockets:
  the first call in a new process opens a fresh session (for a caller's session, it drops the
  inherited connection pools; its configuration is untouched).
- **Redirects.** requests forwards custom headers (the API key, execd tokens) across redirects,
  and a 307 re-sends the body. Every request is sent with ``allow_redirects=False``; a redirect
  is followed here only within the same origin (307/308 for any method, 301/302/303 for GET),
  and only for a call that allows it: execd's calls do not (a sandbox's execd could point the
  client at any route of its origin, which behind a server proxy is the lifecycle API's; real
  execd never redirects). Anything else, an unusable ``Location`` included, raises
  TransportError naming where it pointed.
- **Environment.** The client's own session honours proxies, a CA bundle and a netrc from the
  environment, as requests does, but reads them once per origin through
  ``Session.merge_environment_settings`` (requests would scan the environment on every call),
  and again when one of the variables that requests documents changes or
  ``Client.reload_environment()`` is called. Its requests are prepared once and handed to its
  adapter (``_own_session``: the same bytes, without requests' per-call session work); a
  caller's session goes through ``Session.request``, untouched.
- **Retries.** Only calls marked idempotent (lifecycle GET and DELETE) are retried, on
  connection errors (not on a failed certificate check or TLS spoken to plain HTTP: those
  are permanent) and on 429/502/503/504, with capped exponential backoff that honours a
  capped ``Retry-After``. Other calls are retried only when the connection could not be
  opened (nothing was sent). (The one POST sent again after an answer, a create answered 429,
  is re-sent by ``_lifecycle.Lifecycle.create``, which argues why; never here.) The loop is
  ours, not urllib3's, so it works with any session.
- **Deadlines.** A call made inside a wait (``ready_timeout``, a run's ``timeout``) passes
  that wait's ``deadline``: its connect and read timeouts are at most the time left, and no
  retry is made whose backoff would pass it. The connect and read timeouts stay what they
  are for every other call.
- **Whole calls.** The read timeout bounds each silence, not their sum: a peer that sends a
  byte now and then keeps a read alive for good. A call with a ``deadline`` or a
  ``call_timeout`` (every execd call) is cut at the earlier of the two, ``call_timeout`` counted
  from the request sent: its socket is shut down (``_watchdog.Cutoff``, fired by the shared
  watchdog thread) and it raises TransportError, never retried. The bound covers the whole of
  an answer that is not streamed, and a streamed one until its headers (a run's body is
  bounded by its ``timeout``, a download's by its own). Through a caller's session the
  headers cannot be cut (its connections are not the client's): the bound starts once they
  are in.
- **Close.** ``close()`` closes the client's own session and every connection it opened
  (its adapter remembers each connection an answer came on: ``_own_session``).
"""

from __future__ import annotations

import io
import logging
import os
import time
from typing import Any, Iterable, Mapping, NamedTuple
from urllib.parse import urljoin, urlsplit

import requests
import urllib3

from . import _failures as failures
from ._constants import CHUNK_SIZE
from ._errors import TransportError, parse_retry_after, redact
from ._json import loads
from ._own_session import Environment, new_session, origin, send_prepared, sending
from ._wait import time_left
from ._watchdog import Cutoff

logger = logging.getLogger("osb_sync")

RETRY_STATUSES = frozenset({429, 502, 503, 504})
# Lifecycle answers are small JSON; an endless or huge one is a broken peer. (execd's calls
# pass a cap of their own kind: ``_execd``.)
MAX_BODY_BYTES = 16 * 1024 * 1024
BACKOFF_BASE = 0.5
BACKOFF_MAX = 8.0
RETRY_AFTER_MAX = 30.0
MAX_REDIRECTS = 5
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


def retry_after_seconds(response: requests.Response) -> float | None:
    """``Retry-After`` (seconds or HTTP-date, ``parse_retry_after``), capped at
    RETRY_AFTER_MAX; None if absent or unusable."""
    delay = parse_retry_after(response.headers.get("Retry-After"))
    return None if delay is None else min(delay, RETRY_AFTER_MAX)


def response_json(response: requests.Response) -> Any:
    """The decoded body, or None when it is empty or not JSON (absurd nesting included)."""
    try:
        return loads(response.content) if response.content else None
    except ValueError:
        return None


def backoff_seconds(attempt: int, cap: float = BACKOFF_MAX) -> float:
    """Exponential backoff for retry number ``attempt`` (0-based), at most ``cap`` seconds."""
    return float(min(cap, BACKOFF_BASE * 2.0 ** min(attempt, 16)))


class Transport:
    """Sends every HTTP request of one client (see the module docstring for the rules)."""

    def __init__(
        self,
        *,
        session: requests.Session | None,
        connect_timeout: float,
        read_timeout: float,
        pool_maxsize: int,
        max_retries: int,
        pool_block: bool = False,
        call_timeout: float | None = None,
    ):
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.call_timeout = call_timeout
        self._pool_maxsize = pool_maxsize
        self._pool_block = pool_block
        self._max_retries = max_retries
        self._owns_session = session is None
        self._session = session if session is not None else self._new_session()
        self._environment = Environment(self._session)
        self._pid = os.getpid()

    def reload_environment(self) -> None:
        """Read proxy, CA bundle and netrc settings again before the next request."""
        self._environment.forget()

    def _new_session(self) -> requests.Session:
        return new_session(self._pool_maxsize, self._pool_block)

    @property
    def session(self) -> requests.Session:
        """The session to use in this process (a fresh one after a fork)."""
        if os.getpid() != self._pid:
            if self._owns_session:
                self._session = self._new_session()
                self._environment = Environment(self._session)
            else:
                for adapter in self._session.adapters.values():
                    adapter.close()
            self._pid = os.getpid()
        return self._session

    def tls_settings(self, url: str) -> tuple[Any, Any]:
        """``(verify, cert)`` as a request to ``url`` would use them (the session's, merged
        with the environment's CA bundle): for a connection the transport does not make
        itself (a WebSocket)."""
        settings = self._environment.settings(url)
        return settings.verify, settings.cert

    def close(self) -> None:
        """Close the session if this transport created it, and every socket it opened.

        A caller's session is theirs: it is left as it is. A request after ``close()`` opens
        new connections.
        """
        if self._owns_session:
            self._session.close()

    def request(
        self,
        method: str,
        url: str,
        *,
        read_timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        params: Any = None,
        data: Any = None,
        stream: bool = False,
        idempotent: bool = False,
        secrets: Iterable[str] = (),
        deadline: float | None = None,
        follow_redirects: bool = True,
        call_timeout: float | None = None,
        max_body: int = MAX_BODY_BYTES,
    ) -> requests.Response:
        """Send one request and return the response, whatever its status.

        ``read_timeout`` overrides the transport's for this call (bounding silence, not the
        whole response). ``deadline`` (a ``time.monotonic()`` instant) bounds the connect and
        read timeouts by the time left, and the retries: none is made past it. ``deadline``
        and ``call_timeout`` (seconds from the request sent) bound the whole call (see the
        module docstring). Without ``follow_redirects`` a redirect raises TransportError. A
        body that is not streamed is read whole, at most ``max_body`` bytes.

        Raises:
            TransportError: no usable response (after the retries this call allows), no whole
                answer within the call's bound, or the deadline had passed before the request
                could be sent.
        """
        call = _Call(
            method=method,
            url=url,
            timeout=(self.connect_timeout, read_timeout or self.read_timeout),
            headers=dict(headers or {}),
            json=json,
            params=params,
            data=data,
            stream=stream,
            secrets=tuple(secrets),
            follow_redirects=follow_redirects,
            deadline=deadline,
            call_timeout=call_timeout,
            max_body=max_body,
        )
        attempt = 0
        while True:
            try:
                response = self._send(_within(call, deadline))
            except _ConnectFailed as exc:
                delay = backoff_seconds(attempt)
                if (
                    attempt >= self._max_retries
                    or exc.permanent
                    or not (idempotent or exc.nothing_sent)
                    or _passes(deadline, delay)
                ):
                    raise exc.error from exc.__cause__
            else:
                if deadline is not None and stream:
                    _allow_silence(response, call.timeout[1])
                if not idempotent or response.status_code not in RETRY_STATUSES:
                    return response
                delay = retry_after_seconds(response) or backoff_seconds(attempt)
                if attempt >= self._max_retries or _passes(deadline, delay):
                    return response
                response.close()
            logger.debug("%s %s: retrying in %.2f s", method, call.path, delay)
            time.sleep(delay)
            attempt += 1

    def _send(self, call: _Call) -> requests.Response:
        """Send, following redirects only within the same origin."""
        for _ in range(MAX_REDIRECTS + 1):
            response = self._send_once(call)
            if response.status_code not in _REDIRECT_STATUSES:
                return response
            if not call.follow_redirects:
                response.close()
                raise TransportError(
                    f"{call.method} {call.path} -> {response.status_code} redirect to "
                    f"{_shown_location(response, call.secrets)} refused: this call follows no "
                    "redirect (execd's calls never do: it is the sandbox's)"
                )
            if call.data is not None and not isinstance(call.data, bytes):
                response.close()
                raise TransportError(
                    f"{call.method} {call.path} -> {response.status_code}: a streamed body "
                    "cannot be sent again to follow a redirect"
                )
            target = self._redirect_target(call.method, call.url, response, call.secrets)
            call = call._replace(url=target, params=None)  # the Location has its own query
        raise TransportError(f"{call.method} {call.path}: more than {MAX_REDIRECTS} redirects")

    def _send_once(self, call: _Call) -> requests.Response:
        started = time.monotonic()
        cutoff = None
        if call.deadline is not None or call.call_timeout is not None:
            cutoff = Cutoff(call.deadline, call.call_timeout)
        try:
            if self._owns_session:
                sending(cutoff)  # started by the connection once the request is sent
                try:
                    response = self._send_own(call)
                finally:
                    sending(None)
            else:
                response = self._send_theirs(call)
            if cutoff is not None:
                cutoff.start(answer_socket(response))  # for a caller's session: only now
            if not call.stream:
                # A body asked for as is is read as is: never inflated before the caller saw it.
                _read_capped_body(
                    response,
                    call.max_body,
                    call.headers.get("Accept-Encoding") != "identity",
                    cutoff,
                )
            elif cutoff is not None and cutoff.finish():  # the headers came as it cut
                response.close()
                raise _CutOff
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError, _CutOff) as exc:
            elapsed = (time.monotonic() - started) * 1000
            logger.debug(
                "%s %s -> %s after %.1f ms", call.method, call.path, type(exc).__name__, elapsed
            )
            if cutoff is not None and cutoff.finish():
                error = TransportError(
                    f"{call.method} {call.path}: no whole answer within {cutoff.describe()}: "
                    "the connection was cut"
                )
                raise _ConnectFailed(error, False, True) from None
            message = failures.describe(call.method, call.url, exc, call.timeout)
            error = TransportError(redact(message, call.secrets))
            raise _ConnectFailed(error, _nothing_sent(exc), failures.is_permanent(exc)) from exc
        except _BodyTooLarge:
            raise TransportError(
                f"{call.method} {call.path}: the response body exceeded {call.max_body} bytes"
            ) from None
        finally:
            if cutoff is not None:
                cutoff.finish()
        elapsed = (time.monotonic() - started) * 1000
        logger.debug(
            "%s %s -> %d in %.1f ms", call.method, call.path, response.status_code, elapsed
        )
        return response

    def _send_theirs(self, call: _Call) -> requests.Response:
        """Through a caller's session: ``Session.request``, with whatever it configured."""
        return self.session.request(
            call.method, call.url, stream=True, allow_redirects=False, **call.send_arguments()
        )

    def _send_own(self, call: _Call) -> requests.Response:
        """Through the client's own session (``_own_session``: prepared once, sent by its
        adapter, the environment read once per origin)."""
        return send_prepared(
            self.session, self._environment, call.method, call.url, **call.send_arguments()
        )

    @staticmethod
    def _redirect_target(
        method: str, url: str, response: requests.Response, secrets: tuple[str, ...]
    ) -> str:
        location = response.headers.get("Location", "")
        response.close()
        path = urlsplit(url).path
        try:
            target = urljoin(url, location)
            shown = redact(urlsplit(target)._replace(query="", fragment="").geturl(), secrets)
            elsewhere = origin(target) != origin(url)
        except ValueError:  # a host or port urllib cannot read
            raise TransportError(
                f"{method} {path} -> {response.status_code} redirect to an unusable Location "
                f"({_shown_location(response, secrets)})"
            ) from None
        if elsewhere:
            raise TransportError(
                f"{method} {path} -> {response.status_code} redirect to another origin "
                f"({shown}) refused: credentials are never sent to another origin"
            )
        if response.status_code not in (307, 308) and method != "GET":
            raise TransportError(
                f"{method} {path} -> {response.status_code} redirect to {shown} refused: "
                "it would change the method"
            )
        return target


def _shown_location(response: requests.Response, secrets: tuple[str, ...]) -> str:
    """A redirect's ``Location`` as an error shows it: credentials redacted, quoted, cut."""
    location = redact(response.headers.get("Location", ""), secrets)
    return repr(location if len(location) <= 200 else location[:200] + "...")


class _Call(NamedTuple):
    """One request as the caller described it (redirects replace ``url`` and ``params``)."""

    method: str
    url: str
    timeout: tuple[float, float]
    headers: dict[str, str]
    json: Any
    params: Any
    data: Any
    stream: bool
    secrets: tuple[str, ...]
    follow_redirects: bool
    deadline: float | None  # the whole call's bound (with call_timeout): see the module
    call_timeout: float | None
    max_body: int

    @property
    def path(self) -> str:
        return urlsplit(self.url).path

    def send_arguments(self) -> dict[str, Any]:
        """What both send paths pass on as keywords: headers, body, query and timeout."""
        return {
            "headers": self.headers,
            "json": self.json,
            "params": self.params,
            "data": self.data,
            "timeout": self.timeout,
        }


def _within(call: _Call, deadline: float | None) -> _Call:
    """``call`` with its connect and read timeouts at most the time left before ``deadline``.

    Raises:
        TransportError: the deadline has passed: nothing is sent.
    """
    left = time_left(deadline)
    if left is None:
        return call
    if left <= 0:
        raise TransportError(f"{call.method} {call.path}: not sent, its deadline had passed")
    connect, read = call.timeout
    return call._replace(timeout=(min(connect, left), min(read, left)))


def answer_socket(response: requests.Response) -> Any:
    """The socket an answer comes on (``HTTPResponse.connection.sock``, public attributes of
    urllib3 and http.client), or None when another adapter does not say."""
    return getattr(getattr(response.raw, "connection", None), "sock", None)


def _allow_silence(response: requests.Response, read_timeout: float) -> None:
    """Once a streamed answer's headers came within the deadline, allow its body the read
    timeout again: the deadline bounded the wait for the headers, the silence of a stream is
    the read timeout's (a run's watchdog bounds the whole).

    Through the connection's socket (``HTTPResponse.connection.sock``, public attributes of
    urllib3 and http.client); urllib3 sets a reused connection's timeout again on each
    request. Without them (another adapter) the bounded timeout stays.
    """
    sock = answer_socket(response)
    if sock is not None:
        try:
            sock.settimeout(read_timeout)
        except OSError:
            pass  # closed meanwhile: the read will say so


def _passes(deadline: float | None, delay: float) -> bool:
    """Whether sleeping ``delay`` seconds would reach ``deadline``."""
    return deadline is not None and time.monotonic() + delay >= deadline


class _BodyTooLarge(Exception):
    """Internal: a non-streamed response passed its cap."""


class _CutOff(Exception):
    """Internal: the whole-call bound cut the connection as the answer came (what was read
    may only look whole)."""


def _read_capped_body(
    response: requests.Response, cap: int, decode: bool, cutoff: Cutoff | None
) -> None:
    """Read a whole (non-streamed) body, at most ``cap`` bytes, and release the connection
    (raise _CutOff if ``cutoff`` cut it meanwhile).

    requests would read an endless body forever; here it is read through urllib3's public
    ``stream()`` (``decode``: its ``Content-Encoding`` undone) and swapped for an in-memory
    file, from which ``.content`` reads as usual.
    """
    raw = response.raw
    if not hasattr(raw, "stream"):  # not urllib3 (an exotic adapter): no cap possible
        response.content  # noqa: B018 - loads the body
        return
    pieces: list[bytes] = []
    total = 0
    for chunk in raw.stream(CHUNK_SIZE, decode_content=decode):
        total += len(chunk)
        if total > cap:
            response.close()
            raise _BodyTooLarge
        pieces.append(chunk)
    if cutoff is not None and cutoff.finish():
        response.close()  # it only looks whole: a cut ends headers and length-less bodies
        raise _CutOff
    raw.release_conn()
    response.raw = io.BytesIO(b"".join(pieces))
    response.content  # noqa: B018 - caches the body, as a non-streamed request would


class _ConnectFailed(Exception):
    """Internal: a request raised; carries the public error and whether a retry is safe
    (nothing was sent) or pointless (the failure is permanent, such as a bad certificate)."""

    def __init__(self, error: TransportError, nothing_sent: bool, permanent: bool):
        super().__init__(str(error))
        self.error = error
        self.nothing_sent = nothing_sent
        self.permanent = permanent


def never_sent(error: TransportError) -> bool:
    """True when the request behind ``error`` never left: its connection was never opened."""
    return error.__cause__ is not None and _nothing_sent(error.__cause__)


def _nothing_sent(exc: BaseException) -> bool:
    """True when the connection was never opened, so not even a POST reached the server."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(reason, urllib3.exceptions.NewConnectionError)
