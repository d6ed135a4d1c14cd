"""The ``osb-sync`` command line: run code in a sandbox, serve the local server, manage sandboxes.

Exit statuses (one table, README.rst, Command line): 0 success; 1 the code raised, or a
sandbox to delete was not found; the remote status of ``exec`` and ``run --language bash``
(126/127 as the shell uses them, 128+n for a signal death); 124 past ``--timeout``; 125
osb-sync itself failed (bad usage, server unreachable, refused); 128+n osb-sync stopped by
signal n (130 for Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from . import _cli_commands as commands
from ._cli_output import EXIT_OWN_ERROR, EXIT_SIGNAL_BASE, EXIT_TIMED_OUT, error_json
from ._constants import API_BASE_ENV, API_KEY_ENV, LANGUAGES, VERSION
from ._errors import OpenSandboxError
from .local.host import options as server_options

STATES = ["Pending", "Running", "Paused", "Stopping", "Terminated", "Failed"]


class _Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGINT), unwinding like Ctrl-C; remembers the signal for the exit status."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 125, out of the way of remote exit statuses (as ``docker run``)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_OWN_ERROR, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.debug:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    previous = _interrupt_on_sigterm()
    try:
        return int(args.handler(args))
    except KeyboardInterrupt as exc:
        print("osb-sync: interrupted", file=sys.stderr)
        return EXIT_SIGNAL_BASE + getattr(exc, "signum", signal.SIGINT)
    except commands.RunTimedOut as exc:
        return _report(args, exc, EXIT_TIMED_OUT)
    except (commands.UsageError, OpenSandboxError, OSError) as exc:
        return _report(args, exc, None)
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
    raise _Interrupted(signum)


def _report(args: argparse.Namespace, exc: BaseException, status: int | None) -> int:
    """One line on stderr (and, with --json, an error object on stdout); the exit status."""
    status = EXIT_OWN_ERROR if status is None else status
    if args.debug:
        traceback.print_exc()
    print(f"osb-sync: error: {exc}", file=sys.stderr)
    if args.json:
        cause = exc.__cause__ if isinstance(exc, commands.RunTimedOut) else None
        print(json.dumps(error_json(cause or exc, status)))
    return status


def _global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every subcommand takes, before or after its name.

    On subcommands their default is SUPPRESS, so a value given before the name survives.
    """

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    group = parser.add_argument_group("global options (before or after the command)")
    group.add_argument(
        "--api-base",
        default=default(None),
        metavar="URL",
        help=f"lifecycle URL ending in /v1 (default: ${API_BASE_ENV}; `run`: an embedded "
        "local server when neither is set)",
    )
    group.add_argument(
        "--api-key", default=default(None), help=f"API key (default: ${API_KEY_ENV})"
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="machine-readable output on stdout (errors too)",
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=default(False),
        help="log requests; tracebacks on errors",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = _Parser(
        prog="osb-sync",
        description="Run code in OpenSandbox sandboxes. Exit statuses: see README.rst, "
        "Command line (125: osb-sync itself failed).",
    )
    parser.add_argument("-V", "--version", action="version", version=f"osb-sync {VERSION}")
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str = "") -> argparse.ArgumentParser:
        child = sub.add_parser(
            name,
            help=summary,
            description=description or summary,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        _global_options(child, suppress=True)
        return child

    _add_run(command)
    _add_serve(command)
    _add_manage(command)
    return parser


def _add_run(command: Any) -> None:
    run = command(
        "run",
        "run code in a new sandbox (on an embedded local server by default)",
        "Run code in a new sandbox and delete it. Without --api-base or "
        f"${API_BASE_ENV}, an embedded local server ({commands.NOT_A_BOUNDARY}) is started. "
        "Python exits 1 when the code raised; bash passes its exit status through.",
    )
    run.add_argument("code", nargs="?", help="the code; '-' reads standard input")
    run.add_argument("-f", "--file", help="read the code from this file (UTF-8 text)")
    run.add_argument("--language", default="python", choices=LANGUAGES, help="the language")
    run.add_argument(
        "--keep", action="store_true", help="do not delete the sandbox (needs --api-base)"
    )
    run.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="deadline of the run (exit 124 past it)"
    )
    run.add_argument("--template", help="image of the sandbox (default: the server's)")
    run.add_argument("--allow-internet", action="store_true", help="no deny-all network policy")
    run.set_defaults(handler=commands.cmd_run)


def _add_serve(command: Any) -> None:
    serve = command(
        "serve",
        "run the local server in the foreground (until Ctrl-C)",
        f"Run the local OpenSandbox-compatible server: {commands.NOT_A_BOUNDARY}. "
        f"It requires the API key of ${API_KEY_ENV} or --api-key-file when one is set. "
        "--json prints one JSON start-up line on stdout.",
    )
    server_options.add_flags(serve)  # one per LocalServer option that has a flag
    serve.set_defaults(handler=commands.cmd_serve)


def _add_manage(command: Any) -> None:
    create = command("create", "create a sandbox on a server and print its id (not deleted)")
    create.add_argument("--template", help="image of the sandbox (default: the server's)")
    create.add_argument(
        "--lifetime", type=int, default=300, metavar="SECONDS", help="seconds until it expires"
    )
    create.add_argument(
        "--metadata", action="append", default=[], metavar="KEY=VALUE", help="label (repeatable)"
    )
    create.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="variable (repeatable)"
    )
    create.add_argument("--allow-internet", action="store_true", help="no deny-all network policy")
    create.set_defaults(handler=commands.cmd_create)

    listing = command("list", "list the sandboxes of a server")
    listing.add_argument(
        "--state", action="append", default=[], choices=STATES, help="keep this state (repeatable)"
    )
    listing.add_argument(
        "--metadata", action="append", default=[], metavar="KEY=VALUE", help="keep this label"
    )
    listing.set_defaults(handler=commands.cmd_list)

    get = command("get", "describe one sandbox")
    get.add_argument("id", help="the sandbox id")
    get.set_defaults(handler=commands.cmd_get)

    delete = command("delete", "delete sandboxes (exit 1 if one was not found)")
    delete.add_argument("ids", nargs="+", metavar="ID", help="sandbox ids")
    delete.set_defaults(handler=commands.cmd_delete)

    execute = command(
        "exec",
        "run a shell command in a sandbox; exits with the command's status",
        "Run a shell command (bash -c) in an existing sandbox and exit with its status.",
    )
    execute.add_argument("id", help="the sandbox id")
    execute.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="deadline of the command (exit 124)"
    )
    execute.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command and its arguments"
    )
    execute.set_defaults(handler=commands.cmd_exec)
