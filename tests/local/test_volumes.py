"""Volumes: host binds under allowed directories, pvc directories under the volume root.

The mount tests need bubblewrap: they skip where sandboxes cannot be isolated, and fail instead
under OSB_REQUIRE_ISOLATION=1.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from osb_sync.local import LocalServer
from osb_sync.local.host import bwrap
from tests.imagekit import Entry, Image, layer_bytes, write_layout
from tests.local.support import (
    CREATE_BODY,
    Box,
    local_server,
    registry_of,
    require_isolation,
    texts,
    volume_server,
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """allowed/data/hello.txt (an allowed host tree), outside/secret.txt (not allowed)."""
    (tmp_path / "allowed" / "data").mkdir(parents=True)
    (tmp_path / "allowed" / "data" / "hello.txt").write_text("hello from the host\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret\n")
    ids = bwrap.probe().ids
    if ids is not None:  # what an operator does to let sandboxes write a host directory
        os.chown(tmp_path / "allowed" / "data", ids.uid, ids.gid)
    return tmp_path


@pytest.fixture
def server(tree: Path) -> Iterator[LocalServer]:
    """An isolated server that allows host paths under `allowed/`, pvcs under `volumes/`."""
    with volume_server(tree) as srv:
        yield srv


def create(server: LocalServer, http: requests.Session, *volumes: dict[str, Any]) -> Any:
    return http.post(f"{server.api_base}/sandboxes", json={**CREATE_BODY, "volumes": list(volumes)})


def shell(box: Box, command: str) -> str:
    events = box.command(command)
    return "\n".join(texts(events) + texts(events, "stderr"))  # one event a line


def host(path: Path, mount: str = "/mnt/data", **extra: Any) -> dict[str, Any]:
    return {"name": "data", "host": {"path": str(path)}, "mountPath": mount, **extra}


def pvc(claim: str, mount: str = "/data", **extra: Any) -> dict[str, Any]:
    return {"name": "work", "pvc": {"claimName": claim}, "mountPath": mount, **extra}


def test_host_volume_is_readable_and_writable_at_its_mount_path(
    server: LocalServer, http: requests.Session, tree: Path
) -> None:
    box = Box(server, http, {**CREATE_BODY, "volumes": [host(tree / "allowed" / "data")]})
    assert shell(box, "cat /mnt/data/hello.txt") == "hello from the host"
    assert shell(box, "echo from-sandbox > /mnt/data/new.txt && echo ok") == "ok"
    assert (tree / "allowed" / "data" / "new.txt").read_text() == "from-sandbox\n"


def test_read_only_host_volume_refuses_writes_with_erofs(
    server: LocalServer, http: requests.Session, tree: Path
) -> None:
    volume = host(tree / "allowed", readOnly=True, subPath="data")
    box = Box(server, http, {**CREATE_BODY, "volumes": [volume]})
    assert shell(box, "cat /mnt/data/hello.txt") == "hello from the host"
    said = shell(box, "python3 -c \"open('/mnt/data/x', 'w')\" 2>&1; rm /mnt/data/hello.txt")
    assert "[Errno 30] Read-only file system" in said, said
    assert "Read-only file system" in said.splitlines()[-1]
    assert (tree / "allowed" / "data" / "hello.txt").exists()
    assert not (tree / "allowed" / "data" / "x").exists()


def test_pvc_sub_path_works_and_persists_across_sandboxes(
    server: LocalServer, http: requests.Session, tree: Path
) -> None:
    first = Box(server, http, {**CREATE_BODY, "volumes": [pvc("cache", subPath="a/b")]})
    assert shell(first, "echo kept > /data/note.txt && echo ok") == "ok"
    assert http.delete(f"{server.api_base}/sandboxes/{first.id}").status_code == 204
    assert (tree / "volumes" / "cache" / "a" / "b" / "note.txt").read_text() == "kept\n"
    second = Box(server, http, {**CREATE_BODY, "volumes": [pvc("cache", "/mnt/all")]})
    assert shell(second, "cat /mnt/all/a/b/note.txt") == "kept"


def test_pvc_that_must_exist_answers_400_when_missing(
    server: LocalServer, http: requests.Session, tree: Path
) -> None:
    volume = {"name": "w", "pvc": {"claimName": "nope", "createIfNotExists": False}}
    answer = create(server, http, {**volume, "mountPath": "/data"})
    assert answer.status_code == 400
    assert answer.json()["code"] == "VOLUME::PVC_NOT_FOUND"
    assert not (tree / "volumes" / "nope").exists()


def test_unlisted_host_path_is_refused_with_400(
    server: LocalServer, http: requests.Session, tree: Path
) -> None:
    for path in (tree / "outside", tree / "allowed" / ".." / "outside", Path("/etc")):
        answer = create(server, http, host(path))
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "VOLUME::HOST_PATH_NOT_ALLOWED"
        assert "--allow-host-path" in answer.json()["message"]


def test_symlink_out_of_an_allowed_tree_is_refused(
    server: LocalServer, http: requests.Session, tree: Path
) -> None:
    os.symlink(tree / "outside", tree / "allowed" / "link")
    answer = create(server, http, host(tree / "allowed" / "link"))
    assert answer.json()["code"] == "VOLUME::HOST_PATH_NOT_ALLOWED"
    escape = create(server, http, host(tree / "allowed", subPath="link"))
    assert escape.status_code == 400
    assert escape.json()["code"] == "VOLUME::INVALID_SUB_PATH"


def test_pvc_sub_path_through_a_symlink_is_refused(
    server: LocalServer, http: requests.Session, tree: Path
) -> None:
    (tree / "volumes" / "claim").mkdir(parents=True)
    os.symlink("/etc", tree / "volumes" / "claim" / "out")
    os.symlink("/nowhere/x", tree / "volumes" / "claim" / "dangling")
    for sub in ("out", "out/ssl", "dangling"):
        answer = create(server, http, pvc("claim", subPath=sub))
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "VOLUME::INVALID_SUB_PATH"
    assert not os.path.exists("/nowhere")


@pytest.mark.parametrize(
    ("volume", "code"),
    [
        (host(Path("/etc")), "VOLUME::HOST_PATH_NOT_ALLOWED"),
        (host(Path("/nowhere/x")), "VOLUME::HOST_PATH_NOT_ALLOWED"),
        ({"name": "d", "host": {"path": "/a\0b"}, "mountPath": "/d"}, "VOLUME::INVALID_HOST_PATH"),
        (
            pvc("nope") | {"pvc": {"claimName": "nope", "createIfNotExists": False}},
            "VOLUME::PVC_NOT_FOUND",
        ),
        (pvc("c", subPath="../x"), "VOLUME::INVALID_SUB_PATH"),
    ],
)
def test_a_refused_volume_source_is_refused_before_its_image_is_pulled(
    http: requests.Session, tree: Path, volume: dict[str, Any], code: str
) -> None:
    # Planning a create checks every volume's source before it pulls the image: a request the
    # server refuses for its volume makes no download (a registry's, of up to the size limit).
    require_isolation()
    python3 = Entry("usr/bin/python3", data=b"#!/bin/sh\n", mode=0o755)
    write_layout(tree / "layouts" / "tiny", "v1", [Image([layer_bytes([python3])])])
    image = {"uri": f"oci:{tree / 'layouts' / 'tiny'}:v1"}
    with local_server(
        isolation=True,
        allowed_host_paths=[tree / "allowed"],
        volume_root=tree / "volumes",
        image_store=tree / "store",
        local_image_paths=[tree / "layouts"],
    ) as server:
        body = {**CREATE_BODY, "image": image, "volumes": [volume]}
        answer = http.post(f"{server.api_base}/sandboxes", json=body)
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == code, answer.text
        images = registry_of(server).config.images
        assert images is not None and images.store.images() == []


def test_host_volumes_need_an_allowed_directory(http: requests.Session, tree: Path) -> None:
    require_isolation()
    with local_server(min_timeout=1, isolation=True) as bare:
        answer = create(bare, http, host(tree / "allowed"))
        assert answer.status_code == 400
        assert answer.json()["code"] == "VOLUME::HOST_PATH_NOT_ALLOWED"
        assert "allows no host paths" in answer.json()["message"]
        assert "--allow-host-path DIR" in answer.json()["message"]


@pytest.mark.parametrize(
    ("volumes", "code", "says"),
    [
        ([pvc("c", "relative")], "VOLUME::INVALID_MOUNT_PATH", "absolute"),
        ([pvc("c", "/")], "VOLUME::INVALID_MOUNT_PATH", "whole container"),
        ([pvc("c", "/usr/local")], "VOLUME::INVALID_MOUNT_PATH", "/usr"),
        ([pvc("c", "/etc")], "VOLUME::INVALID_MOUNT_PATH", "/etc"),
        ([pvc("c", "/proc/x")], "VOLUME::INVALID_MOUNT_PATH", "/proc"),
        ([pvc("c", "/dev")], "VOLUME::INVALID_MOUNT_PATH", "/dev"),
        ([pvc("c", "/home")], "VOLUME::INVALID_MOUNT_PATH", "/home/sandbox"),
        ([pvc("c", "/data/../etc")], "VOLUME::INVALID_MOUNT_PATH", ".."),
        ([pvc("c"), {**pvc("d"), "name": "other"}], "VOLUME::DUPLICATE", "/data"),
        ([pvc("c"), {**pvc("d", "/data/y"), "name": "in"}], "VOLUME::INVALID_MOUNT_PATH", "inside"),
        ([pvc("c", subPath="../x")], "VOLUME::INVALID_SUB_PATH", ".."),
        ([pvc("c", subPath="/abs")], "VOLUME::INVALID_SUB_PATH", "relative"),
        (
            [{"name": "o", "ossfs": {"bucket": "b"}, "mountPath": "/o"}],
            "VOLUME::INVALID_BACKEND",
            "ossfs",
        ),
        ([{"name": "n", "mountPath": "/n"}], "VOLUME::INVALID_BACKEND", "exactly one"),
    ],
)
def test_bad_volumes_answer_400(
    server: LocalServer, http: requests.Session, volumes: list[Any], code: str, says: str
) -> None:
    answer = create(server, http, *volumes)
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == code
    assert says in answer.json()["message"]


@pytest.mark.parametrize(
    "volume",
    [
        {"name": "Bad_Name", "pvc": {"claimName": "c"}, "mountPath": "/d"},
        {"name": "d", "pvc": {"claimName": "Bad_Claim"}, "mountPath": "/d"},
        {"name": "d", "pvc": {"claimName": "c"}},
        {"name": "d", "pvc": {"claimName": "c"}, "mountPath": "/d", "readOnly": "yes"},
    ],
)
def test_malformed_volumes_answer_422(
    server: LocalServer, http: requests.Session, volume: dict[str, Any]
) -> None:
    assert create(server, http, volume).status_code == 422


def test_volumes_without_isolation_answer_400(http: requests.Session, tmp_path: Path) -> None:
    with local_server(min_timeout=1, isolation=False, volume_root=tmp_path) as plain:
        answer = create(plain, http, pvc("c"))
        assert answer.status_code == 400
        assert "volumes need isolated sandboxes" in answer.json()["message"]
        assert not (tmp_path / "c").exists()
