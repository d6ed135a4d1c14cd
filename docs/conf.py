"""Sphinx configuration: the guides and the API reference of osb_sync (``tox -e docs``)."""

from __future__ import annotations

import sys
from pathlib import Path

from sphinx.application import Sphinx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from osb_sync import __version__  # noqa: E402 (after the path is set)

project = "osb_sync"
author = "Seed df0f2d04 maintainers"
copyright = author
version = release = __version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
# Code blocks are formatted to 100 columns (ruff's line length): the theme's 660-pixel body cut
# them off behind a scroll bar. A wider page and a slightly smaller code font show 100 columns
# whole (checked by looking at every page in headless Chromium).
html_theme_options = {"page_width": "1160px", "body_max_width": "none", "code_font_size": "0.8em"}

# One docstring dialect: a name in backticks is code, in single backticks (`x`, as
# osb_sync/local writes it) as in double (``x``, reStructuredText's literal); never italics.
default_role = "literal"
autodoc_default_options = {"members": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# deepagents-code (Python 3.11+, a large dependency tree) is the host of one integration: its
# base classes are mocked so that module's reference builds without it.
autodoc_mock_imports = ["deepagents", "deepagents_code"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# The build runs with -n: every reference must resolve. No intersphinx: CI never reaches
# beyond loopback, and fetching the Python and requests inventories would. The types below
# appear in signatures and are shown as plain text instead of links: the standard library's and
# third-party ones (no inventory to link to), and private ones (not part of the API).
nitpicky = True
nitpick_ignore_regex = [
    ("py:.*", r"(requests|urllib3|flask|django|deepagents|deepagents_code|_pytest)(\..*)?"),
]
nitpick_ignore = [
    ("py:class", name)
    for name in (
        # standard library
        "datetime",
        "datetime.datetime",
        "os.PathLike",
        "Path",
        "collections.abc.Callable",
        # the host frameworks' own, as their annotations name them
        "Flask",
        "HttpRequest",
        # private: the create keywords' TypedDict, internals a constructor takes, type variables
        "CreateOptions",
        "PoolStore",  # the store protocol (osb_sync._pool_contract): InProcessStore, RedisStore
        "osb_sync._pool_contract.PoolSpec",
        "osb_sync._pool_contract.Lender",
        "Lifecycle",
        "Execd",
        "Folder",
        "R",
        "osb_sync._execution.R",
        "osb_sync._constants.NoTimeout",
        "osb_sync.local.http.httpd.Limits",
        "Limits",
        # LocalServer.routes: the table's own types (the registry, one exchange)
        "osb_sync.local.host.registry.Registry",
        "osb_sync.local.http.exchange.Exchange",
    )
] + [("py:exc", "SandboxNotFoundError")]  # deepagents-code's, named in a Raises section

# The Django integration reads settings lazily; autodoc looks at every module attribute.
try:
    import django.conf
except ImportError:
    pass
else:
    django.conf.settings.configure()


def raises_the_errors_of(
    app: Sphinx, what: str, name: str, obj: object, options: object, lines: list[str]
) -> None:
    """Move a "Raises:" entry ``The errors of :meth:`x`.`` out of the field list.

    The package writes it after the typed entries; napoleon would read it as an exception type.
    It becomes a sentence after the section.
    """
    moved = [line.strip() for line in lines if line.strip().startswith("The errors of ")]
    if moved:
        lines[:] = [line for line in lines if not line.strip().startswith("The errors of ")]
        lines.extend(["", *(f"Raises {text[0].lower()}{text[1:]}" for text in moved)])


def setup(app: Sphinx) -> None:
    # before napoleon (priority 500) turns the sections into fields
    app.connect("autodoc-process-docstring", raises_the_errors_of, priority=400)
