"""``osb-sync run`` and ``osb-sync serve``: code in a new sandbox, and the local server.

``run`` creates a sandbox on the configured server or, where none is (no ``--api-base``, no
``$OPEN_SANDBOX_API_BASE``), on an embedded local server started for the run and stopped with
it; it streams the output live and deletes the sandbox (``--keep``: only on a server that
outlives it). Python's result is printed as ``python -c`` would (exit 1 when the code raised,
``sys.exit(n)`` exits n); bash runs as a command, whose status passes through. ``serve`` runs
the local server in the foreground until a signal.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ._cli_exec import run_command
from ._cli_logging import dropped_log_lines
from ._cli_options import (
    SERVER_HINT,
    GlobalOptions,
    OutputOptions,
    RunOptions,
    RunTimedOut,
    ServeOptions,
    Stopped,
    UsageError,
)
from ._cli_output import EXIT_RAISED, EXIT_SIGNAL_BASE, print_status, progress
from ._cli_registry_auth import with_usual_credentials
from ._client import Client
from ._config import check_run_arguments
from ._constants import API_KEY_ENV
from ._errors import SandboxTimeoutError
from ._models import Event, ExecutionResult
from ._sandbox import Sandbox

if TYPE_CHECKING:
    from .local import LocalServer

UNENFORCED_POLICY = (
    "sandboxes cannot be isolated here, so the local server cannot enforce the "
    "deny-all network policy: code in its sandboxes can reach the network"
)
# What the local server's execd runs (osb_sync/local/execd/code_interpreting.py says so too).
LOCAL_LANGUAGES = ("python", "bash")
# An interrupt's "its context may still be busy" is moot in `run`: the sandbox is deleted next.
MOOT_AFTER_INTERRUPT = "may still be busy"
IMAGE_NOT_CODE = (
    "run takes code, not an image: the image goes in --image: "
    "osb-sync run --image {image} 'CODE' (or --language bash 'COMMAND')"
)
# run's flags that only the embedded server takes (LocalServer's keywords)
EMBEDDED_ONLY = ("local_image_paths", "registry_auth_file")


def cmd_run(cli: GlobalOptions, run: RunOptions) -> int:
    """``osb-sync run``: create a sandbox, stream the code's output live, delete the sandbox."""
    if run.tty or run.interactive:
        return _run_tty(cli, run)
    code = _read_code(run)
    check_run_arguments(code, run.language, run.max_output, run.timeout)
    if run.keep and run.rm:
        raise UsageError("give --keep or --rm, not both (run deletes its sandbox without --keep)")
    if cli.remote_configured() and any(run.store.keywords.get(k) for k in EMBEDDED_ONLY):
        raise UsageError(
            "--allow-image-path and --registry-auth-file are the embedded server's: a server "
            "named by --api-base reads images as it was started to (osb-sync serve ...)"
        )
    if run.keep and not cli.remote_configured():
        raise UsageError(
            "--keep needs a server that outlives this command (the embedded one stops with "
            f"it): {SERVER_HINT}"
        )
    if run.language not in LOCAL_LANGUAGES and not cli.remote_configured():
        raise UsageError(
            f"the embedded local server runs {', '.join(LOCAL_LANGUAGES)}, not "
            f"{run.language}: pass --api-base of an OpenSandbox server whose image runs it"
        )
    moot = contextlib.nullcontext() if run.keep else dropped_log_lines(MOOT_AFTER_INTERRUPT)
    with moot, _client_or_local_server(cli, run) as (client, said_unisolated):
        with progress("creating a sandbox"):
            sandbox = client.create_sandbox(
                template=run.template, allow_internet_access=run.allow_internet or None
            )
        try:
            message = client.get_sandbox(sandbox.id).message
            print_status(message, cli.verbose, said_unisolated)
            output = OutputOptions(run.timeout, run.max_output)
            if run.language == "bash":  # as a command: its exit status comes back (/code's not)
                return run_command(sandbox, code, output, cli.json)
            return _run_code(sandbox, code, run.language, output, cli.json)
        except KeyboardInterrupt as exc:
            kept = "kept" if run.keep else "deleted"
            note = f": the run was stopped and sandbox {sandbox.id} {kept}"
            raise Stopped(getattr(exc, "signum", 2), note) from exc
        finally:
            if run.keep:
                print(f"osb-sync: kept sandbox {sandbox.id}", file=sys.stderr)
            else:
                client.delete_quietly(sandbox.id)


def _run_code(
    sandbox: Sandbox, code: str, language: str, output: OutputOptions, as_json: bool
) -> int:
    try:
        result = sandbox.run_code(
            code,
            language=language,
            timeout=output.timeout,
            max_output_bytes=output.max_output,
            on_event=None if as_json else _echo_output,
        )
    except SandboxTimeoutError as exc:
        raise RunTimedOut(str(exc)) from exc
    status = _print_result(result, as_json)
    error = result.error
    word = code.strip()
    if error is not None and error.name == "NameError" and f"'{word}'" in error.value:
        # `run busybox`: a docker habit (the image first); the code was that one name
        print(f"osb-sync: hint: {IMAGE_NOT_CODE.format(image=word)}", file=sys.stderr)
    return status


def _image_like(code: str) -> bool:
    """Whether the code is an image reference alone (``python:3.12``, ``ghcr.io/a/b:1``):
    valid Python (an annotation) that would run and do nothing."""
    return re.fullmatch(r"[a-z0-9][a-z0-9._/-]*:[A-Za-z0-9_][A-Za-z0-9._-]*", code) is not None


def _run_tty(cli: GlobalOptions, run: RunOptions) -> int:
    """``osb-sync run -t`` / ``-it``: a shell (or CODE as a shell command) on a terminal of a
    new sandbox, deleted when it ends (unless --keep)."""
    from ._cli_tty import InputNotATerminal, require_terminal, run_terminal

    if not run.tty:
        raise UsageError("-i goes with -t: run -it [CMD] (run reads code from '-', not -i)")
    if run.file or run.code == "-" or cli.json:
        raise UsageError("-t runs a shell command given as CODE: not -f, '-' or --json")
    if run.keep and not cli.remote_configured():
        raise UsageError(f"--keep needs a server that outlives this command: {SERVER_HINT}")
    try:
        require_terminal(run.interactive)
    except InputNotATerminal as exc:
        print(f"{exc}", file=sys.stderr)
        return 1
    with _client_or_local_server(cli, run) as (client, said_unisolated):
        with progress("creating a sandbox"):
            sandbox = client.create_sandbox(
                template=run.template, allow_internet_access=run.allow_internet or None
            )
        try:
            print_status(client.get_sandbox(sandbox.id).message, cli.verbose, said_unisolated)
            return run_terminal(
                sandbox,
                run.code,
                interactive=run.interactive,
                cwd=None,
                env=None,
                owned=not run.keep,
            )
        finally:
            if run.keep:
                print(f"osb-sync: kept sandbox {sandbox.id}", file=sys.stderr)
            else:
                client.delete_quietly(sandbox.id)


def _read_code(run: RunOptions) -> str:
    if run.file and run.code:
        raise UsageError("give the code or --file, not both")
    if run.file:
        with open(run.file, "rb") as handle:
            data = handle.read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"{run.file} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}): "
                "run takes source code; copy a binary file into a sandbox with files.write"
            ) from None
    if run.code == "-":
        return sys.stdin.read()
    if run.code is None:
        raise UsageError("no code: osb-sync run CODE, run -f FILE, or run - (standard input)")
    if _image_like(run.code.strip()):
        raise UsageError(IMAGE_NOT_CODE.format(image=run.code.strip()))
    return str(run.code)


@contextlib.contextmanager
def _client_or_local_server(cli: GlobalOptions, run: RunOptions) -> Iterator[tuple[Client, bool]]:
    """A client of the configured server, or of an embedded local server started for the run,
    and whether the CLI has already warned that its sandboxes are not isolated."""
    if cli.remote_configured():
        with Client(cli.api_base, cli.api_key) as client:
            yield client, False
        return
    from .local import LocalServer

    # The line below says what the server's start-up warning would say, in the CLI's words.
    logging.getLogger("osb_sync.local").setLevel(logging.ERROR)
    # One sandbox per process: a spare would only be started to be killed at exit.
    with (
        with_usual_credentials(run.store.keywords, bool(run.template)) as images,
        LocalServer(
            unenforced_network_policy="accept",
            spare_containers=0,
            isolation=False if run.no_isolation else None,
            **images,
        ) as server,
    ):
        if server.refusal:  # fails closed: no sandbox is made
            raise UsageError(server.refusal)
        if not server.isolated:
            print(f"osb-sync: warning: {_isolation_line(server)}", file=sys.stderr)
        with Client(server.api_base, server.api_key) as client:
            yield client, not server.isolated


def _echo_output(event: Event) -> None:
    stream = {"stdout": sys.stdout, "stderr": sys.stderr}.get(event.type)
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


# -- serve ----------------------------------------------------------------------------------


def cmd_serve(cli: GlobalOptions, serve: ServeOptions) -> int:
    """``osb-sync serve``: the local server in the foreground until Ctrl-C (exit 128+n)."""
    from .local import LocalServer

    if cli.api_base:
        raise UsageError("serve starts a server and takes no --api-base: use --host and --port")
    if cli.api_key:
        raise UsageError(
            "serve takes no --api-key: a command line shows in `ps`; put the key in "
            f"{API_KEY_ENV} or in a file given with --api-key-file"
        )
    _raise_file_limit()
    try:
        server = LocalServer(**{**serve.server, "api_key": _server_key(serve.api_key_file)})
        server.start()
    except (ValueError, RuntimeError) as exc:  # bad --execd/--jupyter/--execd-image, no isolation
        raise UsageError(str(exc)) from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(
                f"cannot listen on {serve.server['host']}:{serve.server['port']}: the port is in "
                "use (another server?); pick another with --port, or --port 0 for any free one"
            ) from None
        raise
    try:
        _announce(server, cli.json)
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


def _server_key(api_key_file: str | None) -> str | None:
    """The key `serve` requires: --api-key-file, else the environment."""
    if api_key_file:
        with open(api_key_file, encoding="utf-8") as handle:
            key = handle.readline().strip()
        if not key:
            raise UsageError(f"{api_key_file} holds no API key")
        return key
    return os.environ.get(API_KEY_ENV) or None


def _isolation_line(server: LocalServer) -> str:
    """What the local server's sandboxes are, and how to isolate them where they are not."""
    if server.isolated:
        return "sandboxes are bubblewrap containers with their own namespaces"
    if server.refusal:
        return f"sandboxes cannot be isolated ({server.isolation_problem}): none is created"
    return (
        f"sandboxes are NOT isolated ({server.isolation_problem}): code runs as this user on "
        f"this machine; to isolate them, {server.isolation_fix}"
    )
