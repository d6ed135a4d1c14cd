"""The osb-sync command line: main(argv) in this process, and a real subprocess where the
process itself is under test (the ``-m`` entry's exit status, a terminal, a signal)."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import pty
import select
import socket
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from osb_sync import ApiError, Client, Sandbox
from osb_sync._cli import ALIASES, build_parser, main
from osb_sync.local import LocalServer
from osb_sync.local.host.bwrap import probe
from tests.fakeserver import FakeServer

OWN_ERROR = 125


@dataclass
class Ran:
    """What a command line run left: its exit status and its output."""

    returncode: int
    stdout: str
    stderr: str


def osb(*args: str, stdin: str | None = None) -> Ran:
    """Run ``osb-sync ARGS`` as ``python -m osb_sync`` would, in this process."""
    out, err, saved_stdin = io.StringIO(), io.StringIO(), sys.stdin
    sys.stdin = io.StringIO(stdin or "")
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                status = main(list(args))
            except SystemExit as stop:  # argparse: usage errors, --help, --version
                status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    finally:
        sys.stdin = saved_stdin
    return Ran(status, out.getvalue(), err.getvalue())


def osb_process(*args: str, **popen: Any) -> subprocess.CompletedProcess[str]:
    """Run ``python -m osb_sync ARGS`` as a real subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
    options: dict[str, Any] = {"capture_output": True} if not popen else popen
    return subprocess.run(
        [sys.executable, "-m", "osb_sync", *args],
        text=True,
        env=env,
        timeout=60,
        check=False,
        **options,
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_line(proc: Ran) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "HTTPConnectionPool" not in proc.stderr
    return lines[0]


@pytest.fixture
def server(shared_server: LocalServer) -> LocalServer:
    return shared_server


@pytest.fixture
def sandbox_id(shared_sandbox: Sandbox) -> str:
    return shared_sandbox.id


def count(server: LocalServer) -> int:
    with Client(server.api_base) as client:
        return len(list(client.list_sandboxes()))


# -- running code ---------------------------------------------------------------------------


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


def test_run_reads_stdin_and_files(tmp_path: Path) -> None:
    assert osb("run", "-", stdin="print('from stdin')").stdout == "from stdin\n"
    script = tmp_path / "job.sh"
    script.write_text("echo from file")
    assert osb("run", "-f", str(script), "--language", "bash").stdout == "from file\n"


def test_run_is_quiet_on_success_and_shows_the_status_message_with_v(server: LocalServer) -> None:
    quiet = osb("run", "print(1)", "--api-base", server.api_base)
    assert (quiet.returncode, quiet.stdout) == (0, "1\n")
    if server.isolated:
        assert quiet.stderr == "", quiet.stderr  # everything asked for is enforced
    proc = osb("run", "-v", "print(1)", "--api-base", server.api_base)
    shown = [line for line in proc.stderr.splitlines() if line.startswith("osb-sync: server: ")]
    assert len(shown) == 1 and "enforced" in shown[0], proc.stderr
    assert shown[0].count("Limits enforced: ") == 1 and "; not enforced: " in shown[0]


# -- exit statuses --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "status"),
    [("echo out; exit 3", 3), ("exit 7", 7), ("no-such-command", 127), ("kill -9 $$", 137)],
)
def test_bash_runs_and_exec_pass_the_remote_status_through(
    server: LocalServer, sandbox_id: str, script: str, status: int
) -> None:
    ran = osb("run", "--language", "bash", script)
    executed = osb("exec", "--api-base", server.api_base, sandbox_id, script)
    assert (ran.returncode, executed.returncode) == (status, status), ran.stderr
    if script.startswith("echo"):
        assert ran.stdout == executed.stdout == "out\n"


def test_a_run_past_its_timeout_exits_124_with_a_json_error_on_stdout() -> None:
    proc = osb("run", "--json", "--timeout", "0.5", "import time\ntime.sleep(30)")
    assert proc.returncode == 124, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["type"] == "SandboxTimeoutError" and error["exit_code"] == 124
    assert "interrupted" in error["message"]


def test_a_command_past_its_timeout_exits_124(server: LocalServer, sandbox_id: str) -> None:
    proc = osb("exec", "--api-base", server.api_base, "--timeout", "0.5", sandbox_id, "sleep 30")
    assert proc.returncode == 124 and "--timeout" in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("run",),
        ("run", "1", "-f", "x.py"),
        ("run", ""),
        ("run", "puts 1", "--language", "ruby"),
        ("list",),
        ("exec",),
        ("nonsense",),
        ("create", "--metadata", "novalue"),
        ("serve", "--api-base", "http://127.0.0.1:1/v1"),
    ],
)
def test_usage_errors_exit_125_in_one_line(args: tuple[str, ...]) -> None:
    proc = osb(*args)
    assert proc.returncode == OWN_ERROR, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.strip()


def test_empty_code_is_refused_before_a_sandbox_is_created(server: LocalServer) -> None:
    before = count(server)
    proc = osb("run", "  ", "--api-base", server.api_base)
    assert proc.returncode == OWN_ERROR and "code is empty" in one_line(proc)
    assert count(server) == before


def test_a_binary_file_is_one_clear_line(tmp_path: Path) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    proc = osb("run", "-f", str(model))
    assert proc.returncode == OWN_ERROR
    assert one_line(proc) == (
        f"osb-sync: error: {model} is not UTF-8 text (byte 0 is 0x89): run takes source code; "
        "copy a binary file into a sandbox with files.write"
    )


def test_keep_on_the_embedded_server_is_refused() -> None:
    proc = osb("run", "--keep", "print(1)")
    assert proc.returncode == OWN_ERROR and proc.stdout == ""
    assert "--keep needs a server that outlives this command" in one_line(proc)


def test_keep_on_a_server_keeps_the_sandbox(server: LocalServer) -> None:
    proc = osb("run", "--keep", "print(1)", "--api-base", server.api_base)
    kept = proc.stderr.strip().splitlines()[-1].removeprefix("osb-sync: kept sandbox ")
    with Client(server.api_base) as client:
        assert client.get_sandbox(kept).state == "Running"
        assert client.delete_sandbox(kept)


# -- failures say what to do ----------------------------------------------------------------


def test_server_down_is_one_line_with_the_fix(sleeps: list[float]) -> None:
    port = closed_port()
    proc = osb("run", "print(1)", "--api-base", f"http://127.0.0.1:{port}/v1")
    assert proc.returncode == OWN_ERROR
    assert one_line(proc) == (
        f"osb-sync: error: POST http://127.0.0.1:{port}/v1/sandboxes failed: connection refused "
        "(is the server running? start one with: osb-sync serve)"
    )
    assert sleeps == [0.5, 1.0]  # retried with backoff (recorded by the fixture, not slept)


def test_https_against_the_plain_http_server_says_use_http(server: LocalServer) -> None:
    api = server.api_base.replace("http://", "https://")
    line = one_line(osb("list", "--api-base", api))
    assert line.endswith("(the server speaks plain HTTP: use http:// instead of https://)")


def test_a_base_without_v1_says_the_api_base_usually_ends_in_v1() -> None:
    with FakeServer() as fake:
        proc = osb("create", "--api-base", fake.url)
    assert proc.returncode == OWN_ERROR
    assert one_line(proc).endswith(f"(the API base usually ends in /v1: {fake.url}/v1?)")


def test_a_wrong_key_is_one_line() -> None:
    with LocalServer(api_key="the-right-key", unenforced_network_policy="accept") as keyed:
        proc = osb("list", "--api-base", keyed.api_base, "--api-key", "a-wrong-key")
    assert proc.returncode == OWN_ERROR
    line = one_line(proc)
    assert "401" in line and "a-wrong-key" not in line


def test_runtime_error_is_one_line_with_request_id(server: LocalServer) -> None:
    proc = osb("exec", "--api-base", server.api_base, "no-such-sandbox", "true")
    assert proc.returncode == 1  # as docker exec: no such sandbox (issue 48)
    assert one_line(proc).startswith("osb-sync: error: no sandbox no-such-sandbox")
    refused = osb("create", "--api-base", server.api_base, "--lifetime", "1")
    assert refused.returncode == OWN_ERROR
    line = one_line(refused)
    assert "422" in line and "request id" in line
    debug = osb("exec", "--api-base", server.api_base, "--debug", "no-such-sandbox", "true")
    assert "Traceback" in debug.stderr


# -- managing sandboxes, global options, JSON -----------------------------------------------


def test_manage_sandboxes_on_a_server(server: LocalServer) -> None:
    api = ("--api-base", server.api_base)
    created = osb("create", *api, "--metadata", "team=ml", "--json")
    assert created.returncode == 0, created.stderr
    sandbox = json.loads(created.stdout)
    sandbox_id = sandbox["id"]
    assert sandbox["metadata"] == {"team": "ml"}  # an object, without osb-sync/create-id

    listed = osb("list", *api, "--metadata", "team=ml", "--json")
    assert json.loads(listed.stdout) == [sandbox]
    table = osb("list", *api)
    assert (
        table.stdout.splitlines()[0].split()[:2] == ["ID", "STATE"] and sandbox_id in table.stdout
    )
    assert "create-id" not in table.stdout

    got = osb("get", sandbox_id, *api, "--json")
    assert json.loads(got.stdout) == sandbox and sandbox["state"] == "Running"

    executed = osb("exec", *api, sandbox_id, "echo", "hello world")
    assert (executed.returncode, executed.stdout) == (0, "hello world\n")

    assert osb("delete", sandbox_id, *api).stdout == f"deleted {sandbox_id}\n"
    missing = osb("delete", sandbox_id, *api)
    assert (missing.returncode, missing.stdout) == (1, f"not found {sandbox_id}\n")
    as_json = osb("delete", sandbox_id, *api, "--json")
    assert json.loads(as_json.stdout) == [{"id": sandbox_id, "deleted": False}]


def test_global_options_go_before_or_after_the_command(server: LocalServer) -> None:
    before = osb("--api-base", server.api_base, "--json", "list")
    after = osb("list", "--json", "--api-base", server.api_base)
    assert before.returncode == after.returncode == 0, before.stderr
    assert isinstance(json.loads(before.stdout), list) and before.stdout == after.stdout


def test_exec_json_is_the_command_shape(server: LocalServer, sandbox_id: str) -> None:
    proc = osb("--json", "exec", "--api-base", server.api_base, sandbox_id, "echo hi; exit 4")
    assert proc.returncode == 4
    shape = json.loads(proc.stdout)
    assert set(shape) == {"id", "exit_code", "stdout", "stderr", "timed_out", "error"}
    assert (shape["exit_code"], shape["stdout"], shape["timed_out"]) == (4, "hi\n", False)


def test_errors_under_json_are_an_object_on_stdout(sleeps: list[float]) -> None:
    proc = osb("list", "--json", "--api-base", f"http://127.0.0.1:{closed_port()}/v1")
    assert proc.returncode == OWN_ERROR
    error = json.loads(proc.stdout)["error"]
    assert error["type"] == "TransportError" and "connection refused" in error["message"]


# -- conventions ----------------------------------------------------------------------------


def test_version_short_and_long() -> None:
    short, long = osb("-V"), osb("--version")
    assert short.returncode == long.returncode == 0
    assert short.stdout == long.stdout and short.stdout.startswith("osb-sync ")


def test_every_subcommand_and_option_has_help() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    summaries = {choice.dest: choice.help for choice in sub._choices_actions}
    assert set(summaries) == {
        *("run", "serve", "create", "list", "get", "inspect", "delete", "exec", "cp"),
        *("logs", "pause", "resume", "renew", "stats", "help", "completion", "images", "pull"),
    }
    for name, child in sub.choices.items():
        assert summaries[ALIASES.get(name, name)], name
        for action in child._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("run", ["{python,bash,", "(default: python)", "SECONDS"]),
        ("list", ["Pending, Running, Paused,", "any case"]),
        ("create", ["--lifetime SECONDS", "(default: an hour"]),
        ("serve", ["(default: 8080)", "(default: 127.0.0.1)"]),
        ("exec", ["exit with its status", "--timeout SECONDS"]),
    ],
)
def test_help_shows_defaults_and_choices(command: str, shown: list[str]) -> None:
    proc = osb(command, "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for piece in shown:
        assert piece in text, (piece, proc.stdout)


def test_no_progress_escapes_in_a_stderr_file_when_stdout_is_a_terminal(tmp_path: Path) -> None:
    controller, terminal = pty.openpty()
    try:
        with (tmp_path / "err").open("w") as err:
            proc = osb_process("run", "print(1)", stdout=terminal, stderr=err)
    finally:
        os.close(terminal)
        os.close(controller)
    assert proc.returncode == 0, (tmp_path / "err").read_text()
    written = (tmp_path / "err").read_bytes()
    assert b"\r" not in written and b"\x1b[" not in written, written


def test_serve_json_prints_a_start_up_line_and_ctrl_c_exits_130() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
    argv = [sys.executable, "-m", "osb_sync", "serve", "--json", "--port", "0"]
    argv.append("--allow-unenforced-network-policy")
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "no start-up line within 60 s"
        start = json.loads(proc.stdout.readline())
        assert start["api_base"].startswith("http://127.0.0.1:") and start["pid"] == proc.pid
        assert start["api_key_required"] is False
        with Client(start["api_base"]) as client:
            assert list(client.list_sandboxes()) == []
        proc.send_signal(2)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == "osb-sync: interrupted: server stopped"


def test_serve_volume_options_reach_the_server(tmp_path: Path) -> None:
    if probe().bwrap is None:
        pytest.skip(f"volumes need isolated sandboxes: {probe().problem}")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "in.txt").write_text("from the host")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
    argv = [sys.executable, "-m", "osb_sync", "serve", "--json", "--port", "0"]
    argv += ["--allow-host-path", str(tmp_path / "shared"), "--volume-root", str(tmp_path / "v")]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "no start-up line within 60 s"
        api = ("--api-base", json.loads(proc.stdout.readline())["api_base"])
        with Client(api[1]) as client:
            host = {"name": "h", "host": {"path": str(tmp_path / "shared")}, "mountPath": "/h"}
            claim = {"name": "p", "pvc": {"claimName": "keep"}, "mountPath": "/p"}
            with client.create_sandbox(volumes=[host, claim]) as sandbox:
                said = sandbox.commands.run("cat /h/in.txt; echo made > /p/out.txt")
                assert said.stdout == "from the host\n"
            outside = {**host, "host": {"path": str(tmp_path)}}
            with pytest.raises(ApiError, match="HOST_PATH_NOT_ALLOWED"):
                client.create_sandbox(volumes=[outside])
        assert (tmp_path / "v" / "keep" / "out.txt").read_text() == "made\n"
        created = osb("create", "-v", *api)
        shown = [line for line in created.stderr.splitlines() if "Limits enforced: " in line]
        assert len(shown) == 1, created.stderr
        osb("delete", created.stdout.strip(), *api)
    finally:
        proc.kill()
        proc.wait()


def test_a_create_that_never_connected_logs_no_orphan_lookup(
    caplog: pytest.LogCaptureFixture, sleeps: list[float]
) -> None:
    caplog.set_level(logging.DEBUG)
    proc = osb("create", "--api-base", f"http://127.0.0.1:{closed_port()}/v1", "--debug")
    assert proc.returncode == OWN_ERROR
    assert "POST /v1/sandboxes -> ConnectionError" in caplog.text, caplog.text
    assert "failed create" not in caplog.text and "look for a sandbox" not in caplog.text


def test_python_m_osb_sync_exits_with_the_status_main_returns(server: LocalServer) -> None:
    proc = osb_process(
        "run", "--api-base", server.api_base, "--language", "bash", "echo out; exit 3"
    )
    assert (proc.returncode, proc.stdout) == (3, "out\n"), proc.stderr
    assert osb_process("nonsense").returncode == OWN_ERROR
