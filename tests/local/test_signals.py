"""Processes running a local server exit cleanly on SIGTERM and SIGINT: no sandbox, process
or temporary directory is left behind. Each runs as a real subprocess with its own TMPDIR."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import IO

import pytest
import requests

from tests.leftovers import free_port, local_dirs, processes_under, wait_until
from tests.local.support import CREATE_BODY

SIGNALS = [signal.SIGTERM, signal.SIGINT]


def start(argv: list[str], tmp: Path, **env: str) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**clean, "TMPDIR": str(tmp), **env},
    )


def wait_for_line(
    stream: IO[str] | None, pattern: str, errors: IO[str] | None = None
) -> re.Match[str]:
    assert stream is not None
    for line in stream:
        found = re.search(pattern, line)
        if found:
            return found
    said = errors.read()[-2000:] if errors is not None else ""
    raise AssertionError(f"the process ended before printing {pattern!r}: {said}")


def stop_and_check(proc: subprocess.Popen[str], sig: int, tmp: Path) -> None:
    """Signal `proc`, then check it exited and left nothing in `tmp`."""
    assert processes_under(tmp), "nothing was running: the check below would prove nothing"
    proc.send_signal(sig)
    try:
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_until(lambda: not processes_under(tmp), timeout=10), processes_under(tmp)
    assert local_dirs(tmp) == []


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A short TMPDIR (a long one is tested in test_local_processes.py)."""
    path = Path(tempfile.mkdtemp(prefix="osb-sig-", dir="/tmp"))
    yield path
    for pid in processes_under(path):  # only if a test failed: do not leak
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("sig", SIGNALS)
def test_run_cleans_up_on_a_signal(tmp: Path, sig: int) -> None:
    code = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(1)"
    proc = start([sys.executable, "-m", "osb_sync", "run", code], tmp)
    wait_for_line(proc.stdout, "ready", proc.stderr)
    stop_and_check(proc, sig, tmp)
    assert proc.returncode == 128 + sig


def serve(tmp: Path, *args: str, **env: str) -> tuple[subprocess.Popen[str], str]:
    proc = start([sys.executable, "-m", "osb_sync", "serve", "--port", "0", *args], tmp, **env)
    found = wait_for_line(proc.stderr, r"serving (http://\S+/v1)")
    return proc, found.group(1)


@pytest.mark.parametrize("sig", SIGNALS)
def test_serve_cleans_up_on_a_signal(tmp: Path, sig: int) -> None:
    proc, api = serve(tmp, "--allow-unenforced-network-policy")
    created = requests.post(f"{api}/sandboxes", json=CREATE_BODY, timeout=30).json()
    endpoint = requests.get(f"{api}/sandboxes/{created['id']}/endpoints/44772", timeout=30).json()
    execd = f"http://{endpoint['endpoint']}"
    ran = requests.post(
        f"{execd}/command",
        json={"command": "sleep 600", "background": True},
        headers=endpoint["headers"],
        timeout=30,
    )
    assert ran.status_code == 200
    stop_and_check(proc, sig, tmp)
    assert proc.returncode == 128 + sig  # 130 for Ctrl-C, as a shell reports it
    assert proc.stderr is not None and "interrupted: server stopped" in proc.stderr.read()


def test_serve_that_cannot_bind_leaves_nothing(tmp: Path) -> None:
    with __import__("socket").create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = start([sys.executable, "-m", "osb_sync", "serve", "--port", str(port)], tmp)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 125 and "the port is in use" in err and "--port 0" in err
    assert os.listdir(tmp) == []


def test_serve_on_every_interface_refuses_to_start_without_a_key(tmp: Path) -> None:
    argv = [sys.executable, "-m", "osb_sync", "serve", "--host", "0.0.0.0", "--port", "0"]
    proc = start(argv, tmp)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("serve --host 0.0.0.0 started without an API key")
    assert proc.returncode == 125, err
    assert "OPEN_SANDBOX_API_KEY" in err and "--api-key-file" in err and "--allow-no-api-key" in err
    assert "serving" not in err and os.listdir(tmp) == []


@pytest.mark.parametrize("source", ["environment", "file"])
def test_serve_reads_its_key_without_argv(tmp: Path, source: str) -> None:
    key = "s3cret-key-from-" + source
    if source == "file":
        (tmp / "key").write_text(key + "\n")
        proc, api = serve(tmp, "--api-key-file", str(tmp / "key"))
    else:
        proc, api = serve(tmp, OPEN_SANDBOX_API_KEY=key)
    try:
        assert requests.get(f"{api}/sandboxes", timeout=10).status_code == 401
        headers = {"OPEN-SANDBOX-API-KEY": key}
        assert requests.get(f"{api}/sandboxes", headers=headers, timeout=10).status_code == 200
        with open(f"/proc/{proc.pid}/cmdline", "rb") as cmdline:
            assert key.encode() not in cmdline.read()
    finally:
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 128 + signal.SIGTERM


def test_serve_answers_an_allowed_host(tmp: Path) -> None:
    proc, api = serve(tmp, "--allowed-host", "sandbox.internal")
    try:
        named = requests.get(f"{api}/sandboxes", headers={"Host": "sandbox.internal"}, timeout=10)
        other = requests.get(f"{api}/sandboxes", headers={"Host": "other.example"}, timeout=10)
        assert (named.status_code, other.status_code) == (200, 421)
    finally:
        proc.terminate()
        proc.wait(30)


EMBEDDING_SCRIPT = """
import time
from osb_sync import Client
from osb_sync.local import LocalServer

server = LocalServer(unenforced_network_policy="accept").start()
client = Client(server.api_base)
sandbox = client.create_sandbox()
sandbox.commands.start("sleep 600")
print("ready", flush=True)
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize("sig", SIGNALS)
def test_a_program_embedding_the_server_cleans_up(tmp: Path, sig: int) -> None:
    proc = start([sys.executable, "-c", EMBEDDING_SCRIPT], tmp)
    wait_for_line(proc.stdout, "ready", proc.stderr)  # its failure shows the stderr
    stop_and_check(proc, sig, tmp)


PLUGIN_TEST = """
import time

def test_long(opensandbox_sandbox):
    opensandbox_sandbox.commands.start("sleep 600")
    print("ready", flush=True)
    while True:
        time.sleep(1)
"""


@pytest.mark.parametrize("sig", SIGNALS)
def test_the_pytest_plugin_cleans_up(tmp: Path, sig: int) -> None:
    (tmp / "suite").mkdir()
    (tmp / "suite" / "test_long.py").write_text(textwrap.dedent(PLUGIN_TEST))
    installed = any(e.name == "opensandbox" for e in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "osb_sync.testing"]  # not installed: load it by name
    argv = [sys.executable, "-m", "pytest", "-s", "-q", *plugin]
    argv += ["-p", "no:cacheprovider", str(tmp / "suite")]
    proc = start(argv, tmp)
    wait_for_line(proc.stdout, "ready", proc.stderr)
    stop_and_check(proc, sig, tmp)
    assert proc.returncode != 0  # interrupted, not passed


def test_the_free_port_helper_is_free() -> None:
    port = free_port()
    assert 1 <= port <= 65535


def test_serve_raises_a_low_open_file_limit(tmp: Path) -> None:
    # The connection cap is half the open-file limit: 256 files would cap it at 128.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip("the hard open-file limit is below 1024")
    argv = [sys.executable, "-m", "osb_sync", "serve", "--port", "0"]
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=low_limit)
    try:
        wait_for_line(proc.stderr, "serving")
        with open(f"/proc/{proc.pid}/limits") as limits:
            line = next(text for text in limits if text.startswith("Max open files"))
        assert int(line.split()[3]) >= 1024
    finally:
        proc.terminate()
        proc.wait(30)


SIGTERM_TO_A_THREAD = """
import signal, sys, threading
from osb_sync._cli import main

def signal_this_thread():
    sys.stdin.readline()  # the test writes a line once the server is serving
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

threading.Thread(target=signal_this_thread, daemon=True).start()
sys.exit(main(["serve", "--port", "0"]))
"""


def test_serve_stops_on_a_sigterm_the_kernel_gave_another_thread(tmp: Path) -> None:
    # The kernel may hand a process's SIGTERM to any thread; a main thread asleep for an hour
    # would then run its handler an hour later (seen in CI: serve ignored SIGTERM for 30 s).
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_TO_A_THREAD],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    try:
        wait_for_line(proc.stderr, "serving")
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
