"""The subcommands of ``osb-sync`` (parsed by ``osb_sync._cli``)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import posixpath
import secrets
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable, TextIO

from ._cli_output import (
    EXIT_NOT_FOUND,
    EXIT_RAISED,
    EXIT_SIGNAL_BASE,
    EXIT_TIMED_OUT,
    cli_terms,
    command_json,
    command_status,
    names_missing_thing,
    new_lines,
    print_table,
    printable,
    progress,
    sandbox_json,
    sandbox_row,
    status_summary,
)
from ._client import Client
from ._config import check_run_arguments
from ._constants import API_BASE_ENV, API_KEY_ENV, DOMAIN_ENV
from ._errors import NotFoundError, NotSupportedError, SandboxTimeoutError
from ._models import Event, ExecutionResult, SandboxInfo
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
NO_TTY = (
    "-t needs a pseudo-terminal, and execd offers one only over a WebSocket (/pty) that "
    "osb-sync does not speak; run without -t (the command's output is then not a terminal)"
)
# What the local server's execd runs (osb_sync/local/execd/code_interpreting.py says so too).
LOCAL_LANGUAGES = ("python", "bash")
LOG_WINDOW = 10000  # lines: the most a diagnostics logs call returns (its tail's maximum)
FOLLOW_INTERVAL = 1.0  # seconds between the polls of logs -f of a sandbox's own log
# Where `exec -i` puts standard input in the sandbox before the command opens it.
STDIN_DIR = "/tmp"  # noqa: S108 - the sandbox's /tmp; the name is random, the mode 0600


class UsageError(Exception):
    """Bad command-line input."""


class RunTimedOut(Exception):
    """The run passed its --timeout (exit 124)."""


class Refused(Exception):
    """What a sandbox answered is refused (exit 1): ``cp`` out of it, an entry that would land
    outside DEST."""


def cmd_run(args: argparse.Namespace) -> int:
    """``osb-sync run``: create a sandbox, stream the code's output live, delete the sandbox."""
    code = _read_code(args)
    check_run_arguments(code, args.language, args.max_output, args.timeout)
    if args.keep and not _remote_configured(args):
        raise UsageError(
            "--keep needs a server that outlives this command (the embedded one stops with "
            f"it): {SERVER_HINT}"
        )
    if args.language not in LOCAL_LANGUAGES and not _remote_configured(args):
        raise UsageError(
            f"the embedded local server runs {', '.join(LOCAL_LANGUAGES)}, not "
            f"{args.language}: pass --api-base of an OpenSandbox server whose image runs it"
        )
    with _client_or_local_server(args) as (client, said_unisolated):
        with progress("creating a sandbox"):
            sandbox = client.create_sandbox(
                template=args.template, allow_internet_access=args.allow_internet or None
            )
        try:
            _print_status(client.get_sandbox(sandbox.id).message, args, said_unisolated)
            if args.language == "bash":
                return _run_bash(sandbox, code, args)
            return _run_code(sandbox, code, args)
        except KeyboardInterrupt:
            kept = "kept" if args.keep else "deleted"
            args.interrupt_note = f": the run was stopped and sandbox {sandbox.id} {kept}"
            raise
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
            max_output_bytes=args.max_output,
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
    if args.api_key:
        raise UsageError(
            "serve takes no --api-key: a command line shows in `ps`; put the key in "
            f"{API_KEY_ENV} or in a file given with --api-key-file"
        )
    _raise_file_limit()
    try:
        server = LocalServer(**server_options.keywords(args, api_key=_server_key(args)))
        server.start()
    except (ValueError, RuntimeError) as exc:  # bad --execd/--jupyter/--execd-image, no isolation
        raise UsageError(str(exc)) from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(
                f"cannot listen on {args.host}:{args.port}: the port is in use (another "
                "server?); pick another with --port, or --port 0 for any free one"
            ) from None
        raise
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
    if server.refusal:
        print(f"osb-sync: error: every create answers 503: {server.refusal}", file=sys.stderr)
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
    """The key `serve` requires: --api-key-file, else the environment."""
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as handle:
            key = handle.readline().strip()
        if not key:
            raise UsageError(f"{args.api_key_file} holds no API key")
        return key
    return os.environ.get(API_KEY_ENV) or None


class _CliLogFormatter(logging.Formatter):
    """``osb-sync: warning: ...``: the program's name on every log line it prints."""

    def format(self, record: logging.LogRecord) -> str:
        return f"osb-sync: {record.levelname.lower()}: {printable(cli_terms(record.getMessage()))}"


def configure_logging(args: argparse.Namespace) -> None:
    """Warnings (and with --debug, everything) on stderr, each line with the program name."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_CliLogFormatter())
    handler.addFilter(_MootAfterInterrupt(args))
    package = logging.getLogger("osb_sync")
    for old in [h for h in package.handlers if isinstance(h.formatter, _CliLogFormatter)]:
        package.removeHandler(old)  # main() called again in one process (tests)
    package.addHandler(handler)
    package.propagate = False
    package.setLevel(logging.DEBUG if args.debug else logging.WARNING)
    if args.debug:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)


class _MootAfterInterrupt(logging.Filter):
    """Drop "its context may still be busy" in ``run``: the sandbox is deleted right after."""

    def __init__(self, args: argparse.Namespace):
        super().__init__()
        self._args = args

    def filter(self, record: logging.LogRecord) -> bool:
        moot = self._args.command == "run" and not getattr(self._args, "keep", False)
        return not (moot and "may still be busy" in record.getMessage())


# -- managing sandboxes ---------------------------------------------------------------------


def cmd_create(args: argparse.Namespace) -> int:
    """``osb-sync create``: print the new sandbox's id (it is not deleted)."""
    with remote_client(args) as client:
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
        _print_status(info.message, args)
        print(sandbox.id)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """``osb-sync list``: a table (or a JSON array, or with -q the ids) of sandboxes."""
    with remote_client(args) as client:
        metadata = _pairs(args.metadata, "--metadata")
        infos = list(client.list_sandboxes(states=args.state or None, metadata=metadata))
    if args.json:
        print(json.dumps([sandbox_json(info) for info in infos]))
    elif args.quiet:
        for info in infos:
            print(info.id)
    else:
        rows = [sandbox_row(info) for info in infos]
        print_table(rows, ["id", "state", "created_at", "expires_at", "metadata"])
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    """``osb-sync get ID...``: each sandbox's description; exit 1 if one was not found."""
    found = []
    with remote_client(args) as client:
        for sandbox_id in args.ids:
            info = _info_or_none(client, sandbox_id)
            if info is None:
                continue
            found.append(info)
            if not args.json:
                if len(found) > 1:
                    print()
                for key, value in sandbox_row(info).items():
                    print(f"{key + ':':<12} {value}")
    if args.json:
        shapes = [sandbox_json(info) for info in found]
        print(json.dumps(shapes[0] if len(args.ids) == 1 and shapes else shapes))
    return 0 if len(found) == len(args.ids) else EXIT_NOT_FOUND


def cmd_inspect(args: argparse.Namespace) -> int:
    """``osb-sync inspect ID...``: a JSON array of sandboxes (as ``docker inspect``)."""
    with remote_client(args) as client:
        found = [info for info in (_info_or_none(client, i) for i in args.ids) if info]
    print(json.dumps([sandbox_json(info) for info in found], indent=2))
    return 0 if len(found) == len(args.ids) else EXIT_NOT_FOUND


def _info_or_none(client: Client, sandbox_id: str) -> SandboxInfo | None:
    try:
        return client.get_sandbox(sandbox_id)
    except NotFoundError as exc:
        if not names_missing_thing(exc):
            raise  # a 404 about the route: a wrong API base, not a missing sandbox
        print(f"osb-sync: error: no sandbox {sandbox_id}", file=sys.stderr)
        return None


def cmd_delete(args: argparse.Namespace) -> int:
    """``osb-sync delete ID... | --all | --metadata K=V``: exit 1 if an id was not found."""
    metadata = _pairs(args.metadata, "--metadata")
    if bool(args.ids) + bool(args.all) + bool(metadata) != 1:
        raise UsageError("delete takes sandbox ids, --all, or --metadata KEY=VALUE (one of them)")
    outcomes = []
    with remote_client(args) as client:
        ids = list(args.ids)
        if args.all or metadata:
            ids = [info.id for info in client.list_sandboxes(metadata=metadata)]
        for sandbox_id in ids:
            deleted = client.delete_sandbox(sandbox_id)
            outcomes.append({"id": sandbox_id, "deleted": deleted})
            if not args.json:
                print(f"{'deleted' if deleted else 'not found'} {sandbox_id}")
    if args.json:
        print(json.dumps(outcomes))
    # Under --all or --metadata a sandbox gone between the listing and its deletion is not
    # an error: the command's goal (none left) is met.
    missing = args.ids and not all(o["deleted"] for o in outcomes)
    return EXIT_NOT_FOUND if missing else 0


def cmd_pause(args: argparse.Namespace) -> int:
    """``osb-sync pause ID...``."""
    return _each(args, "paused", lambda client, sandbox_id: client.pause(sandbox_id))


def cmd_resume(args: argparse.Namespace) -> int:
    """``osb-sync resume ID...``."""
    return _each(args, "resumed", lambda client, sandbox_id: client.resume(sandbox_id))


def cmd_renew(args: argparse.Namespace) -> int:
    """``osb-sync renew ID... [--lifetime SECONDS]``: print each new expiry."""

    def renew(client: Client, sandbox_id: str) -> object:
        expires = client.renew(sandbox_id, args.lifetime)
        return expires.isoformat() if expires else None

    return _each(args, "renewed", renew, "expires_at")


def cmd_stats(args: argparse.Namespace) -> int:
    """``osb-sync stats ID...``: one CPU and memory sample of each sandbox."""
    rows: list[dict[str, str]] = []
    shapes = []
    with remote_client(args) as client:
        for sandbox_id in args.ids:
            try:
                metrics = client.connect(sandbox_id).metrics()
            except NotFoundError as exc:
                if not names_missing_thing(exc):
                    raise
                print(f"osb-sync: error: no sandbox {sandbox_id}", file=sys.stderr)
                continue
            shape = {"id": sandbox_id, **vars(metrics)}
            shapes.append(shape)
            rows.append(
                {
                    "id": sandbox_id,
                    "cpus": f"{metrics.cpu_count:g}",
                    "cpu%": f"{metrics.cpu_used_pct:.1f}",
                    "mem_used": f"{metrics.mem_used_mib:.1f}MiB",
                    "mem_total": f"{metrics.mem_total_mib:.1f}MiB",
                }
            )
    if args.json:
        print(json.dumps(shapes))
    else:
        print_table(rows, ["id", "cpus", "cpu%", "mem_used", "mem_total"])
    return 0 if len(shapes) == len(args.ids) else EXIT_NOT_FOUND


def _each(
    args: argparse.Namespace,
    done: str,
    call: Callable[[Client, str], object],
    field: str = "",
) -> int:
    """Apply ``call`` to each id; a line (or a JSON object) each; exit 1 if one was missing."""
    outcomes = []
    with remote_client(args) as client:
        for sandbox_id in args.ids:
            try:
                value = call(client, sandbox_id)
            except NotFoundError as exc:
                if not names_missing_thing(exc):
                    raise
                outcomes.append({"id": sandbox_id, "found": False})
                if not args.json:
                    print(f"not found {sandbox_id}")
                continue
            outcome: dict[str, object] = {"id": sandbox_id, "found": True}
            if field:
                outcome[field] = value
            outcomes.append(outcome)
            if not args.json:
                print(f"{done} {sandbox_id}" + (f" {field}={value}" if field else ""))
    if args.json:
        print(json.dumps(outcomes))
    return 0 if all(o["found"] for o in outcomes) else EXIT_NOT_FOUND


# -- commands in a sandbox ------------------------------------------------------------------


def cmd_exec(args: argparse.Namespace) -> int:
    """``osb-sync exec [-i] [-d] [-e K=V] [-w DIR] [-u UID[:GID]] ID CMD...``: exit with its
    status (``-d``: print the background command's id)."""
    if args.tty:
        raise UsageError(NO_TTY)
    if not args.cmd:
        raise UsageError("exec needs a command: osb-sync exec ID CMD...")
    if args.detach and args.interactive:
        raise UsageError("give -i or -d, not both: a background command reads no input")
    command = args.cmd[0] if len(args.cmd) == 1 else shlex.join(args.cmd)
    with remote_client(args) as client:
        sandbox = client.connect(args.id)
        if args.detach:
            handle = sandbox.commands.start(command, **_command_options(args))
            print(json.dumps({"id": handle.id}) if args.json else handle.id)
            return 0
        if args.interactive:
            command = _with_stdin(sandbox, command)
        return _run_command(sandbox, command, args)


def _command_options(args: argparse.Namespace) -> dict[str, Any]:
    """``cwd``, ``env`` and ``uid``/``gid`` of a command, from -w, -e and -u."""
    options: dict[str, Any] = {"cwd": args.workdir, "env": _pairs(args.env, "--env")}
    if args.user:
        uid, _, gid = args.user.partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            raise UsageError(
                f"-u takes a numeric UID or UID:GID (execd runs a command as numbers, not "
                f"names), got {args.user!r}"
            )
        options["uid"] = int(uid)
        options["gid"] = int(gid) if gid else None
    return options


def _with_stdin(sandbox: Sandbox, command: str) -> str:
    """Upload standard input to a file, and make it the command's standard input.

    execd has no stdin route: the input is read to its end here, streamed to a file of the
    sandbox, opened as the shell's standard input and unlinked at once (the open descriptor
    keeps it), so nothing is left behind and the command reads it as from a pipe that has
    already been written.
    """
    path = posixpath.join(STDIN_DIR, f"osb-stdin-{secrets.token_hex(8)}")
    # A pipe cannot be measured for Content-Length: spooled (in memory up to 8 MiB, then a
    # temporary file), read to its end.
    with tempfile.SpooledTemporaryFile(max_size=8 << 20) as data:
        if hasattr(sys.stdin, "buffer"):
            shutil.copyfileobj(sys.stdin.buffer, data)
        else:  # a text stream in place of stdin (an embedding program's, a test's)
            data.write(sys.stdin.read().encode("utf-8"))
        data.seek(0)
        sandbox.files.write(path, data, mode=0o600)
    quoted = shlex.quote(path)
    return f"exec 0<{quoted} && rm -f {quoted} || exit 125\n{command}"


def _run_command(sandbox: Sandbox, command: str, args: argparse.Namespace) -> int:
    """Run a shell command, echoing its output live (unless --json); its exit status."""
    echo = not args.json
    options = _command_options(args) if args.command == "exec" else {}
    result = sandbox.commands.run(
        command,
        timeout=args.timeout,
        on_stdout=_writer(sys.stdout) if echo else None,
        on_stderr=_writer(sys.stderr) if echo else None,
        max_output_bytes=args.max_output,
        **options,
    )
    status = command_status(result)
    if args.json:
        print(json.dumps(command_json(result)))
    elif status == EXIT_TIMED_OUT:
        print(f"osb-sync: the command passed --timeout ({args.timeout:g} s)", file=sys.stderr)
    return status


def cmd_logs(args: argparse.Namespace) -> int:
    """``osb-sync logs ID [COMMAND_ID] [-f] [--tail N]``: a background command's output, or
    without COMMAND_ID the sandbox's own log (the server's diagnostics route)."""
    with remote_client(args) as client:
        if args.command_id is None:
            return _sandbox_log(client, args)
        if args.tail is not None:
            raise UsageError("--tail is for a sandbox's own log (logs ID, without COMMAND_ID)")
        command = client.connect(args.id).commands.get(args.command_id)
        if args.follow:
            for text in command.iter_logs():
                sys.stdout.write(text)
                sys.stdout.flush()
        else:
            text, _ = command.logs()
            sys.stdout.write(text)
    return 0


def _sandbox_log(client: Client, args: argparse.Namespace) -> int:
    """The sandbox's log (its container's output), ``--tail`` lines; with ``-f`` polled every
    ``FOLLOW_INTERVAL`` seconds (the route does not stream) until the sandbox is gone."""
    diagnostics = client.diagnostics(args.id)

    def window() -> list[str]:
        # The route's most lines each time, so each window starts where the last one did or
        # later (what is new follows their overlap); following, a partial line waits.
        lines = (diagnostics.logs(tail=LOG_WINDOW).content or "").splitlines(True)
        return [line for line in lines if line.endswith("\n")] if args.follow else lines

    try:
        shown = window()
        sys.stdout.writelines(shown[-args.tail :] if args.tail else shown)
        while args.follow:
            sys.stdout.flush()
            time.sleep(FOLLOW_INTERVAL)
            try:
                now = window()
                sys.stdout.writelines(new_lines(shown, now))
                shown = now
                client.get_sandbox(args.id)
            except NotFoundError as exc:
                if names_missing_thing(exc):
                    return 0  # the sandbox is gone: its log ended, as docker logs -f ends
                raise
    except NotSupportedError as exc:
        raise UsageError(
            "logs ID without COMMAND_ID reads the server's diagnostics route "
            "(GET /v1/sandboxes/ID/diagnostics/logs), which this server does not serve "
            f"(HTTP {exc.status_code}): it needs OpenSandbox server 1.1 or later, or "
            "osb-sync serve; a background command's output needs no such route: "
            "osb-sync logs ID COMMAND_ID"
        ) from None
    return 0


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


def remote_client(args: argparse.Namespace) -> Client:
    """A client of the server the command line or the environment names.

    Raises:
        UsageError: none is named.
    """
    if not _remote_configured(args):
        raise UsageError(f"this command needs a server: {SERVER_HINT}")
    return Client(args.api_base, args.api_key)


@contextlib.contextmanager
def _client_or_local_server(args: argparse.Namespace) -> Iterator[tuple[Client, bool]]:
    """A client of the configured server, or of an embedded local server started for the run,
    and whether the CLI has already warned that its sandboxes are not isolated."""
    if _remote_configured(args):
        with Client(args.api_base, args.api_key) as client:
            yield client, False
        return
    from .local import LocalServer

    # The line below says what the server's start-up warning would say, in the CLI's words.
    logging.getLogger("osb_sync.local").setLevel(logging.ERROR)
    # One sandbox per process: a spare would only be started to be killed at exit.
    isolation = False if getattr(args, "no_isolation", False) else None
    with LocalServer(
        unenforced_network_policy="accept", spare_containers=0, isolation=isolation
    ) as server:
        if server.refusal:  # fails closed: no sandbox is made
            raise UsageError(server.refusal)
        if not server.isolated:
            print(f"osb-sync: warning: {_isolation_line(server)}", file=sys.stderr)
        with Client(server.api_base, server.api_key) as client:
            yield client, not server.isolated


def _isolation_line(server: LocalServer) -> str:
    """What the local server's sandboxes are, and how to isolate them where they are not."""
    if server.isolated:
        return "sandboxes are bubblewrap containers with their own namespaces"
    if server.refusal:
        return f"sandboxes cannot be isolated ({server.isolation_problem}): none is created"
    from .local.host.bwrap import FIX

    return (
        f"sandboxes are NOT isolated ({server.isolation_problem}): code runs as this user on "
        f"this machine; to isolate them, {FIX}"
    )


def _print_status(
    message: str | None, args: argparse.Namespace, said_unisolated: bool = False
) -> None:
    """The server's status message: whole with -v, else one line of what is NOT enforced."""
    line = status_summary(message, args.verbose, said_unisolated)
    if line:
        print("osb-sync: server: " + printable(line, keep="\n"), file=sys.stderr)


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
        if result.error is not None and result.error.name != "SystemExit":
            error = result.error
            lines = error.traceback or [f"{error.name}: {error.value}"]
            print("\n".join(lines), file=sys.stderr)
    return _code_status(result)


def _code_status(result: ExecutionResult) -> int:
    """0, 1 when the code raised, or n for ``sys.exit(n)`` (as ``python -c`` exits)."""
    error = result.error
    if error is None:
        return 0
    if error.name != "SystemExit":
        return EXIT_RAISED
    value = error.value.strip()
    if value in ("", "None"):
        return 0
    if value.lstrip("-").isdigit():
        return int(value) & 0xFF
    print(value, file=sys.stderr)  # sys.exit("message"): Python prints it and exits 1
    return EXIT_RAISED


def _pairs(items: list[str], option: str) -> dict[str, str] | None:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes KEY=VALUE, got {item!r}")
        pairs[key] = value
    return pairs or None
