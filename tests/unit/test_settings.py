"""The settings values: built and checked once, their defaults written once and quoted right."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

import osb_sync
from osb_sync import Client, ConfigurationError, Sandbox
from osb_sync._config import DEFAULT_SETTINGS, ClientSettings
from tests.helpers import API

ROOT = Path(__file__).resolve().parents[2]


def flat(path: Path) -> str:
    """A document with its line breaks and indents folded into single spaces."""
    return " ".join(path.read_text().split())


def test_the_signatures_take_their_defaults_from_the_settings() -> None:
    client = inspect.signature(Client).parameters
    for field in dataclasses.fields(ClientSettings):
        assert client[field.name].default == getattr(DEFAULT_SETTINGS, field.name)
    execd = inspect.signature(Sandbox.from_execd).parameters
    for name in ("connect_timeout", "read_timeout", "pool_maxsize"):
        assert execd[name].default == getattr(DEFAULT_SETTINGS, name)


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
        ({"create_timeout": True}, "create_timeout"),
        ({"pool_maxsize": 1.5}, "pool_maxsize"),
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
