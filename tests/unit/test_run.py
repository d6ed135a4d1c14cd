"""tests/run.py, the test command: what it reads from pytest's junit files and what it prints."""

from __future__ import annotations

import ast
import configparser
import os
import re
import shlex
from pathlib import Path

import pytest

from tests import run
from tests.nonroot import run_as_users

pytest_plugins = ["pytester"]

SUITE = """
import pytest

def test_passes():
    pass

def test_fails():
    assert False

@pytest.mark.skip(reason="our execd only: a behaviour of ours")
def test_ours():
    pass

def test_no_execd():
    pytest.skip("run-execd not found beside the repository (set OSB_REAL_EXECD_DIR)")

@pytest.mark.parametrize("n", [1, 2])
def test_no_bwrap(n):
    pytest.skip("sandboxes cannot be isolated here: bubblewrap is not installed")

@pytest.fixture
def broken():
    raise RuntimeError("setup")

def test_error(broken):
    pass
"""


@pytest.fixture
def junit(pytester: pytest.Pytester) -> Path:
    """A junit file that pytest itself wrote for SUITE."""
    pytester.makepyfile(
        test_suite=SUITE, test_missing="import pytest\npytest.importorskip('osb_no_such')\n"
    )
    path = pytester.path / "junit.xml"
    pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--junitxml={path}")
    return path


def test_counts_and_skip_reasons_come_from_pytests_junit_file(junit: Path) -> None:
    passed, failed, skips = run.read_junit(junit)
    assert (passed, failed) == (1, 2)  # a failure and an error in setup
    assert sorted(skips) == [
        "could not import 'osb_no_such': No module named 'osb_no_such'",  # a whole module
        "our execd only: a behaviour of ours",
        "run-execd not found beside the repository (set OSB_REAL_EXECD_DIR)",
        "sandboxes cannot be isolated here: bubblewrap is not installed",
        "sandboxes cannot be isolated here: bubblewrap is not installed",
    ]


def test_env_reports_read_each_envs_junit_file_and_toxs_results(
    junit: Path, tmp_path: Path
) -> None:
    (tmp_path / "realexecd" / "tmp").mkdir(parents=True)
    junit.rename(tmp_path / "realexecd" / run.JUNIT)
    results = {
        "testenvs": {
            "realexecd": {"result": {"success": False, "duration": 75.2, "skipped": False}},
            "type": {"result": {"success": True, "duration": 30.0, "skipped": False}},
            "py313": {"result": {"success": True, "duration": 0.3, "skipped": True}},
        }
    }
    reports = run.env_reports(["realexecd", "type", "py313", "lint"], results, tmp_path)
    assert [(r.name, r.status, r.has_tests) for r in reports] == [
        ("realexecd", "FAIL", True),
        ("type", "OK", False),
        ("py313", "SKIP", False),
        ("lint", "FAIL", False),  # tox gave no result for it
    ]
    realexecd = reports[0]
    assert (realexecd.passed, realexecd.failed, realexecd.seconds) == (1, 2, 75.2)
    assert realexecd.by_design() == {"tests of our own execd's behaviour": 1}
    assert sum(realexecd.not_run().values()) == 4


@pytest.mark.parametrize(
    ("env", "reason", "label"),
    [
        ("py311", "n/a: not an event stream", "fault-matrix cells that do not apply"),
        (
            "py311",
            "README.rst:23 marked: it is the test command",
            "doc blocks marked .. skip-block",
        ),
        (
            "py310",
            "could not import 'flask': No module named 'flask'",
            "suites of the flask, django, deepagents and sdk envs",
        ),
        (
            "django",
            "could not import 'flask': No module named 'flask'",
            "suites of the flask, django, deepagents and sdk envs",
        ),
        ("flask", "could not import 'flask': No module named 'flask'", None),  # its own env
        ("deepagents", "could not import 'deepagents_code': No module named 'x'", None),
        (
            "py310",
            "parsing TOML needs Python 3.11",
            "TOML checks on Python 3.10, which lacks tomllib",
        ),
        ("py311", "sandboxes cannot be isolated here: bwrap cannot create namespaces", None),
        ("py311", "slirp4netns is not installed (apt-get install slirp4netns)", None),
    ],
)
def test_skips_by_design_are_told_from_suites_that_could_not_run(
    env: str, reason: str, label: str | None
) -> None:
    assert run.design_label(env, reason) == label


def report(name: str, status: str = "OK", **fields: object) -> run.EnvReport:
    made = run.EnvReport(name, status, seconds=201.0)
    for key, value in fields.items():
        setattr(made, key, value)
    return made


def test_the_summary_names_each_suite_that_did_not_fully_run_and_ends_with_the_total() -> None:
    reports = [
        report("py311", has_tests=True, passed=900, skips=["n/a: x", "n/a: y", "no cgroup"]),
        report("type"),
        report("conformance", has_tests=True, skips=["run-execd not found (set X)"] * 25),
        report("py313", "SKIP", note="not run: no python3.13 interpreter found"),
    ]
    lines = run.summary(reports, ["bubblewrap"], ci=False, descriptions={"type": "mypy"})
    assert lines[2:6] == [
        "py311        OK    3 min 21 s  900 passed, 0 failed, 3 skipped (2 by design)",
        "type         OK    3 min 21 s  mypy",
        "conformance  OK    3 min 21 s  0 passed, 0 failed, 25 skipped",
        "py313        SKIP              not run: no python3.13 interpreter found",
    ]
    assert lines[6:] == [
        "Skipped by design: fault-matrix cells that do not apply (2)",
        "Did not fully run:",
        "  py311: 1 skipped: no cgroup",
        "  conformance: 25 skipped: run-execd not found (set X)",
        "  py313: not run: no python3.13 interpreter found",
        "  to run the isolation suites here (Debian, Ubuntu): "
        + ("" if run.os.geteuid() == 0 else "sudo ")
        + "apt-get install bubblewrap",
        "900 passed, 0 failed, 28 skipped",
    ]


def test_an_env_that_failed_outside_pytest_counts_as_a_failure() -> None:
    reports = [report("py312", "FAIL", has_tests=True, passed=10), report("type", "FAIL")]
    lines = run.summary(reports, [], ci=True)
    assert "a command outside pytest failed" in lines[2]
    assert "failed (its output is above)" in lines[3]
    assert re.fullmatch(r"10 passed, 2 failed, 0 skipped", lines[-1])


def test_many_skip_reasons_are_cut_to_the_commonest() -> None:
    skips = [f"reason {n}" for n in range(6) for _ in range(n + 1)]
    line = run.not_run_line(report("py310", has_tests=True, skips=skips))
    assert line == (
        "py310: 6 skipped: reason 5 | 5 skipped: reason 4 | 4 skipped: reason 3 | "
        "3 skipped: reason 2 | 3 more skipped (.tox/py310/tmp/junit.xml)"
    )


def test_a_long_reason_is_cut_to_one_short_line() -> None:
    line = run.not_run_line(report("py311", has_tests=True, skips=["why\n" + "x" * 300]))
    assert line is not None and "\n" not in line
    assert line.startswith("py311: 1 skipped: why xxx") and line.endswith("x...")
    assert len(line) == len("py311: 1 skipped: ") + run.REASON_CHARS


def test_pyenv_versions_prefer_cis_and_else_the_newest_patch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listed = "system\n3.10.2\n3.10.13\n3.11.7\n3.12.0\n3.12.10\n3.9.18\n"
    monkeypatch.setattr(run.shutil, "which", lambda name: "/bin/pyenv")
    monkeypatch.setattr(
        run.subprocess, "run", lambda *a, **k: run.subprocess.CompletedProcess(a, 0, listed)
    )
    assert run.pyenv_version(None) == "3.11.7:3.10.13:3.12.10"  # no 3.13: tox says it is missing
    # what pyenv's shim sets when nobody set the variable: the others are added after it
    assert run.pyenv_version("3.11.7") == "3.11.7:3.10.13:3.12.10"
    assert run.pyenv_version("3.12.0:3.11.7") == "3.12.0:3.11.7:3.10.13"
    assert run.pyenv_version("3.11.7:3.10.2:3.12.0") is None  # nothing to add


def test_pyenv_is_left_alone_where_there_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run.shutil, "which", lambda name: None)
    assert run.pyenv_version(None) is None


# The markers that decide where a suite runs (setup.cfg; tests/conftest.py marks three folders).
PLACE_MARKERS = ("slow", "local", "conformance", "httpfuzz", "nonroot")
FOLDER_MARKERS = {"local": "local", "conformance": "conformance", "nonroot": "nonroot"}


def suite_markers(path: Path) -> set[frozenset[str]]:
    """The sets of PLACE_MARKERS the tests of one file carry (by its folder, its
    ``pytestmark`` and its tests' decorators)."""
    tree = ast.parse(path.read_text())
    base = {FOLDER_MARKERS[path.parent.name]} if path.parent.name in FOLDER_MARKERS else set()
    decorated = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in PLACE_MARKERS:
            inner = node.value
            if isinstance(inner, ast.Attribute) and inner.attr == "mark":
                decorated.add(node.attr)
    module_level = {
        node.value.attr
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
        and isinstance(node.value, ast.Attribute)
    }
    base |= module_level
    return {frozenset(base)} | {frozenset(base | {m}) for m in decorated - module_level}


def env_selections(ini: Path) -> dict[str, list[tuple[str, list[str], list[str]]]]:
    """Per env of the envlist: each pytest command's ``-m`` expression, paths and ignores."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(ini)
    envlist = [e for e in re.split(r"[,\s]+", config.get("tox", "envlist")) if e]
    found: dict[str, list[tuple[str, list[str], list[str]]]] = {}
    for env in envlist:
        section = f"testenv:{env}"
        if not config.has_option(section, "commands"):
            section = "testenv"
        commands = config.get(section, "commands", fallback="")
        for line in commands.splitlines():
            if run_as_users.DRIVER in line:  # its pytest, as each user, runs one file
                found.setdefault(env, []).append(("nonroot", [run_as_users.SUITE], []))
                continue
            if "pytest" not in line:
                continue
            words = shlex.split(re.sub(r"\{posargs:([^}]*)\}", r"\1", line).replace("{", "_"))
            expression, paths, ignored = "", [], []
            for i, word in enumerate(words):
                if word == "-m" and words[i + 1] not in ("pytest", "coverage"):
                    expression = words[i + 1]
                elif word.startswith("--ignore="):
                    ignored.append(word.split("=", 1)[1])
                elif word.startswith("tests/"):
                    paths.append(word)
            found.setdefault(env, []).append((expression, paths, ignored))
    return found


def selects(
    selection: tuple[str, list[str], list[str]], path: str, markers: frozenset[str]
) -> bool:
    expression, paths, ignored = selection

    def under(root: str) -> bool:
        return path == root or path.startswith(root.rstrip("/") + "/")

    if paths and not any(under(p) for p in paths):
        return False
    if any(under(p) for p in ignored):
        return False
    names = {m: m in markers for m in PLACE_MARKERS}
    return not expression or bool(eval(expression, {"__builtins__": {}}, names))


def test_every_suite_runs_in_some_env_that_ci_runs() -> None:
    """Each test file's tests, with each set of the markers that place them, are selected by
    an env of the envlist (what .ci/run runs): a suite moved out of the interpreter envs (the
    local server's, into its own) must land somewhere."""
    root = Path(run.__file__).resolve().parents[1]
    selections = env_selections(root / "tox.ini")
    files = sorted((root / "tests").rglob("test_*.py"))
    assert len(files) > 50
    missing = [
        (str(f.relative_to(root)), sorted(markers))
        for f in files
        for markers in suite_markers(f)
        if not any(
            selects(sel, str(f.relative_to(root)), markers)
            for sels in selections.values()
            for sel in sels
        )
    ]
    assert missing == []
    assert selects(selections["local"][0], "tests/local/test_isolation.py", frozenset({"local"}))
    assert not selects(
        selections["py310"][0], "tests/local/test_isolation.py", frozenset({"local"})
    )


def test_the_suite_check_finds_a_suite_no_env_runs(tmp_path: Path) -> None:
    ini = tmp_path / "tox.ini"
    ini.write_text(
        "[tox]\nenvlist = py311\n[testenv]\n"
        'commands = python -m pytest --ignore=tests/local -m "not conformance" {posargs:-q}\n'
    )
    (sel,) = env_selections(ini)["py311"]
    assert sel == ("not conformance", [], ["tests/local"])
    assert not selects(sel, "tests/local/test_x.py", frozenset({"local"}))
    assert not selects(sel, "tests/conformance/test_c.py", frozenset({"conformance"}))
    assert selects(sel, "tests/faults/test_f.py", frozenset({"slow"}))


def test_the_envs_that_wait_for_the_interpreter_envs_wait_for_local_too() -> None:
    """conformance and realexecd start after the interpreter envs, out of their load (real
    execd's Jupyter now and then never ends a run under it); tests/local was part of that load
    and now runs in 'local', so they wait for it as well."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(Path(run.__file__).resolve().parents[1] / "tox.ini")
    waiting = {}
    for section in config.sections():
        depends = config[section].get("depends")
        if depends:
            waiting[section] = {name.strip() for name in depends.split(",")}
    assert waiting, "no env waits for another: the check would pass on nothing"
    for section, names in waiting.items():
        if {"py310", "py311", "py312", "py313"} <= names:
            assert "local" in names, section


def test_the_non_root_run_is_a_skip_ci_fails_on_where_it_cannot_make_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_as_users.os, "geteuid", lambda: 1000)
    junit = tmp_path / "junit.xml"
    assert run_as_users.main(["--junit", str(junit)]) == 0
    passed, failed, skips = run.read_junit(junit)
    assert (passed, failed, len(skips)) == (0, 0, 1), skips
    assert "needs root" in skips[0]
    assert run.design_label("nonroot", skips[0]) is None  # not by design: CI=true fails on it


def test_the_non_root_run_takes_no_lock_a_user_could_have_planted(tmp_path: Path) -> None:
    """/run/lock is every user's: a link there must not make root create a file elsewhere,
    and a lock file of another user's (whose holder could stall the run) is refused."""
    target = tmp_path / "nologin"
    link = tmp_path / "lock-link"
    link.symlink_to(target)
    with pytest.raises(OSError):
        run_as_users.shadow("true", lock_path=str(link))
    assert not target.exists()
    if os.geteuid() == 0:
        theirs = tmp_path / "lock-theirs"
        theirs.write_text("")
        os.chown(theirs, 1000, 1000)
        with pytest.raises(RuntimeError, match="not a file of root's"):
            run_as_users.shadow("true", lock_path=str(theirs))
        assert run_as_users.shadow("true", lock_path=str(tmp_path / "lock")).returncode == 0


def test_the_non_root_run_s_tun_node_is_in_a_directory_only_root_enters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 0666 tun node where every user can reach it would open the host's tun to all."""
    monkeypatch.setattr(run_as_users.os, "stat", lambda *_: os.stat_result((0o20600,) + (0,) * 9))
    made: list[str] = []
    monkeypatch.setattr(run_as_users.os, "mknod", lambda path, *_: made.append(str(path)))
    monkeypatch.setattr(run_as_users.Path, "chmod", lambda *_: None)
    wrap, where = run_as_users.tun_wrapper()
    try:
        assert where is not None and made == [str(where / "tun")] and wrap[-1] == made[0]
        info = os.lstat(where)
        assert info.st_mode & 0o777 == 0o700 and info.st_uid == os.geteuid()
    finally:
        if where is not None:
            where.rmdir()
