"""The docs' command-line reference (docs/cli.rst) is the parser's (issue 48): written by
docs/cli_reference.py, compared here, so the page cannot drift from the command line."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType

from osb_sync._cli import ALIASES, build_parser
from osb_sync._cli_output import EXIT_STATUSES, JSON_SHAPES

ROOT = Path(__file__).resolve().parents[2]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "cli_reference", ROOT / "docs" / "cli_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_what_the_parser_writes() -> None:
    page = (ROOT / "docs" / "cli.rst").read_text(encoding="utf-8")
    assert page == generator().reference(), "run: python docs/cli_reference.py"


def test_the_page_names_every_command_option_exit_status_and_json_shape() -> None:
    page = generator().reference()
    parser = build_parser()
    for name, child in parser.verbs.items():  # type: ignore[attr-defined]
        assert f"osb-sync {ALIASES.get(name, name)}" in page and name in page, name
        for action in child._actions:
            for flag in action.option_strings:
                assert flag in page, f"{name} {flag}"
    for line in EXIT_STATUSES.splitlines():
        assert line.strip() in page
    for what, _ in JSON_SHAPES:
        assert what in page


def test_the_page_is_in_the_docs_toctree() -> None:
    index = (ROOT / "docs" / "index.rst").read_text(encoding="utf-8")
    assert "\n   cli\n" in index


def test_a_changed_option_changes_the_page() -> None:
    module = generator()
    before = module.reference()
    real = module.build_parser

    def more() -> argparse.ArgumentParser:
        parser = real()
        parser.verbs["stats"].add_argument("--new-flag", help="a flag the page lacks")  # type: ignore[attr-defined]
        return parser

    module.build_parser = more
    after = module.reference()
    assert after != before and "--new-flag" in after and "--new-flag" not in before


def test_help_text_starts_no_markup_on_the_page() -> None:
    """`--allow`'s "*.wildcard" opened emphasis that nothing closed (the docs build failed)."""
    plain = generator()._plain
    assert plain("reach *.example.org | `x` \\n") == "reach \\*.example.org \\| 'x' \\\\n"
    assert "\\*.wildcard" in generator().reference()
