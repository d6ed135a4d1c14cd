"""The package's layering, checked on its source with ``ast`` (also run by ``tox -e lint``).

The layers, top to bottom::

    consumers   osb_sync (the table of contents), _functions, _provider, _pool*,
                _cli*, testing, integrations.*      (they hold or build a Client)
    Client      _client                              (Client and the handles it keeps)
    Sandbox     _sandbox, _commands, _contexts, _files
    handles     _lifecycle, _resources, _execd, _orphans, _execution, _stream, _command_stream,
                _options
    transport   _transport, _failures, _errors, _answers, _models, _config, _constants

Rules:

1. Only the consumers import ``_client`` (where ``Client`` lives): nothing Client is built
   from reaches a Client, so a ``Sandbox`` never does.
2. A private name (one leading underscore) belongs to its module. Another module may use a
   private *module* (``from ._lifecycle import Lifecycle``: the names without an underscore of
   a private module are the documented internal interface), but never a private name of
   another module: not imported (``from ._x import _y``), not read off an object or module
   (``obj._y``) unless the same module defines ``_y``. namedtuple's ``_replace`` and its
   kind are public API despite their underscore.
3. ``osb_sync.local`` is split along its process boundary: ``local/execd`` (inside each
   sandbox) never imports ``local/host`` (the server process), ``local/host`` never imports
   ``local/execd`` (it starts it as a program), and the two places both sides share import
   neither: ``local/http`` (the HTTP layer) and ``local/protocol.py`` (the messages between
   the server and execd, which imports nothing but the standard library: an image's python3
   runs it). This is the security line, as a test.
4. The import graph of the package has no cycle (imports inside functions included).
5. The root of the error tree, ``OpenSandboxError``, is never raised (nor built to be raised
   later): each failure raises a class below it, which callers can catch apart.
6. Cohesion decides a module's size, not a count. ``MAX_LINES`` is a smoke alarm, not a
   target: a module past it is named in ``LONG_MODULES`` with why it is one idea, or split
   along an idea of its own (rules 2 and 4 refuse the circle that a split made to fit leaves).
   At 800 the ceiling fired on modules that were one idea and was met by trimming comments;
   at 1,000 it still catches a module that grows unnoticed. A reason for a module under the
   ceiling is stale, and fails.
7. Each folder of ``osb_sync.local`` (and ``local`` itself) lists its modules in its
   ``__init__`` docstring, one ``- `name`:`` line each (a folder as ``name/``): exactly the
   files there, so the list cannot drift.
8. In ``osb_sync.local`` only the modules that answer HTTP (``HTTP_ANSWERS``: the routes and
   request checks, and the HTTP layer) build an HTTP error (``HttpError``, ``error``) or use
   the request checks (``local/host/validation``, ``local/http/bodies``); the mechanics raise
   their own errors (``local/host/errors.py``), which the server maps to answers in one place.

``osb_sync.local`` is checked by the same rules; the cases it breaks are listed in
``LOCAL_ALLOWED`` with why (none today).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "osb_sync"
MAX_LINES = 1000
# module -> why it is one idea although longer than MAX_LINES (none today)
LONG_MODULES: dict[str, str] = {}
CLIENT_MODULES = {"_client"}
CONSUMERS = {
    "__init__", "__main__", "_functions", "_provider", "_pool", "_pool_contract",
    "_cli", "_cli_options", "_cli_run", "_cli_sandboxes", "_cli_exec", "testing",
}  # fmt: skip

# osb_sync.local's cases, left for the local-server work (it owns those modules), as
# (module, violation) pairs; none today.
LOCAL_ALLOWED: set[tuple[str, str]] = set()
# The modules of osb_sync.local that answer HTTP (rule 8): the server's routes, beside their
# stores, and its request checks; execd's routes; the HTTP layer (local/http/*) besides.
HTTP_ANSWERS = {
    *(f"local.host.{name}" for name in (
        "server", "registry", "sandboxes", "snapshots", "pools", "diagnostics", "network",
        "proxy", "validation",
    )),
    *(f"local.execd.{name}" for name in (
        "main", "router", "code_interpreting", "command", "filesystem", "uploads", "metrics",
        "identity", "pty",
    )),
}  # fmt: skip
HTTP_ERRORS = {"HttpError", "error", "bad_body"}  # what local/http/exchange.py answers with


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield ".".join(path.relative_to(PACKAGE).with_suffix("").parts), path


def module_names() -> set[str]:
    return {name for name, _ in modules()}


def imported_modules(tree: ast.AST, name: str) -> Iterator[tuple[str, list[str]]]:
    """(imported module relative to the package, names taken from it) of every import."""
    package = name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            if not node.level:
                if not (node.module or "").startswith("osb_sync"):
                    continue
                parts = (node.module or "").split(".")[1:]
            else:
                parts = base + (node.module.split(".") if node.module else [])
            target = ".".join(parts)
            names = [alias.name for alias in node.names]
            yield target, names
            for alias in names:  # ``from . import _orphans``: a module, not a name
                yield ".".join([*parts, alias]), []
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("osb_sync."):
                    yield alias.name.split(".", 1)[1], []


def private_names_defined(tree: ast.AST) -> set[str]:
    """The ``_names`` this module owns: its functions, classes, attributes and globals."""
    owned: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            owned.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            owned.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            owned.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            owned.add(node.target.id)
    return {name for name in owned if name.startswith("_")}


# Public API of the standard library that starts with an underscore (namedtuple's methods;
# os._exit, how a forked child ends without running its parent's clean-up).
STDLIB_API = {"_replace", "_asdict", "_fields", "_make", "_exit"}


def is_private(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("_") and not dunder and name not in STDLIB_API


def violations(name: str, path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    top = name.split(".")[0]
    known = module_names()
    for target, names in imported_modules(tree, name):
        if target.split(".")[-1] in CLIENT_MODULES and name not in CLIENT_MODULES:
            if top not in CONSUMERS and top != "integrations":
                yield f"imports {target}: only consumers may reach a Client"
        for imported in names:
            if is_private(imported) and ".".join([target, imported]).strip(".") not in known:
                yield f"imports the private name {imported} of {target}"
    owned = private_names_defined(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not is_private(node.attr):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if node.attr not in owned:
            yield f"line {node.lineno}: reads {node.attr}, a private name of another module"
    for target, _ in imported_modules(tree, name):
        if target in known or target.rsplit(".", 1)[0] in known:
            side = local_side(target if target in known else target.rsplit(".", 1)[0])
            if side in FORBIDDEN.get(local_side(name), ()):
                yield f"imports {target}: local/{local_side(name)} never imports local/{side}"
    for line in root_errors_built(tree):
        yield f"line {line}: builds {ROOT_ERROR}, the root of the errors: raise a class below it"
    if local_side(name) == "protocol":
        yield from foreign_imports(tree)
    if name.startswith("local.") and local_side(name) != "http" and name not in HTTP_ANSWERS:
        yield from http_answers(tree, name)
    lines = len(path.read_text().splitlines())
    if lines > MAX_LINES and name not in LONG_MODULES:
        yield f"has {lines} lines (at most {MAX_LINES}, or a reason in LONG_MODULES)"


ROOT_ERROR = "OpenSandboxError"


def root_errors_built(tree: ast.AST) -> list[int]:
    """The lines that call the root error class (``raise OpenSandboxError(...)``, or one kept
    to raise later) or raise the class itself."""
    lines = set()
    for node in ast.walk(tree):
        target = node.func if isinstance(node, ast.Call) else None
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc
        name = getattr(target, "id", None) or getattr(target, "attr", None)
        if name == ROOT_ERROR:
            lines.add(node.lineno)
    return sorted(lines)


# local/<side> -> the sides it must never import
FORBIDDEN = {
    "execd": ("host",),
    "host": ("execd",),
    "http": ("host", "execd"),
    "protocol": ("host", "execd", "http"),
}


def local_side(module: str) -> str | None:
    """``host``, ``execd`` or ``http`` for a module in that folder of ``local``, ``protocol``
    for ``local/protocol.py``, else None."""
    parts = module.split(".")
    if parts[:2] == ["local", "protocol"]:
        return "protocol"
    return parts[1] if len(parts) > 2 and parts[0] == "local" else None


def foreign_imports(tree: ast.AST) -> Iterator[str]:
    """An import of anything but the standard library (the protocol's rule)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found = ["." * node.level + (node.module or "")]
        else:
            continue
        for module in found:
            if module != "__future__" and module.split(".")[0] not in sys.stdlib_module_names:
                yield f"imports {module}: the protocol imports the standard library only"


def http_answers(tree: ast.AST, name: str) -> Iterator[str]:
    """What builds an HTTP answer outside `HTTP_ANSWERS` (rule 8)."""
    for target, names in imported_modules(tree, name):
        if target == "local.http.exchange" and HTTP_ERRORS & set(names):
            yield f"imports {', '.join(sorted(HTTP_ERRORS & set(names)))}: only {HTTP_NOTE}"
        if target == "local.host.validation" and names:
            yield f"imports the request checks of validation: only {HTTP_NOTE}"
        if target == "local.http.bodies" and set(names) - {"rfc3339"}:
            yield f"imports the request checks of http/bodies: only {HTTP_NOTE}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "HttpError":
            yield f"line {node.lineno}: reads HttpError: only {HTTP_NOTE}"


HTTP_NOTE = "HTTP_ANSWERS build HTTP answers (raise an error of local/host/errors.py)"


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the modules of the package it imports."""
    known = module_names()
    graph: dict[str, set[str]] = {}
    for name, path in modules():
        tree = ast.parse(path.read_text(), str(path))
        targets = {t for t, _ in imported_modules(tree, name) if t in known and t != name}
        graph[name] = {t for t in targets if not name.startswith(t + ".")}  # not its packages
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


LISTED = re.compile(r"^- `([A-Za-z_]\w*/?)`", re.MULTILINE)


def listing_gaps(folder: Path) -> list[str]:
    """How the module list of `folder/__init__.py`'s docstring differs from its files."""
    docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    listed = LISTED.findall(docstring)
    files = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    files |= {p.parent.name + "/" for p in folder.glob("*/__init__.py")}
    gaps = [f"{name} is not listed" for name in sorted(files - set(listed))]
    gaps += [f"{name} is listed but no file" for name in sorted(set(listed) - files)]
    gaps += [
        f"{name} is listed twice" for name in sorted({n for n in listed if listed.count(n) > 1})
    ]
    return gaps


@pytest.mark.parametrize(
    "folder", sorted({p.parent for p in (PACKAGE / "local").rglob("__init__.py")})
)
def test_each_local_folder_lists_its_modules(folder: Path) -> None:
    assert listing_gaps(folder) == [], folder


def test_the_listing_check_finds_a_gap(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    for name in ("a", "b"):
        (tmp_path / f"{name}.py").write_text("")
    (tmp_path / "__init__.py").write_text(
        '"""Doc.\n\n- `a`: one.\n- `gone`: two.\n- `a`: again.\n"""\n'
    )
    assert listing_gaps(tmp_path) == [
        "b is not listed", "sub/ is not listed", "gone is listed but no file", "a is listed twice",
    ]  # fmt: skip


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(module_names()))
def test_module_keeps_to_its_layer(name: str) -> None:
    path = dict(modules())[name]
    found = [v for v in violations(name, path) if (name, v) not in LOCAL_ALLOWED]
    assert found == [], f"osb_sync.{name}: " + "; ".join(found)


def stale_reasons(reasons: dict[str, str], paths: dict[str, Path]) -> set[str]:
    """The modules given a reason in ``reasons`` that are gone or within ``MAX_LINES``."""
    return {
        name
        for name in reasons
        if name not in paths or len(paths[name].read_text().splitlines()) <= MAX_LINES
    }


def test_every_long_module_reason_is_for_a_module_past_the_ceiling(tmp_path: Path) -> None:
    assert stale_reasons(LONG_MODULES, dict(modules())) == set(), "drop these reasons"
    short, long = tmp_path / "short.py", tmp_path / "long.py"
    short.write_text("x = 1\n")
    long.write_text("x = 1\n" * (MAX_LINES + 1))
    reasons = {"short": "one idea", "long": "one idea", "gone": "one idea"}
    assert stale_reasons(reasons, {"short": short, "long": long}) == {"short", "gone"}


def test_the_checks_catch_what_they_forbid(tmp_path: Path) -> None:
    source = tmp_path / "bad.py"
    bad = [
        "from ._client import Client",
        "from ._constants import _hidden",
        "handle._execd.base_url",
        "raise OpenSandboxError('x')",
        "later = errors.OpenSandboxError",  # a name, not a call: allowed
        "raise OpenSandboxError",
        "raise ConfigurationError('a leaf')",
        "caught = isinstance(exc, OpenSandboxError)",
    ]
    source.write_text("\n".join(bad) + "\n" + "x = 1\n" * MAX_LINES)
    found = list(violations("_sandbox", source))
    assert len(found) == 6, found
    assert [v.split(" ")[:2] for v in found] == [
        ["imports", "_client:"],
        ["imports", "the"],  # ... private name _hidden
        ["line", "3:"],
        ["line", "4:"],  # raise OpenSandboxError('x')
        ["line", "6:"],  # raise OpenSandboxError
        ["has", str(MAX_LINES + 8)],
    ], found


@pytest.mark.parametrize(
    ("name", "source", "side"),
    [
        ("local.execd.command", "from ..host import container\n", "host"),
        ("local.execd.command", "from osb_sync.local.host.spawn import SPAWNER\n", "host"),
        ("local.host.registry", "from ..execd.router import ExecdApp\n", "execd"),
        ("local.http.httpd", "from ..execd import runner\n", "execd"),
    ],
)
def test_the_security_line_is_checked(tmp_path: Path, name: str, source: str, side: str) -> None:
    path = tmp_path / "module.py"
    path.write_text(source)
    found = [v for v in violations(name, path) if "never imports" in v]
    assert found and found[0].endswith(f"never imports local/{side}"), found


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("import requests\n", "imports requests"),
        ("from osb_sync.local.http import exchange\n", "imports osb_sync.local.http"),
        ("from .host import bwrap\n", "imports .host"),
    ],
)
def test_the_protocol_imports_the_standard_library_only(
    tmp_path: Path, source: str, says: str
) -> None:
    path = tmp_path / "protocol.py"
    path.write_text("from __future__ import annotations\nimport json\n" + source)
    found = [v for v in violations("local.protocol", path) if "standard library" in v]
    assert found and found[0].startswith(says), found
    path.write_text("from __future__ import annotations\nimport json\n")
    assert list(violations("local.protocol", path)) == []


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("local.execd.command", "from ..protocol import Claim\n"),
        ("local.host.container", "from ..protocol import Start\n"),
    ],
)
def test_both_sides_may_import_the_protocol(tmp_path: Path, name: str, source: str) -> None:
    path = tmp_path / "module.py"
    path.write_text(source)
    assert list(violations(name, path)) == []


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("local.host.limits", "from ..http.exchange import HttpError\n"),
        ("local.host.volumes", "from ..http.exchange import Exchange, error\n"),
        ("local.host.capacity", "from .validation import bad_parameter\n"),
        ("local.host.images.service", "from ...http import exchange\nexchange.HttpError(1, 2)\n"),
        ("local.execd.runner", "from ..http.exchange import error\n"),
        ("local.execd.runner", "from ..http.bodies import bad_request\n"),
    ],
)
def test_http_answers_are_built_only_where_errors_are_mapped(
    tmp_path: Path, name: str, source: str
) -> None:
    path = tmp_path / "module.py"
    path.write_text(source)
    found = [v for v in violations(name, path) if "HTTP_ANSWERS" in v]
    assert found, found
    allowed = "local.host.registry" if name.startswith("local.host") else "local.execd.command"
    assert [v for v in violations(allowed, path) if "HTTP_ANSWERS" in v] == []
