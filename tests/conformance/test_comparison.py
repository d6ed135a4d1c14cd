"""The suite's own comparison rules (no execd needed)."""

from __future__ import annotations

import pytest

from .outcome import Large, differences, lacks_trailing
from .test_conformance import ACCEPTED, SCENARIOS, accepted, only_trailing_losses


def test_differences_name_each_differing_leaf() -> None:
    real = {"a": {"stdout": "x", "results": [1]}, "b": 1, "only_real": 0}
    local = {"a": {"stdout": "x", "results": [2]}, "b": 1}
    assert differences(real, local) == {
        "a.results": ([1], [2]),
        "only_real": (0, "<absent>"),
    }


@pytest.mark.parametrize(
    ("real", "local", "lost"),
    [
        ("hi", "hi\nthere", True),
        ([{"text": "1"}], [{"text": "1"}, {"text": "2"}], True),
        (None, 3, True),
        ("<absent>", {"name": "E"}, True),
        ("there", "hi\nthere", False),  # lost at the start: not a late loss
        ([{"text": "2"}], [{"text": "1"}, {"text": "2"}], False),
        ("hi", "hi", False),
        (3, None, False),  # real has more
        ("hi!", "hi", False),
        (Large(b""), Large(b"y" * 9 + b"\n"), True),  # a large output lost whole
        (Large(b"y" * 5), Large(b"y" * 9 + b"\n"), True),
        (Large(b"z"), Large(b"y" * 9 + b"\n"), False),
        (Large(b"y"), Large(b"y"), False),
    ],
)
def test_only_late_losses_count_as_lost_events(real: object, local: object, lost: bool) -> None:
    assert lacks_trailing(real, local) is lost


def test_a_retry_needs_every_difference_to_be_a_late_loss() -> None:
    assert only_trailing_losses({"a.stdout": ("", "x\n"), "a.results": ([], [{"text": "1"}])})
    assert not only_trailing_losses({"a.stdout": ("", "x\n"), "a.error": ("E", None)})
    assert not only_trailing_losses({})


def test_every_accepted_difference_names_a_scenario_and_gives_a_reason() -> None:
    names = {scenario.name for scenario in SCENARIOS}
    assert len(names) == len(SCENARIOS)
    for pattern, reason in ACCEPTED.items():
        name, separator, path = pattern.partition(": ")
        assert separator and path and name in names, pattern
        assert len(reason) > 40, pattern
    assert accepted("exceptions", "zero.error.layout") is not None
    assert accepted("exceptions", "zero.error.name") is None
    assert accepted("simple_code", "6*7.results") is None
