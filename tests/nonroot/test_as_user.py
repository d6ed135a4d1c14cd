"""The local server as an ordinary user runs it (issue 42): run by such a user, in a venv of the
system's Python with this package installed from a copy of the tree (`run_as_users.py` makes
both users, the venvs and the copy, and runs this as each; CI does, through `tox -e nonroot`).

The named subset of "Running as a non-root user" (docs/guides/local-server.rst): the README's
first command, the sandbox's identity, a memory limit enforced or said not to be, deny-all by
default, an internet-enabled sandbox, files, and a stop that leaves no process of the user.
`OSB_NONROOT_KIND` says which user this is (`range`: one with a subordinate id range; `no-range`:
one without); anything else, or root, fails: these tests never skip.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from osb_sync import Client
from osb_sync.local import LocalServer
from osb_sync.local.host import identity

README = Path(__file__).resolve().parents[2] / "README.rst"
KIND = os.environ.get("OSB_NONROOT_KIND", "")
KINDS = ("range", "no-range")
# Run in a sandbox: allocate and touch argv[1] MiB.
ALLOCATE = (
    "import sys; x = bytearray(int(sys.argv[1]) << 20); x[::4096] = b'1' * len(x[::4096]);"
    " print('allocated')"
)
# Run in a sandbox: connect to argv[1]:argv[2]; what happened.
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("connected")
except OSError as exc:
    print(type(exc).__name__, exc.errno)
"""


def test_this_is_an_ordinary_user_of_the_kind_named() -> None:
    assert os.geteuid() != 0, "run as an ordinary user (tests/nonroot/run_as_users.py)"
    assert KIND in KINDS, f"OSB_NONROOT_KIND={KIND!r}: one of {KINDS}"
    ids = identity.host_range()
    assert not isinstance(ids, str), ids
    assert ids.own == (KIND == "no-range"), ids


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    with LocalServer(spare_containers=0) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LocalServer) -> Iterator[Client]:
    with Client(server.api_base) as client:
        yield client


def readme_command() -> str:
    """The README's first command, after its install step (the venv has the package)."""
    line = next(line for line in README.read_text().splitlines() if "&& osb-sync run" in line)
    return line.split("&&", 1)[1].strip()


def test_the_readme_s_first_command_prints_42() -> None:
    command = readme_command()
    assert command == 'osb-sync run "print(6*7)"', command
    bin_dir = os.path.dirname(sys.executable)  # the venv's, where pip put osb-sync
    done = subprocess.run(
        ["/bin/sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"},
    )
    assert done.returncode == 0, done
    assert done.stdout.splitlines()[-1] == "42", done.stdout
    if KIND == "no-range":  # its one line says whose root it is
        assert "root inside is your user outside" in done.stderr + done.stdout, done


def test_root_inside_is_the_range_s_first_id_or_the_user(client: Client) -> None:
    with client.create_sandbox() as sandbox:
        shown = sandbox.commands.run("id -u; id -g; cat /proc/self/uid_map").stdout.split()
        message = sandbox.info().message or ""
    assert shown[:3] == ["0", "0", "0"], shown
    outside, count = int(shown[3]), int(shown[4])
    if KIND == "range":
        assert count == identity.COUNT and outside != os.getuid(), shown
        assert "root inside is your user outside" not in message, message
    else:
        assert (outside, count) == (os.getuid(), 1), shown
        assert "root inside is your user outside" in message, message


def test_a_128_mib_memory_limit_is_enforced_or_said_not_to_be(client: Client) -> None:
    limits = {"cpu": "1", "memory": "128Mi"}
    with client.create_sandbox(resource_limits=limits) as sandbox:
        message = sandbox.info().message or ""
        small, large = (
            sandbox.commands.run(f"python3 -c {shlex.quote(ALLOCATE)} {mib} 2>&1; echo exit=$?")
            for mib in (16, 256)
        )
    found = re.search(r"Limits enforced: (.*?); not enforced: (.*?)\.?$", message)
    assert found is not None, message
    enforced, unenforced = found.group(1), found.group(2)
    assert ("memory=128Mi" in enforced) != ("memory=128Mi" in unenforced), message
    assert "allocated" in small.stdout, small  # well under the limit
    if "memory=128Mi" in enforced:  # the limit's error, or its OOM killer
        assert "allocated" not in large.stdout, (message, large)
        assert "MemoryError" in large.stdout or "exit=137" in large.stdout, (message, large)


def test_a_sandbox_reaches_nothing_but_its_loopback_by_default(
    server: LocalServer, client: Client
) -> None:
    with client.create_sandbox() as sandbox:
        message = sandbox.info().message or ""
        names = "import socket; print(*[name for _, name in socket.if_nameindex()])"
        links = sandbox.commands.run(f"python3 -c {shlex.quote(names)}").stdout.split()
        words = ["python3", "-c", CONNECT]
        out = sandbox.commands.run(shlex.join([*words, "192.0.2.1", "80"])).stdout.strip()
        host = sandbox.commands.run(shlex.join([*words, "10.0.2.2", str(server.port)])).stdout
    assert "loopback only" in message, message
    assert links == ["lo"], links
    assert out.startswith("OSError 101"), out  # ENETUNREACH: no route at all
    assert "connected" not in host, host


def test_an_internet_sandbox_has_slirp4netns_s_address_and_not_the_host(
    server: LocalServer, client: Client
) -> None:
    with client.create_sandbox(allow_internet_access=True) as sandbox:
        message = sandbox.info().message or ""
        shown = sandbox.commands.run("ip -4 addr show tap0; ip route").stdout
        words = ["python3", "-c", CONNECT]
        host = [
            sandbox.commands.run(shlex.join([*words, target, str(server.port)])).stdout.strip()
            for target in ("10.0.2.2", "127.0.0.1")
        ]
    assert "outbound through slirp4netns" in message, message
    assert "inet 10.0.2.100/24" in shown and "default via 10.0.2.2 dev tap0" in shown, shown
    assert not [said for said in host if said == "connected"], host


def test_files_round_trip(client: Client) -> None:
    with client.create_sandbox() as sandbox:
        sandbox.files.write("/tmp/work/note.txt", "kept by a user's sandbox\n")
        assert sandbox.files.read_text("/tmp/work/note.txt") == "kept by a user's sandbox\n"
        names = [entry.path for entry in sandbox.files.list("/tmp/work")]
        assert names == ["/tmp/work/note.txt"], names
        assert sandbox.commands.run("cat /tmp/work/note.txt").stdout == "kept by a user's sandbox\n"


def test_a_context_keeps_its_state_and_is_deleted(client: Client) -> None:
    with client.create_sandbox() as sandbox:
        context = sandbox.contexts.create("python")
        sandbox.run_code("kept = 6 * 7", context=context)
        assert sandbox.run_code("print(kept)", context=context).stdout == "42\n"
        assert context.id in [c.id for c in sandbox.contexts.list("python")]
        sandbox.contexts.delete(context)
        assert context.id not in [c.id for c in sandbox.contexts.list("python")]


def owned(uids: set[int]) -> set[int]:
    """The live processes (not zombies) of `uids`, but this one."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            owner = os.stat(f"/proc/{entry}").st_uid
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if owner in uids and state != "Z" and int(entry) != os.getpid():
            found.add(int(entry))
    return found


def test_a_stop_leaves_no_process_of_the_user_or_its_range() -> None:
    ids = identity.host_range()
    assert not isinstance(ids, str), ids
    uids = {os.getuid(), *range(ids.uid, ids.uid + ids.count)}
    server = LocalServer(spare_containers=1).start()  # a spare, a template, slirp4netns
    try:
        with Client(server.api_base) as client:
            sandbox = client.create_sandbox(allow_internet_access=True)
            sandbox.commands.run("setsid sleep 600 >/dev/null 2>&1 < /dev/null &")
            assert sandbox.run_code("print(6*7)").stdout == "42\n"
            assert len(owned(uids)) > 3  # bwrap, the template, execd, the spare, ...
    finally:
        server.stop()
    deadline = time.monotonic() + 10  # SIGKILLed processes take a moment to be gone
    while (left := owned(uids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
