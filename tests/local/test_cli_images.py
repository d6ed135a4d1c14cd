"""``osb-sync images``, ``images prune`` and ``pull`` on a store of their own, from a loopback
registry (issue 25, items 2 and 6). Needs skopeo and docker-registry (skipped without them,
unless OSB_REQUIRE_IMAGES=1)."""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import re
import threading
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from osb_sync._cli import main
from osb_sync.local.host.images import pull, store
from tests import imagekit
from tests.imagekit import Entry, Image, LoopbackRegistry, layer_bytes, write_layout

MISSING = imagekit.missing_tools()
if MISSING and not imagekit.REQUIRE_IMAGES:
    pytest.skip(
        f"the image CLI tests need {', '.join(MISSING)} (apt-get install skopeo"
        " docker-registry); OSB_REQUIRE_IMAGES=1 makes this a failure",
        allow_module_level=True,
    )
OWN_ERROR = 125


def osb(*args: str) -> tuple[int, str, str]:
    """``osb-sync ARGS`` in this process: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            status = main(list(args))
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 1
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A small image (a few KiB, no python3, a device node) on a loopback registry."""
    work = tmp_path_factory.mktemp("cli-registry")
    registry = LoopbackRegistry(work / "registry").start()
    try:
        tiny = Image(
            [layer_bytes([Entry("etc/hello", data=b"hi\n" * 2000), Entry("dev/null", "chardev")])]
        )
        write_layout(work / "tiny", "v1", [tiny])
        yield registry.push(work / "tiny", "v1", "tiny")
    finally:
        registry.stop()


def test_pull_then_images_then_prune(tmp_path: Path, reference: str) -> None:
    where = str(tmp_path / "store")
    status, out, err = osb("pull", reference, "--image-store", where)
    assert status == 0, err
    assert out.startswith(f"{reference}@sha256:") and "no python3" in out
    assert "1 device node skipped: each sandbox gets its own /dev" in out
    assert f"{reference}: downloading" in err and f"{reference}: unpacking" in err  # plain
    assert f"{reference}: downloaded " in err and " B of " in err  # the total: its manifest
    assert "\r" not in err  # no bar off a terminal

    status, out, err = osb("images", "--image-store", where)
    assert status == 0, err
    header, row = out.splitlines()
    assert header.split() == ["REFERENCE", "DIGEST", "SIZE", "LAST", "USED"]
    assert row.startswith(reference) and "sha256:" in row and "just now" in row
    listed = json.loads(osb("images", "--image-store", where, "--json")[1])
    (image,) = listed
    assert image["size"] >= 6000 and not image["in_use"]
    assert image["skipped"] == ["dev/null"]

    # an image a sandbox holds survives prune; once let go, it goes
    opened = store.ImageStore(Path(where), pull.Puller(Path(where) / "scratch"))
    held = store.hold(opened.get(reference, pull.host_platform())[0])  # cached: no pull
    try:
        status, out, err = osb("images", "prune", "--image-store", where)
        assert (status, out) == (0, ""), err
        assert "0 images removed" in err
    finally:
        os.close(held)
    status, out, err = osb("images", "prune", "--image-store", where)
    assert status == 0 and out == f"removed {image['digest']}\n", err
    assert osb("images", "--image-store", where, "--json")[1] == "[]\n"


def test_pull_of_a_missing_tag_says_so(tmp_path: Path, reference: str) -> None:
    missing = reference.rsplit(":", 1)[0] + ":no-such-tag"
    status, out, err = osb("pull", missing, "--image-store", str(tmp_path))
    assert status == OWN_ERROR and out == ""
    assert "IMAGE_NOT_FOUND: cannot pull" in err and missing in err


def test_pull_without_skopeo_names_the_apt_get_line(
    tmp_path: Path, reference: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    status, _, err = osb("pull", reference, "--image-store", str(tmp_path / "store"))
    assert status == OWN_ERROR
    assert "IMAGE_TOOL_MISSING" in err and "apt-get install skopeo" in err


def test_pull_json(tmp_path: Path, reference: str) -> None:
    status, out, err = osb("pull", reference, "--image-store", str(tmp_path), "--json")
    assert status == 0, err
    answer: dict[str, Any] = json.loads(out)
    assert answer["reference"] == reference and answer["digest"].startswith("sha256:")
    assert answer["python"] is None and answer["skipped"] == ["dev/null"]


def test_pull_past_the_size_limit_says_which_flag_raises_it(tmp_path: Path, reference: str) -> None:
    where = tmp_path / "store"
    status, out, err = osb(
        "pull", reference, "--image-store", str(where), "--image-size-limit", "4096"
    )
    assert status == OWN_ERROR and out == ""
    assert "IMAGE_TOO_LARGE: cannot pull" in err and "limit of 4.0 KiB (4096 bytes)" in err
    assert "--image-size-limit BYTES" in err
    assert (
        os.listdir(where / "tmp") == []
        and osb("images", "--image-store", str(where), "--json")[1] == "[]\n"
    )


def test_pull_reads_the_users_docker_config_plain_entries_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 48 row 11: a registry with a password, credentials from ~/.docker/config.json."""
    registry = LoopbackRegistry(tmp_path / "registry", basic_auth=True).start()
    try:
        write_layout(tmp_path / "tiny", "v1", [Image([layer_bytes([Entry("etc/a", data=b"a")])])])
        ref = registry.push(tmp_path / "tiny", "v1", "tiny")
        for name in ("REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "DOCKER_CONFIG"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        config = tmp_path / "home" / ".docker" / "config.json"
        config.parent.mkdir(parents=True)
        store_flag = ("--image-store", str(tmp_path / "store"))

        config.write_text(json.dumps({"auths": {registry.host: {}}, "credsStore": "desktop"}))
        status, _, err = osb("pull", ref, *store_flag)  # a helper is never run
        assert status == OWN_ERROR and "IMAGE_UNAUTHORIZED" in err, err
        assert "credsStore (credential helpers) are not supported" in err

        token = base64.b64encode(f"{imagekit.USER}:{imagekit.PASSWORD}".encode()).decode()
        config.write_text(json.dumps({"auths": {registry.host: {"auth": token}}}))
        status, out, err = osb("pull", ref, *store_flag, "--debug")
        assert status == 0 and out.startswith(f"{ref}@sha256:"), err
        assert imagekit.PASSWORD not in out + err and token not in out + err
    finally:
        registry.stop()


BLOB_GET = re.compile(r"/v2/.+/blobs/(sha256:[0-9a-f]{64})")
HOP_BY_HOP = {"connection", "transfer-encoding", "content-length", "date", "server"}


def _serve(host: str, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """`handler` on HOST, a port from bind(0), in a thread."""
    server = ThreadingHTTPServer((host, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_pull_never_sends_the_credentials_where_a_blob_redirect_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 48 row 11: "never sent to another host on a redirect". The registry that holds
    the credentials (a relay in front of a basic-auth registry) answers each blob GET it has
    authorized with a 307 to another host, 127.0.0.2, as registries on object storage do;
    that host serves the blob, sees every request, and must see no credentials."""
    registry = LoopbackRegistry(tmp_path / "registry", basic_auth=True).start()
    blobs: dict[str, bytes] = {}  # what the relay redirected, by digest
    at_relay: list[str] = []  # the Authorization header of each request the relay got
    elsewhere: list[str] = []  # each request line and its headers, as the other host got them

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            elsewhere.append(f"{self.requestline}\n{self.headers}")
            data = blobs.get(self.path.split("?")[0].rpartition("/")[2], b"")
            self.send_response(200 if data else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    class Relay(BaseHTTPRequestHandler):
        def relay(self) -> None:
            at_relay.append(self.headers.get("Authorization", ""))
            upstream = http.client.HTTPConnection("127.0.0.1", registry.port, timeout=30)
            try:  # each header line as sent (skopeo sends several Accept lines)
                upstream.putrequest(self.command, self.path, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in ("host", "connection"):
                        upstream.putheader(name, value)
                upstream.endheaders()
                answer = upstream.getresponse()
                body = answer.read()
            finally:
                upstream.close()
            blob = BLOB_GET.fullmatch(self.path)
            if blob and self.command == "GET" and answer.status == 200:
                blobs[blob[1]] = body
                self.send_response(307)
                self.send_header("Location", f"http://{other}/blobs/{blob[1]}?expires=60")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            length = str(len(body)) if self.command == "GET" else answer.getheader("Content-Length")
            self.send_header("Content-Length", length or "0")
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_HEAD = relay

        def log_message(self, *args: Any) -> None:
            pass

    far = _serve("127.0.0.2", Elsewhere)  # another host, not only another port
    other = f"127.0.0.2:{far.server_address[1]}"
    near = _serve("127.0.0.1", Relay)
    host = f"127.0.0.1:{near.server_address[1]}"
    try:
        write_layout(tmp_path / "tiny", "v1", [Image([layer_bytes([Entry("etc/a", data=b"a")])])])
        ref = registry.push(tmp_path / "tiny", "v1", "tiny").replace(registry.host, host)
        for name in ("REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "DOCKER_CONFIG"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        config = tmp_path / "home" / ".docker" / "config.json"
        config.parent.mkdir(parents=True)
        token = base64.b64encode(f"{imagekit.USER}:{imagekit.PASSWORD}".encode()).decode()
        config.write_text(json.dumps({"auths": {host: {"auth": token}}}))

        status, out, err = osb("pull", ref, "--image-store", str(tmp_path / "store"))
        assert status == 0 and out.startswith(f"{ref}@sha256:"), err
        assert f"Basic {token}" in at_relay  # the credentials were in play
        assert len(blobs) >= 2 and len(elsewhere) >= len(blobs)  # config and layer, redirected
        for request in elsewhere:
            assert "authorization" not in request.lower(), request
            assert imagekit.PASSWORD not in request and token not in request, request
    finally:
        for server in (near, far):
            server.shutdown()
            server.server_close()
        registry.stop()
