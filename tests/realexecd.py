"""The client suites on the real execd: which execd the local server runs, and lossy retries.

``OSB_TEST_EXECD`` (tox -e realexecd sets it): a path to an execd binary, or ``shared`` for the
build in ``shared/opensandbox-execd`` (see tests/conformance/execds.py); ``OSB_TEST_JUPYTER``:
the ``jupyter`` executable behind it (default: run-execd's venv). Servers of the client suites
take ``server_options()``; without ``OSB_TEST_EXECD`` they run our own execd.

Real execd now and then closes a ``/code`` stream before its last events (README of
shared/opensandbox-execd). ``until_complete`` runs again, in a fresh context, an attempt whose
outcome lacks only trailing output, at most ``MAX_RETRIES`` times; every retry is recorded,
printed at once and listed at the end of the run (tests/sockets/conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from osb_sync import CodeContext, ExecutionResult, Sandbox
from osb_sync.local.host.bwrap import probe
from tests.conformance.execds import real_execd_dir, skip_or_fail
from tests.conformance.outcome import lacks_trailing

EXECD_ENV = "OSB_TEST_EXECD"
JUPYTER_ENV = "OSB_TEST_JUPYTER"
VENV_ENV = "OSB_EXECD_JUPYTER_VENV"
MAX_RETRIES = 3
RETRIES: list[str] = []
T = TypeVar("T")


def in_use() -> bool:
    """True when the client suites run on an execd binary instead of ours."""
    return bool(os.environ.get(EXECD_ENV))


def default_venv() -> Path:
    """run-execd's Jupyter venv."""
    if os.environ.get(VENV_ENV):
        return Path(os.environ[VENV_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache) / "osb-execd-jupyter"


def server_options() -> dict[str, Any]:
    """``execd=``/``jupyter=`` for LocalServer under ``OSB_TEST_EXECD``, else nothing.

    Skips (fails under ``OSB_REQUIRE_REAL_EXECD=1``) when the binary or venv is missing.
    """
    wanted = os.environ.get(EXECD_ENV)
    if not wanted:
        return {}
    if wanted == "shared":
        folder = real_execd_dir()
        if folder is None:
            skip_or_fail("shared/opensandbox-execd not found (set OSB_REAL_EXECD_DIR)")
        assert folder is not None
        wanted = str(folder / "execd")
    if probe().bwrap is None:
        skip_or_fail(f"an execd binary needs isolated sandboxes: {probe().problem}")
    jupyter = os.environ.get(JUPYTER_ENV) or str(default_venv() / "bin" / "jupyter")
    if not os.access(wanted, os.X_OK):
        skip_or_fail(f"the execd binary {wanted} is missing or not executable")
    if not os.access(jupyter, os.X_OK):
        skip_or_fail(f"{jupyter} is missing (run-execd start builds its Jupyter venv)")
    return {"execd": wanted, "jupyter": jupyter}


def record(test: str, attempt: int, lost: list[str]) -> None:
    line = f"{test}: retry {attempt}, real execd lacked trailing output in {lost}"
    RETRIES.append(line)
    print(f"real-execd retry: {line}")


def until_complete(
    test: str,
    attempt: Callable[[int], T],
    observed: Callable[[T], dict[str, Any]],
    expected: dict[str, Any],
) -> T:
    """``attempt(0)``; under a real execd, ``attempt(n)`` again (n = 1..3, each in a fresh
    context) while what it ``observed`` lacks only trailing parts of ``expected``.

    Returns the last attempt's value: the test asserts on it as it would on the first.
    """
    value = attempt(0)
    for number in range(1, MAX_RETRIES + 1):
        seen = observed(value)
        lost = sorted(k for k in expected if seen.get(k) != expected[k])
        if not in_use() or not lost or not all(lacks_trailing(seen[k], expected[k]) for k in lost):
            break
        record(test, number, lost)
        value = attempt(number)
    return value


def run_expecting(
    sandbox: Sandbox,
    code: str,
    test: str,
    setup: str = "",
    context: CodeContext | None = None,
    **expected: Any,
) -> ExecutionResult:
    """``sandbox.run_code(code, context=context)``, retried as ``until_complete`` says against
    ``expected`` (fields of ExecutionResult); a retry runs ``setup`` then ``code`` in a new
    context."""

    def attempt(number: int) -> ExecutionResult:
        if number == 0:
            return sandbox.run_code(code, context=context)
        fresh = sandbox.contexts.create("python")
        if setup:
            sandbox.run_code(setup, context=fresh)
        return sandbox.run_code(code, context=fresh)

    return until_complete(test, attempt, lambda r: vars(r), expected)
