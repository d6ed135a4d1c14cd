"""The local server against hostile HTTP: framing, body caps, slow clients, Host, media types."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from osb_sync.local import LocalServer
from osb_sync.local.host.recovery import LOCK_NAME
from tests.local.rawhttp import exchange, read_answer, request
from tests.local.support import CREATE_BODY, Box, local_server, wait_for

JSON = {"Content-Type": "application/json"}


def sandbox_count(server: LocalServer) -> int:
    assert server.root_dir is not None
    return len(
        [
            p
            for p in server.root_dir.iterdir()
            if p.suffix != ".run" and p.name not in (".spares", LOCK_NAME)
        ]
    )


@pytest.mark.parametrize(
    "framing",
    [
        "Content-Length: -1",
        "Content-Length: +5",
        "Content-Length: 1e3",
        "Content-Length: 99999999999999999999999",
        "Transfer-Encoding: gzip",
        "Content-Length: 5\r\nContent-Length: 6",
        "Content-Length: 5\r\nTransfer-Encoding: chunked",
    ],
)
def test_bad_framing_is_400_before_reading(local: LocalServer, framing: str) -> None:
    # The body never comes: an answer proves the server did not wait (or read) for it.
    head = f"POST /health HTTP/1.1\r\nHost: 127.0.0.1:{local.port}\r\n{framing}\r\n\r\n"
    answer = exchange(local.port, head.encode(), timeout=10)
    assert answer.status == 400 and answer.headers.get("connection") == "close"


@pytest.mark.parametrize("size_line", [b"-1", b"0x10", b"fffffffffffffffffffff", b"zz", b""])
def test_malformed_chunk_size_is_400(local: LocalServer, box: Box, size_line: bytes) -> None:
    head = request("POST", "/v1/sandboxes", local.port, {**JSON, "Transfer-Encoding": "chunked"})
    head = head.replace(b"Content-Length: 0\r\n", b"")
    answer = exchange(local.port, head + size_line + b"\r\n", timeout=10)
    assert answer.status == 400
    assert sandbox_count(local) == 1  # only the fixture's


def test_json_body_over_the_cap_is_413_before_it_is_sent(local: LocalServer) -> None:
    head = request("POST", "/v1/sandboxes", local.port, JSON).replace(
        b"Content-Length: 0", b"Content-Length: 2000000"
    )
    answer = exchange(local.port, head, timeout=10)
    assert answer.status == 413 and "1048576" in answer.json()["message"]
    assert answer.headers["connection"] == "close"  # the server does not wait for the body


def test_a_large_invalid_body_is_not_echoed(local: LocalServer, http: requests.Session) -> None:
    big = {**CREATE_BODY, "metadata": {"k": "v" * 500_000}, "timeout": "x" * 400_000}
    answer = http.post(f"{local.api_base}/sandboxes", json=big)
    assert answer.status_code == 422
    assert len(answer.content) < 4096 and "omitted" in answer.text


def slow_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    return sock


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """True if the server closes `sock` within `within` seconds while we dribble header bytes."""
    deadline = time.monotonic() + within
    sock.settimeout(0.3)
    while time.monotonic() < deadline:
        try:
            sock.sendall(b"X")
            if sock.recv(1024) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


@pytest.fixture
def quick_limits() -> Iterator[LocalServer]:
    from osb_sync.local.http.httpd import Limits

    limits = Limits(header_timeout=1.0, idle_timeout=1.0, io_timeout=5.0)
    with local_server(limits=limits, command_grace=0) as server:
        yield server


def test_headers_must_arrive_within_the_header_timeout(quick_limits: LocalServer) -> None:
    with slow_client(quick_limits.port) as sock:
        started = time.monotonic()
        assert closed_by_server(sock, within=15)
        assert time.monotonic() - started < 10


def test_an_idle_keep_alive_connection_is_closed(quick_limits: LocalServer) -> None:
    with socket.create_connection(("127.0.0.1", quick_limits.port), timeout=15) as sock:
        sock.sendall(request("GET", "/health", quick_limits.port))
        assert read_answer(sock).status == 200
        started = time.monotonic()
        assert sock.recv(1) == b""  # closed by the server, not by our 15 s timeout
        assert time.monotonic() - started < 10


SERVE_WITH_FEW_FILES = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
from osb_sync.local import LocalServer
server = LocalServer()
server.start()
print(server.port, flush=True)
server.serve_forever()
"""


def test_health_answers_while_200_slow_clients_hold_connections(tmp_path: Path) -> None:
    # 128 descriptors, as in the report: 200 slow clients used to leave none for /health.
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_WITH_FEW_FILES],
        stdout=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    slow = []
    try:
        for _ in range(200):
            slow.append(slow_client(port))
        for _ in range(3):
            answer = requests.get(f"http://127.0.0.1:{port}/health", timeout=10)
            assert answer.status_code == 200
    finally:
        for sock in slow:
            sock.close()
        proc.terminate()
        proc.wait(30)
    assert proc.returncode == 0 and os.listdir(tmp_path) == []


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:80", "127.0.0.2", ""])
def test_a_foreign_host_is_refused(local: LocalServer, host: str) -> None:
    body = request("POST", "/v1/sandboxes", local.port, JSON, b"{}")
    body = body.replace(f"Host: 127.0.0.1:{local.port}".encode(), f"Host: {host}".encode())
    answer = exchange(local.port, body)
    assert answer.status == (400 if not host else 421)
    health = request("GET", "/health", local.port).replace(
        f"127.0.0.1:{local.port}".encode(), host.encode()
    )
    assert exchange(local.port, health).status in (400, 421)
    assert sandbox_count(local) == 0


def test_a_request_without_host_is_400(local: LocalServer) -> None:
    answer = exchange(local.port, b"GET /health HTTP/1.0\r\n\r\n")
    assert answer.status == 400


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:8080", "[::1]:1", "127.0.0.1"])
def test_loopback_names_are_served(local: LocalServer, host: str) -> None:
    answer = requests.get(f"{local.base_url}/health", headers={"Host": host}, timeout=10)
    assert answer.status_code == 200


def test_allowed_host_names_the_server(http: requests.Session) -> None:
    with local_server(allowed_hosts=["sandbox.internal"]) as server:
        headers = {"Host": "sandbox.internal:9000"}
        created = http.post(f"{server.api_base}/sandboxes", json=CREATE_BODY, headers=headers)
        assert created.status_code == 202
        sandbox_id = created.json()["id"]
        endpoint = http.get(
            f"{server.api_base}/sandboxes/{sandbox_id}/endpoints/44772", headers=headers
        )
        assert endpoint.json()["endpoint"].startswith("sandbox.internal:9000/")
        other = http.get(f"{server.base_url}/health", headers={"Host": "other.internal"})
        assert other.status_code == 421


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "LOCALHOST:1", None])
def test_with_a_key_a_request_without_it_is_401_whatever_its_host(host: str | None) -> None:
    with local_server(api_key="k-" + os.urandom(8).hex(), spare_containers=0) as server:
        headers = {"Host": host} if host is not None else {}
        for method, path in (("GET", "/v1/sandboxes"), ("POST", "/sandboxes"), ("GET", "/x")):
            answer = requests.request(method, server.base_url + path, headers=headers, timeout=10)
            assert answer.status_code == 401, (method, path, answer.text)


def test_an_ipv6_address_binds_and_all_of_them_take_ipv4_too() -> None:
    with local_server(host="::1", spare_containers=0) as server:  # loopback: no key needed
        assert server.base_url == f"http://[::1]:{server.port}"
        assert requests.get(f"{server.api_base}/sandboxes", timeout=10).status_code == 200
    key = {"OPEN-SANDBOX-API-KEY": "k-" + os.urandom(8).hex()}
    with local_server(host="::", api_key=key["OPEN-SANDBOX-API-KEY"], spare_containers=0) as server:
        for base in (f"http://[::1]:{server.port}", f"http://127.0.0.1:{server.port}"):
            assert requests.get(f"{base}/v1/sandboxes", timeout=10).status_code == 401
            answer = requests.get(f"{base}/v1/sandboxes", headers=key, timeout=10)
            assert answer.status_code == 200, base


# Run in a mount namespace whose /etc/hosts says `localhost` is every address.
BY_NAME = """
from osb_sync.local import LocalServer
try:
    server = LocalServer(host="localhost", spare_containers=0, isolation=False).start()
except ValueError as exc:
    print("refused:", exc)
else:
    print("served on", server._httpd.server_address)
    server.stop()
"""


def test_a_name_is_judged_by_the_address_it_bound(tmp_path: Path) -> None:
    """`localhost` is a name like any other: where it names every address, a server bound by
    it without a key refuses to serve, as one given 0.0.0.0 does."""
    if os.geteuid() != 0:
        pytest.skip("a mount namespace of the test's own needs root")
    hosts = tmp_path / "hosts"
    hosts.write_text("0.0.0.0 localhost\n")
    bind = 'mount --bind "$0" /etc/hosts && exec "$@"'
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", bind, str(hosts)]
    done = subprocess.run(
        [*argv, sys.executable, "-c", BY_NAME], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.startswith("refused:"), (done.stdout, done.stderr[-2000:])
    assert "'0.0.0.0'" in done.stdout and "OPEN_SANDBOX_API_KEY" in done.stdout


@pytest.mark.parametrize("media_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_json_bodies_need_the_json_media_type(
    local: LocalServer, http: requests.Session, media_type: str | None
) -> None:
    headers = {"Content-Type": media_type} if media_type else {}
    raw = json.dumps(CREATE_BODY).encode()
    answer = http.post(f"{local.api_base}/sandboxes", data=raw, headers=headers)
    assert answer.status_code == 415
    assert sandbox_count(local) == 0


def test_body_less_routes_need_no_media_type(local: LocalServer, box: Box) -> None:
    for path in (f"/v1/sandboxes/{box.id}/pause", f"/v1/sandboxes/{box.id}/resume"):
        assert exchange(local.port, request("POST", path, local.port)).status == 202
    session = box.call("POST", "/session")  # no body, no Content-Type
    assert session.status_code == 200 and session.json()["session_id"]
    created = box.call("POST", "/session", data=b"{}", headers=JSON)
    assert created.status_code == 200


@pytest.mark.parametrize("port", ["83746", "0", "65536", "9" * 5000, "-1", "\uff11\uff12"])
def test_proxy_refuses_ports_outside_1_to_65535(box: Box, port: str) -> None:
    answer = box.http.get(
        f"{box.server.base_url}/sandboxes/{box.id}/proxy/{port}/", headers=box.headers
    )
    assert answer.status_code == 400 and "65535" in answer.json()["message"]


EARLY_ANSWER = """
import socket, time
server = socket.create_server(("127.0.0.1", {port}))
conn, _ = server.accept()
head = b""
while b"\\r\\n\\r\\n" not in head:
    head += conn.recv(65536)
conn.sendall(b"HTTP/1.1 413 Too Large\\r\\nContent-Length: 7\\r\\n\\r\\ntoo big")
time.sleep(60)  # neither reads the body nor closes
"""


def test_an_answer_before_the_whole_body_is_relayed_at_once(box: Box) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    box.call(
        "POST",
        "/files/upload",
        files=[
            ("metadata", ("metadata", json.dumps({"path": "early.py"}), "application/json")),
            ("file", ("early.py", EARLY_ANSWER.format(port=port).encode(), "text/x-python")),
        ],
    )
    box.command("python early.py", background=True)
    endpoint = box.http.get(f"{box.server.api_base}/sandboxes/{box.id}/endpoints/{port}").json()
    host, _, rest = endpoint["endpoint"].partition("/")
    token = endpoint["headers"]["X-EXECD-ACCESS-TOKEN"]
    head = (
        f"POST /{rest}/upload HTTP/1.1\r\nHost: {host}\r\nX-EXECD-ACCESS-TOKEN: {token}\r\n"
        "Content-Length: 100000000\r\n\r\n"
    ).encode()
    address = host.split(":")

    def answer() -> bytes:
        with socket.create_connection((address[0], int(address[1])), timeout=20) as sock:
            sock.sendall(head + b"x" * 1000)  # and then waits, as a client that reads first
            return sock.recv(65536)

    assert wait_for(lambda: b"413" in answer(), timeout=30)
