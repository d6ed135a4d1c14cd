"""``osb-sync cp``'s parts that need no sandbox: mtimes and symlinks going in (issue 49, row 1),
each made by a command in the sandbox."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from osb_sync._cli_copy import ARGUMENT_BYTES, LINKS_SCRIPT, _make_links, _set_mtimes, _walk
from osb_sync._cli_options import Refused
from osb_sync._models import CommandResult


class _Commands:
    def __init__(self, exit_code: int, stderr: str = "") -> None:
        self.runs: list[tuple[list[str], dict[str, str]]] = []
        self.result = CommandResult(exit_code=exit_code, stderr=stderr)

    def run(self, argv: list[str], env: dict[str, str] | None = None) -> CommandResult:
        self.runs.append((argv, env or {}))
        return self.result


class _Sandbox:
    def __init__(self, commands: _Commands) -> None:
        self.commands = commands


def test_mtimes_go_in_by_touch_grouped_by_time_in_utc(capsys: pytest.CaptureFixture[str]) -> None:
    commands = _Commands(0)
    stamps = [("/a b", 1_000_000_000.7), ("-n", 1_000_000_000), ("/c", -5)]
    _set_mtimes(_Sandbox(commands), stamps)  # type: ignore[arg-type]
    assert commands.runs == [
        (["touch", "-m", "-c", "-t", "200109090146.40", "--", "/a b", "-n"], {"TZ": "UTC0"}),
        (["touch", "-m", "-c", "-t", "197001010000.00", "--", "/c"], {"TZ": "UTC0"}),
    ]
    assert capsys.readouterr().err == ""


def test_many_paths_are_split_across_touches() -> None:
    commands = _Commands(0)
    paths = [f"/tmp/{i:05d}-" + "x" * 200 for i in range(1000)]
    _set_mtimes(_Sandbox(commands), [(p, 0) for p in paths])  # type: ignore[arg-type]
    sent = [argv[6:] for argv, _ in commands.runs]
    assert [p for group in sent for p in group] == paths
    assert len(sent) > 1 and all(sum(map(len, g)) < ARGUMENT_BYTES for g in sent)


def test_a_sandbox_without_touch_is_said_once(capsys: pytest.CaptureFixture[Any]) -> None:
    commands = _Commands(127, "bash: touch: command not found\n")
    _set_mtimes(_Sandbox(commands), [("/a", 1), ("/b", 2)])  # type: ignore[arg-type]
    assert len(commands.runs) == 1
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "osb-sync: warning: mtimes were not kept: `touch` failed in the sandbox (bash: touch:"
        " command not found); the copies have the time they were written"
    ]


def test_links_go_in_as_pairs_of_arguments_never_through_a_shell_string() -> None:
    commands = _Commands(0)
    links = [("/t/a b", "x'; rm -rf /"), ("/t/-n", "-")]
    _make_links(_Sandbox(commands), links)  # type: ignore[arg-type]
    assert commands.runs == [
        (["sh", "-c", LINKS_SCRIPT, "sh", "x'; rm -rf /", "/t/a b", "-", "/t/-n"], {})
    ]


def test_a_sandbox_without_ln_is_said_once(capsys: pytest.CaptureFixture[Any]) -> None:
    commands = _Commands(127, "sh: ln: not found\n")
    _make_links(_Sandbox(commands), [("/a", "b"), ("/c", "d")])  # type: ignore[arg-type]
    assert len(commands.runs) == 1
    assert capsys.readouterr().err.splitlines() == [
        "osb-sync: warning: symlinks were not copied: `ln -s` failed in the sandbox (sh: ln:"
        " not found); 2 in all"
    ]


def test_the_links_script_makes_parents_and_takes_any_text(tmp_path: Path) -> None:
    pairs = [
        "x'; touch pwned",
        f"{tmp_path}/new/a b",
        "-",
        f"{tmp_path}/-n",
        "\n",
        f"{tmp_path}/nl",
    ]
    done = subprocess.run(["sh", "-c", LINKS_SCRIPT, "sh", *pairs], cwd=tmp_path, check=False)
    assert done.returncode == 0
    assert [os.readlink(path) for path in pairs[1::2]] == pairs[0::2]
    assert not (tmp_path / "pwned").exists()
    taken = subprocess.run(["sh", "-c", LINKS_SCRIPT, "sh", "y", pairs[1]], check=False)
    assert taken.returncode != 0  # a path taken stops it


def test_the_links_script_never_makes_a_link_inside_a_directory_in_its_place(
    tmp_path: Path,
) -> None:
    """`ln -s TEXT PATH` where PATH is a directory (or a link to one) makes PATH/TEXT's last
    component inside it and succeeds: the copy's link was then somewhere else, unsaid."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "to-dir").symlink_to(tmp_path / "elsewhere")
    for path in ("dir", "to-dir"):
        done = subprocess.run(
            ["sh", "-c", LINKS_SCRIPT, "sh", "/etc", str(tmp_path / path)],
            capture_output=True,
            check=False,
        )
        assert done.returncode != 0 and done.stderr
    assert list((tmp_path / "dir").iterdir()) == []
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_an_absurd_mtime_of_a_tar_member_is_clamped_never_a_traceback() -> None:
    """A PAX header may say any mtime ("1e20", "nan"): gmtime raised OverflowError or
    ValueError after every file was written; a year past 9999 made an argument touch
    refuses."""
    commands = _Commands(0)
    stamps = [("/far", 1e20), ("/nan", float("nan")), ("/past-9999", 253402300800.0 * 10)]
    _set_mtimes(_Sandbox(commands), stamps)  # type: ignore[arg-type]
    touch = ["touch", "-m", "-c", "-t"]
    assert commands.runs == [
        ([*touch, "999912312359.59", "--", "/far", "/past-9999"], {"TZ": "UTC0"}),
        ([*touch, "197001010000.00", "--", "/nan"], {"TZ": "UTC0"}),
    ]


def test_a_directory_the_walk_cannot_read_stops_the_copy_before_anything_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.walk leaves out a directory it cannot list (EACCES for a user, not for root: here
    os.scandir refuses it), and the copy went on without it, unsaid."""
    (tmp_path / "tree" / "locked").mkdir(parents=True)
    (tmp_path / "tree" / "locked" / "f").write_text("f")
    (tmp_path / "tree" / "g").write_text("g")
    scandir = os.scandir

    def refusing(path: Any = ".") -> Any:
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    with pytest.raises(Refused, match=r"locked.*Permission denied"):
        _walk(tmp_path / "tree")


def test_a_file_the_user_cannot_read_stops_the_copy_before_anything_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its upload failed with EACCES half way through the tree, the files before it copied
    (root reads anything: here os.access says no)."""
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "a").write_text("a")
    (tmp_path / "tree" / "secret").write_text("s")
    access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: not str(path).endswith("secret") and access(path, mode)
    )
    with pytest.raises(Refused, match="secret"):
        _walk(tmp_path / "tree")
