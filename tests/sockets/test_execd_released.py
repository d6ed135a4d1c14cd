"""Issue 45: what execd 1.1.1 added, against a fake of each generation (tests/fake_execd.py):
argv commands (and June's execd refusing them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from osb_sync import (
    ApiError,
    CommandFailed,
    ConfigurationError,
    NotFoundError,
    NotSupportedError,
    Sandbox,
)
from tests.fake_execd import EXECD_PATH, TOKEN, FakeExecd, serve_execd
from tests.fakeserver import FakeServer

CODE = "import json, sys; print(json.dumps(sys.argv[1:]))"
ARGS = ["a b", "$HOME", "", "it's", "`id`", "\\n", "-c"]


def fake(form: str, root: Path) -> Iterator[tuple[FakeExecd, Sandbox]]:
    with FakeServer() as server:
        execd = serve_execd(server, form, root)
        url = f"http://127.0.0.1:{server.server_address[1]}{EXECD_PATH}"
        with Sandbox.from_execd(url, headers={"X-EXECD-ACCESS-TOKEN": TOKEN}) as sandbox:
            yield execd, sandbox


@pytest.fixture
def released(tmp_path: Path) -> Iterator[tuple[FakeExecd, Sandbox]]:
    yield from fake("released", tmp_path)


@pytest.fixture
def june(tmp_path: Path) -> Iterator[tuple[FakeExecd, Sandbox]]:
    yield from fake("june", tmp_path)


def test_an_argv_goes_as_argv_to_a_released_execd(released: tuple[FakeExecd, Sandbox]) -> None:
    execd, sandbox = released
    result = sandbox.commands.run(["python3", "-c", CODE, *ARGS], cwd=".", env={"K": "v"})
    assert (result.exit_code, result.stdout) == (0, json.dumps(ARGS) + "\n")
    assert execd.bodies == [
        {"argv": ["python3", "-c", CODE, *ARGS], "cwd": ".", "envs": {"K": "v"}}
    ]


def test_june_refuses_argv_once_then_gets_the_quoted_command(
    june: tuple[FakeExecd, Sandbox],
) -> None:
    execd, sandbox = june
    first = sandbox.commands.run(["python3", "-c", CODE, *ARGS])
    second = sandbox.commands.run(["python3", "-c", CODE, "x"])
    assert first.stdout == json.dumps(ARGS) + "\n" and second.stdout == '["x"]\n'
    assert [sorted(body) for body in execd.bodies] == [["argv"], ["command"], ["command"]]
    assert execd.bodies[1]["command"].startswith("exec -- python3 -c ")
    started = sandbox.commands.start(["sh", "-c", 'echo "$1"', "-", "a  b"])
    assert started.logs()[0] == "a  b\n" and "argv" not in execd.bodies[-1]


def test_exec_runs_the_program_not_a_builtin_of_its_name(june: tuple[FakeExecd, Sandbox]) -> None:
    """``exec --``: ``["echo", "-n", "x"]`` runs /bin/echo as an argv would; a missing program
    exits 127 (the one difference: execd 1.1.1 fails it with an ``error`` event)."""
    _, sandbox = june
    assert sandbox.commands.run(["type", "echo"]).exit_code == 127  # a builtin only
    missing = sandbox.commands.run(["no-such-program-xyz"])
    assert missing.exit_code == 127 and "not found" in missing.stderr


def test_other_refusals_are_not_retried(released: tuple[FakeExecd, Sandbox]) -> None:
    execd, sandbox = released
    execd.server.routes[("POST", f"{EXECD_PATH}/command")] = lambda req: req.send_json(
        400, {"code": "INVALID_REQUEST_BODY", "message": "argv must contain a non-empty executable"}
    )
    with pytest.raises(ApiError, match="non-empty executable"):
        sandbox.commands.run(["true"])
    assert len(execd.server.seen("POST", f"{EXECD_PATH}/command")) == 1


def test_set_env_on_a_released_execd(released: tuple[FakeExecd, Sandbox]) -> None:
    execd, sandbox = released
    sandbox.commands.set_env("TOKENISH", "s3cret value")
    sandbox.commands.set_env("QUOTED", "it's")
    assert sandbox.commands.run('echo "$TOKENISH|$QUOTED"').stdout == "s3cret value|it's\n"
    body = execd.bodies[0]
    assert "s3cret" not in body["command"]  # the line travels in envs, not the command line
    assert body["envs"] == {"OSB_SET_ENV_LINE": "TOKENISH='s3cret value'"}
    assert execd.bodies[1]["envs"] == {"OSB_SET_ENV_LINE": 'QUOTED="it\'s"'}
    assert (execd.root / ".execd-envs").read_text() == "TOKENISH='s3cret value'\nQUOTED=\"it's\"\n"


def test_set_env_on_june_says_execd_has_no_envs_file(june: tuple[FakeExecd, Sandbox]) -> None:
    _, sandbox = june
    with pytest.raises(CommandFailed, match="set_env failed for 'K': EXECD_ENVS is not set"):
        sandbox.commands.set_env("K", "v")


LINES = "first\r\nsecond line\n\nfourth\nlast, no newline"
PICKS = {
    (None, None): LINES,
    (2, 1): "second line",
    (2, None): "second line\n\nfourth\nlast, no newline",
    (None, 2): "first\nsecond line",
    (3, 1): "",
    (5, 9): "last, no newline",
    (9, None): "",
}


@pytest.mark.parametrize("form", ["released", "june"])
def test_line_downloads(form: str, tmp_path: Path) -> None:
    """1.1.1 picks the lines; June sends the whole file, and the client picks them."""
    (tmp_path / "f.txt").write_bytes(LINES.encode())
    for execd, sandbox in fake(form, tmp_path):
        for (offset, limit), want in PICKS.items():
            assert sandbox.files.read_text("f.txt", offset=offset, limit=limit) == want
        seen = execd.server.seen("GET", f"{EXECD_PATH}/files/download")
        assert seen[1].query == {"path": ["f.txt"], "offset": ["2"], "limit": ["1"]}
        for bad in (0, -1, True, "2", 1.5):
            with pytest.raises(ConfigurationError, match="offset must be an int"):
                sandbox.files.read_text("f.txt", offset=bad)  # type: ignore[arg-type]


def test_files_as_a_user_use_the_identity_routes(released: tuple[FakeExecd, Sandbox]) -> None:
    execd, sandbox = released
    (execd.root / "f.txt").write_text("a\nb\n")
    assert sandbox.files_as(1000, 100).read_text("f.txt", offset=2) == "b"
    seen = execd.server.seen("GET", f"{EXECD_PATH}/v1/filesystem/1000/100/files/download")
    assert execd.identities == [(1000, 100)] and seen[0].query["path"] == ["f.txt"]


def test_files_as_a_user_on_june_say_it_is_not_served(june: tuple[FakeExecd, Sandbox]) -> None:
    """June's execd has no such route (a plain-text 404): never a fallback to the daemon's."""
    execd, sandbox = june
    (execd.root / "f.txt").write_text("a\n")
    with pytest.raises(NotSupportedError, match="files as a user"):
        sandbox.files_as(0, 0).read_text("f.txt")
    with pytest.raises(NotFoundError):  # a missing file is still that
        sandbox.files.read_text("missing.txt")
