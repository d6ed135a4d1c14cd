"""The CLI by idea: each verb's handler takes the global options and its own, typed; none sees
argparse's namespace or asks which verb called it."""

from __future__ import annotations

import ast
import importlib
import typing
from pathlib import Path

import pytest

from osb_sync._cli import build_parser
from osb_sync._cli_options import (
    VERBS,
    ExecOptions,
    GlobalOptions,
    NewSandboxOptions,
    ServeOptions,
    UsageError,
)

PACKAGE = Path(__file__).resolve().parents[2] / "osb_sync"
# One command line per verb, parsed as the user would type it.
COMMAND_LINES = {
    "run": ["run", "print(1)", "--timeout", "2"],
    "serve": ["serve", "--port", "0"],
    "create": ["create", "--metadata", "a=b", "--env", "X=1"],
    "list": ["ls", "--state", "running"],
    "get": ["get", "a", "b"],
    "inspect": ["inspect", "a"],
    "delete": ["rm", "--all"],
    "pause": ["pause", "a"],
    "resume": ["resume", "a"],
    "renew": ["renew", "a", "--lifetime", "60"],
    "stats": ["stats", "a"],
    "exec": ["exec", "-e", "A=1", "-w", "/tmp", "sb", "echo", "hi"],
    "logs": ["logs", "sb", "-f"],
    "cp": ["cp", "sb:/a", "b"],
    "images": ["images", "prune"],
    "pull": ["pull", "x:1"],
    "help": ["help", "exit-codes"],
    "completion": ["completion", "bash"],
}


def test_every_verb_has_a_command_line_here() -> None:
    assert set(COMMAND_LINES) == set(VERBS)
    assert set(VERBS) <= set(build_parser().verbs)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(VERBS))
def test_each_handler_takes_the_global_options_and_its_own(name: str) -> None:
    verb = VERBS[name]
    handler = getattr(importlib.import_module(f"osb_sync.{verb.module}"), verb.handler)
    hints = typing.get_type_hints(handler)
    del hints["return"]
    assert list(hints.values()) == [GlobalOptions, verb.options], hints
    args = build_parser().parse_args(COMMAND_LINES[name])
    assert args.command == name  # an alias runs the verb it names
    options = verb.options.of(args)
    assert isinstance(options, verb.options)
    assert GlobalOptions.of(args) == GlobalOptions()


def test_key_value_flags_are_dicts_and_a_bad_one_names_its_flag() -> None:
    parser = build_parser()
    created = NewSandboxOptions.of(parser.parse_args(COMMAND_LINES["create"]))
    assert (created.metadata, created.env) == ({"a": "b"}, {"X": "1"})
    executed = ExecOptions.of(parser.parse_args(COMMAND_LINES["exec"]))
    assert (executed.env, executed.cmd, executed.output.timeout) == (
        {"A": "1"},
        ["echo", "hi"],
        None,
    )
    with pytest.raises(UsageError, match="--env takes KEY=VALUE, got 'X'"):
        ExecOptions.of(parser.parse_args(["exec", "-e", "X", "sb", "true"]))


def test_allow_is_a_deny_default_with_allow_rules_and_never_beside_allow_internet() -> None:
    parser = build_parser()
    plain = NewSandboxOptions.of(parser.parse_args(["create"]))
    assert plain.network_policy() is None  # the client's default: deny-all
    named = NewSandboxOptions.of(
        parser.parse_args(["create", "--allow", "a.test", "--allow", "*.b.test"])
    )
    assert named.network_policy() == {
        "defaultAction": "deny",
        "egress": [
            {"action": "allow", "target": "a.test"},
            {"action": "allow", "target": "*.b.test"},
        ],
    }
    with pytest.raises(UsageError, match=r"--allow .* --allow-internet .* give one of them"):
        NewSandboxOptions.of(parser.parse_args(["create", "--allow", "a.test", "--allow-internet"]))


def test_serve_gets_the_servers_keywords_but_its_key() -> None:
    serve = ServeOptions.of(build_parser().parse_args(["serve", "--port", "0"]))
    assert serve.server["port"] == 0 and serve.server["api_key"] is None
    assert serve.api_key_file is None


HANDLER_MODULES = sorted({verb.module for verb in VERBS.values()} - {"_cli"})


@pytest.mark.parametrize("module", HANDLER_MODULES)
def test_no_handler_module_sees_the_namespace_or_the_calling_verb(module: str) -> None:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert "argparse" not in names | imported and "Namespace" not in attributes
    assert "command" not in attributes  # args.command: which verb called


def test_the_api_key_stays_out_of_the_global_options_repr() -> None:
    cli = GlobalOptions.of(build_parser().parse_args(["ls", "--api-key", "sk-do-not-show-1234"]))
    assert cli.api_key == "sk-do-not-show-1234"  # still given to the client
    assert "sk-do-not-show-1234" not in repr(cli) and "sk-do-not-show" not in str(cli)
