"""Failed requests say, in one line, the URL, the cause in words and the likely fix."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from osb_sync import Client, NotFoundError, TransportError
from tests.fakeserver import FakeServer


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def plain_http() -> Iterator[int]:
    """A plain-HTTP server; its port."""
    server = HTTPServer(("127.0.0.1", 0), _Quiet)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def failure(base: str, **options: Any) -> str:
    with Client(base, "secret-key", max_retries=0, **options) as client:
        with pytest.raises(TransportError) as info:
            client.get_sandbox("sbx")
    message = str(info.value)
    assert "\n" not in message and "Max retries" not in message and "secret-key" not in message
    return message


def test_refused_names_the_url_and_says_to_start_a_server() -> None:
    port = closed_port()
    message = failure(f"http://127.0.0.1:{port}/v1")
    assert message == (
        f"GET http://127.0.0.1:{port}/v1/sandboxes/sbx failed: connection refused "
        "(is the server running? start one with: osb-sync serve)"
    )


def test_https_against_plain_http_says_use_http(plain_http: int) -> None:
    message = failure(f"https://127.0.0.1:{plain_http}/v1")
    assert message.startswith(f"GET https://127.0.0.1:{plain_http}/v1/sandboxes/sbx failed: TLS")
    assert message.endswith("(the server speaks plain HTTP: use http:// instead of https://)")


def test_dns_failure_names_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_host(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    message = failure("http://sandbox.example.invalid/v1")
    assert "cannot resolve the host name 'sandbox.example.invalid' (DNS)" in message


def test_silence_is_a_read_timeout_in_words() -> None:
    with socket.socket() as listener:  # accepts (in the backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        message = failure(f"http://127.0.0.1:{port}/v1", read_timeout=0.3)
    assert message.endswith(
        "failed: no answer within 0.3 s (read timeout: the server is slow or stuck)"
    )


def test_a_404_on_a_base_without_v1_suggests_v1() -> None:
    with FakeServer() as server, Client(server.url, max_retries=0) as client:
        with pytest.raises(NotFoundError) as info:
            client.get_sandbox("sbx")
    assert str(info.value).endswith(f"(the API base usually ends in /v1: {server.url}/v1?)")


def test_a_missing_sandbox_under_v1_gets_no_hint() -> None:
    with FakeServer() as server, Client(server.api_base, max_retries=0) as client:
        with pytest.raises(NotFoundError) as info:
            client.get_sandbox("sbx")
    assert "NOT_FOUND" in str(info.value) and "usually ends in /v1" not in str(info.value)


def test_the_url_shown_carries_no_credentials_or_query() -> None:
    port = closed_port()
    with Client(f"http://user:pa55word@127.0.0.1:{port}/v1", max_retries=0) as client:
        with pytest.raises(TransportError) as info:
            list(client.list_sandboxes())
    assert str(info.value).startswith(f"GET http://127.0.0.1:{port}/v1/sandboxes failed:")
