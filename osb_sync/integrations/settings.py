"""What the framework integrations read the same way: both spellings of a setting, the store.

The client's environment variables are spelled ``OPEN_SANDBOX_*``, the integrations' settings
``OPENSANDBOX_*``; both spellings are accepted for every setting, and giving both with
different values is an error (which one was meant cannot be guessed).
"""

from __future__ import annotations

from typing import Any, Mapping

from .._errors import ConfigurationError
from .._pool_contract import PoolStore

PREFIX, OTHER_PREFIX = "OPENSANDBOX", "OPEN_SANDBOX"
_MISSING = object()


def other_spelling(name: str) -> str:
    """``OPENSANDBOX_X`` -> ``OPEN_SANDBOX_X`` (and ``OPENSANDBOX`` -> ``OPEN_SANDBOX``)."""
    return OTHER_PREFIX + name[len(PREFIX) :]


def read(config: Mapping[str, Any], name: str, default: Any) -> Any:
    """The setting ``name`` (an ``OPENSANDBOX*`` name) in either spelling, else ``default``.

    Raises:
        ConfigurationError: both spellings are set, to different values.
    """
    value = config.get(name, _MISSING)
    other = config.get(other_spelling(name), _MISSING)
    if value is not _MISSING and other is not _MISSING and value != other:
        raise ConfigurationError(
            f"{name} and {other_spelling(name)} are both set, to different values: keep one"
        )
    if value is _MISSING:
        value = other
    return default if value is _MISSING else value


def pool_store(redis_url: object, setting: str) -> PoolStore | None:
    """A RedisStore for ``redis_url`` (the setting ``setting``), or None (this process only).

    Raises:
        ConfigurationError: not a Redis URL, or redis-py is not installed.
    """
    if redis_url is None:
        return None
    if not isinstance(redis_url, str):
        raise ConfigurationError(f"{setting} must be a Redis URL (a str)")
    from .._pool_redis import RedisStore

    try:
        return RedisStore(redis_url)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{setting}: {exc}") from exc
