"""The Sandbox handle and its in-sandbox (execd) calls."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Mapping
from urllib.parse import urlsplit

from .constants import DEFAULT_LANGUAGE, MAX_OUTPUT_BYTES
from .errors import ConfigurationError, OpenSandboxError, error_from_response
from .execution import ExecutionStream
from .models import Event, ExecutionResult

if TYPE_CHECKING:
    from types import TracebackType

    from .client import Client

logger = logging.getLogger("osb_sync")

_STREAM_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "text/event-stream",
    "Cache-Control": "no-cache",
    # Counted bytes must be wire bytes: no transparent decompression under the cap.
    "Accept-Encoding": "identity",
}
_INTERRUPT_READ_TIMEOUT = 10.0


def execd_base_url(endpoint: str, scheme: str) -> str:
    """``scheme://endpoint`` for a scheme-less endpoint (which may carry a path)."""
    endpoint = endpoint.strip().rstrip("/")
    if "://" in endpoint:
        return endpoint
    return f"{scheme}://{endpoint}"


class Sandbox:
    """A running sandbox: its id, its execd endpoint, and the client that reaches it.

    Used as a context manager, it deletes the sandbox on exit when ``delete_on_exit`` is true:
    the default for a sandbox this client created, not for one obtained with ``connect()``.

    Attributes:
        id: the sandbox id.
        api_base: the lifecycle API it belongs to.
        execd_endpoint: execd's address as the server gave it (usually without a scheme).
        execd_headers: headers the server requires on execd calls (e.g. an access token).
        use_server_proxy: whether the endpoint goes through the server's proxy.
        delete_on_exit: whether leaving a ``with`` block deletes the sandbox.
    """

    def __init__(
        self,
        client: Client,
        sandbox_id: str,
        *,
        execd_endpoint: str,
        execd_headers: Mapping[str, str] | None = None,
        use_server_proxy: bool = False,
        delete_on_exit: bool = False,
    ):
        self.id = sandbox_id
        self.api_base = client.api_base
        self.execd_endpoint = execd_endpoint
        self.execd_headers = dict(execd_headers or {})
        self.use_server_proxy = use_server_proxy
        self.delete_on_exit = delete_on_exit
        self._client = client

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, execd_endpoint={self.execd_endpoint!r})"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.delete_on_exit:
            self._client._delete_quietly(self.id)

    @property
    def execd_url(self) -> str:
        """execd's base URL, with the scheme of the client's ``api_base`` (or ``execd_scheme``)."""
        return execd_base_url(self.execd_endpoint, self._client.execd_scheme)

    def run_code(
        self,
        code: str,
        *,
        language: str = DEFAULT_LANGUAGE,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        timeout: float | None = None,
        on_event: Callable[[Event], object] | None = None,
    ) -> ExecutionResult:
        """Run code and return what it produced; see :meth:`Client.run_code`."""
        with self.stream_code(
            code,
            language=language,
            max_output_bytes=max_output_bytes,
            timeout=timeout,
            on_event=on_event,
        ) as stream:
            return stream.result()

    def stream_code(
        self,
        code: str,
        *,
        language: str = DEFAULT_LANGUAGE,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        timeout: float | None = None,
        on_event: Callable[[Event], object] | None = None,
    ) -> ExecutionStream:
        """Start running code and return the live event stream; see :meth:`Client.stream_code`."""
        _check_run_arguments(code, language, max_output_bytes, timeout)
        body = {"code": code, "context": {"language": language}}
        url = self.execd_url + "/code"
        response = self._client._transport.request(
            "POST",
            url,
            json=body,
            headers={**_STREAM_HEADERS, **self.execd_headers},
            stream=True,
            secrets=self._secrets(),
        )
        if response.status_code >= 300:
            try:
                raise error_from_response(response, "POST", urlsplit(url).path, self._secrets())
            finally:
                response.close()
        return ExecutionStream(
            response,
            max_output_bytes=max_output_bytes,
            timeout=timeout,
            on_event=on_event,
            interrupt=self._interrupt_code_quietly,
        )

    def delete(self) -> bool:
        """Delete this sandbox; see :meth:`Client.delete_sandbox`."""
        return self._client.delete_sandbox(self)

    def _secrets(self) -> tuple[str, ...]:
        return tuple(self.execd_headers.values())

    def _interrupt_code_quietly(self, context_id: str) -> None:
        """Best effort ``DELETE /code?id=``: a run left behind would keep its context busy."""
        url = self.execd_url + "/code"
        try:
            response = self._client._transport.request(
                "DELETE",
                url,
                params={"id": context_id},
                headers=self.execd_headers,
                read_timeout=_INTERRUPT_READ_TIMEOUT,
                secrets=self._secrets(),
            )
            response.close()
            if response.status_code >= 300:
                logger.warning(
                    "interrupting the run in sandbox %s: DELETE /code -> %d",
                    self.id,
                    response.status_code,
                )
        except OpenSandboxError as exc:
            logger.warning("interrupting the run in sandbox %s failed: %s", self.id, exc)


def _check_run_arguments(
    code: object, language: object, max_output_bytes: object, timeout: object
) -> None:
    if not isinstance(code, str):
        raise ConfigurationError(f"code must be a str, not {type(code).__name__}")
    if not isinstance(language, str) or not language:
        raise ConfigurationError("language must be a non-empty str such as 'python' or 'bash'")
    if not isinstance(max_output_bytes, int) or max_output_bytes <= 0:
        raise ConfigurationError("max_output_bytes must be a positive int")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ConfigurationError("timeout must be a positive number of seconds, or None")
