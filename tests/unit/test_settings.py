"""Settings and options: each built and checked once, declared once, and quoted right."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

import osb_sync
from osb_sync import Client, ConfigurationError, Sandbox
from osb_sync._config import DEFAULT_SETTINGS, ClientSettings
from osb_sync._options import Reach, build_create_body, split_create_options
from tests.helpers import API

ROOT = Path(__file__).resolve().parents[2]


def flat(path: Path) -> str:
    """A document with its line breaks and indents folded into single spaces."""
    return " ".join(path.read_text().split())


def test_the_signatures_take_their_defaults_from_the_settings() -> None:
    client = inspect.signature(Client).parameters
    for field in dataclasses.fields(ClientSettings):
        assert client[field.name].default == field.default
    execd = inspect.signature(Sandbox.from_execd).parameters
    for name in ("connect_timeout", "read_timeout", "call_timeout", "pool_maxsize"):
        assert execd[name].default == ClientSettings.__dataclass_fields__[name].default


def test_the_call_timeout_is_twice_the_read_timeout_unless_given() -> None:
    assert DEFAULT_SETTINGS.call_timeout == 2 * DEFAULT_SETTINGS.read_timeout == 120.0
    assert ClientSettings(read_timeout=4).call_timeout == 8.0
    assert ClientSettings(read_timeout=4, call_timeout=1).call_timeout == 1.0
    assert Client(API, read_timeout=3)._transport.call_timeout == 6.0
    assert Sandbox.from_execd("http://127.0.0.1:1", call_timeout=2)._execd.call_timeout == 2.0


def test_the_readme_states_the_defaults() -> None:
    readme = flat(ROOT / "README.rst")
    parameters = inspect.signature(Client).parameters.values()
    shown = [f"{p.name}={p.default!r}" for p in parameters]
    shown.insert(2, "*")  # session and what follows are keyword-only
    assert f"``Client({', '.join(shown)})``" in readme
    s = DEFAULT_SETTINGS
    assert (
        f"``Client(connect_timeout={s.connect_timeout:g}, read_timeout={s.read_timeout:g}, "
        f"create_timeout={s.create_timeout:g})``" in readme
    )
    assert f"``ready_timeout`` ({osb_sync.DEFAULT_READY_TIMEOUT:g} s)" in readme
    for document in (readme, flat(ROOT / "docs" / "guides" / "web.rst")):
        assert f"``pool_maxsize`` (connections, {s.pool_maxsize} by default)" in document


def test_settings_are_frozen_and_normalised() -> None:
    settings = ClientSettings(connect_timeout=3, read_timeout=4)
    assert (settings.connect_timeout, settings.read_timeout) == (3.0, 4.0)
    assert isinstance(settings.connect_timeout, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.read_timeout = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"read_timeout": "60"}, "read_timeout"),
        ({"call_timeout": 0}, "call_timeout"),
        ({"create_timeout": True}, "create_timeout"),
        ({"pool_maxsize": 1.5}, "pool_maxsize"),
        ({"pool_block": 1}, "pool_block"),
        ({"max_retries": -1}, "max_retries"),
        ({"execd_scheme": "ftp"}, "execd_scheme"),
    ],
)
def test_a_bad_setting_is_named(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        ClientSettings(**kwargs)
    with pytest.raises(ConfigurationError, match=named):
        Client(API, **kwargs)


def test_from_execd_checks_its_settings() -> None:
    with pytest.raises(ConfigurationError, match="pool_maxsize"):
        Sandbox.from_execd("http://127.0.0.1:44772", pool_maxsize=0)
    with pytest.raises(ConfigurationError, match="read_timeout"):
        Sandbox.from_execd("http://127.0.0.1:44772", read_timeout=-1)


# -- options declared once ---------------------------------------------------------------


def keywords(function: Any) -> dict[str, Any]:
    parameters = inspect.signature(function).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is p.KEYWORD_ONLY}


def test_the_run_keywords_are_one_declaration_shown_by_every_signature() -> None:
    shared = {
        "language": "python",
        "max_output_bytes": osb_sync.MAX_OUTPUT_BYTES,
        "timeout": None,
        "on_event": None,
    }
    assert keywords(Client.run_code) == keywords(Client.stream_code) == shared
    with_context = {"language": "python", "context": None, **shared}
    assert keywords(Sandbox.run_code) == keywords(Sandbox.stream_code) == with_context
    assert list(keywords(Sandbox.run_code)) == list(with_context)  # context second, as before
    functions = keywords(osb_sync.run_code)
    assert {k: functions.pop(k) for k in ("api_key", "api_base", "session")} == dict.fromkeys(
        ("api_key", "api_base", "session")
    )
    assert functions == with_context
    assert "language: str = 'python'" in str(inspect.signature(Client.run_code))


def test_a_keyword_that_is_not_a_run_option_is_refused_before_any_request() -> None:
    # No server: a refused keyword must not even resolve the sandbox's endpoint.
    client = Client("http://127.0.0.1:9/v1", max_retries=0)
    with pytest.raises(
        TypeError, match="run_code\\(\\) got an unexpected keyword argument 'context'"
    ):
        client.run_code("sbx-1", "1", context="c1")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="stream_code\\(\\) got an unexpected keyword"):
        client.stream_code("sbx-1", "1", langauge="bash")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="connect\\(\\) got an unexpected keyword"):
        client.connect("sbx-1", ready_timout=1)  # type: ignore[call-arg]
    sandbox = Sandbox.from_execd("http://127.0.0.1:9")
    with pytest.raises(TypeError, match="run_code\\(\\) got an unexpected keyword"):
        sandbox.run_code("1", timeuot=1)  # type: ignore[call-arg]


def test_connect_and_create_share_the_reach_keywords() -> None:
    reach = keywords(Client.connect)
    assert reach == {
        "use_server_proxy": False,
        "ready_timeout": None,
        "poll_interval": None,
        "health_check": True,
    }
    create = keywords(Client.create_sandbox)
    assert {name: create[name] for name in reach} == reach


def test_the_create_options_split_into_the_body_and_the_clients_own() -> None:
    options = {
        "template": "img",
        "ready_timeout": 5,
        "health_check": False,
        "use_server_proxy": True,
    }
    body, reach = split_create_options(options)
    assert body == {"template": "img"}
    assert reach == Reach(use_server_proxy=True, ready_timeout=5.0, health_check=False)
    assert reach.poll_interval == osb_sync.DEFAULT_POLL_INTERVAL
    with pytest.raises(TypeError, match="ready_timeout"):
        build_create_body({"ready_timeout": 5}, {})  # the client's own never reach the body
    assert "ready_timeout" not in build_create_body(body, {})


def test_reach_defaults_and_checks() -> None:
    assert Reach.of({"ready_timeout": None, "poll_interval": None}) == Reach()
    assert Reach().ready_timeout == osb_sync.DEFAULT_READY_TIMEOUT
    with pytest.raises(ConfigurationError, match="poll_interval"):
        Reach.of({"poll_interval": -1})
    with pytest.raises(ConfigurationError, match="ready_timeout"):
        Client(API).connect("sbx-1", ready_timeout="30")  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Reach().health_check = False  # type: ignore[misc]
