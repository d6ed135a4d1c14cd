"""execd's CodeInterpreting routes: code contexts and `/code` runs.

The route table is `router.py`; commands and bash sessions live in `command.py`. Streams
follow the real daemon (protocol reference, section 2.3): bare JSON events followed by a blank
line, `init` first, a ping right after it and then every ping interval, and a type-less error
object without a newline when a stream fails after `init` (e.g. "session is busy").
"""

from __future__ import annotations

import codecs
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..http.bodies import bad_request, read_object, working_dir
from ..http.exchange import Exchange, error
from .command import Commands, CommandSpec, run_shell
from .pyworker import DEAD_WORKER, PythonWorker
from .runner import SandboxRuntime, kill_group
from .workers import Emit, complete, failure, run_error

LANGUAGES = ("python", "bash")


@dataclass
class Context:
    """A code context: one language, one working directory, one run at a time."""

    id: str
    language: str
    cwd: Path
    lock: threading.Lock
    worker: PythonWorker | None = None
    running: subprocess.Popen[bytes] | None = None  # the current bash run, for interrupt

    def describe(self) -> dict[str, str]:
        """The `{"id","language"}` body of the context routes."""
        return {"id": self.id, "language": self.language}

    def interrupt(self) -> None:
        """SIGINT the running code (KeyboardInterrupt in Python)."""
        if self.worker is not None:
            self.worker.interrupt()
        if self.running is not None:
            kill_group(self.running.pid, signal.SIGINT)

    def close(self) -> None:
        """Kill the context's worker, if any."""
        if self.worker is not None:
            self.worker.kill()


class CodeInterpreter:
    """The code contexts of one sandbox and their `/code` runs (the CodeInterpreting routes)."""

    def __init__(self, runtime: SandboxRuntime, commands: Commands) -> None:
        self.runtime = runtime
        self.commands = commands  # language-less code runs as a command; streams start there
        self._lock = threading.Lock()
        self._contexts: dict[str, Context] = {}
        self._defaults: dict[str, str] = {}

    def close(self) -> None:
        """Kill every context's worker (the sandbox is going away)."""
        with self._lock:
            contexts = list(self._contexts.values())
            self._contexts.clear()
        for context in contexts:
            context.close()

    def _new_context(self, language: str, cwd: Path, default: bool = False) -> Context:
        """A new context; with `default`, the language's default one unless it exists."""
        if language not in LANGUAGES:
            # Real execd answers 500 once a kernel fails to start; this one knows beforehand
            # that it cannot, and says so as a bad request naming the field (issue 28).
            supported = ", ".join(LANGUAGES)
            raise error(
                400,
                "INVALID_REQUEST_BODY",
                f"language {language!r} is not supported: the local server runs {supported}",
            )
        with self._lock:
            existing = self._contexts.get(self._defaults.get(language, ""))
            if default and existing is not None:
                return existing
            context = Context(secrets.token_hex(16), language, cwd, threading.Lock())
            self._contexts[context.id] = context
            if default:
                self._defaults[language] = context.id
        return context

    def _find_context(self, context_id: str) -> Context:
        with self._lock:
            context = self._contexts.get(context_id)
        if context is None:
            raise error(404, "CONTEXT_NOT_FOUND", f"context {context_id} not found")
        return context

    def create_context(self, ex: Exchange) -> None:
        """POST /code/context."""
        body = read_object(ex)
        if not body.get("language") or not isinstance(body["language"], str):
            raise bad_request("language is required")
        cwd = working_dir(body.get("cwd"), self.runtime.dir, self.runtime.resolve)
        ex.send_json(200, self._new_context(str(body["language"]), cwd).describe())

    def list_contexts(self, ex: Exchange) -> None:
        """GET /code/contexts?language= (language optional, as in real execd)."""
        language = ex.arg("language")
        with self._lock:
            found = [
                c.describe()
                for c in self._contexts.values()
                if not language or c.language == language
            ]
        ex.send_json(200, found)

    def get_context(self, ex: Exchange) -> None:
        """GET /code/contexts/{id}."""
        ex.send_json(200, self._find_context(ex.params["id"]).describe())

    def _drop(self, doomed: list[Context]) -> None:
        with self._lock:
            for context in doomed:
                self._contexts.pop(context.id, None)
                if self._defaults.get(context.language) == context.id:
                    del self._defaults[context.language]
        for context in doomed:
            context.close()

    def delete_context(self, ex: Exchange) -> None:
        """DELETE /code/contexts/{id}."""
        self._drop([self._find_context(ex.params["id"])])
        ex.send(200)

    def delete_contexts(self, ex: Exchange) -> None:
        """DELETE /code/contexts?language=."""
        language = ex.arg("language")
        if not language:
            raise error(400, "MISSING_QUERY", "missing query parameter: language")
        with self._lock:
            doomed = [c for c in self._contexts.values() if c.language == language]
        self._drop(doomed)
        ex.send(200)

    def interrupt_code(self, ex: Exchange) -> None:
        """DELETE /code?id=: interrupt the run of a context."""
        context_id = ex.arg("id")
        if not context_id:
            raise error(400, "MISSING_QUERY", "missing query parameter: id")
        self._find_context(context_id).interrupt()
        ex.send(200)

    def run_code(self, ex: Exchange) -> None:
        """POST /code: run code in a context (no language: run it as a shell command)."""
        body = read_object(ex)
        code = body.get("code")
        if not isinstance(code, str) or not code:
            raise bad_request("code is required")
        spec = body.get("context") or {}
        language = spec.get("language") if isinstance(spec, dict) else None
        if language is not None and not isinstance(language, str):
            raise bad_request("context.language must be a string")
        if language != "python" and "\0" in code:
            raise bad_request("code must not contain NUL characters")  # a shell cannot run it
        if not language:
            # Real execd runs language-less code as a shell command, even with a context id.
            self.commands.execute(ex, CommandSpec(code, self.runtime.dir, {}), background=False)
            return
        if spec.get("id"):
            with self._lock:
                found = self._contexts.get(str(spec["id"]))
            if found is None:  # a 500 here, unlike the context routes' 404, as in real execd
                raise error(
                    500, "RUNTIME_ERROR", f"error running codes context {spec['id']} not found"
                )
            context = found
        else:
            context = self._new_context(str(language), self.runtime.dir, default=True)
        stream = self.commands.stream(ex, context.id)
        if not context.lock.acquire(blocking=False):
            stream.bare_error("RUNTIME_ERROR", "error running codes session is busy")
            stream.close()
            return
        try:
            stream.start_pings()
            if context.language == "python":
                self._run_python(context, code, stream.event)
            else:
                self._run_bash(context, code, stream.event)
        finally:
            context.lock.release()
            stream.close()

    def _run_python(self, context: Context, code: str, emit: Emit) -> None:
        started = time.monotonic()
        lost = ""
        try:
            if context.worker is None or not context.worker.alive:
                if context.worker is not None:
                    # Died between runs: start afresh, like a kernel restart, and tell this
                    # run rather than let the code meet a NameError for what was lost.
                    if not context.worker.death_reported:
                        lost = context.worker.ending()
                    context.worker.kill()
                context.worker = PythonWorker(self.runtime, context.cwd)
        except OSError as exc:
            emit({"type": "error", "error": {"ename": "OSError", "evalue": str(exc)}})
            return
        if lost:
            evalue = (
                f"the Python worker of this context {lost} after its last run and was"
                " restarted: its variables and imports are gone, and this code was not run."
                " Run it again to run it in the fresh worker"
            )
            emit({"type": "status", "text": "error"})
            emit({"type": "error", "error": {**DEAD_WORKER, "evalue": evalue}})
            emit(complete(started))
            return
        context.worker.run(code, emit)

    def _run_bash(self, context: Context, code: str, emit: Emit) -> None:
        """One `bash -c` per run (cwd and variables do not persist; use sessions for that)."""
        started = time.monotonic()
        decoders = {
            name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")
        }

        def sink(name: str, data: bytes) -> None:
            text = decoders[name].decode(data)
            if text:
                emit({"type": name, "text": text})

        def started_process(proc: subprocess.Popen[bytes]) -> None:
            context.running = proc

        oom_before = self.runtime.oom_kills()
        outcome = run_shell(self.runtime, CommandSpec(code, context.cwd, {}), sink, started_process)
        context.running = None
        if outcome != 0:
            emit({"type": "status", "text": "error"})
            emit(
                failure(*run_error(self.runtime, outcome, oom_before))
                if isinstance(outcome, int)
                else failure(outcome, outcome)
            )
        emit(complete(started))
