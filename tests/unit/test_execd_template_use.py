"""Which servers' sandboxes get their execd from the execd template (`host/execd_template.py`),
and the placeholder bwrap runs there: decided from the probe's findings alone (the template's
behaviour itself is tests/local/test_execd_template.py's)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from osb_sync.local.host import bwrap, execd_template, identity
from osb_sync.local.protocol import Fork

RANGE = identity.IdRange(165536, 165536, helpers=("/usr/bin/newuidmap", "/usr/bin/newgidmap"))
ROOT_RANGE = identity.IdRange(100000, 100000)
OWN = identity.own_ids(1000, 1000, "no range", "usermod ...")


def support(ids: identity.IdRange) -> bwrap.Support:
    return bwrap.Support("/usr/bin/bwrap", "", None, False, b"\0" * 8, ids)


@pytest.fixture
def new_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(execd_template, "kernel_joins_by_pidfd", lambda: True)
    monkeypatch.setattr(execd_template.os, "pidfd_open", lambda *_: 0, raising=False)
    monkeypatch.setattr(execd_template, "_owns_interpreter", lambda: False)  # root's, say


def test_not_where_root_inside_is_the_user_who_owns_the_interpreter(
    monkeypatch: pytest.MonkeyPatch, new_kernel: None
) -> None:
    """Its execds' /proc/self/exe would be that file, writable to them as its owner."""
    monkeypatch.setattr(execd_template, "_owns_interpreter", lambda: True)
    assert not execd_template.usable(support(OWN), None)
    assert execd_template.usable(support(RANGE), None)  # root inside is an id of the range
    assert execd_template.usable(support(ROOT_RANGE), None)


@pytest.mark.parametrize("ids", [ROOT_RANGE, RANGE, OWN], ids=["root", "range", "own ids"])
def test_every_isolating_server_uses_it_for_our_execd(
    ids: identity.IdRange, new_kernel: None
) -> None:
    assert execd_template.usable(support(ids), None)
    assert not execd_template.usable(support(ids), object())  # an execd binary


def test_a_server_that_is_not_root_needs_bash_for_its_placeholder(
    monkeypatch: pytest.MonkeyPatch, new_kernel: None
) -> None:
    monkeypatch.setattr(execd_template, "BASH", "/nonexistent/bash")
    assert execd_template.usable(support(ROOT_RANGE), None)  # bwrap makes its namespace
    assert not execd_template.usable(support(RANGE), None)
    assert not execd_template.usable(support(OWN), None)


def test_the_placeholder_closes_the_namespace_descriptor_bwrap_leaves_open() -> None:
    assert execd_template.placeholder() == execd_template.PLACEHOLDER  # a root server's: dash
    held = os.open("/dev/null", os.O_RDONLY)  # stands for the namespace's descriptor
    number = fcntl.fcntl(held, fcntl.F_DUPFD, 20)  # past 9, as a server's are
    os.close(held)
    try:
        command = execd_template.placeholder(number)
        assert command[0] == execd_template.BASH
        with subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(number,)
        ) as proc:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline() == b"up\n"
            assert str(number) not in os.listdir(f"/proc/{proc.pid}/fd")
            proc.stdin.write(b"7\n")
            proc.stdin.close()
            assert proc.wait(30) == 7  # the exit status the template writes
    finally:
        os.close(number)


def test_a_fork_request_names_the_groups_its_execd_is_born_in() -> None:
    procs = ("/sys/fs/cgroup/pids/osb-sync/x/cgroup.procs",)
    assert Fork.decode(Fork(7, procs).encode()) == Fork(7, procs)
    assert Fork.decode(b'{"init": 7}') == Fork(7)  # no groups: the server's own
    with pytest.raises(ValueError, match="groups must be a list of strings"):
        Fork.decode(b'{"init": 7, "groups": [1]}')


def test_a_bwrap_copied_aside_is_in_a_directory_only_its_user_enters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    original = tmp_path / "bwrap"
    original.write_bytes(b"\\x7fELF stands in for bwrap")
    copy = Path(bwrap.private_copy(str(original)))
    assert copy.read_bytes() == original.read_bytes() and copy != original
    assert copy.parent.parent == tmp_path / "osb-sync"
    assert copy.parent.stat().st_mode & 0o777 == 0o700
    assert copy.stat().st_mode & 0o777 == 0o700


def test_a_sealed_execd_imports_only_what_was_imported_before_and_what_is_built_in(
    tmp_path: Path,
) -> None:
    """Once in a container, the template's paths name the container's files (an image's):
    `seal_imports` (the forked process's first step) keeps the importer off every file."""
    (tmp_path / "planted.py").write_text("print('loaded'); raise SystemExit(99)\n")
    script = (
        "import sys\n"
        f"sys.path[:0] = [{str(tmp_path)!r}, {str(Path(__file__).parents[2])!r}]\n"
        "from osb_sync.local.execd import template\n"
        "template.preload()\n"
        "template.seal_imports()\n"
        "import json, posix, traceback  # imported before; built in\n"
        "assert '127.0.0.1'.encode('idna') == b'127.0.0.1'  # the relay's\n"
        "try:\n"
        "    json.loads('{')  # raised in the standard library's files, whose lines it shows\n"
        "except ValueError:\n"
        "    assert 'return _default_decoder.decode(s)' in traceback.format_exc()\n"
        "try:\n"
        "    import planted\n"
        "except ModuleNotFoundError as exc:\n"
        "    print('refused', exc.name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "refused planted\n"), done.stderr
