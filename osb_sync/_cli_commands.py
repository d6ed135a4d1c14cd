"""The subcommands of ``osb-sync`` (parsed by ``osb_sync._cli``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Callable, TextIO

from ._cli_output import (
    EXIT_RAISED,
    EXIT_SIGNAL_BASE,
    EXIT_TIMED_OUT,
    ROUTINE_MESSAGES,
    command_json,
    command_status,
    print_table,
    progress,
    sandbox_json,
    sandbox_row,
)
from ._client import Client
from ._config import check_run_arguments
from ._constants import API_BASE_ENV, API_KEY_ENV, DOMAIN_ENV, MAX_OUTPUT_BYTES
from ._errors import SandboxTimeoutError
from ._models import Event, ExecutionResult
from ._sandbox import Sandbox

if TYPE_CHECKING:
    from .local import LocalServer

UNENFORCED_POLICY = (
    "sandboxes cannot be isolated here, so the local server cannot enforce the "
    "deny-all network policy: code in its sandboxes can reach the network"
)
NOT_A_BOUNDARY = (
    "a development server: keep it on loopback; each sandbox is a bubblewrap container "
    "where bubblewrap works, else NOT isolated from this machine"
)
SERVER_HINT = f"pass --api-base or set {API_BASE_ENV} (start a server with: osb-sync serve)"


class UsageError(Exception):
    """Bad command-line input."""


class RunTimedOut(Exception):
    """The run passed its --timeout (exit 124)."""


def cmd_run(args: argparse.Namespace) -> int:
    """``osb-sync run``: create a sandbox, stream the code's output live, delete the sandbox."""
    code = _read_code(args)
    check_run_arguments(code, args.language, MAX_OUTPUT_BYTES, args.timeout)
    if args.keep and not _remote_configured(args):
        raise UsageError(
            "--keep needs a server that outlives this command (the embedded one stops with "
            f"it): {SERVER_HINT}"
        )
    with _client_or_local_server(args) as client:
        with progress("creating a sandbox"):
            sandbox = client.create_sandbox(
                template=args.template, allow_internet_access=args.allow_internet or None
            )
        try:
            _show_status_message(client, sandbox.id)
            if args.language == "bash":
                return _run_bash(sandbox, code, args)
            return _run_code(sandbox, code, args)
        finally:
            if args.keep:
                print(f"osb-sync: kept sandbox {sandbox.id}", file=sys.stderr)
            else:
                client.delete_quietly(sandbox.id)


def _run_code(sandbox: Sandbox, code: str, args: argparse.Namespace) -> int:
    try:
        result = sandbox.run_code(
            code,
            language=args.language,
            timeout=args.timeout,
            on_event=None if args.json else _echo_output,
        )
    except SandboxTimeoutError as exc:
        raise RunTimedOut(str(exc)) from exc
    return _print_result(result, args.json)


def _run_bash(sandbox: Sandbox, code: str, args: argparse.Namespace) -> int:
    """Bash runs as a command: its exit status comes back (``/code`` carries none)."""
    return _run_command(sandbox, code, args)


def cmd_serve(args: argparse.Namespace) -> int:
    """``osb-sync serve``: the local server in the foreground until Ctrl-C (exit 128+n)."""
    from .local import LocalServer
    from .local.host import options as server_options

    if args.api_base:
        raise UsageError("serve starts a server and takes no --api-base: use --host and --port")
    _raise_file_limit()
    try:
        server = LocalServer(**server_options.keywords(args, api_key=_server_key(args)))
        server.start()
    except (ValueError, RuntimeError) as exc:  # a bad --execd/--jupyter, or no isolation
        raise UsageError(str(exc)) from None
    try:
        _announce(server, args.json)
        # Until a signal (LocalServer.serve_forever would swallow it), in short sleeps: a SIGTERM
        # the kernel hands to another thread (one forking a container, say) does not wake this
        # one, whose Python handler then runs only when its sleep ends.
        while True:
            time.sleep(0.5)
    except KeyboardInterrupt as exc:
        print("osb-sync: interrupted: server stopped", file=sys.stderr)
        return EXIT_SIGNAL_BASE + int(getattr(exc, "signum", 2))
    finally:
        server.stop()


def _announce(server: LocalServer, as_json: bool) -> None:
    if as_json:
        line = {
            "api_base": server.api_base,
            "pid": os.getpid(),
            "api_key_required": server.api_key is not None,
            "network_policy_enforced": server.network_policy_enforced,
        }
        print(json.dumps(line), flush=True)
    print(f"osb-sync: serving {server.api_base} ({_isolation_line(server)})", file=sys.stderr)
    if server.api_key is None:
        print(f"osb-sync: warning: no API key ({API_KEY_ENV} is not set)", file=sys.stderr)
    if not server.network_policy_enforced:
        print(f"osb-sync: warning: {UNENFORCED_POLICY}", file=sys.stderr)


def _raise_file_limit(wanted: int = 4096) -> None:
    """Raise the soft open-file limit towards `wanted` (the connection cap is half of it)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _server_key(args: argparse.Namespace) -> str | None:
    """The key `serve` requires: --api-key-file, else --api-key, else the environment."""
    if args.api_key_file and args.api_key:
        raise UsageError("give --api-key-file or --api-key, not both")
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as handle:
            key = handle.readline().strip()
        if not key:
            raise UsageError(f"{args.api_key_file} holds no API key")
        return key
    return args.api_key or os.environ.get(API_KEY_ENV) or None


def cmd_create(args: argparse.Namespace) -> int:
    """``osb-sync create``: print the new sandbox's id (it is not deleted)."""
    with _remote_client(args) as client:
        with progress("creating a sandbox"):
            sandbox = client.create_sandbox(
                template=args.template,
                timeout=args.lifetime,
                metadata=_pairs(args.metadata, "--metadata"),
                env_vars=_pairs(args.env, "--env"),
                allow_internet_access=args.allow_internet or None,
            )
        info = client.get_sandbox(sandbox.id)
    if args.json:
        print(json.dumps(sandbox_json(info)))
    else:
        _print_status_message(info.message)
        print(sandbox.id)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """``osb-sync list``: a table (or a JSON array) of sandboxes."""
    with _remote_client(args) as client:
        metadata = _pairs(args.metadata, "--metadata")
        infos = list(client.list_sandboxes(states=args.state or None, metadata=metadata))
    if args.json:
        print(json.dumps([sandbox_json(info) for info in infos]))
    else:
        rows = [sandbox_row(info) for info in infos]
        print_table(rows, ["id", "state", "created_at", "expires_at", "metadata"])
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    """``osb-sync get ID``: one sandbox's description."""
    with _remote_client(args) as client:
        info = client.get_sandbox(args.id)
    if args.json:
        print(json.dumps(sandbox_json(info)))
    else:
        for key, value in sandbox_row(info).items():
            print(f"{key + ':':<12} {value}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """``osb-sync delete ID...``: exit 1 if any was not found."""
    outcomes = []
    with _remote_client(args) as client:
        for sandbox_id in args.ids:
            deleted = client.delete_sandbox(sandbox_id)
            outcomes.append({"id": sandbox_id, "deleted": deleted})
            if not args.json:
                print(f"{'deleted' if deleted else 'not found'} {sandbox_id}")
    if args.json:
        print(json.dumps(outcomes))
    return 0 if all(o["deleted"] for o in outcomes) else EXIT_RAISED


def cmd_exec(args: argparse.Namespace) -> int:
    """``osb-sync exec ID CMD...``: run a shell command in a sandbox; exit with its status."""
    if not args.cmd:
        raise UsageError("exec needs a command: osb-sync exec ID CMD...")
    command = args.cmd[0] if len(args.cmd) == 1 else shlex.join(args.cmd)
    with _remote_client(args) as client:
        return _run_command(client.connect(args.id), command, args)


def _run_command(sandbox: Sandbox, command: str, args: argparse.Namespace) -> int:
    """Run a shell command, echoing its output live (unless --json); its exit status."""
    echo = not args.json
    result = sandbox.commands.run(
        command,
        timeout=args.timeout,
        on_stdout=_writer(sys.stdout) if echo else None,
        on_stderr=_writer(sys.stderr) if echo else None,
    )
    status = command_status(result)
    if args.json:
        print(json.dumps(command_json(result)))
    elif status == EXIT_TIMED_OUT:
        print(f"osb-sync: the command passed --timeout ({args.timeout:g} s)", file=sys.stderr)
    return status


# -- helpers --------------------------------------------------------------------------------


def _read_code(args: argparse.Namespace) -> str:
    if args.file and args.code:
        raise UsageError("give the code or --file, not both")
    if args.file:
        with open(args.file, "rb") as handle:
            data = handle.read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"{args.file} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}): "
                "run takes source code; copy a binary file into a sandbox with files.write"
            ) from None
    if args.code == "-":
        return sys.stdin.read()
    if args.code is None:
        raise UsageError("no code: osb-sync run CODE, run -f FILE, or run - (standard input)")
    return str(args.code)


def _remote_configured(args: argparse.Namespace) -> bool:
    return bool(args.api_base or os.environ.get(API_BASE_ENV) or os.environ.get(DOMAIN_ENV))


def _remote_client(args: argparse.Namespace) -> Client:
    if not _remote_configured(args):
        raise UsageError(f"this command needs a server: {SERVER_HINT}")
    return Client(args.api_base, args.api_key)


@contextlib.contextmanager
def _client_or_local_server(args: argparse.Namespace) -> Iterator[Client]:
    """A client of the configured server, or of an embedded local server started for the run."""
    if _remote_configured(args):
        with Client(args.api_base, args.api_key) as client:
            yield client
        return
    from .local import LocalServer

    # The line below says what the server's start-up warning would say, in the CLI's words.
    logging.getLogger("osb_sync.local").setLevel(logging.ERROR)
    # One sandbox per process: a spare would only be started to be killed at exit.
    with LocalServer(unenforced_network_policy="accept", spare_containers=0) as server:
        if not server.isolated:
            print(f"osb-sync: warning: {_isolation_line(server)}", file=sys.stderr)
        with Client(server.api_base, server.api_key) as client:
            yield client


def _isolation_line(server: LocalServer) -> str:
    """What the local server's sandboxes are, and how to isolate them where they are not."""
    if server.isolated:
        return "sandboxes are bubblewrap containers with their own namespaces"
    from .local.host.bwrap import FIX

    return (
        f"sandboxes are NOT isolated ({server.isolation_problem}): code runs as this user on "
        f"this machine; to isolate them, {FIX}"
    )


def _show_status_message(client: Client, sandbox_id: str) -> None:
    """The server's status message, once, when it says more than the routine."""
    _print_status_message(client.get_sandbox(sandbox_id).message)


def _print_status_message(message: str | None) -> None:
    if message and message.strip() not in ROUTINE_MESSAGES:
        print(f"osb-sync: server: {message.strip()}", file=sys.stderr)


def _writer(stream: TextIO) -> Callable[[str], None]:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


def _echo_output(event: Event) -> None:
    stream: TextIO | None = {"stdout": sys.stdout, "stderr": sys.stderr}.get(event.type)
    if stream is not None and event.text:
        stream.write(event.text)
        stream.flush()


def _print_result(result: ExecutionResult, as_json: bool) -> int:
    if as_json:
        print(json.dumps(result.to_dict()))
    else:
        for item in result.results:
            if "text" in item:
                print(item["text"])
        if result.error is not None:
            error = result.error
            lines = error.traceback or [f"{error.name}: {error.value}"]
            print("\n".join(lines), file=sys.stderr)
    return EXIT_RAISED if result.error is not None else 0


def _pairs(items: list[str], option: str) -> dict[str, str] | None:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes KEY=VALUE, got {item!r}")
        pairs[key] = value
    return pairs or None
