"""The keyword options of the public calls, each declared once.

- ``BodyOptions``: what ``create_sandbox`` sends in the ``POST /sandboxes`` body
  (:func:`build_create_body` reads only these).
- ``ReachOptions``: the client's own settings for reaching a sandbox's execd and waiting for
  it (``create_sandbox``, ``connect``), built once into a frozen :class:`Reach`; they never
  reach the body builder.
- ``CreateOptions``: both, the keywords of ``create_sandbox`` (and ``SandboxPool``).
- ``RunOptions``: the keywords of a code run (``Client.run_code``/``stream_code``);
  ``CodeRunOptions`` adds a ``context`` (``Sandbox.run_code``/``stream_code``,
  ``osb_sync.run_code``).

Each TypedDict types its keywords (``**options: Unpack[RunOptions]``: type checkers and IDEs
show them); its ``*_DEFAULTS`` mapping holds the value of each keyword not given, and
:func:`with_keywords` builds from both the runtime signature (``help()``,
``inspect.signature``, the docs). :func:`check_options` refuses a keyword that is not one,
as Python does for a signature.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypedDict, TypeVar, get_type_hints

from ._constants import (
    DEFAULT_ENTRYPOINT,
    DEFAULT_LANGUAGE,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_READY_TIMEOUT,
    DEFAULT_RESOURCE_LIMITS,
    DEFAULT_TEMPLATE,
    DEFAULT_TIMEOUT,
    MAX_OUTPUT_BYTES,
    NO_TIMEOUT,
    NoTimeout,
)
from ._errors import ConfigurationError
from ._models import CodeContext, Event
from ._validators import non_empty, seconds, whole

F = TypeVar("F", bound=Callable[..., Any])


class BodyOptions(TypedDict, total=False):
    """The keywords of ``Client.create_sandbox`` that go into the request body."""

    template: str | None
    timeout: int | NoTimeout | None
    allow_internet_access: bool | None
    metadata: Mapping[str, str] | None
    env_vars: Mapping[str, str] | None
    resource_limits: Mapping[str, str] | None
    resource_requests: Mapping[str, str] | None
    entrypoint: Sequence[str] | None
    network_policy: Mapping[str, Any] | None
    secure_access: bool
    snapshot_id: str | None
    image_auth: Mapping[str, str] | None
    platform: Mapping[str, str] | None
    volumes: Sequence[Mapping[str, Any]] | None
    extensions: Mapping[str, str] | None
    lifecycle: Mapping[str, Any] | None
    credential_proxy: bool
    pool: str | None
    template_id: str | None


class ReachOptions(TypedDict, total=False):
    """The keywords of ``Client.connect``: how execd is reached and waited for."""

    use_server_proxy: bool
    ready_timeout: float | None
    poll_interval: float | None
    health_check: bool


class CreateOptions(BodyOptions, ReachOptions, total=False):
    """The keywords of ``Client.create_sandbox`` (documented there)."""


class RunOptions(TypedDict, total=False):
    """The keywords of ``Client.run_code`` and ``Client.stream_code`` (documented there)."""

    language: str
    max_output_bytes: int
    timeout: float | None
    on_event: Callable[[Event], object] | None


class CodeRunOptions(RunOptions, total=False):
    """The keywords of ``Sandbox.run_code`` and ``Sandbox.stream_code``: a run's, and its
    context."""

    context: CodeContext | str | None


@dataclass(frozen=True)
class Reach:
    """How the client reaches a sandbox's execd, and how long it waits, checked once.

    Attributes:
        use_server_proxy: route execd calls through the server's proxy.
        ready_timeout: seconds for each wait (Running, endpoint, ping).
        poll_interval: seconds between two polls.
        health_check: wait until execd answers ``/ping``.

    Raises:
        ConfigurationError: a negative or non-numeric wait.
    """

    use_server_proxy: bool = False
    ready_timeout: float = DEFAULT_READY_TIMEOUT
    poll_interval: float = DEFAULT_POLL_INTERVAL
    health_check: bool = True

    def __post_init__(self) -> None:
        for name in ("ready_timeout", "poll_interval"):
            object.__setattr__(self, name, seconds(name, getattr(self, name)))  # frozen: once

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> Reach:
        """The Reach that keywords ask for; other keywords are ignored.

        A ``ready_timeout`` or ``poll_interval`` of None is the default.

        Raises:
            ConfigurationError: a negative or non-numeric wait.
        """
        given = {name: options[name] for name in REACH_DEFAULTS if name in options}
        for name in ("ready_timeout", "poll_interval"):
            if name in given and given[name] is None:
                del given[name]
        return cls(**given)


DEFAULT_REACH = Reach()

# A keyword not given has this value (None: the server's or the client's default applies).
BODY_DEFAULTS: dict[str, Any] = {name: None for name in BodyOptions.__annotations__}
BODY_DEFAULTS.update(secure_access=False, credential_proxy=False)
# What the released server rejects beside a templateId: the template fixes the workload.
TEMPLATE_FIXED = (
    "template", "image_auth", "snapshot_id", "pool", "entrypoint", "env_vars",
    "resource_limits", "resource_requests", "volumes", "platform", "lifecycle",
)  # fmt: skip
REACH_DEFAULTS: dict[str, Any] = {
    "use_server_proxy": DEFAULT_REACH.use_server_proxy,
    "ready_timeout": None,
    "poll_interval": None,
    "health_check": DEFAULT_REACH.health_check,
}
CREATE_DEFAULTS: dict[str, Any] = {**BODY_DEFAULTS, **REACH_DEFAULTS}
RUN_DEFAULTS: dict[str, Any] = {
    "language": DEFAULT_LANGUAGE,
    "max_output_bytes": MAX_OUTPUT_BYTES,
    "timeout": None,
    "on_event": None,
}
# ``context`` second, where Sandbox's signature has always shown it.
CODE_RUN_DEFAULTS: dict[str, Any] = {"language": DEFAULT_LANGUAGE, "context": None}
CODE_RUN_DEFAULTS.update(RUN_DEFAULTS)


def check_options(
    options: Mapping[str, Any],
    caller: str = "create_sandbox",
    defaults: Mapping[str, Any] = CREATE_DEFAULTS,
) -> None:
    """Raise TypeError for a keyword that is not an option, as Python does for a signature."""
    for name in options:
        if name not in defaults:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")


def split_create_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], Reach]:
    """``create_sandbox``'s keywords split into the body's and the client's own (a Reach).

    Raises:
        ConfigurationError: a bad wait setting.
    """
    body = {name: value for name, value in options.items() if name in BODY_DEFAULTS}
    return body, Reach.of(options)


def with_keywords(options: type, defaults: Mapping[str, Any]) -> Callable[[F], F]:
    """Give a function taking ``**options`` the runtime signature of those keywords.

    Its own parameters come first, then one keyword-only parameter per entry of
    ``defaults``, annotated from the TypedDict ``options``.
    """
    hints = get_type_hints(options)

    def decorate(function: F) -> F:
        signature = inspect.signature(function)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        keywords = [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=value, annotation=hints[name]
            )
            for name, value in defaults.items()
        ]
        function.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*own, *keywords]
        )
        return function

    return decorate


def build_create_body(options: Mapping[str, Any], metadata: Mapping[str, str]) -> dict[str, Any]:
    """The ``POST /sandboxes`` body; deny-all network unless internet access is asked for.

    ``metadata`` is added to the option's own labels (the create-id tag). A sandbox comes
    from one source: an image (``template``), a ``snapshot_id``, a ``template_id`` (whose
    template fixes the workload: no entrypoint, env, resources, volumes, platform, hooks or
    secure access beside it) or a ``pool`` (``extensions.poolRef``; the pool's sandboxes are
    made in advance, so no network policy is sent, not even the default deny-all, nor volumes
    or a platform).

    Raises:
        ConfigurationError: two sources; a field the source does not take; a ``timeout``
            that is not a positive int, None or NO_TIMEOUT (a template needs one).
    """
    unknown = set(options) - set(BODY_DEFAULTS)
    if unknown:  # the client's own settings (a Reach) never go into the body
        raise TypeError(f"not request body options: {sorted(unknown)}")
    get = {**BODY_DEFAULTS, **options}.__getitem__
    timeout = get("timeout")
    _check_lifetime(timeout)
    sources = [n for n in ("snapshot_id", "template_id", "pool") if get(n) is not None]
    if len(sources) > 1:
        raise ConfigurationError(f"pass one of snapshot_id, template_id and pool, not {sources}")
    body: dict[str, Any] = {}
    entrypoint = get("entrypoint")
    if get("template_id") is not None:
        given = [n for n in TEMPLATE_FIXED if get(n)]
        given += [n for n in ("secure_access", "credential_proxy") if get(n)]
        if given:
            raise ConfigurationError(
                f"a sandbox from template_id takes its workload from the template: drop {given}"
            )
        if timeout is NO_TIMEOUT:
            raise ConfigurationError("a sandbox from template_id needs a timeout (its lifetime)")
        body["templateId"] = non_empty("template_id", get("template_id"))
    elif get("snapshot_id") is not None:
        if get("template") is not None or get("image_auth") is not None:
            raise ConfigurationError("pass either template (with image_auth) or snapshot_id")
        body["snapshotId"] = non_empty("snapshot_id", get("snapshot_id"))
        if entrypoint:
            body["entrypoint"] = list(entrypoint)
    else:
        body["image"] = {"uri": get("template") or DEFAULT_TEMPLATE}
        if get("image_auth"):
            body["image"]["auth"] = dict(get("image_auth"))
        body["entrypoint"] = list(entrypoint or DEFAULT_ENTRYPOINT)
    body["timeout"] = None if timeout is NO_TIMEOUT else (timeout or DEFAULT_TIMEOUT)
    # a pool's or a template's sandboxes have their resources already
    if get("resource_limits") or sources in ([], ["snapshot_id"]):
        body["resourceLimits"] = dict(get("resource_limits") or DEFAULT_RESOURCE_LIMITS)
    labels = {**(get("metadata") or {}), **metadata}
    if labels:
        body["metadata"] = labels
    for name, key in (("env_vars", "env"), ("resource_requests", "resourceRequests")):
        if get(name):
            body[key] = dict(get(name))
    if get("pool") is not None:
        given = [n for n in ("network_policy", "volumes", "platform") if get(n) not in (None, [])]
        if given:  # the released server refuses them (400)
            raise ConfigurationError(
                "a sandbox from a pool has the pool's network, volumes and platform (its "
                f"sandboxes exist already): drop {', '.join(given)} (change the network later "
                "with sandbox.network_policy)"
            )
    elif get("network_policy") is not None:
        body["networkPolicy"] = dict(get("network_policy"))
    elif get("allow_internet_access") is not True:
        body["networkPolicy"] = {"defaultAction": "deny", "egress": []}
    if get("secure_access"):
        body["secureAccess"] = True
    if get("credential_proxy"):
        body["credentialProxy"] = {"enabled": True}
    if get("lifecycle"):
        body["lifecycle"] = dict(get("lifecycle"))
    if get("platform"):
        body["platform"] = dict(get("platform"))
    if get("volumes"):
        body["volumes"] = [dict(volume) for volume in get("volumes")]
    extensions = dict(get("extensions") or {})
    if get("pool") is not None:
        pool = non_empty("pool", get("pool"))
        if extensions.get("poolRef", pool) != pool:
            raise ConfigurationError("pool and extensions['poolRef'] name different pools")
        extensions["poolRef"] = pool
    if extensions:
        body["extensions"] = extensions
    return body


def lifetime_seconds(options: Mapping[str, Any]) -> float | None:
    """The sandbox lifetime the options ask for, in seconds; None for ``NO_TIMEOUT``."""
    timeout = options.get("timeout")
    return None if timeout is NO_TIMEOUT else float(timeout or DEFAULT_TIMEOUT)


def _check_lifetime(timeout: object) -> None:
    if timeout is None or timeout is NO_TIMEOUT:
        return
    whole(
        "timeout (the sandbox lifetime)",
        timeout,
        1,
        what="a positive int of seconds",
        fix=f"None for the default ({DEFAULT_TIMEOUT} s), osb_sync.NO_TIMEOUT for no expiry",
    )
