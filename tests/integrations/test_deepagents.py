"""The deepagents-code provider, discovered and driven through the host's own code."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("deepagents_code")

from deepagents.backends.sandbox import BaseSandbox
from deepagents_code.integrations import sandbox_factory
from deepagents_code.integrations.sandbox_config import SandboxConfig
from deepagents_code.integrations.sandbox_provider import (
    SandboxNotFoundError,
    SandboxProvider,
)
from deepagents_code.integrations.sandbox_registry import SandboxRegistry

from osb_sync import Client, NotFoundError
from osb_sync.integrations.deepagents import OpenSandboxBackend, OpenSandboxProvider
from osb_sync.local import LocalServer


@pytest.fixture(scope="module")
def local() -> Iterator[LocalServer]:
    with LocalServer(command_grace=0, unenforced_network_policy="accept") as srv:
        yield srv


@pytest.fixture
def registry(local: LocalServer, monkeypatch: pytest.MonkeyPatch) -> SandboxRegistry:
    monkeypatch.setenv("OPEN_SANDBOX_API_BASE", local.api_base)
    registry = SandboxRegistry(config=SandboxConfig())  # no user config file
    monkeypatch.setattr(sandbox_factory, "_get_registry", lambda: registry)
    return registry


@pytest.fixture
def backend(registry: SandboxRegistry) -> Iterator[OpenSandboxBackend]:
    with sandbox_factory.create_sandbox("opensandbox", params={"metadata": {"t": "da"}}) as b:
        assert isinstance(b, OpenSandboxBackend)
        yield b


def test_the_host_discovers_the_provider(registry: SandboxRegistry) -> None:
    assert "opensandbox" in registry.available_providers()
    provider = registry.create_provider("opensandbox")
    assert isinstance(provider, OpenSandboxProvider) and isinstance(provider, SandboxProvider)
    metadata = registry.get_metadata("opensandbox")
    assert metadata is not None and metadata.supports_sandbox_id
    assert sandbox_factory.get_default_working_dir("opensandbox") == "/tmp"


def test_a_command_through_the_host(backend: OpenSandboxBackend) -> None:
    assert isinstance(backend, BaseSandbox)
    result = backend.execute("echo out; echo err >&2; exit 3")
    assert (result.output, result.exit_code, result.truncated) == ("out\nerr\n", 3, False)
    assert backend.execute("true").exit_code == 0


def test_file_round_trip(backend: OpenSandboxBackend, tmp_path: Path) -> None:
    # The local server's sandboxes see the host's file system: absolute paths are host paths.
    path = str(tmp_path / "src" / "app.py")
    assert backend.write(path, "x = 1\nprint('TODO')\n").error is None
    read = backend.read(path)
    assert read.error is None and read.file_data is not None
    assert read.file_data["content"] == "x = 1\nprint('TODO')"  # lines, as the host reads
    edited = backend.edit(path, "x = 1", "x = 2")
    assert (edited.error, edited.occurrences) == (None, 1)
    grep = backend.grep("TODO", str(tmp_path))
    assert grep.matches is not None
    assert [(m["path"], m["line"]) for m in grep.matches] == [(path, 2)]
    glob = backend.glob("**/*.py", str(tmp_path))
    assert glob.matches is not None and [m["path"] for m in glob.matches] == ["src/app.py"]
    listing = backend.ls(str(tmp_path / "src"))
    assert listing.entries == [{"path": path, "is_dir": False}]

    blob = bytes(range(256)) * 10
    up = backend.upload_files([(str(tmp_path / "b.bin"), blob), (str(tmp_path / "c.txt"), b"c")])
    assert [r.error for r in up] == [None, None]
    down = backend.download_files(
        [str(tmp_path / "b.bin"), path, str(tmp_path / "missing"), str(tmp_path / "src")]
    )
    assert down[0].content == blob and down[1].content == b"x = 2\nprint('TODO')\n"
    assert [r.error for r in down] == [None, None, "file_not_found", "is_directory"]


def test_timeout_and_output_cap(registry: SandboxRegistry) -> None:
    provider = registry.create_provider("opensandbox")
    backend = provider.get_or_create(max_output_bytes=10_000)
    try:
        timed_out = backend.execute("echo started; sleep 30", timeout=1)
        assert timed_out.exit_code == 124 and timed_out.output.startswith("started\n")
        assert "timed out after 1 seconds" in timed_out.output
        flood = backend.execute("yes | head -c 1000000")
        assert flood.truncated and flood.exit_code is None
        assert backend.execute("echo still fine").output == "still fine\n"
    finally:
        provider.delete(sandbox_id=backend.id)


def test_reattach_by_id_and_delete(registry: SandboxRegistry, local: LocalServer) -> None:
    provider = registry.create_provider("opensandbox")
    created = provider.get_or_create()
    again = provider.get_or_create(sandbox_id=created.id)
    assert again.id == created.id and again.execute("echo $((6*7))").output == "42\n"
    provider.delete(sandbox_id=created.id)
    provider.delete(sandbox_id=created.id)  # already gone: fine
    with Client(local.api_base) as client, pytest.raises(NotFoundError):
        client.get_sandbox(created.id)
    with pytest.raises(SandboxNotFoundError):
        provider.get_or_create(sandbox_id=created.id)


def test_the_host_deletes_what_it_created(registry: SandboxRegistry, local: LocalServer) -> None:
    with sandbox_factory.create_sandbox("opensandbox") as backend:
        sandbox_id = backend.id
    with Client(local.api_base) as client, pytest.raises(NotFoundError):
        client.get_sandbox(sandbox_id)


def test_params_from_the_users_config(local: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    declared = {
        "class_path": "osb_sync.integrations.deepagents:OpenSandboxProvider",
        "params": {"api_base": local.api_base, "metadata": {"team": "agents"}},
    }
    registry = SandboxRegistry(config=SandboxConfig(providers={"opensandbox": declared}))
    monkeypatch.setattr(sandbox_factory, "_get_registry", lambda: registry)
    with sandbox_factory.create_sandbox("opensandbox") as backend:
        with Client(local.api_base) as client:
            assert client.get_sandbox(backend.id).metadata["team"] == "agents"


def test_a_sandbox_in_use_is_renewed(registry: SandboxRegistry) -> None:
    provider = registry.create_provider("opensandbox")
    backend = provider.get_or_create(timeout=600)
    try:
        assert backend.lifetime == 600
        before = backend.sandbox.info().expires_at
        time.sleep(1.1)  # expiry times have whole seconds
        assert backend.execute("true").exit_code == 0  # not yet due: no renewal
        assert backend.sandbox.info().expires_at == before
        backend._renew_at = 0.0  # as if half the lifetime had passed
        assert backend.execute("true").exit_code == 0
        after = backend.sandbox.info().expires_at
        assert before is not None and after is not None and after > before
    finally:
        provider.delete(sandbox_id=backend.id)
