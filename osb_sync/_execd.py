"""Low-level calls to one sandbox's execd: the request funnel and event streams."""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import Any, Callable, Mapping, TypeVar
from urllib.parse import urlsplit

import requests

from ._answers import BadAnswer
from ._constants import INTERRUPT_WAIT
from ._errors import (
    ApiError,
    OpenSandboxError,
    SandboxStateError,
    error_from_response,
    invalid_response,
    redact,
)
from ._execution import NOT_STARTED, ExecutionStream, Folder, R
from ._models import Event
from ._transport import Transport, response_json
from ._wait import Wait

logger = logging.getLogger("osb_sync")
T = TypeVar("T")

STREAM_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "text/event-stream",
    "Cache-Control": "no-cache",
}
# On every execd call: counted bytes must be wire bytes, and a few hundred bytes of a body
# compressed twice inflate to gigabytes (urllib3 before 2.6 inflates a whole block at a time,
# before any cap can act). An answer encoded all the same is refused unread.
IDENTITY = {"Accept-Encoding": "identity"}
# What an answer that is not streamed may weigh, by kind: its parsed form can take 30 times as
# much memory (16 MiB of ``[{},{},...]`` is 5.6 million dicts, 464 MiB), so only a listing,
# whose size is the sandbox's file tree's, gets more than a small object needs.
ANSWER_BYTES = 1 << 20  # an object (info, a context, a session, a status, metrics), or nothing
LISTING_BYTES = 16 << 20  # files.search, files.list, contexts.list: 80 000 entries or so
LOGS_BYTES = 16 << 20  # a background command's output since a cursor (text)
PAUSED_HINT = "the sandbox is paused: resume it first (sandbox.resume())"


class Execd:
    """One sandbox's execd: its base URL and the headers the server requires on every call."""

    def __init__(self, transport: Transport, base_url: str, headers: Mapping[str, str]):
        self._transport = transport
        self.move(base_url, headers)

    def move(self, base_url: str, headers: Mapping[str, str]) -> None:
        """Send later calls to another address (a resumed sandbox's execd may have moved)."""
        self.base_url = base_url
        self._headers = dict(headers)
        self._secrets = tuple(self._headers.values())

    @property
    def headers(self) -> dict[str, str]:
        """A copy of the headers sent on every call."""
        return dict(self._headers)

    @property
    def read_timeout(self) -> float:
        """Seconds of silence allowed on a response, unless a call says otherwise."""
        return self._transport.read_timeout

    @property
    def call_timeout(self) -> float | None:
        """Seconds a call may take from its request sent to its answer (streamed: its headers)."""
        return self._transport.call_timeout

    @property
    def connect_timeout(self) -> float:
        """Seconds to open a connection."""
        return self._transport.connect_timeout

    def tls_settings(self) -> tuple[Any, Any]:
        """``(verify, cert)`` for a connection to execd's origin that requests does not make
        (the terminals' WebSocket): the client's, as an HTTP call would use them."""
        return self._transport.tls_settings(self.base_url)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The values of the headers sent on every call (the token): never shown."""
        return self._secrets

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Any = None,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
        stream: bool = False,
        retry: bool | None = None,
        deadline: float | None = None,
        max_body: int = ANSWER_BYTES,
    ) -> requests.Response:
        """Send one call; an error status raises (and closes the response).

        execd is the sandbox's and may lie (``_answers``): a body that is not streamed is read
        at most ``max_body`` bytes (its kind's: ``ANSWER_BYTES``, ``LISTING_BYTES``,
        ``LOGS_BYTES``; past it, TransportError), a redirect is never followed (behind a
        server proxy execd's origin is the lifecycle API's, whose routes a redirect could
        reach: TransportError), a body is asked for and taken as is (``Accept-Encoding:
        identity``: an answer with another ``Content-Encoding`` is refused, its body never
        decoded); a call whose answer is JSON goes through :meth:`answer`.

        GETs are retried on transient failures unless ``retry`` is False. The whole call (of a
        streamed answer: until its headers) is bounded by the client's ``call_timeout`` and
        by ``deadline`` (a ``time.monotonic()`` instant), which also bounds its connect and
        read timeouts by the time left, and its retries.

        Raises:
            NotFoundError: 404 (a missing file, context or command).
            SandboxStateError: the server's proxy says the sandbox is paused.
            ApiError: another error status; ``code`` ``INVALID_RESPONSE``: an encoded body.
            TransportError: no usable response.
        """
        url = self.base_url + path
        response = self._transport.request(
            method,
            url,
            json=json,
            params=params,
            data=data,
            headers={**IDENTITY, **(headers or {}), **self._headers},
            read_timeout=read_timeout,
            stream=stream,
            idempotent=method == "GET" if retry is None else retry,
            secrets=self._secrets,
            deadline=deadline,
            follow_redirects=False,
            call_timeout=self._transport.call_timeout,
            max_body=max_body,
        )
        encoding = response.headers.get("Content-Encoding")
        if encoding is not None and encoding.strip().lower() not in ("", "identity"):
            response.close()
            raise self.invalid(
                response,
                BadAnswer(
                    "the Content-Encoding header",
                    "is not identity, which the client asked for (the body was not decoded)",
                    encoding,
                ),
            )
        if response.status_code >= 300:
            try:
                exc = error_from_response(response, method, urlsplit(url).path, self._secrets)
            finally:
                response.close()
            if exc.status_code == 502 and "paused" in exc.message.lower():
                raise SandboxStateError(f"{PAUSED_HINT} ({exc})") from exc
            raise exc
        return response

    def answer(self, method: str, path: str, read: Callable[[Any], T], **kwargs: Any) -> T:
        """A call whose JSON answer (None for an empty or non-JSON body) ``read`` checks and
        converts (``_answers``: execd is the sandbox's, and may lie).

        Raises:
            ApiError: ``code`` ``INVALID_RESPONSE``: ``read`` refused the answer (the message
                names the field); or the errors of :meth:`request`.
        """
        response = self.request(method, path, **kwargs)
        try:
            return read(response_json(response))
        except BadAnswer as exc:
            raise self.invalid(response, exc) from None

    def invalid(self, response: requests.Response, exc: BadAnswer) -> ApiError:
        """The ``INVALID_RESPONSE`` error for an answer ``exc`` refused, the token redacted."""
        return invalid_response(response, exc.describe(self._secrets), self._secrets)

    def stream(
        self,
        path: str,
        body: dict[str, Any],
        *,
        folder: Folder[R],
        max_output_bytes: int,
        timeout: float | None = None,
        on_event: Callable[[Event], object] | None = None,
        interrupt_path: str | None = None,
        stop_at_terminal: bool = False,
        deadline: float | None = None,
    ) -> ExecutionStream[R]:
        """POST a run and return its live event stream.

        ``timeout`` (seconds) runs from now, or up to ``deadline`` (a ``time.monotonic()``
        instant) when the caller started it earlier: the request waits for execd's answer at
        most the time left, and the stream's deadline is the same instant.

        Raises:
            SandboxTimeoutError: execd did not answer within ``timeout``: the run may have
                started, but execd had not named it, so no interrupt could be sent.
            ApiError: execd refused the run.
            TransportError: execd could not be reached.
        """
        wait = None if timeout is None else Wait("the run did not finish", timeout, deadline)
        deadline = None if wait is None else wait.deadline
        with wait.bounding(f"; {NOT_STARTED}") if wait is not None else nullcontext():
            response = self.request(
                "POST", path, json=body, headers=STREAM_HEADERS, stream=True, deadline=deadline
            )
        content_type = response.headers.get("Content-Type", "")
        if "html" in content_type.lower():
            response.close()
            raise invalid_response(
                response, "an HTML page instead of an event stream (a proxy or gateway in the way?)"
            )
        interrupt = None
        if interrupt_path is not None:

            def interrupt(run_id: str) -> bool:
                return self.try_interrupt(interrupt_path, run_id)

        return ExecutionStream(
            response,
            max_output_bytes=max_output_bytes,
            timeout=timeout,
            on_event=on_event,
            interrupt=interrupt,
            folder=folder,
            stop_at_terminal=stop_at_terminal,
            deadline=deadline,
            secrets=self._secrets,
        )

    def interrupt(self, path: str, run_id: str, deadline: float | None = None) -> None:
        """``DELETE {path}?id=``: stop a run (``/code``: a context's run; ``/command``: a command).

        Raises:
            NotFoundError: no such run or context.
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        self.request("DELETE", path, params={"id": run_id}, deadline=deadline)

    def try_interrupt(self, path: str, run_id: str) -> bool:
        """:meth:`interrupt`, bounded by ``INTERRUPT_WAIT``; False (logged) if it failed."""
        wait = min(INTERRUPT_WAIT, self._transport.read_timeout)
        try:
            self.interrupt(path, run_id, time.monotonic() + wait)
        except OpenSandboxError as exc:
            shown = redact(run_id, self._secrets)  # execd's init text
            logger.warning("interrupting run %s (DELETE %s) failed: %s", shown, path, exc)
            return False
        except AttributeError:
            # Client.close() on another thread closed the pooled connection this request had
            # (urllib3 then finds its socket gone): the client is going away, and so is the run.
            shown = redact(run_id, self._secrets)
            logger.info("interrupting run %s: the client was closed meanwhile", shown)
            return False
        return True
