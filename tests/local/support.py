"""What the local server's tests share: the suite's server, sandbox handles and helpers.

Every test talks to a real server over loopback with `requests` or `http.client`. A test makes
its server with `local_server(**overrides)` (the suite's settings, and its own); a test of
LocalServer's own defaults, or a server in a process of its own (`serverproc.py`), builds one
itself. The fixtures (`conftest.py`) are made from these.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from osb_sync.local import LocalServer
from osb_sync.local.host.bwrap import SANDBOX_HOME, probe
from osb_sync.local.host.registry import Registry
from osb_sync.local.host.sandboxes import LocalSandbox

# OSB_REQUIRE_ISOLATION=1 (CI): a test that needs isolated sandboxes fails instead of skipping.
REQUIRE_ISOLATION = os.environ.get("OSB_REQUIRE_ISOLATION") == "1"

CREATE_BODY: dict[str, Any] = {
    "image": {"uri": "opensandbox/code-interpreter:v1.1.0"},
    "entrypoint": ["/bin/sh"],
    "resourceLimits": {"cpu": "500m", "memory": "512Mi"},
}


def parse_events(raw: bytes) -> list[dict[str, Any]]:
    """Split an execd stream into objects: `{...}\\n\\n` frames plus a bare trailing error."""
    return [json.loads(block) for block in raw.split(b"\n\n") if block.strip()]


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def host_pids_with(marker: str) -> list[int]:
    """The host pids whose command line holds `marker`, read from the host's /proc.

    How a test finds a sandbox's processes: a pid printed inside a sandbox numbers its own PID
    namespace, and the same number on the host is any process (a kernel thread, say).
    """
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if marker.encode() in cmdline.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def sleep_marker(seconds: int) -> str:
    """A `sleep` argument of about `seconds` that no other process has (`602.0417395`): the
    test suite may run in several copies at once on one host."""
    return f"{seconds}.{secrets.randbelow(10**7):07d}"


def wait_for(predicate: Any, timeout: float = 5.0) -> bool:
    """Poll `predicate` until it is true or `timeout` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(result)


class Box:
    """A sandbox on a LocalServer, with helpers for its execd."""

    def __init__(self, server: LocalServer, http: requests.Session, body: dict[str, Any]) -> None:
        self.server = server
        self.http = http
        created = http.post(f"{server.api_base}/sandboxes", json=body)
        assert created.status_code == 202, created.text
        self.id: str = created.json()["id"]
        self.created = created.json()
        endpoint = http.get(f"{server.api_base}/sandboxes/{self.id}/endpoints/44772").json()
        self.base = f"http://{endpoint['endpoint']}"
        self.headers: dict[str, str] = endpoint["headers"]

    @property
    def dir(self) -> str:
        """The sandbox directory on disk."""
        assert self.server.root_dir is not None
        return os.path.join(self.server.root_dir, self.id)

    @property
    def home(self) -> str:
        """The sandbox directory as the sandbox's own processes see it."""
        return SANDBOX_HOME if self.server.isolated else self.dir

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One execd request with the sandbox's token."""
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return self.http.request(method, self.base + path, headers=headers, **kwargs)

    def stream(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """POST a streaming execd route and return its events."""
        response = self.call("POST", path, json=body)
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"] == "text/event-stream"
        return parse_events(response.content)

    def code(self, code: str, **context: Any) -> list[dict[str, Any]]:
        """Run `code` through /code (python unless `language` is given)."""
        return self.stream("/code", {"code": code, "context": {"language": "python", **context}})

    def command(self, command: str, **extra: Any) -> list[dict[str, Any]]:
        """Run `command` through /command (its events texts keep their line ends: see
        `texts`)."""
        return CommandEvents(self.stream("/command", {"command": command, **extra}))


class CommandEvents(list):  # type: ignore[type-arg]
    """A /command run's events: `texts` reads them line by line."""


def texts(events: list[dict[str, Any]], kind: str = "stdout") -> list[str]:
    """The texts of the events of type `kind`; of a /command run (`Box.command`), its output
    line by line without line ends (a blank line as "\\n"), whatever the events' split."""
    found = [e["text"] for e in events if e.get("type") == kind]
    if not isinstance(events, CommandEvents):
        return found
    return [line or "\n" for line in "".join(found).splitlines()]


def require_isolation() -> None:
    """Skip the test where sandboxes cannot be isolated (fail under OSB_REQUIRE_ISOLATION=1)."""
    problem = probe().problem
    if problem:
        if REQUIRE_ISOLATION:
            pytest.fail(f"OSB_REQUIRE_ISOLATION=1 but sandboxes cannot be isolated: {problem}")
        pytest.skip(f"sandboxes cannot be isolated here: {problem}")


def require_slirp() -> None:
    """Skip the test where sandboxes get no network through slirp4netns (fail under
    OSB_REQUIRE_ISOLATION=1)."""
    if probe().slirp is None:
        reason = "slirp4netns is not installed (apt-get install slirp4netns)"
        if REQUIRE_ISOLATION:
            pytest.fail(f"OSB_REQUIRE_ISOLATION=1 but {reason}")
        pytest.skip(reason)


# The suite's server: fast heartbeats, no /command grace, a 1 s minimum sandbox timeout.
SUITE = {"ping_interval": 0.2, "command_grace": 0, "min_timeout": 1}


def local_server(**overrides: Any) -> LocalServer:
    """A LocalServer for a test (not started): the suite's settings, then `overrides`."""
    return LocalServer(**{**SUITE, **overrides})


def volume_server(tree: Path) -> LocalServer:
    """An isolated server for the volume tests (not started): host paths allowed under
    `tree/allowed`, pvcs under `tree/volumes`."""
    require_isolation()
    allowed = [tree / "allowed"]
    return local_server(isolation=True, allowed_host_paths=allowed, volume_root=tree / "volumes")


def registry_of(server: LocalServer) -> Registry:
    """The started `server`'s registry (its resources, its spares)."""
    assert server._registry is not None, "the server is not started"
    return server._registry


def sandbox_of(server: LocalServer, sandbox_id: str) -> LocalSandbox:
    """The live sandbox `sandbox_id` of the started `server`."""
    sandbox = registry_of(server).sandboxes.find(sandbox_id)
    assert sandbox is not None, f"no sandbox {sandbox_id}"
    return sandbox
