"""The main process of a sandbox's container: its execd, JUPYTER_PORT and the server's relay.

Run as a script by path (`python -I -S execd/main.py RELAY_FD READY_FD`), inside the
sandbox's bubblewrap container or, where isolation is impossible, as a plain subprocess; or,
in a root server's default sandbox, forked from the execd template (`template.py`), which calls
`main` with descriptors 3 and 4 once it has entered the container. Its first line of standard
input is the start line, the second the claim line (`protocol.Start` and `protocol.Claim`,
declared in `local/protocol.py`, which the server imports too). Between them the container is
a warm spare: imported, sockets bound, serving nothing. The token never appears in
an environment or a command line the sandbox could read (except an execd binary's environment:
it takes the token in EXECD_ACCESS_TOKEN, as in OpenSandbox). Once claimed it

- serves our Python execd (`router.ExecdApp`) on 127.0.0.1:`execd_port` (44772 in a container,
  an ephemeral port without one), refusing requests without the token;
- accepts and drops connections on 127.0.0.1:`jupyter_port` (the official code interpreter
  probes `/dev/tcp/127.0.0.1/$JUPYTER_PORT` before it runs anything);
- relays each connection of the listening Unix socket RELAY_FD (made by the server in a
  directory the sandbox cannot see) to the port named on its first line, `PORT\\n`, answering
  `ok\\n` or `error ...\\n`: the server reaches execd and every port only this way;
- or, when the start line names an `execd_binary`, runs that binary on 44772 (and a
  Jupyter server on `jupyter_port` when it names `jupyter`) as children (`binary_child.py`),
  started once claimed, and relays to them instead;
- once execd is up, starts the claim line's `entrypoint` (OpenSandbox's bootstrap order: execd
  first, then the user's process), a child in its own process group with the sandbox's
  environment, in its working directory, its standard input an open pipe, its output on this
  process's standard error (the container log); none when the line has none;
- writes `ready\\n` to READY_FD once started (a spare waits for its claim there), `serving\\n`
  once claimed, and exits once standard input reaches EOF (the server went away or deletes the
  sandbox), killing what its execd started; or once the entrypoint exits, with its exit code
  (128+N for signal N; 127 with a line on standard error when its program cannot be run), as
  a Docker container ends with its main process.

It loads `osb_sync.local` without running `osb_sync/__init__.py`, so it never imports the
client (nor `requests`): standard library only.
"""

from __future__ import annotations

import ctypes
import hmac
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any


def load_package() -> None:
    """Make `osb_sync.local` importable without importing `osb_sync` itself (the client)."""
    local = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, path in (("osb_sync", os.path.dirname(local)), ("osb_sync.local", local)):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package


load_package()  # run by path, this directory is not a package yet
from osb_sync.local.protocol import Claim, Start  # noqa: E402

EXECD_PORT = 44772
TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"  # noqa: S105 (a header name)
UNAUTHORIZED = {"error": f"Unauthorized: invalid or missing header {TOKEN_HEADER}"}
PR_SET_DUMPABLE = 4


def pump(source: socket.socket, target: socket.socket) -> None:
    """Copy bytes from `source` to `target` until EOF, then half-close `target`."""
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    try:
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def relay(client: socket.socket, ports: dict[int, int]) -> None:
    """Serve one relay request: read the port, connect on loopback, then copy both ways."""
    with client:
        line = b""
        while not line.endswith(b"\n") and len(line) < 16:
            byte = client.recv(1)
            if not byte:
                return
            line += byte
        try:
            port = int(line)
            upstream = socket.create_connection(("127.0.0.1", ports.get(port, port)), timeout=10)
        except (OSError, ValueError) as exc:
            client.sendall(f"error {exc}\n".encode())
            return
        with upstream:
            upstream.settimeout(None)
            client.sendall(b"ok\n")
            back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
            back.start()
            pump(client, upstream)
            back.join()


def accept_forever(server: socket.socket, ports: dict[int, int] | None) -> None:
    """Accept connections: relay them when `ports` is given, else drop them at once."""
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        if ports is None:
            conn.close()
        else:
            threading.Thread(target=relay, args=(conn, ports), daemon=True).start()


def container_status(returncode: int) -> int:
    """A process's exit as a container reports it: its code, or 128+N for signal N (-N)."""
    return 128 - returncode if returncode < 0 else returncode


def hide_memory() -> None:
    """Keep sandbox code (same uid, no CAP_SYS_PTRACE) out of this process's /proc memory."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: there is no container to hide from either


def close_namespaces() -> None:
    """Close the namespace descriptors this process inherited (bwrap leaves the one of
    `--userns` open): nothing in the sandbox needs them."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return  # no /proc: not a container
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, gone
        if target.startswith(("user:[", "net:[", "mnt:[", "pid:[", "ipc:[", "uts:[")):
            os.close(int(name))


def wait_for_claim(ready_fd: int) -> Claim | None:
    """Report ready, then read the claim line (None: stdin closed, the spare was not needed)."""
    os.write(ready_fd, b"ready\n")
    line = sys.stdin.buffer.readline()
    if not line:
        return None
    claim = Claim.decode(line)
    if claim.process_limit:  # before anything of the sandbox's runs; no sandbox may raise it
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]  # the server's user's, which holds
        limit = claim.process_limit  # anyway: a larger ask is that (raising it needs a cap)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
        # Every other process of the sandbox too, its init first: one left at the server's
        # limit could be made to fork past it (ptrace). The server does it where it may: a
        # root one without CAP_SYS_RESOURCE may not, and these are execd's own id.
        for pid in sorted(int(name) for name in os.listdir("/proc") if name.isdigit()):
            try:
                hard = resource.prlimit(pid, resource.RLIMIT_NPROC)[1]
                own = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
                resource.prlimit(pid, resource.RLIMIT_NPROC, (own, own))
            except OSError:
                pass  # gone, or another id's (none before the claim): the server's stands
    return claim


class Entrypoint:
    """The sandbox's main process, started after execd (see the module docstring)."""

    def __init__(self, argv: tuple[str, ...] | None) -> None:
        self.argv = list(argv) if argv else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.failure = ""  # why it could not be started
        self._stdin_w = -1  # held open: a shell as entrypoint waits on it, never sees EOF

    def start(self, spawn: Any) -> None:
        """Start it with `spawn(argv, stdin=...)` (a Popen); a failure is kept, not raised."""
        if not self.argv:
            return
        stdin_r, self._stdin_w = os.pipe()
        try:
            self.proc = spawn(self.argv, stdin=stdin_r)
        except OSError as exc:
            self.failure = f"the entrypoint {self.argv[0]!r} could not be started: {exc.strerror}"
        finally:
            os.close(stdin_r)

    def wait_or_eof(self) -> int | None:
        """Block until standard input reaches EOF (None) or the entrypoint ends (its code)."""
        if self.failure:
            print(f"osb-sync: {self.failure}", file=sys.stderr, flush=True)
            return 127
        if self.proc is None:
            sys.stdin.buffer.read()
            return None
        proc = self.proc
        ended_r, ended_w = os.pipe()

        def watch() -> None:
            proc.wait()
            os.close(ended_w)  # wakes the selector below

        threading.Thread(target=watch, daemon=True).start()
        # stdin is read here, not in a thread: a thread blocked on it aborts the exit
        with selectors.DefaultSelector() as selector:
            selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
            selector.register(ended_r, selectors.EVENT_READ)
            while not any(key.fd == ended_r for key, _ in selector.select()):
                if not os.read(sys.stdin.fileno(), 65536):
                    break  # EOF: the server deletes the sandbox, or went away
        os.close(ended_r)
        code = proc.poll()
        return None if code is None else container_status(code)

    def stop(self) -> None:
        """Kill its process group (whatever it started too)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
        if self._stdin_w >= 0:
            os.close(self._stdin_w)
            self._stdin_w = -1


def serve(start: Start, relay_server: socket.socket, ready_fd: int) -> int | None:
    """Start up, report ready, wait for the claim line, then serve until stdin EOF (None) or
    the entrypoint's end (its exit code)."""
    if start.execd_binary:
        return serve_binary(start, relay_server, ready_fd)
    from osb_sync.local.execd import router, runner
    from osb_sync.local.http import exchange, httpd

    jupyter = socket.create_server(("127.0.0.1", start.jupyter_port))
    hosts = httpd.host_names("127.0.0.1", ())
    server = httpd.HTTPServer(
        ("127.0.0.1", start.execd_port), lambda ex: None, httpd.Limits(), hosts
    )
    claim = wait_for_claim(ready_fd)
    if claim is None:
        return None  # a spare the server never claimed
    env = {**claim.env, "JUPYTER_PORT": str(jupyter.getsockname()[1])}
    runtime = runner.SandboxRuntime(
        Path(start.home),
        Path(start.run_dir),
        env,
        claim.address_space_limit,
        Path(start.oom_control) if start.oom_control else None,
        start.user,
        start.python,
    )
    app = router.ExecdApp(runtime, start.ping_interval, start.command_grace)
    token = claim.token.encode()

    def route(ex: exchange.Exchange) -> None:
        given = (ex.headers.get(TOKEN_HEADER) or "").encode()
        if not hmac.compare_digest(given, token):
            raise exchange.HttpError(401, UNAUTHORIZED)
        app.handle(ex, ex.path)

    server.route = route
    ports = {EXECD_PORT: server.server_address[1]}
    stopped = threading.Event()
    for target, args in (
        (server.serve_forever, (0.5,)),
        (server.watch_deadlines, (stopped,)),
        (accept_forever, (jupyter, None)),
        (accept_forever, (relay_server, ports)),
    ):
        threading.Thread(target=target, args=args, daemon=True).start()
    entrypoint = Entrypoint(claim.entrypoint)
    entrypoint.start(lambda argv, stdin: runtime.spawn(argv, stdin=stdin, stdout=2, stderr=2))
    os.write(ready_fd, b"serving\n")
    os.close(ready_fd)
    code = entrypoint.wait_or_eof()
    stopped.set()
    app.close()
    entrypoint.stop()
    runtime.close()
    return code


def serve_binary(start: Start, relay_server: socket.socket, ready_fd: int) -> int | None:
    """Like `serve`, with an execd binary (and a Jupyter server) as children instead of ours."""
    from osb_sync.local.execd.binary_child import ExecdChildren, ExecdStartError

    claim = wait_for_claim(ready_fd)
    if claim is None:
        return None  # a spare the server never claimed
    children = ExecdChildren(start, claim)
    if start.jupyter is None:  # nothing else listens on JUPYTER_PORT: the sink does
        sink = socket.create_server(("127.0.0.1", start.jupyter_port))
        threading.Thread(target=accept_forever, args=(sink, None), daemon=True).start()
    try:
        assert start.execd_binary is not None
        children.start(start.execd_binary, start.jupyter, start.execd_port)
    except ExecdStartError as exc:
        print(f"the execd binary did not start: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    threading.Thread(target=accept_forever, args=(relay_server, {}), daemon=True).start()
    entrypoint = Entrypoint(claim.entrypoint)
    uid, gid = start.user or (None, None)
    entrypoint.start(
        lambda argv, stdin: subprocess.Popen(
            argv,
            cwd=start.home,
            env=claim.env,
            stdin=stdin,
            stdout=2,
            stderr=2,
            start_new_session=True,
            user=uid,
            group=gid,
            extra_groups=None if uid is None else [],
        )
    )
    os.write(ready_fd, b"serving\n")
    os.close(ready_fd)
    code = entrypoint.wait_or_eof()
    entrypoint.stop()
    children.stop()
    return code


def main(argv: list[str]) -> int:
    """Read the start line from standard input, then serve (see `serve`) until it closes or
    the entrypoint ends; the exit code is the entrypoint's, else 0."""
    hide_memory()
    close_namespaces()
    try:  # a server not root: its user's groups, which the sandbox's namespace does not map
        os.setgroups([])
    except OSError:
        pass  # not root, not isolated: its groups are the server's
    relay_server = socket.socket(fileno=int(argv[1]))
    start = Start.decode(sys.stdin.buffer.readline())
    if start.file_size_limit:
        limit = start.file_size_limit
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    code = serve(start, relay_server, int(argv[2]))
    return code or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
