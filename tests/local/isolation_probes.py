"""What the escape tests run: probe code for inside a sandbox, and host-side canaries and checks.

A probe is Python code run with `run_code`: PRELUDE defines `attempt(name, fn, *args)`, which
records what a call returned or raised, and helpers that read, write and connect; the probe
prints every outcome as one JSON line. Host-side helpers make canaries (files, a TCP listener,
a process with a marker in its command line) that code in a sandbox must not reach.

Nothing here reaches beyond loopback: 10.0.2.2 (slirp4netns' alias of the host) is tried only
from a sandbox in a network namespace of its own whose only interfaces are `lo` and `tap0`.
A host pid may number one of the sandbox's own processes in its PID namespace: probes check
the command line (`checked_pid`) before they signal or read one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from osb_sync import OpenSandboxError, Sandbox
from osb_sync.local import LocalServer
from tests.local.support import host_pids_with, local_server

RUN_TIMEOUT = 120.0
PROBE_MARK = "OSB-PROBE "
# Shared by every probe: `attempt` records what a call returned or raised.
PRELUDE = r"""
import json, os, socket, subprocess, sys
_outcomes = {}
def attempt(name, fn, *args):
    try:
        _outcomes[name] = {"ok": True, "value": fn(*args)}
    except BaseException as exc:
        _outcomes[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
def read(path):
    with open(path, "rb") as f:
        return f.read().decode("latin-1")
def write(path):
    with open(path, "x") as f:
        f.write("written from a sandbox")
    return path
def drain(sock, payload):
    sock.sendall(payload.encode())
    chunks = []
    try:
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    except socket.timeout:
        pass
    return b"".join(chunks).decode("latin-1")
def talk(host, port, payload=""):
    with socket.create_connection((host, port), timeout=3) as sock:
        return drain(sock, payload)
NETNS_OF = '''
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(f"/proc/{sys.argv[4]}/ns/net", os.O_RDONLY)
if libc.setns(fd, 0x40000000) != 0:
    sys.exit("setns: " + os.strerror(ctypes.get_errno()))
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3) as sock:
    sock.sendall(sys.argv[3].encode())
    print(sock.recv(65536).decode("latin-1"))
'''
def talk_from_netns_of(pid, host, port, payload=""):
    done = subprocess.run([sys.executable, "-c", NETNS_OF, host, str(port), payload, str(pid)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise OSError(done.stderr.strip()[-300:])
    return done.stdout
def find(name, roots, depth=4):
    found = {}
    for root in roots:
        for here, dirs, files in os.walk(root, onerror=lambda exc: None):
            if here.count(os.sep) - root.count(os.sep) >= depth:
                dirs.clear()
            if name in files:
                found[os.path.join(here, name)] = read(os.path.join(here, name))
    if not found:
        raise FileNotFoundError(f"no {name} under {roots}")
    return found
def unix_sockets(root):
    import stat
    paths = []
    for here, dirs, files in os.walk(root, onerror=lambda exc: None):
        paths += [os.path.join(here, f) for f in files
                  if stat.S_ISSOCK(os.lstat(os.path.join(here, f)).st_mode)]
    return paths
def talk_unix(path, payload):
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(3)
        sock.connect(path)
        return drain(sock, payload)
def behind_slirp(host_netns):
    # In a network namespace of its own whose only interfaces are lo and slirp4netns' tap0?
    with open("/proc/net/dev") as f:
        names = {line.split(":")[0].strip() for line in f.readlines()[2:]}
    return os.stat("/proc/self/ns/net").st_ino != host_netns and names <= {"lo", "tap0"}
def checked_pid(pid, cmdline):
    # pid, if it is the host process with that command line (not one of the sandbox's own)
    try:
        seen = read(f"/proc/{pid}/cmdline")
    except FileNotFoundError:
        raise ProcessLookupError(f"no process {pid} here") from None
    if seen != cmdline:
        raise LookupError(f"pid {pid} is another process here")
    return pid
"""


def _why_bwrap_cannot_isolate() -> str | None:
    """None when this machine's bwrap creates the namespaces a sandbox needs, else why not."""
    if not sys.platform.startswith("linux"):
        return "sandboxes are isolated on Linux only"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (apt-get install bubblewrap slirp4netns)"
    argv = [bwrap, "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    probe = subprocess.run([*argv, "true"], capture_output=True, text=True, timeout=60)
    return f"bwrap cannot create namespaces: {probe.stderr.strip()}" if probe.returncode else None


def _unavailable(reason: str) -> None:
    if os.environ.get("OSB_REQUIRE_ISOLATION") == "1":
        pytest.fail(f"OSB_REQUIRE_ISOLATION=1 but sandboxes cannot be isolated: {reason}")
    pytest.skip(f"sandboxes cannot be isolated here: {reason}")


def isolating_server(**options: Any) -> LocalServer:
    """A started LocalServer that isolates its sandboxes (skips or fails where impossible)."""
    reason = _why_bwrap_cannot_isolate()
    try:
        return local_server(isolation=True, **options).start()
    except Exception as exc:
        if reason is None:  # this machine's bwrap works: the server is at fault
            raise
        _unavailable(f"{reason}; LocalServer(isolation=True): {exc}")


def run(sandbox: Sandbox, code: str) -> str:
    """Run Python `code` in `sandbox`; its stdout (the code must not raise)."""
    result = sandbox.run_code(code, timeout=RUN_TIMEOUT)
    assert result.error is None, (result.error, result.stderr)
    return result.stdout


def probe(sandbox: Sandbox, body: str) -> dict[str, Any]:
    """Run PRELUDE + `body` in `sandbox`; the outcomes its `attempt` calls recorded."""
    stdout = run(sandbox, f"{PRELUDE}\n{body}\nprint({PROBE_MARK!r} + json.dumps(_outcomes))")
    line = next(x for x in stdout.splitlines() if x.startswith(PROBE_MARK))
    outcomes: dict[str, Any] = json.loads(line[len(PROBE_MARK) :])
    return outcomes


def assert_all_failed(outcomes: dict[str, Any], *secrets: str) -> None:
    """Every attempt raised, and no secret appears anywhere in what the probe saw."""
    got_through = {name: repr(o["value"])[:60] for name, o in outcomes.items() if o["ok"]}
    assert not got_through, f"these attempts succeeded: {got_through}"
    found = leaked(json.dumps(outcomes), [json.dumps(s)[1:-1] for s in secrets])
    assert not found, f"leaked into the sandbox: {found}"


def leaked(seen: str, secrets: list[str]) -> list[str]:
    """The beginnings of the `secrets` that occur in `seen` (short: never print a secret)."""
    return [secret[:30] for secret in secrets if secret in seen]


def unique(prefix: str) -> str:
    """`prefix` and a random suffix: a marker no other test or file contains."""
    return f"{prefix}-{uuid.uuid4().hex}"


@contextmanager
def canary_file(directory: str | Path) -> Iterator[tuple[Path, str]]:
    """A file with a unique text in `directory` on the host; removed afterwards."""
    path = Path(directory) / f"{unique('osb-canary')}.txt"
    text = unique("host-canary-text")
    path.write_text(text)
    try:
        yield path, text
    finally:
        path.unlink(missing_ok=True)


@contextmanager
def host_listener(abstract: bool = False) -> Iterator[tuple[Any, str, list[Any]]]:
    """A listener on the host: its address, the greeting it sends and who connected.

    A TCP port on 127.0.0.1, or with `abstract` a name in the abstract Unix socket namespace
    (which belongs to the network namespace, like loopback).
    """
    greeting = unique("host-listener")
    accepted: list[Any] = []
    if abstract:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(f"\0{greeting}")
        sock.listen()
    else:
        sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = sock.accept()
            except OSError:
                continue
            accepted.append(peer)
            with conn:
                conn.sendall(greeting.encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield sock.getsockname() if abstract else sock.getsockname()[1], greeting, accepted
    finally:
        stop.set()
        thread.join()
        sock.close()


@contextmanager
def host_process(marker: str) -> Iterator[subprocess.Popen[bytes]]:
    """A host process with `marker` in its command line; killed afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def kill_host_processes_with(marker: str) -> None:
    """SIGKILL the host processes with `marker` in their command line (what escaped a test)."""
    for pid in host_pids_with(marker):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def where(sandbox: Sandbox, relative: str) -> str:
    """The absolute path of `relative` as `sandbox` itself sees it."""
    return run(sandbox, f"import os; print(os.path.abspath({relative!r}))").strip()


def host_text(path: str) -> str | None:
    """What the host (the test) reads at `path`, None when it cannot."""
    try:
        return Path(path).read_bytes().decode("latin-1")
    except OSError:
        return None


def shadow_secrets() -> list[str]:
    """Lines of the host's /etc/shadow, when the test may read it."""
    text = host_text("/etc/shadow")
    return [line for line in (text or "").splitlines() if line.strip()]


ESCAPES = r"""
import subprocess, sys
SLEEPER = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "signal.signal(signal.SIGHUP, signal.SIG_IGN); time.sleep(1000)")
DOUBLE_FORK = ("import os, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
               "        argv = [sys.executable, '-c', sys.argv[1], sys.argv[2]]\n"
               "        os.execv(sys.executable, argv)\n"
               "os._exit(0)")
quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
subprocess.Popen([sys.executable, "-c", SLEEPER, MARKER + "-setsid"], start_new_session=True,
                 **quiet)
subprocess.Popen(["nohup", sys.executable, "-c", SLEEPER, MARKER + "-nohup"], **quiet)
subprocess.run([sys.executable, "-c", DOUBLE_FORK, SLEEPER, MARKER + "-double-fork"], **quiet)
"""


REACH = """
attempt("{label}127.0.0.1", talk, "127.0.0.1", {port}, {payload!r})
for pid in (1, {server_pid}):
    attempt(f"{label}127.0.0.1 from the netns of pid {{pid}}", talk_from_netns_of, pid,
            "127.0.0.1", {port}, {payload!r})
if behind_slirp({host_netns}):
    attempt("{label}10.0.2.2", talk, "10.0.2.2", {port}, {payload!r})
"""


def reach(port: int, payload: str = "", label: str = "") -> str:
    """Probe lines that connect to host loopback `port`, directly and from the host's netns.

    The host's network namespace is entered through pid 1 and the server's pid, which a
    sandbox outside a PID namespace sees; attempts are named `label` + how they connected.
    """
    return REACH.format(
        port=port,
        payload=payload,
        label=label,
        server_pid=os.getpid(),
        host_netns=os.stat("/proc/self/ns/net").st_ino,
    )


LISTENER = r"""
import socket, subprocess, sys
SERVE = r'''
import socket, sys
sock = socket.create_server(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
answer = ("HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(sys.argv[1]), sys.argv[1]))
while True:
    conn, _ = sock.accept()
    with conn:
        conn.recv(65536)
        conn.sendall(answer.encode())
'''
listener = subprocess.Popen([sys.executable, "-c", SERVE, GREETING], stdout=subprocess.PIPE,
                            start_new_session=True)
print(int(listener.stdout.readline()))
"""


def through_files_api(call: Callable[[], Any]) -> Any:
    """What a files API call returned, or the text of the error it raised."""
    try:
        return call()
    except OpenSandboxError as exc:
        return f"{type(exc).__name__}: {exc}"
