"""Lifecycle REST calls: create, wait until Running, resolve endpoints, get, list, delete.

Also the released server's other routes (snapshots, diagnostics, network policy, pools,
templates, ``/version``), each called as a *feature*: a server that does not serve one (404
for the route itself, 405, 501) raises :class:`NotSupportedError`, whose message says what
would serve it (``FEATURES``). Every call goes through :meth:`Lifecycle.request`, the one
funnel from a response to an exception.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator, Mapping, Sequence
from urllib.parse import quote, urlencode, urlsplit

import requests

from ._config import execd_url
from ._constants import API_KEY_ENV, API_KEY_HEADER, CREATE_ID_KEY
from ._errors import (
    ApiError,
    CapacityError,
    ConfigurationError,
    NotFoundError,
    OpenSandboxError,
    QuotaExceededError,
    SandboxStateError,
    StartTimeoutError,
    TransportError,
    error_from_response,
    invalid_response,
    not_supported,
    route_unknown,
    with_suffix,
)
from ._failures import V1_HINT
from ._models import Endpoint, SandboxInfo, parse_time
from ._transport import Transport, backoff_seconds, never_sent, response_json
from ._validators import positive_seconds, whole
from ._wait import Wait

logger = logging.getLogger("osb_sync")

FATAL_STATES = frozenset({"Failed", "Stopping", "Terminated"})
PAUSED_STATES = frozenset({"Paused", "Pausing"})
RESUME_HINT = "resume it first (sandbox.resume(), or client.resume(sandbox_id))"
EGRESS_HINT = (
    "Hint: this server has no egress support for networkPolicy; pass "
    "allow_internet_access=True or configure egress on the server."
)
MAX_PAGE_SIZE = 200
# A retried create is sent only with at least this long left for its answer.
MIN_CREATE_ATTEMPT = 1.0
KEY_HINT = f"set {API_KEY_ENV} or pass api_key= with the server's key"


def _names_network_policy(exc: ApiError) -> bool:
    """The server's 400 is about the network policy (not merely a create that had one)."""
    text = (exc.message or "").lower()
    return "networkpolicy" in text or "egress" in text


def _v1_base(api_base: str) -> str:
    """The API base with its version segment (``/v2``, none) replaced by ``/v1``."""
    head, _, last = api_base.rstrip("/").rpartition("/")
    if head and len(last) > 1 and last[0] == "v" and last[1:].isdigit():
        return f"{head}/v1"
    return f"{api_base.rstrip('/')}/v1"


# feature -> what would serve it (the end of a NotSupportedError's message)
FEATURES = {
    "snapshots": "Snapshots need OpenSandbox server 1.1 or later (Docker or Kubernetes "
    "runtime), or osb-sync serve.",
    "diagnostics": "Diagnostics need OpenSandbox server 1.1 or later, or osb-sync serve.",
    "scoped diagnostics": "The stable Diagnostics API (diagnostic-api.yml) is served by "
    "osb-sync serve; the released Docker runtime answers 501 to a scope: pass scope=None "
    "for its plain-text logs and events.",
    "network policy changes": "Changing a running sandbox's network policy needs OpenSandbox "
    "server 1.1 or later with egress configured (egress.image), or osb-sync serve.",
    "pools": "Pools need OpenSandbox's Kubernetes runtime (osb-sync serve keeps them as warm "
    "spares).",
    "templates": "Templates need OpenSandbox's Kubernetes runtime with fsb templates "
    "(SandboxTemplate CRDs).",
    "server version": "GET /version needs OpenSandbox server 1.1 or later.",
    "sandbox stats": "A sandbox's usage against its limits is an extension of osb-sync serve "
    "(GET /sandboxes/{id}/stats); OpenSandbox's server has none: sandbox.metrics() gives "
    "execd's figures, which are the host's.",
    "signed endpoints": "A signed endpoint (expires) needs OpenSandbox's ingress gateway with "
    "secure access configured (Kubernetes); without expires, the endpoint's headers "
    "authorize the call.",
}
_UNASKED = object()  # the server's version before anyone asked


# A caller's own bound on a create's 429 resends (``resends_by``): a pool's acquire timeout.
_resend_deadline: ContextVar[float | None] = ContextVar("osb_sync_resend_deadline", default=None)


@contextmanager
def resends_by(deadline: float | None) -> Iterator[None]:
    """Within the block, a create answered 429 is sent again only while its wait and a
    second more fit before ``deadline`` (a ``time.monotonic()`` instant; None: no bound but
    ``create_timeout``), so a caller with a timeout of its own (``SandboxPool.acquire``) is
    not held past it by resends."""
    token = _resend_deadline.set(deadline)
    try:
        yield
    finally:
        _resend_deadline.reset(token)


def _retagged(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with a fresh ``osb-sync/create-id`` tag (when it has one): a retried create's
    own, so the search for a refused attempt's sandbox can never find the retried one."""
    metadata = body.get("metadata")
    if not isinstance(metadata, dict) or CREATE_ID_KEY not in metadata:
        return body
    return {**body, "metadata": {**metadata, CREATE_ID_KEY: os.urandom(8).hex()}}


def sandbox_path(sandbox_id: str) -> str:
    """``/sandboxes/{id}`` with the id escaped, so no id can reach another route."""
    return f"/sandboxes/{quote(sandbox_id, safe='')}"


def epoch(when: datetime | int | None) -> int | None:
    """Unix epoch seconds of a time (a naive time is UTC), or the int given; None stays None.

    Raises:
        ConfigurationError: not a datetime or an int, or a time already past.
    """
    if when is None:
        return None
    if isinstance(when, datetime):
        aware = when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
        seconds = int(aware.timestamp())
    elif type(when) is int:
        seconds = when
    else:
        raise ConfigurationError(f"expires must be a datetime or Unix epoch seconds, got {when!r}")
    if seconds <= datetime.now(timezone.utc).timestamp():
        raise ConfigurationError(f"expires must be in the future, got epoch second {seconds}")
    return seconds


def _state_of(data: Any) -> str | None:
    status = data.get("status") if isinstance(data, dict) else None
    state = status.get("state") if isinstance(status, dict) else None
    return state if isinstance(state, str) else None


def _describe_state(data: Any) -> str:
    status = data.get("status") if isinstance(data, dict) else None
    if not isinstance(status, dict):
        return ""
    details = [str(status[k]) for k in ("reason", "message") if status.get(k)]
    return f" ({': '.join(details)})" if details else ""


class Lifecycle:
    """The lifecycle API of one server, reached through a Transport with one API key."""

    def __init__(
        self,
        transport: Transport,
        api_base: str,
        api_key: str,
        create_timeout: float,
        execd_scheme: str,
    ):
        self.api_base = api_base
        self.execd_scheme = execd_scheme
        self._transport = transport
        self._api_key = api_key
        self._create_timeout = create_timeout
        self._server_version: Any = _UNASKED
        # /version is served at the server's root, beside /v1
        self.server_root = api_base[: -len("/v1")] if api_base.endswith("/v1") else api_base
        self._searched = False  # a failed create started a background search (see close)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Any = None,
        read_timeout: float | None = None,
        check: bool = True,
        secrets: tuple[str, ...] = (),
        feature: str | None = None,
        root: bool = False,
        deadline: float | None = None,
    ) -> requests.Response:
        """Send a lifecycle call with the API key; raise ApiError for an error status if asked.

        ``secrets`` (besides the API key) are redacted from any error message; ``deadline``
        (a ``time.monotonic()`` instant) bounds the call's waits by the time left. ``feature``
        (a key of ``FEATURES``) turns an answer saying the server does not serve the route
        into a NotSupportedError. ``root``: ``path`` is under the server's root, not ``/v1``.

        Raises:
            NotSupportedError: the server does not serve ``feature``.
            ApiError: an error status (when ``check``).
            TransportError: no usable response.
        """
        headers = {"Content-Type": "application/json"} if json is not None else {}
        if self._api_key:
            headers[API_KEY_HEADER] = self._api_key
        response = self._transport.request(
            method,
            (self.server_root if root else self.api_base) + path,
            json=json,
            params=params,
            headers=headers,
            read_timeout=read_timeout,
            idempotent=method in ("GET", "DELETE"),
            secrets=(self._api_key, *secrets),
            deadline=deadline,
        )
        if check and response.status_code >= 300:
            raise self.error(response, secrets, feature)
        return response

    def error(
        self,
        response: requests.Response,
        secrets: tuple[str, ...] = (),
        feature: str | None = None,
    ) -> ApiError:
        """The ApiError describing an error response (secrets redacted).

        For a ``feature`` call, an answer saying the route is not served is a
        NotSupportedError naming the feature and the server's version.
        """
        path = urlsplit(response.url).path if response.url else ""
        method = (response.request.method or "") if response.request is not None else ""
        exc = error_from_response(response, method, path, (self._api_key, *secrets))
        if feature is not None and route_unknown(exc):
            version = None if feature == "server version" else self.known_server_version()
            return not_supported(exc, feature, FEATURES[feature], version)
        if exc.status_code == 404 and "SANDBOX" not in (exc.code or ""):
            if not self.api_base.endswith("/v1"):
                return with_suffix(exc, f"({V1_HINT}: {_v1_base(self.api_base)}?)")
        if exc.status_code == 401:
            return with_suffix(exc, f"({KEY_HINT})")
        return exc

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /sandboxes``, all within ``create_timeout``; a failure that may have left a
        sandbox starts a search for it.

        A 429 (no capacity now) is retried after the wait its ``Retry-After`` asks for (at
        least the transport's backoff), each time with a fresh ``osb-sync/create-id`` tag,
        while the wait and a second more fit in the time left. Why a POST may be sent again
        here: the released server deletes the sandbox it made before it answers 429 (its
        ``create_sandbox`` rolls back on every error of its readiness wait, the pool's 429
        included), so nothing of the refused attempt is left to duplicate; in case that
        rollback failed, the refused attempt's own tag is searched for and deleted, and the
        fresh tag keeps that search off the retried sandbox.

        Raises:
            CapacityError: 429, and the wait asked for does not fit in ``create_timeout`` (or
                before the deadline of an enclosing ``resends_by``).
            ApiError: another error status, or a success without an id.
            TransportError: no usable response.
        """
        deadline = time.monotonic() + self._create_timeout
        caller = _resend_deadline.get()  # a caller's own timeout (resends_by), if sooner
        resend_by = deadline if caller is None else min(deadline, caller)
        bound = (
            f"create_timeout={self._create_timeout:g}; raise create_timeout"
            if resend_by == deadline
            else "the caller's timeout; pass a longer one"
        )
        attempt = 0
        while True:
            try:
                return self._create_once(body, max(deadline - time.monotonic(), 0.001))
            except CapacityError as exc:
                delay = max(exc.retry_after or 0.0, backoff_seconds(attempt))
                left = resend_by - time.monotonic()
                if delay + MIN_CREATE_ATTEMPT > left:
                    raise with_suffix(
                        exc,
                        f"(not retried: the {delay:g} s wait does not fit in the "
                        f"{max(left, 0.0):.1f} s left of {bound} or the pool's capacity)",
                    ) from None
                logger.info(
                    "POST /sandboxes -> 429 %s: retrying in %.1f s (attempt %d)",
                    exc.code,
                    delay,
                    attempt + 2,
                )
                time.sleep(delay)
                body = _retagged(body)
                attempt += 1

    def _create_once(self, body: dict[str, Any], read_timeout: float) -> dict[str, Any]:
        """One ``POST /sandboxes``; a failure that may have left a sandbox searches for it."""
        auth = body.get("image", {}).get("auth") or {}
        try:
            response = self.request(
                "POST",
                "/sandboxes",
                json=body,
                read_timeout=read_timeout,
                secrets=tuple(str(v) for v in auth.values()),
            )
        except ApiError as exc:
            if exc.status_code >= 500 or isinstance(exc, (CapacityError, QuotaExceededError)):
                # The server answered, done with the request, unless a gateway gave up (a
                # 504 without the server's own code): the server may still be making it.
                gave_up = exc.status_code == 504 and not isinstance(exc, StartTimeoutError)
                self._search_after_failed_create(body, answered=not gave_up)
            if exc.code == "SANDBOX::INVALID_PARAMETER" and _names_network_policy(exc):
                raise with_suffix(exc, EGRESS_HINT) from None
            raise
        except TransportError as exc:
            if not never_sent(exc):
                self._search_after_failed_create(body, answered=False)
            raise
        data = response_json(response)
        if not isinstance(data, dict) or data.get("id") in (None, ""):
            self._search_after_failed_create(body, answered=True)
            shape = "an object without an id" if isinstance(data, dict) else "not a JSON object"
            raise invalid_response(response, f"the create response is {shape}")
        return data

    def _search_after_failed_create(self, body: dict[str, Any], *, answered: bool) -> None:
        create_id = body.get("metadata", {}).get(CREATE_ID_KEY, "")
        if create_id:
            lifetime = body.get("timeout")  # None: the sandbox never expires
            lifetime = None if lifetime is None else float(lifetime)
            from . import _orphans as orphans  # only after a lost answer: not at import

            self._searched = True
            orphans.search(self, create_id, answered=answered, lifetime=lifetime)

    def close(self) -> None:
        """End the background searches of this API's failed creates, after their last
        chance (at most ``_orphans.EXIT_WAIT`` seconds in all, as at interpreter exit)."""
        if self._searched:
            from . import _orphans as orphans

            orphans.finish(self)

    def get(self, sandbox_id: str, deadline: float | None = None) -> Any:
        """``GET /sandboxes/{id}``: the decoded body (None if it is not JSON).

        Raises:
            NotFoundError: no such sandbox.
            ApiError: another error status.
            TransportError: no usable response (by ``deadline``, when given).
        """
        return response_json(self.request("GET", sandbox_path(sandbox_id), deadline=deadline))

    def info(self, sandbox_id: str, deadline: float | None = None) -> SandboxInfo:
        """The sandbox's current description.

        Raises:
            NotFoundError: no such sandbox.
            ApiError: another error status, or an answer that is not a JSON object.
            TransportError: no usable response (by ``deadline``, when given).
        """
        response = self.request("GET", sandbox_path(sandbox_id), deadline=deadline)
        data = response_json(response)
        if not isinstance(data, dict):
            raise invalid_response(response, "the answer is not a JSON object")
        return SandboxInfo.from_dict(data)

    def check_state(self, sandbox_id: str, deadline: float | None = None) -> str | None:
        """Read the sandbox's state and raise if execd cannot answer in it; returns the state.

        What a wait on execd asks after a ping that failed or went unanswered: a paused or
        ended sandbox would never answer, so the wait ends at once with the reason.

        Raises:
            SandboxStateError: Paused or Pausing (with the hint to resume), or Failed, Stopping
                or Terminated (with the server's reason and message).
            NotFoundError: the sandbox is gone.
            ApiError: another error status.
            TransportError: no usable response (by ``deadline``, when given).
        """
        data = self.get(sandbox_id, deadline)
        state = _state_of(data)
        if state in PAUSED_STATES:
            raise SandboxStateError(
                f"sandbox {sandbox_id} is {state}{_describe_state(data)}: {RESUME_HINT}"
            )
        if state in FATAL_STATES:
            raise SandboxStateError(f"sandbox {sandbox_id} entered {state}{_describe_state(data)}")
        return state

    def resume(self, sandbox_id: str, ready_timeout: float, poll_interval: float) -> None:
        """Resume a paused sandbox and wait until it is Running, all within ``ready_timeout``.

        Raises:
            ApiError: e.g. 409 when it is not paused.
            SandboxStateError: it entered Failed, Stopping or Terminated.
            SandboxTimeoutError: not Running within ``ready_timeout``.
        """
        wait = Wait(f"sandbox {sandbox_id} was not Running", ready_timeout)
        with wait.bounding():
            self.action(sandbox_id, "resume", wait.deadline)
            data = self.get(sandbox_id, wait.deadline)
        self.wait_until_running(sandbox_id, data, wait.left(), poll_interval)

    def endpoint(
        self,
        sandbox_id: str,
        port: int,
        use_server_proxy: bool,
        ready_timeout: float,
        poll_interval: float,
        expires: datetime | int | None = None,
    ) -> Endpoint:
        """How to reach ``port`` of a sandbox: a URL with scheme, and the headers to send.

        ``expires`` (a time, or Unix epoch seconds) asks for a signed route token valid
        until then (the released server's ``expires``; it needs an ingress gateway with
        secure access).

        Raises:
            ConfigurationError: a port outside 1..65535, or an ``expires`` in the past.
            The errors of :meth:`resolve_endpoint`.
        """
        whole("port", port, 1, 65535)
        endpoint, headers = self.resolve_endpoint(
            sandbox_id, port, use_server_proxy, ready_timeout, poll_interval, epoch(expires)
        )
        return Endpoint(url=execd_url(endpoint, self.execd_scheme), headers=headers)

    def action(self, sandbox_id: str, verb: str, deadline: float | None = None) -> None:
        """``POST /sandboxes/{id}/{verb}`` with no body (``pause``, ``resume``)."""
        self.request("POST", f"{sandbox_path(sandbox_id)}/{verb}", deadline=deadline).close()

    def renew(
        self, sandbox_id: str, seconds: float, read_timeout: float | None = None
    ) -> datetime | None:
        """Set the expiry to now + ``seconds`` (RFC 3339 UTC); returns the server's answer.

        Raises:
            ConfigurationError: ``seconds`` is not a positive number.
            ApiError: e.g. a sandbox without expiry.
        """
        lifetime = timedelta(seconds=positive_seconds("seconds", seconds))
        expires = datetime.now(timezone.utc) + lifetime
        body = {"expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}
        path = f"{sandbox_path(sandbox_id)}/renew-expiration"
        data = response_json(self.request("POST", path, json=body, read_timeout=read_timeout))
        return parse_time(data.get("expiresAt")) if isinstance(data, dict) else None

    def patch_metadata(self, sandbox_id: str, patch: Mapping[str, str | None]) -> SandboxInfo:
        """JSON merge patch of the labels; returns the sandbox as the server now describes it."""
        path = f"{sandbox_path(sandbox_id)}/metadata"
        data = response_json(self.request("PATCH", path, json=dict(patch)))
        return SandboxInfo.from_dict(data if isinstance(data, dict) else {"id": sandbox_id})

    def iter_sandboxes(
        self,
        states: Sequence[str] | None,
        metadata: Mapping[str, str] | None,
        page_size: int,
        deadline: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every sandbox matching the filters, page by page, fetched lazily (each page by
        ``deadline``, a ``time.monotonic()`` instant, when given)."""
        params: dict[str, Any] = {}
        if states:
            params["state"] = list(states)
        if metadata:
            params["metadata"] = urlencode(dict(metadata))
        return self.iter_pages("/sandboxes", params, page_size, deadline=deadline)

    def wait_until_running(
        self, sandbox_id: str, data: Any, ready_timeout: float, poll_interval: float
    ) -> None:
        """Poll while the sandbox is not Running: one sleep between two polls, and each poll
        waits at most the time left of ``ready_timeout``. Any other state is waited through:
        ``Pending``, and Kubernetes' ``Allocated`` (the pod has an address but is not ready;
        a create answers ``Running`` for it, a later GET or list may still show it).

        Raises:
            SandboxStateError: Failed, Stopping or Terminated.
            SandboxTimeoutError: not Running within ``ready_timeout``.
            NotFoundError: the sandbox disappeared.
        """
        wait = Wait(f"sandbox {sandbox_id} was not Running", ready_timeout)
        while True:
            state = _state_of(data)
            if state == "Running":
                return
            if state in FATAL_STATES:
                raise SandboxStateError(
                    f"sandbox {sandbox_id} entered {state}{_describe_state(data)}"
                )
            last = f" (last state: {state or 'unknown'}{_describe_state(data)})"
            if not wait.expired():
                wait.sleep(poll_interval)
            if wait.expired():
                raise wait.error(last)
            with wait.bounding(last):
                data = self.get(sandbox_id, wait.deadline)

    def resolve_endpoint(
        self,
        sandbox_id: str,
        port: int,
        use_server_proxy: bool,
        ready_timeout: float,
        poll_interval: float,
        expires: int | None = None,
    ) -> tuple[str, dict[str, str]]:
        """The endpoint and headers of a port; 404s and unusable bodies are retried.

        A 404 whose code says the sandbox itself is unknown (``*::SANDBOX_NOT_FOUND``) is not
        retried: only a 404 for an endpoint that is not ready yet (Kubernetes'
        ``POD_IP_NOT_AVAILABLE``, an EndpointNotReadyError, while the pod starts) is; the
        timeout names the last answer and is chained from it.

        Raises:
            NotFoundError: the sandbox does not exist.
            SandboxTimeoutError: no endpoint within ``ready_timeout`` (chained from the last error).
            ApiError: any error status other than 404.
        """
        path = f"{sandbox_path(sandbox_id)}/endpoints/{port}"
        params = {"use_server_proxy": "true" if use_server_proxy else "false"}
        if expires is not None:
            params["expires"] = str(expires)
        feature = "signed endpoints" if expires is not None else None
        wait = Wait(f"execd endpoint for {sandbox_id} was not ready", ready_timeout)
        detail = f" (use_server_proxy={use_server_proxy})"
        while True:
            try:
                with wait.bounding(detail):
                    response = self.request(
                        "GET", path, params=params, deadline=wait.deadline, feature=feature
                    )
                data = response_json(response)
            except NotFoundError as exc:
                if (exc.code or "").endswith("SANDBOX_NOT_FOUND"):
                    raise  # the sandbox is gone; only an endpoint not ready yet is retried
                last_error: Exception = exc
            else:
                # From the lifecycle API (which the API key authenticates), not from execd: the
                # server says where its sandbox's execd is and with which headers. execd calls
                # send only these, never the API key, and follow no redirect (_transport).
                endpoint = data.get("endpoint") if isinstance(data, dict) else None
                if isinstance(endpoint, str) and endpoint.strip():
                    headers = data.get("headers")
                    headers = headers if isinstance(headers, dict) else {}
                    return endpoint, {str(k): str(v) for k, v in headers.items()}
                last_error = ValueError("the endpoint response has no usable 'endpoint'")
            if not wait.expired():
                wait.sleep(poll_interval)
            if wait.expired():
                raise wait.error(f"{detail}; last answer: {last_error}") from last_error

    def delete(self, sandbox_id: str) -> bool:
        """``DELETE /sandboxes/{id}``: True if deleted, False on 404.

        Raises:
            ApiError: any other error status.
            TransportError: no usable response.
        """
        response = self.request("DELETE", sandbox_path(sandbox_id), check=False)
        response.close()
        if response.status_code == 404:
            return False
        if response.status_code >= 300:
            raise self.error(response)
        return True

    def delete_quietly(self, sandbox_id: str) -> bool:
        """Best-effort delete for cleanup paths: logs, never raises; True if it was deleted."""
        try:
            return self.delete(sandbox_id)
        except OpenSandboxError as exc:
            logger.warning("could not delete sandbox %s: %s", sandbox_id, exc)
            return False

    def find_by_create_id(self, create_id: str, deadline: float | None = None) -> list[str]:
        """Ids of the sandboxes tagged with this ``osb-sync/create-id``.

        Raises:
            ApiError: an error status.
            TransportError: no usable response (by ``deadline``, when given).
        """
        found = self.iter_sandboxes(None, {CREATE_ID_KEY: create_id}, MAX_PAGE_SIZE, deadline)
        return [
            str(item.get("id"))
            for item in found
            if isinstance(item.get("metadata"), dict)
            and item["metadata"].get(CREATE_ID_KEY) == create_id
        ]

    # -- the released server's other routes ------------------------------------------------

    def server_version(self) -> str:
        """``GET /version`` (at the server's root): the server's version.

        Raises:
            NotSupportedError: the server has no ``/version`` (before 1.1).
            ApiError: another error status, or an answer without a version.
            TransportError: no usable response.
        """
        response = self.request("GET", "/version", feature="server version", root=True)
        data = response_json(response)
        version = data.get("version") if isinstance(data, dict) else data
        if not isinstance(version, str) or not version.strip():
            raise invalid_response(response, "the /version answer has no 'version' string")
        self._server_version = version
        return version

    def known_server_version(self) -> str | None:
        """The server's version for an error message: asked once, None if it does not say."""
        if self._server_version is _UNASKED:
            self._server_version = None  # asked once, even when it fails
            try:
                self.server_version()
            except OpenSandboxError as exc:
                logger.debug("the server did not tell its version: %s", exc)
        return self._server_version if isinstance(self._server_version, str) else None

    def call(
        self,
        method: str,
        path: str,
        feature: str,
        *,
        json: Any = None,
        params: Any = None,
    ) -> Any:
        """One call of a feature: its decoded JSON answer (None when empty).

        Raises:
            NotSupportedError: the server does not serve ``feature``.
            NotFoundError: the thing named does not exist.
            ApiError: another error status.
            TransportError: no usable response.
        """
        return response_json(self.request(method, path, json=json, params=params, feature=feature))

    def call_object(
        self,
        method: str,
        path: str,
        feature: str,
        *,
        json: Any = None,
        params: Any = None,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """:meth:`call` whose answer must be a JSON object (by ``deadline``, when given).

        Raises:
            ApiError: the answer is not a JSON object; and the errors of :meth:`call`.
        """
        response = self.request(
            method, path, json=json, params=params, feature=feature, deadline=deadline
        )
        data = response_json(response)
        if not isinstance(data, dict):
            raise invalid_response(response, "the answer is not a JSON object")
        return data

    def text(self, path: str, feature: str, params: Any = None) -> str:
        """``GET`` a plain-text answer of a feature (diagnostics).

        Raises:
            The errors of :meth:`call`.
        """
        return self.request("GET", path, params=params, feature=feature).text

    def remove(self, path: str, feature: str) -> bool:
        """``DELETE`` a thing of a feature: True if deleted, False if it did not exist.

        Raises:
            NotSupportedError: the server does not serve ``feature``.
            ApiError: another error status.
            TransportError: no usable response.
        """
        try:
            self.request("DELETE", path, feature=feature).close()
        except NotFoundError:
            return False
        return True

    def iter_pages(
        self,
        path: str,
        params: Mapping[str, Any],
        page_size: int,
        feature: str | None = None,
        deadline: float | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every item of a paginated list (``{items, pagination}``), page by page, lazily
        (each page by ``deadline``, a ``time.monotonic()`` instant, when given).

        Raises:
            ConfigurationError: ``page_size`` is not an int from 1 to 200.
            NotSupportedError: the server does not serve ``feature``.
            ApiError: an error status.
            TransportError: no usable response.
        """
        whole("page_size", page_size, 1, MAX_PAGE_SIZE)
        page = 1
        while True:
            query = {"pageSize": page_size, **params, "page": page}
            response = self.request("GET", path, params=query, feature=feature, deadline=deadline)
            data = response_json(response)
            items = data.get("items") if isinstance(data, dict) else None
            if not isinstance(items, list) or not items:
                return
            yield from (item for item in items if isinstance(item, dict))
            pagination = data.get("pagination")
            if not (isinstance(pagination, dict) and pagination.get("hasNextPage")):
                return
            page += 1
