"""The public surface: exports, error tree, packaging, plugins."""

from __future__ import annotations

import logging
import pkgutil
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import requests
import responses

import osb_sync
from osb_sync._errors import redact
from tests.helpers import API, SID

# Submodules users import by name; every other module is private (a leading underscore).
PUBLIC_MODULES = {"local", "testing", "integrations"}


def public_names() -> set[str]:
    """What ``osb_sync`` offers, as httpx's surface test reads it: its non-underscore names
    (the ones imported on first use loaded first, every name ``dir()`` lists)."""
    for name in dir(osb_sync):
        getattr(osb_sync, name)
    # (isidentifier: pytest's assertion rewriting adds "@py_builtins" to modules it rewrites)
    return {name for name in vars(osb_sync) if name.isidentifier() and not name.startswith("_")}


def test_every_public_name_is_in_all() -> None:
    # A new public name is a decision: it goes into __all__ (and the README) or gets a "_".
    assert public_names() - PUBLIC_MODULES == set(osb_sync.__all__)


def test_only_the_public_modules_lack_an_underscore() -> None:
    modules = {info.name for info in pkgutil.iter_modules(osb_sync.__path__)}
    assert {name for name in modules if not name.startswith("_")} == PUBLIC_MODULES


def test_local_is_imported_on_first_use_only() -> None:
    script = (
        "import sys, osb_sync\n"
        "assert 'osb_sync.local' not in sys.modules\n"
        "assert osb_sync.local.LocalServer.__name__ == 'LocalServer'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def test_pools_providers_and_functions_are_imported_on_first_use_only() -> None:
    script = (
        "import sys, osb_sync\n"
        "lazy = ['osb_sync._pool', 'osb_sync._provider', 'osb_sync._functions', "
        "'osb_sync._orphans', 'osb_sync._files', 'secrets']\n"
        "assert not [m for m in lazy if m in sys.modules], sys.modules.keys()\n"
        "from osb_sync import SandboxPool, run_code\n"
        "assert SandboxPool.__module__ == 'osb_sync._pool'\n"
        "found = osb_sync.discover_providers\n"
        "assert found is sys.modules['osb_sync._provider'].discover_providers\n"
        "assert 'SandboxPool' in vars(osb_sync) and 'create_sandbox' in dir(osb_sync)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def test_constants() -> None:
    assert osb_sync.MAX_OUTPUT_BYTES == 10 * 1024 * 1024
    assert osb_sync.DEFAULT_TEMPLATE == "opensandbox/code-interpreter:v1.1.0"
    assert osb_sync.DEFAULT_ENTRYPOINT == ("/opt/code-interpreter/code-interpreter.sh",)
    assert osb_sync.DEFAULT_TIMEOUT == 300
    assert dict(osb_sync.DEFAULT_RESOURCE_LIMITS) == {"cpu": "1", "memory": "2Gi"}
    assert osb_sync.EXECD_PORT == 44772
    assert osb_sync.DEFAULT_POLL_INTERVAL == 0.2
    assert osb_sync.DEFAULT_READY_TIMEOUT == 30.0
    assert osb_sync.DEFAULT_LANGUAGE == "python"


@pytest.mark.parametrize(
    ("cls", "bases"),
    [
        (osb_sync.ConfigurationError, (ValueError,)),
        (osb_sync.SandboxStateError, (ValueError,)),
        (osb_sync.SandboxTimeoutError, (TimeoutError,)),
        (osb_sync.OutputLimitExceeded, (ValueError,)),
        (osb_sync.CommandFailed, ()),
        (osb_sync.PoolClosedError, ()),
        (osb_sync.ApiError, (requests.HTTPError,)),
        (osb_sync.NotFoundError, (osb_sync.ApiError, requests.HTTPError)),
        (osb_sync.NotSupportedError, (osb_sync.ApiError, requests.HTTPError)),
        (osb_sync.TransportError, (requests.ConnectionError,)),
        (osb_sync.StreamError, (osb_sync.TransportError, requests.ConnectionError)),
    ],
)
def test_error_tree(cls: type, bases: tuple[type, ...]) -> None:
    assert issubclass(cls, osb_sync.OpenSandboxError)
    for base in bases:
        assert issubclass(cls, base)


def answered_error(
    status: int, body: bytes, content_type: str = "application/json", **client: str
) -> osb_sync.ApiError:
    """The error a client raises for ``GET /v1/sandboxes/{SID}`` answered with this body."""
    headers = {"X-Request-ID": "rid-42"}
    with responses.RequestsMock() as rsps, osb_sync.Client(API, **client) as c:
        rsps.get(
            f"{API}/sandboxes/{SID}",
            status=status,
            body=body,
            content_type=content_type,
            headers=headers,
        )
        with pytest.raises(osb_sync.ApiError) as info:
            c.get_sandbox(SID)
    return info.value


@pytest.mark.parametrize(
    ("body", "content_type", "expected"),
    [
        (b'{"code":"DOCKER::SANDBOX_NOT_RUNNING","message":"not running"}', "application/json",
         " DOCKER::SANDBOX_NOT_RUNNING: not running (request id rid-42)"),
        (b'{"detail":[{"loc":["body","timeout"],"msg":"too small"}]}', "application/json",
         " VALIDATION_ERROR: body.timeout: too small (request id rid-42)"),
        (b'{"error":"Unauthorized"}', "application/json", ": Unauthorized (request id rid-42)"),
        (b"<html><body>Bad gateway</body></html>", "text/html",
         ": an HTML page (37 bytes) instead of an API error body (request id rid-42)"),
        (b"plain\n  words", "text/plain", ": plain words (request id rid-42)"),
        (b"[1, 2]", "application/json", ": [1, 2] (request id rid-42)"),
    ],
)  # fmt: skip
def test_error_funnel_messages(body: bytes, content_type: str, expected: str) -> None:
    """Every unusable answer goes through one funnel: what a client call raises."""
    error = answered_error(409, body, content_type)
    assert str(error) == f"GET /v1/sandboxes/{SID} -> 409{expected}"
    assert error.status_code == 409 and error.request_id == "rid-42"
    assert isinstance(error.response, requests.Response)


def test_error_funnel_redacts_secrets_and_maps_404() -> None:
    body = b'{"code":"NF","message":"key s3cr3t-key was wrong"}'
    error = answered_error(404, body, api_key="s3cr3t-key")
    assert isinstance(error, osb_sync.NotFoundError)
    assert "s3cr3t-key" not in str(error) and "s3cr3t-key" not in error.message


def test_redact_finds_a_secret_as_repr_escapes_it_too() -> None:
    """A secret quoted by a repr (a refused value, a bytes line urllib3 quotes) is escaped
    there: redacted all the same; one under 4 characters would be everywhere, and is not."""
    secret = "tok\\en\n-9d41"
    assert redact(f"got {secret!r} and {secret}", [secret]) == "got '[redacted]' and [redacted]"
    assert redact("a b c", ["b"]) == "a b c"


def test_package_ships_py_typed() -> None:
    assert (Path(osb_sync.__file__).parent / "py.typed").is_file()


def test_entry_point_is_published_and_discovered() -> None:
    (ep,) = [e for e in entry_points(group="sandbox_providers") if e.name == "opensandbox"]
    assert ep.value == "osb_sync:OpenSandboxProvider"
    providers = osb_sync.discover_providers()
    assert providers["opensandbox"] is osb_sync.OpenSandboxProvider


def test_broken_plugin_is_logged_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dist = tmp_path / "broken_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[sandbox_providers]\nbroken = no_such_module_x:Cls\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="osb_sync"):
        providers = osb_sync.discover_providers()
    assert "broken" not in providers and "opensandbox" in providers
    assert "could not load sandbox provider 'broken'" in caplog.text


def test_provider_methods_delegate(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, tuple[object, ...], dict[str, object]]] = []
    for name in ("create_sandbox", "run_code", "delete_sandbox", "code_interpreter_tool"):
        monkeypatch.setattr(
            f"osb_sync._functions.{name}",
            lambda *a, _n=name, **kw: seen.append((_n, a, kw)) or _n,
        )
    provider = osb_sync.OpenSandboxProvider()
    assert provider.create_sandbox(api_base="http://x/v1", template="t") == "create_sandbox"
    assert provider.run_code(container="sid", code="1", language="bash") == "run_code"
    assert provider.delete_sandbox(container="sid", api_key="k") == "delete_sandbox"
    assert provider.code_interpreter_tool(code="1", timeout=60) == "code_interpreter_tool"
    assert seen == [
        ("create_sandbox", (), {"api_base": "http://x/v1", "template": "t"}),
        ("run_code", ("sid", "1"), {"language": "bash"}),
        ("delete_sandbox", ("sid",), {"api_key": "k"}),
        ("code_interpreter_tool", ("1",), {"timeout": 60}),
    ]


def test_the_unrelated_sseclient_package_is_detected(tmp_path: Path) -> None:
    fake = tmp_path / "sseclient.py"
    fake.write_text(
        textwrap.dedent(
            """
            class SSEClient:
                def __init__(self, url, last_id=None, retry=3000, session=None, **kw):
                    pass
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, "-c", "from osb_sync import Client"],  # names load on first use
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr and "pip uninstall -y sseclient" in proc.stderr
