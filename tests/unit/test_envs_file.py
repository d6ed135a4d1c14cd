"""The local execd's EXECD_ENVS file (issue 45): execd 1.1.1's rules, and a hostile file."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from osb_sync.local.execd import envs_file


def test_the_rules_of_the_file() -> None:
    text = (
        "# a comment\n\nA=1\n B = ' x y '\nC='two\nlines'\n"
        'D="q\\"uote\\n\\t$HOME ${HOME}"\nE= $HOME/x $UNSET.\nbad-key=1\nnoequals\n'
        'F="unterminated\nA=2\n'
    )
    assert envs_file.parse(text, {"HOME": "/h"}) == {
        "A": "2",
        "B": " x y ",
        "C": "two\nlines",
        "D": 'q"uote\n\t/h /h',
        "E": "/h/x .",
    }


def test_read_honours_only_a_regular_file_of_an_allowed_owner(tmp_path: Path) -> None:
    me = os.getuid()
    good = tmp_path / "envs"
    good.write_text("K='v'\n")
    assert envs_file.read(str(good), {me}, {}) == {"K": "v"}
    assert envs_file.read(str(good), {me + 1}, {}) == {}  # owned by a user commands are not
    link = tmp_path / "link"
    link.symlink_to(good)
    assert envs_file.read(str(link), {me}, {}) == {}  # a final link is not followed
    assert envs_file.read(str(tmp_path / "missing"), {me}, {}) == {}
    assert envs_file.read(str(tmp_path), {me}, {}) == {}  # a directory


def test_a_fifo_does_not_block_and_a_huge_file_is_read_to_its_limit(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = threading.Event()
    threading.Thread(
        target=lambda: (envs_file.read(str(fifo), {os.getuid()}, {}), done.set()), daemon=True
    ).start()
    assert done.wait(5), "reading a fifo blocked"
    huge = tmp_path / "huge"
    huge.write_text("K='" + "x" * (envs_file.LIMIT * 2) + "'\nL='after'\n")
    assert envs_file.read(str(huge), {os.getuid()}, {}) == {}  # cut: unterminated, skipped
