"""The whole sandbox surface against the local server, over real loopback sockets."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests

import osb_sync
from osb_sync import (
    ApiError,
    Client,
    CommandFailed,
    ConfigurationError,
    NotFoundError,
    OutputLimitExceeded,
    Sandbox,
)
from osb_sync.local import LocalServer
from tests import realexecd


@pytest.fixture(scope="module")
def local() -> Iterator[LocalServer]:
    with LocalServer(
        **realexecd.server_options(),
        min_timeout=1,
        ping_interval=0.5,
        command_grace=1.0,
        unenforced_network_policy="accept",
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(local: LocalServer) -> Iterator[Client]:
    with Client(local.api_base, read_timeout=20) as c:
        yield c


@pytest.fixture(scope="module")
def sandbox(client: Client) -> Iterator[Sandbox]:
    """One sandbox for the module: each test uses files, contexts and commands of its own."""
    with client.create_sandbox() as sb:
        yield sb


# -- commands -------------------------------------------------------------------------------


def test_command_output_is_rebuilt_line_by_line(sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = sandbox.commands.run("printf 'a\\n\\nb\\n'; echo oops >&2")
    assert (result.stdout, result.stderr, result.exit_code) == ("a\n\nb\n", "oops\n", 0)
    assert result.id and result.error is None and not result.timed_out
    # The stream ends at the terminal event, not when execd closes it a second later.
    assert time.monotonic() - started < 0.9
    assert result.check() is result


def test_non_zero_exit_is_data_and_check_raises(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("echo bad >&2; exit 7")
    assert result.exit_code == 7 and result.error is not None
    with pytest.raises(CommandFailed, match="exited with 7: bad") as info:
        result.check()
    assert info.value.exit_code == 7 and isinstance(info.value, osb_sync.OpenSandboxError)


def test_command_cwd_env_and_live_lines(sandbox: Sandbox) -> None:
    sandbox.files.mkdir("work")
    out: list[str] = []
    err: list[str] = []
    result = sandbox.commands.run(
        "pwd; echo $GREETING; echo err >&2",
        cwd="work",
        env={"GREETING": "hi"},
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert result.stdout.endswith("/work\nhi\n")
    # all the output, once, through its callback, in pieces (lines, or parts of lines)
    assert ("".join(out), "".join(err)) == (result.stdout, "err\n")


ARGV_CODE = "import json, sys; print(json.dumps(sys.argv[1:]))"


def test_an_argv_passes_each_argument_unchanged(sandbox: Sandbox) -> None:
    """Issue 45: an argv runs without a shell (execd 1.1.0+; on June's execd, tox -e
    realexecd, as a quoted shell command after its 400)."""
    args = ["a b", "$HOME", "", "it's", '"q"', "*", "; echo no"]
    result = sandbox.commands.run(["python3", "-c", ARGV_CODE, *args])
    assert (result.exit_code, result.stdout) == (0, json.dumps(args) + "\n"), result.stderr
    again = sandbox.commands.run(("python3", "-c", ARGV_CODE, "x"), env={"A": "1"})
    assert again.stdout == '["x"]\n'
    background = sandbox.commands.start(["sh", "-c", "echo $0 $1", "zero", "one two"])
    assert background.wait(timeout=10).exit_code == 0
    assert background.logs()[0] == "zero one two\n"


@pytest.mark.parametrize("argv", [[], [""], ["ls", 3], ["ls", "a\0b"], "  "])
def test_a_bad_argv_is_refused_before_any_request(sandbox: Sandbox, argv: object) -> None:
    with pytest.raises(ConfigurationError, match=r"argv|command"):
        sandbox.commands.run(argv)  # type: ignore[arg-type]


def test_command_timeout_is_a_result(sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = sandbox.commands.run("sleep 30", timeout=0.5)
    assert result.timed_out and result.exit_code == -1
    assert time.monotonic() - started < 5
    with pytest.raises(CommandFailed, match="timed out"):
        result.check()


def test_stream_command_and_early_exit_interrupts(sandbox: Sandbox) -> None:
    with sandbox.commands.stream("echo start; sleep 30") as stream:
        for event in stream:
            if event.type == "stdout":
                break
        command_id = stream.execution_id
    assert command_id is not None
    status = sandbox.commands.get(command_id).wait(timeout=10)
    assert not status.running


def test_background_command_logs_status_wait(sandbox: Sandbox) -> None:
    command = sandbox.commands.start("for i in 1 2 3; do echo line$i; sleep 0.1; done")
    assert "".join(command.iter_logs(poll_interval=0.05)) == "line1\nline2\nline3\n"
    status = command.wait(timeout=5)
    assert (status.running, status.exit_code) == (False, 0)
    assert status.started_at is not None and status.finished_at is not None
    text, cursor = command.logs()
    assert text == "line1\nline2\nline3\n" and command.logs(cursor) == ("", cursor)


def test_background_command_kill(sandbox: Sandbox) -> None:
    command = sandbox.commands.start("sleep 30")
    assert command.status().running
    command.kill()
    assert not command.wait(timeout=10).running
    with pytest.raises(osb_sync.SandboxTimeoutError):
        sandbox.commands.start("sleep 30").wait(timeout=0.3)


def test_bash_session_keeps_state_and_is_deleted(sandbox: Sandbox) -> None:
    with sandbox.commands.session() as session:
        assert session.run("cd /tmp && export X=42").exit_code == 0
        result = session.run("pwd; echo $X; echo e >&2")
        assert result.stdout == "/tmp\n42\ne\n"
    with pytest.raises(ApiError):
        session.run("true")


# -- code contexts --------------------------------------------------------------------------


def test_named_contexts(sandbox: Sandbox) -> None:
    ctx = sandbox.contexts.create("python")
    sandbox.run_code("y = 21", context=ctx)
    expected = [{"text": "42"}]
    result = realexecd.run_expecting(
        sandbox, "y * 2", "named_contexts", setup="y = 21", context=ctx, results=expected
    )
    assert result.results == expected
    assert sandbox.run_code("y * 2", context=ctx.id, language="python").execution_id == ctx.id
    assert ctx in sandbox.contexts.list("python")
    assert sandbox.contexts.get(ctx.id) == ctx
    sandbox.contexts.delete(ctx)
    with pytest.raises(NotFoundError):
        sandbox.contexts.get(ctx.id)
    sandbox.contexts.create("python")
    sandbox.contexts.delete_all("python")
    assert sandbox.contexts.list("python") == []


def test_interrupt_code_by_context_id(sandbox: Sandbox) -> None:
    ctx = sandbox.contexts.create("python")
    with sandbox.stream_code(
        "import time\nprint('go', flush=True)\ntime.sleep(30)", context=ctx
    ) as s:
        next(e for e in s if e.type == "stdout")
        sandbox.contexts.interrupt(ctx.id)
        result = s.result()
    assert result.error is not None and "KeyboardInterrupt" in result.error.name


# -- files ----------------------------------------------------------------------------------


def test_files_round_trip(sandbox: Sandbox, tmp_path: Path) -> None:
    files = sandbox.files
    files.write("d/a.txt", "h\u00e9llo\n")
    files.write("d/b.bin", b"\x00\x01\x02", mode=0o600)
    files.write_many([("d/c.txt", "c"), ("d/e/f.txt", b"f", 0o640)])
    assert files.read_text("d/a.txt") == "h\u00e9llo\n"
    assert files.read_bytes("d/b.bin") == b"\x00\x01\x02"
    assert b"".join(files.iter_bytes("d/a.txt", start=1)) == "h\u00e9llo\n".encode()[1:]
    info = files.info("d/b.bin")["d/b.bin"]
    assert (info.type, info.size, info.mode) == ("file", 3, 0o600)
    assert info.modified_at is not None and info.modified_at.tzinfo is not None
    assert {Path(i.path).name for i in files.list("d")} >= {"a.txt", "b.bin", "c.txt", "e"}
    assert {Path(i.path).name for i in files.search("d", "*.txt")} == {"a.txt", "c.txt", "f.txt"}
    assert files.replace("d/a.txt", "llo", "LLO") == 1
    files.move("d/c.txt", "d/moved.txt")
    files.chmod("d/moved.txt", 0o604)
    assert files.info("d/moved.txt")["d/moved.txt"].mode == 0o604
    files.remove("d/moved.txt")
    assert not files.exists("d/moved.txt") and files.exists("d/a.txt")
    files.rmtree("d/e")
    assert not files.exists("d/e")


def test_upload_and_download_stream_from_disk(sandbox: Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    source.write_bytes(bytes(range(256)) * 8192)  # 2 MiB
    sandbox.files.upload(source, "big.bin")
    target = tmp_path / "back.bin"
    assert sandbox.files.download("big.bin", target) == source.stat().st_size
    assert target.read_bytes() == source.read_bytes()
    with source.open("rb") as handle:
        handle.seek(100)
        sandbox.files.write("tail.bin", handle)
    assert sandbox.files.read_bytes("tail.bin") == source.read_bytes()[100:]


def test_read_bytes_is_capped(sandbox: Sandbox) -> None:
    sandbox.files.write("ten.txt", "x" * 10)
    assert sandbox.files.read_bytes("ten.txt", max_bytes=10) == b"x" * 10
    with pytest.raises(OutputLimitExceeded, match="exceeded 9 bytes"):
        sandbox.files.read_bytes("ten.txt", max_bytes=9)


def test_missing_file_is_not_found_with_the_path(sandbox: Sandbox) -> None:
    with pytest.raises(NotFoundError, match=r"no/such\.txt"):
        sandbox.files.read_bytes("no/such.txt")
    with pytest.raises(NotFoundError, match=r"no/such\.txt"):
        sandbox.files.info("no/such.txt")


def test_bad_file_arguments(sandbox: Sandbox) -> None:
    with pytest.raises(ConfigurationError):
        sandbox.files.write("", "x")
    with pytest.raises(ConfigurationError):
        sandbox.files.replace("a", "", "b")


# -- the sandbox itself ---------------------------------------------------------------------


def test_metrics_and_ping(client: Client, sandbox: Sandbox) -> None:
    metrics = sandbox.metrics()
    assert metrics.cpu_count >= 1 and metrics.mem_total_mib > 0
    assert sandbox.ping() is True
    stranger = Sandbox.from_execd(sandbox.execd_url)
    assert stranger.ping() is False  # no execd token


def test_a_bare_execd_handle_runs_everything_but_the_lifecycle(sandbox: Sandbox) -> None:
    with Sandbox.from_execd(sandbox.execd_url, headers=sandbox.execd_headers) as bare:
        assert bare.id == sandbox.execd_url and bare != sandbox
        result = realexecd.run_expecting(bare, "6 * 7", "bare_execd", results=[{"text": "42"}])
        assert result.results == [{"text": "42"}]
        assert bare.commands.run("echo hi").stdout == "hi\n"
        bare.files.write("bare.txt", "seen")
        assert sandbox.files.read_text("bare.txt") == "seen"
        context = bare.contexts.create()
        assert context.id in {c.id for c in sandbox.contexts.list("python")}
        with pytest.raises(ConfigurationError, match="no lifecycle API"):
            bare.info()
    assert sandbox.ping()  # leaving the bare handle's block deleted nothing


def test_reach_a_web_app_in_the_sandbox(sandbox: Sandbox) -> None:
    sandbox.files.write("www/index.html", "hello from the sandbox")
    port = 18000 + int(time.time() * 1000) % 2000
    server = sandbox.commands.start(f"python3 -m http.server {port} --bind 127.0.0.1", cwd="www")
    endpoint = sandbox.get_endpoint(port)
    assert endpoint.url.startswith("http://") and endpoint.headers
    deadline = time.monotonic() + 10
    while True:
        response = requests.get(endpoint.url + "/index.html", headers=endpoint.headers, timeout=5)
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    server.kill()
    assert response.text == "hello from the sandbox"


def test_lifecycle_management(client: Client) -> None:
    with client.create_sandbox(metadata={"suite": "surface"}) as sandbox:
        info = sandbox.info()
        assert info.state == "Running" and info.metadata["suite"] == "surface"
        before = info.expires_at
        renewed = sandbox.renew(3600)
        assert before is not None and renewed is not None and renewed > before
        patched = sandbox.patch_metadata({"suite": None, "team": "ml"})
        assert "suite" not in patched.metadata and patched.metadata["team"] == "ml"
        assert [s.id for s in client.list_sandboxes(metadata={"team": "ml"})] == [sandbox.id]
        sandbox.pause()
        assert sandbox.info().state == "Paused"
        assert sandbox.id in [s.id for s in client.list_sandboxes(states=["Paused"])]
        with pytest.raises(ApiError) as info_error:
            sandbox.pause()
        assert info_error.value.status_code == 409
        sandbox.resume()
        result = realexecd.run_expecting(sandbox, "print('back')", "lifecycle", stdout="back\n")
        assert result.stdout == "back\n"


def test_no_timeout_sandbox_never_expires(client: Client) -> None:
    with client.create_sandbox(timeout=osb_sync.NO_TIMEOUT) as sandbox:
        assert sandbox.info().expires_at is None


def test_delete_all_by_metadata(client: Client) -> None:
    with pytest.raises(ConfigurationError):
        client.delete_all(metadata={})
    keep = client.create_sandbox(metadata={"batch": "keep"})
    doomed = {client.create_sandbox(metadata={"batch": "doomed"}).id for _ in range(2)}
    assert set(client.delete_all(metadata={"batch": "doomed"})) == doomed
    assert client.get_sandbox(keep.id).state == "Running"
    keep.delete()


def test_renew_expiry_is_rfc3339_utc(client: Client, sandbox: Sandbox) -> None:
    expiry = sandbox.renew(120)
    assert expiry is not None
    remaining = (expiry - datetime.now(timezone.utc)).total_seconds()
    assert 100 < remaining <= 121


@pytest.mark.ours_only("June's execd does not reread EXECD_ENVS for each command (1.1.1's does)")
def test_set_env_reaches_every_later_command(sandbox: Sandbox) -> None:
    """Issue 45: commands.set_env appends to the EXECD_ENVS file, which execd rereads for
    every command; a command's own env still wins."""
    sandbox.commands.set_env("OSB_GREETING", "hello world")
    sandbox.commands.set_env("OSB_QUOTED", 'it\'s $HOME \\ "q"')
    result = sandbox.commands.run('echo "$OSB_GREETING"; echo "$OSB_QUOTED"')
    home = sandbox.commands.run('echo "$HOME"').stdout.strip()
    assert result.stdout == f'hello world\nit\'s {home} \\ "q"\n'
    own = sandbox.commands.run('echo "$OSB_GREETING"', env={"OSB_GREETING": "mine"})
    assert own.stdout == "mine\n"
    argv = sandbox.commands.run(["sh", "-c", 'echo "$OSB_GREETING"'])
    assert argv.stdout == "hello world\n"
    with pytest.raises(ConfigurationError, match="key must match"):
        sandbox.commands.set_env("1BAD", "x")
    with pytest.raises(ConfigurationError, match="NUL"):
        sandbox.commands.set_env("OK", "a\0b")


def test_read_text_picks_lines(sandbox: Sandbox) -> None:
    """Issue 45: line downloads (execd 1.1.1; June's execd sends the whole file and the client
    picks the lines: tox -e realexecd)."""
    sandbox.files.write("lines.txt", "first\r\nsecond line\n\nfourth\n")
    assert sandbox.files.read_text("lines.txt", offset=2, limit=1) == "second line"
    assert sandbox.files.read_text("lines.txt", offset=2) == "second line\n\nfourth"
    assert sandbox.files.read_text("lines.txt", limit=1) == "first"
    assert sandbox.files.read_text("lines.txt", offset=10) == ""
