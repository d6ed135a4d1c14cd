"""Shared pieces of the hypothesis tests (tests/unit: the stream pipeline, the unpacker).

Bounded and deterministic: derandomized (the same examples on every run), no deadline, and no
example database written into the repository. A plain ``pytest`` run tries a quarter of each
test's examples, to stay quick; the tox interpreter envs set ``OSB_PROPERTY_EXAMPLES=full``.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

# Hypothesis keeps caches even without a database: keep them out of the working tree.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "osb-sync-hypothesis")

FULL = os.environ.get("OSB_PROPERTY_EXAMPLES") == "full"


def bounded(examples: int) -> settings:
    """Settings for a property test that tries `examples` examples (a quarter, unless FULL)."""
    return settings(
        max_examples=examples if FULL else max(10, examples // 4),
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)


def event_objects(types: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    """Event objects of the given types, with text and a few arbitrary JSON fields."""
    return st.builds(
        lambda kind, text, extra: {"type": kind, "text": text, **extra},
        st.sampled_from(types),
        st.text(max_size=60),
        st.dictionaries(st.sampled_from(["timestamp", "results", "error", "x"]), json_values),
    )


def decoded(events: list[Any]) -> list[tuple[str, str | None, int | None, str]]:
    """Everything an Event carries, comparable (``data`` as canonical JSON)."""
    return [(e.type, e.text, e.timestamp, json.dumps(e.data, sort_keys=True)) for e in events]


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (any order, repeats allowed: empty chunks)."""
    points = sorted(min(c, len(data)) for c in cuts)
    return [data[a:b] for a, b in itertools.pairwise([0, *points, len(data)])]
