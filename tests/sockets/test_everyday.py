"""Everyday mistakes get a clear, typed error saying what to do (issue 14)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import responses

from osb_sync import Client, ConfigurationError, Sandbox, SandboxStateError
from osb_sync.local import LocalServer
from tests.helpers import API


@pytest.fixture
def local(shared_server: LocalServer) -> LocalServer:
    return shared_server


@pytest.fixture
def sandbox(shared_sandbox: Sandbox) -> Sandbox:
    return shared_sandbox


def test_osb_sync_local_after_import_osb_sync_and_the_import_stays_light() -> None:
    code = (
        "import sys, osb_sync\n"
        "assert 'osb_sync.local' not in sys.modules, 'import osb_sync loaded the server'\n"
        "print(osb_sync.local.LocalServer.__name__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert (proc.returncode, proc.stdout) == (0, "LocalServer\n"), proc.stderr
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        __import__("osb_sync").nothing  # noqa: B018


@pytest.mark.parametrize(
    ("code", "language", "match"),
    [
        ("", "python", "code is empty"),
        ("  \n", "python", "code is empty"),
        ("puts 1", "ruby", "unknown language 'ruby': execd runs python, bash"),
    ],
)
def test_bad_code_is_refused_before_a_sandbox_is_created(
    code: str, language: str, match: str
) -> None:
    with responses.RequestsMock() as rsps, Client(API) as client:  # no route: any call fails
        with pytest.raises(ConfigurationError, match=match):
            client.code_interpreter_tool(code, language=language)
        assert len(rsps.calls) == 0


@pytest.mark.parametrize("timeout", [0, -5, 1.5, "600", True])
def test_a_lifetime_that_is_not_a_positive_int_is_refused(timeout: object) -> None:
    with responses.RequestsMock() as rsps, Client(API) as client:
        with pytest.raises(ConfigurationError, match="NO_TIMEOUT for no expiry"):
            client.create_sandbox(timeout=timeout)  # type: ignore[arg-type]
        assert len(rsps.calls) == 0


def test_code_in_a_paused_sandbox_says_to_resume(local: LocalServer) -> None:
    with Client(local.api_base) as client, client.create_sandbox() as sandbox:
        sandbox.pause()
        for call in (lambda: sandbox.run_code("1"), lambda: sandbox.commands.run("true")):
            with pytest.raises(SandboxStateError, match=r"paused: resume it first") as info:
                call()
            assert "502" in str(info.value)
        started = time.monotonic()
        with pytest.raises(SandboxStateError, match="resume it first"):
            client.connect(sandbox.id)  # not a 30 s wait for /ping
        assert time.monotonic() - started < 10
        sandbox.resume()
        assert sandbox.run_code("6*7").results == [{"text": "42"}]


def test_write_many_takes_a_dict_and_names_a_bad_mode(sandbox: Sandbox) -> None:
    sandbox.files.write_many({"many/a.txt": "a", "many/b.txt": b"b"})
    assert sandbox.files.read_text("many/a.txt") + sandbox.files.read_text("many/b.txt") == "ab"
    with pytest.raises(ConfigurationError, match=r"mode must be an int .* got '644'"):
        sandbox.files.write_many([("many/c.txt", "c", "644")])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match=r"\(path, data\[, mode\]\) tuples, got str"):
        sandbox.files.write_many(["many/d.txt"])  # type: ignore[list-item]


def test_read_text_of_binary_data_names_the_path(sandbox: Sandbox) -> None:
    sandbox.files.write("blob.bin", b"\x00\xff\xfe")
    with pytest.raises(UnicodeDecodeError, match=r"'blob\.bin' is not utf-8 text"):
        sandbox.files.read_text("blob.bin")


def test_the_readmes_iter_logs_example_shows_output_while_the_server_runs(
    sandbox: Sandbox,
) -> None:
    readme = (Path(__file__).parents[2] / "README.rst").read_text()
    example = re.search(r'commands\.start\("(python [^"]*http\.server) 8000"\)', readme)
    assert example is not None and " -u " in example.group(1)
    server = sandbox.commands.start(f"{example.group(1)} --bind 127.0.0.1 0")
    stop = threading.Timer(30, server.kill)  # without -u, the logs stay empty: do not hang
    stop.start()
    try:
        first = next(server.iter_logs(poll_interval=0.05), "")
    finally:
        stop.cancel()
        server.kill()
    assert "Serving HTTP" in first


def test_the_readme_lists_command_failed_and_says_contexts_interrupt_takes_a_context() -> None:
    readme = " ".join((Path(__file__).parents[2] / "README.rst").read_text().split())
    assert "- ``CommandFailed``: ``CommandResult.check()``" in readme
    assert "``interrupt(ctx)``: it interrupts the run going on in a code context" in readme
    assert "125 osb-sync itself failed" in readme
