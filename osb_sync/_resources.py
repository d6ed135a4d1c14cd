"""The released server's nouns besides sandboxes, each a small class over the Lifecycle.

``client.snapshots``, ``client.pools`` and ``client.templates`` name server-wide things;
``sandbox.diagnostics`` and ``sandbox.network_policy`` are bound to one sandbox. Every call
goes through ``Lifecycle.request`` as a *feature*: a server that does not serve it raises
NotSupportedError (see ``_lifecycle.FEATURES``), never a bare 404 or 501.
"""

from __future__ import annotations

import builtins
import re
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence
from urllib.parse import quote, urlencode

from ._config import check_id
from ._errors import ConfigurationError, SandboxStateError
from ._lifecycle import sandbox_path
from ._models import (
    DiagnosticContent,
    NetworkPolicy,
    NetworkRule,
    Pool,
    PoolCapacity,
    Snapshot,
    Template,
)
from ._validators import non_empty, whole
from ._wait import Wait

if TYPE_CHECKING:
    from ._lifecycle import Lifecycle

SNAPSHOT_FAILED_STATES = frozenset({"Failed", "Deleting"})
DEFAULT_SNAPSHOT_TIMEOUT = 300.0  # a snapshot copies a file system: minutes, not seconds
DEFAULT_PAGE_SIZE = 20  # the released server's default for /snapshots and /templates
# Kubernetes' DNS-1123 label rule, the released server's pattern for a pool name
POOL_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _escaped(value: str, what: str) -> str:
    return quote(non_empty(what, value), safe="")


def check_pool_name(name: object) -> str:
    """A pool name, checked against the released server's pattern (DNS-1123, 253 chars).

    Raises:
        ConfigurationError: another name.
    """
    if not isinstance(name, str) or len(name) > 253 or not POOL_NAME.match(name):
        raise ConfigurationError(
            f"a pool name is lowercase letters, digits and '-' (not at either end), at most "
            f"253 characters, got {name!r}"
        )
    return name


def _capacity(capacity: PoolCapacity | Mapping[str, int]) -> PoolCapacity:
    if isinstance(capacity, PoolCapacity):
        return capacity
    if isinstance(capacity, Mapping):
        return PoolCapacity(**capacity)
    raise ConfigurationError(f"capacity must be a PoolCapacity, got {capacity!r}")


class Snapshots:
    """``client.snapshots``: point-in-time copies of sandboxes, restorable by id."""

    def __init__(self, lifecycle: Lifecycle):
        self._lifecycle = lifecycle

    def create(self, sandbox_id: str, name: str | None = None) -> Snapshot:
        """Start a snapshot of a running sandbox; it is ``Creating`` until ``Ready``.

        Args:
            sandbox_id: the sandbox (it must be Running).
            name: a name for it (the server's default when None).

        Raises:
            ConfigurationError: an empty name.
            NotSupportedError: the server makes no snapshots.
            NotFoundError: no such sandbox.
            ApiError: e.g. 409 when the sandbox is not running.
            TransportError: the server could not be reached.
        """
        if name is not None:
            non_empty("a snapshot name", name)
        path = f"{sandbox_path(check_id(sandbox_id))}/snapshots"
        body = {"name": name} if name is not None else {}
        return Snapshot.from_dict(self._lifecycle.call_object("POST", path, "snapshots", json=body))

    def get(self, snapshot_id: str) -> Snapshot:
        """One snapshot's current description.

        Raises:
            NotFoundError: no such snapshot.
            NotSupportedError: the server makes no snapshots.
            ApiError: another error status.
        """
        path = f"/snapshots/{_escaped(snapshot_id, 'a snapshot id')}"
        return Snapshot.from_dict(self._lifecycle.call_object("GET", path, "snapshots"))

    def list(
        self,
        *,
        sandbox_id: str | None = None,
        name: str | None = None,
        states: Sequence[str] | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> Iterator[Snapshot]:
        """Iterate over snapshots, following pagination lazily.

        Args:
            sandbox_id: keep the snapshots of this sandbox.
            name: keep the snapshots of this exact name.
            states: keep snapshots in any of these states (``Creating``, ``Ready``...).
            page_size: snapshots per request (1 to 200).

        Raises:
            ConfigurationError: a bad ``page_size``.
            NotSupportedError: the server makes no snapshots.
            ApiError: an error status.
        """
        params: dict[str, Any] = {}
        if sandbox_id is not None:
            params["sandboxId"] = check_id(sandbox_id)
        if name is not None:
            params["name"] = name
        if states:
            params["state"] = [str(state) for state in states]
        for item in self._lifecycle.iter_pages("/snapshots", params, page_size, "snapshots"):
            yield Snapshot.from_dict(item)

    def delete(self, snapshot_id: str) -> bool:
        """Delete a snapshot: True if deleted, False if it did not exist.

        Raises:
            NotSupportedError: the server makes no snapshots.
            ApiError: e.g. 409 while it is still being made.
        """
        path = f"/snapshots/{_escaped(snapshot_id, 'a snapshot id')}"
        return self._lifecycle.remove(path, "snapshots")

    def wait_until_ready(
        self,
        snapshot_id: str,
        *,
        timeout: float = DEFAULT_SNAPSHOT_TIMEOUT,
        poll_interval: float = 0.5,
    ) -> Snapshot:
        """Poll a snapshot until it is ``Ready``: one sleep between two polls.

        Raises:
            SandboxStateError: it entered ``Failed`` or ``Deleting``.
            SandboxTimeoutError: not Ready within ``timeout`` seconds.
            NotFoundError: no such snapshot.
            NotSupportedError: the server makes no snapshots.
        """
        wait = Wait(f"snapshot {snapshot_id} was not Ready", timeout)
        path = f"/snapshots/{_escaped(snapshot_id, 'a snapshot id')}"
        while True:
            with wait.bounding():
                data = self._lifecycle.call_object("GET", path, "snapshots", deadline=wait.deadline)
            snapshot = Snapshot.from_dict(data)
            if snapshot.ready:
                return snapshot
            if snapshot.state in SNAPSHOT_FAILED_STATES:
                detail = ": ".join(d for d in (snapshot.reason, snapshot.message) if d)
                raise SandboxStateError(
                    f"snapshot {snapshot_id} entered {snapshot.state}"
                    + (f" ({detail})" if detail else "")
                )
            if wait.expired():
                raise wait.error(f" (last state: {snapshot.state or 'unknown'})")
            wait.sleep(poll_interval)


class Pools:
    """``client.pools``: the server's pools of pre-warmed sandboxes (Kubernetes runtime;
    osb-sync serve keeps them as warm spares)."""

    def __init__(self, lifecycle: Lifecycle):
        self._lifecycle = lifecycle

    def create(
        self,
        name: str,
        template: Mapping[str, Any],
        capacity: PoolCapacity | Mapping[str, int],
    ) -> Pool:
        """Create a pool; then ``create_sandbox(pool=name)`` takes a sandbox from it.

        Args:
            name: the pool's name (lowercase letters, digits, '-').
            template: what each sandbox is made from: a Kubernetes ``PodTemplateSpec``
                (``{"metadata": ..., "spec": {"containers": [...]}}``), sent as it is; the
                server copies it unread into its Pool resource. osb-sync serve takes the
                same template (honouring the container's image, env and limits, ignoring
                execd's plumbing with a note in ``Pool.message``), or a create body.
            capacity: how many sandboxes it keeps warm.

        Raises:
            ConfigurationError: a bad name, template or capacity.
            NotSupportedError: the server has no pools.
            ApiError: e.g. 409 when a pool of that name exists.
        """
        if not isinstance(template, Mapping):
            raise ConfigurationError("template must be a mapping (the pool's sandbox template)")
        body = {
            "name": check_pool_name(name),
            "template": dict(template),
            "capacitySpec": _capacity(capacity).to_dict(),
        }
        return Pool.from_dict(self._lifecycle.call_object("POST", "/pools", "pools", json=body))

    def get(self, name: str) -> Pool:
        """One pool and its status.

        Raises:
            NotFoundError: no such pool.
            NotSupportedError: the server has no pools.
        """
        path = f"/pools/{quote(check_pool_name(name), safe='')}"
        return Pool.from_dict(self._lifecycle.call_object("GET", path, "pools"))

    def list(self) -> builtins.list[Pool]:
        """Every pool (the server does not paginate them).

        Raises:
            NotSupportedError: the server has no pools.
            ApiError: an error status.
        """
        items = self._lifecycle.call_object("GET", "/pools", "pools").get("items")
        return [Pool.from_dict(item) for item in items or () if isinstance(item, dict)]

    def update(self, name: str, capacity: PoolCapacity | Mapping[str, int]) -> Pool:
        """Change a pool's capacity; returns the pool as the server now describes it.

        Raises:
            NotFoundError: no such pool.
            NotSupportedError: the server has no pools.
        """
        path = f"/pools/{quote(check_pool_name(name), safe='')}"
        body = {"capacitySpec": _capacity(capacity).to_dict()}
        return Pool.from_dict(self._lifecycle.call_object("PUT", path, "pools", json=body))

    def delete(self, name: str) -> bool:
        """Delete a pool: True if deleted, False if it did not exist.

        Raises:
            NotSupportedError: the server has no pools.
        """
        return self._lifecycle.remove(f"/pools/{quote(check_pool_name(name), safe='')}", "pools")


class Templates:
    """``client.templates``: fsb templates, golden images built by the server's Kubernetes
    runtime (``create_sandbox(template_id=...)``)."""

    def __init__(self, lifecycle: Lifecycle):
        self._lifecycle = lifecycle

    def create(
        self,
        image: str,
        publish: str,
        *,
        entrypoint: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        resource_limits: Mapping[str, str] | None = None,
        readiness_probe: str | None = None,
        warmup_seconds: int | None = None,
        format: str | None = None,
    ) -> Template:
        """Start building a template; it is ``Pending`` until ``Succeeded``.

        Args:
            image: the image to build it from.
            publish: where the server publishes the artifacts.
            entrypoint, env, metadata, resource_limits: the template's workload.
            readiness_probe: e.g. ``tcp://127.0.0.1:44772`` or ``cmd://<command>``.
            warmup_seconds: the fallback warm-up window.
            format: ``native`` or ``overlaybd`` (the server's default).

        Raises:
            ConfigurationError: an empty image or publish, or a bad format.
            NotSupportedError: the server has no templates.
            ApiError: e.g. 409 for a template of that name.
        """
        non_empty("image", image)
        non_empty("publish", publish)
        if format not in (None, "native", "overlaybd"):
            raise ConfigurationError(f"format must be 'native' or 'overlaybd', got {format!r}")
        body: dict[str, Any] = {"image": image, "publish": publish}
        for key, value in (
            ("env", env),
            ("metadata", metadata),
            ("resourceLimits", resource_limits),
        ):
            if value:
                body[key] = dict(value)
        if entrypoint:
            body["entrypoint"] = list(entrypoint)
        readiness: dict[str, Any] = {}
        if readiness_probe is not None:
            readiness["probe"] = readiness_probe
        if warmup_seconds is not None:
            readiness["warmupSeconds"] = warmup_seconds
        if readiness:
            body["readiness"] = readiness
        if format is not None:
            body["format"] = format
        data = self._lifecycle.call_object("POST", "/templates", "templates", json=body)
        return Template.from_dict(data)

    def get(self, template_id: str) -> Template:
        """One template's status.

        Raises:
            NotFoundError: no such template.
            NotSupportedError: the server has no templates.
        """
        path = f"/templates/{_escaped(template_id, 'a template id')}"
        return Template.from_dict(self._lifecycle.call_object("GET", path, "templates"))

    def list(
        self, *, metadata: Mapping[str, str] | None = None, page_size: int = DEFAULT_PAGE_SIZE
    ) -> Iterator[Template]:
        """Iterate over templates, following pagination lazily.

        Raises:
            ConfigurationError: a bad ``page_size``.
            NotSupportedError: the server has no templates.
        """
        params = {"metadata": urlencode(dict(metadata))} if metadata else {}
        for item in self._lifecycle.iter_pages("/templates", params, page_size, "templates"):
            yield Template.from_dict(item)

    def delete(self, template_id: str) -> bool:
        """Delete a template (running sandboxes are unaffected): True if deleted, False if it
        did not exist.

        Raises:
            NotSupportedError: the server has no templates.
        """
        path = f"/templates/{_escaped(template_id, 'a template id')}"
        return self._lifecycle.remove(path, "templates")


def _positive(name: str, value: int | None, maximum: int) -> int | None:
    return None if value is None else whole(name, value, 1, maximum, fix="or None")


class Diagnostics:
    """``sandbox.diagnostics``: the server's troubleshooting text about one sandbox.

    Without a ``scope``, ``logs`` and ``events`` ask for the released server's plain text
    (what its Docker runtime serves); with one, the stable Diagnostics descriptor of
    ``diagnostic-api.yml`` (``container``, ``lifecycle``, ``runtime``, ``all``...), which
    the released Docker runtime answers with 501, raised as NotSupportedError.
    """

    def __init__(self, lifecycle: Lifecycle, sandbox_id: str):
        self._lifecycle = lifecycle
        self._path = f"{sandbox_path(sandbox_id)}/diagnostics"
        self._sandbox_id = sandbox_id

    def _content(self, kind: str, scope: str | None, params: dict[str, Any]) -> DiagnosticContent:
        path = f"{self._path}/{kind}"
        if scope is None:
            text = self._lifecycle.text(path, "diagnostics", params or None)
            return DiagnosticContent(sandbox_id=self._sandbox_id, kind=kind, content=text)
        non_empty("scope (e.g. 'container', or None)", scope)
        if params:
            raise ConfigurationError(
                f"{', '.join(params)} apply to the plain-text {kind} only: pass scope=None"
            )
        query = {"scope": scope}
        data = self._lifecycle.call_object("GET", path, "scoped diagnostics", params=query)
        return DiagnosticContent.from_dict(data)

    def logs(
        self,
        scope: str | None = None,
        *,
        tail: int | None = None,
        since: str | None = None,
        container: str | None = None,
    ) -> DiagnosticContent:
        """The sandbox's logs.

        Args:
            scope: a Diagnostics scope, or None for the plain-text logs.
            tail: trailing lines (1 to 10000; plain text only).
            since: only newer logs, e.g. ``"10m"`` (plain text only).
            container: which container (plain text only).

        Raises:
            ConfigurationError: a bad argument, or plain-text options with a scope.
            NotSupportedError: the server does not serve it (a scope on the Docker runtime).
            NotFoundError: no such sandbox.
            ApiError: e.g. 400 for a scope the server does not know.
        """
        params: dict[str, Any] = {}
        if _positive("tail", tail, 10000) is not None:
            params["tail"] = tail
        if since is not None:
            params["since"] = since
        if container is not None:
            params["container"] = container
        return self._content("logs", scope, params)

    def events(self, scope: str | None = None, *, limit: int | None = None) -> DiagnosticContent:
        """The sandbox's events (created, started, paused, OOM-killed, expired...).

        Args:
            scope: a Diagnostics scope, or None for the plain-text events.
            limit: at most this many events (1 to 500; plain text only).

        Raises:
            The errors of :meth:`logs`.
        """
        params = {"limit": limit} if _positive("limit", limit, 500) is not None else {}
        return self._content("events", scope, params)

    def inspect(self) -> str:
        """The runtime's description of the sandbox's container, as plain text.

        Raises:
            NotSupportedError: the server has no diagnostics.
            NotFoundError: no such sandbox.
        """
        return self._lifecycle.text(f"{self._path}/inspect", "diagnostics")

    def summary(self, *, tail: int | None = None, event_limit: int | None = None) -> str:
        """Logs, events and state together, as plain text.

        Args:
            tail: trailing log lines (1 to 10000).
            event_limit: at most this many events (1 to 500).

        Raises:
            ConfigurationError: a bad argument.
            NotSupportedError: the server has no diagnostics.
            NotFoundError: no such sandbox.
        """
        params: dict[str, Any] = {}
        if _positive("tail", tail, 10000) is not None:
            params["tail"] = tail
        if _positive("event_limit", event_limit, 500) is not None:
            params["event_limit"] = event_limit
        return self._lifecycle.text(f"{self._path}/summary", "diagnostics", params or None)


class Network:
    """``sandbox.network_policy``: the running sandbox's egress policy, changed in place."""

    def __init__(self, lifecycle: Lifecycle, sandbox_id: str):
        self._lifecycle = lifecycle
        self._path = f"{sandbox_path(sandbox_id)}/networkpolicy"

    def get(self) -> NetworkPolicy:
        """The policy the sandbox runs under now.

        Raises:
            NotSupportedError: the server cannot change network policies at run time.
            NotFoundError: no such sandbox.
        """
        data = self._lifecycle.call("GET", self._path, "network policy changes")
        return NetworkPolicy.from_dict(data)

    def replace(self, policy: NetworkPolicy | Mapping[str, Any]) -> None:
        """Replace the whole policy (``NetworkPolicy("allow")`` lifts a deny-all).

        Raises:
            ConfigurationError: a malformed policy.
            NotSupportedError: the server cannot change network policies at run time.
            ApiError: e.g. 400 for rules the server cannot enforce.
        """
        if isinstance(policy, Mapping):
            unknown = set(policy) - {"defaultAction", "egress"}
            if unknown:
                raise ConfigurationError(f"a network policy has no {sorted(unknown)}")
            policy = NetworkPolicy(
                default_action=policy.get("defaultAction"), egress=tuple(policy.get("egress") or ())
            )
        if not isinstance(policy, NetworkPolicy):
            raise ConfigurationError(f"policy must be a NetworkPolicy, got {policy!r}")
        self._lifecycle.request(
            "PUT", self._path, json=policy.to_dict(), feature="network policy changes"
        ).close()

    def patch_rules(self, rules: Sequence[NetworkRule | Mapping[str, str]]) -> None:
        """Add or replace rules by target (the egress sidecar's merge: the first of two rules
        for one target wins).

        Raises:
            ConfigurationError: no rules, or a malformed one.
            NotSupportedError: the server cannot change network policies at run time.
            ApiError: e.g. 400 for rules the server cannot enforce.
        """
        checked = [NetworkRule.of(dict(r) if isinstance(r, Mapping) else r) for r in rules]
        if not checked:
            raise ConfigurationError("patch_rules needs at least one rule")
        self._lifecycle.request(
            "PATCH",
            self._path,
            json=[rule.to_dict() for rule in checked],
            feature="network policy changes",
        ).close()

    def delete_rules(self, targets: Sequence[str]) -> None:
        """Remove the rules for these targets (host names as the rules name them).

        Raises:
            ConfigurationError: no targets, or one that is not a non-empty str.
            NotSupportedError: the server cannot change network policies at run time.
        """
        if isinstance(targets, str):
            raise ConfigurationError("targets is a list of host names, not one str")
        names = list(targets)
        if not names or not all(isinstance(t, str) and t.strip() for t in names):
            raise ConfigurationError("delete_rules needs non-empty host names")
        self._lifecycle.request(
            "DELETE", self._path, json=names, feature="network policy changes"
        ).close()
