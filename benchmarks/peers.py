"""The three clients doing the same work, behind one small interface, for side-by-side runs.

- ``osb_sync``;
- ``opensandbox``: the official sync SDK (``SandboxSync``) with ``opensandbox-code-interpreter``
  (``CodeInterpreterSync``), as its README shows;
- ``litellm``: LiteLLM's async OpenSandbox provider (``litellm.acreate_sandbox`` ...), driven by
  one event loop per client.

Each client: ``open()`` a sandbox, ``run_many(n)`` calls of ``run_code("pass")`` in it,
``command_many(n)`` calls of ``commands.run("true")``, ``upload_many(n)`` 1 KB uploads,
``get_many(n)`` lookups of the sandbox on the lifecycle server, ``cycle_many(n)`` create+run+delete
cycles, ``close()``. Peers are imported lazily, so a missing one is reported (with its error
text) instead of stopping the run.

``python benchmarks/peers.py NAME API_BASE`` is a worker: one client in a process of its own
(so its CPU time is its own, and two osb_sync trees can be compared side by side: put the other
tree first on ``PYTHONPATH``), driven by JSON lines on stdin (``Worker.handle``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Protocol
from urllib.parse import urlsplit

IMAGE = "opensandbox/code-interpreter:v1.1.0"
ENTRYPOINT = ["/opt/code-interpreter/code-interpreter.sh"]
CODE = "pass"
COMMAND = "true"
UPLOAD_PATH = "/tmp/osb-bench-upload.bin"
UPLOAD = bytes(range(256)) * 4  # 1 KB
SKIP_SDK_HEALTH = "OSB_BENCH_SDK_SKIP_HEALTH"
POOL_BLOCK = "OSB_BENCH_POOL_BLOCK"
LIFETIME = 3600  # seconds: the sandboxes of open() outlive every run of the scripts


class Peer(Protocol):
    name: str

    def open(self) -> None: ...

    def run_many(self, n: int) -> None: ...

    def cycle_many(self, n: int) -> None: ...

    def close(self) -> None: ...


class OsbSync:
    name = "osb_sync"

    def __init__(self, api_base: str, pool_maxsize: int = 32):
        from osb_sync import Client

        # OSB_BENCH_POOL_BLOCK=1: Client(pool_block=True) (osb_sync after issue 29 only)
        extra = {"pool_block": True} if os.environ.get(POOL_BLOCK) else {}
        self.client = Client(api_base, pool_maxsize=pool_maxsize, **extra)
        self.sandbox: Any = None

    def open(self) -> None:
        # a lifetime longer than any run of the scripts (the default, 300 s, is not)
        self.sandbox = self.client.create_sandbox(allow_internet_access=True, timeout=LIFETIME)

    def run_once(self, context: str | None = None) -> None:
        result = self.sandbox.run_code(CODE, context=context or None)
        assert result.error is None, result.error

    def run_many(self, n: int) -> None:
        for _ in range(n):
            self.run_once()

    def command_many(self, n: int) -> None:
        for _ in range(n):
            result = self.sandbox.commands.run(COMMAND)
            assert result.exit_code == 0, result

    def upload_many(self, n: int) -> None:
        for _ in range(n):
            self.sandbox.files.write(UPLOAD_PATH, UPLOAD)

    def get_many(self, n: int) -> None:
        for _ in range(n):
            assert self.client.get_sandbox(self.sandbox.id).id == self.sandbox.id

    def get_once(self, context: str | None = None) -> None:
        assert self.client.get_sandbox(self.sandbox.id).id == self.sandbox.id

    def cycle_many(self, n: int) -> None:
        for _ in range(n):
            with self.client.create_sandbox(allow_internet_access=True) as sandbox:
                assert sandbox.run_code(CODE).error is None

    def for_thread(self) -> OsbSync:
        """Another handle (own sandbox object) on the same client, for one thread."""
        worker = OsbSync.__new__(OsbSync)
        worker.client = self.client
        worker.open()
        return worker

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.delete()
        self.client.close()


class OpenSandboxSdk:
    name = "opensandbox"

    def __init__(self, api_base: str):
        from opensandbox.config import ConnectionConfigSync

        self.config = ConnectionConfigSync(
            domain=urlsplit(api_base).netloc, protocol="http", request_timeout=timedelta(seconds=30)
        )
        self.sandbox: Any = None
        self.interpreter: Any = None

    def _create(self) -> tuple[Any, Any]:
        from code_interpreter import CodeInterpreterSync
        from opensandbox import SandboxSync

        sandbox = SandboxSync.create(
            IMAGE,
            entrypoint=ENTRYPOINT,
            connection_config=self.config,
            timeout=timedelta(seconds=LIFETIME),
        )
        # Its health check probes Jupyter on the image's port (44771); run-execd's Jupyter
        # listens elsewhere, so against the real execd (SKIP_SDK_HEALTH set) it is skipped.
        skip = bool(os.environ.get(SKIP_SDK_HEALTH))
        return sandbox, CodeInterpreterSync.create(sandbox, skip_health_check=skip)

    def open(self) -> None:
        self.sandbox, self.interpreter = self._create()

    def run_once(self, context: str | None = None) -> None:
        if not context:
            execution = self.interpreter.codes.run(CODE)
        else:
            from code_interpreter.models.code_sync import CodeContextSync

            target = CodeContextSync(id=context, language="python")
            execution = self.interpreter.codes.run(CODE, context=target)
        assert execution.error is None, execution.error

    def run_many(self, n: int) -> None:
        for _ in range(n):
            self.run_once()

    def command_many(self, n: int) -> None:
        for _ in range(n):
            execution = self.sandbox.commands.run(COMMAND)
            assert execution.error is None, execution.error

    def upload_many(self, n: int) -> None:
        for _ in range(n):
            self.sandbox.files.write_file(UPLOAD_PATH, UPLOAD)

    def get_many(self, n: int) -> None:
        for _ in range(n):
            assert self.sandbox.get_info().id == self.sandbox.id

    def get_once(self, context: str | None = None) -> None:
        assert self.sandbox.get_info().id == self.sandbox.id

    def for_thread(self) -> OpenSandboxSdk:
        """Its own sandbox and interpreter objects for one thread (the SDK's pattern)."""
        worker = OpenSandboxSdk.__new__(OpenSandboxSdk)
        worker.config = self.config
        worker.open()
        return worker

    def cycle_many(self, n: int) -> None:
        for _ in range(n):
            sandbox, interpreter = self._create()
            assert interpreter.codes.run(CODE).error is None
            sandbox.kill()
            interpreter.close()
            sandbox.close()

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.kill()
            self.interpreter.close()
            self.sandbox.close()


class LiteLlm:
    name = "litellm"

    def __init__(self, api_base: str):
        import litellm

        self.litellm = litellm
        self.api_base = api_base
        self.loop = asyncio.new_event_loop()
        self.handle: Any = None

    async def _create(self) -> Any:
        return await self.litellm.acreate_sandbox(
            provider="opensandbox", api_base=self.api_base, api_key="", allow_internet_access=True
        )

    async def _run(self, handle: Any) -> None:
        result = await self.litellm.arun_code(
            provider="opensandbox", container=handle, code=CODE, api_key="", api_base=self.api_base
        )
        assert result.error is None, result.error

    async def _delete(self, handle: Any) -> None:
        await self.litellm.adelete_sandbox(
            provider="opensandbox", container=handle, api_key="", api_base=self.api_base
        )

    def open(self) -> None:
        self.handle = self.loop.run_until_complete(self._create())

    def run_many(self, n: int) -> None:
        async def many() -> None:
            for _ in range(n):
                await self._run(self.handle)

        self.loop.run_until_complete(many())

    def cycle_many(self, n: int) -> None:
        async def many() -> None:
            for _ in range(n):
                handle = await self._create()
                await self._run(handle)
                await self._delete(handle)

        self.loop.run_until_complete(many())

    def close(self) -> None:
        if self.handle is not None:
            self.loop.run_until_complete(self._delete(self.handle))
        self.loop.close()


FACTORIES = {"osb_sync": OsbSync, "opensandbox": OpenSandboxSdk, "litellm": LiteLlm}


class Worker:
    """One client in this process, driven by ``{"op": ...}`` lines; answers one JSON line each."""

    def __init__(self, name: str, api_base: str, pool_maxsize: int):
        from _common import ConnectionCounter

        options = {"pool_maxsize": pool_maxsize} if name == "osb_sync" else {}
        self.peer: Any = FACTORIES[name](api_base, **options)
        self.counter = ConnectionCounter().__enter__()
        self.threads: list[tuple[Any, str | None]] = []
        self.call = "run_once"
        self.context_locks: dict[str, threading.Lock] = {}

    def handle(
        self, op: str, n: int = 0, contexts: list[str] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        if op == "open":
            self.peer.open()
            module = sys.modules.get("osb_sync")
            return {"osb_sync": getattr(module, "__file__", None)}
        if op == "threads":  # one handle per context, made concurrently, then warmed up
            made: list[Any] = [None] * len(contexts or [])
            makers = [
                threading.Thread(target=lambda i=i: made.__setitem__(i, self.peer.for_thread()))
                for i in range(len(made))
            ]
            for thread in makers:
                thread.start()
            for thread in makers:
                thread.join()
            self.threads = list(zip(made, contexts or [], strict=True))
            self.round(2)
            return {"connections_setup": self.counter.sockets}
        if op == "shared_threads":
            return self.shared_threads(n, **kwargs)
        if op == "round":
            return self.round(n)
        if op == "connections":
            return {"by_address": dict(self.counter.by_address)}
        if op == "close":
            self.peer.close()
            return {}
        work = {
            "runs": self.peer.run_many,
            "commands": self.peer.command_many,
            "uploads": self.peer.upload_many,
            "gets": self.peer.get_many,
        }[op]
        wall, cpu = time.perf_counter(), time.process_time()
        work(n)
        return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}

    def shared_threads(self, n: int, call: str = "run", n_contexts: int = 0) -> dict[str, Any]:
        """``n`` threads on the one sandbox of ``open``: ``call`` "get" (``get_sandbox``) or
        "run" (``run_code`` in one of ``n_contexts`` code contexts made here, thread i in context
        i % n_contexts; the threads of one context take turns, so execd never sees two runs in
        one context), then warm-up rounds until one opens no connection (at most 5)."""
        self.call = "get_once" if call == "get" else "run_once"
        ids = [""]
        if call == "run":
            ids = [self.peer.sandbox.contexts.create().id for _ in range(n_contexts)]
            self.context_locks = {i: threading.Lock() for i in ids}
        self.threads = [(self.peer, ids[i % len(ids)]) for i in range(n)]
        for _ in range(5):  # warm: until a round opens no connection (5 rounds at most)
            if not self.round(2)["sockets"]:
                break
        return {"connections_setup": self.counter.sockets}

    def round(self, calls: int) -> dict[str, Any]:
        """Every thread makes ``calls`` runs in its own context, started at a barrier."""
        latencies: list[float] = []
        failures: list[str] = []
        barrier = threading.Barrier(len(self.threads) + 1)

        def work(handle: Any, context: str) -> None:
            call, lock = getattr(handle, self.call), self.context_locks.get(context)
            barrier.wait()
            for _ in range(calls):
                started = time.perf_counter()
                try:
                    if lock is None:
                        call(context)
                    else:
                        with lock:
                            call(context)
                except Exception as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")
                latencies.append(time.perf_counter() - started)

        threads = [threading.Thread(target=work, args=pair) for pair in self.threads]
        for thread in threads:
            thread.start()
        sockets = self.counter.sockets
        barrier.wait()
        wall, cpu = time.perf_counter(), time.process_time()
        for thread in threads:
            thread.join()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        time.sleep(0.2)  # let the pool's and the streams' helper threads, if any, end
        latencies.sort()
        return {
            "throughput": len(latencies) / wall,
            "cpu_ms_per_call": cpu / len(latencies) * 1e3,
            "p50_ms": latencies[len(latencies) // 2] * 1e3,
            "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
            "sockets": self.counter.sockets - sockets,
            "threads_after": threading.active_count(),  # this thread alone when none leaked
            "os_threads_after": len(os.listdir("/proc/self/task")),
            "failures": len(failures),
            "failure_example": failures[:1],
        }


def serve(name: str, api_base: str, pool_maxsize: int) -> None:
    """The worker loop: a JSON request per stdin line, a JSON answer per stdout line."""
    worker: Worker | None = None
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if worker is None:
                worker = Worker(name, api_base, pool_maxsize)
            answer = {"ok": True, **worker.handle(**request)}
        except Exception as exc:
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 32)
