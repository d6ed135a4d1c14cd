"""The ``osb-sync`` command line: run code in a sandbox, serve the local server, manage sandboxes.

This module is the parser and the dispatch: each verb's handler gets the options every verb
takes and its own, typed (``_cli_options``: what each verb is given, and where its handler
lives), and every failure becomes one line on stderr and an exit status. The exit statuses are
one table, ``EXIT_STATUSES`` in ``_cli_output`` (``osb-sync help exit-codes`` prints it). This
module imports only the standard library and the light modules (constants, the server's
option declarations, the typed options, the output table): ``--version``, ``--help`` and usage
errors never load requests or the client; a verb's module loads on first use.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from ._cli_options import (
    VERBS,
    CannotRun,
    CompletionOptions,
    GlobalOptions,
    HelpOptions,
    NoSuchSandbox,
    Refused,
    RunTimedOut,
    Stopped,
    UsageError,
)
from ._cli_output import (
    EXIT_BROKEN_PIPE,
    EXIT_CANNOT_RUN,
    EXIT_NOT_FOUND,
    EXIT_OWN_ERROR,
    EXIT_REFUSED,
    EXIT_SIGNAL_BASE,
    EXIT_STATUSES,
    EXIT_TIMED_OUT,
    JSON_SHAPES,
    cli_terms,
    error_json,
    names_missing_thing,
    printable,
)
from ._constants import API_BASE_ENV, API_KEY_ENV, LANGUAGES, MAX_OUTPUT_BYTES, VERSION
from .local.host import options as server_options

PROG = "osb-sync"
IMAGE_HELP = (
    "image of the sandbox (default: the server's); --template is the same flag. A registry "
    "reference (python:3.12, host/name:tag, name@sha256:...) or, on a local server, "
    "oci:/DIR[:TAG] (an OCI layout directory, an absolute path) or docker-archive:/FILE "
    "(docker save's tar), under a directory the server allows (serve --allow-image-path; run "
    "--allow-image-path)"
)
# exec's options (each is pinned by a test): given after the sandbox id, they are a mistake
EXEC_OPTIONS = (
    *("-i", "--interactive", "-t", "--tty", "-d", "--detach", "-e", "--env", "-w"),
    *("--workdir", "-u", "--user", "--timeout", "--max-output"),
)
CREATE_LIFETIME = 3600  # seconds: `create`'s default lifetime (an hour; see --lifetime's help)
STATES = ["Pending", "Running", "Paused", "Stopping", "Terminated", "Failed", "Allocated"]
ALIASES = {"ls": "list", "ps": "list", "rm": "delete", "unpause": "resume"}
# docker's verbs that osb-sync has under another name, or has not: what to type instead (a
# close spelling would suggest the opposite: `stop` is not `list`, `ps` is not `pause`).
DOCKER_VERBS = {
    "stop": "'pause' keeps a sandbox, 'rm' deletes it",
    "kill": "'rm' deletes a sandbox",
    "start": "'resume' a paused sandbox, or 'create' a new one",
    "container": "the sandbox verbs are top-level: osb-sync ls, rm, exec ...",
    "attach": "'logs -f ID' follows a sandbox's log",
    "image": "'images'",
    "rmi": "'images prune' removes the images no sandbox runs",
}
SHELLS = ("bash", "zsh", "fish")
HELP_TOPICS = {
    "exit-codes": EXIT_STATUSES,
    "json": "what --json prints on stdout (one JSON document):\n\n"
    + "\n".join(f"  {what}:\n    {shape}" for what, shape in JSON_SHAPES),
}


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 125, out of the way of remote exit statuses (as ``docker run``);
    an unknown command gets a "did you mean"."""

    verbs: dict[str, argparse.ArgumentParser]  # the subcommands (set on the top parser)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_OWN_ERROR, f"{self.prog}: error: {message}{self._suggestion(message)}\n")

    def _suggestion(self, message: str) -> str:
        """`` (did you mean 'list'?)`` for an unknown command close to a known one."""
        verbs = getattr(self, "verbs", {})
        if "invalid choice" not in message or not verbs:
            return ""
        import difflib

        given = message.split("invalid choice: ", 1)[-1].split(" ", 1)[0].strip("'\"")
        if given in DOCKER_VERBS:
            return f" (osb-sync has no {given!r}: {DOCKER_VERBS[given]})"
        close = difflib.get_close_matches(given, list(verbs), n=1, cutoff=0.6)
        return f" (did you mean {close[0]!r}?)" if close else ""


class _HelpFormatter(argparse.HelpFormatter):
    """``(default: X)`` after an option's help only when there is a default worth saying."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, [], argparse.SUPPRESS)
            or action.option_strings == []
        ):
            return text
        return f"{text} (default: %(default)s)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = parse(build_parser(), argv)
    previous = _interrupt_on_sigterm()
    try:
        return _dispatch(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line parsed; a usage error is the verb's (its usage, and a hint for what
    a docker user typed: code after ``run``'s image, options after ``exec``'s sandbox id)."""
    args, extra = parser.parse_known_args(argv)
    verb = _verbs(parser).get(args.command, parser)
    if extra:
        hint = ""
        if args.command == "run":
            image = args.code if args.code and ":" in args.code else "IMAGE"
            hint = (
                "; run takes the code as one argument (quote it), -f FILE or - (standard "
                f"input), and the image goes in --image: osb-sync run --image {image} 'CODE'"
            )
        verb.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    if args.command == "exec" and args.cmd and _exec_option(args.cmd[0]):
        verb.error(
            f"{args.cmd[0]} after the sandbox id is taken as the command: options go before "
            f"the sandbox id: osb-sync exec {args.cmd[0]} ... {args.id} CMD..."
        )
    return args


def _exec_option(word: str) -> bool:
    """Whether ``word`` (the first word of exec's command) is one of exec's own options."""
    return any(word == flag or word.startswith(flag + "=") for flag in EXEC_OPTIONS) or (
        len(word) > 2 and word[0] == "-" and word[:2] in EXEC_OPTIONS
    )


def _dispatch(args: argparse.Namespace) -> int:
    """Run the verb; every failure becomes one line on stderr and its exit status."""
    verb = VERBS[args.command]
    cli = GlobalOptions.of(args)
    if verb.module == "_cli":  # help and completion: nothing more to load
        return int(globals()[verb.handler](cli, verb.options.of(args)))
    from ._cli_logging import configure_logging  # the client and requests: only for a verb
    from ._errors import NotFoundError, OpenSandboxError, OutputLimitExceeded

    configure_logging(cli.debug)
    handler = getattr(importlib.import_module(f".{verb.module}", __package__), verb.handler)
    try:
        return int(handler(cli, verb.options.of(args)))
    except KeyboardInterrupt as exc:
        print(f"{PROG}: interrupted{getattr(exc, 'note', '')}", file=sys.stderr)
        return EXIT_SIGNAL_BASE + getattr(exc, "signum", signal.SIGINT)
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except RunTimedOut as exc:
        return _report(cli, exc, EXIT_TIMED_OUT)
    except Refused as exc:
        return _report(cli, exc, EXIT_REFUSED)
    except CannotRun as exc:
        return _report(cli, exc, EXIT_CANNOT_RUN)
    except NoSuchSandbox as exc:  # exec's too: as docker exec, "no such container" is 1
        return _report(cli, exc, EXIT_NOT_FOUND)
    except OutputLimitExceeded as exc:
        return _report(cli, exc, EXIT_OWN_ERROR)
    except NotFoundError as exc:
        missing = names_missing_thing(exc) and not verb.runs
        return _report(cli, exc, EXIT_NOT_FOUND if missing else EXIT_OWN_ERROR)
    except (UsageError, OpenSandboxError, OSError) as exc:
        return _report(cli, exc, None)


def _quiet_broken_pipe() -> int:
    """The reader went away (``| head``): exit 141 without a word, as a shell tool does."""
    # Python would flush stdout again at exit and print the error: point it at /dev/null.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced (a test's StringIO)
        pass
    return EXIT_BROKEN_PIPE


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
    raise Stopped(signum)


def _report(cli: GlobalOptions, exc: BaseException, status: int | None) -> int:
    """One line on stderr (and, with --json, an error object on stdout); the exit status."""
    import json
    import traceback

    status = EXIT_OWN_ERROR if status is None else status
    if cli.debug:
        print(printable(traceback.format_exc(), keep="\n"), end="", file=sys.stderr)
    message = printable(cli_terms(str(exc)))
    if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
        return _quiet_broken_pipe()
    print(f"{PROG}: error: {message}", file=sys.stderr)
    if cli.json:
        cause = exc.__cause__ if isinstance(exc, RunTimedOut) else None
        print(json.dumps(error_json(cause or exc, status, message)))
    return status


# -- the two verbs that need no server ------------------------------------------------------


def cmd_help(cli: GlobalOptions, wanted: HelpOptions) -> int:
    """``osb-sync help [TOPIC | COMMAND]``: a topic (exit-codes), a command's help, or all."""
    import difflib

    parser = build_parser()
    topic = wanted.topic
    if topic is None:
        parser.print_help()
        return 0
    if topic in HELP_TOPICS:
        print(HELP_TOPICS[topic])
        return 0
    verbs = _verbs(parser)
    name = ALIASES.get(topic, topic)
    if name in verbs:
        verbs[name].print_help()
        return 0
    close = difflib.get_close_matches(topic, [*HELP_TOPICS, *verbs], n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    topics = ", ".join([*HELP_TOPICS, *verbs])
    print(f"{PROG}: error: no help on {topic!r}{hint}; topics: {topics}", file=sys.stderr)
    return EXIT_OWN_ERROR


def cmd_completion(cli: GlobalOptions, wanted: CompletionOptions) -> int:
    """``osb-sync completion SHELL``: a static completion script, generated by shtab."""
    try:
        import shtab
    except ImportError:
        print(
            f"{PROG}: error: completion scripts are generated by shtab, which is not "
            "installed: pip install shtab (from a checkout of osb-sync: pip install "
            "'.[completion]')",
            file=sys.stderr,
        )
        return EXIT_OWN_ERROR
    preamble = BASH_IDS_FUNCTION if wanted.shell == "bash" else ""
    print(shtab.complete(build_parser(), shell=wanted.shell, preamble=preamble))
    return 0


def _verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return dict(getattr(parser, "verbs", {}))


# -- argument types: each says what is wrong in the flag's terms ----------------------------


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"a positive number of seconds, got {text!r}")
    return value


def _whole_seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a positive number of seconds, got {text!r}")
    return value


def _log_lines(text: str) -> int:
    value = int(text) if text.isdigit() else 0
    if not 1 <= value <= 10000:
        raise argparse.ArgumentTypeError(f"a number of lines from 1 to 10000, got {text!r}")
    return value


def _state(text: str) -> str:
    """A sandbox state in any case (``running`` is ``Running``)."""
    import difflib

    for state in STATES:
        if state.lower() == text.lower():
            return state
    close = difflib.get_close_matches(text.capitalize(), STATES, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise argparse.ArgumentTypeError(
        f"unknown state {text!r}{hint}; states: {', '.join(STATES)} (any case)"
    )


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2}
_UNITS.update({"mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3})


def _size(text: str) -> int:
    """A byte count with an optional unit: ``600000``, ``64KiB``, ``10MB``, ``1GiB``."""
    stripped = text.strip().lower()
    digits = stripped.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = stripped[len(digits) :]
    try:
        number = float(digits)
    except ValueError:
        number = -1.0
    if unit not in _UNITS or not number > 0:
        raise argparse.ArgumentTypeError(
            f"a size such as 20MB, 64KiB or 1000000 (bytes), got {text!r}"
        )
    return int(number * _UNITS[unit])


# -- the parser -----------------------------------------------------------------------------


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
        "--api-key",
        default=default(None),
        help=f"API key (default: ${API_KEY_ENV}, which `ps` does not show)",
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="machine-readable output on stdout (errors too)",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default(False),
        help="say more: the server's whole status message (what it isolates and enforces)",
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
        prog=PROG,
        description="Run code in OpenSandbox sandboxes. Exit statuses: osb-sync help exit-codes "
        "(125: osb-sync itself failed).",
    )
    parser.add_argument("-V", "--version", action="version", version=f"{PROG} {VERSION}")
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, summary: str, description: str = "", aliases: Sequence[str] = ()
    ) -> argparse.ArgumentParser:
        child = sub.add_parser(
            name,
            aliases=list(aliases),
            help=summary,
            description=description or summary,
            formatter_class=_HelpFormatter,
        )
        _global_options(child, suppress=True)
        child.set_defaults(command=name)  # an alias (ls, rm) runs the verb it names
        return child

    _add_run(command)
    _add_serve(command)
    _add_manage(command)
    _add_exec(command)
    _add_files_and_logs(command)
    _add_images(command)
    _add_help(command)
    parser.verbs = dict(sub.choices)
    return parser


def _max_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-output",
        type=_size,
        default=MAX_OUTPUT_BYTES,
        metavar="SIZE",
        help="cap on the output (stdout, stderr and results as you read them; units: KB, "
        "KiB, MB, MiB, GB, GiB); past it osb-sync stops the run and exits 125",
    )


def _add_run(command: Any) -> None:
    run = command(
        "run",
        "run code in a new sandbox (on an embedded local server by default)",
        "Run code in a new sandbox and delete it. Without --api-base or "
        f"${API_BASE_ENV}, an embedded local server (a development server, not a security "
        "boundary where sandboxes cannot be isolated) is started. Python exits 1 when the "
        "code raised (sys.exit(n) exits n); bash passes its exit status through. -it runs a "
        "shell (or CODE as a shell command) on a terminal of the new sandbox joined to this "
        "one, as exec -it does, and deletes the sandbox when it ends.",
    )
    run.add_argument(
        "code", nargs="?", help="the code; '-' reads standard input (with -t: a shell command)"
    )
    run.add_argument(
        "-i", "--interactive", action="store_true", help="with -t: this terminal's input"
    )
    run.add_argument(
        "-t",
        "--tty",
        action="store_true",
        help="run CODE as a shell command (default: a shell) on a terminal of the sandbox",
    )
    run.add_argument("-f", "--file", help="read the code from this file (UTF-8 text)")
    run.add_argument("--language", default="python", choices=LANGUAGES, help="the language")
    run.add_argument(
        "--keep", action="store_true", help="do not delete the sandbox (needs --api-base)"
    )
    run.add_argument(
        "--rm",
        action="store_true",
        help="accepted for docker's habit: run deletes its sandbox anyway (but with --keep)",
    )
    run.add_argument(
        "--timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="deadline of the run (exit 124 past it; default: none)",
    )
    run.add_argument("--template", "--image", metavar="IMAGE", help=IMAGE_HELP)
    run.add_argument("--allow-internet", action="store_true", help="no deny-all network policy")
    _max_output(run)
    run.add_argument(
        "--no-isolation",
        action="store_true",
        help="where sandboxes cannot be isolated, run the code on this machine as your user "
        "anyway (the embedded server; default: refuse)",
    )
    # The embedded server's image flags, as `pull` and `serve` have them: what pull fetched
    # (oci:DIR, docker-archive:FILE, a private registry's image), run can use.
    server_options.add_flags(
        run,
        (
            server_options.IMAGE_STORE,
            server_options.REGISTRY_AUTH_FILE,
            server_options.LOCAL_IMAGE_PATHS,
        ),
    )


def _add_serve(command: Any) -> None:
    serve = command(
        "serve",
        "run the local server in the foreground (until Ctrl-C)",
        "Run the local OpenSandbox-compatible server: a development server, keep it on "
        f"loopback. It requires the API key of ${API_KEY_ENV} or --api-key-file when one is "
        "set (never --api-key: the command line shows in `ps`); a --host other than loopback "
        "refuses to start without one (or --allow-no-api-key). --json prints one JSON "
        "start-up line on stdout.",
    )
    server_options.add_flags(serve)  # one per LocalServer option that has a flag


def _add_manage(command: Any) -> None:
    create = command("create", "create a sandbox on a server and print its id (not deleted)")
    create.add_argument("--template", "--image", metavar="IMAGE", help=IMAGE_HELP)
    create.add_argument(
        "--lifetime",
        type=_whole_seconds,
        default=CREATE_LIFETIME,
        metavar="SECONDS",
        help="seconds until it expires (default: an hour, for a session at a shell; the "
        "client's 300 s suit a program that deletes what it made; the server sets the range, "
        "60 to 86400 on OpenSandbox; renew pushes it back)",
    )
    create.add_argument(
        "--name",
        metavar="NAME",
        help="sandboxes have no names (their ids are given by the server): NAME becomes the "
        "label name=NAME (list --metadata name=NAME finds it)",
    )
    create.add_argument(
        "--metadata", action="append", default=[], metavar="KEY=VALUE", help="label (repeatable)"
    )
    create.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="variable (repeatable)"
    )
    create.add_argument("--allow-internet", action="store_true", help="no deny-all network policy")
    create.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="HOST",
        help="reach this host name or *.wildcard only, nothing else (repeatable; a deny-all "
        "policy with allow rules)",
    )

    listing = command("list", "list the sandboxes of a server", aliases=["ls", "ps"])
    listing.add_argument(
        "--state",
        action="append",
        default=[],
        type=_state,
        metavar="STATE",
        help=f"keep this state, any case (repeatable): {', '.join(STATES)}",
    )
    listing.add_argument(
        "--metadata", action="append", default=[], metavar="KEY=VALUE", help="keep this label"
    )
    listing.add_argument("-q", "--quiet", action="store_true", help="print only the ids")

    get = command("get", "describe sandboxes (exit 1 if one was not found)")
    _sandbox_ids(get.add_argument("ids", nargs="+", metavar="ID", help="sandbox ids"))

    inspect = command("inspect", "print sandboxes as a JSON array (exit 1 if one was not found)")
    _sandbox_ids(inspect.add_argument("ids", nargs="+", metavar="ID", help="sandbox ids"))

    delete = command("delete", "delete sandboxes (exit 1 if one was not found)", aliases=["rm"])
    _sandbox_ids(delete.add_argument("ids", nargs="*", metavar="ID", help="sandbox ids"))
    delete.add_argument(
        "--all",
        action="store_true",
        help="every sandbox of the server, anyone's: asks first on a terminal; elsewhere "
        "refused without --yes",
    )
    delete.add_argument(
        "-y", "--yes", action="store_true", help="delete --all without asking (for scripts)"
    )
    delete.add_argument(
        "-f",
        "--force",
        action="store_true",
        help="accepted for docker's habit: a running sandbox is deleted anyway (it does not "
        "answer --all's question: --yes does)",
    )
    delete.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="every sandbox with this label (repeatable: all of them)",
    )

    for verb, summary, aliases in (
        ("pause", "pause sandboxes (wait until Paused)", []),
        ("resume", "resume paused sandboxes (wait until Running)", ["unpause"]),
    ):
        action = command(verb, f"{summary}; exit 1 if one was not found", aliases=aliases)
        _sandbox_ids(action.add_argument("ids", nargs="+", metavar="ID", help="sandbox ids"))

    renew = command("renew", "push back the expiry of sandboxes; exit 1 if one was not found")
    _sandbox_ids(renew.add_argument("ids", nargs="+", metavar="ID", help="sandbox ids"))
    renew.add_argument(
        "--lifetime",
        type=_whole_seconds,
        default=300,
        metavar="SECONDS",
        help="expire this many seconds from now",
    )

    stats = command(
        "stats",
        "limits and usage of sandboxes",
        "Each sandbox's limits and its usage against them, which osb-sync serve reads from its"
        " cgroups; elsewhere execd's figures, which are the host's (column OF says whose).",
    )
    _sandbox_ids(
        stats.add_argument(
            "ids", nargs="*", metavar="ID", help="sandbox ids (default: every running sandbox)"
        )
    )


# Completion of sandbox ids: `osb-sync ls -q` against the server of the environment
# ($OPEN_SANDBOX_API_BASE), as shtab's `complete` attribute of an argument says for each shell.
BASH_IDS = "_osb_sync_sandbox_ids"
BASH_IDS_FUNCTION = f"""
# sandbox ids, from the server of $OPEN_SANDBOX_API_BASE
{BASH_IDS}() {{
  compgen -W "$(osb-sync ls -q 2>/dev/null)" -- "$1"
}}
"""
ID_COMPLETION = {
    "bash": BASH_IDS,
    "zsh": "($(osb-sync ls -q 2>/dev/null))",
    "fish": "(osb-sync ls -q 2>/dev/null)",
}


def _sandbox_ids(action: argparse.Action) -> argparse.Action:
    """Mark an argument as sandbox ids, for the completion scripts."""
    action.complete = ID_COMPLETION  # type: ignore[attr-defined]  # shtab reads it
    return action


def _add_exec(command: Any) -> None:
    execute = command(
        "exec",
        "run a shell command in a sandbox; exits with the command's status",
        "Run a shell command (bash -c) in an existing sandbox and exit with its status. "
        "-i sends standard input: it is read to its end and uploaded first (execd has no "
        "stdin route), so the command sees it as a file, not a live stream. -it runs the "
        "command (default: a shell) on a terminal of the sandbox joined to this one, in raw "
        "mode (Ctrl-C, Ctrl-D and Ctrl-Z reach the sandbox; window size changes follow); the "
        "terminal session is deleted when exec ends, or is killed.",
    )
    execute.add_argument(
        "-i",
        "--interactive",
        action="store_true",
        help="give the command this standard input (read to its end first, then uploaded)",
    )
    execute.add_argument(
        "-t",
        "--tty",
        action="store_true",
        help="run on a terminal of the sandbox (with -i: joined to this one; CMD optional)",
    )
    execute.add_argument(
        "-d", "--detach", action="store_true", help="run in the background; print its id"
    )
    execute.add_argument(
        "-e", "--env", action="append", default=[], metavar="KEY=VALUE", help="variable"
    )
    execute.add_argument("-w", "--workdir", metavar="DIR", help="working directory")
    execute.add_argument(
        "-u", "--user", metavar="UID[:GID]", help="numeric user (and group) to run as"
    )
    execute.add_argument(
        "--timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="deadline of the command (exit 124; default: none)",
    )
    _max_output(execute)
    _sandbox_ids(execute.add_argument("id", help="the sandbox id"))
    execute.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command and its arguments"
    )


def _add_files_and_logs(command: Any) -> None:
    copy = command(
        "cp",
        "copy files and directories between this machine and a sandbox",
        "Copy SRC to DEST; one of them is SANDBOX:PATH. A directory is copied whole; '-' "
        "as SRC reads a tar archive from standard input, as DEST writes one to standard "
        "output (as docker cp). Out of a sandbox, its answers are not trusted: the copy is "
        "named after PATH, never after execd's answer; an entry that would land outside DEST "
        "(not beneath PATH, a '..' in its name) stops the copy with exit 1, nothing is written "
        "through a symlink in DEST, a file longer than its listing is refused, so is a listing "
        "larger than the space free where DEST is, and symlinks are skipped (execd does not "
        "say where they point).",
    )
    copy.add_argument("src", metavar="SRC", help="a local path, SANDBOX:PATH, or -")
    copy.add_argument("dest", metavar="DEST", help="a local path, SANDBOX:PATH, or -")

    logs = command(
        "logs",
        "a sandbox's log, or the output of a background command (exec -d)",
        "Without COMMAND_ID, print the sandbox's own log (its container's output; the "
        "server's diagnostics route, OpenSandbox server 1.1 or later, or osb-sync serve, "
        "which keeps it after the sandbox is deleted). With COMMAND_ID, the output (stdout "
        "and stderr together) of a command started with exec -d.",
    )
    _sandbox_ids(logs.add_argument("id", help="the sandbox id"))
    logs.add_argument("command_id", nargs="?", metavar="COMMAND_ID", help="from exec -d")
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="a command's: until it ends; a sandbox's: polled every second (the route does "
        "not stream) until the sandbox is gone, or Ctrl-C",
    )
    logs.add_argument(
        "--tail",
        type=_log_lines,
        metavar="N",
        help="a sandbox's log: its last N lines (1 to 10000; default: all the server "
        "returns, at most 10000)",
    )


def _add_images(command: Any) -> None:
    store_flags = (server_options.IMAGE_STORE, server_options.IMAGE_STORE_SIZE)
    images = command(
        "images",
        "list the local image store's images (reference, digest, size, last used)",
        "List, or prune, the image store of local servers (--image-store; no server needed).",
    )
    server_options.add_flags(images, store_flags)
    actions = images.add_subparsers(
        dest="images_action", metavar="ACTION", help="prune: remove every image no sandbox runs"
    )
    for name in ("ls", "list"):
        listing = actions.add_parser(
            name, help="list the images (as without ACTION)", formatter_class=_HelpFormatter
        )
        _global_options(listing, suppress=True)
        server_options.add_flags(listing, store_flags)
    prune = actions.add_parser(
        "prune",
        help="remove every image no sandbox runs",
        description="Remove every image of the store that no sandbox runs now.",
        formatter_class=_HelpFormatter,
    )
    _global_options(prune, suppress=True)
    server_options.add_flags(prune, store_flags)
    pull = command(
        "pull",
        "fetch an image into the local image store ahead of time",
        "Pull IMAGE into the image store of local servers, asking its registry again (a"
        " bar on a terminal, else plain lines on standard error); then print it with its"
        " digest. Needs skopeo.",
    )
    pull.add_argument("image", metavar="IMAGE", help="reference (python:3.12, host/name:tag)")
    pull.add_argument("--platform", metavar="OS/ARCH", help="default: this machine's")
    server_options.add_flags(
        pull,
        (
            *store_flags,
            server_options.IMAGE_SIZE_LIMIT,
            server_options.INSECURE_REGISTRIES,
            server_options.REGISTRY_AUTH_FILE,
            server_options.LOCAL_IMAGE_PATHS,
        ),
    )


def _add_help(command: Any) -> None:
    helper = command("help", "help on a command or a topic (exit-codes, json)")
    helper.add_argument("topic", nargs="?", metavar="TOPIC", help="exit-codes, json, or a command")

    completion = command(
        "completion",
        "print a shell completion script (bash, zsh, fish)",
        "Print a static completion script, generated by shtab (pip install "
        "shtab, or from a checkout '.[completion]'). bash: osb-sync completion bash > "
        "~/.local/share/bash-completion/completions/osb-sync; zsh: into a directory of "
        "$fpath as _osb-sync; fish: > ~/.config/fish/completions/osb-sync.fish.",
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell")
