"""The capacity check's count of open descriptors (issue 50): a listing of /proc/self/fd grows
with the live sandboxes, so it is redone only when it could matter."""

from __future__ import annotations

import pytest

from osb_sync.local.host import capacity
from osb_sync.local.host.errors import CapacityError

OPEN = [100]  # what `open_descriptors` answers


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each call of `open_descriptors` (it answers `OPEN[0]`)."""
    calls: list[int] = []
    OPEN[0] = 100

    def counted() -> int:
        calls.append(OPEN[0])
        return OPEN[0]

    monkeypatch.setattr(capacity, "open_descriptors", counted)
    monkeypatch.setattr(capacity, "available_memory", lambda: None)
    return calls


def test_far_from_the_limit_one_count_serves_a_second(counts: list[int]) -> None:
    check = capacity.Capacity(lambda: 5, fd_limit=100_000)
    for _ in range(10):
        with check.admit():
            pass
    assert len(counts) == 1


def test_a_count_older_than_its_ttl_is_redone(
    counts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    check = capacity.Capacity(lambda: 5, fd_limit=100_000)
    clock = [1000.0]
    monkeypatch.setattr(capacity.time, "monotonic", lambda: clock[0])
    with check.admit():
        pass
    clock[0] += capacity.COUNT_TTL + 0.1
    with check.admit():
        pass
    assert len(counts) == 2


def test_near_the_limit_every_create_counts_and_is_refused_in_time(counts: list[int]) -> None:
    """Past half the limit the estimate is not used: the exact count refuses the create that
    would cross it (as before), never later."""
    limit = 100 + capacity.FD_RESERVE + capacity.FDS_PER_CREATE + capacity.FDS_PER_SANDBOX
    check = capacity.Capacity(lambda: 5, fd_limit=limit)
    with check.admit():
        pass
    OPEN[0] = 101  # a connection more: the next create would cross the limit
    with pytest.raises(CapacityError), check.admit():
        pass
    assert counts == [100, 101]
