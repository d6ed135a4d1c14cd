"""The library's log lines on the terminal, as ``osb-sync`` prints them.

Every verb but help and completion prints the ``osb_sync`` logger's warnings on stderr (with
``--debug`` everything, requests' too), one line each, as ``osb-sync: warning: ...`` in the
command line's terms (flags, not keywords), never an escape sequence. A verb that knows a line
is moot where it runs drops it for a while (:func:`dropped_log_lines`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from ._cli_output import cli_terms, printable


class _CliLogFormatter(logging.Formatter):
    """``osb-sync: warning: ...``: the program's name on every log line it prints."""

    def format(self, record: logging.LogRecord) -> str:
        return f"osb-sync: {record.levelname.lower()}: {printable(cli_terms(record.getMessage()))}"


def configure_logging(debug: bool) -> None:
    """Warnings (and with ``debug``, everything) on stderr, each line with the program name."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_CliLogFormatter())
    package = logging.getLogger("osb_sync")
    for old in _cli_handlers():
        package.removeHandler(old)  # main() called again in one process (tests)
    package.addHandler(handler)
    package.propagate = False
    package.setLevel(logging.DEBUG if debug else logging.WARNING)
    if debug:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)


def _cli_handlers() -> list[logging.Handler]:
    handlers = logging.getLogger("osb_sync").handlers
    return [h for h in handlers if isinstance(h.formatter, _CliLogFormatter)]


class _Dropping(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


@contextlib.contextmanager
def dropped_log_lines(text: str) -> Iterator[None]:
    """While the block runs, the log lines that contain ``text`` are not printed (a verb's
    own knowledge that they are moot)."""
    dropping = _Dropping(text)
    handlers = _cli_handlers()
    for handler in handlers:
        handler.addFilter(dropping)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(dropping)
