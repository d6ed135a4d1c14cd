"""One-line descriptions of failed requests: the URL, the cause in words, the likely fix.

requests wraps the real cause (a refused socket, a DNS failure, a TLS alert) in two layers of
urllib3 pool errors whose text repeats the host and adds ``Max retries exceeded``; the cause is
dug out here and said plainly instead.
"""

from __future__ import annotations

import socket
import ssl
from collections import deque
from typing import Iterator
from urllib.parse import urlsplit

import requests
import urllib3

SERVE_HINT = "is the server running? start one with: osb-sync serve"
PLAIN_HTTP_HINT = "the server speaks plain HTTP: use http:// instead of https://"
V1_HINT = "the API base usually ends in /v1"


def describe(method: str, url: str, exc: BaseException, timeout: tuple[float, float]) -> str:
    """``METHOD URL failed: cause (fix)`` for an exception raised while sending a request."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]  # never the user:password of a URL
    shown = parts._replace(netloc=host, query="", fragment="").geturl()
    return f"{method} {shown} failed: {_cause(exc, url, timeout)}"


def _cause(exc: BaseException, url: str, timeout: tuple[float, float]) -> str:
    connect, read = timeout
    chain = list(_chain(exc))
    if _speaks_plain_http(chain):
        return f"TLS handshake failed ({PLAIN_HTTP_HINT})"
    if any(isinstance(e, (requests.exceptions.SSLError, ssl.SSLError)) for e in chain):
        return f"TLS error: {_innermost(chain)}"
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return f"connection refused ({SERVE_HINT})"
    if any(isinstance(e, (socket.gaierror, urllib3.exceptions.NameResolutionError)) for e in chain):
        host = urlsplit(url).hostname
        return f"cannot resolve the host name {host!r} (DNS): check the host in the URL"
    if any(isinstance(e, urllib3.exceptions.EmptyPoolError) for e in chain):
        return (
            f"every pooled connection to the host stayed in use for {connect:g} s "
            "(pool_block=True): raise pool_maxsize to the number of threads, or connect_timeout"
        )
    if isinstance(exc, requests.ConnectTimeout):
        return f"timed out connecting after {connect:g} s (is the host reachable, the port right?)"
    if isinstance(exc, requests.ReadTimeout) or any(
        isinstance(e, (socket.timeout, urllib3.exceptions.ReadTimeoutError)) for e in chain
    ):
        return f"no answer within {read:g} s (read timeout: the server is slow or stuck)"
    return f"connection broken: {_innermost(chain)}"


def is_permanent(exc: BaseException) -> bool:
    """True for a failure that a retry cannot mend: a certificate that fails verification,
    or TLS spoken to a plain-HTTP server."""
    chain = list(_chain(exc))
    if any(isinstance(e, ssl.SSLCertVerificationError) for e in chain):
        return True
    return _speaks_plain_http(chain)


def _speaks_plain_http(chain: list[BaseException]) -> bool:
    if not any(isinstance(e, (requests.exceptions.SSLError, ssl.SSLError)) for e in chain):
        return False
    text = " ".join(str(e) for e in chain)
    return "WRONG_VERSION_NUMBER" in text or "record layer failure" in text


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, the urllib3 errors it wraps, and their causes, outermost first."""
    seen: set[int] = set()
    todo: deque[BaseException] = deque([exc])
    while todo:
        current = todo.popleft()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = [getattr(current, "reason", None), *current.args]
        linked += [current.__cause__, current.__context__]
        todo.extend(item for item in linked if isinstance(item, BaseException))


def _innermost(chain: list[BaseException]) -> str:
    """The text of the deepest cause, without urllib3's ``<connection object at 0x...>:``."""
    inner = chain[-1]
    text = str(inner) or type(inner).__name__
    if ">: " in text:
        text = text.split(">: ", 1)[1]
    return f"{type(inner).__name__}: {text}" if type(inner).__name__ not in text else text
