"""The three clients doing the same work, behind one small interface, for side-by-side runs.

- ``osb_sync``;
- ``opensandbox``: the official sync SDK (``SandboxSync``) with ``opensandbox-code-interpreter``
  (``CodeInterpreterSync``), as its README shows;
- ``litellm``: LiteLLM's async OpenSandbox provider (``litellm.acreate_sandbox`` ...), driven by
  one event loop per client.

Each client: ``open()`` a sandbox, ``run_many(n)`` calls of ``run_code("pass")`` in it,
``cycle_many(n)`` create+run+delete cycles, ``close()``. Peers are imported lazily, so a missing
one is reported (with its error text) instead of stopping the run.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, Protocol
from urllib.parse import urlsplit

IMAGE = "opensandbox/code-interpreter:v1.1.0"
ENTRYPOINT = ["/opt/code-interpreter/code-interpreter.sh"]
CODE = "pass"


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

        self.client = Client(api_base, pool_maxsize=pool_maxsize)
        self.sandbox: Any = None

    def open(self) -> None:
        self.sandbox = self.client.create_sandbox(allow_internet_access=True)

    def run_once(self) -> None:
        result = self.sandbox.run_code(CODE)
        assert result.error is None, result.error

    def run_many(self, n: int) -> None:
        for _ in range(n):
            self.run_once()

    def cycle_many(self, n: int) -> None:
        for _ in range(n):
            with self.client.create_sandbox(allow_internet_access=True) as sandbox:
                assert sandbox.run_code(CODE).error is None

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

        sandbox = SandboxSync.create(IMAGE, entrypoint=ENTRYPOINT, connection_config=self.config)
        return sandbox, CodeInterpreterSync.create(sandbox)

    def open(self) -> None:
        self.sandbox, self.interpreter = self._create()

    def run_once(self) -> None:
        execution = self.interpreter.codes.run(CODE)
        assert execution.error is None, execution.error

    def run_many(self, n: int) -> None:
        for _ in range(n):
            self.run_once()

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
