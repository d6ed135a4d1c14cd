"""Escapes tried from inside local sandboxes, through the public client, must all fail.

Each test plays the part of model-written code in a deny-all sandbox (unless it says otherwise)
and tries to reach what lies outside: host files, other sandboxes, the server, host processes
and host loopback ports; the files API is tried with `..`, absolute and symlinked paths. The
tests assert on what got through (canary texts, successful calls), never on timings.

They need a server that isolates its sandboxes (bubblewrap). Where the machine cannot isolate
they skip, unless OSB_REQUIRE_ISOLATION=1 (CI), where they fail. Each failed on the server
before containers (issue 11), where every escape worked. Probes and host-side helpers:
`isolation_probes`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

import osb_sync
from osb_sync import Client, Sandbox
from osb_sync.local import LocalServer
from tests.local.isolation_probes import (
    ESCAPES,
    LISTENER,
    assert_all_failed,
    canary_file,
    host_listener,
    host_process,
    host_text,
    isolating_server,
    kill_host_processes_with,
    leaked,
    probe,
    reach,
    run,
    shadow_secrets,
    through_files_api,
    unique,
    where,
)
from tests.local.support import host_pids_with, wait_for


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    """One isolating server for the module's tests."""
    srv = isolating_server()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: LocalServer) -> Iterator[Client]:
    """A client of `server`."""
    with Client(api_base=server.api_base) as cli:
        yield cli


@pytest.fixture
def sandbox(client: Client) -> Iterator[Sandbox]:
    """A deny-all sandbox, deleted after the test."""
    with client.create_sandbox() as box:
        yield box


@pytest.fixture
def other(client: Client) -> Iterator[Sandbox]:
    """A second deny-all sandbox, deleted after the test."""
    with client.create_sandbox() as box:
        yield box


@pytest.fixture
def home_canary() -> Iterator[tuple[Path, str]]:
    """A canary file in the server user's $HOME."""
    with canary_file(os.path.expanduser("~")) as canary:
        yield canary


@pytest.fixture
def temp_canary() -> Iterator[tuple[Path, str]]:
    """A canary file in a fresh host temporary directory."""
    directory = tempfile.mkdtemp(prefix="osb-host-")
    try:
        with canary_file(directory) as canary:
            yield canary
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- host files -----------------------------------------------------------------------------------


def test_code_cannot_read_etc_shadow(sandbox: Sandbox) -> None:
    outcomes = probe(
        sandbox,
        'attempt("/etc/shadow", read, "/etc/shadow")\n'
        'attempt("/proc/1/root/etc/shadow", read, "/proc/1/root/etc/shadow")',
    )
    assert_all_failed(outcomes, *shadow_secrets())


@pytest.mark.parametrize("where_on_host", ["home", "temp"])
def test_code_cannot_read_a_host_canary(
    sandbox: Sandbox,
    where_on_host: str,
    home_canary: tuple[Path, str],
    temp_canary: tuple[Path, str],
) -> None:
    path, text = home_canary if where_on_host == "home" else temp_canary
    outcomes = probe(
        sandbox,
        f'attempt("absolute", read, {str(path)!r})\n'
        f'attempt("via /proc/1/root", read, "/proc/1/root" + {str(path)!r})\n'
        f'attempt("by name in $HOME", read, os.path.expanduser("~/{path.name}"))\n'
        f'attempt("search", find, {path.name!r}, ["/tmp", os.path.expanduser("~"), '
        f"{str(path.parent)!r}])",
    )
    assert_all_failed(outcomes, text)


def test_code_cannot_find_or_read_another_sandboxs_files(
    server: LocalServer, sandbox: Sandbox, other: Sandbox
) -> None:
    name, text = f"{unique('osb-canary')}.txt", unique("sandbox-canary")
    other.files.write(name, text)
    try:
        other.files.write(f"/tmp/{name}", text)
        other_path = where(other, name)
        seen_by_other = run(other, f"print(open({name!r}).read(), open('/tmp/{name}').read())")
        assert seen_by_other.split() == [text, text]  # the canaries are there
        outcomes = probe(
            sandbox,
            f'attempt("its path", read, {other_path!r})\n'
            f'attempt("its /tmp", read, "/tmp/{name}")\n'
            f'attempt("via /proc/1/root", read, "/proc/1/root" + {other_path!r})\n'
            f'attempt("server root", read, {str(server.root_dir)!r} + "/{other.id}/{name}")\n'
            f'attempt("search", find, {name!r}, ["/tmp", os.path.expanduser("~"), '
            f"{os.path.dirname(other_path)!r}, {str(server.root_dir)!r}])",
        )
        assert_all_failed(outcomes, text)
    finally:
        Path(f"/tmp/{name}").unlink(missing_ok=True)  # where a server without isolation put it


def test_code_cannot_read_the_servers_state(
    server: LocalServer, sandbox: Sandbox, other: Sandbox
) -> None:
    server_pid = os.getpid()  # LocalServer serves from this process
    environ, cmdline = host_text(f"/proc/{server_pid}/environ"), host_text("/proc/self/cmdline")
    assert environ and cmdline
    outcomes = probe(
        sandbox,
        f'attempt("root_dir", os.listdir, {str(server.root_dir)!r})\n'
        f'attempt("other sandbox dir", os.listdir, {str(server.root_dir)!r} + "/{other.id}")\n'
        f"server = {server_pid}, {cmdline!r}\n"
        'attempt("environ", lambda: read(f"/proc/{checked_pid(*server)}/environ"))\n'
        'attempt("cmdline", lambda: read(f"/proc/{checked_pid(*server)}/cmdline"))',
    )
    # The sandbox may see its own directory at the host's path, but nothing else of root_dir.
    listed = outcomes.pop("root_dir")
    assert not listed["ok"] or all(e.startswith(sandbox.id) for e in listed["value"]), listed
    assert_all_failed(outcomes, environ, cmdline)  # errors may echo other.id: it was in the path


def test_code_cannot_write_outside_its_writable_directories(sandbox: Sandbox) -> None:
    name = unique("osb-written")
    package_dir = os.path.dirname(osb_sync.__file__)
    targets = [f"/usr/{name}", f"/etc/{name}", f"{package_dir}/{name}", f"/usr/lib/{name}-2"]
    try:
        outcomes = probe(sandbox, "\n".join(f"attempt({t!r}, write, {t!r})" for t in targets))
        assert_all_failed(outcomes)
        assert not [t for t in targets if os.path.exists(t)]
    finally:
        for target in targets:
            Path(target).unlink(missing_ok=True)


# -- processes ------------------------------------------------------------------------------------


def test_code_cannot_signal_processes_outside(sandbox: Sandbox) -> None:
    server = os.getpid(), host_text("/proc/self/cmdline")
    with host_process(unique("osb-host-process")) as outsider:
        outsider_cmdline = host_text(f"/proc/{outsider.pid}/cmdline")  # Popen waited for exec
        outcomes = probe(
            sandbox,
            f'attempt("signal 0 to the server", lambda: os.kill(checked_pid(*{server!r}), 0))\n'
            f"outsider = {outsider.pid}, {outsider_cmdline!r}\n"
            'attempt("SIGKILL to a host process", lambda: os.kill(checked_pid(*outsider), 9))',
        )
        assert_all_failed(outcomes)
        assert outsider.poll() is None


def test_proc_lists_only_the_sandboxs_processes(sandbox: Sandbox) -> None:
    marker = unique("osb-host-process")
    server_cmdline = host_text("/proc/self/cmdline")
    with host_process(marker):
        outcomes = probe(
            sandbox,
            'pids = [p for p in os.listdir("/proc") if p.isdigit()]\n'
            'attempt("cmdlines", lambda: [read(f"/proc/{p}/cmdline") for p in pids])',
        )
    assert outcomes["cmdlines"]["ok"], outcomes
    cmdlines = outcomes["cmdlines"]["value"]
    assert 1 <= len(cmdlines) <= 20, cmdlines
    assert not [c for c in cmdlines if marker in c or c == server_cmdline]


def test_no_process_survives_delete(client: Client) -> None:
    marker = unique("osb-escape")
    kinds = [f"{marker}-setsid", f"{marker}-nohup", f"{marker}-double-fork"]
    try:
        with client.create_sandbox() as box:
            run(box, f"MARKER = {marker!r}\n{ESCAPES}")
            assert wait_for(lambda: all(host_pids_with(k) for k in kinds), timeout=30)
        assert wait_for(lambda: not host_pids_with(marker), timeout=30), [
            k for k in kinds if host_pids_with(k)
        ]
    finally:
        kill_host_processes_with(marker)


# -- network --------------------------------------------------------------------------------------


def test_code_cannot_connect_to_a_host_loopback_listener(sandbox: Sandbox) -> None:
    with host_listener() as (port, greeting, accepted):
        with host_listener(abstract=True) as (name, unix_greeting, unix_accepted):
            outcomes = probe(
                sandbox, reach(port) + f'attempt("abstract socket", talk_unix, {name!r}, "")'
            )
    assert_all_failed(outcomes, greeting, unix_greeting)
    assert not accepted and not unix_accepted


def test_code_cannot_connect_to_the_servers_port(server: LocalServer, sandbox: Sandbox) -> None:
    outcomes = probe(sandbox, reach(server.port, "GET /health HTTP/1.0\r\n\r\n"))
    assert_all_failed(outcomes, "healthy")


def test_code_cannot_connect_to_another_sandboxs_port(
    server: LocalServer, client: Client, sandbox: Sandbox, other: Sandbox
) -> None:
    greeting = unique("other-sandbox-listener")
    try:
        port = int(run(other, f"GREETING = {greeting!r}\n{LISTENER}"))
        endpoint = other.get_endpoint(port)
        seen = requests.get(endpoint.url, headers=endpoint.headers, timeout=30)
        assert greeting in seen.text  # the listener runs and the server's proxy reaches it
        headers = "".join(f"{k}: {v}\r\n" for k, v in endpoint.headers.items())
        via_proxy = f"GET /sandboxes/{other.id}/proxy/{port}/ HTTP/1.0\r\n{headers}\r\n"
        outcomes = probe(
            sandbox,
            reach(port, "GET / HTTP/1.0\r\n\r\n")
            + reach(server.port, via_proxy, label="server proxy at ")
            + f"for path in unix_sockets({str(server.root_dir)!r}):\n"
            f'    attempt(path, talk_unix, path, "{port}\\nGET / HTTP/1.0\\r\\n\\r\\n")',
        )
        assert_all_failed(outcomes, greeting)
    finally:
        kill_host_processes_with(greeting)  # a server without a PID namespace leaves it


def test_sandbox_with_internet_access_cannot_reach_host_loopback(
    server: LocalServer, client: Client
) -> None:
    with client.create_sandbox(allow_internet_access=True) as box, host_listener() as listener:
        port, greeting, accepted = listener
        with host_listener(abstract=True) as (name, unix_greeting, unix_accepted):
            outcomes = probe(
                box,
                reach(port)
                + reach(server.port, label="the server at ")
                + f'attempt("abstract socket", talk_unix, {name!r}, "")',
            )
    assert_all_failed(outcomes, greeting, unix_greeting)
    assert not accepted and not unix_accepted


# -- the files API --------------------------------------------------------------------------------


def test_files_api_reads_stay_inside_the_sandbox(
    server: LocalServer, sandbox: Sandbox, other: Sandbox, home_canary: tuple[Path, str]
) -> None:
    canary, text = home_canary
    name, other_text = f"{unique('osb-canary')}.txt", unique("sandbox-canary")
    other.files.write(name, other_text)
    other_path, cwd = where(other, name), where(sandbox, ".")
    up = "../" * 30
    paths = [
        str(canary),
        f"{up}{str(canary).lstrip('/')}",
        f"/proc/1/root{canary}",
        "/etc/shadow",
        f"{up}etc/shadow",
        other_path,
        f"/..{other_path}",
        os.path.relpath(other_path, cwd),
        f"{server.root_dir}/{other.id}/{name}",
    ]
    read = {path: through_files_api(lambda p=path: sandbox.files.read_text(p)) for path in paths}
    listed = through_files_api(lambda: sandbox.files.list(str(server.root_dir)))
    # other.id only in `listed`: an error about a read may echo the path, which holds it.
    found = leaked(repr(read), [text, other_text, *shadow_secrets()])
    found += leaked(repr(listed), [other.id])
    assert not found, f"the files API reached outside the sandbox: {found}"


def test_files_api_does_not_follow_a_sandbox_symlink_to_a_host_file(
    sandbox: Sandbox, home_canary: tuple[Path, str]
) -> None:
    canary, text = home_canary
    planted = canary.parent / f"{unique('osb-planted')}.txt"
    run(
        sandbox,
        f"import os\nos.symlink({str(canary)!r}, 'link-file')\n"
        "os.symlink('/etc/shadow', 'link-shadow')\n"
        f"os.symlink({str(canary.parent)!r}, 'link-dir')",
    )
    try:
        read = [
            through_files_api(lambda p=p: sandbox.files.read_text(p))
            for p in ["link-file", "link-shadow", f"link-dir/{canary.name}"]
        ]
        through_files_api(lambda: sandbox.files.write("link-file", "overwritten"))
        through_files_api(lambda: sandbox.files.write(f"link-dir/{planted.name}", "planted"))
        through_files_api(lambda: sandbox.files.replace(f"link-dir/{canary.name}", text, "x"))
        found = leaked(repr(read), [text, *shadow_secrets()])
        assert not found, f"the files API followed a link out of the sandbox: {found}"
        assert canary.read_text() == text
        assert not planted.exists()
    finally:
        planted.unlink(missing_ok=True)


def test_files_api_deletes_with_dotdot_leave_others_intact(temp_canary: tuple[Path, str]) -> None:
    canary, text = temp_canary
    server = isolating_server()  # its own: on a server that does not isolate, '..' deletes all
    try:
        with Client(api_base=server.api_base) as client:
            with client.create_sandbox() as box, client.create_sandbox() as other:
                name, other_text = f"{unique('osb-canary')}.txt", unique("sandbox-canary")
                other.files.write(name, other_text)
                other_dir, cwd = os.path.dirname(where(other, name)), where(box, ".")
                parent = where(box, "..")  # now: the deletes may take the box's own directory
                targets = [
                    f"/..{other_dir}",
                    os.path.relpath(other_dir, cwd),
                    f"/..{canary.parent}",
                    str(canary.parent),
                    f"{'../' * 30}{str(canary.parent).lstrip('/')}",
                ]
                if parent != "/":  # never `rm -r /`, not even in a container
                    targets.append("..")
                for target in targets:
                    through_files_api(lambda t=target: box.files.rmtree(t))
                through_files_api(lambda: box.files.remove(f"/..{canary}"))
                assert canary.exists() and canary.read_text() == text
                assert other.files.read_text(name) == other_text
    finally:
        server.stop()
