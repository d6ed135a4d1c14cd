"""The image machinery without its tools: references, skopeo's command line, unpack, store."""

from __future__ import annotations

import json
import logging
import os
import platform
import stat
import struct
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from osb_sync._constants import DEFAULT_TEMPLATE
from osb_sync.local.host import options
from osb_sync.local.host.errors import ImageError
from osb_sync.local.host.images import pull
from osb_sync.local.host.images.config import (
    ConfigError,
    ImageConfig,
    find_jupyter,
    find_python,
    locate,
)
from osb_sync.local.host.images.execd_image import MACHINES, ExecdImageError, execd_from_image
from osb_sync.local.host.images.pull import Puller, PullError, Source, parse
from osb_sync.local.host.images.rootfs import ImageView, confine
from osb_sync.local.host.images.service import ImageService, ImageSettings
from osb_sync.local.host.images.store import ImageStore, StoredImage
from osb_sync.local.host.images.unpack import (
    SizeLimit,
    TooLarge,
    UnpackError,
    in_range,
    server_owned,
    unpack,
)
from osb_sync.local.host.server import answer
from tests.imagekit import Entry, Image, layer_bytes, snapshot, write_dir_layout


@pytest.mark.parametrize(
    ("uri", "canonical"),
    [
        ("python:3.9", "docker.io/library/python:3.9"),
        ("python", "docker.io/library/python:latest"),
        ("library/python:3", "docker.io/library/python:3"),
        ("docker://user/app:v1", "docker.io/user/app:v1"),
        ("127.0.0.1:5000/a/b:t", "127.0.0.1:5000/a/b:t"),
        ("localhost/x", "localhost/x:latest"),
        ("ghcr.io/o/x@sha256:" + "a" * 64, "ghcr.io/o/x@sha256:" + "a" * 64),
        ("oci:/srv/layout:v2", "oci:/srv/layout:v2"),
        ("docker-archive:/srv/app.tar", "docker-archive:/srv/app.tar"),
    ],
)
def test_references_resolve_as_docker_reads_them(uri: str, canonical: str) -> None:
    assert parse(uri).canonical == canonical


@pytest.mark.parametrize("uri", ["Python:3", "a b", "oci:relative:t", "x:tag with space", ""])
def test_bad_references_say_what_a_reference_is(uri: str) -> None:
    with pytest.raises(ValueError, match=r"reference|absolute path|tag"):
        parse(uri)


def test_loopback_hosts() -> None:
    assert pull.is_loopback("127.0.0.1:5000") and pull.is_loopback("localhost:1")
    assert pull.is_loopback("[::1]:5000")
    assert not pull.is_loopback("registry.example:5000") and not pull.is_loopback("10.0.0.1")


@pytest.mark.parametrize(
    ("stderr", "reason"),
    [
        ("reading manifest v2 in r/x: manifest unknown: manifest unknown", pull.NOT_FOUND),
        ("reading manifest v1 in r/x: unauthorized: authentication required", pull.UNAUTHORIZED),
        ('no image found in image index for architecture amd64, variant "", OS linux',
         pull.NO_PLATFORM),
        ("pinging container registry r: dial tcp: connect: connection refused", pull.NETWORK),
        ("something else", pull.PULL_FAILED),
        # a port (bind(0) gave 55403 in a CI rehearsal) or a request id is no status code
        ("reading manifest nope in 127.0.0.1:55403/x: manifest unknown (request id a403b)",
         pull.NOT_FOUND),
        ("pinging container registry r: received unexpected HTTP status: 403 Forbidden",
         pull.UNAUTHORIZED),
    ],
)  # fmt: skip
def test_skopeo_failures_are_classified(stderr: str, reason: str) -> None:
    assert pull.classify(stderr) == reason


def test_skopeo_gets_no_credentials_on_its_command_line_nor_the_operators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pull.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setenv("REGISTRY_AUTH_FILE", "/root/.config/containers/auth.json")
    monkeypatch.setenv("DOCKER_CONFIG", "/root/.docker")
    puller = Puller(tmp_path, insecure_registries=("reg.example:5000",))
    auth_file = puller._auth(
        parse("reg.example:5000/x"), {"username": "u", "password": "pw"}, tmp_path
    )
    assert stat.S_IMODE(auth_file.stat().st_mode) == 0o600
    assert json.loads(auth_file.read_text())["auths"]["reg.example:5000"]["auth"] == "dTpwdw=="
    command = puller.command(
        parse("reg.example:5000/x"), tmp_path / "t", {"arch": "arm64"}, auth_file
    )
    assert "pw" not in " ".join(command) and "--src-creds" not in command
    assert command[command.index("--authfile") + 1] == str(auth_file)
    assert "--src-tls-verify=false" in command  # listed insecure
    assert command[command.index("--override-arch") + 1] == "arm64"
    secure = puller.command(parse("ghcr.io/o/x"), tmp_path / "t", {}, auth_file)
    assert "--src-tls-verify=true" in secure
    env = puller.environment()
    assert "REGISTRY_AUTH_FILE" not in env and env["DOCKER_CONFIG"].startswith(str(tmp_path))
    assert env["HOME"].startswith(str(tmp_path))
    empty = puller._auth(
        parse("ghcr.io/o/x"), None, tmp_path / "e" if (tmp_path / "e").mkdir() is None else tmp_path
    )
    assert json.loads(empty.read_text()) == {"auths": {}}


def test_local_sources_only_under_the_allowed_paths(tmp_path: Path) -> None:
    puller = Puller(tmp_path, local_paths=(tmp_path / "ok",))
    puller.check_source(parse(f"oci:{tmp_path}/ok/layout:v1"))
    with pytest.raises(PullError, match="--allow-image-path") as refused:
        puller.check_source(parse("docker-archive:/etc/shadow"))
    assert refused.value.reason == pull.REFUSED


def test_no_skopeo_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pull.shutil, "which", lambda name: None)
    with pytest.raises(PullError, match="apt-get install skopeo") as missing:
        Puller(tmp_path).command(parse("x"), tmp_path, {}, tmp_path / "a")
    assert missing.value.reason == pull.TOOL_MISSING


def test_the_host_view_default_is_the_clients_default_template() -> None:
    assert options.DEFAULT_HOST_IMAGES == (DEFAULT_TEMPLATE,)


def _unpacked(tmp_path: Path, *layers: list[Entry], **config: Any) -> Path:
    write_dir_layout(tmp_path / "layout", Image([layer_bytes(e) for e in layers], **config))
    unpack(tmp_path / "layout", tmp_path / "rootfs")
    return tmp_path / "rootfs"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to an id range needs root")
def test_an_id_range_owns_every_file_and_directory_the_image_has(tmp_path: Path) -> None:
    entries = [Entry("etc", "dir", mode=0o755), Entry("etc/conf"), Entry("opt/deep/file")]
    write_dir_layout(tmp_path / "layout", Image([layer_bytes(entries)]))
    unpack(tmp_path / "layout", tmp_path / "rootfs", in_range(100000, 200000, 65536))
    root = tmp_path / "rootfs"
    for path in (root, root / "etc", root / "etc/conf", root / "opt", root / "opt/deep"):
        found = path.lstat()
        assert (found.st_uid, found.st_gid) == (100000, 200000), path  # the image's root: 0
    assert in_range(100000, 200000, 65536)(70000, 0) is None  # past the range: the server's


def test_layers_apply_in_order_with_whiteouts_and_opaque_dirs(tmp_path: Path) -> None:
    lower = [
        Entry("etc", "dir", mode=0o755),
        Entry("etc/keep", data=b"k"),
        Entry("etc/gone", data=b"g"),
        Entry("opt/a", data=b"a"),
        Entry("opt/sub/b", data=b"b"),
        Entry("bin/tool", data=b"#!", mode=0o4755),
        Entry("lib", "symlink", target="/usr/lib"),
        Entry("etc/hard", "link", target="etc/keep"),
    ]
    upper = [
        Entry("etc/.wh.gone"),
        Entry("opt/new", data=b"n"),  # before the marker: the same layer's entries stay
        Entry("opt/.wh..wh..opq"),
        Entry("etc/keep", data=b"changed"),
    ]
    root = _unpacked(tmp_path, lower, upper)
    assert (root / "etc/keep").read_bytes() == b"changed"
    assert not (root / "etc/gone").exists()
    assert sorted(os.listdir(root / "opt")) == ["new"]
    assert os.readlink(root / "lib") == "/usr/lib"  # kept as is, never followed here
    assert stat.S_IMODE((root / "bin/tool").stat().st_mode) == 0o755  # setuid dropped
    assert (root / "etc/hard").read_bytes() == b"k"


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([Entry("../escape", data=b"x")], "'..' component"),
        ([Entry("/etc/passwd", data=b"x")], "absolute path"),
        ([Entry("evil", "symlink", target="/etc"), Entry("evil/passwd", data=b"x")], "through the link"),  # noqa: E501
        ([Entry("up", "symlink", target="../../.."), Entry("up/x", data=b"x")], "through the link"),
        ([Entry("h", "link", target="/etc/passwd")], "absolute"),
        ([Entry("h", "link", target="../outside")], "'..' component"),
        ([Entry("d", "symlink", target="/etc"), Entry("h", "link", target="d/passwd")], "through the link"),  # noqa: E501
        ([Entry("evil", "symlink", target="/etc"), Entry("evil/.wh.passwd")], "through the link"),
        ([Entry("a", "dir"), Entry("a/.wh...")], "names '..'"),
        ([Entry(".wh..")], "names '.'"),
        ([Entry("a/" * 600 + "f")], "directories deep"),
    ],
)  # fmt: skip
def test_malicious_layers_are_refused(tmp_path: Path, entries: list[Entry], message: str) -> None:
    with pytest.raises(UnpackError, match=message):
        _unpacked(tmp_path, entries)
    assert not (tmp_path.parent / "escape").exists()


def _owner() -> Any:
    """The owners a root server gives (so a chown that leaves the root shows), else none."""
    return in_range(100000, 100000, 65536) if os.geteuid() == 0 else server_owned


def _decoy(path: Path) -> Path:
    """A host directory an image must not reach: `t1/` (0700), `t1/f` and `c`, dated 2001."""
    (path / "t1").mkdir(parents=True)
    (path / "t1" / "f").write_bytes(b"host's")
    (path / "c").write_bytes(b"host's")
    for item in (path / "t1" / "f", path / "c", path / "t1", path):
        os.chmod(item, 0o700 if item.is_dir() else 0o600)
        os.utime(item, (1_000_000_000, 1_000_000_000))
    return path


@pytest.mark.parametrize("later", [False, True], ids=["in-one-layer", "in-a-later-layer"])
def test_a_directory_swapped_for_a_link_leaves_what_the_link_names_alone(
    tmp_path: Path, later: bool
) -> None:
    """Issue 37, row 1: `a/`, `a/t1/` (0777), then `a` a link to a host directory: the
    directories' modes, owners and times were set at the end by path, through the link."""
    host = _decoy(tmp_path / "host")
    before = snapshot(host)
    made = [Entry("a", "dir", mode=0o755), Entry("a/t1", "dir", mode=0o777)]
    swap = [Entry("a", "symlink", target=str(host))]
    layers = [made, swap] if later else [made + swap]
    write_dir_layout(tmp_path / "layout", Image([layer_bytes(e) for e in layers]))
    unpack(tmp_path / "layout", tmp_path / "rootfs", _owner())
    assert snapshot(host) == before
    assert os.readlink(tmp_path / "rootfs" / "a") == str(host)  # kept, as any link


@pytest.mark.parametrize(
    ("user", "etc", "missing"),
    [
        ("hostonly", "HOST", "passwd"),  # a link to a host directory
        ("root", "/etc", "passwd"),  # the container's /etc: itself, a loop; never the host's
        ("0:hostgroup", "HOST", "group"),
    ],
)
def test_the_images_user_is_never_looked_up_on_the_host(
    tmp_path: Path, user: str, etc: str, missing: str
) -> None:
    """Issue 37, row 4: an image whose `etc` links to the host's answered whether a host user
    exists (only the last component was checked for a link)."""
    host = tmp_path / "host-etc"
    host.mkdir()
    (host / "passwd").write_text("hostonly:x:4242:4242::/:/bin/sh\nroot:x:0:0::/root:/bin/sh\n")
    (host / "group").write_text("hostgroup:x:4343:\n")
    target = str(host) if etc == "HOST" else etc
    root = _unpacked(tmp_path, [Entry("etc", "symlink", target=target)])
    with pytest.raises(ValueError, match=f"not in its /etc/{missing}"):
        ImageConfig(user=user).ids(root)


def test_an_image_that_unpacks_past_the_limit_is_refused_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """Issue 37, row 3: 16 MiB of zeros (a 72 KiB layer) in a store of 4 MiB was unpacked
    whole: the cap only drove eviction. The default limit is the store's size."""
    bomb = Image([layer_bytes([Entry("zeros", data=bytes(16 << 20))])])
    store = ImageStore(tmp_path / "store", FakePuller(tmp_path / "s", bomb), cap=4 << 20)
    with pytest.raises(PullError) as refused:
        store.get("reg.example/bomb", {})
    assert refused.value.reason == "IMAGE_TOO_LARGE"
    assert "limit of 4.0 MiB (4194304 bytes)" in refused.value.message, refused.value
    assert "compressed" in refused.value.message
    assert os.listdir(tmp_path / "store" / "tmp") == [] and store.images() == []


def test_a_store_of_size_0_keeps_the_default_limit(tmp_path: Path) -> None:
    """A cap of 0 keeps only the images sandboxes run: it pulls them still."""
    small = Image([layer_bytes([Entry("usr/bin/python3", data=b"", mode=0o755)])])
    store = ImageStore(tmp_path / "store", FakePuller(tmp_path / "s", small), cap=0)
    assert store.limit.total == 10 << 30
    assert store.get("reg.example/small", {})[0].python == "/usr/bin/python3"


def test_device_nodes_are_skipped_and_listed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As rootless Podman skips them: bwrap gives each sandbox its own /dev. The store keeps
    their names (`osb-sync images --json`), the server logs them once, at the pull."""
    nodes = [
        Entry("dev", "dir", mode=0o755),
        Entry("dev/console", "chardev"),
        Entry("dev/null", "chardev"),
        Entry("dev/x\nFORGED log line", "chardev"),  # (after the attack, finding 14)
    ]
    python3 = Entry("usr/bin/python3", data=b"", mode=0o755)
    puller = FakePuller(tmp_path / "s", Image([layer_bytes([*nodes, python3])]))
    service = ImageService(ImageSettings(store=tmp_path / "store"), isolated=True, binary=None)
    service._store = ImageStore(tmp_path / "store", puller)
    body = {"image": {"uri": "reg.example/debian:12"}}
    with caplog.at_level(logging.WARNING, logger="osb_sync.local"):
        run = service.launch(body)
        service.launch(body)  # cached: no second line
    assert run is not None
    image = run.view.image
    assert image.skipped == ("dev/console", "dev/null", "dev/x\nFORGED log line")
    assert os.listdir(image.rootfs / "dev") == []
    (line,) = [r.getMessage() for r in caplog.records]
    assert "reg.example/debian:12@sha256:" in line and "3 device nodes skipped" in line, line
    assert "'dev/console', 'dev/null', 'dev/x\\nFORGED" in line and "its own /dev" in line
    assert "\n" not in line  # an image's names, escaped: no line of the log is the image's
    assert service.store.images()[0]["skipped"] == list(image.skipped)


@pytest.mark.parametrize("floor", [64 << 10, 1 << 30])
def test_a_decompression_bomb_is_refused_past_the_floor_only(tmp_path: Path, floor: int) -> None:
    """4 MiB of zeros is a 4 KiB layer (1000:1): refused past a floor of 64 KiB, kept under the
    default floor of 1 GiB (a layer of zeros is no bomb), both within the size limit."""
    write_dir_layout(tmp_path / "layout", Image([layer_bytes([Entry("z", data=bytes(4 << 20))])]))
    limit = SizeLimit(64 << 20, floor=floor)
    if floor > 4 << 20:
        assert unpack(tmp_path / "layout", tmp_path / "rootfs", limit=limit).size == 4 << 20
        return
    with pytest.raises(TooLarge, match="more than 100 times its compressed size") as refused:
        unpack(tmp_path / "layout", tmp_path / "rootfs", limit=limit)
    assert refused.value.unpacked > floor and refused.value.unpacked > 100 * refused.value.packed
    assert "(65536 bytes) (a decompression bomb)" in str(refused.value)


def test_a_file_past_the_limit_is_refused_before_it_is_written(tmp_path: Path) -> None:
    write_dir_layout(tmp_path / "layout", Image([layer_bytes([Entry("z", data=bytes(1 << 20))])]))
    with pytest.raises(TooLarge, match=r"limit of 512\.0 KiB \(524288 bytes\): at least 1\.0 MiB"):
        unpack(tmp_path / "layout", tmp_path / "rootfs", limit=SizeLimit(512 << 10))
    assert os.listdir(tmp_path / "rootfs") == []  # not even a part of it


def test_an_image_past_the_limit_answers_413_with_how_to_raise_it(tmp_path: Path) -> None:
    bomb = Image([layer_bytes([Entry("zeros", data=bytes(2 << 20))])])
    settings = ImageSettings(store=tmp_path / "store", limit=1 << 20)
    service = ImageService(settings, isolated=True, binary=None)
    service._store = ImageStore(tmp_path / "store", FakePuller(tmp_path / "s", bomb), limit=1 << 20)
    with pytest.raises(ImageError) as raised:
        service.launch({"image": {"uri": "reg.example/bomb:1"}})
    refused = answer(raised.value)  # what the create answers
    assert refused.status == 413
    assert refused.body["code"] == "DOCKER::SANDBOX_IMAGE_PULL_FAILED"
    message = refused.body["message"]
    assert message.startswith("IMAGE_TOO_LARGE: Failed to pull image reg.example/bomb:1: ")
    assert "limit of 1.0 MiB (1048576 bytes)" in message and "compressed" in message
    assert "--image-size-limit BYTES" in message and "image_size_limit=BYTES" in message


def _root_with_links(root: Path) -> Path:
    for folder in ("etc", "run", "usr/lib"):
        (root / folder).mkdir(parents=True)
    (root / "etc" / "passwd").write_text("")
    (root / "srv").symlink_to("/oldroot/tmp")  # absolute: from the image's root
    (root / "var").mkdir()
    (root / "var" / "run").symlink_to("/run")  # Debian's
    (root / "opt").symlink_to("../../../usr/lib")  # relative: `..` stops at the root
    (root / "data").symlink_to("/proc/self/root/oldroot/tmp")
    (root / "loop").symlink_to("loop")
    return root


def test_confine_gives_bwrap_every_destination_resolved_in_the_image(tmp_path: Path) -> None:
    """Issue 37, item 5: the destinations of a bwrap argv as the container sees them."""
    root = _root_with_links(tmp_path / "root")
    options = ["--unshare-user", "--setenv", "PATH", "--bind", "--bind", str(root), "/"]
    options += ["--proc", "/proc", "--ro-bind", "/dev/null", "/proc/kcore"]
    options += ["--tmpfs", "/proc/acpi", "--remount-ro", "/proc/acpi"]
    options += ["--bind", "/h", "/var/run/osb-execd", "--perms", "0755", "--dir", "/opt/osb-sync"]
    options += ["--ro-bind-try", "/x", "/srv/x", "--bind", "/v", "/mnt//a/./b/../c"]
    options += ["--dir", "/../srv/w", "--chdir", "/../srv/w"]
    assert confine(root, options) == [
        *options[:12],  # the namespaces, PATH, the root and /proc's, as written
        *["--tmpfs", "/proc/acpi", "--remount-ro", "/proc/acpi"],
        *["--bind", "/h", "/run/osb-execd", "--perms", "0755", "--dir", "/usr/lib/osb-sync"],
        *["--ro-bind-try", "/x", "/oldroot/tmp/x", "--bind", "/v", "/mnt/a/c"],
        *["--dir", "/oldroot/tmp/w", "--chdir", "/../srv/w"],  # (the container resolves it)
    ]


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["--dir", "/etc/passwd/x"], "/etc/passwd is no directory"),
        (["--dir", "/etc/passwd"], "is no directory in the image"),
        (["--dir", "/loop/x"], "loop of links"),
        (["--proc", "/proc", "--dir", "/proc/self/root/oldroot/tmp"], "leads below '/proc'"),
        (["--proc", "/proc", "--bind", "/h", "/data/x"], "leads below '/proc'"),
        (["--tmpfs", "/run", "--ro-bind", "/h", "/var/run/x"], "leads below '/run'"),
    ],
)
def test_confine_refuses_what_the_image_makes_impossible(
    tmp_path: Path, options: list[str], problem: str
) -> None:
    root = _root_with_links(tmp_path / "root")
    with pytest.raises(ConfigError, match=problem):
        confine(root, ["--bind", str(root), "/", *options])


@pytest.mark.parametrize("option", ["--symlink", "--bogus"])
def test_confine_knows_every_option_it_reads(tmp_path: Path, option: str) -> None:
    with pytest.raises(ValueError, match=f"no rule for the bwrap option '{option}'"):
        confine(tmp_path, [option, "a", "/b"])


def test_an_error_of_the_disk_names_the_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By descriptor, the kernel's error names only the last component (a server that is not
    root cannot give files to its range: 'Operation not permitted: fd')."""

    def refused(*args: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchown", refused)
    write_dir_layout(tmp_path / "layout", Image([layer_bytes([Entry("./etc/conf", data=b"")])]))
    with pytest.raises(PermissionError, match=r"not permitted: layer member '\./etc/conf'"):
        unpack(tmp_path / "layout", tmp_path / "rootfs", in_range(100000, 100000, 65536))


def test_a_layer_that_does_not_match_its_digest_is_refused(tmp_path: Path) -> None:
    write_dir_layout(tmp_path / "layout", Image([layer_bytes([Entry("a", data=b"1")])]))
    manifest = json.loads((tmp_path / "layout" / "manifest.json").read_text())
    blob = tmp_path / "layout" / manifest["layers"][0]["digest"].split(":")[1]
    data = bytearray(blob.read_bytes())
    data[20] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(UnpackError):
        unpack(tmp_path / "layout", tmp_path / "rootfs")


def test_the_config_is_honoured(tmp_path: Path) -> None:
    passwd = b"root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n"
    entries = [
        Entry("etc/passwd", data=passwd),
        Entry("etc/group", data=b"root:x:0:\nstaff:x:50:\n"),
        Entry("usr/bin/python3.9", data=b"", mode=0o755),
        Entry("usr/bin/python3", "symlink", target="python3.9"),
    ]
    root = _unpacked(tmp_path, entries)
    blob = {"config": {"Env": ["PATH=/usr/bin", "A=1=2"], "User": "app", "WorkingDir": "/w",
                       "Entrypoint": ["/e"], "Cmd": ["c"]}}  # fmt: skip
    config = ImageConfig.from_blob(blob)
    assert config.environment == {"PATH": "/usr/bin", "A": "1=2"}
    assert config.ids(root) == (1000, 1001)
    assert ImageConfig(user="app:staff").ids(root) == (1000, 50)
    assert ImageConfig(user="7").ids(root) == (7, 7)
    assert config.effective_entrypoint(None) == ["/e", "c"]
    assert config.effective_entrypoint(["/bin/sh"]) == ["/bin/sh"]
    assert find_python(root, config) == "/usr/bin/python3"
    assert find_python(root, ImageConfig(env=(("PATH", "/bin"),))) is None
    with pytest.raises(ValueError, match="not in its /etc/passwd"):
        ImageConfig(user="nobody").ids(root)


@pytest.mark.parametrize(
    ("key", "value"), [("layers", ["x"]), ("config", {"digest": 5})], ids=["layers", "config"]
)
def test_a_manifest_of_another_shape_is_refused(tmp_path: Path, key: str, value: Any) -> None:
    """After the attack, finding 13: the registry's manifest is copied as it is; `layers: ["x"]`
    was an AttributeError (a 500 UNKNOWN_ERROR), a digest 5 too."""
    write_dir_layout(tmp_path / "layout", Image([layer_bytes([Entry("a", data=b"1")])]))
    manifest = json.loads((tmp_path / "layout" / "manifest.json").read_text())
    (tmp_path / "layout" / "manifest.json").write_text(json.dumps({**manifest, key: value}))
    with pytest.raises(UnpackError, match=r"not lists of digests|unsupported digest '5'"):
        unpack(tmp_path / "layout", tmp_path / "rootfs")


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ("x", "the image's config is not an object"),
        ({"Entrypoint": 5}, "Entrypoint is not a list of strings: '5'"),
        ({"Entrypoint": "sh"}, "Entrypoint is not a list of strings: 'sh'"),  # (ran s, then h)
        ({"Env": 5}, "Env is not a list of strings"),
        ({"Cmd": ["a", 5]}, "Cmd is not a list of strings"),
        ({"User": 0}, "User is not a string"),
        ({"WorkingDir": ["/w"]}, "WorkingDir is not a string"),
    ],
)
def test_a_config_field_of_another_type_is_refused_naming_it(
    tmp_path: Path, config: Any, says: str
) -> None:
    """After the attack, finding 13: AttributeError or TypeError (a 500 UNKNOWN_ERROR, a
    traceback in the log), or characters taken for arguments. Docker refuses such a config."""
    image = Image(
        [layer_bytes([Entry("usr/bin/python3", data=b"", mode=0o755)])], raw_config=config
    )
    store = ImageStore(tmp_path / "store", FakePuller(tmp_path / "s", image))
    with pytest.raises(PullError) as refused:
        store.get("reg.example/x", {})
    assert refused.value.reason == "IMAGE_CONFIG_INVALID" and says in refused.value.message
    assert os.listdir(tmp_path / "store" / "tmp") == [] and store.images() == []


@pytest.mark.parametrize(
    "user", ["\u00b2", "1" * 5000, "4294967295", "0:\u00b2", "0:" + "1" * 5000]
)
def test_a_user_that_is_no_id_nor_name_is_refused(tmp_path: Path, user: str) -> None:
    """After the attack, finding 13: `isdigit` takes '²' (int() then fails), and int() refuses
    5000 digits: ValueError, a 500."""
    root = _unpacked(tmp_path, [Entry("etc/passwd", data=b"root:x:0:0::/root:/bin/sh\n")])
    with pytest.raises(ConfigError, match=r"is not in its /etc/(passwd|group)"):
        ImageConfig(user=user).ids(root)


def test_a_passwd_that_is_a_fifo_is_no_table(tmp_path: Path) -> None:
    """After the attack, finding 9: /etc/passwd was opened (blocking) before it was checked
    to be a file: a fifo held the create's thread until something wrote it, for good."""
    root = _unpacked(tmp_path, [Entry("etc", "dir", mode=0o755), Entry("etc/passwd", "fifo")])
    answer: list[Any] = []

    def look_up() -> None:
        try:
            ImageConfig(user="app").ids(root)
        except ConfigError as exc:
            answer.append(exc)

    reader = threading.Thread(target=look_up, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # let it go (it waits for a writer), then fail
        os.close(os.open(root / "etc" / "passwd", os.O_WRONLY | os.O_NONBLOCK))
    assert answer and "not in its /etc/passwd" in str(answer[0])


@pytest.mark.parametrize(
    "path",
    [
        "/" + "a/" * 10_000,  # a WorkingDir: 1.5 s of CPU at every create (40 000: 24 s)
        "/l1/x",  # three links of 800 `d/..` each
    ],
    ids=["long", "through-long-links"],
)
def test_locate_looks_at_4096_components_at_most(tmp_path: Path, path: str) -> None:
    """After the attack, finding 11: `locate` was quadratic in a path's components, and
    `confine` runs it for every destination at every create."""
    root = _unpacked(
        tmp_path,
        [
            Entry("d", "dir", mode=0o755),
            Entry("l1", "symlink", target="d/../" * 800 + "l2"),
            Entry("l2", "symlink", target="d/../" * 800 + "l3"),
            Entry("l3", "symlink", target="d/../" * 800 + "d"),
        ],
    )
    with pytest.raises(ConfigError, match=r"through more than 4096 components|past 4095 bytes"):
        locate(root, path)


def test_a_working_dir_past_path_max_is_refused() -> None:
    with pytest.raises(ConfigError, match="WorkingDir is longer than 4095 bytes"):
        ImageConfig.from_blob({"config": {"WorkingDir": "/w" * 2048}})


def test_locate_names_no_host_path(tmp_path: Path) -> None:
    """After the attack, finding 14: the kernel's error named the sandbox's root on the host
    (its run directory), in the create's answer."""
    with pytest.raises(ConfigError) as refused:
        locate(tmp_path, "/" + "a" * 300 + "/x")
    assert "File name too long" in str(refused.value) and str(tmp_path) not in str(refused.value)


class FakePuller(Puller):
    """Copies a prepared `dir:` layout instead of running skopeo; counts its pulls."""

    def __init__(self, scratch: Path, image: Image) -> None:
        super().__init__(scratch)
        object.__setattr__(self, "image", image)
        object.__setattr__(self, "copies", [])

    def copy(
        self,
        source: Source,
        target: Path,
        platform: dict[str, str],
        auth: Any = None,
        progress: Any = None,
    ) -> str:
        self.copies.append(source.canonical)  # type: ignore[attr-defined]
        return write_dir_layout(target, self.image)  # type: ignore[attr-defined]


def test_the_store_pulls_once_then_serves_from_itself(tmp_path: Path) -> None:
    image = Image([layer_bytes([Entry("usr/bin/python3", data=b"", mode=0o755)])])
    puller = FakePuller(tmp_path / "scratch", image)
    store = ImageStore(tmp_path / "store", puller)
    first, pulled = store.get("reg.example/x:1", {"arch": "amd64"})
    again, pulled_again = store.get("reg.example/x:1", {"arch": "amd64"})
    assert pulled and not pulled_again and first == again
    assert puller.copies == ["reg.example/x:1"]  # type: ignore[attr-defined]
    assert first.python == "/usr/bin/python3" and first.pinned.startswith("reg.example/x:1@sha256:")
    assert os.listdir(tmp_path / "store" / "tmp") == []
    assert [i["digest"] for i in store.images()] == [first.digest]


def test_a_pull_killed_half_way_leaves_nothing(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store", FakePuller(tmp_path / "s", Image([])))
    (tmp_path / "store" / "tmp" / "1-dead").mkdir()
    (tmp_path / "store" / "tmp" / "1-dead.lock").touch()  # its lock is free: its pull died
    store.clean_tmp()
    assert os.listdir(tmp_path / "store" / "tmp") == []


def test_a_refused_image_leaves_nothing(tmp_path: Path) -> None:
    bad = Image([layer_bytes([Entry("../x", data=b"")])])
    store = ImageStore(tmp_path / "store", FakePuller(tmp_path / "s", bad))
    with pytest.raises(PullError, match=r"'\.\.' component") as refused:
        store.get("reg.example/bad", {})
    assert refused.value.reason == "IMAGE_REFUSED"
    assert os.listdir(tmp_path / "store" / "tmp") == [] and store.images() == []


def test_eviction_and_prune_spare_held_images(tmp_path: Path) -> None:
    from osb_sync.local.host.images.store import hold

    big = Image([layer_bytes([Entry("f", data=b"x" * 1000)])])
    # (a tar is 10 KiB at least: past the cap, the default size limit)
    store = ImageStore(tmp_path / "store", FakePuller(tmp_path / "s", big), cap=1500, limit=1 << 20)
    first, _ = store.get("r.example/a", {})
    fd = hold(first)
    store.puller.image = Image([layer_bytes([Entry("g", data=b"y" * 1000)])])  # type: ignore[attr-defined]
    second, _ = store.get("r.example/b", {})
    assert {i["digest"] for i in store.images()} == {first.digest, second.digest}  # held
    assert store.prune() == [second.digest]
    os.close(fd)
    assert store.prune() == [first.digest] and store.images() == []


def _elf(machine: int = MACHINES.get(platform.machine(), 62), kind: int = 2) -> bytes:
    """An ELF header (64-bit, little-endian) of `kind` for `machine`, and a little body."""
    return b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HH", kind, machine) + bytes(44)


def test_jupyter_counts_with_a_kernelspec_named_python(tmp_path: Path) -> None:
    spec = Entry("usr/share/jupyter/kernels/python/kernel.json", data=b"{}")
    config = ImageConfig(env=(("PATH", "/opt/venv/bin:/usr/bin"),))
    jupyter = Entry("usr/bin/jupyter", data=b"", mode=0o755)
    assert find_jupyter(_unpacked(tmp_path / "a", [jupyter, spec]), config) == "/usr/bin/jupyter"
    python3_only = Entry("usr/share/jupyter/kernels/python3/kernel.json", data=b"{}")
    assert find_jupyter(_unpacked(tmp_path / "b", [jupyter, python3_only]), config) is None
    assert find_jupyter(_unpacked(tmp_path / "c", [spec]), config) is None
    venv = [
        Entry("opt/venv/bin/jupyter", data=b"", mode=0o755),
        Entry("opt/venv/share/jupyter/kernels/python/kernel.json", data=b"{}"),
    ]
    assert find_jupyter(_unpacked(tmp_path / "d", venv), config) == "/opt/venv/bin/jupyter"


@pytest.mark.parametrize(
    ("entries", "entrypoint", "found"),
    [
        ([Entry("execd", data=_elf(), mode=0o755)], None, "/execd"),
        ([Entry("usr/local/bin/execd", data=_elf(), mode=0o755)], ["/bin/x"], "/usr/local/bin/"),
        ([Entry("usr/bin/run-execd", data=_elf(), mode=0o755)], ["run-execd"], "Entrypoint"),
    ],
)
def test_execd_image_finds_the_binary_by_its_rules(
    tmp_path: Path, entries: list[Entry], entrypoint: list[str] | None, found: str
) -> None:
    image = Image([layer_bytes(entries)], entrypoint=entrypoint)
    puller = FakePuller(tmp_path / "scratch", image)
    store = ImageStore(tmp_path / "store", puller)
    binary = execd_from_image(store, "reg.example/execd:1")
    assert found in binary.found_at and binary.path.read_bytes() == _elf()
    assert binary.path.parent.name.startswith("sha256-")
    assert stat.S_IMODE(binary.path.stat().st_mode) == 0o555
    assert execd_from_image(store, "reg.example/execd:1") == binary  # cached: no new pull
    assert len(puller.copies) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"#!/bin/sh\n", "not an ELF executable"),
        (_elf(kind=1), "not an executable"),
        (_elf(machine=999), "built for ELF machine 999"),
    ],
)
def test_execd_image_refuses_what_is_no_executable_for_this_machine(
    tmp_path: Path, data: bytes, message: str
) -> None:
    image = Image([layer_bytes([Entry("execd", data=data, mode=0o755)])])
    store = ImageStore(tmp_path / "store", FakePuller(tmp_path / "scratch", image))
    with pytest.raises(ExecdImageError, match=message):
        execd_from_image(store, "reg.example/execd:1")
    assert not list((tmp_path / "store").glob("execd/*/execd"))


def test_an_execd_image_without_a_binary_names_the_rules(tmp_path: Path) -> None:
    image = Image([layer_bytes([Entry("bin/sh", data=b"", mode=0o755)])])
    store = ImageStore(tmp_path / "store", FakePuller(tmp_path / "scratch", image))
    with pytest.raises(ExecdImageError, match="none of /execd, /usr/local/bin/execd"):
        execd_from_image(store, "reg.example/execd:1")


def test_an_image_without_bash_keeps_an_execd_on_its_own_python(tmp_path: Path) -> None:
    """The placeholder bwrap runs where the template forks execd is the image's shell."""
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    view = ImageView(StoredImage("sha256:0", "x", tmp_path, ImageConfig(), "/usr/bin/python3", 0))
    (root / "bin" / "sh").write_bytes(b"")
    (root / "bin" / "sh").chmod(0o755)
    assert not view.template
    (root / "bin" / "bash").symlink_to("/../../../bin/sh")  # resolved in the image's root
    assert view.template
    (root / "bin" / "sh").chmod(0o644)
    assert not view.template
    assert view.python == "/usr/bin/python3"


def test_a_layer_its_sandbox_nested_deep_is_removed(tmp_path: Path) -> None:
    """A sandbox nests directories at will in its writable copy (`mkdir d; cd d` in a loop):
    `Layer.remove` left such a copy, with RecursionError out of shutil.rmtree past ~1000."""
    from osb_sync.local.host.images.rootfs import Layer

    layer = Layer.__new__(Layer)
    layer.root, layer.kind, layer._mounted, layer._inside = tmp_path / "root", "copy", False, None
    layer.root.mkdir()
    fd = os.open(layer.root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    try:
        layer.remove()
        assert os.listdir(tmp_path) == []
    finally:  # pytest's own clean-up is shutil.rmtree too
        subprocess.run(["rm", "-rf", "--", str(layer.root)], check=True)
