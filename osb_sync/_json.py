"""JSON from peers that may be hostile: nesting is bounded before the parser recurses.

The C parser recurses once per ``[`` or ``{`` and gives up with RecursionError near the
interpreter's limit. Deep enough, a garbage collection during the parse runs finalizers on an
almost full stack, and they fail (seen on CI: "Exception ignored in ... RecursionError"). So
nesting deeper than MAX_DEPTH is refused as a ValueError before ``json`` sees it.
"""

from __future__ import annotations

import itertools
import json
import operator
import re
from typing import Any

MAX_DEPTH = 200
_NOT_STRUCTURE = bytes(range(256)).translate(None, b'[]{}"')
# A string, or an unterminated one to the end, once escapes and all else but brackets are gone.
_STRING = re.compile(rb'"[^"]*"?')
_OPEN_CLOSE = bytes.maketrans(b"[]{}", b"()()")
_PASSES = 8
# Opens count 2, closes 0: the depth after i brackets is the sum so far minus i.
_STEP = bytes.maketrans(b"()", b"\x02\x00")


def check_depth(data: str | bytes) -> None:
    """Raise ValueError when ``data`` nests arrays and objects deeper than MAX_DEPTH.

    Brackets inside strings do not count. Unbalanced brackets past MAX_DEPTH are refused too
    (the parser would recurse into them before finding the end).
    """
    if isinstance(data, str):
        if data.count("[") + data.count("{") <= MAX_DEPTH:
            return
        raw = data.encode("utf-8", "surrogatepass")
    else:
        if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
            return
        raw = data
    if b"\\" in raw:  # escaped backslashes, then escaped quotes: neither ends a string
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Adjacent quotes are an empty string or two strings with nothing between: either way gone.
    structure = raw.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    brackets = _STRING.sub(b"", structure).translate(_OPEN_CLOSE)
    # A pass removes the innermost pairs, one level of nesting; what a few passes leave (a
    # hostile comb) is measured by its deepest prefix.
    passes = 0
    while brackets and passes < _PASSES:
        shorter = brackets.replace(b"()", b"")
        if len(shorter) == len(brackets):
            break
        brackets, passes = shorter, passes + 1
    if brackets and passes + _deepest(brackets) > MAX_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")


def _deepest(brackets: bytes) -> int:
    sums = itertools.accumulate(brackets.translate(_STEP))
    deepest: int = max(map(operator.sub, sums, itertools.count(1)))
    return deepest


def loads(data: str | bytes) -> Any:
    """``json.loads`` of ``data`` after ``check_depth``; ValueError for anything not JSON."""
    check_depth(data)
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
