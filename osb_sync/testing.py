"""A pytest plugin for testing code that uses OpenSandbox (entry point ``pytest11: opensandbox``).

Installed with osb_sync and loaded by pytest automatically. Fixtures:

- ``opensandbox_server`` (session): where the tests' sandboxes live, an
  :class:`OpenSandboxServer`. By default a :class:`~osb_sync.local.LocalServer` on a free
  loopback port, stopped at the end of the session; with ``--opensandbox-api-base URL``
  (and ``--opensandbox-api-key``, else ``OPEN_SANDBOX_API_KEY``) a real deployment instead.
  The environment's ``OPEN_SANDBOX_API_BASE`` is deliberately not used: a test run must not
  reach a deployment because a shell happened to export it.
- ``opensandbox_client`` (function): a :class:`~osb_sync.Client` for that server. Every
  sandbox it creates is tagged with the test session; one still alive when the test ends was
  leaked by the test: it is deleted and the test errors at teardown.
- ``opensandbox_sandbox`` (function): a running sandbox, deleted after the test.
- ``opensandbox_create_kwargs`` (function): the ``create_sandbox`` keywords used by
  ``opensandbox_sandbox``; override it in a ``conftest.py``.

On the local server, any sandbox still alive at the end of the session (created with another
client, a pool left open...) fails the run the same way. On a real deployment only sandboxes
tagged with this session are looked for, so other users' sandboxes are never touched.

Importing this module starts nothing and changes nothing; ``osb_sync.local`` is imported only
when the local server is needed. ``pytest -p no:opensandbox`` turns the plugin off.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import pytest

from ._client import Client
from ._errors import NotFoundError, OpenSandboxError

if TYPE_CHECKING:
    from ._sandbox import Sandbox
    from .local import LocalServer

SESSION_KEY = "osb-sync/test-session"


@dataclass(frozen=True)
class OpenSandboxServer:
    """The server the tests use.

    Attributes:
        api_base: lifecycle URL with ``/v1``.
        api_key: the API key; None: ``OPEN_SANDBOX_API_KEY``; ``""`` for the local server.
        session_tag: value of the ``osb-sync/test-session`` label on this session's sandboxes.
        local: the embedded LocalServer, or None when running against a real deployment.
    """

    api_base: str
    api_key: str | None
    session_tag: str
    local: LocalServer | None = None

    def client(self, **kwargs: Any) -> TrackingClient:
        """A new client for this server that tags and remembers what it creates."""
        return TrackingClient(self.api_base, self.api_key, session_tag=self.session_tag, **kwargs)


class TrackingClient(Client):
    """A Client that labels its sandboxes with the test session and remembers their ids."""

    def __init__(self, *args: Any, session_tag: str, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.session_tag = session_tag
        self._created: list[str] = []
        self._created_lock = threading.Lock()

    def create_sandbox(self, **kwargs: Any) -> Sandbox:
        """:meth:`osb_sync.Client.create_sandbox`, adding the session label to ``metadata``."""
        kwargs["metadata"] = {**(kwargs.get("metadata") or {}), SESSION_KEY: self.session_tag}
        sandbox = super().create_sandbox(**kwargs)
        with self._created_lock:
            self._created.append(sandbox.id)
        return sandbox

    def still_alive(self) -> list[str]:
        """Ids of the sandboxes this client created that still exist."""
        with self._created_lock:
            created = list(self._created)
        alive = []
        for sandbox_id in created:
            try:
                self.get_sandbox(sandbox_id)
            except NotFoundError:
                continue
            alive.append(sandbox_id)
        return alive


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``--opensandbox-*`` options."""
    group = parser.getgroup("opensandbox", "OpenSandbox fixtures (osb_sync)")
    group.addoption(
        "--opensandbox-api-base",
        metavar="URL",
        default=None,
        help="run the opensandbox_* fixtures against this lifecycle URL (with /v1) instead "
        "of an embedded local server",
    )
    group.addoption(
        "--opensandbox-api-key",
        metavar="KEY",
        default=None,
        help="API key for --opensandbox-api-base (default: $OPEN_SANDBOX_API_KEY)",
    )


@pytest.fixture(scope="session")
def opensandbox_server(request: pytest.FixtureRequest) -> Iterator[OpenSandboxServer]:
    """The server for this test session; fails the run if sandboxes were left behind."""
    api_base = request.config.getoption("opensandbox_api_base")
    tag = secrets.token_hex(6)
    if api_base:
        server = OpenSandboxServer(api_base, request.config.getoption("opensandbox_api_key"), tag)
        yield server
        _fail_on_leaks(server, {SESSION_KEY: tag})
        return
    from .local import LocalServer

    # The client's default deny-all policy is accepted even where it cannot be enforced.
    with LocalServer(unenforced_network_policy="accept") as local:
        server = OpenSandboxServer(local.api_base, "", tag, local=local)  # no key to leak
        yield server
        _fail_on_leaks(server, None)


@pytest.fixture
def opensandbox_client(opensandbox_server: OpenSandboxServer) -> Iterator[TrackingClient]:
    """A client for the test's server; a sandbox it created and the test left alive errors."""
    client = opensandbox_server.client()
    try:
        yield client
        leaked = client.still_alive()
        for sandbox_id in leaked:
            client.delete_quietly(sandbox_id)
    finally:
        client.close()
    if leaked:
        pytest.fail(
            f"the test left {len(leaked)} sandbox(es) alive (now deleted): {', '.join(leaked)}",
            pytrace=False,
        )


@pytest.fixture
def opensandbox_create_kwargs() -> dict[str, Any]:
    """Keywords for ``create_sandbox`` in ``opensandbox_sandbox``; override to change them."""
    return {}


@pytest.fixture
def opensandbox_sandbox(
    opensandbox_client: TrackingClient, opensandbox_create_kwargs: dict[str, Any]
) -> Iterator[Sandbox]:
    """A running sandbox, deleted after the test."""
    sandbox = opensandbox_client.create_sandbox(**opensandbox_create_kwargs)
    try:
        yield sandbox
    finally:
        opensandbox_client.delete_quietly(sandbox.id)


def _fail_on_leaks(server: OpenSandboxServer, metadata: dict[str, str] | None) -> None:
    """Delete the sandboxes still alive (all, or those with ``metadata``) and fail if any were."""
    with Client(server.api_base, server.api_key) as client:
        try:
            leaked = [info.id for info in client.list_sandboxes(metadata=metadata)]
        except OpenSandboxError as exc:
            pytest.fail(f"could not list sandboxes to look for leaks: {exc}", pytrace=False)
        for sandbox_id in leaked:
            client.delete_quietly(sandbox_id)
    if leaked:
        pytest.fail(
            f"{len(leaked)} sandbox(es) were left alive at the end of the test session "
            f"(now deleted): {', '.join(leaked)}",
            pytrace=False,
        )
