"""Request shapes of the sandbox surface, with `responses`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import responses

import osb_sync
from osb_sync import ConfigurationError, Sandbox
from osb_sync._constants import CHUNK_SIZE
from tests.helpers import API, ENDPOINT, SID, TOKEN, add_endpoint, created_body, stream_body

EXECD = "http://execd.test:9000/proxy/44772"


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


@pytest.fixture
def sandbox() -> Sandbox:
    return Sandbox.from_execd(
        f"http://{ENDPOINT}", headers={"X-EXECD-ACCESS-TOKEN": TOKEN}, sandbox_id=SID
    )


@pytest.fixture
def managed(rsps: responses.RequestsMock) -> Sandbox:
    """A handle with a lifecycle API behind it (``connect`` without a health check)."""
    add_endpoint(rsps)
    return osb_sync.Client(API, "key-0123456789").connect(SID, health_check=False)


def last_json(rsps: responses.RequestsMock) -> object:
    return json.loads(rsps.calls[-1].request.body)


def test_run_command_body_and_headers(rsps: responses.RequestsMock, sandbox: Sandbox) -> None:
    rsps.post(
        f"{EXECD}/command",
        body=stream_body(
            {"type": "init", "text": "cmd-1"},
            {"type": "stdout", "text": "a"},
            {"type": "stdout", "text": "\n"},
            {"type": "stdout", "text": "b"},
            {"type": "error", "error": {"ename": "CommandExecError", "evalue": "3"}},
        ),
        content_type="text/event-stream",
    )
    result = sandbox.commands.run("x", cwd="/w", env={"A": "1"}, timeout=1.5)
    assert last_json(rsps) == {"command": "x", "cwd": "/w", "envs": {"A": "1"}, "timeout": 1500}
    request = rsps.calls[-1].request
    assert request.headers["X-EXECD-ACCESS-TOKEN"] == TOKEN
    assert "OPEN-SANDBOX-API-KEY" not in request.headers
    assert (result.id, result.stdout, result.exit_code) == ("cmd-1", "a\n\nb\n", 3)


@pytest.mark.parametrize("bad", ["", "   ", None])
def test_empty_command_is_refused(sandbox: Sandbox, bad: object) -> None:
    with pytest.raises(ConfigurationError):
        sandbox.commands.run(bad)  # type: ignore[arg-type]


def test_start_command_is_background(rsps: responses.RequestsMock, sandbox: Sandbox) -> None:
    rsps.post(
        f"{EXECD}/command",
        body=stream_body({"type": "init", "text": "bg-1"}, {"type": "execution_complete"}),
        content_type="text/event-stream",
    )
    rsps.get(f"{EXECD}/command/status/bg-1", json={"id": "bg-1", "running": True})
    rsps.get(
        f"{EXECD}/command/bg-1/logs", body=b"tail", headers={"EXECD-COMMANDS-TAIL-CURSOR": "12"}
    )
    command = sandbox.commands.start("serve", cwd="/srv")
    body = json.loads(rsps.calls[0].request.body)
    assert body == {"command": "serve", "cwd": "/srv", "background": True}
    assert command.logs(8) == ("tail", 12)
    assert parse_qs(urlsplit(rsps.calls[-1].request.url).query) == {"cursor": ["8"]}


def test_start_returns_once_execd_knows_the_command(
    rsps: responses.RequestsMock, sandbox: Sandbox
) -> None:
    # Real execd sends execution_complete before it records a background command.
    rsps.post(
        f"{EXECD}/command",
        body=stream_body({"type": "init", "text": "bg-2"}, {"type": "execution_complete"}),
        content_type="text/event-stream",
    )
    status = f"{EXECD}/command/status/bg-2"
    for _ in range(2):
        rsps.get(status, status=404, json={"code": "INVALID_REQUEST_BODY", "message": "no"})
    rsps.get(status, json={"id": "bg-2", "running": True})
    assert sandbox.commands.start("serve").status().running is True
    assert [c.request.url for c in rsps.calls].count(status) == 4


def test_start_fails_clearly_when_execd_never_knows_the_command(
    rsps: responses.RequestsMock, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("osb_sync._commands.REGISTRATION_WAIT", 0.2)
    rsps.post(
        f"{EXECD}/command",
        body=stream_body({"type": "init", "text": "bg-3"}, {"type": "execution_complete"}),
        content_type="text/event-stream",
    )
    rsps.get(f"{EXECD}/command/status/bg-3", status=404, json={"code": "X", "message": "no"})
    with pytest.raises(osb_sync.SandboxTimeoutError, match="bg-3 but did not know it"):
        sandbox.commands.start("serve")
    assert sandbox.commands.started == ()


def test_start_without_an_init_event_is_an_invalid_answer_and_a_refused_start_fails(
    rsps: responses.RequestsMock, sandbox: Sandbox
) -> None:
    rsps.post(
        f"{EXECD}/command",
        body=stream_body({"type": "execution_complete"}),
        content_type="text/event-stream",
    )
    with pytest.raises(osb_sync.ApiError, match=r"init event's text .* is missing") as info:
        sandbox.commands.start("serve")
    assert info.value.code == "INVALID_RESPONSE"
    error = {"ename": "CommandExecError", "evalue": "126", "traceback": ["no such dir"]}
    rsps.replace(
        responses.POST,
        f"{EXECD}/command",
        body=stream_body({"type": "init", "text": "bg-4"}, {"type": "error", "error": error}),
        content_type="text/event-stream",
    )
    with pytest.raises(osb_sync.CommandFailed, match="did not start: 126") as failed:
        sandbox.commands.start("serve", cwd="/nope")
    assert failed.value.exit_code == 126
    assert sandbox.commands.started == ()


def test_interrupts_use_the_ids(rsps: responses.RequestsMock, sandbox: Sandbox) -> None:
    rsps.delete(f"{EXECD}/code")
    rsps.delete(f"{EXECD}/command")
    sandbox.contexts.interrupt("ctx-1")
    sandbox.commands.interrupt("cmd-2")
    queries = [parse_qs(urlsplit(c.request.url).query) for c in rsps.calls]
    assert queries == [{"id": ["ctx-1"]}, {"id": ["cmd-2"]}]


def test_run_code_in_a_context_sends_id_and_language(
    rsps: responses.RequestsMock, sandbox: Sandbox
) -> None:
    rsps.post(f"{EXECD}/code", body=b"", content_type="text/event-stream")
    sandbox.run_code("1", context=osb_sync.CodeContext(id="c1", language="bash"))
    assert last_json(rsps) == {"code": "1", "context": {"id": "c1", "language": "bash"}}
    sandbox.run_code("1", context="c2")
    assert last_json(rsps) == {"code": "1", "context": {"id": "c2", "language": "python"}}


def test_upload_is_streamed_multipart_with_a_known_length(
    rsps: responses.RequestsMock, sandbox: Sandbox
) -> None:
    rsps.post(f"{EXECD}/files/upload")
    sandbox.files.write_many([("a.txt", "hello"), ("b/c.bin", b"\x00\x01", 0o755)])
    request = rsps.calls[-1].request
    body = b"".join(request.body) if not isinstance(request.body, bytes) else request.body
    assert request.headers["Content-Length"] == str(len(body))
    assert "Transfer-Encoding" not in request.headers
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + request.headers["Content-Type"].encode() + b"\r\n\r\n" + body
    )
    parts = [(p.get_param("name", header="content-disposition"), p.get_filename(), p.get_content())
             for p in message.iter_parts()]  # fmt: skip
    assert [(name, filename) for name, filename, _ in parts] == [
        ("metadata", "metadata"), ("file", "file"), ("metadata", "metadata"), ("file", "file")
    ]  # fmt: skip
    assert json.loads(parts[0][2]) == {"path": "a.txt", "mode": 644, "owner": None, "group": None}
    assert json.loads(parts[2][2])["mode"] == 755
    assert (parts[1][2], parts[3][2]) == (b"hello", b"\x00\x01")


def test_a_small_upload_is_one_body_and_a_large_or_file_one_is_streamed(
    rsps: responses.RequestsMock, sandbox: Sandbox, tmp_path: Path
) -> None:
    rsps.post(f"{EXECD}/files/upload")
    sandbox.files.write("a.txt", b"x" * 1024)
    small = rsps.calls[-1].request
    assert isinstance(small.body, bytes) and small.body.count(b"x" * 1024) == 1
    assert small.headers["Content-Length"] == str(len(small.body))
    sandbox.files.write("big.bin", b"y" * (CHUNK_SIZE + 1))
    assert not isinstance(rsps.calls[-1].request.body, bytes)
    local = tmp_path / "f"
    local.write_bytes(b"z")
    sandbox.files.upload(local, "f")
    assert not isinstance(rsps.calls[-1].request.body, bytes)


def test_download_resumes_with_a_range(rsps: responses.RequestsMock, sandbox: Sandbox) -> None:
    rsps.get(f"{EXECD}/files/download", body=b"rest", status=206)
    assert b"".join(sandbox.files.iter_bytes("/data/f", start=100)) == b"rest"
    request = rsps.calls[-1].request
    assert request.headers["Range"] == "bytes=100-"
    assert parse_qs(urlsplit(request.url).query) == {"path": ["/data/f"]}


def test_file_calls_shapes(rsps: responses.RequestsMock, sandbox: Sandbox) -> None:
    rsps.post(f"{EXECD}/directories")
    rsps.post(f"{EXECD}/files/permissions")
    rsps.post(f"{EXECD}/files/mv")
    rsps.post(f"{EXECD}/files/replace", json={"f": {"replacedCount": 2}})
    rsps.delete(f"{EXECD}/files")
    sandbox.files.mkdir("d", mode=0o700)
    assert last_json(rsps) == {"d": {"mode": 700}}
    sandbox.files.chmod("f", 0o640, owner="u")
    assert last_json(rsps) == {"f": {"mode": 640, "owner": "u"}}
    sandbox.files.move("a", "b")
    assert last_json(rsps) == [{"src": "a", "dest": "b"}]
    assert sandbox.files.replace("f", "x", "y") == 2
    assert parse_qs(urlsplit(rsps.calls[-1].request.url).query) == {"verbose": ["true"]}
    sandbox.files.remove("a", "b")
    assert parse_qs(urlsplit(rsps.calls[-1].request.url).query) == {"path": ["a", "b"]}


def test_renew_and_patch_bodies(rsps: responses.RequestsMock, managed: Sandbox) -> None:
    sandbox = managed
    rsps.post(f"{API}/sandboxes/{SID}/renew-expiration", json={"expiresAt": "2030-01-01T00:00:00Z"})
    rsps.patch(f"{API}/sandboxes/{SID}/metadata", json={"id": SID, "metadata": {"a": "1"}})
    expiry = sandbox.renew(60)
    assert expiry is not None and expiry.year == 2030
    sent = last_json(rsps)
    assert isinstance(sent, dict) and list(sent) == ["expiresAt"]
    assert str(sent["expiresAt"]).endswith("Z") and "." not in str(sent["expiresAt"])
    assert sandbox.patch_metadata({"a": "1", "b": None}).metadata == {"a": "1"}
    assert last_json(rsps) == {"a": "1", "b": None}
    assert rsps.calls[-1].request.headers["OPEN-SANDBOX-API-KEY"] == "key-0123456789"


def test_create_body_extras() -> None:
    body = created_body(
        timeout=osb_sync.NO_TIMEOUT,
        image_auth={"username": "u", "password": "p"},
        platform={"os": "linux", "arch": "arm64"},
        volumes=[{"name": "v", "mountPath": "/m"}],
        extensions={"k": "v"},
    )
    assert body["timeout"] is None and body["image"]["auth"] == {"username": "u", "password": "p"}
    assert (body["platform"], body["volumes"], body["extensions"]) == (
        {"os": "linux", "arch": "arm64"}, [{"name": "v", "mountPath": "/m"}], {"k": "v"}
    )  # fmt: skip
    snapshot = created_body(snapshot_id="snap-1", allow_internet_access=True)
    assert "image" not in snapshot and "entrypoint" not in snapshot
    assert snapshot["snapshotId"] == "snap-1"
    with pytest.raises(ConfigurationError):
        created_body(snapshot_id="s", template="img")


def test_get_endpoint_of_another_port(rsps: responses.RequestsMock, managed: Sandbox) -> None:
    sandbox = managed
    rsps.get(
        f"{API}/sandboxes/{SID}/endpoints/8080",
        json={"endpoint": "10.0.0.5:40109/proxy/8080", "headers": {"X-Gate": "g"}},
    )
    endpoint = sandbox.get_endpoint(8080)
    assert endpoint == osb_sync.Endpoint(
        url="http://10.0.0.5:40109/proxy/8080", headers={"X-Gate": "g"}
    )
    with pytest.raises(ConfigurationError):
        sandbox.get_endpoint(70000)


def test_a_bare_execd_handle_has_no_lifecycle_api(sandbox: Sandbox) -> None:
    assert sandbox.id == SID and sandbox.execd_url == EXECD
    with pytest.raises(ConfigurationError, match=r"Sandbox\.from_execd: it has no lifecycle API"):
        sandbox.renew(60)
    with pytest.raises(ConfigurationError, match=r"http:// or https:// URL"):
        Sandbox.from_execd(ENDPOINT)
