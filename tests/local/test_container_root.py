"""Sandbox root is a container's root (issue 22, items 1-2 and 8): what the official e2e tests do.

`test_03_basic_filesystem_operations` uploads a file owned by `nobody:nogroup` (chown must work:
it failed with EINVAL, the answer a 500 naming the staging file) and moves a file into a
mode-644 directory (root's DAC override); `test_02c_bash_session_api` runs a bash session in
`/var`. Their steps, as our tests, against an isolating server, with the usual writable
directories of a container.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from osb_sync import Client, Sandbox
from osb_sync.local import LocalServer
from tests.local.isolation_probes import isolating_server, probe

USUAL = ("/var", "/srv", "/mnt", "/opt", "/home", "/tmp")


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    """One isolating server."""
    srv = isolating_server()
    yield srv
    srv.stop()


@pytest.fixture
def sandbox(server: LocalServer) -> Iterator[Sandbox]:
    """A sandbox, deleted after the test."""
    with Client(api_base=server.api_base) as cli, cli.create_sandbox() as box:
        yield box


def test_upload_owned_by_nobody_nogroup(sandbox: Sandbox) -> None:
    sandbox.files.write("/tmp/owned.txt", "hello", mode=0o640, owner="nobody", group="nogroup")
    info = sandbox.files.info("/tmp/owned.txt")["/tmp/owned.txt"]
    assert (info.owner, info.group, info.mode) == ("nobody", "nogroup", 0o640)
    assert sandbox.files.read_text("/tmp/owned.txt") == "hello"  # root reads it (DAC override)


def test_move_into_a_mode_644_directory_as_root(sandbox: Sandbox) -> None:
    sandbox.files.mkdir("/tmp/locked", mode=0o644)
    sandbox.files.write("/tmp/moved.txt", "content")
    sandbox.files.move("/tmp/moved.txt", "/tmp/locked/moved.txt")
    assert sandbox.files.read_text("/tmp/locked/moved.txt") == "content"
    assert sandbox.files.info("/tmp/locked")["/tmp/locked"].mode == 0o644


def test_bash_session_in_var(sandbox: Sandbox) -> None:
    with sandbox.commands.session(cwd="/var") as session:
        assert session.run("pwd").stdout.strip() == "/var"
        session.run("echo kept > here.txt && cd /srv")
        assert session.run("pwd; cat /var/here.txt").stdout.split() == ["/srv", "kept"]


def test_usual_directories_are_private_and_writable(server: LocalServer) -> None:
    with Client(api_base=server.api_base) as cli, cli.create_sandbox() as one:
        with cli.create_sandbox() as other:
            body = (
                f"for place in {USUAL!r}:\n"
                '    attempt(place, lambda p=place: write(p + "/mine-one"))\n'
                f'attempt("listed", lambda: {{p: sorted(os.listdir(p)) for p in {USUAL!r}}})'
            )
            written = probe(one, body)
            seen = probe(
                other, f'attempt("listed", lambda: {{p: os.listdir(p) for p in {USUAL!r}}})'
            )
    listed = written.pop("listed")["value"]
    assert all(o["ok"] for o in written.values()), written
    assert all(any(n.startswith("mine-") for n in listed[p]) for p in USUAL), listed
    others = seen["listed"]["value"]
    assert not [p for p in USUAL if any(n.startswith("mine-") for n in others[p])], others
