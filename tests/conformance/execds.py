"""The two execds under comparison: the real one (run-execd) and the local server's.

Both are reached as a user reaches them: through ``Sandbox`` handles of the public client.
The real execd has no lifecycle server in front of it: its handle comes from
``Sandbox.from_execd``.
"""

from __future__ import annotations

import itertools
import os
import platform
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from osb_sync import Sandbox

TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"
DIR_ENV = "OSB_REAL_EXECD_DIR"  # a folder holding run-execd and execd
REQUIRE_ENV = "OSB_REQUIRE_REAL_EXECD"  # "1": a missing or unusable real execd fails the suite
START_TIMEOUT = 300.0  # the first start builds the Jupyter venv (about 40 s on a quiet machine)
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Target:
    """One execd under test: a handle on it and a private directory for the files scenarios."""

    name: str
    sandbox: Sandbox
    root: Path
    _counter: Iterator[int] = field(default_factory=itertools.count)

    def fresh_dir(self) -> str:
        """An absolute path under ``root`` that does not exist yet (a scenario's own folder)."""
        return str(self.root / f"s{next(self._counter)}")

    def handle(self, headers: dict[str, str]) -> Sandbox:
        """Another handle on the same execd endpoint, with other headers (no token, say)."""
        return Sandbox.from_execd(self.sandbox.execd_url, headers=headers)


@contextmanager
def impatient(target: Target, read_timeout: float) -> Iterator[Sandbox]:
    """A handle on the target's execd whose client waits at most ``read_timeout`` for data
    (real execd never answers some calls)."""
    sandbox = target.sandbox
    with Sandbox.from_execd(
        sandbox.execd_url, headers=sandbox.execd_headers, read_timeout=read_timeout
    ) as handle:
        yield handle


def real_execd_dir() -> Path | None:
    """run-execd's folder: ``$OSB_REAL_EXECD_DIR``, else ``shared/opensandbox-execd`` beside
    the repository (CI: ``../shared``) or beside one of its parents (a worktree)."""
    override = os.environ.get(DIR_ENV)
    if override:
        return Path(override)
    for parent in REPO_ROOT.parents:
        candidate = parent / "shared" / "opensandbox-execd"
        if (candidate / "run-execd").is_file():
            return candidate
    return None


def unusable_reason(folder: Path | None) -> str | None:
    """Why the real execd cannot run here, or None when it can."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"the real execd is a Linux x86-64 binary ({platform.system()} {platform.machine()})"
    if folder is None:
        return f"run-execd not found beside the repository (set {DIR_ENV})"
    for name in ("run-execd", "execd"):
        if not os.access(folder / name, os.X_OK):
            return f"{folder / name} is missing or not executable"
    if shutil.which("curl") is None:
        return "run-execd needs curl"
    return None


def skip_or_fail(reason: str) -> None:
    """Skip, unless the environment demands the real execd (CI): then fail."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def real_execd(workdir: Path) -> Iterator[tuple[str, str]]:
    """Start the real execd with an access token; yields its endpoint and the token."""
    folder = real_execd_dir()
    reason = unusable_reason(folder)
    if reason is not None:
        skip_or_fail(reason)
    assert folder is not None
    script = str(folder / "run-execd")
    token = secrets.token_hex(16)
    port = free_port()
    started = subprocess.run(
        [script, "start", str(workdir), str(port), token],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    try:
        if started.returncode != 0:
            skip_or_fail(f"run-execd start failed: {started.stderr.strip()[-2000:]}")
        yield f"127.0.0.1:{port}", token
    finally:
        subprocess.run([script, "stop", str(workdir)], timeout=60, check=False)
