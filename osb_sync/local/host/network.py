"""A sandbox's network policy: what it asks of the server, and the routes that change it on a
running sandbox, the released server's `/networkpolicy` and the egress sidecar's `/policy`
(`egress-api.yaml`), one logic for both.

The local server enforces deny-all (a network namespace with loopback only), allow-all
(slirp4netns, never to the host's own addresses: `firewall.py`) and rules by name (the
server's resolver and the namespace's sets of the addresses it handed out: `egress.py`),
switched on a running sandbox (`SandboxContainer.set_internet`). A target that is no host
name (an IP or a CIDR among them) is refused (400) on every route, as a create refuses it.

The sidecar's API is served by the server, on the host, for the proxy route of port 18080,
behind a token only the endpoint route hands out (`OPENSANDBOX-EGRESS-AUTH`); it is never
sent into the sandbox, and nothing runs on that port inside it, so code in a sandbox can
neither reach nor change its own policy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..http.exchange import Exchange, HttpError, error
from .bwrap import network_plan
from .egress import Rules, TargetError
from .errors import PolicyError
from .sandboxes import Config, LocalSandbox, Sandboxes
from .validation import check_network_policy, check_rules, check_targets, read_json


def needs(policy: dict[str, Any] | None) -> str:
    """What a network policy asks of us: "nothing", "deny-all" or "rules" (per-host egress)."""
    if not policy:
        return "nothing"  # the spec: an empty object or null means allow-all
    default = policy.get("defaultAction") or "deny"
    exceptions = [r for r in policy.get("egress") or [] if r.get("action") != default]
    if exceptions:
        return "rules"
    return "deny-all" if default == "deny" else "nothing"


def rules(policy: dict[str, Any] | None) -> Rules | None:
    """The compiled rules of a policy with rules (`needs` "rules"), else None.

    Raises:
        PolicyError: a target is refused (`egress.check_target`).
    """
    if needs(policy) != "rules":
        return None
    assert policy is not None
    try:
        return Rules.of(normal(policy))
    except TargetError as exc:
        raise PolicyError(f"networkPolicy.egress: {exc}.") from None


def plan(policy: dict[str, Any] | None, config: Config) -> tuple[bool, str]:
    """(give the sandbox outbound access?, status note) for `policy` on this server.

    Raises:
        PolicyError: a target is refused (`rules`).
        The errors of `bwrap.network_plan`.
    """
    rules(policy)
    return network_plan(needs(policy), config.support, config.accept_unenforced)


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
        "enforcementMode": "dns+nft" if has_rules else "namespace",
        "reason": "deny-all is a private network namespace (loopback only); allow-all is "
        "slirp4netns, without this host's own addresses (nftables); rules are the server's "
        "resolver and sets of the addresses it handed out (nftables)",
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


class NetworkPolicy:
    """The handlers of a running sandbox's network policy routes (one change at a time)."""

    def __init__(self, sandboxes: Sandboxes) -> None:
        self.sandboxes = sandboxes
        self._lock = threading.Lock()  # two PATCHes never lose one another's rules

    def _apply(
        self, sandbox: LocalSandbox, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Enforce `change(current policy)` on a running sandbox; the create's refusal for what
        cannot be."""
        with self._lock:
            policy = normal(change(sandbox.policy))
            internet, note = plan(policy, self.sandboxes.config)
            try:
                sandbox.container.set_internet(internet, rules(policy))
            except ProcessLookupError as exc:
                message = f"Sandbox {sandbox.id}'s network cannot change: {exc}."
                raise error(409, "DOCKER::SANDBOX_NOT_RUNNING", message) from None
            except (OSError, RuntimeError) as exc:
                raise error(
                    500, "DOCKER::NETWORK_POLICY_FAILED", f"The network could not change: {exc}"
                ) from None
            sandbox.policy = policy
        answer = status(policy)
        self.sandboxes.journal.record(sandbox.id, f"network policy changed: {answer['mode']}{note}")
        return answer

    def get(self, ex: Exchange) -> None:
        """GET /sandboxes/{id}/networkpolicy: the policy it runs under (PolicyStatusResponse)."""
        ex.send_json(200, status(self.sandboxes.get(ex.params["id"]).policy))

    def put(self, ex: Exchange) -> None:
        """PUT /sandboxes/{id}/networkpolicy: replace the policy of the running sandbox."""
        policy = check_network_policy(read_json(ex))
        sandbox = self.sandboxes.get(ex.params["id"])
        ex.send_json(200, self._apply(sandbox, lambda _: policy))

    def patch(self, ex: Exchange) -> None:
        """PATCH /sandboxes/{id}/networkpolicy: merge rules by target."""
        rules = check_rules(read_json(ex))
        sandbox = self.sandboxes.get(ex.params["id"])
        ex.send_json(200, self._apply(sandbox, lambda now: patched(now, rules)))

    def delete(self, ex: Exchange) -> None:
        """DELETE /sandboxes/{id}/networkpolicy: remove the rules of these targets."""
        targets = check_targets(read_json(ex))
        sandbox = self.sandboxes.get(ex.params["id"])
        ex.send_json(200, self._apply(sandbox, lambda now: without(now, targets)))

    def egress(self, ex: Exchange, sandbox: LocalSandbox, rest: str) -> None:
        """The egress sidecar's `/policy` for the proxy route of port 18080 (already checked
        to carry the sandbox's egress token): GET, PATCH (merge rules), DELETE (targets)."""
        if rest.rstrip("/") != "/policy":
            raise error(404, "EGRESS::NOT_FOUND", f"The egress API has no {rest[:100]!r}.")
        if ex.method == "GET":
            ex.send_json(200, status(sandbox.policy))
        elif ex.method == "PATCH":
            rules = check_rules(read_json(ex))
            ex.send_json(200, self._apply(sandbox, lambda now: patched(now, rules)))
        elif ex.method == "DELETE":
            targets = check_targets(read_json(ex))
            ex.send_json(200, self._apply(sandbox, lambda now: without(now, targets)))
        else:
            raise HttpError(405, {"detail": "Method Not Allowed"})
