"""The `EXECD_ENVS` file: environment every command reads afresh (execd 1.1.1, #2013).

`commands.set_env(key, value)` appends `KEY='value'` (or `KEY="..."`) to the file whose path is
in `$EXECD_ENVS`; execd rereads it for every command. Layers, lowest first: execd's (the
sandbox's) environment < the file < the request's `envs`. The rules of execd 1.1.1's
`runtime/env.go`, as reference/opensandbox-1.1.1.md section 5 states them: blank and `#` lines
are skipped; a key is `[A-Za-z_][A-Za-z0-9_]*` (other lines are skipped); an unquoted value is
trimmed and `$NAME`-expanded from execd's environment; a single-quoted one is literal and may
span lines; a double-quoted one is unescaped (`\\\\ \\" \\n \\r \\t`) and then expanded; the last
of duplicates wins.

The file is the sandbox's: it is opened without following a final link, without blocking on a
fifo, read only if it is a regular file owned by a user the commands run as, and at most
`LIMIT` bytes of it, so no command's environment shows what the sandbox could not read.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection, Mapping

LIMIT = 1 << 20
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NAME = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t"}


def expand(value: str, environ: Mapping[str, str]) -> str:
    """`$NAME` and `${NAME}` from `environ` (an unset name: empty)."""
    return NAME.sub(lambda m: environ.get(m.group(1) or m.group(2), ""), value)


def parse(text: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of an `EXECD_ENVS` file's `text` (see the module for the rules)."""
    found: dict[str, str] = {}
    at = 0
    while at < len(text):
        end = text.find("\n", at)
        end = len(text) if end < 0 else end
        line = text[at:end].strip()
        key, sep, rest = line.partition("=")
        key = key.strip()
        if not line or line.startswith("#") or not sep or not KEY.fullmatch(key):
            at = end + 1
            continue
        start = at + text[at:end].index("=") + 1
        while start < end and text[start] in " \t":
            start += 1
        quote = text[start : start + 1]
        if quote == "'":
            close = text.find("'", start + 1)
            if close < 0:
                at = end + 1  # unterminated: skipped
                continue
            found[key] = text[start + 1 : close]
            at = _line_after(text, close + 1)
        elif quote == '"':
            value, close = _double_quoted(text, start + 1)
            if close < 0:
                at = end + 1
                continue
            found[key] = expand(value, environ)
            at = _line_after(text, close + 1)
        else:
            found[key] = expand(rest.strip(), environ)
            at = end + 1
    return found


def _line_after(text: str, at: int) -> int:
    end = text.find("\n", at)
    return len(text) if end < 0 else end + 1


def _double_quoted(text: str, at: int) -> tuple[str, int]:
    """The unescaped value of a double-quoted string from `at`, and its closing quote's index
    (-1 when it has none)."""
    out: list[str] = []
    while at < len(text):
        char = text[at]
        if char == '"':
            return "".join(out), at
        if char == "\\" and at + 1 < len(text) and text[at + 1] in ESCAPES:
            out.append(ESCAPES[text[at + 1]])
            at += 2
            continue
        out.append(char)
        at += 1
    return "", -1


def read(path: str, owners: Collection[int], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of the file at `path` ({} when it is missing, not a regular file owned by
    one of `owners`, or not readable)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in owners:
            return {}
        data = os.read(fd, LIMIT)
    except OSError:
        return {}
    finally:
        os.close(fd)
    return parse(data.decode("utf-8", "replace"), environ)
