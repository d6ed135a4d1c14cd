"""What the ``osb-sync`` command prints: JSON shapes, tables, exit statuses, progress lines.

What a server or a sandbox's execd said (an error's message and request id, a log line, a
sandbox's fields) is printed through :func:`printable`: to the terminal it is text, never an
escape sequence that retitles the window, clears the screen or reorders what follows. (Names
in ``cp``'s messages are ``repr``'d, which escapes the same characters. A command's own output,
``exec``'s, ``run``'s, ``logs``', is passed through as ``docker exec`` does: it is what was
asked for.)

One JSON shape per object, listed in ``JSON_SHAPES`` (``osb-sync help json``, and the CLI
reference page of the docs).
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable

from ._constants import CREATE_ID_KEY

if TYPE_CHECKING:  # not at import: `osb-sync --version` must not load requests
    from ._models import CommandResult, ExecutionError, SandboxInfo

EXIT_RAISED = 1  # the code raised
EXIT_NOT_FOUND = 1  # a sandbox (file, command) was not found, as `docker inspect`
EXIT_REFUSED = 1  # cp: the sandbox named an entry that would land outside DEST
EXIT_TIMED_OUT = 124  # as timeout(1)
EXIT_CANNOT_RUN = 126  # exec: the command could not be started as asked (-w), as docker exec
EXIT_OWN_ERROR = 125  # osb-sync itself failed, as docker run
EXIT_SIGNAL_BASE = 128
EXIT_BROKEN_PIPE = EXIT_SIGNAL_BASE + 13  # 141 (SIGPIPE is 13): the reader left (`| head`)
# The one table of exit statuses, the same for every verb (`osb-sync help exit-codes`).
EXIT_STATUSES = """\
osb-sync exit statuses (the same for every command):

  0      success
  1      run: the Python code raised (sys.exit(n) in the code exits n);
         exec, get, inspect, delete, pause, resume, renew, stats, logs, cp: a sandbox (or a
         file, a command) was not found, or an id prefix matches several sandboxes;
         cp: the sandbox answered what cp refuses (an entry that would land outside DEST,
         a file longer than listed), and the copy stopped
  N      exec, run --language bash: the remote command's own status, passed through
         (126 not executable, 127 not found, 128+n killed by signal n, as the shell says)
  124    run or exec passed --timeout (as timeout(1))
  125    osb-sync itself failed, as docker run: bad usage, the server unreachable or
         refusing, or the output passed --max-output
  126    exec: the command could not be started as asked (-w names no directory)
  128+n  osb-sync stopped by signal n: 130 for Ctrl-C, 143 for SIGTERM
  141    standard output was closed early (| head): quiet, as a shell tool

exec and run keep 125 for their own failures (as docker exec and docker run do), so a
remote status is never mistaken for one of osb-sync's.
"""
# What --json prints: one document on stdout, one stable shape per object (`osb-sync help json`).
JSON_SHAPES = (
    (
        "sandbox (create, get; list and inspect: an array)",
        '{"id", "state", "message", "image", "created_at", "expires_at", "metadata"}: metadata '
        "an object without the internal osb-sync/create-id tag; times in ISO 8601 or null;"
        ' inspect adds "network_policy": {"defaultAction", "egress", "mode"}, the policy in force'
        " (null where the server cannot say)",
    ),
    ("code run (run)", '{"stdout", "stderr", "results", "error", "execution_count"}'),
    (
        "command (exec, run --language bash)",
        '{"id", "exit_code", "stdout", "stderr", "timed_out", "error"}',
    ),
    ("background command (exec -d)", '{"id"}'),
    ("deletion (delete: an array)", '{"id", "deleted"}'),
    ("pause, resume, renew (an array)", '{"id", "found"} (renew: and "expires_at")'),
    (
        "stats (an array)",
        '{"id", "limits": {"cpu", "memory_mib", "given"}, "sandbox", "host"}: limits as numbers'
        " (null where the server does not say them); sandbox the server's reading of its"
        ' cgroups (osb-sync serve: {"source", "mem_used_mib", "mem_limit_mib", "cpu_limit",'
        ' "cpu_seconds", "pids", "pids_limit"}), else null and host execd\'s /metrics, the'
        ' host\'s figures ({"cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib",'
        ' "timestamp"})',
    ),
    ("logs ID", '{"id", "log"}'),
    ("logs ID COMMAND_ID", '{"id", "command_id", "output"}'),
    ("images (an array)", '{"digest", "references", "size", "last_used", "in_use", ...}'),
    ("images prune", '{"removed"}: the digests removed'),
    ("pull", '{"reference", "digest", "size"}'),
    (
        "serve",
        'one start-up line {"api_base", "pid", "api_key_required", "network_policy_enforced"}',
    ),
    (
        "a failure once the arguments were parsed",
        '{"error": {"type", "message", "exit_code"}}; the one-line message is on stderr too '
        "(a usage error prints only the usage, on stderr)",
    ),
)
# Python keywords (the client's own messages) and what a command-line user types instead.
_CLI_TERMS = (
    ("unenforced_network_policy='accept'", "osb-sync serve --allow-unenforced-network-policy"),
    ("allow_internet_access=True", "--allow-internet"),
    ("raise max_output_bytes", "raise --max-output"),
    ("pass api_key=", "pass --api-key"),
    ("by isolation=False", "by --no-isolation"),
    ("allow_no_api_key=True", "--allow-no-api-key"),
    (
        "(LocalServer(local_image_paths=...), osb-sync serve --allow-image-path DIR)",
        "(--allow-image-path DIR: of run, or of osb-sync serve)",
    ),
)
# Go's names for signals, as execd reports a command killed by one ("signal: killed"), with
# Linux's numbers: the command ran in a Linux sandbox, whatever the client runs on (Windows
# has no SIGHUP, SIGQUIT, SIGKILL or SIGPIPE to look up).
_GO_SIGNAL_NAMES = {
    "hangup": 1,
    "interrupt": 2,
    "quit": 3,
    "aborted": 6,
    "killed": 9,
    "segmentation fault": 11,
    "broken pipe": 13,
    "terminated": 15,
}
# Routine status messages (the real server's and the local server's); anything else is shown.
ROUTINE_MESSAGES = frozenset({"", "Sandbox container started successfully."})


def sandbox_json(info: SandboxInfo) -> dict[str, Any]:
    """The JSON shape of a sandbox."""
    return {
        "id": info.id,
        "state": info.state,
        "message": info.message,
        "image": info.image,
        "created_at": info.created_at.isoformat() if info.created_at else None,
        "expires_at": info.expires_at.isoformat() if info.expires_at else None,
        "metadata": {k: v for k, v in info.metadata.items() if k != CREATE_ID_KEY},
    }


def printable(text: str, keep: str = "") -> str:
    """``text`` with each character that is not printable (ESC and the other controls, bidi
    overrides, a lone surrogate) escaped as ``repr`` escapes it; ``keep``: characters left as
    they are (a traceback's newlines)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def sandbox_row(info: SandboxInfo) -> dict[str, str]:
    """A sandbox as one row of text (``list`` and ``get``)."""
    data = sandbox_json(info)
    data["metadata"] = ",".join(f"{k}={v}" for k, v in sorted(data["metadata"].items()))
    return {key: "" if value is None else printable(str(value)) for key, value in data.items()}


def command_json(result: CommandResult) -> dict[str, Any]:
    """The JSON shape of a command's result."""
    return {
        "id": result.id,
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "timed_out": result.timed_out,
        "error": _error_json(result.error),
    }


def _error_json(error: ExecutionError | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"name": error.name, "value": error.value, "traceback": list(error.traceback)}


def error_json(exc: BaseException, exit_code: int, message: str | None = None) -> dict[str, Any]:
    """The JSON shape of a failure of osb-sync itself (``message``: the line printed)."""
    text = str(exc) if message is None else message
    return {"error": {"type": type(exc).__name__, "message": text, "exit_code": exit_code}}


def names_missing_thing(exc: BaseException) -> bool:
    """True for a 404 that says a sandbox (file, command, context) does not exist; False for
    one about the route itself (a wrong API base: osb-sync's own failure, 125)."""
    code = str(getattr(exc, "code", None) or "")
    return any(thing in code for thing in ("SANDBOX", "FILE", "COMMAND", "CONTEXT"))


def cli_terms(text: str) -> str:
    """A message of the client or the server, in the command line's terms (flags, not keywords)."""
    for keyword, flag in _CLI_TERMS:
        text = text.replace(keyword, flag)
    return text


OWN_USER = "root inside is your user outside"  # the local server's own-uid mapping


def status_summary(message: str | None, verbose: bool, said_unisolated: bool = False) -> str | None:
    """What ``run``/``create`` print of a server's status message, or None for nothing.

    With ``verbose`` the whole message; else nothing when everything asked for is enforced,
    and one short line naming what is not (the local server marks it ``NOT`` or ``not
    enforced: ...``); ``said_unisolated``: the CLI has already warned that sandboxes are not
    isolated.
    """
    text = (message or "").strip()
    if verbose:
        return text if text not in ROUTINE_MESSAGES else None
    if text in ROUTINE_MESSAGES:
        return None
    if text.startswith("Sandbox container started successfully.") or "Isolation:" in text:
        gaps = []
        if "NOT isolated" in text and not said_unisolated:
            gaps.append("this sandbox is NOT isolated (code runs as the server's user)")
        if OWN_USER in text:
            gaps.append(f"{OWN_USER} (no subordinate id range)")
        if "networkPolicy is NOT enforced" in text:
            gaps.append("its network policy is NOT enforced")
        unenforced = _unenforced(text)
        if unenforced and unenforced != "none":
            gaps.append(f"limits NOT enforced: {unenforced}")
        if not gaps:
            return None
        return "; ".join(gaps) + " (-v: the server's whole status message)"
    return text  # another server's message: it is not routine, so it is shown


def _unenforced(text: str) -> str | None:
    """The limits after ``not enforced:``, without their reasons in parentheses: the clause
    ends at a sentence's end (``.`` then a space or the end) outside parentheses; ``cpu=0.5``
    keeps its point."""
    found = re.search(r"not enforced: ", text)
    if found is None:
        return None
    kept, depth, rest = [], 0, text[found.end() :]
    for index, char in enumerate(rest):
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            if char == ";" or (char == "." and rest[index + 1 : index + 2] in ("", " ")):
                break
            kept.append(char)
    return re.sub(r"\s+(?=,|$)", "", "".join(kept)).strip()


def print_status(message: str | None, verbose: bool, said_unisolated: bool = False) -> None:
    """A server's status message on stderr, as :func:`status_summary` shortens it."""
    line = status_summary(message, verbose, said_unisolated)
    if line:
        print("osb-sync: server: " + printable(line, keep="\n"), file=sys.stderr)


def command_status(result: CommandResult) -> int:
    """The exit status of a remote command as a shell reports it (128+n for signal n)."""
    if result.timed_out:
        return EXIT_TIMED_OUT
    if result.exit_code is not None and 0 <= result.exit_code <= 255:
        return result.exit_code
    number = _signal_number(result.error)
    if number is not None:
        return EXIT_SIGNAL_BASE + number
    return EXIT_OWN_ERROR  # no usable status: the outcome is unknown


def _signal_number(error: ExecutionError | None) -> int | None:
    """The signal that killed a command, from execd's ``signal: killed`` (or ``sigkill``)."""
    text = " ".join([error.value, *error.traceback]) if error else ""
    found = re.search(r"signal: ([a-z0-9 ]+)", text.lower())
    if found is None:
        return None
    name = found.group(1).strip()
    if name in _GO_SIGNAL_NAMES:
        return int(_GO_SIGNAL_NAMES[name])
    upper = name.upper()
    member = signal.Signals.__members__.get(upper if upper.startswith("SIG") else "SIG" + upper)
    return int(member) if member is not None else None


def print_table(rows: list[dict[str, str]], columns: list[str]) -> None:
    """Rows as left-aligned columns under upper-case headers."""
    widths = {c: max([len(c)] + [len(r[c]) for r in rows]) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for row in rows:
        print("  ".join(row[c].ljust(widths[c]) for c in columns).rstrip())


@contextlib.contextmanager
def progress(what: str) -> Iterator[None]:
    """A live progress line while waiting, only when standard error is a terminal."""
    if not sys.stderr.isatty():
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


def new_lines(before: list[str], now: list[str]) -> list[str]:
    """The lines of a log window ``now`` that follow the previous window ``before``.

    Both are the last lines of one growing log: the longest end of ``before`` that starts
    ``now`` is what was already printed. A window that slid by exactly a repeat of its own
    lines (full, and the new lines equal the dropped ones) looks unchanged: that is the limit
    of following a log by polling.
    """
    for overlap in range(min(len(before), len(now)), 0, -1):
        if before[-overlap:] == now[:overlap]:
            return now[overlap:]
    return now
