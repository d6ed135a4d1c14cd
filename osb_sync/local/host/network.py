"""A running sandbox's network policy: the released server's `/networkpolicy` and the egress
sidecar's `/policy` (`egress-api.yaml`), one logic for both.

The local server enforces what a network namespace can: deny-all (loopback only) and
allow-all (slirp4netns, never to the host's own addresses: `firewall.py`), switched on a
running sandbox (`SandboxContainer.set_internet`).
Per-host rules are refused with the create's 400 (`bwrap.network_plan`), whatever the route.

The sidecar's API is served by the server, on the host, for the proxy route of port 18080,
behind a token only the endpoint route hands out (`OPENSANDBOX-EGRESS-AUTH`); it is never
sent into the sandbox, and nothing runs on that port inside it, so code in a sandbox can
neither reach nor change its own policy.
"""

from __future__ import annotations

from typing import Any

EGRESS_PORT = 18080
EGRESS_HEADER = "OPENSANDBOX-EGRESS-AUTH"


def normal(policy: dict[str, Any] | None) -> dict[str, Any]:
    """A policy as the routes answer it: `defaultAction` and `egress` always present.

    No policy (or an empty one) is allow-all, as the spec says of the create body.
    """
    if not policy:
        return {"defaultAction": "allow", "egress": []}
    return {
        "defaultAction": policy.get("defaultAction") or "deny",
        "egress": [dict(rule) for rule in policy.get("egress") or []],
    }


def status(policy: dict[str, Any]) -> dict[str, Any]:
    """The sidecar's `PolicyStatusResponse` for a policy."""
    policy = normal(policy)
    has_rules = any(r["action"] != policy["defaultAction"] for r in policy["egress"])
    mode = f"{policy['defaultAction']}_all" + ("_with_rules" if has_rules else "")
    return {
        "status": "ok",
        "mode": mode,
        "enforcementMode": "namespace",
        "reason": "deny-all is a private network namespace (loopback only); allow-all is "
        "slirp4netns, without this host's own addresses (nftables)",
        "policy": policy,
    }


def patched(policy: dict[str, Any], rules: list[dict[str, str]]) -> dict[str, Any]:
    """`policy` with `rules` merged by target: a rule replaces the one for its target, new
    targets are added; of two rules for one target in `rules`, the first wins."""
    policy = normal(policy)
    first: dict[str, dict[str, str]] = {}
    for rule in rules:
        first.setdefault(rule["target"], rule)
    kept = [r for r in policy["egress"] if r["target"] not in first]
    return {**policy, "egress": kept + list(first.values())}


def without(policy: dict[str, Any], targets: list[str]) -> dict[str, Any]:
    """`policy` without the rules for `targets`."""
    policy = normal(policy)
    gone = set(targets)
    return {**policy, "egress": [r for r in policy["egress"] if r["target"] not in gone]}
