"""``osb-sync cp``'s parts that need no sandbox: the mtimes going in (issue 49, row 1)."""

from __future__ import annotations

from typing import Any

import pytest

from osb_sync._cli_copy import TOUCH_ARGUMENT_BYTES, _set_mtimes
from osb_sync._models import CommandResult


class _Commands:
    def __init__(self, exit_code: int, stderr: str = "") -> None:
        self.runs: list[tuple[list[str], dict[str, str]]] = []
        self.result = CommandResult(exit_code=exit_code, stderr=stderr)

    def run(self, argv: list[str], env: dict[str, str]) -> CommandResult:
        self.runs.append((argv, env))
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
    assert len(sent) > 1 and all(sum(map(len, g)) < TOUCH_ARGUMENT_BYTES for g in sent)


def test_a_sandbox_without_touch_is_said_once(capsys: pytest.CaptureFixture[Any]) -> None:
    commands = _Commands(127, "bash: touch: command not found\n")
    _set_mtimes(_Sandbox(commands), [("/a", 1), ("/b", 2)])  # type: ignore[arg-type]
    assert len(commands.runs) == 1
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "osb-sync: warning: mtimes were not kept: `touch` failed in the sandbox (bash: touch:"
        " command not found); the copies have the time they were written"
    ]
