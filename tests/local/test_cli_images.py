"""``osb-sync images``, ``images prune`` and ``pull`` on a store of their own, from a loopback
registry (issue 25, items 2 and 6). Needs skopeo and docker-registry (skipped without them,
unless OSB_REQUIRE_IMAGES=1)."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
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
    import base64

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
