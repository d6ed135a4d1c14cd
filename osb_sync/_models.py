"""Plain data returned by the client. No I/O here."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ._errors import CommandFailed, ConfigurationError
from ._validators import whole


@dataclass(frozen=True, slots=True)
class Event:
    """One decoded event of an execd stream.

    Attributes:
        type: ``init``, ``ping``, ``stdout``, ``stderr``, ``result``, ``execution_count``,
            ``status``, ``error``, ``execution_complete``, or whatever the server sends.
            A type-less ``{"code", "message"}`` object (execd's mid-stream failure) is ``error``.
        text: the event's ``text``, or None.
        timestamp: Unix milliseconds, or None.
        data: the whole decoded object.
    """

    type: str
    text: str | None = None
    timestamp: int | None = None
    data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ExecutionError:
    """An error raised by the code inside the sandbox (returned, not raised)."""

    name: str
    value: str
    traceback: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ExecutionResult:
    """What one run produced.

    Attributes:
        stdout: the concatenated stdout text.
        stderr: the concatenated stderr text.
        results: one dict per ``result`` event (MIME type to value; ``text`` for plain text).
        error: the first error, or None.
        execution_count: the kernel's execution counter, when it sent one.
        execution_id: the ``init`` event's text (for ``/code``, the context id).
    """

    stdout: str = ""
    stderr: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    error: ExecutionError | None = None
    execution_count: int | None = None
    execution_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return LiteLLM's result shape."""
        error = None
        if self.error is not None:
            error = {
                "name": self.error.name,
                "value": self.error.value,
                "traceback": list(self.error.traceback),
            }
        return {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "results": [dict(r) for r in self.results],
            "error": error,
            "execution_count": self.execution_count,
        }


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the lifecycle API describes it.

    Attributes:
        id: the sandbox id.
        state: ``Pending``, ``Running``, ``Paused``... (servers add values; kept as sent).
        reason: machine-readable reason of the state, or None.
        message: human-readable detail of the state, or None.
        metadata: the sandbox's labels.
        image: the image URI, or None (e.g. created from a snapshot).
        entrypoint: the main process.
        created_at: creation time (timezone-aware), or None.
        expires_at: expiry time (timezone-aware), or None when it never expires.
    """

    id: str
    state: str | None = None
    reason: str | None = None
    message: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    image: str | None = None
    entrypoint: list[str] = field(default_factory=list)
    created_at: datetime | None = None
    expires_at: datetime | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SandboxInfo:
        """Build from a lifecycle ``Sandbox`` object, tolerating missing or odd fields."""
        raw_status = data.get("status")
        status: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
        image = data.get("image")
        metadata = data.get("metadata")
        entrypoint = data.get("entrypoint")
        return cls(
            id=str(data.get("id", "")),
            state=_str_or_none(status.get("state")),
            reason=_str_or_none(status.get("reason")),
            message=_str_or_none(status.get("message")),
            metadata=(
                {str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {}
            ),
            image=_str_or_none(image.get("uri")) if isinstance(image, dict) else None,
            entrypoint=[str(e) for e in entrypoint] if isinstance(entrypoint, list) else [],
            created_at=parse_time(data.get("createdAt")),
            expires_at=parse_time(data.get("expiresAt")),
        )


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


_FRACTION = re.compile(r"\.(\d+)")


def parse_time(value: Any) -> datetime | None:
    """Parse an RFC 3339 time (``Z`` and nanoseconds included, which Python 3.10 rejects)."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    if text[-1:] in ("Z", "z"):
        text = text[:-1] + "+00:00"
    text = _FRACTION.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), text, count=1)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class CommandResult:
    """What one shell command produced. A non-zero exit is data, not an exception.

    Attributes:
        id: the command id from ``init`` (for status, logs, interrupt).
        exit_code: the exit code, -1 for a signal death, None when unknown.
        stdout: the output text, each line followed by ``"\\n"``.
        stderr: the error text, likewise (empty for bash sessions: they merge it into stdout).
        error: the error event, or None.
        timed_out: the command ran past its ``timeout`` and was stopped.
        duration: seconds from the request to the end of the stream.
    """

    id: str | None = None
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: ExecutionError | None = None
    timed_out: bool = False
    duration: float = 0.0

    def check(self) -> CommandResult:
        """Return self if the command succeeded.

        Raises:
            CommandFailed: non-zero exit, an error, or a timeout; with the tail of stderr.
        """
        if self.exit_code == 0 and not self.timed_out and self.error is None:
            return self
        tail = (self.stderr or self.stdout)[-_TAIL_CHARS:]
        if self.timed_out:
            reason = "timed out"
        elif self.exit_code is not None:
            reason = f"exited with {self.exit_code}"
        else:
            reason = f"failed: {self.error.value if self.error else 'no exit code'}"
        raise CommandFailed(
            f"command {self.id or ''} {reason}".replace("  ", " ") + (f": {tail}" if tail else ""),
            exit_code=self.exit_code,
            stderr=self.stderr,
        )


_TAIL_CHARS = 2000


@dataclass(frozen=True)
class CommandStatus:
    """A command's state as execd reports it."""

    id: str
    running: bool
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    content: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommandStatus:
        """Build from execd's ``/command/status`` body."""
        exit_code = data.get("exit_code")
        return cls(
            id=str(data.get("id", "")),
            running=bool(data.get("running")),
            exit_code=exit_code if isinstance(exit_code, int) else None,
            started_at=parse_time(data.get("started_at")),
            finished_at=parse_time(data.get("finished_at")),
            error=_str_or_none(data.get("error")),
            content=_str_or_none(data.get("content")),
        )


@dataclass(frozen=True)
class CodeContext:
    """A named code context: state (variables, imports) persists between runs in it."""

    id: str
    language: str

    @classmethod
    def from_dict(cls, data: Any, language: str = "") -> CodeContext:
        """Build from execd's ``{"id", "language"}``; ``language`` fills a missing one.

        Raises:
            ConfigurationError: ``data`` is not a mapping with a str ``id``.
        """
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise ConfigurationError(f"a code context needs an id (a str), got {data!r:.60}")
        return cls(id=data["id"], language=str(data.get("language") or language))


@dataclass(frozen=True)
class Endpoint:
    """How to reach a port a sandbox serves: ``url`` with scheme, and the headers to send."""

    url: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Metrics:
    """One resource sample, as the sandbox's execd reports it (``sandbox.metrics()``).

    OpenSandbox's execd reads ``/proc`` of the kernel it runs on, so these are the host's (or
    the Kubernetes node's) CPU count, CPU use and memory, not the sandbox's against its
    limits; the local server's execd does the same. :class:`SandboxStats` is the sandbox's
    own, where the server can tell it (``osb-sync serve``).
    """

    cpu_count: float
    cpu_used_pct: float
    mem_total_mib: float
    mem_used_mib: float
    timestamp: int | None = None

    @classmethod
    def from_dict(cls, data: Any) -> Metrics:
        """Build from execd's ``/metrics`` answer; missing numbers are 0."""
        data = data if isinstance(data, dict) else {}
        timestamp = data.get("timestamp")
        return cls(
            cpu_count=_number(data.get("cpu_count")),
            cpu_used_pct=_number(data.get("cpu_used_pct")),
            mem_total_mib=_number(data.get("mem_total_mib")),
            mem_used_mib=_number(data.get("mem_used_mib")),
            timestamp=timestamp if type(timestamp) is int else None,
        )


@dataclass(frozen=True)
class SandboxStats:
    """A sandbox's usage against its limits, as ``osb-sync serve`` reads its cgroups
    (``client.sandbox_stats``; an extension of its API, ``GET /sandboxes/{id}/stats``).

    ``resource_limits`` are the create's, as given (``{"memory": "256Mi"}``); every figure is
    None where the server has no group of the sandbox to read it from (a server that is not
    root has none; ``source`` is then None too), and a limit None where there is none.
    ``cpu_seconds`` is the CPU time of the sandbox's live processes and of the children they
    waited for.
    """

    id: str
    resource_limits: dict[str, str] = field(default_factory=dict)
    source: str | None = None
    memory_used_bytes: int | None = None
    memory_limit_bytes: int | None = None
    cpu_limit: float | None = None
    cpu_seconds: float | None = None
    pids: int | None = None
    pids_limit: int | None = None

    @classmethod
    def from_dict(cls, data: Any) -> SandboxStats:
        """Build from the answer; a figure that is not a finite number from 0 is None."""
        data = data if isinstance(data, dict) else {}
        source = data.get("source")
        return cls(
            id=str(data.get("id") or ""),
            resource_limits=_str_map(data.get("resourceLimits")),
            source=source if isinstance(source, str) else None,
            memory_used_bytes=_count(data.get("memoryUsedBytes")),
            memory_limit_bytes=_count(data.get("memoryLimitBytes")),
            cpu_limit=_amount(data.get("cpuLimit")),
            cpu_seconds=_amount(data.get("cpuSeconds")),
            pids=_count(data.get("pids")),
            pids_limit=_count(data.get("pidsLimit")),
        )


def _count(value: Any) -> int | None:
    """A count from 0 below 2**63 (as the kernel's), else None."""
    return value if type(value) is int and 0 <= value < 1 << 63 else None


def _amount(value: Any) -> float | None:
    """A finite number from 0, else None (an int too large for a float too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        amount = float(value)
    except OverflowError:
        return None
    return amount if math.isfinite(amount) and amount >= 0 else None


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


@dataclass(frozen=True)
class FileInfo:
    """A file or directory in a sandbox.

    ``mode`` holds the permission bits as a number (``0o644``); execd's wire form (the decimal
    digits ``644``) is converted both ways.
    """

    path: str
    type: str
    size: int = 0
    mode: int = 0
    owner: str | None = None
    group: str | None = None
    modified_at: datetime | None = None
    created_at: datetime | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FileInfo:
        """Build from execd's ``FileInfo`` object."""
        size = data.get("size")
        return cls(
            path=str(data.get("path", "")),
            type=str(data.get("type", "")),
            size=size if isinstance(size, int) else 0,
            mode=mode_from_wire(data.get("mode")),
            owner=_str_or_none(data.get("owner")),
            group=_str_or_none(data.get("group")),
            modified_at=parse_time(data.get("modified_at")),
            created_at=parse_time(data.get("created_at")),
        )


def mode_to_wire(mode: int) -> int:
    """0o755 -> 755: execd reads the decimal digits as octal.

    Raises:
        ConfigurationError: not an int from 0 to 0o7777.
    """
    whole("a file mode", mode, 0, 0o7777, what="an int from 0 to 0o7777 such as 0o644")
    return int(format(mode, "o"))


def mode_from_wire(value: Any) -> int:
    """755 -> 0o755; anything unreadable -> 0."""
    try:
        return int(str(int(value)), 8)
    except (TypeError, ValueError):
        return 0


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str_map(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _int_or_none(value: Any) -> int | None:
    return value if type(value) is int else None


@dataclass(frozen=True)
class Snapshot:
    """A point-in-time snapshot of a sandbox, as ``/snapshots`` describes it.

    Attributes:
        id: the snapshot id (pass it as ``create_sandbox(snapshot_id=...)``).
        sandbox_id: the sandbox it was taken from.
        name: its name, or None.
        state: ``Creating``, ``Ready``, ``Failed``, ``Deleting`` (kept as sent).
        reason: machine-readable reason of the state, or None.
        message: human-readable detail of the state, or None.
        created_at: creation time, or None.
        last_transition_at: time of the last state change, or None.
    """

    id: str
    sandbox_id: str = ""
    name: str | None = None
    state: str | None = None
    reason: str | None = None
    message: str | None = None
    created_at: datetime | None = None
    last_transition_at: datetime | None = None

    @property
    def ready(self) -> bool:
        """Whether a sandbox can be created from it now."""
        return self.state == "Ready"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        """Build from a lifecycle ``Snapshot`` object, tolerating missing or odd fields."""
        status = _object(data.get("status"))
        return cls(
            id=str(data.get("id", "")),
            sandbox_id=str(data.get("sandboxId", "")),
            name=_str_or_none(data.get("name")),
            state=_str_or_none(status.get("state")),
            reason=_str_or_none(status.get("reason")),
            message=_str_or_none(status.get("message")),
            created_at=parse_time(data.get("createdAt")),
            last_transition_at=parse_time(status.get("lastTransitionAt")),
        )


@dataclass(frozen=True)
class PoolCapacity:
    """How many warm sandboxes a server-side pool keeps (the ``capacitySpec``), checked once.

    Attributes:
        pool_min: sandboxes the pool holds at least, allocated or not.
        pool_max: sandboxes the pool holds at most.
        buffer_min: idle (unallocated) sandboxes kept at least.
        buffer_max: idle sandboxes kept at most.

    Raises:
        ConfigurationError: a count that is not an int >= 0, or a minimum above its maximum.
    """

    pool_min: int = 0
    pool_max: int = 1
    buffer_min: int = 0
    buffer_max: int = 1

    def __post_init__(self) -> None:
        for name in ("pool_min", "pool_max", "buffer_min", "buffer_max"):
            whole(name, getattr(self, name), 0)
        for low, high in (("pool_min", "pool_max"), ("buffer_min", "buffer_max")):
            if getattr(self, low) > getattr(self, high):
                raise ConfigurationError(f"{low} must not exceed {high}")

    def to_dict(self) -> dict[str, int]:
        """The wire form (``bufferMax``, ``bufferMin``, ``poolMax``, ``poolMin``)."""
        return {
            "bufferMax": self.buffer_max,
            "bufferMin": self.buffer_min,
            "poolMax": self.pool_max,
            "poolMin": self.pool_min,
        }

    @classmethod
    def from_dict(cls, data: Any) -> PoolCapacity:
        """Build from the wire form; a missing count is 0.

        Raises:
            ConfigurationError: a count that is not an int >= 0.
        """
        data = data if isinstance(data, dict) else {}
        return cls(
            pool_min=data.get("poolMin", 0),
            pool_max=data.get("poolMax", 0),
            buffer_min=data.get("bufferMin", 0),
            buffer_max=data.get("bufferMax", 0),
        )


@dataclass(frozen=True)
class Pool:
    """A server-side pool of pre-warmed sandboxes (``/pools``).

    Attributes:
        name: the pool's name (pass it as ``create_sandbox(pool=...)``).
        capacity: its capacity spec.
        total: sandboxes it holds, or None when the server did not report a status.
        allocated: sandboxes handed out, or None.
        available: idle sandboxes ready to hand out, or None.
        revision: the server's revision of the pool, or None.
        created_at: creation time, or None.
        message: the server's note on the pool (osb-sync serve: what of a Kubernetes pod
            template it ignored), or None.
    """

    name: str
    capacity: PoolCapacity
    total: int | None = None
    allocated: int | None = None
    available: int | None = None
    revision: str | None = None
    created_at: datetime | None = None
    message: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Pool:
        """Build from a lifecycle ``PoolResponse`` object.

        A capacity the server describes oddly (negative, min above max) is kept as zeros
        rather than refused: it is the server's data, not the caller's argument.
        """
        status = _object(data.get("status"))
        try:
            capacity = PoolCapacity.from_dict(data.get("capacitySpec"))
        except ConfigurationError:
            capacity = PoolCapacity(0, 0, 0, 0)
        return cls(
            name=str(data.get("name", "")),
            capacity=capacity,
            total=_int_or_none(status.get("total")),
            allocated=_int_or_none(status.get("allocated")),
            available=_int_or_none(status.get("available")),
            revision=_str_or_none(status.get("revision")),
            created_at=parse_time(data.get("createdAt")),
            message=_str_or_none(status.get("message")),
        )


@dataclass(frozen=True)
class Template:
    """A sandbox template (an fsb golden image built by the server's Kubernetes runtime).

    Attributes:
        id: the template id (pass it as ``create_sandbox(template_id=...)``).
        image: the image it was built from.
        publish: where the artifacts are published.
        format: ``native`` or ``overlaybd``.
        phase: ``Pending``, ``Building``, ``Succeeded`` or ``Failed`` (kept as sent).
        message: why it failed, or None.
        manifest_ref: the published manifest, once ``Succeeded``; else None.
        entrypoint: its entrypoint, if it has one.
        env: its environment.
        metadata: its labels.
        resource_limits: its resource limits.
        created_at: creation time, or None.
        updated_at: time of the last update, or None.
    """

    id: str
    image: str = ""
    publish: str = ""
    format: str = ""
    phase: str | None = None
    message: str | None = None
    manifest_ref: str | None = None
    entrypoint: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    resource_limits: dict[str, str] = field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Template:
        """Build from a lifecycle ``FsbTemplate`` object."""
        status = _object(data.get("status"))
        entrypoint = data.get("entrypoint")
        return cls(
            id=str(data.get("templateId", "")),
            image=str(data.get("image") or ""),
            publish=str(data.get("publish") or ""),
            format=str(data.get("format") or ""),
            phase=_str_or_none(status.get("phase")),
            message=_str_or_none(status.get("message")),
            manifest_ref=_str_or_none(status.get("manifestRef")),
            entrypoint=[str(e) for e in entrypoint] if isinstance(entrypoint, list) else [],
            env=_str_map(data.get("env")),
            metadata=_str_map(data.get("metadata")),
            resource_limits=_str_map(data.get("resourceLimits")),
            created_at=parse_time(data.get("createdAt")),
            updated_at=parse_time(data.get("updatedAt")),
        )


@dataclass(frozen=True)
class DiagnosticContent:
    """Diagnostic text of a sandbox (its logs or its events).

    With a ``scope``, the server's stable Diagnostics descriptor (``diagnostic-api.yml``):
    the text inline (``content``) or at ``content_url``. Without one, the released server's
    plain text, kept whole in ``content`` (``scope`` None, ``delivery`` ``inline``).

    Attributes:
        sandbox_id: the sandbox.
        kind: ``logs`` or ``events``.
        scope: the scope answered (``container``, ``lifecycle``, ``all``...), or None.
        delivery: ``inline`` or ``url``.
        content_type: the media type of the text.
        content: the text, when inline; else None.
        content_url: where to download the text, when ``delivery`` is ``url``; else None.
        content_length: bytes of the text, when known.
        expires_at: when ``content_url`` stops working, or None.
        truncated: whether the server cut the text.
        warnings: the server's remarks on the text's completeness.
    """

    sandbox_id: str
    kind: str
    scope: str | None = None
    delivery: str = "inline"
    content_type: str = "text/plain; charset=utf-8"
    content: str | None = None
    content_url: str | None = None
    content_length: int | None = None
    expires_at: datetime | None = None
    truncated: bool = False
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiagnosticContent:
        """Build from a ``DiagnosticContentResponse`` object."""
        warnings = data.get("warnings")
        return cls(
            sandbox_id=str(data.get("sandboxId", "")),
            kind=str(data.get("kind", "")),
            scope=_str_or_none(data.get("scope")),
            delivery=str(data.get("delivery") or "inline"),
            content_type=str(data.get("contentType") or ""),
            content=_str_or_none(data.get("content")),
            content_url=_str_or_none(data.get("contentUrl")),
            content_length=_int_or_none(data.get("contentLength")),
            expires_at=parse_time(data.get("expiresAt")),
            truncated=data.get("truncated") is True,
            warnings=[str(w) for w in warnings] if isinstance(warnings, list) else [],
        )


NETWORK_ACTIONS = ("allow", "deny")


@dataclass(frozen=True)
class NetworkRule:
    """One egress rule: ``allow`` or ``deny`` a host (an FQDN or ``*.`` wildcard).

    Raises:
        ConfigurationError: an action other than ``allow``/``deny``, or an empty target.
    """

    action: str
    target: str

    def __post_init__(self) -> None:
        if self.action not in NETWORK_ACTIONS:
            raise ConfigurationError(
                f"a network rule's action must be 'allow' or 'deny', got {self.action!r}"
            )
        if not isinstance(self.target, str) or not self.target.strip():
            raise ConfigurationError("a network rule's target must be a non-empty host name")

    def to_dict(self) -> dict[str, str]:
        """The wire form ``{"action", "target"}``."""
        return {"action": self.action, "target": self.target}

    @classmethod
    def of(cls, rule: NetworkRule | Any) -> NetworkRule:
        """A rule, or one built from a ``{"action", "target"}`` mapping.

        Raises:
            ConfigurationError: anything else, or a bad action or target.
        """
        if isinstance(rule, NetworkRule):
            return rule
        if not isinstance(rule, dict) or set(rule) != {"action", "target"}:
            raise ConfigurationError(
                f"a network rule is a NetworkRule or {{'action': ..., 'target': ...}}, got {rule!r}"
            )
        return cls(action=rule["action"], target=rule["target"])


@dataclass(frozen=True)
class NetworkPolicy:
    """A sandbox's egress policy: a default action and per-host rules.

    Attributes:
        default_action: ``allow`` or ``deny`` (what a host no rule names gets); None when the
            server left it out (the egress sidecar then denies).
        egress: the rules, first match wins.
        mode: the server's summary of the policy (e.g. ``deny_all``), or None.

    Raises:
        ConfigurationError: a default action other than ``allow``/``deny``/None.
    """

    default_action: str | None = "deny"
    egress: tuple[NetworkRule, ...] = ()
    mode: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.default_action not in (*NETWORK_ACTIONS, None):
            raise ConfigurationError(
                f"default_action must be 'allow', 'deny' or None, got {self.default_action!r}"
            )
        object.__setattr__(self, "egress", tuple(NetworkRule.of(r) for r in self.egress))

    def to_dict(self) -> dict[str, Any]:
        """The wire form ``{"defaultAction", "egress"}`` (the create body's and ``/policy``'s)."""
        body: dict[str, Any] = {"egress": [rule.to_dict() for rule in self.egress]}
        if self.default_action is not None:
            body["defaultAction"] = self.default_action
        return body

    @classmethod
    def from_dict(cls, data: Any) -> NetworkPolicy:
        """Build from a policy status (``{"mode", "policy": {...}}``) or a bare policy.

        Rules the server describes oddly are left out rather than refused.
        """
        data = data if isinstance(data, dict) else {}
        policy = data.get("policy") if isinstance(data.get("policy"), dict) else data
        rules = []
        for item in policy.get("egress") or ():
            try:
                rules.append(NetworkRule.of(item))
            except ConfigurationError:
                continue
        action = policy.get("defaultAction")
        return cls(
            default_action=action if action in NETWORK_ACTIONS else None,
            egress=tuple(rules),
            mode=_str_or_none(data.get("mode")),
        )
