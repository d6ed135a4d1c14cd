"""Checks of a caller's arguments, each written once and named (as attrs' ``validators``).

A check takes an argument's name and value and returns the value as the client uses it, or
raises :class:`~osb_sync.ConfigurationError` saying which argument, what it must be and what it
got. The rules every check keeps:

- a number is an ``int`` or a ``float``, never a ``bool`` (``True`` is 1 to Python, not a number
  to a caller who passed it by mistake);
- a number of seconds is finite: no wait ends at NaN or infinity (NaN compares false with
  everything, so ``value <= 0`` let it through), nor past ``MAX_SECONDS`` (a socket takes at
  most ~9.2e9 s: a larger timeout broke the first request with a bare ``OverflowError``);
- a whole number is an ``int`` (``1.0`` is refused: the wire or a count wants an int).

Answers of a server or an execd are not checked here: they are hostile input, checked by
``_answers`` with an error of their own (``INVALID_RESPONSE``).
"""

from __future__ import annotations

import math
from typing import TypeGuard

from ._errors import ConfigurationError

_SHOWN = 60  # characters of a refused value a message shows
# About 31 years: past any wait a caller means, and within what Python's clocks, sockets and
# datetimes take (a socket timeout at most ~9.2e9 s; a lifetime must end before year 9999).
MAX_SECONDS = 1e9


def is_number(value: object) -> TypeGuard[float]:
    """Whether ``value`` is a finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive_seconds(name: str, value: object, fix: str = "") -> float:
    """A finite number of seconds above 0 (at most ``MAX_SECONDS``), as a float.

    Raises:
        ConfigurationError: naming ``name``; ``fix`` (what else it may be) ends the message.
    """
    if not is_number(value) or value <= 0:
        raise _refused(name, "a positive number of seconds", value, fix)
    if value > MAX_SECONDS:
        raise _refused(name, f"a positive number of seconds up to {MAX_SECONDS:g}", value, fix)
    return float(value)


def seconds(name: str, value: object) -> float:
    """A finite number of seconds from 0 to ``MAX_SECONDS``, as a float (0: do not wait).

    Raises:
        ConfigurationError: naming ``name``.
    """
    if not is_number(value) or value < 0:
        raise _refused(name, "a number of seconds >= 0", value)
    if value > MAX_SECONDS:
        raise _refused(name, f"a number of seconds up to {MAX_SECONDS:g}", value)
    return float(value)


def whole(
    name: str, value: object, low: int, high: int | None = None, *, what: str = "", fix: str = ""
) -> int:
    """An int from ``low`` to ``high`` (no upper bound when None).

    Raises:
        ConfigurationError: naming ``name`` and the range (``what`` says it otherwise).
    """
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        if not what:
            what = f"an int from {low} to {high}" if high is not None else f"an int >= {low}"
        raise _refused(name, what, value, fix)
    return value


def non_empty(name: str, value: object) -> str:
    """A str with something other than spaces in it.

    Raises:
        ConfigurationError: naming ``name``.
    """
    if not isinstance(value, str) or not value.strip():
        raise _refused(name, "a non-empty str", value)
    return value


def _refused(name: str, what: str, value: object, fix: str = "") -> ConfigurationError:
    shown = repr(value)
    if len(shown) > _SHOWN:
        shown = shown[:_SHOWN] + "..."
    return ConfigurationError(f"{name} must be {what}, got {shown}{f' ({fix})' if fix else ''}")
