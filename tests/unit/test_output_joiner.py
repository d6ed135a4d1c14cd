"""OutputJoiner (issue 45): each move of the form decision, restated by hand."""

from __future__ import annotations

import pytest

from osb_sync._command_stream import OutputJoiner


def joined(texts: list[tuple[str, str]]) -> tuple[dict[str, str], bool | None]:
    joiner = OutputJoiner()
    out = {"stdout": "", "stderr": ""}
    for channel, text in texts:
        for name, piece in joiner.feed(channel, text):
            out[name] += piece
    for name, piece in joiner.finish():
        out[name] += piece
    return out, joiner.released


OUT, ERR = "stdout", "stderr"


@pytest.mark.parametrize(
    ("texts", "stdout", "stderr", "released"),
    [
        ([(OUT, "a\n")], "a\n", "", True),  # a line break in a text: released
        ([(OUT, "50%\r")], "50%\n", "", True),  # a CR too, made June's LF
        ([(OUT, "a")], "a\n", "", False),  # undecided at the end: June's newline
        ([(OUT, "\n"), (OUT, "\n")], "\n\n", "", None),  # lone LFs mean the same in both
        ([(OUT, "a"), (OUT, "b")], "a\nb\n", "", False),  # a text after a text: June
        ([(OUT, "a"), (OUT, "\n"), (OUT, "b")], "a\n\nb\n", "", False),  # June's blank line
        ([(OUT, "a"), (OUT, "b\n")], "ab\n", "", True),  # a released line in two writes
        ([(OUT, "a"), (ERR, "e\n")], "a", "e\n", True),  # one channel decides for both
        ([(OUT, "a"), (ERR, "e")], "a\n", "e\n", False),  # each channel holds its own
        ([(OUT, "a"), (ERR, "e"), (OUT, "b")], "a\nb\n", "e\n", False),  # June: both newlines
        ([(OUT, "x\r"), (OUT, "\n"), (OUT, "y\r\n")], "x\ny\n", "", True),  # a CRLF split in two
        ([(OUT, "a"), (OUT, "b"), (OUT, "c\n")], "a\nb\nc\n", "", True),  # June seen, then a break
    ],
)
def test_moves(
    texts: list[tuple[str, str]], stdout: str, stderr: str, released: bool | None
) -> None:
    assert joined(texts) == ({"stdout": stdout, "stderr": stderr}, released)


def test_tail_says_what_finish_would_add_without_deciding() -> None:
    joiner = OutputJoiner()
    joiner.feed(OUT, "a")
    assert joiner.tail() == {"stdout": "\n"} and joiner.held == 1
    assert joiner.released is None
    assert joiner.feed(OUT, "b\n") == [(OUT, "b\n")]
    assert joiner.tail() == {} and joiner.held == 0
