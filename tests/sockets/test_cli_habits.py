"""Issue 48: the command line as a docker and kubectl user drives it, one test per row of the
issue's table, each in a real subprocess against the one shared local server (rows that need
no server need none)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from osb_sync import Client, ConfigurationError, Sandbox
from osb_sync._cli import build_parser
from osb_sync.local import LocalServer
from tests.sockets.test_cli import OWN_ERROR, osb_process

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(shared_server: LocalServer) -> LocalServer:
    return shared_server


@pytest.fixture
def sid(shared_sandbox: Sandbox) -> str:
    return shared_sandbox.id


def osb(
    server: LocalServer | None, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """``osb-sync ARGS`` in a subprocess, against ``server`` when one is given."""
    api = ("--api-base", server.api_base) if server else ()
    return osb_process(*api, *args, input=stdin, capture_output=True)


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip().splitlines()[-1]


@pytest.fixture
def labelled(server: LocalServer, request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Ids of the sandboxes a test makes (labelled with its name), deleted after it."""
    made: list[str] = []
    yield made
    with Client(server.api_base) as client:
        for sandbox_id in made:
            client.delete_quietly(sandbox_id)


def create(server: LocalServer, made: list[str], *args: str) -> str:
    proc = osb(server, "create", *args)
    assert proc.returncode == 0, proc.stderr
    made.append(proc.stdout.strip())
    return made[-1]


# -- 1: docker's verbs ------------------------------------------------------------------------


def test_1_ps_and_unpause_are_aliases_and_stop_suggests_what_it_means(
    server: LocalServer, sid: str
) -> None:
    listed = osb(server, "ps", "-q")
    assert listed.returncode == 0 and sid in listed.stdout.split(), listed.stderr
    resumed = osb(server, "unpause", "no-such-48")  # resume's handler and its answer
    assert (resumed.returncode, resumed.stdout) == (1, "not found no-such-48\n"), resumed.stderr
    assert osb(None, "unpause", "--help").stdout.startswith("usage: osb-sync resume")
    for verb, meaning in (("stop", "'pause' keeps a sandbox, 'rm' deletes it"), ("kill", "'rm'")):
        proc = osb(None, verb, sid)
        assert proc.returncode == OWN_ERROR and meaning in last_line(proc)
        assert "did you mean" not in proc.stderr


# -- 2: docker's flags ------------------------------------------------------------------------


def test_2_run_rm_rm_f_and_create_name(server: LocalServer, labelled: list[str]) -> None:
    ran = osb(server, "run", "--rm", "print(1)")
    assert (ran.returncode, ran.stdout) == (0, "1\n"), ran.stderr
    both = osb(server, "run", "--rm", "--keep", "print(1)")
    assert both.returncode == OWN_ERROR and "--keep or --rm" in last_line(both)
    named = create(server, labelled, "--name", "web-48")
    found = osb(server, "ls", "-q", "--metadata", "name=web-48")
    assert found.stdout.split() == [named]
    clash = osb(server, "create", "--name", "a", "--metadata", "name=b")
    assert clash.returncode == OWN_ERROR and "name=NAME" in last_line(clash)
    removed = osb(server, "rm", "-f", named)
    assert (removed.returncode, removed.stdout) == (0, f"deleted {named}\n"), removed.stderr


def test_2_an_unknown_flag_shows_the_verbs_usage_not_the_top_level_one() -> None:
    proc = osb(None, "rm", "--nope", "x")
    assert proc.returncode == OWN_ERROR
    assert proc.stderr.startswith("usage: osb-sync delete"), proc.stderr
    assert "osb-sync delete: error: unrecognized arguments: --nope" in proc.stderr


# -- 3: id prefixes ---------------------------------------------------------------------------


def test_3_a_unique_prefix_names_the_sandbox(server: LocalServer, sid: str) -> None:
    ran = osb(server, "exec", sid[:8], "echo", "hi")
    assert (ran.returncode, ran.stdout) == (0, "hi\n"), ran.stderr
    got = osb(server, "get", "--json", sid[:10])
    assert json.loads(got.stdout)["id"] == sid, got.stderr


def test_3_ambiguous_unknown_and_empty_prefixes(server: LocalServer, sid: str) -> None:
    with Client(server.api_base) as client:
        ids = [s.id for s in client.list_sandboxes()]
    # a prefix every listed id starts with: the empty one is refused, not "all of them"
    empty = osb(server, "exec", "", "true")
    assert empty.returncode == OWN_ERROR and "empty sandbox id" in last_line(empty)
    unknown = osb(server, "exec", "zz-no-such", "true")
    assert unknown.returncode == 1
    assert last_line(unknown).startswith("osb-sync: error: no sandbox zz-no-such (nor one")
    # two sandboxes whose ids share a first character: that character is ambiguous
    extra: list[str] = []
    try:
        with Client(server.api_base) as client:
            while (
                not any(a[0] == b[0] for i, a in enumerate(ids) for b in ids[i + 1 :])
                and len(extra) < 20
            ):
                extra.append(client.create_sandbox(timeout=120).id)
                ids.append(extra[-1])
        first = next(a[0] for i, a in enumerate(ids) for b in ids[i + 1 :] if a[0] == b[0])
        sharing = sorted(i for i in ids if i.startswith(first))
        proc = osb(server, "exec", first, "true")
        assert proc.returncode == 1, proc.stderr
        line = last_line(proc)
        assert f"sandbox id '{first}' is ambiguous" in line and sharing[0] in line
        removed = osb(server, "rm", first)  # nothing is deleted on a guess
        assert removed.returncode == 1 and "ambiguous" in last_line(removed)
        with Client(server.api_base) as client:
            assert all(client.get_sandbox(i) for i in sharing)
    finally:
        with Client(server.api_base) as client:
            for sandbox_id in extra:
                client.delete_quietly(sandbox_id)


def test_3_a_whole_id_wins_over_a_prefix_of_another() -> None:
    from osb_sync._cli_sandboxes import resolve_id
    from osb_sync._models import SandboxInfo

    class Listing:
        """Two sandboxes, 'ab' and 'abc': 'ab' is one whole id and a prefix of the other."""

        ids = ("ab", "abc")

        def get_sandbox(self, sandbox_id: str) -> SandboxInfo:
            if sandbox_id not in self.ids:
                from osb_sync import NotFoundError

                raise NotFoundError("no", status_code=404, code="SANDBOX_NOT_FOUND")
            return SandboxInfo.from_dict({"id": sandbox_id, "status": {"state": "Running"}})

        def list_sandboxes(self) -> Iterator[SandboxInfo]:
            return iter(self.get_sandbox(i) for i in self.ids)

    assert resolve_id(Listing(), "ab") == "ab"  # type: ignore[arg-type]
    assert resolve_id(Listing(), "abc") == "abc"  # type: ignore[arg-type]


# -- 4: lifetimes -----------------------------------------------------------------------------


def test_4_create_lives_an_hour_and_not_found_says_it_may_have_expired(
    server: LocalServer, labelled: list[str]
) -> None:
    made = create(server, labelled)
    with Client(server.api_base) as client:
        info = client.get_sandbox(made)
    assert info.expires_at and info.created_at
    assert (info.expires_at - info.created_at).total_seconds() >= 3500
    gone = osb(server, "exec", "4" * 36, "true")
    assert gone.returncode == 1 and "sandboxes expire; this one may have" in last_line(gone)


# -- 5, 6: exec's options -----------------------------------------------------------------------


def test_5_options_after_the_sandbox_id_get_a_hint(sid: str) -> None:
    proc = osb(None, "exec", sid, "-e", "FOO=bar", "env")
    assert proc.returncode == OWN_ERROR
    assert "options go before the sandbox id" in last_line(proc)
    assert proc.stderr.startswith("usage: osb-sync exec")


def test_5_every_exec_option_is_one(sid: str) -> None:
    from osb_sync._cli import EXEC_OPTIONS

    parser = build_parser()
    for flag in EXEC_OPTIONS:  # the hint's list is the parser's: each flag parses
        value = {"--timeout": ["1"], "--max-output": ["1KB"], "-e": ["A=1"], "--env": ["A=1"]}
        args = [
            flag,
            *value.get(flag, ["x"] if flag in ("-w", "--workdir", "-u", "--user") else []),
        ]
        parser.parse_args(["exec", *args, sid, "true"])


def test_6_a_workdir_that_is_no_directory_exits_126_naming_it(
    server: LocalServer, sid: str
) -> None:
    proc = osb(server, "exec", "-w", "/nope", sid, "pwd")
    assert proc.returncode == 126, proc.stderr
    line = last_line(proc)
    assert "/nope" in line and "INVALID_REQUEST_BODY" not in line and "POST" not in line


# -- 7: run takes code ----------------------------------------------------------------------


def test_7_run_with_an_image_first_says_where_the_image_goes(server: LocalServer) -> None:
    proc = osb(server, "run", "python:3.12", "python", "-c", "print(1)")
    assert proc.returncode == OWN_ERROR and proc.stderr.startswith("usage: osb-sync run")
    assert "osb-sync run --image python:3.12 'CODE'" in last_line(proc)
    alone = osb(server, "run", "python:3.12")  # valid Python (an annotation): refused
    assert alone.returncode == OWN_ERROR and "--image python:3.12" in last_line(alone)
    word = osb(server, "run", "busybox")
    assert word.returncode == 1 and "NameError" in word.stderr
    assert "osb-sync run --image busybox" in word.stderr.strip().splitlines()[-1]
    code = osb(server, "run", "print(2)")
    assert (code.returncode, code.stderr) == (0, "")


# -- 8: --json, images ls, stats ----------------------------------------------------------------


def test_8_logs_json_images_ls_and_stats_of_every_sandbox(
    server: LocalServer, sid: str, tmp_path: Path
) -> None:
    started = osb(server, "exec", "-d", sid, "echo out")
    command_id = started.stdout.strip()
    time.sleep(0.3)
    logged = osb(server, "logs", "--json", sid, command_id)
    assert json.loads(logged.stdout) == {"id": sid, "command_id": command_id, "output": "out\n"}
    own = json.loads(osb(server, "logs", "--json", sid[:9]).stdout)
    assert own["id"] == sid and isinstance(own["log"], str)
    refused = osb(server, "logs", "--json", "-f", sid)
    assert refused.returncode == OWN_ERROR and "--json" in last_line(refused)
    store = ("--image-store", str(tmp_path))
    assert osb(None, "images", "ls", *store).stdout == osb(None, "images", *store).stdout
    assert osb(None, "images", "ls", *store).returncode == 0
    stats = osb(server, "stats", "--json")
    assert stats.returncode == 0 and sid in [s["id"] for s in json.loads(stats.stdout)]


# -- 9: rm --all --------------------------------------------------------------------------------


def test_9_rm_all_asks_on_a_terminal_and_refuses_without_one(server: LocalServer) -> None:
    refused = osb(server, "rm", "--all")  # standard input is a pipe: no question, no deletion
    assert refused.returncode == OWN_ERROR and "--yes" in last_line(refused)
    assert osb(server, "rm", "--all", "-f").returncode == OWN_ERROR  # -f answers nothing
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
    argv = [sys.executable, "-m", "osb_sync", "rm", "--all", "--api-base", server.api_base]
    main, child = pty.openpty()
    proc = subprocess.Popen(argv, stdin=child, stdout=subprocess.PIPE, stderr=child, env=env)
    os.close(child)
    said = b""
    deadline = time.monotonic() + 30
    while b"[y/N]" not in said and time.monotonic() < deadline:
        if select.select([main], [], [], 1)[0]:
            said += os.read(main, 1024)
    os.write(main, b"n\n")
    out, _ = proc.communicate(timeout=30)
    os.close(main)
    assert b"delete all" in said and b"anyone's" in said
    assert proc.returncode == 0 and out == b""
    with Client(server.api_base) as client:
        assert list(client.list_sandboxes())  # the shared sandbox is still there


# -- 10: what pull reads, run reads --------------------------------------------------------------


def test_10_run_reads_an_oci_layout_under_allow_image_path(tmp_path: Path) -> None:
    from tests.imagekit import busybox_image, write_layout

    layout = write_layout(tmp_path / "img", "box", [busybox_image([])])
    image = ("--image", f"oci:{layout}:box")
    refused = osb(None, "run", *image, "print(1)")
    assert refused.returncode == OWN_ERROR
    assert "(--allow-image-path DIR: of run, or of osb-sync serve)" in last_line(refused)
    read = osb(None, "run", "--allow-image-path", str(tmp_path), *image, "print(1)")
    # read, unpacked and found without python3 (the built-in execd's need): no longer refused
    assert read.returncode == OWN_ERROR and "has no python3" in last_line(read), read.stderr
    remote = osb(
        None, "run", "--api-base", "http://127.0.0.1:9/v1", "--allow-image-path", "/x", "1"
    )
    assert remote.returncode == OWN_ERROR and "embedded server's" in last_line(remote)


# -- 15: Client() with nothing set ----------------------------------------------------------------


def test_15_client_without_settings_says_how_to_start_a_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("OPEN_SANDBOX_"):
            monkeypatch.delenv(name)
    with pytest.raises(ConfigurationError) as info:
        Client()
    assert "osb-sync serve" in str(info.value) and "LocalServer()" in str(info.value)


# -- 13, 16: the README -------------------------------------------------------------------------


def test_13_the_readme_example_prints_the_streamed_output_alone(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (ROOT / "README.rst").read_text(encoding="utf-8")
    lines = readme.split(".. code-block:: python\n\n", 1)[1].splitlines()
    block = [line for line in lines[: next(i for i, x in enumerate(lines) if x[:1].isalpha())]]
    code = "\n".join(line[4:] for line in block)
    monkeypatch.setenv("OPEN_SANDBOX_API_BASE", server.api_base)
    exec(compile(code, "README.rst", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.endswith("]\n0\n1\n2\n"), printed  # the loop's lines: no ping, no type names
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" in printed  # the server's Python
    assert "3.12..." not in readme


def test_16_install_lines_work_from_a_checkout() -> None:
    documents = [ROOT / "README.rst", *sorted((ROOT / "docs").rglob("*.rst"))]
    sources = [ROOT / "osb_sync" / "_cli.py", ROOT / "osb_sync" / "_pool_redis.py"]
    for path in documents + sources:
        text = path.read_text(encoding="utf-8")
        assert "install 'osb-sync[" not in text and 'install "osb-sync[' not in text, path
    assert 'pip install ".[deepagents]"' in (ROOT / "README.rst").read_text(encoding="utf-8")


def test_3_bash_completes_sandbox_ids_from_the_server(
    server: LocalServer, sid: str, tmp_path: Path
) -> None:
    pytest.importorskip("shtab")
    script = osb(None, "completion", "bash")
    assert script.returncode == 0, script.stderr
    (tmp_path / "osb-sync.bash").write_text(script.stdout)
    # osb-sync on PATH as a user has it: this interpreter's module
    (tmp_path / "osb-sync").write_text(f'#!/bin/sh\nexec {sys.executable} -m osb_sync "$@"\n')
    (tmp_path / "osb-sync").chmod(0o755)
    line = f"osb-sync exec {sid[:4]}"
    probe = (
        f"source {tmp_path}/osb-sync.bash\n"
        f"COMP_LINE='{line}'; COMP_POINT={len(line)}\n"
        f"COMP_WORDS=(osb-sync exec {sid[:4]}); COMP_CWORD=2\n"
        "_shtab_osb_sync osb-sync " + sid[:4] + " exec\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    env["OPEN_SANDBOX_API_BASE"] = server.api_base
    done = subprocess.run(
        ["bash", "-c", probe], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert sid in done.stdout.split(), (done.stdout, done.stderr)
