"""``create_sandbox``'s options, written once: the signature, the pool and the body share them.

``CreateOptions`` lists every option and its type; ``DEFAULTS`` the value each one has when it
is not given. ``Client.create_sandbox(**options: Unpack[CreateOptions])`` is typed from the
first (type checkers and IDEs show the keywords) and gets its runtime signature (``help()``,
``inspect.signature``) from both; ``SandboxPool`` checks its keywords against them when it is
built, and :func:`build_create_body` reads them.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence, TypedDict, TypeVar, get_type_hints

from ._constants import (
    DEFAULT_ENTRYPOINT,
    DEFAULT_RESOURCE_LIMITS,
    DEFAULT_TEMPLATE,
    DEFAULT_TIMEOUT,
    NO_TIMEOUT,
    NoTimeout,
)
from ._errors import ConfigurationError

F = TypeVar("F", bound=Callable[..., Any])


class CreateOptions(TypedDict, total=False):
    """The keywords of ``Client.create_sandbox`` (documented there)."""

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
    use_server_proxy: bool
    ready_timeout: float | None
    poll_interval: float | None
    snapshot_id: str | None
    image_auth: Mapping[str, str] | None
    platform: Mapping[str, str] | None
    volumes: Sequence[Mapping[str, Any]] | None
    extensions: Mapping[str, str] | None
    health_check: bool


# An option not given has this value (None: the server's or the client's default applies).
DEFAULTS: dict[str, Any] = {name: None for name in CreateOptions.__annotations__}
DEFAULTS.update(secure_access=False, use_server_proxy=False, health_check=True)


def check_options(options: Mapping[str, Any], caller: str = "create_sandbox") -> None:
    """Raise TypeError for a keyword that is not an option, as Python does for a signature."""
    for name in options:
        if name not in DEFAULTS:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")


def option(options: Mapping[str, Any], name: str) -> Any:
    """The value of one option: the one given, else its default."""
    return options.get(name, DEFAULTS[name])


def with_option_signature(method: F) -> F:
    """Give ``method(self, **options)`` the runtime signature of its keywords."""
    hints = get_type_hints(CreateOptions)
    keywords = [
        inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=value, annotation=hints[name]
        )
        for name, value in DEFAULTS.items()
    ]
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return_type = inspect.signature(method).return_annotation
    method.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [self_parameter, *keywords], return_annotation=return_type
    )
    return method


def build_create_body(options: Mapping[str, Any], metadata: Mapping[str, str]) -> dict[str, Any]:
    """The ``POST /sandboxes`` body; deny-all network unless internet access is asked for.

    ``metadata`` is added to the option's own labels (the create-id tag).

    Raises:
        ConfigurationError: both ``template`` and ``snapshot_id``; a ``timeout`` that is not
            a positive int, None or NO_TIMEOUT.
    """
    get = {**DEFAULTS, **options}.__getitem__
    timeout = get("timeout")
    _check_lifetime(timeout)
    body: dict[str, Any] = {}
    entrypoint = get("entrypoint")
    if get("snapshot_id") is not None:
        if get("template") is not None or get("image_auth") is not None:
            raise ConfigurationError("pass either template (with image_auth) or snapshot_id")
        body["snapshotId"] = get("snapshot_id")
        if entrypoint:
            body["entrypoint"] = list(entrypoint)
    else:
        body["image"] = {"uri": get("template") or DEFAULT_TEMPLATE}
        if get("image_auth"):
            body["image"]["auth"] = dict(get("image_auth"))
        body["entrypoint"] = list(entrypoint or DEFAULT_ENTRYPOINT)
    body["timeout"] = None if timeout is NO_TIMEOUT else (timeout or DEFAULT_TIMEOUT)
    body["resourceLimits"] = dict(get("resource_limits") or DEFAULT_RESOURCE_LIMITS)
    labels = {**(get("metadata") or {}), **metadata}
    if labels:
        body["metadata"] = labels
    for name, key in (("env_vars", "env"), ("resource_requests", "resourceRequests")):
        if get(name):
            body[key] = dict(get(name))
    if get("network_policy") is not None:
        body["networkPolicy"] = dict(get("network_policy"))
    elif get("allow_internet_access") is not True:
        body["networkPolicy"] = {"defaultAction": "deny", "egress": []}
    if get("secure_access"):
        body["secureAccess"] = True
    if get("platform"):
        body["platform"] = dict(get("platform"))
    if get("volumes"):
        body["volumes"] = [dict(volume) for volume in get("volumes")]
    if get("extensions"):
        body["extensions"] = dict(get("extensions"))
    return body


def lifetime_seconds(options: Mapping[str, Any]) -> float | None:
    """The sandbox lifetime the options ask for, in seconds; None for ``NO_TIMEOUT``."""
    timeout = options.get("timeout")
    return None if timeout is NO_TIMEOUT else float(timeout or DEFAULT_TIMEOUT)


def _check_lifetime(timeout: object) -> None:
    if timeout is None or timeout is NO_TIMEOUT:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise ConfigurationError(
            f"timeout (the sandbox lifetime) must be a positive int of seconds, got {timeout!r}: "
            f"None for the default ({DEFAULT_TIMEOUT} s), osb_sync.NO_TIMEOUT for no expiry"
        )
