"""What the client takes from an execd answer, checked before it is used.

execd is the sandbox's own process: code running as root in a sandbox can kill it and answer on
its port (on the real OpenSandbox as on the local server), so every name, size, id and number
it sends is hostile input, here as on a server. Each answer the client uses is read by one
function below, built of named checks (a check takes a value and returns it, or raises
:class:`BadAnswer` naming the field and what is wrong); ``Execd.answer`` turns a BadAnswer into
the one error for an unusable answer, ``ApiError(code="INVALID_RESPONSE")``, with the execd's
token redacted from the value it shows. The rules:

- a ``FileInfo`` (``files.info``, ``list``, ``search``): ``path`` a clean absolute path (no
  ``.``, ``..`` or empty component, no NUL, no lone surrogate) shorter than ``PATH_MAX``, and
  in a listing or a search beneath the directory asked for, when that was absolute (execd
  resolves a relative one, so only the first rule holds); ``type`` a string; ``size`` an int
  from 0 to 2**63 - 1 (the largest file size); ``mode`` execd's octal digits, at most 7777;
  ``owner``, ``group`` and the times strings. ``info`` answers only the paths asked for.
- an id that goes into later URLs (a context's ``id``, a session's ``session_id``, a command's
  ``init`` text): a non-empty string without ``/`` or control characters, not ``.`` or ``..``,
  without the execd token in it (an id is shown: in a repr, by ``osb-sync exec -d``); escaped
  where a URL is built (``in_url``), as a caller's id is.
- numbers: metrics finite and not negative, a replace count and a logs cursor ints from 0 (a
  cursor never goes back, and has 19 digits at most), a command's ``running`` a boolean.

A missing optional field keeps the default the models give it (0, None); a present one of the
wrong type is refused: it is the difference between an older execd and a lying one.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, TypeVar
from urllib.parse import quote

from ._errors import ConfigurationError, redact
from ._models import CodeContext, CommandStatus, FileInfo, Metrics

T = TypeVar("T")

MAX_FILE_SIZE = 2**63 - 1  # off_t: no file is larger
PATH_MAX = 4096  # bytes, with the NUL that ends it: no longer path names a file on Linux
_SHOWN = 120  # characters of a refused value an error shows
_MISSING = object()


class BadAnswer(Exception):
    """An answer the client cannot use: ``field`` and what is wrong with its ``value``."""

    def __init__(self, field: str, problem: str, value: Any = _MISSING):
        super().__init__(f"{field} {problem}")
        self.field = field
        self.problem = problem
        self.value = value

    def describe(self, secrets: Iterable[str] = ()) -> str:
        """``field problem (got VALUE)``, the value redacted, then cut short (cut first, a
        secret across the cut would keep all but its end)."""
        text = f"{self.field} {self.problem}"
        if self.value is _MISSING:
            return text
        shown = redact(repr(self.value), secrets)
        if len(shown) > _SHOWN:
            shown = shown[:_SHOWN] + "..."
        return f"{text} (got {shown})"


# -- named checks -------------------------------------------------------------------------------


def an_object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadAnswer(field, "is not a JSON object", value)
    return value


def a_list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadAnswer(field, "is not a JSON array", value)
    return value


def a_str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise BadAnswer(field, "is not a string", value)
    return value


def a_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise BadAnswer(field, "is not a boolean", value)
    return value


def an_int(value: Any, field: str, most: int = MAX_FILE_SIZE, least: int = 0) -> int:
    """An int from ``least`` to ``most`` (JSON's true and false are not numbers)."""
    if type(value) is not int or not least <= value <= most:
        raise BadAnswer(field, f"is not an integer from {least} to {most}", value)
    return value


def a_number(value: Any, field: str) -> float:
    """A finite number, not negative."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadAnswer(field, "is not a number", value)
    if not math.isfinite(value) or value < 0:
        raise BadAnswer(field, "is not a finite number of 0 or more", value)
    return float(value)


def a_mode(value: Any, field: str) -> int:
    """execd's mode: the octal digits written as a decimal number (644), at most 7777."""
    text = str(value) if type(value) is int and value >= 0 else ""
    if not text or len(text) > 4 or not set(text) <= set("01234567"):
        raise BadAnswer(field, "is not a file mode (octal digits up to 7777)", value)
    return int(text)


def a_clean_path(value: Any, field: str, beneath: str | None = None) -> str:
    """An absolute path with no ``.``, ``..`` or empty component; ``beneath`` a directory
    (a clean absolute path) it must be, or lie under."""
    path = a_str(value, field)
    parts = path.split("/")
    if path == "/":
        parts = [""]
    if parts[0] != "" or "\0" in path or any(p in ("", ".", "..") for p in parts[1:]):
        raise BadAnswer(field, "is not a clean absolute path", value)
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate (JSON "\ud800"): no URL or tar can carry it
        raise BadAnswer(field, "is not valid Unicode (a lone surrogate)", value) from None
    if size >= PATH_MAX:
        raise BadAnswer(field, f"is longer than a path can be ({PATH_MAX} bytes, PATH_MAX)")
    if beneath is not None and path != beneath and not path.startswith(beneath.rstrip("/") + "/"):
        raise BadAnswer(field, f"is not beneath {beneath!r}, the directory asked for", value)
    return path


def a_segment(value: Any, field: str, secrets: Iterable[str] = ()) -> str:
    """An id that can be one segment of a URL's path: no ``/``, ``.`` or ``..``, nothing
    unprintable, and none of ``secrets`` in it (an id is shown: in a repr, by the CLI)."""
    text = a_str(value, field)
    if text in ("", ".", "..") or "/" in text or not text.isprintable():
        raise BadAnswer(field, "is not an id that can stand in a URL", value)
    if redact(text, secrets) != text:
        raise BadAnswer(field, "holds a credential of this sandbox (its execd token)")
    return text


def optional(check: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    """``check``, or None for a missing or null value."""

    def maybe(value: Any, field: str) -> T | None:
        return None if value is None else check(value, field)

    return maybe


def field(data: Mapping[str, Any], name: str, check: Callable[[Any, str], T], where: str) -> T:
    """``data[name]`` checked (a missing field is None, for ``optional`` checks); ``where``
    names the object in the answer (``"entry 3"``)."""
    return check(data.get(name), f"{name!r} of {where}")


def in_url(value: str, what: str) -> str:
    """``value`` escaped as one segment of a URL's path.

    Raises:
        ConfigurationError: an empty id, ``.`` or ``..`` (escaping leaves dots as they are).
    """
    if not isinstance(value, str) or value in ("", ".", ".."):
        raise ConfigurationError(f"{what} must be a non-empty str other than '.' and '..'")
    return quote(value, safe="")


# -- the answers ------------------------------------------------------------------------------


def file_info(value: Any, where: str, beneath: str | None = None) -> FileInfo:
    """One FileInfo (``where`` names it in the answer: ``"entry 3"``)."""
    data = an_object(value, where)
    field(data, "path", lambda v, f: a_clean_path(v, f, beneath), where)
    field(data, "type", a_str, where)
    field(data, "size", optional(an_int), where)
    field(data, "mode", optional(a_mode), where)
    for name in ("owner", "group", "modified_at", "created_at"):
        field(data, name, optional(a_str), where)
    return FileInfo.from_dict(data)


def file_infos(value: Any, directory: str) -> list[FileInfo]:
    """A listing or a search of ``directory`` (as asked: its entries must lie beneath it when
    it is absolute)."""
    beneath = _absolute_directory(directory)
    entries = a_list(value, "the answer")
    return [file_info(item, f"entry {i}", beneath) for i, item in enumerate(entries)]


def file_infos_by_path(value: Any, asked: Iterable[str]) -> dict[str, FileInfo]:
    """``files.info``'s ``{path asked: FileInfo}``."""
    data = an_object(value, "the answer")
    wanted = set(asked)
    found = {}
    for key, item in data.items():
        if key not in wanted:
            raise BadAnswer("a key of the answer", "is not a path that was asked for", key)
        found[key] = file_info(item, f"the entry for {key!r}")
    return found


def code_context(
    value: Any, language: str = "", where: str = "the answer", secrets: Iterable[str] = ()
) -> CodeContext:
    """``{"id", "language"}``; ``language`` fills a missing one."""
    data = an_object(value, where)
    field(data, "id", lambda v, f: a_segment(v, f, secrets), where)
    field(data, "language", optional(a_str), where)
    return CodeContext.from_dict(data, language)


def code_contexts(value: Any, language: str = "", secrets: Iterable[str] = ()) -> list[CodeContext]:
    """The answer of ``GET /code/contexts``."""
    items = a_list(value, "the answer")
    return [code_context(item, language, f"entry {i}", secrets) for i, item in enumerate(items)]


def metrics(value: Any) -> Metrics:
    """One ``/metrics`` sample (a missing number is 0)."""
    data = an_object(value, "the answer")
    for name in ("cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib"):
        field(data, name, optional(a_number), "the answer")
    field(data, "timestamp", optional(an_int), "the answer")
    return Metrics.from_dict(data)


def command_status(value: Any, command_id: str) -> CommandStatus:
    """``GET /command/status/{id}``'s answer (a missing ``running`` is False)."""
    data = an_object(value, "the answer")
    field(data, "id", optional(a_str), "the answer")
    field(data, "running", optional(a_bool), "the answer")
    field(data, "exit_code", optional(lambda v, f: an_int(v, f, 2**31 - 1, -(2**31))), "the answer")
    for name in ("error", "content", "started_at", "finished_at"):
        field(data, name, optional(a_str), "the answer")
    return CommandStatus.from_dict({"id": command_id, **data})


def session_id(value: Any, secrets: Iterable[str] = ()) -> str:
    """``POST /session``'s ``{"session_id"}``."""
    data = an_object(value, "the answer")
    return field(data, "session_id", lambda v, f: a_segment(v, f, secrets), "the answer")


def replaced_count(value: Any, path: str) -> int:
    """``POST /files/replace?verbose=true``'s count for ``path`` (0 when it names none)."""
    data = an_object(value, "the answer") if value is not None else {}
    found = data.get(path)
    if found is None:
        return 0
    entry = an_object(found, f"the entry for {path!r}")
    return field(entry, "replacedCount", optional(an_int), f"the entry for {path!r}") or 0


def logs_cursor(header: str | None, sent: int | None, received: int) -> int:
    """The next cursor of ``GET /command/{id}/logs``: its header, which never goes back; without
    one, the cursor sent plus the bytes received."""
    start = sent or 0
    if header is None:
        return start + received
    name = "the EXECD-COMMANDS-TAIL-CURSOR header"
    # At most 19 digits (an int64): int() refuses 4300 digits with a ValueError of its own.
    if not (header.isascii() and header.isdigit()) or len(header) > 19:
        raise BadAnswer(name, "is not a byte offset", header)
    cursor = int(header)
    if cursor < start:
        raise BadAnswer(name, f"goes back before the cursor sent ({start})", header)
    return cursor


def _absolute_directory(directory: str) -> str | None:
    """The directory entries must lie beneath: ``directory`` made clean, when it is absolute."""
    if not directory.startswith("/"):
        return None
    parts: list[str] = []
    for part in directory.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/" + "/".join(parts)
