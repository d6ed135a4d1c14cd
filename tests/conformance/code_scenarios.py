"""Scenarios about ``/code``: runs, contexts and interrupts. Each runs in contexts of its own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from osb_sync import CodeContext, Event, ExecutionResult, OpenSandboxError, Sandbox

from .execds import Target, impatient
from .outcome import Large, Outcome, code_outcome, raised

SLEEPER = "import time\nprint('start', flush=True)\ntime.sleep(20)"
FLOOD = "for _ in range(4000):\n    print('x' * 8192, flush=True)"
# From the start of an interrupted run to the end of the next run in its context.
RECOVERY_BOUND = 20.0
RUN_LIMIT = 60.0  # no run here takes a tenth of that: a run that hangs fails its scenario
SILENCE = 3.0  # how long to wait for an answer real execd never sends


def run(sandbox: Sandbox, code: str, context: CodeContext | str | None = None) -> ExecutionResult:
    """run_code with a deadline: a run that hangs fails its scenario, not the whole suite."""
    return sandbox.run_code(code, context=context, timeout=RUN_LIMIT)


@contextmanager
def fresh_context(sandbox: Sandbox) -> Iterator[CodeContext]:
    context = sandbox.contexts.create()
    try:
        yield context
    finally:
        try:
            sandbox.contexts.delete(context)
        except OpenSandboxError:
            pass


def simple_code(t: Target) -> Outcome:
    snippets = [
        "print('hi')",
        "6*7",
        "x = 5",
        "x * 2",
        "print('a', end='')\nprint('b')",
        "'text'",
        "None",
        "print(1)\n2",
        "print('h\\u00e9llo \\u2713')",
        "import sys\nsys.stdout.write('no newline')",
    ]
    with fresh_context(t.sandbox) as ctx:
        return {s: code_outcome(run(t.sandbox, s, ctx)) for s in snippets}


RICH = """
class Rich:
    def _repr_html_(self): return '<b>rich</b>'
    def _repr_markdown_(self): return '**rich**'
    def _repr_json_(self): return {'rich': [1, 2]}
    def _repr_latex_(self): return '$rich$'
    def _repr_svg_(self): return '<svg/>'
    def _repr_png_(self): return bytes(range(8))
    def __repr__(self): return 'Rich()'
Rich()
"""


def results(t: Target) -> Outcome:
    """Rich representations, IPython's pretty printing, input(), a large output."""
    snippets = {
        "rich": RICH,
        "pretty_list": "list(range(40))",
        "pretty_class": "int",
        "short_dict": "{'b': 1, 'a': 2}",
        "semicolon": "3;",
        "input": "input()",
    }
    with fresh_context(t.sandbox) as ctx:
        outcome = {k: code_outcome(run(t.sandbox, s, ctx)) for k, s in snippets.items()}
        big = run(t.sandbox, "print('y' * 300000)", ctx)
    outcome["big"] = {"stdout": Large(big.stdout.encode()), "error": big.error}
    return outcome


def interleaving(t: Target) -> Outcome:
    code = (
        "import sys, time\n"
        "for i in range(3):\n"
        "    print('out', i, flush=True)\n"
        "    time.sleep(0.2)\n"
        "    print('err', i, file=sys.stderr, flush=True)\n"
        "    time.sleep(0.2)\n"
    )
    order: list[str] = []

    def record(event: Event) -> None:
        if event.type in ("stdout", "stderr"):
            order.append(f"{event.type}:{event.text}")

    with fresh_context(t.sandbox) as ctx:
        result = t.sandbox.run_code(code, context=ctx, on_event=record, timeout=RUN_LIMIT)
    return {"result": code_outcome(result), "order": order}


def exceptions(t: Target) -> Outcome:
    snippets = {
        "zero": "1/0",
        "name": "undefined_name",
        "raise": "print('before', flush=True)\nraise ValueError('bad value')",
        "syntax": "def f(:\n    pass",
        "exit": "raise SystemExit(3)",
    }
    with fresh_context(t.sandbox) as ctx:
        outcome = {k: code_outcome(run(t.sandbox, s, ctx)) for k, s in snippets.items()}
        outcome["after_errors"] = code_outcome(run(t.sandbox, "print('still')", ctx))
    return outcome


def contexts(t: Target) -> Outcome:
    sandbox = t.sandbox
    context = sandbox.contexts.create()
    ids = [c.id for c in sandbox.contexts.list()]
    python_ids = [c.id for c in sandbox.contexts.list("python")]
    outcome: Outcome = {
        "language": context.language,
        "listed": context.id in ids,
        "listed_as_python": context.id in python_ids,
        "get": sandbox.contexts.get(context.id) == context,
        "define": code_outcome(run(sandbox, "kept = 'yes'", context)),
        "state_kept": code_outcome(run(sandbox, "kept", context)),
        "by_id": code_outcome(run(sandbox, "kept", context.id)),
    }
    sandbox.contexts.delete(context)
    outcome["listed_after_delete"] = context.id in [c.id for c in sandbox.contexts.list()]
    outcome["get_deleted"] = raised(lambda: sandbox.contexts.get(context.id))
    outcome["run_deleted"] = raised(lambda: sandbox.run_code("1", context=context))
    outcome["delete_deleted"] = raised(lambda: sandbox.contexts.delete(context))
    with impatient(t, SILENCE) as handle:
        outcome["unknown_language"] = raised(lambda: handle.contexts.create("cobol"))
        outcome["bash_language"] = raised(lambda: handle.run_code("echo hi", language="bash"))
    folder = t.fresh_dir()
    sandbox.files.mkdir(folder)
    with_cwd = sandbox.contexts.create(cwd=folder)
    cwd = run(sandbox, "import os\nos.getcwd()", with_cwd).results
    outcome["cwd"] = [r["text"].replace(folder, "<dir>") for r in cwd]
    sandbox.contexts.delete(with_cwd)
    pair = {sandbox.contexts.create().id, sandbox.contexts.create().id}
    sandbox.contexts.delete_all("python")
    outcome["left_after_delete_all"] = len(pair & {c.id for c in sandbox.contexts.list()})
    outcome["delete_all_unknown"] = raised(lambda: sandbox.contexts.delete_all("cobol"))
    return outcome


def default_context(t: Target) -> Outcome:
    """Runs without a context share one."""
    first = run(t.sandbox, "shared_default = 11")
    second = run(t.sandbox, "shared_default + 1")
    return {
        "define": code_outcome(first),
        "use": code_outcome(second),
        "same_context": first.execution_id == second.execution_id,
    }


def _next_run(sandbox: Sandbox, context: CodeContext, started: float) -> Outcome:
    after = run(sandbox, "print('alive')", context)
    return {
        "next": code_outcome(after),
        "next_within_bound": time.monotonic() - started < RECOVERY_BOUND,
    }


def deadline_interrupt(t: Target) -> Outcome:
    sandbox = t.sandbox
    with fresh_context(sandbox) as ctx:
        started = time.monotonic()
        first = raised(lambda: sandbox.run_code(SLEEPER, context=ctx, timeout=2))
        return {"first": first, **_next_run(sandbox, ctx, started)}


def output_cap_interrupt(t: Target) -> Outcome:
    sandbox = t.sandbox
    with fresh_context(sandbox) as ctx:
        started = time.monotonic()
        first = raised(
            lambda: sandbox.run_code(
                FLOOD, context=ctx, max_output_bytes=256 * 1024, timeout=RUN_LIMIT
            )
        )
        return {"first": first, **_next_run(sandbox, ctx, started)}


def early_exit_interrupt(t: Target) -> Outcome:
    sandbox = t.sandbox
    with fresh_context(sandbox) as ctx:
        started = time.monotonic()
        seen = None
        with sandbox.stream_code(SLEEPER, context=ctx, timeout=RUN_LIMIT) as stream:
            for event in stream:
                if event.type == "stdout":
                    seen = event.text
                    break
        return {"first_stdout": seen, **_next_run(sandbox, ctx, started)}


def explicit_interrupt(t: Target) -> Outcome:
    """interrupt_code() while the stream is read: the run ends with KeyboardInterrupt."""
    sandbox = t.sandbox
    with fresh_context(sandbox) as ctx:
        with sandbox.stream_code(SLEEPER, context=ctx, timeout=RUN_LIMIT) as stream:
            for event in stream:
                if event.type == "stdout":
                    sandbox.contexts.interrupt(ctx.id)
            interrupted = code_outcome(stream.result())
        return {"interrupted": interrupted, **_next_run(sandbox, ctx, time.monotonic())}


def busy_context(t: Target) -> Outcome:
    """A second run while the first still runs is refused; the first is unaffected."""
    sandbox = t.sandbox
    code = "import time\nprint('start', flush=True)\ntime.sleep(3)\nprint('end')"
    with (
        fresh_context(sandbox) as ctx,
        sandbox.stream_code(code, context=ctx, timeout=RUN_LIMIT) as first,
    ):
        for event in first:
            if event.type == "stdout":
                break
        second = code_outcome(run(sandbox, "print('second')", ctx))
        for _ in first:
            pass
        return {"second": second, "first": code_outcome(first.result())}
