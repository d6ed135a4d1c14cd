"""Exceptions raised by osb_sync, and the one funnel that turns a response into one.

The tree::

    OpenSandboxError
    ├── ConfigurationError      (also ValueError)     bad arguments or environment
    ├── SandboxStateError       (also ValueError)     a sandbox (or snapshot) entered a state it
    │                                                  cannot be used from (Failed, Terminated...)
    ├── SandboxTimeoutError     (also TimeoutError)   not ready in time, or a run past its deadline
    ├── OutputLimitExceeded     (also ValueError)     a run's output passed max_output_bytes
    │                                                 (or a file read its max_bytes)
    ├── CommandFailed                                  CommandResult.check() on a failed command,
    │                                                  or a background command that did not start
    ├── PoolClosedError                                a SandboxPool closed, or destroyed by any
    │                                                  process that shares it
    ├── ApiError                (also requests.HTTPError)  the server answered with an error status
    │   ├── NotFoundError                              404
    │   │   └── EndpointNotReadyError                  404 KUBERNETES::POD_IP_NOT_AVAILABLE
    │   ├── NotSupportedError                          the server does not serve the feature
    │   │                                              (404 for the route itself, 405, 501)
    │   ├── CapacityError                              429: no capacity now (``retry_after``)
    │   ├── QuotaExceededError                         403 KUBERNETES::QUOTA_EXCEEDED
    │   ├── StartTimeoutError   (also SandboxTimeoutError)  504 KUBERNETES::POD_READY_TIMEOUT
    │   └── ProxyError                                 the server's proxy to a sandbox failed
    │       ├── ProxyConnectError                      502 BACKEND_CONNECTION_FAILED
    │       ├── ProxyResponseError                     502 BACKEND_RESPONSE_FAILED
    │       └── ProxyTimeoutError                      504 BACKEND_TIMEOUT
    └── TransportError          (also requests.ConnectionError)  no usable response
        └── StreamError                                a stream broke, stalled or ended truncated

``OpenSandboxError`` itself is never raised, only the classes below it
(``tests/unit/test_layers.py`` checks the source): ``except OpenSandboxError`` catches
everything the package raises, and each failure has a class of its own to catch. An answer
that breaks the protocol (a success whose body is unusable) is an ``ApiError`` with ``code``
``INVALID_RESPONSE`` (:func:`invalid_response`).

The Kubernetes faults (``KUBERNETES_FAULTS``) are chosen by status and code in the one funnel,
:func:`error_from_response`, and keep the server's ``code`` and ``message``; a 429 is a
:class:`CapacityError` whatever its code. None of them makes a call that is not idempotent
(a ``POST``) retried by the transport; the one call retried on purpose is a create answered
429, whose sandbox the server deleted before answering (``_lifecycle.Lifecycle.create``).

Every message names what happened and, where known, the request id; none contains an API key
or an execd token.
"""

from __future__ import annotations

import email.utils
import math
import pickle
import sys
import time
from datetime import timezone
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

import requests

from ._constants import REQUEST_ID_HEADER
from ._json import loads

_MAX_BODY_EXCERPT = 300


class OpenSandboxError(Exception):
    """Root of every error raised by osb_sync (never raised itself: catch it, raise a leaf).

    Every one pickles as its class and fields (a process pool or a task queue sends a worker's
    exception back that way), without the ``requests`` response and request (whose headers
    hold the API key) and without a ``partial`` result that does not pickle."""

    def __reduce__(self) -> tuple[Any, ...]:
        state = dict(self.__dict__)
        for name in ("response", "request"):
            if name in state:
                state[name] = None
        if "_build_partial" in state:  # OutputLimitExceeded's: built now, once
            state["_partial"], state["_build_partial"] = getattr(self, "partial", None), None
        for name in ("partial", "_partial"):
            if name in state and not _pickles(state[name]):
                state[name] = None
        return (_rebuild, (type(self), self.args, state))


def _pickles(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 (whatever pickling a caller's value raises)
        return False
    return True


def _rebuild(cls: type[OpenSandboxError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """An unpickled error: `cls` with `args` and `state`, its ``__init__`` not called."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class ConfigurationError(OpenSandboxError, ValueError):
    """The client was given bad configuration or arguments."""


class SandboxStateError(OpenSandboxError, ValueError):
    """The sandbox reached a state it cannot run from (Failed, Stopping, Terminated)."""


class SandboxTimeoutError(OpenSandboxError, TimeoutError):
    """Something did not happen within its deadline."""


class OutputLimitExceeded(OpenSandboxError, ValueError):
    """A run's output passed ``max_output_bytes`` (bytes not decoded yet, a line that is not an
    event or one still being read, count by their size on the wire), or a file read its
    ``max_bytes``: the stream was closed and the run interrupted. ``limit`` is the limit that
    was passed (the cap or ``max_bytes``); ``partial`` the result so far (at most the cap's
    worth of output).

    A run's ``partial`` is built when first read, not when the run stops: joining the kept
    output into one string costs as much memory again, so a caller that does not read it never
    holds the cap's worth twice (issue 29)."""

    def __init__(self, message: str, *, limit: int, partial: Any = None):
        super().__init__(message)
        self.limit = limit
        self._partial = partial
        self._build_partial: Callable[[], Any] | None = None

    @property
    def partial(self) -> Any:
        """The result so far (None when there is none); built on first access, then kept."""
        if self._build_partial is not None:
            self._partial, self._build_partial = self._build_partial(), None
        return self._partial

    @partial.setter
    def partial(self, value: Any) -> None:
        self._partial, self._build_partial = value, None

    def partial_from(self, build: Callable[[], Any]) -> None:
        """Let ``partial`` be ``build()``, called when ``partial`` is first read."""
        self._partial, self._build_partial = None, build


class CommandFailed(OpenSandboxError):
    """A command exited non-zero (raised by ``CommandResult.check()``), or a background command
    did not start (``commands.start``)."""

    def __init__(self, message: str, *, exit_code: int | None, stderr: str):
        super().__init__(message)
        self.exit_code = exit_code
        self.stderr = stderr


class PoolClosedError(OpenSandboxError):
    """A :class:`~osb_sync.SandboxPool` was closed, or destroyed (by any process sharing it):
    it lends nothing more."""


class ApiError(OpenSandboxError, requests.HTTPError):
    """The server answered with an error status.

    Attributes:
        status_code: the HTTP status.
        code: the server's error code (e.g. ``DOCKER::SANDBOX_NOT_FOUND``), or None.
        message: the server's message, or an excerpt of the body.
        request_id: the ``X-Request-ID`` of the response, or None.
        response: the ``requests.Response``.
    """

    def __init__(
        self,
        text: str,
        *,
        status_code: int,
        code: str | None = None,
        message: str = "",
        request_id: str | None = None,
        response: requests.Response | None = None,
    ):
        requests.HTTPError.__init__(self, text, response=response)
        self.status_code = status_code
        self.code = code
        self.message = message
        self.request_id = request_id


class NotFoundError(ApiError):
    """The server answered 404: the sandbox (or the thing asked for) does not exist."""


class NotSupportedError(ApiError):
    """The server does not serve a feature: the route is unknown to it (404), the method is
    not allowed (405), or its runtime does not implement it (501).

    The message names the feature, the server's version when it told it, and what would serve
    it (e.g. "pools need OpenSandbox's Kubernetes runtime").

    Attributes:
        feature: the feature asked for, e.g. ``"pools"``.
        server_version: the server's ``/version``, or None when it did not say.
    """

    def __init__(
        self,
        text: str,
        *,
        feature: str = "",
        server_version: str | None = None,
        status_code: int,
        code: str | None = None,
        message: str = "",
        request_id: str | None = None,
        response: requests.Response | None = None,
    ):
        super().__init__(
            text,
            status_code=status_code,
            code=code,
            message=message,
            request_id=request_id,
            response=response,
        )
        self.feature = feature
        self.server_version = server_version


class EndpointNotReadyError(NotFoundError):
    """404 ``KUBERNETES::POD_IP_NOT_AVAILABLE``: the sandbox's pod has no address yet (it is
    starting). Endpoint waits retry it until their ``ready_timeout``."""


class CapacityError(ApiError):
    """429: the server has no capacity now: its pool is full
    (``KUBERNETES::POOL_CAPACITY_EXHAUSTED``), its fast path is exhausted (``FSB::API_ERROR``),
    or a gateway limits the rate.

    A create answered 429 is retried within ``create_timeout``; this is raised when the wait
    the server asks for does not fit in the time left.

    Attributes:
        retry_after: the seconds the server asked to wait (``Retry-After``), or None when it
            gave none that could be read (absent, negative, not a number or date).
    """

    def __init__(self, text: str, *, retry_after: float | None = None, **fields: Any):
        super().__init__(text, **fields)
        self.retry_after = retry_after


class QuotaExceededError(ApiError):
    """403 ``KUBERNETES::QUOTA_EXCEEDED``: the namespace's ResourceQuota refused the sandbox
    (delete sandboxes, ask for less, or raise the quota); the server deleted what it made."""


class StartTimeoutError(ApiError, SandboxTimeoutError):
    """504 ``KUBERNETES::POD_READY_TIMEOUT``: the server gave up waiting for the sandbox's pod
    to run (its ``sandbox_create_timeout_seconds``); the server deleted what it made."""


class ProxyError(ApiError):
    """The server's proxy could not complete a call to the sandbox (``use_server_proxy``)."""


class ProxyConnectError(ProxyError):
    """502 ``BACKEND_CONNECTION_FAILED``: the proxy could not connect to the sandbox (starting,
    paused or gone); the request did not reach it."""


class ProxyResponseError(ProxyError):
    """502 ``BACKEND_RESPONSE_FAILED``: the connection to the sandbox broke after connecting;
    the request may have reached it (a run may have started)."""


class ProxyTimeoutError(ProxyError):
    """504 ``BACKEND_TIMEOUT``: the sandbox did not answer the proxy in time; the request
    reached it and may still be running."""


# (status, code) -> the class of that answer, and what the message adds (the next step)
KUBERNETES_FAULTS: dict[tuple[int, str], tuple[type[ApiError], str]] = {
    (404, "KUBERNETES::POD_IP_NOT_AVAILABLE"): (
        EndpointNotReadyError,
        "the sandbox is starting: wait, or raise ready_timeout",
    ),
    (403, "KUBERNETES::QUOTA_EXCEEDED"): (
        QuotaExceededError,
        "delete sandboxes, ask for less resource_limits, or raise the namespace's quota",
    ),
    (504, "KUBERNETES::POD_READY_TIMEOUT"): (
        StartTimeoutError,
        "the server's sandbox_create_timeout_seconds passed: check the image and the pod's "
        "events (client diagnostics)",
    ),
    (502, "BACKEND_CONNECTION_FAILED"): (
        ProxyConnectError,
        "the request did not reach the sandbox: is it running?",
    ),
    (502, "BACKEND_RESPONSE_FAILED"): (
        ProxyResponseError,
        "the request may have reached the sandbox: not sent again",
    ),
    (504, "BACKEND_TIMEOUT"): (
        ProxyTimeoutError,
        "the request reached the sandbox and may still run there: not sent again",
    ),
}


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` value asks to wait (RFC 9110: delay-seconds or an HTTP date),
    uncapped; None when absent or unusable: garbage, NaN, infinity, a negative number. A date
    in the past is 0.0; digits too many for a float are the largest float. ``now``: the
    Unix time to count a date from (default: the clock).

    The one parse of ``Retry-After``: the server's value, which is untrusted; what to do with
    a value that is too long is its caller's decision (a cap, or a refusal).
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        delay = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
            if when.tzinfo is None:  # "-0000": RFC 5322's unknown zone; HTTP dates are UTC
                when = when.replace(tzinfo=timezone.utc)
            delay = when.timestamp() - (time.time() if now is None else now)
        except (TypeError, ValueError, OverflowError, IndexError):
            return None
        return max(delay, 0.0) if math.isfinite(delay) else None
    if math.isinf(delay) and text.isascii() and text.isdigit():
        return sys.float_info.max  # a valid delay-seconds too long for a float: "not soon"
    if not math.isfinite(delay) or delay < 0:
        return None
    return delay


class TransportError(OpenSandboxError, requests.ConnectionError):
    """A request got no usable response: refused, DNS, TLS, timeout, or a refused redirect."""

    def __init__(self, message: str):
        requests.ConnectionError.__init__(self, message)


class StreamError(TransportError):
    """An event stream broke, stalled past the read timeout, or ended truncated.

    Attributes:
        partial: what had been received before the fault, folded into a result.
    """

    def __init__(self, message: str, *, partial: Any = None):
        super().__init__(message)
        self.partial = partial


def with_suffix(exc: ApiError, suffix: str) -> ApiError:
    """The same ApiError (same class and fields) with ``suffix`` added to its message."""
    text = f"{exc} {suffix}"
    copy = type(exc).__new__(type(exc), text)
    copy.__dict__.update(exc.__dict__)
    copy.args = (text,)
    return copy


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every secret value that occurs in ``text``, as it is or as ``repr`` escapes it
    (a secret of fewer than 4 characters is not replaced: it would be everywhere).

    The one redaction of the package: wherever a peer's text (an execd answer, a header, an
    exception that quotes the wire) reaches a message, a log line or a repr, it went through
    this function, and a check that a value holds a secret is whether this changes it.
    """
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
            escaped = repr(secret)[1:-1]
            if escaped != secret:
                text = text.replace(escaped, "[redacted]")
    return text


def error_from_response(
    response: requests.Response, method: str, path: str, secrets: Iterable[str] = ()
) -> ApiError:
    """Build the ApiError that describes an error response: its class from the status and
    the server's code (``KUBERNETES_FAULTS``; a 429 is a CapacityError, another 404 a
    NotFoundError), its message naming what happened and, for a known fault, what to do."""
    code, message = _parse_error_body(response)
    request_id = response.headers.get(REQUEST_ID_HEADER)
    text = f"{method} {path} -> {response.status_code}"
    if code:
        text += f" {code}"
    if message:
        text += f": {message}"
    if request_id:
        text += f" (request id {request_id})"
    fields: dict[str, Any] = {}
    cls: type[ApiError] = NotFoundError if response.status_code == 404 else ApiError
    fault = KUBERNETES_FAULTS.get((response.status_code, code or ""))
    if fault is not None:
        cls, hint = fault
        text += f" ({hint})"
    elif response.status_code == 429:
        cls = CapacityError
        fields["retry_after"] = parse_retry_after(response.headers.get("Retry-After"))
        if fields["retry_after"] is not None:
            text += f" (the server asks to retry after {fields['retry_after']:g} s)"
    return cls(
        redact(text, secrets),
        status_code=response.status_code,
        code=None if code is None else redact(code, secrets),
        message=redact(message, secrets),
        request_id=request_id,
        response=response,
        **fields,
    )


def route_unknown(exc: ApiError) -> bool:
    """Whether an error says the server does not serve the route (not that a thing is absent).

    405 and 501 always do, and so does a 400 coded ``*::API_NOT_SUPPORTED`` (a runtime that
    refuses the feature). A 404 does when its body carries no error ``code``: a FastAPI
    server answers an unknown route ``{"detail": "Not Found"}``, while a missing sandbox,
    snapshot or pool comes with a code such as ``SANDBOX::NOT_FOUND``.
    """
    if exc.status_code in (405, 501):
        return True
    if exc.status_code == 400 and (exc.code or "").endswith("::API_NOT_SUPPORTED"):
        return True
    if exc.status_code != 404:
        return False
    return exc.code is None or (exc.code == "VALIDATION_ERROR" and exc.message == "Not Found")


def not_supported(
    exc: ApiError, feature: str, served_by: str, server_version: str | None
) -> NotSupportedError:
    """The NotSupportedError for ``exc``: it names the feature, the server's version and what
    would serve it."""
    version = f"server version {server_version}" if server_version else "server version unknown"
    reason = {
        400: "its runtime refuses it",
        404: "does not know this route",
        405: "does not allow this method",
    }.get(exc.status_code, "does not implement it")
    text = f"this server does not serve {feature} ({version}: it {reason}; {exc})"
    return NotSupportedError(
        f"{text}. {served_by}",
        feature=feature,
        server_version=server_version,
        status_code=exc.status_code,
        code=exc.code,
        message=exc.message,
        request_id=exc.request_id,
        response=exc.response,
    )


def invalid_response(
    response: requests.Response, what: str, secrets: Iterable[str] = ()
) -> ApiError:
    """The ApiError for a success status whose body is unusable (``what`` says how); the
    ``secrets`` a hostile peer may have echoed (into a name, a request id) are redacted."""
    method = (response.request.method or "") if response.request is not None else ""
    path = urlsplit(response.url).path if response.url else ""
    request_id = response.headers.get(REQUEST_ID_HEADER)
    text = f"{method} {path} -> {response.status_code}: {what}"
    if request_id:
        text += f" (request id {request_id})"
    return ApiError(
        redact(text, secrets),
        status_code=response.status_code,
        code="INVALID_RESPONSE",
        message=redact(what, secrets),
        request_id=request_id,
        response=response,
    )


def _parse_error_body(response: requests.Response) -> tuple[str | None, str]:
    try:
        body: Any = loads(response.content)
    except ValueError:
        return None, _excerpt(response)
    if not isinstance(body, dict):
        return None, _excerpt(response)
    code = body.get("code")
    if "message" in body or code is not None:
        return (str(code) if code is not None else None), str(body.get("message") or "")
    if "detail" in body:
        return "VALIDATION_ERROR", _describe_detail(body["detail"])
    if "error" in body:
        return None, str(body["error"])
    return None, _excerpt(response)


def _describe_detail(detail: Any) -> str:
    """Summarise FastAPI's ``{"detail": [...]}`` validation errors."""
    if not isinstance(detail, list):
        return str(detail)
    parts = []
    for item in detail:
        if isinstance(item, dict):
            loc = ".".join(str(p) for p in item.get("loc") or ())
            parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
        else:
            parts.append(str(item))
    return "; ".join(parts)


def _excerpt(response: requests.Response) -> str:
    content_type = response.headers.get("Content-Type", "")
    if "html" in content_type.lower():
        return f"an HTML page ({len(response.content)} bytes) instead of an API error body"
    text = response.content[:_MAX_BODY_EXCERPT].decode("utf-8", "replace")
    return " ".join(text.split())
