"""The execd of one sandbox: every route it serves, in one table, in the spec's order.

The table follows real execd's router (`components/execd/pkg/web/router.go`) and its spec
(`execd-api.yaml`), group by group: Health, CodeInterpreting (`code_interpreting.py`),
Command (`command.py`), Filesystem (`filesystem.py`, uploads in `uploads.py`) and Metric
(`metrics.py`), then execd's terminals (`pty.py`: `/pty`, served since execd 1.0.10 but in
no released spec). `tests/unit/test_route_tables.py` checks it against the spec and lists what
is not served yet. After them, execd 1.1.1's files as a user (`identity.py`): every file route
again under `/v1/filesystem/{uid}/{gid}`, served as that user.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..http.exchange import Exchange, Route, Router
from . import filesystem, identity, metrics, uploads
from .code_interpreting import CodeInterpreter
from .command import Commands
from .pty import PtySessions
from .runner import SandboxRuntime


def ping(ex: Exchange) -> None:
    """GET /ping."""
    ex.send(200)


class ExecdApp:
    """The execd of one sandbox: its route table, contexts, commands and sessions."""

    def __init__(self, runtime: SandboxRuntime, ping_interval: float, command_grace: float) -> None:
        self.runtime = runtime
        self.commands = Commands(runtime, ping_interval, command_grace)
        self.code = CodeInterpreter(runtime, self.commands)
        self.pty = PtySessions(runtime)
        self.router = Router()
        for method, pattern, route in self.routes():
            self.router.add(method, pattern, route)

    def routes(self) -> list[tuple[str, str, Route]]:
        """(method, path pattern, route) of every route, in the spec's order."""
        code, commands = self.code, self.commands

        def files(handler: Callable[[SandboxRuntime, Exchange], None]) -> Route:
            return functools.partial(handler, self.runtime)

        table: list[tuple[str, str, Route]] = [
            ("GET", "/ping", ping),
            ("GET", "/code/contexts", code.list_contexts),
            ("DELETE", "/code/contexts", code.delete_contexts),
            ("GET", "/code/contexts/{id}", code.get_context),
            ("DELETE", "/code/contexts/{id}", code.delete_context),
            ("POST", "/code/context", code.create_context),
            ("POST", "/code", code.run_code),
            ("DELETE", "/code", code.interrupt_code),
            ("POST", "/session", commands.create_session),
            ("POST", "/session/{id}/run", commands.run_in_session),
            ("DELETE", "/session/{id}", commands.delete_session),
            ("POST", "/command", commands.run_command),
            ("DELETE", "/command", commands.interrupt),
            ("GET", "/command/status/{id}", commands.status),
            ("GET", "/command/{id}/logs", commands.logs),
            ("GET", "/files/info", files(filesystem.info)),
            ("DELETE", "/files", files(filesystem.delete_files)),
            ("POST", "/files/permissions", files(filesystem.permissions)),
            ("POST", "/files/mv", files(filesystem.move)),
            ("GET", "/files/search", files(filesystem.search)),
            ("POST", "/files/replace", files(uploads.replace)),
            ("POST", "/files/upload", files(uploads.upload)),
            ("GET", "/files/download", files(filesystem.download)),
            ("GET", "/directories/list", files(filesystem.list_directory)),
            ("POST", "/directories", files(filesystem.make_directories)),
            ("DELETE", "/directories", files(filesystem.delete_directories)),
            ("GET", "/metrics", metrics.get_metrics),
            # execd's terminals (not in the spec; opensandbox-1.1.1.md §2)
            ("POST", "/pty", self.pty.create),
            ("GET", "/pty/{id}", self.pty.status),
            ("DELETE", "/pty/{id}", self.pty.delete),
            ("GET", "/pty/{id}/ws", self.pty.connect),
        ]
        # execd 1.1.1 (#2070): the file routes again, as a user
        file_routes = [r for r in table if r[1].startswith(("/files", "/directories"))]
        for method, pattern, route in file_routes:
            handler = route.func  # type: ignore[attr-defined]
            served = identity.served_as_user(self.runtime, handler)
            table.append((method, identity.PREFIX + pattern, served))
        return table

    def close(self) -> None:
        """Kill every worker and session (the sandbox is going away)."""
        self.code.close()
        self.commands.close()
        self.pty.close()

    def handle(self, ex: Exchange, path: str) -> None:
        """Answer `ex` for the execd path `path` (`/code`, `/files/info`, ...)."""
        found = self.router.match(ex.method, path)
        if isinstance(found, int):
            text = b"404 page not found" if found == 404 else b"405 method not allowed"
            ex.send(found, text, {"Content-Type": "text/plain"})
            return
        route, ex.params = found
        route(ex)
