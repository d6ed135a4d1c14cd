"""The docs' command-line reference (docs/cli.rst), written from osb-sync's own parser.

``python docs/cli_reference.py`` rewrites docs/cli.rst; tests/unit/test_cli_reference.py
fails when the page and the parser differ, so the page cannot drift. The page is rendered from
the parser's actions, not from argparse's help text, which each Python version wraps and words
a little differently.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.rst"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from osb_sync._cli import ALIASES, build_parser  # noqa: E402 (after the path is set)
from osb_sync._cli_output import EXIT_STATUSES, JSON_SHAPES  # noqa: E402

INTRO = """\
Command-line reference
======================

.. This page is written by docs/cli_reference.py from osb-sync's parser; do not edit it by
   hand (tests/unit/test_cli_reference.py compares the two).

``osb-sync`` runs code in sandboxes as ``docker run`` runs containers, and manages sandboxes
as ``docker`` and ``kubectl`` manage theirs: ``ls`` (also ``ps``), ``rm``, ``exec``, ``cp``,
``logs``, ``stats``. Every command has ``--help``; ``osb-sync help exit-codes`` and
``osb-sync help json`` print the two tables at the end of this page.

A sandbox is named by its id or by the start of it, as docker does: ``osb-sync exec 37ef8f4d
echo hi``. An id that exists is taken as it is; a prefix must start one id alone (a prefix of
several ids, or of none, exits 1 naming them); an empty id is refused. Sandboxes have no names:
``create --name web`` is the label ``name=web`` (``ls --metadata name=web`` finds it).
Sandboxes expire: ``create`` gives one an hour (``--lifetime``), ``renew`` pushes it back.
``run`` takes code, not a command: the image goes in ``--image`` (``osb-sync run --image
python:3.12 'print(1)'``; ``--language bash`` for a shell command). ``rm --all`` deletes every
sandbox of the server, anyone's: on a terminal it asks first, elsewhere it needs ``--yes``.

Images
------

``--image`` takes a registry reference (``python:3.12``, ``host/name:tag``,
``name@sha256:...``) or, on a local server, an image on disk: ``oci:/DIR[:TAG]`` (an OCI
layout directory; an absolute path) or ``docker-archive:/FILE`` (``docker save``'s tar), read
only under a directory the server allows (``serve --allow-image-path DIR``; ``run
--allow-image-path DIR`` for the embedded server, as ``pull`` takes it). What ``pull``
fetched, ``run`` and ``create`` use from the store. A test image needs no docker: skopeo
copies one into a layout, and umoci adds your files to it (the built-in execd needs
``python3`` in the image; ``serve --execd PATH`` runs OpenSandbox's execd in any image):

.. skip-block: reaches docker.io, needs skopeo and umoci, and writes ./img and ./files

.. code-block:: shell

    skopeo copy docker://docker.io/library/python:3.12-slim "oci:$PWD/img:py"
    mkdir -p files/app && echo 'print("hello")' > files/app/hello.py
    umoci insert --rootless --image "$PWD/img:py" files /      # /app/hello.py in the image
    osb-sync run --allow-image-path "$PWD" --image "oci:$PWD/img:py" --language bash 'python3 /app/hello.py'

A registry that needs a password: ``pull`` and ``run --image`` read the credentials docker and
podman keep (the first of ``$REGISTRY_AUTH_FILE``, ``$XDG_RUNTIME_DIR/containers/auth.json``,
``~/.config/containers/auth.json``, ``~/.docker/config.json``), its plain ``auths`` entries
only, each sent only to its registry; credential helpers (``credsStore``, ``credHelpers``) are
not run, and say so. ``--registry-auth-file FILE`` (the same form) is used instead when given,
and is the only source of ``serve``, whose server others may use.

"""


def _option_line(action: argparse.Action) -> str:
    """``-e KEY=VALUE, --env KEY=VALUE`` or ``ID`` for one argument."""
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
    elif isinstance(action.metavar, str):
        metavar = action.metavar
    else:
        metavar = action.dest.upper()
    if not action.option_strings:
        return metavar
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    return ", ".join(f"{flag} {metavar}" for flag in action.option_strings)


def _help(action: argparse.Action) -> str:
    text = " ".join((action.help or "").split())
    default = action.default
    if "%(default)s" in text:
        text = text.replace("%(default)s", str(default))
    elif not (
        "default" in text
        or default in (None, False, [], argparse.SUPPRESS)
        or not action.option_strings
    ):
        text = f"{text} (default: {default})"
    return _plain(text)


def _plain(text: str) -> str:
    """`text` as reStructuredText shows it, word for word: no markup starts in it (a
    `*.wildcard` would open emphasis; backquotes become quotes)."""
    text = text.replace("`", "'").replace("\\", "\\\\")
    return text.replace("*", "\\*").replace("|", "\\|")


def _verb(name: str, parser: argparse.ArgumentParser, aliases: list[str]) -> list[str]:
    title = f"osb-sync {name}" + (f" ({', '.join(aliases)})" if aliases else "")
    lines = [title, "-" * len(title), ""]
    lines += [_plain(" ".join((parser.description or "").split())), ""]
    own = [
        a
        for a in parser._actions
        if a.help != argparse.SUPPRESS
        and not isinstance(a, argparse._HelpAction)
        and a.dest not in ("api_base", "api_key", "json", "verbose", "debug")
    ]
    for action in own:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                summary = " ".join((child.description or child.format_usage()).split())
                lines += [f"``{sub}``", f"    {_plain(summary)}", ""]
            continue
        lines += [f"``{_option_line(action)}``", f"    {_help(action)}", ""]
    return lines


def _literal_braces(text: str) -> str:
    """Each outermost ``{...}`` of ``text`` as a literal."""
    out, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "{":
            if depth == 0:
                out.append(text[start:index])
                start = index
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                out.append(f"``{text[start : index + 1]}``")
                start = index + 1
    out.append(text[start:])
    return "".join(out)


def reference() -> str:
    """The page's text."""
    parser = build_parser()
    verbs = getattr(parser, "verbs", {})
    lines = INTRO.splitlines()
    lines += ["Global options", "--------------", ""]
    lines += ["Before or after the command's name (for ``exec``, before the sandbox id).", ""]
    for action in parser._actions:
        if action.dest in ("api_base", "api_key", "json", "verbose", "debug"):
            lines += [f"``{_option_line(action)}``", f"    {_help(action)}", ""]
    for name, child in verbs.items():
        if name in ALIASES:
            continue
        aliases = [alias for alias, verb in ALIASES.items() if verb == name]
        lines += _verb(name, child, aliases)
    lines += ["Exit statuses", "-------------", ""]
    lines += [".. skip-block: the table osb-sync help exit-codes prints, not commands", ""]
    lines += [".. code-block:: text", ""]
    lines += [f"    {line}" if line else "" for line in EXIT_STATUSES.splitlines()]
    lines += ["", "JSON output", "-----------", ""]
    lines += ["``--json`` prints one JSON document on standard output, one shape per object:", ""]
    for what, shape in JSON_SHAPES:
        lines += [f"- {what}: {_literal_braces(shape)}"]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    PAGE.write_text(reference(), encoding="utf-8")
    print(f"wrote {PAGE}")
