"""Each server's one route table, checked against its spec (copies in ``tests/data/specs/``).

execd's table (``ExecdApp.routes``, ``osb_sync/local/execd/router.py``) against
``execd-api.yaml`` (June's) followed by ``EXECD_RELEASED``, the routes the released execd (1.1.1)
added, transcribed by hand from ``shared/reference/opensandbox-1.1.1.md`` sections 1-5 (no execd
spec of the release could be read); the lifecycle server's (``LocalServer.routes``,
``osb_sync/local/host/server.py``) against the released server's
``opensandbox-server-1.1.1-openapi.json``, where each route appears with and without ``/v1``
(one route here, as our server serves both too). Path parameters compare by position, not
name (``{context_id}`` is ``{id}``).

For each server: every route of the table is in the spec or in its ``OURS_ONLY`` (with why);
every route of the spec is in the table or in its ``NOT_SERVED``, exactly, so a route served
later, or a new upstream one, fails until the list says so; and the table keeps the spec's
order. A route is served when it is in the table, even where it answers "not supported".

The routes not served yet are printed by the passing test, so they show in the report of
``python -m pytest -q tests/unit/test_route_tables.py -rA`` (``-rP``: passes with their
output). Printed rather than warned: the gap is known and listed, not a fault, so it should not
be a warning in every run (nor an error under ``-W error``), and an xfail test would only show
its fixed reason, not the list the spec gives.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path

import pytest

from osb_sync.local.execd.router import ExecdApp
from osb_sync.local.execd.runner import SandboxRuntime
from osb_sync.local.host.bwrap import Support
from osb_sync.local.host.registry import Registry
from osb_sync.local.host.sandboxes import Config
from osb_sync.local.host.server import LocalServer
from osb_sync.local.http.exchange import Router

SPECS = Path(__file__).resolve().parents[1] / "data" / "specs"
EXECD_SPEC = SPECS / "execd-api.yaml"
LIFECYCLE_SPEC = SPECS / "opensandbox-server-1.1.1-openapi.json"
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}

Route = tuple[str, str]  # (method, path with every parameter written {})

# Transcribed, not read from a spec file: (method, path as the reference writes it, where).
_AS_USER = "/v1/filesystem/{uid}/{gid}"
EXECD_RELEASED: list[tuple[str, str, str]] = [
    *(
        (method, _AS_USER + path, "1.1.1, #2070: reference 4.1")
        for method, path in (
            ("GET", "/files/info"),
            ("DELETE", "/files"),
            ("POST", "/files/permissions"),  # the plain routes' order (June's spec)
            ("POST", "/files/mv"),
            ("GET", "/files/search"),
            ("POST", "/files/replace"),
            ("POST", "/files/upload"),
            ("GET", "/files/download"),
            ("GET", "/directories/list"),
            ("POST", "/directories"),
            ("DELETE", "/directories"),
        )
    ),
    ("POST", "/init", "1.1.0, #1871: reference 5 (path unconfirmed: /init or /internal/init)"),
    ("GET", "/ready", "1.1.0, #1871: reference 5"),
]

EXECD_NOT_SERVED: set[Route] = {
    ("GET", "/metrics/watch"),  # the metrics stream (SSE)
    ("POST", "/init"),  # runtime init: a control plane's call (fast-sandbox), not a client's
    ("GET", "/ready"),  # its readiness route; clients probe GET /ping
}
_PTY = "execd's terminals since 1.0.10, in no released spec (opensandbox-1.1.1.md section 2)"
EXECD_OURS_ONLY: dict[Route, str] = {
    ("POST", "/pty"): _PTY,
    ("GET", "/pty/{}"): _PTY,
    ("DELETE", "/pty/{}"): _PTY,
    ("GET", "/pty/{}/ws"): _PTY,
}

# none: templates answer as a server without their runtime does (501), as the spec allows
LIFECYCLE_NOT_SERVED: set[Route] = set()
_PROXY_TOO = "the proxy relays every method our HTTP layer accepts; the released spec lists five"
LIFECYCLE_OURS_ONLY: dict[Route, str] = {
    ("HEAD", "/sandboxes/{}/proxy/{}"): _PROXY_TOO,
    ("OPTIONS", "/sandboxes/{}/proxy/{}"): _PROXY_TOO,
    ("HEAD", "/sandboxes/{}/proxy/{}/{}"): _PROXY_TOO,
    ("OPTIONS", "/sandboxes/{}/proxy/{}/{}"): _PROXY_TOO,
    ("GET", "/sandboxes/{}/stats"): "a sandbox's usage against its limits from its cgroups"
    " (osb-sync stats): execd's /metrics reads the host's /proc, in OpenSandbox's execd too",
}


def normalized(method: str, path: str) -> Route:
    """The route as compared: upper-case method, no ``/v1``, parameters unnamed."""
    if path == "/v1" or path.startswith("/v1/"):
        path = path[3:]
    return method.upper(), re.sub(r"\{[^}]*\}", "{}", path)


def yaml_operations(text: str) -> list[Route]:
    """(method, path) of every operation under ``paths:`` of an OpenAPI YAML text, in order.

    A line reader, not a YAML parser (no YAML library at run time): paths are the two-space
    keys of the ``paths:`` block and operations their four-space HTTP-method keys, as
    execd-api.yaml writes them; `test_the_yaml_reader_finds_every_operation` checks it.
    """
    found: list[Route] = []
    inside, path = False, ""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            inside = line.rstrip() == "paths:"
            continue
        if not inside:
            continue
        key = re.fullmatch(r"( +)(\S+):\s*", line)
        if key is None:
            continue
        indent, name = len(key[1]), key[2].strip("'\"")
        if indent == 2:
            path = name
        elif indent == 4 and name in HTTP_METHODS:
            found.append((name.upper(), path))
    return found


def spec_names(operations: list[tuple[str, str]]) -> dict[Route, str]:
    """Each route of a spec (in the spec's order) and its path as the spec first writes it."""
    named: dict[Route, str] = {}
    for method, path in operations:
        named.setdefault(normalized(method, path), path)
    return named


def execd_spec() -> dict[Route, str]:
    """June's spec, then the released execd's routes (``EXECD_RELEASED``)."""
    released = [(method, path) for method, path, _ in EXECD_RELEASED]
    return spec_names([*yaml_operations(EXECD_SPEC.read_text()), *released])


def lifecycle_spec() -> dict[Route, str]:
    paths = json.loads(LIFECYCLE_SPEC.read_text())["paths"]
    return spec_names([(m, p) for p, item in paths.items() for m in item if m in HTTP_METHODS])


def execd_table(tmp_path: Path) -> list[Route]:
    app = ExecdApp(SandboxRuntime(tmp_path, tmp_path, {}), ping_interval=3.0, command_grace=1.0)
    try:
        return [normalized(m, p) for m, p, _ in app.routes()]
    finally:
        app.close()


def lifecycle_table(tmp_path: Path) -> list[Route]:
    support = Support(None, "not needed to read the table", None, False)
    timing = {"pending_seconds": 0.0, "ping_interval": 3.0, "command_grace": 1.0}
    config = Config(
        root=tmp_path,
        min_timeout=60,
        max_timeout=3600,
        unenforced_network_policy="refuse",
        support=support,
        address="127.0.0.1:1",
        **timing,
    )
    registry = Registry(config)
    return [normalized(m, p) for m, p, _ in LocalServer().routes(registry)]


def gaps(
    name: str, table: list[Route], spec: list[Route], not_served: set[Route], ours: dict[Route, str]
) -> list[Route]:
    """Assert `table` matches `spec` up to the two lists; returns the routes not served."""
    assert len(table) == len(set(table)), f"{name}: a route is in the table twice"
    unknown = [r for r in table if r not in spec and r not in ours]
    assert unknown == [], f"{name}: served but not in the spec (add to OURS_ONLY with why)"
    stale = [r for r in ours if r in spec or r not in table]
    assert stale == [], f"{name}: OURS_ONLY lists routes that are in the spec or not served"
    missing = [r for r in spec if r not in table]
    new = [r for r in missing if r not in not_served]
    assert new == [], f"{name}: in the spec but neither served nor in NOT_SERVED"
    served = sorted(r for r in not_served if r in table)
    assert served == [], f"{name}: served now, so take them off NOT_SERVED"
    unknown_gaps = sorted(r for r in not_served if r not in spec)
    assert unknown_gaps == [], f"{name}: NOT_SERVED lists routes the spec does not have"
    return missing


def show(name: str, spec_file: Path, missing: list[Route], named: dict[Route, str]) -> None:
    """Print the routes not served, with the spec's own path (parameter names included)."""
    print(f"\n{name}: {len(missing)} route(s) of {spec_file.name} not served yet:")
    for route in missing:
        print(f"  {route[0]:7} {named[route]}")


def in_spec_order(table: list[Route], spec: list[Route]) -> list[tuple[Route, Route]]:
    """The neighbouring pairs of `table` (routes in both) that the spec orders the other way."""
    both = [r for r in table if r in spec]
    return [(a, b) for a, b in itertools.pairwise(both) if spec.index(a) > spec.index(b)]


def test_execd_table_is_its_spec(tmp_path: Path) -> None:
    spec = execd_spec()
    missing = gaps("execd", execd_table(tmp_path), list(spec), EXECD_NOT_SERVED, EXECD_OURS_ONLY)
    show("execd", EXECD_SPEC, missing, spec)


def test_lifecycle_table_is_the_released_spec(tmp_path: Path) -> None:
    spec = lifecycle_spec()
    table = lifecycle_table(tmp_path)
    missing = gaps("lifecycle", table, list(spec), LIFECYCLE_NOT_SERVED, LIFECYCLE_OURS_ONLY)
    show("lifecycle", LIFECYCLE_SPEC, missing, spec)


def test_execd_table_keeps_the_spec_order(tmp_path: Path) -> None:
    assert in_spec_order(execd_table(tmp_path), list(execd_spec())) == []


def test_lifecycle_table_keeps_the_spec_order(tmp_path: Path) -> None:
    assert in_spec_order(lifecycle_table(tmp_path), list(lifecycle_spec())) == []


def test_the_checks_catch_a_gap_a_stale_entry_and_disorder() -> None:
    spec = [("GET", "/a"), ("POST", "/b"), ("GET", "/c")]
    with pytest.raises(AssertionError, match="neither served nor"):
        gaps("t", [("GET", "/a")], spec, {("POST", "/b")}, {})
    with pytest.raises(AssertionError, match="served now"):
        gaps("t", [("GET", "/a"), ("POST", "/b")], spec, {("POST", "/b"), ("GET", "/c")}, {})
    with pytest.raises(AssertionError, match="not in the spec"):
        gaps("t", [*spec, ("PUT", "/d")], spec, set(), {})
    assert gaps("t", [("GET", "/a")], spec, {("POST", "/b"), ("GET", "/c")}, {}) == spec[1:]
    assert in_spec_order([("GET", "/c"), ("GET", "/a")], spec) == [(("GET", "/c"), ("GET", "/a"))]


def test_the_yaml_reader_finds_every_operation() -> None:
    text = EXECD_SPEC.read_text()
    block = text[text.index("\npaths:\n") : text.index("\ncomponents:\n")]
    operations = yaml_operations(text)
    assert len(operations) == block.count("operationId:") == 28
    assert operations[0] == ("GET", "/ping")
    assert ("GET", "/code/contexts/{context_id}") in operations


def test_the_released_spec_serves_each_route_with_and_without_v1() -> None:
    # Why the two forms count as one route: the spec lists both (/metrics/events and the
    # unversioned /health and /version excepted); our server serves every route under both.
    paths = json.loads(LIFECYCLE_SPEC.read_text())["paths"]
    bare = {p for p in paths if not p.startswith("/v1/")}
    versioned = {p[3:] for p in paths if p.startswith("/v1/")}
    assert bare ^ versioned == {"/metrics/events", "/health", "/version"}


@pytest.mark.parametrize("name", [EXECD_SPEC.name, LIFECYCLE_SPEC.name])
def test_the_spec_copies_are_the_ones_source_txt_names(name: str) -> None:
    source = (SPECS / "SOURCE.txt").read_text()
    digest = hashlib.sha256((SPECS / name).read_bytes()).hexdigest()
    assert name in source and f"sha256 {digest}" in source


def test_a_path_parameter_takes_the_rest_of_the_path() -> None:
    router = Router()
    router.add("GET", "/p/{port}", print)
    router.add("GET", "/p/{port}/{rest:path}", print)
    assert router.match("GET", "/p/1") == (print, {"port": "1"})
    assert router.match("GET", "/p/1/") == (print, {"port": "1"})
    assert router.match("GET", "/p/1/a/b/") == (print, {"port": "1", "rest": "a/b/"})
    assert router.match("POST", "/p/1/a") == 405
