"""Every code block of README.rst and docs/ runs against a local server, or says why it cannot.

A block is a ``.. code-block:: LANG`` directive or a literal block (a paragraph ending in
``::``). Python blocks run with the names the docs assume (``client``, ``sandbox``...) built
from ``OPEN_SANDBOX_API_BASE``, which points at a LocalServer; a block that defines
``test_*`` functions runs as a test file under the pytest plugin; shell blocks made of
``osb-sync`` commands run in bash; TOML blocks are parsed and their ``class_path`` looked up.
A block is skipped only after a comment ``.. skip-block: <reason>`` right before it (before
the paragraph that introduces a literal block). Any other block fails.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

import osb_sync
from osb_sync.local import LocalServer
from osb_sync.local.host.bwrap import probe

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.rst", *sorted((ROOT / "docs").rglob("*.rst"))]
BLOCK_TIMEOUT = 120.0

# Files the blocks name: in the working directory, and in the sandbox a block is given.
LOCAL_FILES = {"model.bin": bytes(range(256)) * 64}
SANDBOX_FILES = {"data/out.parquet": b"PAR1 stands in for a parquet file PAR1"}
# Stand-ins for the reader's own values.
USER_CODE = "print(6 * 7)"

SKIP_MARKER = re.compile(r"^\s*\.\. skip-block:(.*)$")
CODE_BLOCK = re.compile(r"^(\s*)\.\. (code-block|code|sourcecode)::\s*(\S*)\s*$")
UNSUPPORTED = re.compile(r"^\s*\.\. (literalinclude|doctest|testcode)::")
SHELL = {"shell", "bash", "sh", "console"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the first line of code
    language: str  # python, shell, toml...; "" for a literal block (decided by its content)
    code: str
    skip: str | None  # the reason given by a skip-block marker

    @property
    def name(self) -> str:
        return f"{shown(self.path)}:{self.line}"


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def skip_reason(lines: list[str], start: int, where: str) -> str | None:
    """The reason of a marker on the last non-blank line before ``lines[start]``, if any."""
    i = start - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    match = SKIP_MARKER.match(lines[i]) if i >= 0 else None
    if match is None:
        return None
    reason = match.group(1).strip()
    if not reason:
        raise ValueError(f"{where}: a skip-block marker must say why")
    return reason


def paragraph_start(lines: list[str], i: int) -> int:
    while i > 0 and lines[i - 1].strip() and not lines[i - 1].lstrip().startswith(".. "):
        i -= 1
    return i


def indented_body(lines: list[str], i: int, base: int) -> tuple[int, list[str]]:
    """The lines after ``lines[i - 1]`` indented deeper than ``base``: (first line, dedented)."""
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i == len(lines) or indent_of(lines[i]) <= base:
        return i, []
    depth = indent_of(lines[i])
    first, body = i, []
    while i < len(lines) and (not lines[i].strip() or indent_of(lines[i]) >= depth):
        body.append(lines[i][depth:])
        i += 1
    while body and not body[-1].strip():
        body.pop()
    return first, body


def extract(path: Path, text: str | None = None) -> list[Block]:
    """The code blocks of one rst file (or of ``text``, found in ``path``), in order."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        where = f"{shown(path)}:{i + 1}"
        if UNSUPPORTED.match(line):
            raise ValueError(f"{where}: this harness does not run {line.strip()!r}")
        directive = CODE_BLOCK.match(line)
        if directive is not None:
            base, language = len(directive.group(1)), directive.group(3)
            j = i + 1
            while j < len(lines) and lines[j].strip().startswith(":"):  # options
                j += 1
            reason = skip_reason(lines, i, where)
        elif line.rstrip().endswith("::") and not line.lstrip().startswith(".. "):
            start = paragraph_start(lines, i)
            base, language, j = indent_of(lines[start]), "", i + 1
            if lines[start].lstrip().startswith(("- ", "* ")):
                base += 2  # a literal block inside a list item
            reason = skip_reason(lines, start, where)
        else:
            i += 1
            continue
        first, body = indented_body(lines, j, base)
        if not body:
            raise ValueError(f"{where}: a code block without code")
        blocks.append(Block(path, first + 1, language, "\n".join(body) + "\n", reason))
        i = first + len(body)
    return blocks


def all_blocks() -> list[Block]:
    """The documents' blocks, and those of ``help(osb_sync)``."""
    overview = extract(ROOT / "osb_sync" / "__init__.py", inspect.cleandoc(osb_sync.__doc__ or ""))
    return [block for document in DOCUMENTS for block in extract(document)] + overview


def kind_of(block: Block) -> str:
    if block.language in ("python", "python3", "py", "pycon"):
        return "python"
    if block.language in SHELL:
        return "shell"
    if block.language:
        return block.language
    try:
        ast.parse(block.code)
    except SyntaxError:
        return "shell"
    return "python"


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with LocalServer(command_grace=0, unenforced_network_policy="accept") as srv:
        yield srv


@pytest.fixture
def harness(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[osb_sync.Client]:
    """A working directory with the files blocks name, and the environment they read."""
    monkeypatch.setenv("OPEN_SANDBOX_API_BASE", server.api_base)
    monkeypatch.chdir(tmp_path)
    for name, data in LOCAL_FILES.items():
        (tmp_path / name).write_bytes(data)
    with osb_sync.Client() as client:
        yield client
        left = [info.id for info in client.list_sandboxes()]
        for sandbox_id in left:
            client.delete_quietly(sandbox_id)
        assert left == [], "the block left sandboxes alive"


def free_names(code: str) -> set[str]:
    tree = ast.parse(code)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - set(dir(builtins))


def with_deadline(function: Any, name: str) -> None:
    """Run ``function`` in a thread; a block still running after BLOCK_TIMEOUT fails."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            function()
        except BaseException as exc:  # re-raised in the test's thread
            failure.append(exc)

    thread = threading.Thread(target=target, name=f"doc block {name}", daemon=True)
    thread.start()
    thread.join(BLOCK_TIMEOUT)
    assert not thread.is_alive(), f"{name} still running after {BLOCK_TIMEOUT} s"
    if failure:
        raise failure[0]


def run_python(block: Block, client: osb_sync.Client) -> None:
    names = free_names(block.code)
    namespace: dict[str, Any] = {"__name__": "__doc_block__", "osb_sync": osb_sync}
    namespace["client"] = client
    namespace["user_code"] = USER_CODE
    sandbox = None
    if names & {"sandbox", "token", "execd_url"}:
        # labelled like the sandboxes the README's listing example looks for
        sandbox = client.create_sandbox(metadata={"team": "ml"})
        for path, data in SANDBOX_FILES.items():
            sandbox.files.write(path, data)
        namespace["sandbox"] = sandbox
        namespace["execd_url"] = sandbox.execd_url
        namespace["token"] = sandbox.execd_headers.get("X-EXECD-ACCESS-TOKEN", "")
    try:
        code = compile(block.code, block.name, "exec")
        with_deadline(lambda: exec(code, namespace), block.name)
    finally:
        for value in namespace.values():
            if isinstance(value, osb_sync.SandboxPool):
                value.close()  # as the end of the process would
        if sandbox is not None:
            client.delete_quietly(sandbox)


def run_as_test_file(
    block: Block, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, api_base: str
) -> None:
    """A block defining ``test_*`` functions: a test file under the plugin's fixtures."""
    pytester.makepyfile(
        my_app="def run_snippet(client, code):\n"
        "    return client.code_interpreter_tool(code).stdout\n",
        test_block=block.code,
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    installed = any(e.name == "opensandbox" for e in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "osb_sync.testing"]
    result = pytester.runpytest_subprocess(
        *plugin, "-p", "no:cacheprovider", "--opensandbox-api-base", api_base, timeout=300
    )
    tests = len(re.findall(r"^def test_", block.code, re.MULTILINE))
    assert result.parseoutcomes() == {"passed": tests}, result.stdout.str()


def run_shell(block: Block, tmp_path: Path) -> None:
    commands = [
        line for line in block.code.splitlines() if line.strip() and not line.startswith("#")
    ]
    if not all(line.startswith("osb-sync ") for line in commands):
        pytest.fail(f"{block.name}: only osb-sync commands run here; mark it: .. skip-block: why")
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "osb-sync").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m osb_sync "$@"\n')
    (shim / "osb-sync").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        env=env,
        check=True,
        timeout=BLOCK_TIMEOUT,
    )


def class_paths(table: dict[str, Any]) -> Iterator[str]:
    for key, value in table.items():
        if isinstance(value, dict):
            yield from class_paths(value)
        elif key == "class_path":
            yield value


def check_toml(block: Block) -> None:
    tomllib = pytest.importorskip("tomllib", reason="parsing TOML needs Python 3.11")
    paths = list(class_paths(tomllib.loads(block.code)))
    assert paths, f"{block.name}: a TOML block names no class_path"
    for class_path in paths:
        module, _, name = class_path.partition(":")
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, f"no module {module}"
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        assert name in classes, f"{module} defines no class {name}"


BLOCKS = all_blocks()
# A block that starts a LocalServer() of its own creates sandboxes with the client's default,
# deny-all, policy, which that server refuses where it cannot isolate them.
OWN_SERVER = re.compile(r"\bLocalServer\(\)")


def require_isolation() -> None:
    """Skip where sandboxes cannot be isolated (fail under OSB_REQUIRE_ISOLATION=1)."""
    problem = probe().problem
    if not problem:
        return
    reason = (
        f"sandboxes cannot be isolated here: {problem} (a block with a LocalServer() of its "
        "own, whose deny-all sandboxes it then refuses)"
    )
    if os.environ.get("OSB_REQUIRE_ISOLATION") == "1":
        pytest.fail(f"OSB_REQUIRE_ISOLATION=1 but {reason}")
    pytest.skip(reason)


# slow: plain pytest leaves these out (about 11 s); the tox interpreter envs, and so CI, run them
@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_block(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if block.skip is not None:
        pytest.skip(f"{block.name} marked: {block.skip}")
    kind = kind_of(block)
    if kind == "python" and OWN_SERVER.search(block.code):
        require_isolation()
    if kind == "toml":
        check_toml(block)
        return
    client = request.getfixturevalue("harness")
    if kind == "python" and re.search(r"^def test_", block.code, re.MULTILINE):
        pytester = request.getfixturevalue("pytester")
        monkeypatch = request.getfixturevalue("monkeypatch")
        run_as_test_file(block, pytester, monkeypatch, request.getfixturevalue("server").api_base)
    elif kind == "python":
        run_python(block, client)
    elif kind == "shell":
        run_shell(block, tmp_path)
    else:
        pytest.fail(f"{block.name}: no way to run a {kind} block; mark it: .. skip-block: why")


def test_the_extractor_finds_each_kind_of_block(tmp_path: Path) -> None:
    document = tmp_path / "sample.rst"
    document.write_text(
        "Title\n=====\n\n"
        "A literal block::\n\n    print(1)\n\nAfter.\n\n"
        ".. skip-block: needs a cluster\n\n"
        "Skipped, in the\nexpanded form: ::\n\n    osb-sync list\n\n"
        "- a list item with\n  a block::\n\n      x = 1\n\n      y = x\n\n"
        ".. code-block:: python\n   :caption: options are not code\n\n   z = 2\n\n"
        ".. toctree::\n\n   not/a/block\n",
        encoding="utf-8",
    )
    blocks = extract(document)
    assert [(b.language, b.code, b.skip) for b in blocks] == [
        ("", "print(1)\n", None),
        ("", "osb-sync list\n", "needs a cluster"),
        ("", "x = 1\n\ny = x\n", None),
        ("python", "z = 2\n", None),
    ]
    assert [kind_of(b) for b in blocks] == ["python", "shell", "python", "python"]


def test_a_marker_without_a_reason_is_refused(tmp_path: Path) -> None:
    document = tmp_path / "sample.rst"
    document.write_text(".. skip-block:\n\n.. code-block:: python\n\n   1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="must say why"):
        extract(document)


def test_every_guide_has_blocks() -> None:
    for document in DOCUMENTS:
        assert any(block.path == document for block in BLOCKS) or document.name in (
            "index.rst",
            "api.rst",
        ), f"{document} has no code block: is the extractor blind to its form?"


def test_help_gives_an_overview() -> None:
    overview = inspect.cleandoc(osb_sync.__doc__ or "")
    for name in ("Client", "Sandbox", "ExecutionResult", "SandboxPool", "OpenSandboxError"):
        assert f"- ``{name}``: " in overview and name in osb_sync.__all__
    assert "README.rst" in overview and "``docs/``" in overview
    assert any(block.path.name == "__init__.py" for block in BLOCKS)  # its example runs


def test_an_unmarked_shell_block_that_is_not_osb_sync_fails(tmp_path: Path) -> None:
    block = Block(tmp_path / "guide.rst", 3, "shell", "pip install osb-sync\n", None)
    with pytest.raises(pytest.fail.Exception, match=r"mark it: \.\. skip-block: why"):
        run_shell(block, tmp_path)
