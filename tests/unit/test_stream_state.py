"""ExecutionStream's state machine: every legal move, and that any other raises."""

from __future__ import annotations

import io
import itertools
import json

import pytest
import requests

from osb_sync import ExecutionResult, _execution
from osb_sync._execution import (
    OUTCOMES,
    TRANSITIONS,
    ExecutionStream,
    IllegalTransition,
    State,
    Trigger,
    process_event,
)

S, T = State, Trigger

# Written out again here, not derived from the table: a move added or lost must show up here.
MOVES = {
    (S.OPEN, T.END): S.ENDED,
    (S.OPEN, T.DEADLINE): S.EXPIRED,
    (S.OPEN, T.CLOSE_ELSEWHERE): S.CLOSING,
    (S.OPEN, T.STOP): S.STOPPING,
    (S.EXPIRED, T.END): S.ENDED,
    (S.EXPIRED, T.GIVE_UP): S.CUT,
    (S.EXPIRED, T.CLOSE_ELSEWHERE): S.EXPIRED,
    (S.EXPIRED, T.STOP): S.STOPPING,
    (S.CUT, T.END): S.ENDED,
    (S.CUT, T.CLOSE_ELSEWHERE): S.CUT,
    (S.CUT, T.STOP): S.STOPPING,
    (S.CLOSING, T.STOP): S.STOPPING,
    (S.STOPPING, T.NOTHING_TO_INTERRUPT): S.LEFT,
    (S.STOPPING, T.UNNAMED): S.NOT_STARTED,
    (S.STOPPING, T.STALLED): S.IN_BACKGROUND,
    (S.STOPPING, T.INTERRUPT): S.INTERRUPTING,
    (S.INTERRUPTING, T.REFUSED): S.INTERRUPT_FAILED,
    (S.INTERRUPTING, T.ACCEPTED): S.DRAINING,
    (S.INTERRUPTING, T.RUN_ENDED): S.INTERRUPTED,
    (S.DRAINING, T.RUN_ENDED): S.INTERRUPTED,
    (S.DRAINING, T.GIVE_UP): S.NOT_ENDED,
    (S.DRAINING, T.BROKE): S.END_UNSEEN,
    (S.NOT_ENDED, T.RUN_ENDED): S.NOT_ENDED,
    (S.NOT_ENDED, T.BROKE): S.NOT_ENDED,
}
TIMERS = (T.DEADLINE, T.GIVE_UP)
# A timer's trigger where it has no move of its own changes nothing.
LATE = {
    (state, trigger): state
    for state in State
    for trigger in TIMERS
    if (state, trigger) not in MOVES
}
LEGAL = {**MOVES, **LATE}
RESTING = {S.ENDED, S.LEFT, *OUTCOMES}


@pytest.mark.parametrize(("state", "trigger"), sorted(LEGAL, key=str))
def test_every_legal_move_goes_where_the_diagram_says(state: State, trigger: Trigger) -> None:
    assert process_event(state, trigger) is LEGAL[(state, trigger)]


def test_the_table_holds_exactly_the_legal_moves() -> None:
    table = {
        (state, trigger): target
        for state, moves in TRANSITIONS.items()
        for trigger, target in moves.items()
    }
    assert table == LEGAL
    assert set(TRANSITIONS) == set(State)


ILLEGAL = sorted((pair for pair in itertools.product(State, Trigger) if pair not in LEGAL), key=str)


@pytest.mark.parametrize(("state", "trigger"), ILLEGAL)
def test_every_other_move_raises(state: State, trigger: Trigger) -> None:
    with pytest.raises(IllegalTransition, match=f"{trigger.name} is not a move from {state.name}"):
        process_event(state, trigger)


def test_some_moves_a_bug_would_make_are_illegal() -> None:
    assert (S.STOPPING, T.END) in ILLEGAL  # a stream being stopped never ends normally
    assert (S.INTERRUPTED, T.STOP) in ILLEGAL  # nor is it stopped twice
    assert (S.ENDED, T.STOP) in ILLEGAL
    assert (S.CLOSING, T.END) in ILLEGAL
    assert len(ILLEGAL) > len(LEGAL)


def walk(*triggers: Trigger) -> State:
    state = S.OPEN
    for trigger in triggers:
        state = process_event(state, trigger)
    return state


@pytest.mark.parametrize(
    ("triggers", "outcome"),
    [
        ((T.STOP, T.NOTHING_TO_INTERRUPT), ""),
        ((T.STOP, T.UNNAMED), _execution.NOT_STARTED),
        ((T.STOP, T.STALLED), _execution.IN_BACKGROUND),
        ((T.STOP, T.INTERRUPT, T.REFUSED), _execution.INTERRUPT_FAILED),
        ((T.STOP, T.INTERRUPT, T.RUN_ENDED), _execution.INTERRUPTED),
        ((T.STOP, T.INTERRUPT, T.ACCEPTED, T.RUN_ENDED), _execution.INTERRUPTED),
        ((T.STOP, T.INTERRUPT, T.ACCEPTED, T.BROKE), _execution.END_UNSEEN),
        ((T.STOP, T.INTERRUPT, T.ACCEPTED, T.GIVE_UP), _execution.NOT_ENDED),
        # The drain's end after its timer gave up: still "not ended".
        ((T.STOP, T.INTERRUPT, T.ACCEPTED, T.GIVE_UP, T.RUN_ENDED), _execution.NOT_ENDED),
        # The watchdog's deadline, then its give-up, then the reader stops.
        ((T.DEADLINE, T.GIVE_UP, T.STOP, T.INTERRUPT, T.ACCEPTED, T.GIVE_UP), _execution.NOT_ENDED),
        # A late timer after the run was interrupted changes nothing.
        ((T.STOP, T.INTERRUPT, T.RUN_ENDED, T.GIVE_UP, T.DEADLINE), _execution.INTERRUPTED),
        ((T.END,), ""),
    ],
)
def test_the_outcome_follows_from_the_moves(triggers: tuple[Trigger, ...], outcome: str) -> None:
    assert OUTCOMES.get(walk(*triggers), "") == outcome


def test_every_state_is_reachable_and_every_path_comes_to_rest() -> None:
    reachable, frontier = {S.OPEN}, [S.OPEN]
    while frontier:
        for target in TRANSITIONS[frontier.pop()].values():
            if target not in reachable:
                reachable.add(target)
                frontier.append(target)
    assert reachable == set(State)
    for state in set(State) - RESTING:
        assert any(target is not state for target in TRANSITIONS[state].values()), state
    for state in RESTING:
        assert all(target is state for target in TRANSITIONS[state].values()), state


class Raw:
    """A response body with urllib3's ``shutdown()``, recording its calls."""

    def __init__(self, body: bytes):
        self._body = io.BytesIO(body)
        self.shutdowns = 0

    def read(self, amount: int = -1) -> bytes:
        return self._body.read(amount)

    def shutdown(self) -> None:
        self.shutdowns += 1

    def close(self) -> None:
        return None


def test_a_deadline_that_fires_after_the_end_changes_nothing() -> None:
    """The watchdog may fire just as a run ends: it neither interrupts nor cuts the socket.

    Once read to its end, the connection may already serve another request.
    """
    body = b"".join(
        json.dumps(event).encode() + b"\n\n"
        for event in [{"type": "init", "text": "run-1"}, {"type": "stdout", "text": "hi\n"}]
    )
    response = requests.Response()
    response.status_code, response.raw = 200, Raw(body)
    interrupts: list[str] = []
    stream: ExecutionStream[ExecutionResult] = ExecutionStream(
        response,
        max_output_bytes=1 << 20,
        timeout=60,
        interrupt=lambda run_id: interrupts.append(run_id) is None,
    )
    assert stream.result().stdout == "hi\n"
    stream._expire()  # what the watchdog calls at the deadline
    assert (interrupts, response.raw.shutdowns, stream._state) == ([], 0, S.ENDED)
