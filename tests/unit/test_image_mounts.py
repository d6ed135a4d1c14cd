"""Where bwrap makes and mounts things, for an image's links and a create's volumes (issue 37,
after the attack: findings 1, 2, 3 and 12). bwrap makes every mount point and directory while
the host's root is its /oldroot, following links: a destination resolved into a place that is
no longer the image's (procfs at `/`, a volume a sandbox writes) leads it to the host. These
tests read the options `image_options` builds (no bwrap runs); the property test
tests/unit/test_mount_properties.py has the kernel resolve them as it does for bwrap.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from osb_sync.local.host import bwrap, volumes
from osb_sync.local.host.errors import VolumeError
from osb_sync.local.host.images.config import ConfigError, ImageConfig
from osb_sync.local.host.images.rootfs import image_options
from osb_sync.local.host.images.store import StoredImage
from osb_sync.local.host.server import answer

OOM = ["--ro-bind-try", "/sys/fs/cgroup/memory/x/memory.oom_control", "/run/osb-oom-control"]
EXECD = ["--ro-bind", "/srv/execd", "/opt/opensandbox/execd"]


def _root(path: Path, links: dict[str, str]) -> Path:
    """An image's root: /usr/bin/python3, /etc, /run, and `links` (name -> target)."""
    for folder in {"usr/bin", "etc", "run", "srv"} - set(links):
        (path / folder).mkdir(parents=True, exist_ok=True)
    (path / "usr/bin/python3").write_bytes(b"")
    for name, target in links.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).symlink_to(target)
    return path


def _options(root: Path, workdir: str = "/", binds: list[volumes.Bind] | None = None) -> list[str]:
    """The options of a sandbox of the image `root`, with the server's OOM counter and execd
    binary, and `binds` as the server's volumes (each a `--bind` of its own)."""
    image = StoredImage(
        "sha256:0",
        "reg.example/x",
        root.parent,
        ImageConfig(working_dir=workdir),
        "/usr/bin/python3",
        0,
    )
    mounts = [arg for b in binds or () for arg in ("--bind", f"/volumes{b.target}", b.target)]
    layer: Any = SimpleNamespace(root=root)
    return image_options(layer, image, Path("/state"), 3, mounts, [*EXECD, *OOM], binds or ())


def _bind(source: Path, target: str, name: str = "a", read_only: bool = False) -> volumes.Bind:
    source.mkdir(parents=True, exist_ok=True)
    return volumes.Bind(os.open(source, os.O_PATH | os.O_DIRECTORY), read_only, target, name)


@pytest.mark.parametrize("target", ["/", ".", "..", "/etc/.."])
@pytest.mark.parametrize("link", ["proc", "dev"])
def test_no_mount_of_the_server_lands_on_the_containers_root(
    tmp_path: Path, link: str, target: str
) -> None:
    """Finding 1: `proc -> /` had bwrap mount procfs over the image's root, and `confine` did
    not count a mount at `/`: `dev -> /self/root/oldroot/DIR/dev` then led bwrap's `--dev`
    through procfs' self/root to the host, where it made DIR/dev."""
    root = _root(tmp_path / "root", {link: target, "x": "/self/root/oldroot/tmp/decoy"})
    with pytest.raises(ConfigError, match="leads to the container's root"):
        _options(root)


def test_links_that_move_the_servers_mounts_inside_the_image_are_followed(tmp_path: Path) -> None:
    """`run -> /`: the state directory and the OOM counter at /osb-execd and /osb-oom-control
    of the image's root, which is what the container sees at /run/...: nothing leaves it."""
    options = _options(_root(tmp_path / "root", {"run": "/", "var/run": "/run"}))
    assert options[options.index("/state") + 1] == "/osb-execd"
    assert options[options.index(OOM[1]) + 1] == "/osb-oom-control"


@pytest.mark.parametrize(
    ("links", "targets", "says"),
    [
        ({"data": "/"}, ["/data"], "leads, through the image's links, to the container's root"),
        ({"data": "/run"}, ["/data"], "to '/run', above '/run/osb-execd'"),
        ({"data": "/opt/osb-sync"}, ["/data"], "above '/opt/osb-sync/lib/osb_sync', where the"),
        ({"data": "/opt/opensandbox"}, ["/data"], "above '/opt/opensandbox/execd'"),
        ({"data": "/proc/sys"}, ["/data"], "to '/proc/sys', inside '/proc', where the server"),
        ({"data": "/dev/shm"}, ["/data"], "to '/dev/shm', inside '/dev'"),
        ({"x": "/data/sub"}, ["/data", "/x/y"], "inside the mountPath of volume 'a' ('/data')"),
        ({"x": "/data"}, ["/data", "/x"], "at the mountPath of volume 'a' ('/data')"),
        ({"x": "/data/y"}, ["/x/z", "/data"], "above the mountPath of volume 'a'"),
        ({"data": "/usr/lib"}, ["/data"], "which would cover /usr"),
    ],
)
def test_a_volume_lands_nowhere_the_server_or_another_volume_mounts(
    tmp_path: Path, links: dict[str, str], targets: list[str], says: str
) -> None:
    """Findings 2 and 3: an image's link moved a volume to `/` or over the server's own
    mounts, or one volume into another; bwrap then made the server's later mount points (or
    the inner volume's) in the volume, through links a sandbox had written there."""
    root = _root(tmp_path / "root", links)
    binds = [_bind(tmp_path / f"v{i}", t, "ab"[i]) for i, t in enumerate(targets)]
    try:
        with pytest.raises(VolumeError) as raised:
            _options(root, binds=binds)
    finally:
        volumes.close(binds)
    refused = answer(raised.value)  # what the create answers
    assert refused.status == 400
    assert refused.body["code"] == "VOLUME::INVALID_MOUNT_PATH"
    assert says in refused.body["message"], refused.body["message"]


def test_the_servers_mounts_and_the_working_dir_come_before_the_volumes(tmp_path: Path) -> None:
    """Finding 2: the execd binary, the OOM counter and the WorkingDir's `--dir` came after
    the volumes: a volume over their parents had bwrap make them in it."""
    binds = [_bind(tmp_path / "v", "/data")]
    try:
        options = _options(_root(tmp_path / "root", {}), workdir="/srv/app", binds=binds)
    finally:
        volumes.close(binds)
    volume = options.index("/volumes/data")
    for arg in (EXECD[1], OOM[1]):
        assert options.index(arg) < volume
    assert options.index("--dir", volume - 3) < volume and options[-2:] == ["--chdir", "/srv/app"]


def test_bwraps_options_of_a_default_sandbox_put_the_volumes_last() -> None:
    options = bwrap.container_options([], 3, [], ["--bind", "/v", "/data"], EXECD)
    assert options.index(EXECD[1]) < options.index("/v")


@pytest.mark.parametrize("target", ["/workspace", "/ws"])
def test_a_working_dir_inside_a_volume_is_made_in_it(tmp_path: Path, target: str) -> None:
    """Finding 12: a WorkingDir under a volume's mountPath (/workspace/app, a pvc at
    /workspace) was refused (bwrap would have made it in the image, under the mount). Now it
    is made in the volume, by descriptor, and bwrap only chdirs there (in the container's own
    view: the host is detached by then)."""
    root = _root(tmp_path / "root", {"ws": "/workspace"})
    binds = [_bind(tmp_path / "v", target)]
    try:
        options = _options(root, workdir="/workspace/app/src", binds=binds)
    finally:
        volumes.close(binds)
    assert "/workspace/app/src" not in options[:-1]  # no `--dir`: bwrap makes it nowhere
    assert options[-2:] == ["--chdir", "/workspace/app/src"]
    assert (tmp_path / "v" / "app" / "src").is_dir()


def test_a_working_dir_is_never_made_through_a_volumes_link(tmp_path: Path) -> None:
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "app").symlink_to(tmp_path / "outside")
    binds = [_bind(tmp_path / "v", "/workspace")]
    try:
        options = _options(_root(tmp_path / "root", {}), workdir="/workspace/app/x", binds=binds)
    finally:
        volumes.close(binds)
    assert options[-2:] == ["--chdir", "/workspace/app/x"] and not (tmp_path / "outside").exists()


def test_a_working_dir_missing_in_a_read_only_volume_is_refused(tmp_path: Path) -> None:
    binds = [_bind(tmp_path / "v", "/workspace", "ws", read_only=True)]
    try:
        with pytest.raises(VolumeError) as raised:
            _options(_root(tmp_path / "root", {}), workdir="/workspace/app", binds=binds)
    finally:
        volumes.close(binds)
    refused = answer(raised.value)
    assert refused.body["code"] == "VOLUME::SUB_PATH_NOT_FOUND"
    assert "WorkingDir '/workspace/app' is not in the read-only volume 'ws'" in str(refused)
    assert os.listdir(tmp_path / "v") == []


@pytest.mark.parametrize(
    ("first", "second", "where"),
    [("/data", "/data/sub/y", "inside"), ("/data/sub/y", "/data", "above")],
)
def test_a_volume_in_another_is_refused_before_any_is_opened(
    tmp_path: Path, first: str, second: str, where: str
) -> None:
    """Finding 3, default sandboxes too: a sandbox that writes the outer volume replaced a
    directory of it by a link to /oldroot/DIR (another tenant's claim, /tmp): bwrap made the
    inner mount point there, as the range's root."""
    claims = [
        {"name": name, "pvc": {"claimName": name}, "mountPath": path}
        for name, path in (("a", first), ("b", second))
    ]
    with pytest.raises(VolumeError) as raised:
        volumes.mounts(claims, (), tmp_path / "volumes", isolated=True)
    refused = answer(raised.value)
    assert refused.body["code"] == "VOLUME::INVALID_MOUNT_PATH"
    message = refused.body["message"]
    assert (
        f"mountPath {second!r} of volume 'b' is {where} the mountPath {first!r} of volume 'a'"
        in message
    )
    assert not (tmp_path / "volumes").exists()  # no claim made


@pytest.mark.parametrize("path", ["/run/osb-oom-control", "/opt/osb-sync/lib", "/opt/opensandbox"])
def test_no_volume_covers_what_the_server_mounts(tmp_path: Path, path: str) -> None:
    claim = {"name": "a", "pvc": {"claimName": "a"}, "mountPath": path}
    own = ("/run/osb-oom-control", "/opt/opensandbox/execd")
    with pytest.raises(VolumeError, match="which the container needs"):
        volumes.mounts([claim], (), tmp_path, isolated=True, protected=own)
