"""Every operation x every fault, over real loopback sockets (``tests/faults/faultserver.py``).

Each cell makes what its operation needs on a healthy fake OpenSandbox, injects one fault into
the operation's route, makes the call, heals the server and checks that:

1. the call returned, or raised an ``OpenSandboxError`` subclass (never a KeyError, a
   JSONDecodeError or an untyped requests exception), within a time bound;
2. the outcome is the one the fault calls for, where that is clear-cut (``expected``);
3. no sandbox is left behind (the fault server records every delete);
4. the same client then succeeds on the healthy route: no broken pooled connection is reused
   (a response smuggled onto a kept-alive socket would surface here), and the servers never
   received a malformed request;
5. neither the API key nor the execd token appears in the exception (causes included) or the
   log, each credential only went where it belongs, and nothing reached the other origin.

Backoff sleeps of the transport are recorded instead of slept (default ``max_retries``); real
sleeps are exercised by the tests after the matrix. Marked slow (about 35 s): plain
``pytest`` leaves it out, ``pytest -m slow`` and the tox interpreter envs run it. Every outcome
goes to ``reports/fault-matrix.md`` when ``OSB_FAULT_REPORT=1`` (or a path) asks for it.
"""

from __future__ import annotations

import datetime
import inspect
import logging
import os
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import osb_sync._transport
from osb_sync import Client, OpenSandboxError, Sandbox
from tests.faults.faultserver import (
    API_KEY_HEADER,
    FAULTS,
    FILE_BYTES,
    KEY,
    TOKEN,
    TOKEN_HEADER,
    World,
)

pytestmark = pytest.mark.slow

READ_TIMEOUT = 0.4
RUN_TIMEOUT = 1.0  # > READ_TIMEOUT, so a stall is the read timeout's and a drip the deadline's
COMMAND_TIMEOUT = 0.3  # execd's; the client waits a little longer (osb_sync DEADLINE_SLACK)
CAP = 64 * 1024
BOUND = 3.0
CREATE = {"ready_timeout": 0.3, "poll_interval": 0.01}
# The report is written only when asked: OSB_FAULT_REPORT=1 (this path) or a path of your own.
REPORT_ENV = "OSB_FAULT_REPORT"
DEFAULT_REPORT = Path(__file__).resolve().parents[2] / "reports" / "fault-matrix.md"


def report_path() -> Path | None:
    asked = os.environ.get(REPORT_ENV, "")
    if asked in ("", "0"):
        return None
    return DEFAULT_REPORT if asked == "1" else Path(asked)


@dataclass(frozen=True)
class Op:
    """An operation: the route its faults go to and the kind of answer that route gives."""

    name: str
    route: str
    kind: str  # json | empty | stream | bytes
    bound: float = BOUND


OPS = {
    op.name: op
    for op in (
        Op("create", "create", "json"),
        Op("wait", "get", "json"),
        Op("endpoint", "endpoint", "json"),
        Op("delete", "delete", "empty"),
        Op("run_code", "code", "stream"),
        Op("run_command", "command", "stream", BOUND + COMMAND_TIMEOUT + 2.0),
        Op("read_bytes", "download", "bytes"),
    )
}

NOT_STREAM = "not an event stream"
OPAQUE = "file content is opaque bytes"
NO_DEADLINE = (
    "the call has no overall deadline by design (read_timeout bounds silence); "
    "an endless body is the flood cell"
)


def not_applicable(op: Op, fault: str) -> str | None:
    """Why ``fault`` means nothing for ``op``, or None when the cell runs."""
    kind = op.kind
    rules: dict[str, dict[str, str]] = {
        "drip": {"json": NO_DEADLINE, "empty": NO_DEADLINE, "bytes": NO_DEADLINE},
        "oversized_event": {"json": "no events; see flood", "empty": "no events; see flood"},
        "events_after_complete": {"json": NOT_STREAM, "empty": NOT_STREAM, "bytes": NOT_STREAM},
        "missing_status": {
            "empty": "a delete's body is not read",
            "stream": "events have no status",
            "bytes": OPAQUE,
        },
        "missing_id": {"empty": "a delete's body is not read", "bytes": OPAQUE},
        "wrong_types": {"empty": "a delete's body is not read", "bytes": OPAQUE},
        **{
            f: {"bytes": OPAQUE}
            for f in ("non_json", "json_list", "invalid_utf8", "html_200", "deep_json")
        },
        "bare_error_eof": {"bytes": OPAQUE},
    }
    reason = rules.get(fault, {}).get(kind)
    if reason is None and op.name == "endpoint" and fault in ("missing_id", "missing_status"):
        reason = "an endpoint answer has neither id nor status"
    return reason


RAISES_STREAM = {"StreamError"}
TRANSPORT = {"TransportError"}
NOT_OK = {"any OpenSandboxError"}  # must raise; which subclass is the library's choice


def expected(op: Op, fault: str) -> set[str] | None:
    """The outcomes a fault calls for, where that is clear-cut; None: any typed outcome."""
    kind = op.kind
    if fault in ("refused", "reset_before_response", "redirect_cross_origin"):
        return TRANSPORT
    if fault in ("bad_status_line", "header_flood"):
        return TRANSPORT
    if fault == "html_200" and kind == "stream":
        return NOT_OK  # a web page is not a run: returning an empty result would be a lie
    if fault in ("stall_before_headers", "stall_mid_body") and op.name in ("wait", "endpoint"):
        # A poll inside a wait waits at most the wait's time left (0.3 s, under READ_TIMEOUT).
        return {"SandboxTimeoutError"}
    if fault == "stall_before_headers":
        return TRANSPORT
    if fault in ("reset_mid_body", "truncated_chunked", "lying_cl_long", "stall_mid_body"):
        return RAISES_STREAM if kind in ("stream", "bytes") else TRANSPORT
    if fault == "drip":
        return {"ok"} if op.name == "run_command" else {"SandboxTimeoutError"}
    if fault in ("flood", "oversized_event") and kind in ("stream", "bytes"):
        return {"OutputLimitExceeded"}
    if fault.split("_")[0] in ("500", "502", "503", "504", "429") or fault == "html_error":
        error = "CapacityError" if fault.startswith("429") else "ApiError"  # 429: its own class
        return {error} if op.name != "endpoint" else {error, "SandboxTimeoutError"}
    if kind == "stream" and fault == "invalid_utf8":
        return RAISES_STREAM
    if kind == "stream" and fault == "fin_mid_event":
        return RAISES_STREAM
    if fault in ("events_after_complete", "lying_cl_short"):
        return {"ok"}
    return None


# -- matrix -----------------------------------------------------------------------------------


class Matrix:
    """Outcome per (fault, operation), written as a markdown table when the module ends."""

    def __init__(self) -> None:
        self.cells: dict[tuple[str, str], str] = {}
        self.reasons: dict[tuple[str, str], str] = {}
        self.failed: set[tuple[str, str]] = set()
        self.started = time.monotonic()

    def record(self, op: str, fault: str, outcome: str, reason: str = "") -> None:
        self.cells[(fault, op)] = outcome
        if reason:
            self.reasons[(fault, op)] = reason

    def fail(self, op: str, fault: str, why: str) -> None:
        self.failed.add((fault, op))
        self.cells[(fault, op)] = f"FAIL: {self.cells.get((fault, op), '?')} ({why})"

    def totals(self) -> dict[str, int]:
        values = list(self.cells.values())
        na = sum(v == "n/a" for v in values)
        ran = len(values) - na
        return {
            "cells": len(values),
            "ran": ran,
            "passed": ran - len(self.failed),
            "failed": len(self.failed),
            "ok": sum(v == "ok" for v in values),
            "raised": ran - len(self.failed) - sum(v == "ok" for v in values),
            "n/a": na,
        }

    def summary(self, report: Path | None = None) -> str:
        t = self.totals()
        return (
            f"fault matrix: {t['cells']} cells, {t['passed']} passed ({t['ok']} ok, "
            f"{t['raised']} typed errors), {t['failed']} failed, {t['n/a']} n/a, "
            f"{time.monotonic() - self.started:.1f} s"
            + (f" -> {report}" if report else f" (set {REPORT_ENV}=1 for the report)")
        )

    def markdown(self) -> str:
        ops = list(OPS)
        lines = [
            "# Fault matrix",
            "",
            f"Generated by `OSB_FAULT_REPORT=1 python -m pytest -m slow tests/faults` on "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC.",
            "",
            "Each cell is the outcome of the faulted call: `ok` (it returned), the class of the "
            "`OpenSandboxError` it raised, `n/a` (the fault means nothing for that call) or "
            "`FAIL` (an invariant broke). Every "
            "non-n/a cell also checked: no hang, no sandbox left behind, the next call on the "
            "same client succeeds, no credential in the error or the log.",
            "",
            f"**Totals:** {self.summary(report_path())}",
            "",
            "| fault | " + " | ".join(ops) + " |",
            "|---|" + "---|" * len(ops),
        ]
        for fault in FAULTS:
            row = [self.cells.get((fault, op), "not run") for op in ops]
            lines.append(f"| `{fault}` | " + " | ".join(row) + " |")
        lines += ["", "## Faults", ""]
        lines += [f"- `{f.name}`: {f.description}" for f in FAULTS.values()]
        lines += ["", "## Why n/a", ""]
        lines += [f"- `{fault}` x {op}: {why}" for (fault, op), why in sorted(self.reasons.items())]
        return "\n".join(lines) + "\n"


MATRIX = Matrix()


class _Summary:
    """A pytest plugin that prints the matrix totals in the terminal summary."""

    def __init__(self, text: str):
        self.text = text

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_line(self.text)


@pytest.fixture(scope="module", autouse=True)
def fault_matrix(request: pytest.FixtureRequest) -> Iterator[Matrix]:
    MATRIX.started = time.monotonic()
    yield MATRIX
    if not MATRIX.cells:
        return
    report = report_path()
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(MATRIX.markdown())
    plugin = _Summary(MATRIX.summary(report))
    if not request.config.pluginmanager.is_registered(plugin):
        request.config.pluginmanager.register(plugin, "osb-fault-matrix")


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def backoff(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the transport's backoff sleeps instead of sleeping."""
    slept: list[float] = []
    clock = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if n[0] != "_"})
    clock.sleep = slept.append
    monkeypatch.setattr(osb_sync._transport, "time", clock)
    return slept


@pytest.fixture
def client(world: World) -> Iterator[Client]:
    with Client(
        world.api_base,
        KEY,
        connect_timeout=0.5,
        read_timeout=READ_TIMEOUT,
        create_timeout=READ_TIMEOUT,
    ) as c:
        yield c


# -- one cell ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None
    elapsed: float = 0.0
    hung: bool = False

    @property
    def name(self) -> str:
        if self.hung:
            return "HANG"
        return "ok" if self.error is None else type(self.error).__name__


def bounded(world: World, call: Callable[[], Any], bound: float) -> Outcome:
    """Run ``call`` in a thread; past ``bound`` release the server and report a hang."""
    outcome = Outcome()

    def target() -> None:
        started = time.monotonic()
        try:
            outcome.value = call()
        except BaseException as exc:
            outcome.error = exc
        outcome.elapsed = time.monotonic() - started

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(bound)
    if thread.is_alive():
        outcome.hung = True
        world.heal()
        thread.join(10)
    return outcome


def chain_text(exc: BaseException | None) -> str:
    """Messages and reprs of an exception and everything it was raised from."""
    parts = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts += [str(exc), repr(exc)]
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def with_supported(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` with the keyword arguments its signature accepts."""
    accepted = inspect.signature(fn).parameters
    return fn(*args, **{k: v for k, v in kwargs.items() if k in accepted})


def call_op(op: Op, client: Client, sandbox: Sandbox | None) -> Any:
    if op.name in ("create", "wait", "endpoint"):
        return client.create_sandbox(**CREATE)
    assert sandbox is not None
    if op.name == "delete":
        return client.delete_sandbox(sandbox.id)
    if op.name == "run_code":
        return sandbox.run_code("print('ok'); 1 + 1", timeout=RUN_TIMEOUT, max_output_bytes=CAP)
    if op.name == "run_command":
        return with_supported(
            sandbox.commands.run, "echo ok", timeout=COMMAND_TIMEOUT, max_output_bytes=CAP
        )
    return with_supported(sandbox.files.read_bytes, "/data.bin", max_bytes=CAP)


def healthy_call(op: Op, client: Client, sandbox: Sandbox | None) -> None:
    """The next call on the same client, on a healed route: it must simply work."""
    if op.name in ("create", "wait", "endpoint"):
        with client.create_sandbox(**CREATE):
            pass
    elif op.name == "delete":
        assert sandbox is not None and client.delete_sandbox(sandbox.id) in (True, False)
    elif op.name == "run_code":
        assert sandbox is not None and sandbox.run_code("print('ok')").stdout == "ok\n"
    elif op.name == "run_command":
        assert sandbox is not None and sandbox.commands.run("echo ok").stdout == "ok\n"
    else:
        assert sandbox is not None and sandbox.files.read_bytes("/data.bin") == FILE_BYTES


def check_value(op: Op, fault: str, value: Any) -> None:
    """What a returned value must hold after the faults that still allow success."""
    if op.kind == "json":
        assert isinstance(value, Sandbox)
    elif op.name == "delete":
        assert isinstance(value, bool)
    elif op.name == "read_bytes":
        assert fault == "fin_mid_event" or value == FILE_BYTES  # close-delimited: undetectable
    elif fault == "drip":
        assert value.timed_out, "a command past its timeout is a timed-out result"
    elif fault == "events_after_complete" and op.name == "run_code":
        assert value.stdout == "ok\nlate\n", "/code is read to EOF, late events included"
    elif fault == "bare_error_eof":
        assert value.error is not None and value.error.value.endswith("session is busy")
    elif fault not in ("missing_id", "wrong_types"):
        assert value.stdout.startswith("ok\n")


class Cell:
    """One operation under one fault, and every check that follows it."""

    def __init__(
        self, world: World, client: Client, op: Op, fault: str, caplog: pytest.LogCaptureFixture
    ):
        self.world, self.client, self.op, self.fault, self.caplog = world, client, op, fault, caplog

    def arm(self) -> None:
        if self.fault != "refused":
            self.world.inject(self.op.route, self.fault)
        elif self.op.name in ("create", "delete"):
            self.world.api.go_down()
        elif self.op.name in ("wait", "endpoint"):
            self.world.down_after = "create"  # the sandbox exists, then the API is gone
        else:
            self.world.execd.go_down()

    def call(self, sandbox: Sandbox | None) -> Outcome:
        self.arm()
        outcome = bounded(self.world, lambda: call_op(self.op, self.client, sandbox), self.op.bound)
        if self.fault == "lying_cl_short":
            assert self.world.smuggled.wait(2), "the smuggled bytes were never sent"
        self.world.heal()
        MATRIX.record(self.op.name, self.fault, outcome.name)
        self.check(outcome)
        return outcome

    def check(self, outcome: Outcome) -> None:
        assert not outcome.hung, f"no answer within {self.op.bound} s"
        if outcome.error is not None and not isinstance(outcome.error, OpenSandboxError):
            raise AssertionError(f"untyped error: {outcome.error!r}") from outcome.error
        wanted = expected(self.op, self.fault)
        if wanted is NOT_OK:
            assert outcome.name != "ok", "expected an OpenSandboxError, the call returned"
        elif wanted is not None:
            assert outcome.name in wanted, f"expected {sorted(wanted)}"
        if outcome.name == "ok":
            check_value(self.op, self.fault, outcome.value)
        text = chain_text(outcome.error) + self.caplog.text
        assert KEY not in text and TOKEN not in text, "a credential leaked into the error or log"
        assert self.world.requests("other") == [], "a request reached another origin"
        for seen in self.world.requests("execd"):
            assert API_KEY_HEADER.lower() not in {h.lower() for h in seen.headers}
        for seen in self.world.requests("api"):
            assert TOKEN_HEADER.lower() not in {h.lower() for h in seen.headers}

    def run(self) -> None:
        if self.op.name in ("create", "wait", "endpoint"):
            self.run_create()
        elif self.op.name == "delete":
            self.run_delete()
        else:
            self.run_in_sandbox()
        assert self.world.live() == [], "a sandbox was left behind"
        assert self.world.bad_requests == [], "a server received a malformed request"

    def run_create(self) -> None:
        self.world.pending = self.op.name == "wait"
        outcome = self.call(None)
        if isinstance(outcome.value, Sandbox):
            assert self.client.delete_sandbox(outcome.value) is True
        left = self.world.live()
        if self.fault == "refused" and self.op.name in ("wait", "endpoint"):
            # The API went away with the sandbox in it: the leak cannot be avoided, only told.
            assert len(left) == 1 and f"could not delete sandbox {left[0]}" in self.caplog.text
            self.world.forget(left[0])
        assert self.world.live() == [], "the failed create left its sandbox behind"
        healthy_call(self.op, self.client, None)

    def run_delete(self) -> None:
        sandbox = self.client.create_sandbox(**CREATE)
        self.call(sandbox)
        healthy_call(self.op, self.client, sandbox)

    def run_in_sandbox(self) -> None:
        with self.client.create_sandbox(**CREATE) as sandbox:
            self.call(sandbox)
            healthy_call(self.op, self.client, sandbox)


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("op_name", list(OPS))
def test_fault_cell(
    op_name: str,
    fault: str,
    world: World,
    client: Client,
    backoff: list[float],
    caplog: pytest.LogCaptureFixture,
) -> None:
    op = OPS[op_name]
    reason = not_applicable(op, fault)
    if reason is not None:
        MATRIX.record(op_name, fault, "n/a", reason)
        pytest.skip(f"n/a: {reason}")
    caplog.set_level(logging.DEBUG, logger="osb_sync")
    try:
        Cell(world, client, op, fault, caplog).run()
    except BaseException as exc:
        MATRIX.fail(
            op_name, fault, str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
        )
        raise
    if fault in ("429_seconds", "429_date") and op.name in ("delete", "read_bytes"):
        # Idempotent calls honour Retry-After (recorded, capped), not the exponential backoff.
        assert backoff and all(0.0 < s <= 3.0 for s in backoff), backoff
    if fault in ("429_seconds", "429_date") and op.name == "wait":
        # ... but not past their wait's deadline: a Retry-After of 1-2 s exceeds its 0.3 s.
        assert backoff == [], backoff


# -- beyond the matrix: retries with real sleeps, transient faults, two faults at once ----------


def test_retry_after_seconds_is_slept_for_real(world: World, client: Client) -> None:
    sandbox = client.create_sandbox(**CREATE)
    world.inject("get", "429_seconds", times=1)
    assert client.get_sandbox(sandbox.id).state == "Running"
    first, second = world.requests("api", "get")
    assert 0.95 <= second.at - first.at < 3.0
    client.delete_sandbox(sandbox)


@pytest.mark.parametrize("fault", ["reset_before_response", "503_empty", "stall_before_headers"])
def test_one_transient_fault_on_an_idempotent_call_is_retried(
    fault: str, world: World, client: Client, backoff: list[float]
) -> None:
    sandbox = client.create_sandbox(**CREATE)
    world.inject("get", fault, times=1)
    assert client.get_sandbox(sandbox.id).state == "Running"
    assert backoff == [0.5] and len(world.requests("api", "get")) == 2
    client.delete_sandbox(sandbox)


@pytest.mark.parametrize("fault", ["reset_before_response", "503"])
def test_a_create_that_reached_the_server_is_not_sent_twice(
    fault: str, world: World, client: Client, backoff: list[float]
) -> None:
    world.inject("create", fault, times=1)
    with pytest.raises(OpenSandboxError):
        client.create_sandbox(**CREATE)
    assert len(world.requests("api", "create")) == 1 and backoff == []
    assert world.live() == []


@pytest.mark.parametrize(
    ("op_name", "fault", "timeout"),
    [
        ("run_code", "drip", RUN_TIMEOUT),
        ("run_code", "stall_mid_body", None),
        ("run_command", "drip", COMMAND_TIMEOUT),
    ],
)
def test_a_run_ends_on_time_when_the_interrupt_stalls_too(
    op_name: str, fault: str, timeout: float | None, world: World, client: Client
) -> None:
    """A wedged execd stalls the best-effort interrupt too: the caller's deadline must hold.

    Bound: the run's own deadline (or the read timeout that ends a stalled stream), plus one
    read timeout for the interrupt, plus scheduling slack.
    """
    op = OPS[op_name]
    client_deadline = (timeout or READ_TIMEOUT) + (2.0 if op_name == "run_command" else 0.0)
    bound = client_deadline + READ_TIMEOUT + 1.0
    with client.create_sandbox(**CREATE) as sandbox:
        world.inject(op.route, fault)
        world.inject("interrupt", "stall_before_headers")
        if op_name == "run_code":
            call = lambda: sandbox.run_code("1", timeout=timeout)  # noqa: E731
        else:
            call = lambda: sandbox.commands.run("sleep 9", timeout=timeout)  # noqa: E731
        outcome = bounded(world, call, bound)
        world.heal()
    assert not outcome.hung, (
        f"{op_name} under {fault} with a stalled interrupt took over {bound:.1f} s "
        "(the interrupt waits for its own 10 s read timeout)"
    )
    assert outcome.error is None or isinstance(outcome.error, OpenSandboxError)


def test_the_local_server_does_not_hold_streams_back_for_delayed_acks() -> None:
    """A stalled byte of another kind: Nagle on the server waits for the client's delayed ACK.

    The local server sends the status line, the headers and each event in separate small
    writes without TCP_NODELAY, so every streamed answer waits about 40 ms (Linux's minimum
    delayed ACK) before its second segment leaves. Go's execd sets TCP_NODELAY; a healthy
    ``run_code("pass")`` on loopback takes about 10 ms. Nagle's wait is a floor under every
    run, so the fastest of 30 is asserted under 35 ms: a loaded machine slows the median (the
    flake hunt saw 114 ms under four copies of the suite), not every run.
    """
    from osb_sync.local import LocalServer

    with (
        LocalServer(unenforced_network_policy="accept") as server,
        Client(server.api_base) as local_client,
        local_client.create_sandbox(allow_internet_access=True) as sandbox,
    ):
        for _ in range(3):
            sandbox.run_code("pass")
        times = []
        for _ in range(30):
            started = time.perf_counter()
            sandbox.run_code("pass")
            times.append(time.perf_counter() - started)
    assert min(times) < 0.035, f"run_code('pass') took at least {min(times) * 1e3:.0f} ms (of 30)"
