"""The osb-sync command line, run as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from osb_sync.local import LocalServer


def osb(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
    return subprocess.run(
        [sys.executable, "-m", "osb_sync", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with LocalServer(unenforced_network_policy="accept", command_grace=0) as srv:
        yield srv


def test_run_prints_42_on_the_embedded_server() -> None:
    proc = osb("run", "print(6*7)")
    assert (proc.returncode, proc.stdout) == (0, "42\n"), proc.stderr


def test_run_prints_the_value_and_streams_stderr() -> None:
    proc = osb("run", "import sys\nprint('to err', file=sys.stderr)\n6*7")
    assert (proc.returncode, proc.stdout) == (0, "42\n")
    assert "to err" in proc.stderr


def test_run_exits_1_when_the_code_raises() -> None:
    proc = osb("run", "1/0")
    assert proc.returncode == 1
    assert "ZeroDivisionError" in proc.stderr and proc.stdout == ""


def test_run_reads_stdin_and_files(tmp_path: os.PathLike[str]) -> None:
    assert osb("run", "-", stdin="print('from stdin')").stdout == "from stdin\n"
    script = os.path.join(tmp_path, "job.sh")
    with open(script, "w") as handle:
        handle.write("echo from file")
    assert osb("run", "-f", script, "--language", "bash").stdout == "from file\n"


@pytest.mark.parametrize(
    "args",
    [
        ("run",),
        ("run", "1", "-f", "x.py"),
        ("list",),
        ("exec",),
        ("nonsense",),
        ("create", "--metadata", "novalue"),
    ],
)
def test_usage_errors_exit_2_without_traceback(args: tuple[str, ...]) -> None:
    proc = osb(*args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip()


def test_manage_sandboxes_on_a_server(server: LocalServer) -> None:
    api = ("--api-base", server.api_base)
    created = osb("create", *api, "--metadata", "team=ml", "--json")
    assert created.returncode == 0, created.stderr
    sandbox_id = json.loads(created.stdout)["id"]

    listed = osb("list", *api, "--metadata", "team=ml", "--json")
    assert [row["id"] for row in json.loads(listed.stdout)] == [sandbox_id]
    table = osb("list", *api)
    assert (
        table.stdout.splitlines()[0].split()[:2] == ["ID", "STATE"] and sandbox_id in table.stdout
    )

    got = osb("get", sandbox_id, *api, "--json")
    assert json.loads(got.stdout)["state"] == "Running"

    executed = osb("exec", *api, sandbox_id, "echo", "hello world")
    assert (executed.returncode, executed.stdout) == (0, "hello world\n")
    failed = osb("exec", *api, sandbox_id, "exit 3")
    assert failed.returncode == 1

    assert osb("delete", sandbox_id, *api).stdout == f"deleted {sandbox_id}\n"
    missing = osb("delete", sandbox_id, *api)
    assert (missing.returncode, missing.stdout) == (1, f"not found {sandbox_id}\n")


def test_runtime_error_is_one_line_with_request_id(server: LocalServer) -> None:
    proc = osb("get", "no-such-sandbox", "--api-base", server.api_base)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert "404" in line and "request id" in line
    debug = osb("get", "no-such-sandbox", "--api-base", server.api_base, "--debug")
    assert "Traceback" in debug.stderr
