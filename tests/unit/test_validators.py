"""The named checks of a caller's arguments (``_validators``), and their use at every entry
point that takes a number: a bool, NaN or infinity is refused there, naming the argument."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest

from osb_sync import ConfigurationError, PoolCapacity, RedisStore
from osb_sync._command_stream import command_body, timeout_ms
from osb_sync._config import ClientSettings, check_run_arguments
from osb_sync._models import mode_to_wire
from osb_sync._options import Reach, build_create_body
from osb_sync._pool import checked_pool_arguments
from osb_sync._pool_server import server_pool_store
from osb_sync._validators import is_number, non_empty, positive_seconds, seconds, whole

NOT_NUMBERS = [True, False, math.nan, math.inf, -math.inf, "1", None, [1]]


@pytest.mark.parametrize("value", [1, 0.5, 10**9, 1e-9])
def test_positive_seconds_takes_finite_numbers_above_zero_as_floats(value: float) -> None:
    taken = positive_seconds("t", value)
    assert taken == value and type(taken) is float


@pytest.mark.parametrize("value", [*NOT_NUMBERS, 0, -1, 0.0])
def test_positive_seconds_refuses_what_is_not_and_names_the_argument(value: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        positive_seconds("read_timeout", value, "or None")
    assert str(info.value) == (
        f"read_timeout must be a positive number of seconds, got {value!r} (or None)"
    )


@pytest.mark.parametrize("value", [10**9 + 1, 2**40, 1e300])
def test_seconds_past_any_wait_python_can_make_are_refused(value: float) -> None:
    # 2**40 s as a read timeout passed the check and then broke the first request with a bare
    # OverflowError (socket.settimeout takes at most ~9.2e9 s); a lifetime past year 9999 too.
    for check in (positive_seconds, seconds):
        with pytest.raises(ConfigurationError, match=r"^t must be .*seconds up to 1e\+09, got"):
            check("t", value)


def test_a_huge_read_timeout_is_refused_up_front_not_at_the_first_request() -> None:
    with pytest.raises(ConfigurationError, match="read_timeout"):
        ClientSettings(read_timeout=2**40)


def test_seconds_takes_zero_and_refuses_the_rest() -> None:
    assert seconds("poll_interval", 0) == 0.0
    for value in [*NOT_NUMBERS, -0.1]:
        with pytest.raises(ConfigurationError, match="poll_interval must be a number of"):
            seconds("poll_interval", value)


def test_whole_takes_ints_in_range_only() -> None:
    assert whole("n", 3, 1, 3) == 3
    assert whole("n", 10**30, 0) == 10**30
    for value in [*NOT_NUMBERS, 1.0, 0, 4]:
        with pytest.raises(ConfigurationError, match=r"n must be an int from 1 to 3, got "):
            whole("n", value, 1, 3)
    with pytest.raises(ConfigurationError, match=r"^n must be an int >= 0, got -1$"):
        whole("n", -1, 0)
    with pytest.raises(ConfigurationError, match=r"^m must be a mode, got 9 \(say 0o644\)$"):
        whole("m", 9, 0, 8, what="a mode", fix="say 0o644")


def test_non_empty_and_is_number() -> None:
    assert non_empty("id", "x") == "x"
    for value in ["", "  ", None, 1]:
        with pytest.raises(ConfigurationError, match="id must be a non-empty str"):
            non_empty("id", value)
    assert [is_number(v) for v in (1, 1.5, True, math.nan, math.inf, "1")] == [
        True, True, False, False, False, False
    ]  # fmt: skip


def test_a_long_value_is_cut_in_the_message() -> None:
    with pytest.raises(ConfigurationError) as info:
        positive_seconds("t", "x" * 500)
    assert len(str(info.value)) < 150 and str(info.value).endswith("...")


# Every entry point that takes a number, and the argument its message must name. Each of these
# took True (and NaN passed every `value <= 0`) before the checks were named and shared.
ENTRY_POINTS: list[tuple[str, Callable[[Any], object]]] = [
    ("connect_timeout", lambda v: ClientSettings(connect_timeout=v)),
    ("read_timeout", lambda v: ClientSettings(read_timeout=v)),
    ("call_timeout", lambda v: ClientSettings(call_timeout=v)),
    ("create_timeout", lambda v: ClientSettings(create_timeout=v)),
    ("pool_maxsize", lambda v: ClientSettings(pool_maxsize=v)),
    ("max_retries", lambda v: ClientSettings(max_retries=v)),
    ("timeout", lambda v: check_run_arguments("1", "python", 100, v)),
    ("max_output_bytes", lambda v: check_run_arguments("1", "python", v, None)),
    ("timeout", timeout_ms),
    ("uid", lambda v: command_body("true", None, None, None, uid=v)),
    ("gid", lambda v: command_body("true", None, None, None, uid=0, gid=v)),
    ("ready_timeout", lambda v: Reach(ready_timeout=v)),
    ("poll_interval", lambda v: Reach(poll_interval=v)),
    ("the sandbox lifetime", lambda v: build_create_body({"timeout": v}, {})),
    ("size", lambda v: checked_pool_arguments(v, None, "never", "p")),
    ("max_size", lambda v: checked_pool_arguments(1, v, "never", "p")),
    ("max_size", lambda v: server_pool_store("p", None, "never", v, {})),
    ("leader_lease", lambda v: RedisStore(url="redis://x", leader_lease=v)),
    ("borrow_lease", lambda v: RedisStore(url="redis://x", borrow_lease=v)),
    ("redis_timeout", lambda v: RedisStore(url="redis://x", redis_timeout=v)),
    ("pool_min", lambda v: PoolCapacity(pool_min=v)),
    ("a file mode", mode_to_wire),
]


@pytest.mark.parametrize(("name", "call"), ENTRY_POINTS, ids=[n for n, _ in ENTRY_POINTS])
@pytest.mark.parametrize("value", [True, math.nan, "3"], ids=["bool", "nan", "str"])
def test_every_number_argument_refuses_a_bool_nan_and_text(
    name: str, call: Callable[[Any], object], value: object
) -> None:
    if value is math.nan and name in ("pool_maxsize", "max_retries", "uid", "gid"):
        value = 1.5  # a whole number's NaN: a float
    with pytest.raises(ConfigurationError, match=name):
        call(value)
