"""The ``osb-sync`` command line: run code in a sandbox, serve the local server, manage sandboxes.

Exit codes: 0 success, 1 runtime error (or the code raised), 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any, Callable, TextIO

from .client import Client
from .constants import API_BASE_ENV, API_KEY_ENV, DOMAIN_ENV, VERSION
from .errors import ConfigurationError, OpenSandboxError
from .models import Event, ExecutionResult, SandboxInfo

UNENFORCED_POLICY = (
    "network namespaces are not available here, so the local server cannot enforce the "
    "deny-all network policy: code in its sandboxes can reach the network"
)
NOT_A_BOUNDARY = (
    "a development server, NOT a security boundary: sandboxes run as this user on this machine"
)


class UsageError(Exception):
    """Bad command-line input (exit code 2)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.debug:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    previous = _interrupt_on_sigterm()
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        print("osb-sync: interrupted", file=sys.stderr)
        return 130
    except (UsageError, ConfigurationError) as exc:
        _report(args, exc)
        return 2
    except (OpenSandboxError, OSError) as exc:
        _report(args, exc)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _interrupt_on_sigterm() -> Any:
    """Make SIGTERM unwind like Ctrl-C, so sandboxes and an embedded server are cleaned up.

    Returns the previous handler, or None when nothing was changed.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _report(args: argparse.Namespace, exc: BaseException) -> None:
    if args.debug:
        traceback.print_exc()
    print(f"osb-sync: error: {exc}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--api-base", help=f"lifecycle URL with /v1 (env {API_BASE_ENV})")
    common.add_argument("--api-key", help="API key (env OPEN_SANDBOX_API_KEY)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--debug", action="store_true", help="log requests; tracebacks on errors")

    parser = argparse.ArgumentParser(
        prog="osb-sync", description="Run code in OpenSandbox sandboxes."
    )
    parser.add_argument("--version", action="version", version=f"osb-sync {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run",
        parents=[common],
        help="run code in a new sandbox (on an embedded local server by default)",
        description="Run code in a new sandbox. Without --api-base or "
        f"{API_BASE_ENV}, an embedded local server ({NOT_A_BOUNDARY}) is started.",
    )
    run.add_argument("code", nargs="?", help="the code; '-' reads standard input")
    run.add_argument("-f", "--file", help="read the code from this file")
    run.add_argument("--language", default="python", help="python (default) or bash")
    run.add_argument("--keep", action="store_true", help="do not delete the sandbox")
    run.add_argument("--timeout", type=float, help="seconds the run may take")
    run.add_argument("--template", help="image of the sandbox")
    run.add_argument("--allow-internet", action="store_true", help="no deny-all network policy")
    run.set_defaults(handler=cmd_run)

    serve = sub.add_parser(
        "serve", parents=[common], help="run the local server in the foreground",
        description=f"Run the local OpenSandbox-compatible server: {NOT_A_BOUNDARY}.",
    )  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (keep loopback)")
    serve.add_argument(
        "--api-key-file", metavar="PATH", help="read the API key from this file (first line)"
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host header is NAME (repeatable)",
    )
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--min-timeout", type=int, default=60, help="smallest sandbox timeout")
    serve.add_argument("--pending-seconds", type=float, default=0.0, help="provisioning delay")
    serve.add_argument(
        "--allow-unenforced-network-policy",
        action="store_true",
        help="accept deny-all network policies even where they cannot be enforced",
    )
    serve.set_defaults(handler=cmd_serve)

    create = sub.add_parser("create", parents=[common], help="create a sandbox and print its id")
    create.add_argument("--template", help="image of the sandbox")
    create.add_argument("--timeout", type=int, help="lifetime in seconds (default 300)")
    create.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    create.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    create.add_argument("--allow-internet", action="store_true", help="no deny-all network policy")
    create.set_defaults(handler=cmd_create)

    listing = sub.add_parser("list", parents=[common], help="list sandboxes")
    listing.add_argument("--state", action="append", default=[], help="filter (repeatable)")
    listing.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    listing.set_defaults(handler=cmd_list)

    get = sub.add_parser("get", parents=[common], help="describe a sandbox")
    get.add_argument("id")
    get.set_defaults(handler=cmd_get)

    delete = sub.add_parser("delete", parents=[common], help="delete sandboxes")
    delete.add_argument("ids", nargs="+", metavar="ID")
    delete.set_defaults(handler=cmd_delete)

    execute = sub.add_parser("exec", parents=[common], help="run a shell command in a sandbox")
    execute.add_argument("id")
    execute.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD")
    execute.set_defaults(handler=cmd_exec)
    return parser


# -- commands -------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    """``osb-sync run``: create a sandbox, stream the code's output live, delete the sandbox."""
    code = _read_code(args)
    with _client_or_local_server(args) as client:
        with _progress("creating a sandbox"):
            sandbox = client.create_sandbox(
                template=args.template, allow_internet_access=args.allow_internet or None
            )
        try:
            result = sandbox.run_code(
                code,
                language=args.language,
                timeout=args.timeout,
                on_event=None if args.json else _echo_output,
            )
        finally:
            if args.keep:
                print(f"osb-sync: kept sandbox {sandbox.id}", file=sys.stderr)
            else:
                client._delete_quietly(sandbox.id)
    return _print_result(result, args.json)


def cmd_serve(args: argparse.Namespace) -> int:
    """``osb-sync serve``: the local server in the foreground until Ctrl-C."""
    from .local import LocalServer

    _raise_file_limit()
    server = LocalServer(
        args.host,
        args.port,
        api_key=_server_key(args),
        allowed_hosts=args.allowed_host,
        min_timeout=args.min_timeout,
        pending_seconds=args.pending_seconds,
        unenforced_network_policy="accept" if args.allow_unenforced_network_policy else "refuse",
    )
    server.start()
    print(f"osb-sync: serving {server.api_base} ({NOT_A_BOUNDARY})", file=sys.stderr)
    if server.api_key is None:
        print(f"osb-sync: warning: no API key ({API_KEY_ENV} is not set)", file=sys.stderr)
    if not server.network_policy_enforced:
        print(f"osb-sync: warning: {UNENFORCED_POLICY}", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("osb-sync: shutting down", file=sys.stderr)
    finally:
        server.stop()
    return 0


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
        with _progress("creating a sandbox"):
            sandbox = client.create_sandbox(
                template=args.template,
                timeout=args.timeout,
                metadata=_pairs(args.metadata, "--metadata"),
                env_vars=_pairs(args.env, "--env"),
                allow_internet_access=args.allow_internet or None,
            )
    if args.json:
        print(json.dumps({"id": sandbox.id, "execd_endpoint": sandbox.execd_endpoint}))
    else:
        print(sandbox.id)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """``osb-sync list``: a table (or JSON lines) of sandboxes."""
    with _remote_client(args) as client:
        infos = client.list_sandboxes(
            states=args.state or None, metadata=_pairs(args.metadata, "--metadata")
        )
        rows = [_info_row(info) for info in infos]
    if args.json:
        print(json.dumps(rows))
    else:
        _print_table(rows, ["id", "state", "created_at", "expires_at", "metadata"])
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    """``osb-sync get ID``: one sandbox's description."""
    with _remote_client(args) as client:
        row = _info_row(client.get_sandbox(args.id))
    if args.json:
        print(json.dumps(row))
    else:
        for key, value in row.items():
            print(f"{key + ':':<12} {value}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """``osb-sync delete ID...``: exit 1 if any was not found."""
    missing = 0
    with _remote_client(args) as client:
        for sandbox_id in args.ids:
            deleted = client.delete_sandbox(sandbox_id)
            missing += not deleted
            print(f"{'deleted' if deleted else 'not found'} {sandbox_id}")
    return 1 if missing else 0


def cmd_exec(args: argparse.Namespace) -> int:
    """``osb-sync exec ID CMD...``: run a shell command in an existing sandbox."""
    if not args.cmd:
        raise UsageError("exec needs a command: osb-sync exec ID CMD...")
    command = args.cmd[0] if len(args.cmd) == 1 else shlex.join(args.cmd)
    with _remote_client(args) as client:
        echo = None if args.json else sys.stdout.write
        result = client.connect(args.id).run_command(
            command, on_stdout=echo, on_stderr=None if args.json else sys.stderr.write
        )
    if args.json:
        print(json.dumps({k: v for k, v in result.__dict__.items() if k != "error"}))
    return 0 if result.exit_code == 0 else 1


# -- helpers --------------------------------------------------------------------------------


def _read_code(args: argparse.Namespace) -> str:
    if args.file and args.code:
        raise UsageError("give the code or --file, not both")
    if args.file:
        with open(args.file, encoding="utf-8") as handle:
            return handle.read()
    if args.code == "-":
        return sys.stdin.read()
    if args.code is None:
        raise UsageError("no code: osb-sync run CODE, run -f FILE, or run - (standard input)")
    return str(args.code)


def _remote_configured(args: argparse.Namespace) -> bool:
    return bool(args.api_base or os.environ.get(API_BASE_ENV) or os.environ.get(DOMAIN_ENV))


def _remote_client(args: argparse.Namespace) -> Client:
    if not _remote_configured(args):
        raise UsageError(
            f"this command needs a server: pass --api-base or set {API_BASE_ENV} "
            "(start one with: osb-sync serve)"
        )
    return Client(args.api_base, args.api_key)


@contextlib.contextmanager
def _client_or_local_server(args: argparse.Namespace) -> Iterator[Client]:
    """A client of the configured server, or of an embedded local server started for the run."""
    if _remote_configured(args):
        with Client(args.api_base, args.api_key) as client:
            yield client
        return
    from .local import LocalServer

    with LocalServer(unenforced_network_policy="accept") as server:
        if not args.allow_internet and not server.network_policy_enforced:
            print(f"osb-sync: warning: {UNENFORCED_POLICY}", file=sys.stderr)
        with Client(server.api_base, server.api_key) as client:
            yield client


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
    return 1 if result.error is not None else 0


def _pairs(items: list[str], option: str) -> dict[str, str] | None:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes KEY=VALUE, got {item!r}")
        pairs[key] = value
    return pairs or None


def _info_row(info: SandboxInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "state": info.state or "",
        "created_at": info.created_at.isoformat() if info.created_at else "",
        "expires_at": info.expires_at.isoformat() if info.expires_at else "",
        "metadata": ",".join(f"{k}={v}" for k, v in sorted(info.metadata.items())),
        "image": info.image or "",
    }


def _print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max([len(c)] + [len(str(r[c])) for r in rows]) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for row in rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in columns).rstrip())


@contextlib.contextmanager
def _progress(what: str) -> Iterator[None]:
    """A live progress line on a terminal while waiting; nothing when piped."""
    if not sys.stdout.isatty():
        yield
        return
    done = threading.Event()
    started = time.monotonic()

    def show(write: Callable[[str], object] = sys.stderr.write) -> None:
        while not done.wait(0.2):
            write(f"\r{what}... {time.monotonic() - started:4.1f}s")
            sys.stderr.flush()

    thread = threading.Thread(target=show, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()
