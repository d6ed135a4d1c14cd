"""The Sandbox handle: code, commands, contexts, files and lifecycle of one sandbox."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Mapping
from urllib.parse import urlsplit

import requests

from . import _answers as answers
from ._commands import Commands
from ._config import DEFAULT_SETTINGS, ClientSettings, check_run_arguments
from ._constants import EXECD_PORT, MAX_ID
from ._contexts import Contexts
from ._errors import (
    ConfigurationError,
    NotFoundError,
    OpenSandboxError,
    SandboxStateError,
    TransportError,
)
from ._execd import Execd
from ._models import CodeContext, Endpoint, ExecutionResult, Metrics, SandboxInfo, Snapshot
from ._options import (
    CODE_RUN_DEFAULTS,
    DEFAULT_REACH,
    CodeRunOptions,
    Reach,
    check_options,
    with_keywords,
)
from ._resources import Diagnostics, Network, Snapshots
from ._stream import ExecutionFolder
from ._transport import Transport
from ._wait import Wait

if TYPE_CHECKING:
    from datetime import datetime
    from types import TracebackType

    from typing_extensions import Unpack

    from ._execution import ExecutionStream
    from ._files import Files
    from ._lifecycle import Lifecycle
    from ._pty import Pty

logger = logging.getLogger("osb_sync")


class Sandbox:
    """A running sandbox: its id and the handles on its lifecycle API and its execd.

    Built by :meth:`Client.create_sandbox` and :meth:`Client.connect`; the constructor is
    internal. Two handles on the same sandbox are equal (and hash alike).

    Used as a context manager, it deletes the sandbox on exit when ``delete_on_exit`` is true:
    the default for a sandbox created by ``create_sandbox``, not for one obtained with
    ``connect()``.

    Attributes:
        id: the sandbox id.
        commands: shell commands (:class:`Commands`).
        contexts: code contexts (:class:`Contexts`).
        use_server_proxy: whether execd is reached through the server's proxy.
        delete_on_exit: whether leaving a ``with`` block deletes the sandbox.
    """

    def __init__(
        self,
        sandbox_id: str,
        *,
        lifecycle: Lifecycle | None,
        execd: Execd,
        use_server_proxy: bool = False,
        delete_on_exit: bool = False,
    ):
        self.id = sandbox_id
        self.use_server_proxy = use_server_proxy
        self.delete_on_exit = delete_on_exit
        self._lifecycle_api = lifecycle
        self._execd = execd
        self.commands = Commands(execd)
        self.contexts = Contexts(execd)
        self._files: Files | None = None
        self._pty: Pty | None = None
        self._owned_transport: Transport | None = None  # from_execd's own connections

    @classmethod
    def from_execd(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        sandbox_id: str | None = None,
        session: requests.Session | None = None,
        connect_timeout: float = DEFAULT_SETTINGS.connect_timeout,
        read_timeout: float = DEFAULT_SETTINGS.read_timeout,
        call_timeout: float | None = None,
        pool_maxsize: int = DEFAULT_SETTINGS.pool_maxsize,
        pool_block: bool = DEFAULT_SETTINGS.pool_block,
    ) -> Sandbox:
        """A handle on a bare execd, without a lifecycle server in front of it.

        For an execd you run yourself (``execd --port 44772``) or reach directly. Code,
        commands, contexts, files, ``metrics`` and ``ping`` work as on any sandbox; the
        lifecycle calls (``info``, ``pause``, ``resume``, ``renew``, ``patch_metadata``,
        ``delete``, ``get_endpoint``) raise ConfigurationError. ``with`` closes the handle's
        connections on exit.

        Args:
            url: execd's base URL, e.g. ``http://127.0.0.1:44772``.
            headers: sent on every call, e.g. ``{"X-EXECD-ACCESS-TOKEN": token}``; never sent
                to another origin.
            sandbox_id: the handle's ``id`` (default: ``url``).
            session: a ``requests.Session`` to send through; never mutated or closed.
            connect_timeout: seconds to open a connection.
            read_timeout: seconds of silence allowed on any response, streams included.
            call_timeout: seconds a call may take from its request sent to the end of its
                answer (of a streamed one: to its headers); default: twice ``read_timeout``.
            pool_maxsize: connections kept to execd: size it for the number of threads.
            pool_block: wait for a free connection (at most ``connect_timeout``) when all are
                in use, instead of opening one more (see :class:`Client`).

        Raises:
            ConfigurationError: ``url`` is not an http(s) URL, or a bad argument.
        """
        if not isinstance(url, str) or urlsplit(url.strip()).scheme not in ("http", "https"):
            raise ConfigurationError(
                f"url must be execd's http:// or https:// URL, e.g. 'http://127.0.0.1:{EXECD_PORT}'"
            )
        settings = ClientSettings(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            call_timeout=call_timeout,
            pool_maxsize=pool_maxsize,
            pool_block=pool_block,
            max_retries=0,
        )
        transport = Transport(
            session=session,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            pool_maxsize=settings.pool_maxsize,
            pool_block=settings.pool_block,
            max_retries=settings.max_retries,
            call_timeout=settings.call_timeout,
        )
        base_url = url.strip().rstrip("/")
        execd = Execd(transport, base_url, headers or {})
        sandbox = cls(sandbox_id or base_url, lifecycle=None, execd=execd)
        sandbox._owned_transport = transport
        return sandbox

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, execd_url={self.execd_url!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sandbox):
            return NotImplemented
        return self.id == other.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.delete_on_exit:
            self._lifecycle.delete_quietly(self.id)
        if self._owned_transport is not None:
            self._owned_transport.close()

    @property
    def _lifecycle(self) -> Lifecycle:
        if self._lifecycle_api is None:
            raise ConfigurationError(
                f"sandbox handle {self.id!r} was made by Sandbox.from_execd: it has no lifecycle "
                "API (info, pause, resume, renew, patch_metadata, delete, get_endpoint)"
            )
        return self._lifecycle_api

    @property
    def diagnostics(self) -> Diagnostics:
        """The server's logs, events, inspection and summary of this sandbox.

        Raises:
            ConfigurationError: a handle from ``Sandbox.from_execd`` (no lifecycle API).
        """
        return Diagnostics(self._lifecycle, self.id)

    @property
    def network_policy(self) -> Network:
        """The sandbox's egress policy, changed while it runs (get, replace, patch, delete rules).

        Raises:
            ConfigurationError: a handle from ``Sandbox.from_execd`` (no lifecycle API).
        """
        return Network(self._lifecycle, self.id)

    @property
    def files(self) -> Files:
        """The file system (:class:`Files`), made on first use: a script that only runs code
        never imports it."""
        if self._files is None:
            from ._files import Files

            self._files = Files(self._execd)
        return self._files

    @property
    def pty(self) -> Pty:
        """Interactive terminals (:class:`~osb_sync.Pty`): execd's ``/pty`` sessions over a
        WebSocket, made on first use."""
        if self._pty is None:
            from ._pty import Pty

            self._pty = Pty(self._execd)
        return self._pty

    def files_as(self, uid: int, gid: int) -> Files:
        """The file system as the numeric user ``uid`` and group ``gid`` (execd 1.1.1, #2070):
        the same calls as :attr:`files`, each served by execd as that user, so the kernel
        checks every path and link as that user and new files are theirs.

        execd switches identity per request (it must run as root); it enforces file
        permissions, not a tenant boundary. Nothing falls back to :attr:`files`: an execd
        older than 1.1.1 raises ``NotSupportedError`` (its 404), one that cannot switch
        ``ApiError`` (503 ``FILESYSTEM_IDENTITY_UNAVAILABLE``).

        Raises:
            ConfigurationError: ``uid`` or ``gid`` is not an int from 0 to 4294967294.
        """
        from ._files import Files

        for name, number in (("uid", uid), ("gid", gid)):
            if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < MAX_ID:
                raise ConfigurationError(f"{name} must be an int from 0 to {MAX_ID - 1}")
        return Files(self._execd, (uid, gid))

    @property
    def execd_url(self) -> str:
        """execd's base URL (with the scheme of the client's ``api_base`` or ``execd_scheme``)."""
        return self._execd.base_url

    @property
    def execd_headers(self) -> dict[str, str]:
        """A copy of the headers the server requires on execd calls (e.g. an access token)."""
        return self._execd.headers

    # -- code ---------------------------------------------------------------------------------

    @with_keywords(CodeRunOptions, CODE_RUN_DEFAULTS)
    def run_code(self, code: str, **options: Unpack[CodeRunOptions]) -> ExecutionResult:
        """Run code and return what it produced; see :meth:`Client.run_code`.

        ``context``: a CodeContext (its language is used) or a context id (with ``language``).

        Raises:
            The errors of :meth:`Client.run_code`.
        """
        check_options(options, "run_code", CODE_RUN_DEFAULTS)
        with self.stream_code(code, **options) as stream:
            return stream.result()

    @with_keywords(CodeRunOptions, CODE_RUN_DEFAULTS)
    def stream_code(
        self, code: str, **options: Unpack[CodeRunOptions]
    ) -> ExecutionStream[ExecutionResult]:
        """Start running code and return the live event stream; see :meth:`Client.stream_code`.

        Raises:
            ApiError: execd refused the call.
            TransportError: execd could not be reached.
        """
        check_options(options, "stream_code", CODE_RUN_DEFAULTS)
        return start_code(self, code, options)

    # -- the sandbox itself ---------------------------------------------------------------------

    def get_endpoint(self, port: int, *, expires: datetime | int | None = None) -> Endpoint:
        """How to reach a port the sandbox serves (a web app started inside it).

        Args:
            port: the port.
            expires: ask for a signed route token valid until then (a time, or Unix epoch
                seconds; the server needs an ingress gateway with secure access).

        Raises:
            ConfigurationError: a port outside 1..65535, or an ``expires`` in the past.
            SandboxTimeoutError: no endpoint within the default ready timeout.
            ApiError: the server refused.
        """
        wait = DEFAULT_REACH
        return self._lifecycle.endpoint(
            self.id, port, self.use_server_proxy, wait.ready_timeout, wait.poll_interval, expires
        )

    def snapshot(self, name: str | None = None, *, wait: bool = False) -> Snapshot:
        """Take a snapshot of this sandbox (``create_sandbox(snapshot_id=...)`` restores it).

        Args:
            name: a name for it.
            wait: return only once it is Ready (else it may still be ``Creating``).

        Raises:
            NotSupportedError: the server makes no snapshots.
            SandboxStateError: with ``wait``, the snapshot failed.
            SandboxTimeoutError: with ``wait``, not Ready in time.
            ApiError: e.g. 409 when the sandbox is not running.
        """
        snapshots = Snapshots(self._lifecycle)
        made = snapshots.create(self.id, name)
        return snapshots.wait_until_ready(made.id) if wait and not made.ready else made

    def metrics(self) -> Metrics:
        """One resource sample (CPU and memory) as execd reports it: OpenSandbox's execd
        reads the ``/proc`` of the kernel it runs on, so these are the host's (or the node's)
        figures, not the sandbox's against its limits (``client.sandbox_stats`` has those on
        ``osb-sync serve``).

        Raises:
            ApiError: execd refused the call, or answered a number that is not finite and 0 or
                more (``code`` ``INVALID_RESPONSE``).
            TransportError: execd could not be reached.
        """
        return self._execd.answer("GET", "/metrics", answers.metrics)

    def ping(self, *, timeout: float | None = None) -> bool:
        """Whether execd answers ``/ping`` within ``timeout`` seconds (default: the call timeout).

        Raises:
            SandboxStateError: the sandbox is paused (waiting would not help).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._execd.request("GET", "/ping", retry=False, deadline=deadline).close()
        except SandboxStateError:
            raise
        except OpenSandboxError:
            return False
        return True

    def wait_until_healthy(self, ready_timeout: float, poll_interval: float) -> None:
        """Poll ``/ping`` until execd answers, all within ``ready_timeout`` seconds.

        Each ping waits at most half the time left, so that when it fails or goes unanswered
        there is time to ask the lifecycle API for the sandbox's state: a sandbox that is
        paused, failed or gone ends the wait at once, with the server's reason. (A handle made
        by ``from_execd`` has no lifecycle API: it only pings.)

        Raises:
            SandboxStateError: the sandbox is paused (resume it first), or Failed, Stopping or
                Terminated (with the server's reason and message).
            NotFoundError: the sandbox is gone (deleted while it started).
            SandboxTimeoutError: no answer within ``ready_timeout`` seconds.
        """
        wait = Wait(f"execd of sandbox {self.id} did not answer /ping", ready_timeout)
        detail = f" ({self.execd_url})"
        while not self._answers_ping(time.monotonic() + wait.left() / 2):
            with wait.bounding(detail):
                self._check_state(wait.deadline)
            if not wait.expired():
                wait.sleep(poll_interval)
            if wait.expired():
                raise wait.error(detail)

    def _answers_ping(self, deadline: float) -> bool:
        """One ping of the wait, answered by ``deadline`` (a ``time.monotonic()`` instant)."""
        try:
            self._execd.request("GET", "/ping", retry=False, deadline=deadline).close()
        except SandboxStateError:
            raise
        except OpenSandboxError:
            return False
        return True

    def _check_state(self, deadline: float) -> None:
        """After a failed ping: raise if the lifecycle API says execd cannot answer.

        A 404 from the endpoint alone proves nothing (a gateway may not route a new sandbox
        yet), and neither does a lifecycle API that cannot be asked: the wait goes on.
        """
        if self._lifecycle_api is None:
            return
        try:
            self._lifecycle_api.check_state(self.id, deadline)
        except (SandboxStateError, NotFoundError):
            raise
        except OpenSandboxError as exc:
            if isinstance(exc, TransportError) and time.monotonic() >= deadline:
                raise
            logger.debug("reading the state of sandbox %s failed: %s", self.id, exc)

    def info(self) -> SandboxInfo:
        """A fresh description from the lifecycle API.

        Raises:
            NotFoundError: the sandbox is gone.
            ApiError: the server refused the call.
            TransportError: the server could not be reached.
        """
        return self._lifecycle.info(self.id)

    def pause(self) -> None:
        """Pause the sandbox (its processes stop; execution is refused until resumed).

        Raises:
            ApiError: e.g. 409 when it is not running.
            TransportError: the server could not be reached.
        """
        self._lifecycle.action(self.id, "pause")

    def resume(
        self, *, ready_timeout: float | None = None, poll_interval: float | None = None
    ) -> None:
        """Resume, wait until Running, and re-resolve execd (its endpoint may change).

        Raises:
            ApiError: e.g. 409 when it is not paused.
            SandboxStateError: it entered Failed, Stopping or Terminated.
            SandboxTimeoutError: not Running, or execd not answering, within ``ready_timeout``.
            TransportError: the server could not be reached.
        """
        wait = Reach.of({"ready_timeout": ready_timeout, "poll_interval": poll_interval})
        self._lifecycle.resume(self.id, wait.ready_timeout, wait.poll_interval)
        endpoint = self._lifecycle.endpoint(
            self.id, EXECD_PORT, self.use_server_proxy, wait.ready_timeout, wait.poll_interval
        )
        self._execd.move(endpoint.url, endpoint.headers)
        self.wait_until_healthy(wait.ready_timeout, wait.poll_interval)

    def renew(self, seconds: float, *, timeout: float | None = None) -> datetime | None:
        """Expire ``seconds`` from now instead; returns the new expiry.

        Args:
            seconds: the new remaining lifetime.
            timeout: seconds to wait for the answer (default: the client's read timeout).

        Raises:
            ConfigurationError: ``seconds`` is not a positive number.
            ApiError: e.g. a sandbox without expiry.
            TransportError: the server could not be reached.
        """
        return self._lifecycle.renew(self.id, seconds, timeout)

    def patch_metadata(self, patch: Mapping[str, str | None]) -> SandboxInfo:
        """Merge-patch the labels (``None`` deletes a key).

        Raises:
            ApiError: e.g. a reserved or invalid label.
            TransportError: the server could not be reached.
        """
        return self._lifecycle.patch_metadata(self.id, patch)

    def delete(self) -> bool:
        """Delete this sandbox; see :meth:`Client.delete_sandbox`.

        Raises:
            ApiError: an error status other than 404.
            TransportError: the server could not be reached.
        """
        return self._lifecycle.delete(self.id)


def start_code(
    sandbox: Sandbox, code: str, options: Mapping[str, Any], deadline: float | None = None
) -> ExecutionStream[ExecutionResult]:
    """:meth:`Sandbox.stream_code` with checked ``options``, and the run's ``deadline`` (a
    ``time.monotonic()`` instant) when the caller started it earlier: a run by sandbox id
    starts its deadline before the handle is reached.

    Raises:
        The errors of :meth:`Sandbox.stream_code`.
    """
    run: dict[str, Any] = {**CODE_RUN_DEFAULTS, **options}
    context, language = run["context"], run["language"]
    if isinstance(context, CodeContext):
        language = context.language
    max_output_bytes, timeout = run["max_output_bytes"], run["timeout"]
    check_run_arguments(code, language, max_output_bytes, timeout)
    target: dict[str, str] = {"language": language}
    if context is not None:
        # Both, always: without a language real execd runs the code as a shell command.
        target["id"] = context.id if isinstance(context, CodeContext) else context
    return sandbox._execd.stream(
        "/code",
        {"code": code, "context": target},
        folder=ExecutionFolder(),
        max_output_bytes=max_output_bytes,
        timeout=timeout,
        on_event=run["on_event"],
        interrupt_path="/code",
        deadline=deadline,
    )
