"""Issue 45: June's execd and execd 1.1.1 frame a command's output differently (June: one
event per line, terminator stripped; 1.1.1: texts that join to the exact output). The same
outputs, in both forms, through ``commands.run``, the callbacks, ``commands.start().logs()``
and the CLI give the same text (see ``osb_sync/_command_stream.py`` for the rule)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from osb_sync import Sandbox
from osb_sync._cli import main
from tests.fake_execd import EXECD_PATH, SID, TOKEN, FakeExecd, serve_execd
from tests.fakeserver import FakeServer

FORMS = ["june", "released", "released-split-crlf"]

# Outputs that end with a newline: the same text from both forms.
SAME = {
    "blank_lines": "printf 'a\\n\\nb\\n'",
    "leading_blank_lines": "printf '\\n\\nlast\\n'",
    "crlf": "printf 'a\\r\\nb\\r\\n'",
    "cr_progress": "printf '10%%\\r20%%\\rdone\\n'",
    "mixed_ends": "printf 'x\\r\\ny\\rz\\n'",
    "one_line": "echo one",
    "stderr_too": "echo out; printf 'e1\\n\\ne2\\r\\n' >&2; echo more",
    "many_lines": "seq 1 500",
    "unicode": "printf 'caf\\xc3\\xa9 \\xe2\\x98\\x83\\n'",
}
EXPECTED = {
    "blank_lines": ("a\n\nb\n", ""),
    "leading_blank_lines": ("\n\nlast\n", ""),
    "crlf": ("a\nb\n", ""),
    "cr_progress": ("10%\n20%\ndone\n", ""),
    "mixed_ends": ("x\ny\nz\n", ""),
    "one_line": ("one\n", ""),
    "stderr_too": ("out\nmore\n", "e1\n\ne2\n"),
    "many_lines": ("".join(f"{i}\n" for i in range(1, 501)), ""),
    "unicode": ("caf\u00e9 \u2603\n", ""),
}


@pytest.fixture(params=FORMS)
def execd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FakeExecd]:
    form = request.param
    with FakeServer() as server:
        yield serve_execd(
            server, form.split("-")[0], tmp_path, split_crlf=form.endswith("split-crlf")
        )


def handle(fake: FakeExecd) -> Sandbox:
    port = fake.server.server_address[1]
    return Sandbox.from_execd(
        f"http://127.0.0.1:{port}{EXECD_PATH}", headers={"X-EXECD-ACCESS-TOKEN": TOKEN}
    )


@pytest.mark.parametrize("name", sorted(SAME))
def test_run_and_callbacks_give_the_same_text(execd: FakeExecd, name: str) -> None:
    out: list[str] = []
    err: list[str] = []
    with handle(execd) as sandbox:
        result = sandbox.commands.run(SAME[name], on_stdout=out.append, on_stderr=err.append)
    assert (result.stdout, result.stderr) == EXPECTED[name]
    assert ("".join(out), "".join(err)) == EXPECTED[name]
    assert result.exit_code == 0


def test_a_cr_progress_line_reaches_the_callback_before_the_line_ends(execd: FakeExecd) -> None:
    """Each piece is handed on with its own event: no waiting for a later newline."""
    calls: list[str] = []
    with handle(execd) as sandbox:
        sandbox.commands.run(SAME["cr_progress"], on_stdout=calls.append)
    assert "".join(calls) == "10%\n20%\ndone\n"
    assert calls[0].startswith("10%") and "20%" not in calls[0]


def test_background_logs_are_the_raw_output_in_both_forms(execd: FakeExecd) -> None:
    """The logs route is plain text, not events: no form to join (same bytes from both)."""
    with handle(execd) as sandbox:
        command = sandbox.commands.start("printf 'a\\n\\nb\\r\\n'")
        assert command.wait(timeout=10).exit_code == 0
        text, cursor = command.logs()
    assert (text, cursor) == ("a\n\nb\r\n", 6)


def test_output_without_a_final_newline(execd: FakeExecd) -> None:
    """The one documented difference: June's events cannot say whether the last line had a
    newline (it gets one); 1.1.1's can, except for output that is one line: it reads as June's."""
    with handle(execd) as sandbox:
        one_line = sandbox.commands.run("printf abc").stdout
        two_lines = sandbox.commands.run("printf 'a\\nb'").stdout
    assert one_line == "abc\n"
    assert two_lines == ("a\nb\n" if execd.form == "june" else "a\nb")


def test_the_cli_prints_the_same_text(execd: FakeExecd) -> None:
    out, err = io.StringIO(), io.StringIO()
    api = execd.server.api_base
    with redirect_stdout(out), redirect_stderr(err):
        status = main(["exec", "--api-base", api, SID, "--", "bash", "-c", SAME["stderr_too"]])
    assert status == 0, err.getvalue()
    assert out.getvalue() == EXPECTED["stderr_too"][0]
    assert err.getvalue().endswith(EXPECTED["stderr_too"][1])
