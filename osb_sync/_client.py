"""The public facade: Client, which holds the transport, the lifecycle API and the handles.

Client is one idea, the lifecycle API of a server as its caller sees it: create and connect,
the calls on sandboxes named by id (describe, list, pause, resume, renew, delete), and runs
by id. It holds its parts (a Transport, a Lifecycle, the Handles kept for runs by id) and
inherits from nothing; every call that may move or end a sandbox forgets its handle.
"""

from __future__ import annotations

import builtins
import logging
import os
import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

import requests

from ._config import (
    DEFAULT_SETTINGS,
    ClientSettings,
    check_id,
    check_run_arguments,
    resolve_api_base,
)
from ._constants import (
    API_KEY_ENV,
    CREATE_ID_KEY,
    DEFAULT_LANGUAGE,
    DEFAULT_READY_TIMEOUT,
    EXECD_PORT,
    MAX_OUTPUT_BYTES,
)
from ._errors import (
    ApiError,
    ConfigurationError,
    NotSupportedError,
    SandboxTimeoutError,
    TransportError,
)
from ._execd import Execd
from ._execution import ExecutionStream
from ._lifecycle import MAX_PAGE_SIZE, Lifecycle, sandbox_path
from ._models import Endpoint, Event, ExecutionResult, SandboxInfo, SandboxStats
from ._options import (
    CREATE_DEFAULTS,
    REACH_DEFAULTS,
    RUN_DEFAULTS,
    CreateOptions,
    Reach,
    ReachOptions,
    RunOptions,
    build_create_body,
    check_options,
    split_create_options,
    with_keywords,
)
from ._resources import Diagnostics, Network, Pools, Snapshots, Templates
from ._sandbox import Sandbox, start_code
from ._transport import Transport
from ._validators import is_number, whole
from ._wait import Wait

if TYPE_CHECKING:
    from datetime import datetime
    from types import TracebackType

    from typing_extensions import Unpack

logger = logging.getLogger("osb_sync")

# Handles kept for calls by sandbox id (Client.run_code(sandbox_id, ...)).
HANDLES_KEPT = 64


class Client:
    """A blocking, thread-safe OpenSandbox client.

    One client may be shared by any number of threads (rules: the production guide, "Threads
    and processes").

    Args:
        api_base: lifecycle base URL including ``/v1``; else ``OPEN_SANDBOX_API_BASE``, else
            ``OPEN_SANDBOX_DOMAIN`` (host[:port] or URL without ``/v1``).
        api_key: sent as ``OPEN-SANDBOX-API-KEY`` to the lifecycle API only, when non-empty;
            an explicit value wins even when ``""``; else ``OPEN_SANDBOX_API_KEY``.
        session: a ``requests.Session`` to send through (TLS, proxies, tests); never mutated,
            never closed by the client.
        connect_timeout: seconds to open a connection.
        read_timeout: seconds of silence allowed on any response, streams included.
        call_timeout: seconds an execd call may take from its request sent to the end of its
            answer (of a streamed one: to its headers); default: twice ``read_timeout``.
        create_timeout: seconds allowed for ``POST /sandboxes`` (servers pull images inside it),
            its resends after a 429 (no capacity now) included.
        pool_maxsize: connections kept per host: size it for the number of threads.
        pool_block: when all ``pool_maxsize`` connections to a host are in use, wait for
            one to be free instead of opening one more (which is closed after its call): the
            connections to a host never exceed ``pool_maxsize``. The wait counts as connecting:
            past ``connect_timeout`` the call raises TransportError naming ``pool_maxsize``.
        max_retries: retries of idempotent lifecycle calls.
        execd_scheme: scheme for scheme-less execd endpoints; default: that of ``api_base``.

    Attributes:
        snapshots: the server's snapshots (:class:`Snapshots`).
        pools: the server's pools of pre-warmed sandboxes (:class:`Pools`).
        templates: the server's sandbox templates (:class:`Templates`).

    Raises:
        ConfigurationError: no api_base, or a bad argument.
    """

    def __init__(
        self,
        api_base: str | None = None,
        api_key: str | None = None,
        *,
        session: requests.Session | None = None,
        connect_timeout: float = DEFAULT_SETTINGS.connect_timeout,
        read_timeout: float = DEFAULT_SETTINGS.read_timeout,
        call_timeout: float | None = None,
        create_timeout: float = DEFAULT_SETTINGS.create_timeout,
        pool_maxsize: int = DEFAULT_SETTINGS.pool_maxsize,
        pool_block: bool = DEFAULT_SETTINGS.pool_block,
        max_retries: int = DEFAULT_SETTINGS.max_retries,
        execd_scheme: str | None = DEFAULT_SETTINGS.execd_scheme,
    ):
        self.api_base = resolve_api_base(api_base)
        api_key_value = api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")
        settings = ClientSettings(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            call_timeout=call_timeout,
            create_timeout=create_timeout,
            pool_maxsize=pool_maxsize,
            pool_block=pool_block,
            max_retries=max_retries,
            execd_scheme=execd_scheme,
        )
        self.execd_scheme = settings.execd_scheme or urlsplit(self.api_base).scheme
        self._transport = Transport(
            session=session,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            pool_maxsize=settings.pool_maxsize,
            pool_block=settings.pool_block,
            max_retries=settings.max_retries,
            call_timeout=settings.call_timeout,
        )
        self._lifecycle = Lifecycle(
            self._transport,
            self.api_base,
            api_key_value,
            settings.create_timeout,
            self.execd_scheme,
        )
        self._handles = Handles()
        self.snapshots = Snapshots(self._lifecycle)
        self.pools = Pools(self._lifecycle)
        self.templates = Templates(self._lifecycle)

    @property
    def read_timeout(self) -> float:
        """Seconds of silence allowed on any response (the ``read_timeout`` argument)."""
        return self._transport.read_timeout

    def __repr__(self) -> str:
        return f"Client(api_base={self.api_base!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def reload_environment(self) -> None:
        """Read proxy, CA bundle and netrc settings from the environment again.

        The client's own session reads them once per origin, and again by itself only when
        one of the variables requests documents (``HTTP_PROXY``, ``HTTPS_PROXY``,
        ``ALL_PROXY``, ``NO_PROXY``, ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``, ``NETRC``)
        changes: call this after editing ``~/.netrc`` or the system's proxy configuration.
        A caller's session reads them on every call, as requests does.
        """
        self._transport.reload_environment()

    def close(self) -> None:
        """Stop the client's background work and close its own connections.

        The background searches for sandboxes of failed creates get a last chance first (at
        most 3 s in all, as at interpreter exit; an undecided one is logged with the tag to
        look for), then stop. Every connection of the client's own session is closed; a
        caller's session is left open.
        """
        self._lifecycle.close()
        self._transport.close()

    # -- lifecycle -------------------------------------------------------------------------

    @with_keywords(CreateOptions, CREATE_DEFAULTS)
    def create_sandbox(self, **options: Unpack[CreateOptions]) -> Sandbox:
        """Create a sandbox, wait until it runs and resolve its execd endpoint.

        Creation is atomic from the caller's side: any failure after the server assigned an
        id deletes that sandbox before the error propagates, and a create whose answer was
        lost is looked up by its ``osb-sync/create-id`` metadata tag and deleted, in the
        background (the call waits at most 1 s for the first lookup).

        Args:
            template: image URI (default ``DEFAULT_TEMPLATE``).
            timeout: sandbox lifetime in seconds (default 300); ``NO_TIMEOUT`` for none.
            allow_internet_access: True omits the default deny-all ``networkPolicy``.
            metadata: labels (Kubernetes label rules apply to values).
            env_vars: environment of the sandbox.
            resource_limits: e.g. ``{"cpu": "1", "memory": "2Gi"}`` (the default).
            resource_requests: sent as ``resourceRequests``.
            entrypoint: the main process (default ``DEFAULT_ENTRYPOINT``).
            network_policy: sent as is; wins over ``allow_internet_access`` (even ``{}``).
            secure_access: ask for ``secureAccess``.
            snapshot_id: restore from a snapshot instead of an image; one still being made
                is waited for (within ``ready_timeout``) before the create.
            image_auth: registry credentials ``{"username", "password"}`` (never logged).
            platform: ``{"os": ..., "arch": ...}``.
            volumes: volume definitions, sent as they are.
            extensions: server-specific string options.
            lifecycle: execd's hooks, ``{"preStart": {"command": [...]}, "periodic": [...]}``.
            credential_proxy: ask for ``credentialProxy`` (Credential Vault injection).
            pool: take a sandbox from this server-side pool (``extensions.poolRef``); the
                pool's sandboxes exist already, so no network policy is sent.
            template_id: create from this template (it fixes the workload: no entrypoint,
                env, resources, volumes, platform, hooks or secure access beside it).
            use_server_proxy: route execd calls through the server's proxy.
            ready_timeout: seconds for each wait (Running, endpoint, ping); default 30.
            poll_interval: seconds between polls; default 0.2.
            health_check: wait until execd answers ``/ping`` (a first call otherwise may meet
                a 502 while execd starts).

        The last four are the client's own (how it reaches execd and waits); the others go
        into the request body.

        Returns:
            The running sandbox; leaving ``with sandbox:`` deletes it.

        Raises:
            ApiError: the server refused the request (a 400 for a network policy the server
                cannot enforce carries a hint).
            SandboxStateError: the sandbox entered Failed, Stopping or Terminated.
            SandboxTimeoutError: not Running, or no endpoint, within ``ready_timeout``.
            TransportError: the server could not be reached.
        """
        check_options(options)
        body_options, reach = split_create_options(options)
        body = build_create_body(body_options, {CREATE_ID_KEY: os.urandom(8).hex()})
        if "snapshotId" in body:
            self._wait_for_snapshot(body["snapshotId"], reach)
        data = self._lifecycle.create(body)
        sandbox_id = str(data["id"])
        try:
            self._lifecycle.wait_until_running(
                sandbox_id, data, reach.ready_timeout, reach.poll_interval
            )
            sandbox = self._reach(sandbox_id, reach)
        except BaseException:
            self._lifecycle.delete_quietly(sandbox_id)
            raise
        logger.debug("sandbox %s is running", sandbox_id)
        sandbox.delete_on_exit = True
        return sandbox

    def _wait_for_snapshot(self, snapshot_id: str, reach: Reach) -> None:
        """Wait until a snapshot can be restored; a server without the snapshot API decides
        at the create itself."""
        try:
            self.snapshots.wait_until_ready(
                snapshot_id, timeout=reach.ready_timeout, poll_interval=reach.poll_interval
            )
        except NotSupportedError:
            logger.debug("no snapshot API: creating from snapshot %s unchecked", snapshot_id)

    def server_version(self) -> str:
        """The server's version (``GET /version``, beside ``/v1``).

        Raises:
            NotSupportedError: the server does not tell it (before 1.1).
            ApiError: another error status.
            TransportError: the server could not be reached.
        """
        return self._lifecycle.server_version()

    @with_keywords(ReachOptions, REACH_DEFAULTS)
    def connect(self, sandbox_id: str, **options: Unpack[ReachOptions]) -> Sandbox:
        """Resolve the execd endpoint of an existing sandbox and return a handle to it.

        The handle does not delete the sandbox when a ``with`` block ends unless its
        ``delete_on_exit`` is set.

        Args:
            sandbox_id: the sandbox.
            use_server_proxy, ready_timeout, poll_interval, health_check: as for
                :meth:`create_sandbox`; with ``health_check`` it waits until execd answers
                ``/ping``.

        Raises:
            ApiError: the server refused the request.
            SandboxStateError: the sandbox is paused (resume it first), or Failed, Stopping or
                Terminated: execd cannot answer ``/ping``.
            SandboxTimeoutError: no endpoint (404s are retried) or no ``/ping`` answer within
                ``ready_timeout``.
            TransportError: the server could not be reached.
        """
        check_options(options, "connect", REACH_DEFAULTS)
        sandbox_id = check_id(sandbox_id)
        return self._reach(sandbox_id, Reach.of(options))

    def delete_sandbox(self, sandbox: Sandbox | str) -> bool:
        """Delete a sandbox.

        Returns:
            True if it was deleted, False if it did not exist (404).

        Raises:
            ApiError: any other error status.
            TransportError: the server could not be reached.
        """
        sandbox_id = check_id(sandbox.id if isinstance(sandbox, Sandbox) else sandbox)
        self._handles.forget(sandbox_id)
        return self._lifecycle.delete(sandbox_id)

    def delete_quietly(self, sandbox: Sandbox | str) -> bool:
        """Delete a sandbox for a cleanup path: a failure is logged, never raised.

        What ``with sandbox:``, :class:`SandboxPool`, the CLI and the pytest plugin use.

        Returns:
            True if it was deleted; False if it did not exist or could not be deleted.
        """
        sandbox_id = check_id(sandbox.id if isinstance(sandbox, Sandbox) else sandbox)
        self._handles.forget(sandbox_id)
        return self._lifecycle.delete_quietly(sandbox_id)

    def get_sandbox(self, sandbox_id: str) -> SandboxInfo:
        """Fetch a sandbox's current description.

        Raises:
            NotFoundError: no such sandbox.
            ApiError: another error status.
            TransportError: the server could not be reached.
        """
        return self._lifecycle.info(check_id(sandbox_id))

    def list_sandboxes(
        self,
        *,
        states: Sequence[str] | None = None,
        metadata: Mapping[str, str] | None = None,
        page_size: int = 50,
    ) -> Iterator[SandboxInfo]:
        """Iterate over sandboxes, following pagination lazily.

        Args:
            states: keep sandboxes in any of these states.
            metadata: keep sandboxes whose labels include all of these.
            page_size: sandboxes per request (1 to 200).

        Raises:
            ApiError: an error status.
            TransportError: the server could not be reached.
        """
        whole("page_size", page_size, 1, MAX_PAGE_SIZE)
        for item in self._lifecycle.iter_sandboxes(states, metadata, page_size):
            yield SandboxInfo.from_dict(item)

    def get_endpoint(
        self,
        sandbox_id: str,
        port: int,
        *,
        use_server_proxy: bool = False,
        ready_timeout: float | None = None,
        expires: datetime | int | None = None,
    ) -> Endpoint:
        """How to reach ``port`` of a sandbox: a URL with scheme, and the headers to send.

        Args:
            sandbox_id: the sandbox.
            port: the port it serves.
            use_server_proxy: through the server's proxy.
            ready_timeout: seconds to wait for the endpoint.
            expires: ask for a signed route token valid until then (a time, or Unix epoch
                seconds; the server needs an ingress gateway with secure access).

        Raises:
            ConfigurationError: a port outside 1..65535, or an ``expires`` in the past.
            SandboxTimeoutError: no endpoint within ``ready_timeout``.
            ApiError: the server refused.
        """
        reach = Reach.of({"ready_timeout": ready_timeout})
        return self._lifecycle.endpoint(
            check_id(sandbox_id),
            port,
            use_server_proxy,
            reach.ready_timeout,
            reach.poll_interval,
            expires,
        )

    def pause(self, sandbox_id: str) -> None:
        """Pause a sandbox.

        Raises:
            ApiError: e.g. 409 when it is not running.
        """
        sandbox_id = check_id(sandbox_id)
        self._handles.forget(sandbox_id)
        self._lifecycle.action(sandbox_id, "pause")

    def resume(
        self,
        sandbox_id: str,
        *,
        ready_timeout: float | None = None,
        poll_interval: float | None = None,
    ) -> None:
        """Resume a paused sandbox and wait until it is Running.

        Raises:
            ApiError: e.g. 409 when it is not paused.
            SandboxTimeoutError: not Running within ``ready_timeout`` (the resume request
                included).
        """
        sandbox_id = check_id(sandbox_id)
        reach = Reach.of({"ready_timeout": ready_timeout, "poll_interval": poll_interval})
        self._handles.forget(sandbox_id)
        self._lifecycle.resume(sandbox_id, reach.ready_timeout, reach.poll_interval)

    def renew(self, sandbox_id: str, seconds: float) -> datetime | None:
        """Make a sandbox expire ``seconds`` from now; returns the new expiry.

        Raises:
            ConfigurationError: ``seconds`` is not a positive number.
            ApiError: e.g. a sandbox without expiry.
        """
        return self._lifecycle.renew(check_id(sandbox_id), seconds)

    def diagnostics(self, sandbox_id: str) -> Diagnostics:
        """The server's logs and events of a sandbox, reached without its execd endpoint (so
        also while it is paused, and on ``osb-sync serve`` after it is gone).

        Raises:
            ConfigurationError: a malformed id.
        """
        return Diagnostics(self._lifecycle, check_id(sandbox_id))

    def network_policy(self, sandbox_id: str) -> Network:
        """A sandbox's egress policy (get, replace, patch, delete rules), reached without its
        execd endpoint, as ``Sandbox.network_policy``.

        Raises:
            ConfigurationError: a malformed id.
        """
        return Network(self._lifecycle, check_id(sandbox_id))

    def sandbox_stats(self, sandbox_id: str) -> SandboxStats:
        """A sandbox's usage against its limits, read from its cgroups by ``osb-sync serve``
        (an extension of its API). OpenSandbox's server has none; ``sandbox.metrics()`` gives
        execd's figures there, which are the host's (or node's), not the sandbox's.

        Raises:
            ConfigurationError: a malformed id.
            NotSupportedError: the server has no such extension (OpenSandbox's own).
            NotFoundError: no such sandbox.
            ApiError: another error status, or an answer that is not a JSON object.
            TransportError: the server could not be reached.
        """
        path = f"{sandbox_path(check_id(sandbox_id))}/stats"
        return SandboxStats.from_dict(self._lifecycle.call_object("GET", path, "sandbox stats"))

    def patch_metadata(self, sandbox_id: str, patch: Mapping[str, str | None]) -> SandboxInfo:
        """Merge-patch a sandbox's labels: a value adds or replaces, ``None`` deletes.

        Raises:
            ApiError: e.g. a reserved or invalid label.
        """
        return self._lifecycle.patch_metadata(check_id(sandbox_id), patch)

    def delete_all(self, *, metadata: Mapping[str, str]) -> builtins.list[str]:
        """Delete every sandbox whose labels include ``metadata``; returns their ids.

        The cleanup tool after a crash (pooled sandboxes carry a pool tag, every create an
        ``osb-sync/create-id``). An empty filter is refused: it would match everything.

        Raises:
            ConfigurationError: an empty ``metadata``.
        """
        if not metadata:
            raise ConfigurationError("delete_all needs a non-empty metadata filter")
        ids = [info.id for info in self.list_sandboxes(metadata=metadata, page_size=MAX_PAGE_SIZE)]
        return [sandbox_id for sandbox_id in ids if self._lifecycle.delete(sandbox_id)]

    # -- running code ----------------------------------------------------------------------

    @with_keywords(RunOptions, RUN_DEFAULTS)
    def run_code(
        self, sandbox: Sandbox | str, code: str, **options: Unpack[RunOptions]
    ) -> ExecutionResult:
        """Run code in a sandbox and return what it produced.

        An exception raised by the code is returned in ``result.error``, not raised.

        Args:
            sandbox: a Sandbox, or a sandbox id (its endpoint is resolved first).
            code: the code to run.
            language: the kernel (``python``, ``bash``, ...).
            max_output_bytes: cap on the output as read (UTF-8 bytes of stdout, stderr and
                result payloads; the stream's framing is not counted).
            timeout: overall deadline in seconds, from the call on (reaching a sandbox given
                by id included); on expiry the run is interrupted.
            on_event: called with each Event as it arrives, on the calling thread.

        Raises:
            OutputLimitExceeded: the output passed ``max_output_bytes``, with what is not
                decoded yet counted by its size on the wire (the run is interrupted).
            SandboxTimeoutError: ``timeout`` expired (the run is interrupted if it had started).
            StreamError: the stream broke, stalled past ``read_timeout`` or ended truncated.
            ApiError: execd refused the request.
            TransportError: execd could not be reached.
        """
        check_options(options, "run_code", RUN_DEFAULTS)
        with self._handle(sandbox, options.get("timeout")) as (handle, deadline):
            with start_code(handle, code, options, deadline) as stream:
                return stream.result()

    @with_keywords(RunOptions, RUN_DEFAULTS)
    def stream_code(
        self, sandbox: Sandbox | str, code: str, **options: Unpack[RunOptions]
    ) -> ExecutionStream[ExecutionResult]:
        """Start running code and return its live event stream (use it in a ``with`` block).

        Leaving the block before the end closes the connection and interrupts the run on
        the server. Once exhausted, ``stream.result()`` returns the ExecutionResult.

        Raises:
            ApiError: execd refused the request.
            TransportError: execd could not be reached.
        """
        check_options(options, "stream_code", RUN_DEFAULTS)
        with self._handle(sandbox, options.get("timeout")) as (handle, deadline):
            return start_code(handle, code, options, deadline)

    def code_interpreter_tool(
        self,
        code: str,
        *,
        language: str = DEFAULT_LANGUAGE,
        run_timeout: float | None = None,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        on_event: Callable[[Event], object] | None = None,
        **create_kwargs: Unpack[CreateOptions],
    ) -> ExecutionResult:
        """Create a sandbox, run code in it, and delete it, whatever happened.

        ``timeout`` among ``create_kwargs`` is the sandbox lifetime; ``run_timeout`` bounds
        the run. A failed delete is logged and never masks the run's own error. Empty code
        and an unknown language are refused before a sandbox is created.

        Raises:
            ConfigurationError: empty code, an unknown language, a bad argument.
            The errors of :meth:`create_sandbox` and :meth:`run_code`.
        """
        check_options(create_kwargs, "code_interpreter_tool")
        check_run_arguments(code, language, max_output_bytes, run_timeout)
        sandbox = self.create_sandbox(**create_kwargs)
        try:
            return sandbox.run_code(
                code,
                language=language,
                max_output_bytes=max_output_bytes,
                timeout=run_timeout,
                on_event=on_event,
            )
        finally:
            self._lifecycle.delete_quietly(sandbox.id)

    # -- internals -------------------------------------------------------------------------

    def _reach(self, sandbox_id: str, reach: Reach) -> Sandbox:
        """A handle on execd's endpoint; with ``health_check``, once execd answers ``/ping``."""
        endpoint = self._lifecycle.endpoint(
            sandbox_id, EXECD_PORT, reach.use_server_proxy, reach.ready_timeout, reach.poll_interval
        )
        sandbox = Sandbox(
            sandbox_id,
            lifecycle=self._lifecycle,
            execd=Execd(self._transport, endpoint.url, endpoint.headers),
            use_server_proxy=reach.use_server_proxy,
        )
        if reach.health_check:
            sandbox.wait_until_healthy(reach.ready_timeout, reach.poll_interval)
        return sandbox

    @contextmanager
    def _handle(
        self, sandbox: Sandbox | str, timeout: float | None = None
    ) -> Iterator[tuple[Sandbox, float | None]]:
        """The sandbox, or a handle on it kept for the next call by id (forgotten on error),
        and the deadline of a run of ``timeout`` seconds, which starts now.

        A handle is reached (endpoint and ``/ping``) once, not on every call by id; reaching
        it takes from the run's time.

        Raises:
            SandboxTimeoutError: the run's time ran out while the handle was being reached.
        """
        wait = None
        if is_number(timeout) and timeout > 0:
            wait = Wait("the run did not finish", timeout)  # a bad timeout: the run refuses it
        deadline = None if wait is None else wait.deadline
        if isinstance(sandbox, Sandbox):
            yield sandbox, deadline
            return
        sandbox_id = check_id(sandbox)
        handle = self._handles.get(sandbox_id)
        if handle is None:
            handle = self._handles.keep(self._connect_for_run(sandbox_id, wait))
        try:
            yield handle, deadline
        except (ApiError, TransportError):
            self._handles.forget(sandbox_id)  # gone, moved or paused: reach it afresh next time
            raise

    def _connect_for_run(self, sandbox_id: str, wait: Wait | None) -> Sandbox:
        """``connect(sandbox_id)``, within the time left of the run's ``wait``."""
        if wait is None:
            return self.connect(sandbox_id)
        try:
            return self.connect(sandbox_id, ready_timeout=min(DEFAULT_READY_TIMEOUT, wait.left()))
        except (SandboxTimeoutError, TransportError) as exc:
            if wait.expired():
                raise wait.error(f": sandbox {sandbox_id} was not reached in time ({exc})") from exc
            raise


class Handles:
    """The last ``HANDLES_KEPT`` handles reached for calls by sandbox id (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: OrderedDict[str, Sandbox] = OrderedDict()

    def get(self, sandbox_id: str) -> Sandbox | None:
        with self._lock:
            handle = self._handles.get(sandbox_id)
            if handle is not None:
                self._handles.move_to_end(sandbox_id)
            return handle

    def keep(self, handle: Sandbox) -> Sandbox:
        with self._lock:
            self._handles[handle.id] = handle
            while len(self._handles) > HANDLES_KEPT:
                self._handles.popitem(last=False)
        return handle

    def forget(self, sandbox_id: str) -> None:
        with self._lock:
            self._handles.pop(sandbox_id, None)
