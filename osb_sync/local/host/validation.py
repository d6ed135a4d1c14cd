"""Request validation for the lifecycle API, answering like the real (FastAPI) server.

Shape errors are FastAPI's 422 `{"detail": [{"type", "loc", "msg", "input"}]}` (pydantic v2
wording); rule errors the server checks itself (metadata labels, network policy) are 400
`{"code", "message"}`.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

from ..http.exchange import Exchange, HttpError, error

RESERVED_PREFIX = "opensandbox.io/"
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?", re.IGNORECASE)
ACTIONS = ("allow", "deny")
ECHO_LIMIT = 1024  # a 422 repeats the offending input only up to this size


Detail = dict[str, Any]


def issue(kind: str, loc: list[Any], msg: str, value: Any) -> Detail:
    """One pydantic-style error entry; a large `value` is summarised, not echoed."""
    return {"type": kind, "loc": loc, "msg": msg, "input": _echo(value)}


def _echo(value: Any) -> Any:
    """`value`, or a short description when its JSON is larger than ECHO_LIMIT."""
    try:
        size = len(json.dumps(value))
    except (TypeError, ValueError, RecursionError):
        return "<input omitted>"
    if size <= ECHO_LIMIT:
        return value
    return f"<{type(value).__name__} input of {size} bytes omitted>"


def bad_parameter(message: str) -> HttpError:
    """The real server's 400 for a value its configuration refuses."""
    return error(400, "SANDBOX::INVALID_PARAMETER", message)


def unprocessable(details: list[Detail]) -> HttpError:
    """FastAPI's 422 answer."""
    return HttpError(422, {"detail": details})


def unprocessable_body(expected: str, value: Any) -> HttpError:
    """FastAPI's 422 for a body that is not what a route takes."""
    return HttpError(
        422,
        {"detail": [{"type": "value_error", "loc": ["body"], "msg": f"expected {expected}",
                     "input": value if len(repr(value)) < 1024 else "<omitted>"}]},
    )  # fmt: skip


def invalid_json(message: str) -> HttpError:
    """FastAPI's 422 for a body that is not JSON."""
    return unprocessable(
        [issue("json_invalid", ["body", 0], "JSON decode error", {}) | {"ctx": {"error": message}}]
    )


def read_json(ex: Exchange) -> Any:
    """The JSON body of a lifecycle request; FastAPI's 422 when it is not JSON."""
    try:
        return ex.json_body()
    except ValueError as exc:
        raise invalid_json(str(exc)) from None


def _string_map(body: dict[str, Any], name: str, nullable_values: bool = False) -> list[Detail]:
    value = body.get(name)
    if not isinstance(value, dict):
        return [issue("dict_type", ["body", name], "Input should be a valid dictionary", value)]
    return [
        issue("string_type", ["body", name, key], "Input should be a valid string", item)
        for key, item in value.items()
        if not isinstance(item, str) and not (nullable_values and item is None)
    ]


def _image(value: Any) -> list[Detail]:
    if not isinstance(value, dict):
        return [
            issue(
                "model_attributes_type",
                ["body", "image"],
                "Input should be a valid dictionary or object to extract fields from",
                value,
            )
        ]
    if "uri" not in value:
        return [issue("missing", ["body", "image", "uri"], "Field required", value)]
    if not isinstance(value["uri"], str) or not value["uri"]:
        return [
            issue(
                "string_type",
                ["body", "image", "uri"],
                "Input should be a valid string",
                value["uri"],
            )
        ]
    return []


def _network_policy(value: Any) -> list[Detail]:
    loc: list[Any] = ["body", "networkPolicy"]
    if not isinstance(value, dict):
        return [
            issue(
                "model_attributes_type",
                loc,
                "Input should be a valid dictionary or object to extract fields from",
                value,
            )
        ]
    found: list[Detail] = []
    if value.get("defaultAction") not in (None, *ACTIONS):
        found.append(
            issue(
                "literal_error",
                [*loc, "defaultAction"],
                "Input should be 'allow' or 'deny'",
                value["defaultAction"],
            )
        )
    rules = value.get("egress") or []
    if not isinstance(rules, list):
        return [*found, issue("list_type", [*loc, "egress"], "Input should be a valid list", rules)]
    for index, rule in enumerate(rules):
        if (
            not isinstance(rule, dict)
            or rule.get("action") not in ACTIONS
            or not isinstance(rule.get("target"), str)
        ):
            found.append(
                issue(
                    "value_error",
                    [*loc, "egress", index],
                    "Value error, a rule needs action allow|deny and a target",
                    rule,
                )
            )
    return found


def _timeout(value: Any, minimum: int) -> list[Detail]:
    if value is None:
        return []
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not value.is_integer())
    ):
        return [issue("int_type", ["body", "timeout"], "Input should be a valid integer", value)]
    if value < minimum:
        return [
            issue(
                "greater_than_equal",
                ["body", "timeout"],
                f"Input should be greater than or equal to {minimum}",
                value,
            )
            | {"ctx": {"ge": minimum}}
        ]
    return []


def check_create(body: Any, min_timeout: int, max_timeout: int) -> None:
    """Raise the real server's 422 for a malformed CreateSandboxRequest, 400 for a refused one.

    Everything is checked here, before the sandbox gets a directory or a process.
    """
    if not isinstance(body, dict):
        raise unprocessable(
            [
                issue(
                    "model_attributes_type",
                    ["body"],
                    "Input should be a valid dictionary or object to extract fields from",
                    body,
                )
            ]
        )
    found: list[Detail] = []
    if body.get("image") is not None:
        found += _image(body["image"])
    snapshot = body.get("snapshotId")
    if snapshot is not None and not isinstance(snapshot, str):
        found.append(
            issue("string_type", ["body", "snapshotId"], "Input should be a valid string", snapshot)
        )
    entrypoint = body.get("entrypoint")
    if entrypoint is not None:
        if not isinstance(entrypoint, list) or not all(isinstance(a, str) for a in entrypoint):
            found.append(
                issue(
                    "list_type",
                    ["body", "entrypoint"],
                    "Input should be a valid list of strings",
                    entrypoint,
                )
            )
        elif not entrypoint:
            found.append(
                issue(
                    "too_short",
                    ["body", "entrypoint"],
                    "List should have at least 1 item after validation, not 0",
                    [],
                )
            )
    found += _timeout(body.get("timeout"), min_timeout)
    if "resourceLimits" not in body:
        found.append(issue("missing", ["body", "resourceLimits"], "Field required", body))
    else:
        found += _string_map(body, "resourceLimits")
    for name, nullable in (("env", True), ("metadata", False), ("extensions", False)):
        if body.get(name) is not None:
            found += _string_map(body, name, nullable)
    if body.get("networkPolicy") is not None:
        found += _network_policy(body["networkPolicy"])
    if not found:
        has_image, has_snapshot = body.get("image") is not None, snapshot is not None
        if has_image == has_snapshot:
            found.append(
                issue(
                    "value_error",
                    ["body"],
                    "Value error, exactly one of 'image' or 'snapshotId' must be provided",
                    body,
                )
            )
        elif has_image and not entrypoint:
            found.append(
                issue(
                    "value_error",
                    ["body"],
                    "Value error, 'entrypoint' is required when 'image' is provided",
                    body,
                )
            )
    if found:
        raise unprocessable(found)
    timeout = body.get("timeout")
    if timeout is not None and timeout > max_timeout:
        raise bad_parameter(
            f"timeout {timeout:.0f} exceeds the maximum of {max_timeout} seconds "
            "(omit it for a sandbox that does not expire)"
        )
    for key, value in (body.get("env") or {}).items():
        if not key or "=" in key or "\0" in key or "\0" in (value or ""):
            raise bad_parameter(f"env name {key[:100]!r} or its value is not a valid variable")
    if any("\0" in argument for argument in body.get("entrypoint") or ()):
        raise bad_parameter("entrypoint: an argument holds a NUL byte, which no argv can")


def check_sandbox(body: Any, min_timeout: int, max_timeout: int) -> dict[str, Any]:
    """A create's body (its pool's template and its snapshot's fields in it), checked whole:
    `check_create`, then its metadata's labels (`check_labels`); the body."""
    check_create(body, min_timeout, max_timeout)
    check_labels(body.get("metadata") or {})
    checked: dict[str, Any] = body
    return checked


def check_network_policy(value: Any) -> dict[str, Any]:
    """A NetworkPolicy body (PUT /networkpolicy); FastAPI's 422 when malformed."""
    found = _network_policy(value)
    if found:
        raise unprocessable(found)
    return dict(value)


def check_rules(rules: Any) -> list[dict[str, str]]:
    """A non-empty list of NetworkRule (PATCH /networkpolicy, PATCH /policy); 422 otherwise."""
    if not isinstance(rules, list) or not rules:
        raise unprocessable(
            [issue("list_type", ["body"], "Input should be a non-empty list of rules", rules)]
        )
    found = _network_policy({"egress": rules})
    if found:
        raise unprocessable([{**d, "loc": ["body", *d["loc"][3:]]} for d in found])
    return [{"action": r["action"], "target": r["target"]} for r in rules]


def check_targets(targets: Any) -> list[str]:
    """A non-empty list of host names (DELETE /networkpolicy, DELETE /policy); 422 otherwise."""
    if (
        not isinstance(targets, list)
        or not targets
        or not all(isinstance(t, str) and t for t in targets)
    ):
        raise unprocessable(
            [issue("list_type", ["body"], "Input should be a non-empty list of strings", targets)]
        )
    return list(targets)


def check_labels(metadata: dict[str, Any]) -> None:
    """Raise 400 SANDBOX::INVALID_METADATA_LABEL unless keys and values are Kubernetes labels."""
    for key, value in metadata.items():
        prefix, _, name = key.rpartition("/")
        if key.startswith(RESERVED_PREFIX):
            problem = f"metadata key {key!r} uses the reserved prefix {RESERVED_PREFIX!r}"
        elif (
            len(name) > 63
            or not LABEL_NAME.fullmatch(name)
            or (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.fullmatch(prefix)))
        ):
            problem = f"metadata key {key!r} is not a valid label key"
        elif value is not None and (len(value) > 63 or not LABEL_VALUE.fullmatch(value)):
            problem = (
                f"metadata value {value!r} of {key!r} is not a valid label value "
                "(at most 63 characters, alphanumerics with '-', '_', '.' inside)"
            )
        else:
            continue
        raise error(400, "SANDBOX::INVALID_METADATA_LABEL", problem)


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp as an aware datetime (naive means UTC), or None if malformed."""
    found = RFC3339.fullmatch(value) if isinstance(value, str) else None
    if not found:
        return None
    base, fraction, zone = found.groups()
    # fromisoformat on 3.10 takes neither "Z" nor fractions other than 3 or 6 digits.
    text = base + (fraction or ".0")[:7].ljust(7, "0")
    try:
        moment = datetime.fromisoformat(text)
        if zone and zone.upper() != "Z":
            moment = datetime.fromisoformat(text + zone)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def query_int(raw: str | None, name: str, default: int, low: int, high: int | None) -> int:
    """A bounded integer query parameter, with FastAPI's 422 when it is not."""
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise unprocessable(
            [
                issue(
                    "int_parsing",
                    ["query", name],
                    "Input should be a valid integer, unable to parse string as an integer",
                    raw,
                )
            ]
        ) from None
    if value < low:
        raise unprocessable(
            [
                issue(
                    "greater_than_equal",
                    ["query", name],
                    f"Input should be greater than or equal to {low}",
                    raw,
                )
            ]
        )
    if high is not None and value > high:
        raise unprocessable(
            [
                issue(
                    "less_than_equal",
                    ["query", name],
                    f"Input should be less than or equal to {high}",
                    raw,
                )
            ]
        )
    return value


def check_renewal(body: Any) -> datetime:
    """The new expiry of a RenewSandboxExpirationRequest; the real server's 422 if malformed."""
    if not isinstance(body, dict) or "expiresAt" not in body:
        raise unprocessable([issue("missing", ["body", "expiresAt"], "Field required", body)])
    extra = [
        issue("extra_forbidden", ["body", k], "Extra inputs are not permitted", v)
        for k, v in body.items()
        if k != "expiresAt"
    ]
    moment = parse_time(body["expiresAt"])
    if moment is None:
        extra.append(
            issue(
                "datetime_from_date_parsing",
                ["body", "expiresAt"],
                "Input should be a valid datetime",
                body["expiresAt"],
            )
        )
    if extra or moment is None:
        raise unprocessable(extra)
    return moment


def check_patch(patch: Any) -> None:
    """The real server's 422 unless a metadata patch maps names to strings or null."""
    if not isinstance(patch, dict):
        raise unprocessable(
            [issue("dict_type", ["body"], "Input should be a valid dictionary", patch)]
        )
    wrong = [
        issue("string_type", ["body", k], "Input should be a valid string", v)
        for k, v in patch.items()
        if v is not None and not isinstance(v, str)
    ]
    if wrong:
        raise unprocessable(wrong)
