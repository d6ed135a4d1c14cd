"""The ``POST /sandboxes`` body built from ``create_sandbox``'s options."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ._constants import (
    DEFAULT_ENTRYPOINT,
    DEFAULT_RESOURCE_LIMITS,
    DEFAULT_TEMPLATE,
    DEFAULT_TIMEOUT,
    NO_TIMEOUT,
    _NoTimeout,
)
from ._errors import ConfigurationError


def build_create_body(
    *,
    template: str | None = None,
    timeout: int | _NoTimeout | None = None,
    allow_internet_access: bool | None = None,
    metadata: Mapping[str, str] | None = None,
    env_vars: Mapping[str, str] | None = None,
    resource_limits: Mapping[str, str] | None = None,
    resource_requests: Mapping[str, str] | None = None,
    entrypoint: Sequence[str] | None = None,
    network_policy: Mapping[str, Any] | None = None,
    secure_access: bool = False,
    snapshot_id: str | None = None,
    image_auth: Mapping[str, str] | None = None,
    platform: Mapping[str, str] | None = None,
    volumes: Sequence[Mapping[str, Any]] | None = None,
    extensions: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``POST /sandboxes`` body; deny-all network unless internet access is asked for.

    Raises:
        ConfigurationError: both ``template`` and ``snapshot_id``; a ``timeout`` that is not
            a positive int, None or NO_TIMEOUT.
    """
    _check_lifetime(timeout)
    body: dict[str, Any] = {}
    if snapshot_id is not None:
        if template is not None or image_auth is not None:
            raise ConfigurationError("pass either template (with image_auth) or snapshot_id")
        body["snapshotId"] = snapshot_id
        if entrypoint:
            body["entrypoint"] = list(entrypoint)
    else:
        body["image"] = {"uri": template or DEFAULT_TEMPLATE}
        if image_auth:
            body["image"]["auth"] = dict(image_auth)
        body["entrypoint"] = list(entrypoint or DEFAULT_ENTRYPOINT)
    body["timeout"] = None if timeout is NO_TIMEOUT else (timeout or DEFAULT_TIMEOUT)
    body["resourceLimits"] = dict(resource_limits or DEFAULT_RESOURCE_LIMITS)
    if metadata:
        body["metadata"] = dict(metadata)
    if env_vars:
        body["env"] = dict(env_vars)
    if resource_requests:
        body["resourceRequests"] = dict(resource_requests)
    if network_policy is not None:
        body["networkPolicy"] = dict(network_policy)
    elif allow_internet_access is not True:
        body["networkPolicy"] = {"defaultAction": "deny", "egress": []}
    if secure_access:
        body["secureAccess"] = True
    if platform:
        body["platform"] = dict(platform)
    if volumes:
        body["volumes"] = [dict(volume) for volume in volumes]
    if extensions:
        body["extensions"] = dict(extensions)
    return body


def _check_lifetime(timeout: object) -> None:
    if timeout is None or timeout is NO_TIMEOUT:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise ConfigurationError(
            f"timeout (the sandbox lifetime) must be a positive int of seconds, got {timeout!r}: "
            f"None for the default ({DEFAULT_TIMEOUT} s), osb_sync.NO_TIMEOUT for no expiry"
        )
