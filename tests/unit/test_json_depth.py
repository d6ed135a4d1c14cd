"""JSON from a peer is refused when nested past ``_json.MAX_DEPTH``, before the C parser
recurses into it: a garbage collection deep inside that parser ran finalizers on an almost full
stack (CI, Python 3.11: the fault cell ``run_code-deep_json`` failed on "Exception ignored ...
RecursionError")."""

from __future__ import annotations

import gc
import json
import random
from typing import Any, ClassVar

import pytest

from osb_sync import _json, _stream
from osb_sync._errors import _parse_error_body
from osb_sync.local.http.exchange import parse_json

LIMIT = _json.MAX_DEPTH


def reference_depth(text: str) -> int:
    """The deepest prefix of brackets outside strings, read one character at a time, up to a
    backslash outside a string (no parser reads past one)."""
    depth = deepest = 0
    inside = escaped = False
    for char in text:
        if inside:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                inside = False
        elif char == '"':
            inside = True
        elif char == "\\":
            break
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def accepted(data: str | bytes) -> bool:
    try:
        _json.check_depth(data)
    except ValueError:
        return False
    return True


def nested(depth: int, rng: random.Random) -> Any:
    """A value nested exactly ``depth`` deep, mixing arrays, objects and bracketed strings."""
    if depth == 0:
        return rng.choice(['"[{', "x\\", '\\"]', 1, None, "plain"])
    inner = nested(depth - 1, rng)
    siblings = [rng.choice(["]]", "{", '"', "\\\\", 2.5]) for _ in range(rng.randrange(3))]
    if rng.random() < 0.5:
        return [*siblings, inner]
    return {"k": inner, **{f"s{i}": sibling for i, sibling in enumerate(siblings)}}


@pytest.mark.parametrize("seed", range(40))
def test_valid_json_is_refused_exactly_past_the_limit(seed: int) -> None:
    rng = random.Random(seed)
    depth = rng.choice([LIMIT - 1, LIMIT, LIMIT + 1, rng.randrange(1, 3 * LIMIT)])
    text = json.dumps([nested(depth - 1, rng) for _ in range(rng.randrange(1, 4))])
    assert reference_depth(text) == depth
    assert accepted(text) is (depth <= LIMIT)
    assert accepted(text.encode()) is (depth <= LIMIT)


@pytest.mark.parametrize("seed", range(200))
def test_garbage_deeper_than_the_limit_is_never_accepted(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = ["[", "[", "{", "]", "}", '"', "\\", "a", ",", ":", "[[[[", "]]]]"]
    text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(100, 3000)))
    if reference_depth(text) > LIMIT:
        assert not accepted(text)
    if accepted(text):
        # Whatever passes, the parser can take without recursing near the limit.
        try:
            json.loads(text)
        except ValueError:
            pass


@pytest.mark.parametrize(
    "text",
    [
        "[" * 20_000 + "]" * 20_000,
        "[" * (LIMIT + 1),
        '{"a":' * (LIMIT + 1) + "1" + "}" * (LIMIT + 1),
        ("[" * LIMIT + "]" * LIMIT) * 50 + "[" * (LIMIT + 1),
        '["\\\\", ' + "[" * (LIMIT + 1) + "]" * (LIMIT + 1) + "]",
    ],
)
def test_deep_nesting_is_a_value_error_at_every_decoder(text: str) -> None:
    with pytest.raises(ValueError, match="nested deeper than"):
        _json.loads(text)
    with pytest.raises(ValueError, match="nested deeper than"):
        parse_json(text.encode())
    assert _stream.decode_event('{"type": "result", "results": ' + text + "}") is None


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"text": "[" * 10_000, "more": ['"{' * 5000]})
    assert _json.loads(text)["text"] == "[" * 10_000


def test_an_error_body_nested_too_deep_is_shown_as_an_excerpt() -> None:
    class Body:
        content = b"[" * 5000
        text = "[" * 5000
        headers: ClassVar[dict[str, str]] = {}

    code, message = _parse_error_body(Body())  # type: ignore[arg-type]
    assert code is None and message.startswith("[[[")


class _Finalized:
    """Garbage in a cycle whose finalizer needs a little stack, as a socket's close does."""

    outcomes: ClassVar[list[str]] = []

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        def nest(n: int) -> int:
            return 0 if n == 0 else 1 + nest(n - 1)

        try:
            nest(120)
            self.outcomes.append("ok")
        except RecursionError:
            self.outcomes.append("RecursionError")


def test_a_collection_during_a_hostile_event_leaves_finalizers_their_stack() -> None:
    """Collections are made to fall at every depth the parser reaches; each finalizer must
    still have room to run (it had none on 3.10 and 3.11 before the check)."""
    deep = '{"type": "result", "results": ' + "[" * 20_000 + "]" * 20_000 + "}"
    _Finalized.outcomes.clear()
    before = gc.get_threshold()
    try:
        for threshold in range(700, 1000, 10):
            gc.collect()
            gc.set_threshold(threshold)
            _Finalized()
            assert _stream.decode_event(deep) is None
    finally:
        gc.set_threshold(*before)
    gc.collect()
    assert _Finalized.outcomes and set(_Finalized.outcomes) == {"ok"}
