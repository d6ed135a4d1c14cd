"""The client's own session (``_own_session``: requests prepared once and handed to the
adapter's ``send``, the environment read once per origin) sends what a caller's session sends
through ``Session.request``: the same bytes, redirects, proxies and errors; ``responses`` still
works.

The caller's session in these tests is configured exactly as the client's own (``new_session``),
so any difference comes from the path, not the configuration.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import requests
import responses
from urllib3.connection import HTTPConnection, HTTPSConnection

from osb_sync import Client, TransportError
from osb_sync._own_session import ENVIRONMENT_VARIABLES, new_session
from osb_sync._transport import Transport

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
SECRET = "secret-token-1234"


class Capture(socketserver.ThreadingTCPServer):
    """Records every request's raw bytes (head and body) and answers with ``answer(raw)``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, answer: Callable[[bytes], bytes] = lambda raw: OK):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer
        self.raw: list[bytes] = []
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(socketserver.StreamRequestHandler):
    server: Capture

    def handle(self) -> None:
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline()
                if not line:
                    return
                head += line
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            raw = head + self.rfile.read(length)
            self.server.raw.append(raw)
            self.wfile.write(self.server.answer(raw))


@pytest.fixture
def capture() -> Iterator[Capture]:
    server = Capture()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc


def transports() -> dict[str, Transport]:
    """The client's own session, and a caller's session configured the same way."""
    options: dict[str, Any] = dict(
        connect_timeout=5.0, read_timeout=5.0, pool_maxsize=4, max_retries=0
    )
    return {
        "own": Transport(session=None, **options),
        "callers": Transport(session=new_session(4), **options),
    }


CALLS: list[dict[str, Any]] = [
    dict(method="GET", path="/v1/sandboxes", params={"page": 1, "metadata": "a=b&c"}),
    dict(method="POST", path="/code", json={"code": "pass", "context": {"language": "python"}},
         headers={"Accept": "text/event-stream", "X-EXECD-ACCESS-TOKEN": SECRET}, stream=True),
    dict(method="DELETE", path="/code", params={"id": "run 1"}, headers={"accept": "x/y"}),
    dict(method="POST", path="/files/upload", data=b"\x00binary\xff",
         headers={"Content-Type": "application/octet-stream"}),
    dict(method="get", path="/ping", params=[("a", "1"), ("a", "2")], data=b""),
]  # fmt: skip


def send_all(transport: Transport, base: str) -> None:
    for call in CALLS:
        call = dict(call)
        response = transport.request(call.pop("method"), base + call.pop("path"), **call)
        response.close()


def test_the_same_bytes_reach_the_wire_through_both_paths(capture: Capture) -> None:
    wire = {}
    for name, transport in transports().items():
        capture.raw.clear()
        send_all(transport, capture.url)
        wire[name] = list(capture.raw)
        transport.close()
    assert len(wire["own"]) == len(CALLS)
    assert wire["own"] == wire["callers"]
    assert b"User-Agent: osb-sync/" in wire["own"][0]
    assert b"Cookie" not in b"".join(wire["own"])


def test_the_own_session_sends_without_preparing_a_request_per_call(
    capture: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its calls are prepared here and sent by the adapter (no ``Request.prepare``, no
    ``Session.send``); a caller's session goes through both. Both go through the adapter's
    ``send``."""
    prepared: list[str] = []
    sessions: list[str] = []
    adapters: list[str] = []
    prepare = requests.PreparedRequest.prepare
    session_send = requests.Session.send
    adapter_send = requests.adapters.HTTPAdapter.send

    def counting(self: requests.PreparedRequest, *args: Any, **kwargs: Any) -> None:
        prepared.append(str(kwargs.get("url") or args[1]))
        prepare(self, *args, **kwargs)

    def counted_session(self: requests.Session, request: Any, **kwargs: Any) -> Any:
        sessions.append(request.url)
        return session_send(self, request, **kwargs)

    def counted_adapter(self: Any, request: Any, **kwargs: Any) -> Any:
        adapters.append(request.url)
        return adapter_send(self, request, **kwargs)

    monkeypatch.setattr(requests.PreparedRequest, "prepare", counting)
    monkeypatch.setattr(requests.Session, "send", counted_session)
    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", counted_adapter)
    own, callers = transports().values()
    send_all(own, capture.url)
    assert (prepared, sessions, len(adapters)) == ([], [], len(CALLS))
    send_all(callers, capture.url)
    assert (len(prepared), len(sessions), len(adapters)) == (len(CALLS),) * 2 + (2 * len(CALLS),)


def test_a_proxy_from_the_environment_is_used_alike_and_a_change_is_noticed(
    capture: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = Capture()
    wire: dict[str, list[bytes]] = {}
    try:
        for name, transport in transports().items():
            monkeypatch.delenv("HTTP_PROXY", raising=False)
            capture.raw.clear()
            proxy.raw.clear()
            transport.request("GET", capture.url + "/direct").close()
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            transport.request("GET", "http://sandbox.test:9000/ping").close()
            transport.request("GET", capture.url + "/proxied").close()
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            transport.request("GET", capture.url + "/bypassed").close()
            monkeypatch.delenv("NO_PROXY")
            wire[name] = capture.raw + proxy.raw
            assert [raw.split(b" ")[1] for raw in capture.raw] == [b"/direct", b"/bypassed"]
            assert [raw.split(b" ")[1] for raw in proxy.raw] == [
                b"http://sandbox.test:9000/ping",
                capture.url.encode() + b"/proxied",
            ]
            transport.close()
    finally:
        proxy.close()
    assert wire["own"] == wire["callers"]


def test_a_ca_bundle_from_the_environment_is_passed_as_verify(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, list[Any]] = {"own": [], "callers": []}
    for name, transport in transports().items():

        def send(self: Any, request: Any, **kwargs: Any) -> Any:
            seen[name].append((kwargs["verify"], dict(kwargs["proxies"])))  # noqa: B023
            raise requests.ConnectionError("stop here")

        with monkeypatch.context() as patch:
            patch.setattr(requests.adapters.HTTPAdapter, "send", send)
            for bundle in ("/a/bundle.pem", "/another/bundle.pem"):
                patch.setenv("REQUESTS_CA_BUNDLE", bundle)
                with pytest.raises(TransportError):
                    transport.request("GET", "https://sandbox.test/v1/sandboxes")
    assert seen["own"] == seen["callers"] == [("/a/bundle.pem", {}), ("/another/bundle.pem", {})]


def test_netrc_credentials_alike_and_read_again_when_told(
    capture: Capture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login alice password one\n")
    monkeypatch.setenv("NETRC", str(netrc))
    own, callers = transports().values()
    for transport in (own, callers):
        transport.request("GET", capture.url + "/a").close()
    assert capture.raw[0] == capture.raw[1]
    assert b"Authorization: Basic YWxpY2U6b25l\r\n" in capture.raw[0]
    netrc.write_text("machine 127.0.0.1 login alice password two\n")
    own.request("GET", capture.url + "/a").close()
    assert b"YWxpY2U6b25l" in capture.raw[-1]  # read once: the file is not stat-ed per call
    own.reload_environment()
    own.request("GET", capture.url + "/a").close()
    callers.request("GET", capture.url + "/a").close()
    assert capture.raw[-1] == capture.raw[-2]
    assert b"Authorization: Basic YWxpY2U6dHdv\r\n" in capture.raw[-1]


@pytest.mark.parametrize("path", ["own", "callers"])
def test_redirects_alike_and_secrets_never_leave_the_origin(path: str, capture: Capture) -> None:
    other = Capture()
    try:

        def answer(raw: bytes) -> bytes:
            target = {
                b"GET /same ": b"/landed",
                b"GET /away ": other.url.encode() + b"/stolen",
            }
            for start, location in target.items():
                if raw.startswith(start):
                    return b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % (
                        location
                    )
            return OK

        capture.answer = answer
        transport = transports()[path]
        headers = {"X-EXECD-ACCESS-TOKEN": SECRET}
        response = transport.request("GET", capture.url + "/same", headers=headers)
        assert response.status_code == 200
        assert capture.raw[-1].startswith(b"GET /landed HTTP/1.1\r\n")
        assert SECRET.encode() in capture.raw[-1]  # same origin: the token follows
        with pytest.raises(TransportError, match="another origin") as info:
            transport.request("GET", capture.url + "/away", headers=headers, secrets=[SECRET])
        assert other.raw == []
        assert SECRET not in str(info.value)
    finally:
        other.close()


def test_errors_alike() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    messages = []
    for transport in transports().values():
        with pytest.raises(TransportError) as info:
            transport.request("POST", f"http://127.0.0.1:{closed_port}/code", json={})
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "refused" in messages[0]


def test_responses_still_intercepts_the_own_session() -> None:
    seen = []
    for transport in transports().values():
        with responses.RequestsMock() as rsps:
            rsps.post("http://execd.test:9000/code", json={"ok": True})
            response = transport.request("POST", "http://execd.test:9000/code", json={"a": 1})
            assert response.json() == {"ok": True}
            request = rsps.calls[0].request
            seen.append((request.method, request.url, dict(request.headers), request.body))
    assert seen[0] == seen[1]


def test_the_client_reads_the_environment_again_when_told(
    capture: Capture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    netrc = tmp_path / ".netrc"  # HOME is tmp_path: found without NETRC
    with Client(capture.url + "/v1", api_key="") as client:
        client._transport.request("GET", capture.url + "/x").close()
        netrc.write_text("machine 127.0.0.1 login bob password pw\n")
        client._transport.request("GET", capture.url + "/x").close()
        client.reload_environment()
        client._transport.request("GET", capture.url + "/x").close()
    assert [b"Authorization" in raw for raw in capture.raw] == [False, False, True]


@pytest.mark.parametrize("pool_block", [False, True])
def test_every_pool_has_the_connections_that_start_the_call_bound(pool_block: bool) -> None:
    """The whole-call bound cuts a dripping answer's headers only through the own session's
    connections (a caller's are not the client's): plain, TLS, blocking pools and through a
    proxy, each keeps its kind's own behaviour."""
    adapter = new_session(2, pool_block).get_adapter("http://x")
    managers = [adapter.poolmanager, adapter.proxy_manager_for("http://127.0.0.1:3128")]
    for manager in managers:
        for scheme, kind in (("http", HTTPConnection), ("https", HTTPSConnection)):
            pool = manager.connection_from_url(f"{scheme}://127.0.0.1:9/")
            assert issubclass(pool.ConnectionCls, kind), (scheme, pool.ConnectionCls)
            assert pool.ConnectionCls.getresponse is not kind.getresponse
            assert pool.scheme == scheme
            assert pool.block == pool_block


@pytest.mark.parametrize("pool_block", [False, True])
def test_a_pickled_session_keeps_its_adapter_whole(pool_block: bool, capture: Capture) -> None:
    """requests' sessions and adapters pickle (``HTTPAdapter.__setstate__`` keeps only its
    ``__attrs__``): the own adapter's copy still remembers and closes its connections, and its
    pools still have the connections that start the call bound."""
    import pickle

    session = pickle.loads(pickle.dumps(new_session(2, pool_block)))
    adapter = session.get_adapter("http://x")
    pool = adapter.poolmanager.connection_from_url(capture.url)
    assert pool.ConnectionCls.getresponse is not HTTPConnection.getresponse
    assert pool.block == pool_block
    response = session.get(capture.url + "/x", stream=True)
    connection = response.raw.connection
    assert connection is not None and connection.sock is not None
    adapter.close()  # raised AttributeError ('_connections_lock') on the copy
    assert connection.sock is None
