"""Images for the image tests, built without Docker, and loopback registries to push them to.

An image here is an OCI layout directory written by `write_layout` (layers are tar.gz blobs
made with `tarfile`; a rootfs from `mmdebstrap` becomes one layer), pushed with `skopeo copy`
to a `docker-registry` (the distribution registry) on 127.0.0.1, one anonymous and one with
htpasswd basic auth. Built images are cached under `$XDG_CACHE_HOME/osb-sync-test-images`.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
TOOLS = ("skopeo", "docker-registry")
# OSB_REQUIRE_IMAGES=1 (CI): the image tests fail instead of skipping without their tools.
REQUIRE_IMAGES = os.environ.get("OSB_REQUIRE_IMAGES") == "1"
# The mmdebstrap suite whose python3 (3.9) differs from every test interpreter.
BULLSEYE_PACKAGES = "python3,python3-six"
# The basic-auth registry's one user; the hash is bcrypt's (cost 4) of PASSWORD, made once
# (no bcrypt module is needed to run the tests).
USER, PASSWORD = "tester", "s3cret-pass"
PASSWORD_BCRYPT = "$2b$04$gmrvq.WlAztJxMSaEZfEdOSc3pNgCG.NTPksLriK1pAh.TY1Od1SS"


def cache_dir() -> Path:
    """Where built images are kept between runs."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "osb-sync-test-images"


def missing_tools() -> list[str]:
    """The tools the registry tests need that are not on PATH."""
    return [tool for tool in TOOLS if shutil.which(tool) is None]


@dataclass
class Entry:
    """One member of a test layer: a file, dir, symlink, hard link, device or whiteout."""

    name: str
    kind: str = "file"  # file, dir, symlink, link, chardev, fifo
    data: bytes = b""
    target: str = ""
    mode: int = 0o644


def layer_bytes(entries: Iterable[Entry]) -> bytes:
    """An uncompressed tar of `entries`, names kept exactly as given (even `../` ones)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.mode = entry.mode
            info.mtime = 1_700_000_000
            types = {
                "file": tarfile.REGTYPE,
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "link": tarfile.LNKTYPE,
                "chardev": tarfile.CHRTYPE,
                "fifo": tarfile.FIFOTYPE,
            }
            info.type = types[entry.kind]
            info.linkname = entry.target
            if entry.kind == "file":
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
            else:
                tar.addfile(info)
    return buffer.getvalue()


@dataclass
class Image:
    """What `write_layout` needs: layers (uncompressed tars) and the config's fields."""

    layers: list[bytes]
    env: list[str] = field(default_factory=lambda: ["PATH=/usr/local/bin:/usr/bin:/bin"])
    working_dir: str = ""
    user: str = ""
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    architecture: str = HOST_ARCH


def _blob(layout: Path, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _manifest(layout: Path, image: Image) -> dict[str, Any]:
    """Write `image`'s blobs into `layout`; its manifest's descriptor."""
    diff_ids, layers = [], []
    for layer in image.layers:
        diff_ids.append("sha256:" + hashlib.sha256(layer).hexdigest())
        layers.append({"mediaType": OCI_LAYER, **_blob(layout, gzip.compress(layer, 1, mtime=0))})
    config: dict[str, Any] = {"Env": image.env}
    for key, value in (
        ("WorkingDir", image.working_dir),
        ("User", image.user),
        ("Entrypoint", image.entrypoint),
        ("Cmd", image.cmd),
    ):
        if value:
            config[key] = value
    config_blob = {
        "architecture": image.architecture,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, **_blob(layout, json.dumps(config_blob).encode())},
        "layers": layers,
    }
    return {
        "mediaType": OCI_MANIFEST,
        **_blob(layout, json.dumps(manifest).encode()),
        "platform": {"architecture": image.architecture, "os": "linux"},
    }


def write_layout(layout: Path, tag: str, images: Sequence[Image], as_list: bool = False) -> Path:
    """Write an OCI layout holding `images` under `tag` (one image, or with `as_list` an index).

    Returns:
        `layout`.
    """
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    descriptors = [_manifest(layout, image) for image in images]
    if as_list:
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": descriptors}
        top = {"mediaType": OCI_INDEX, **_blob(layout, json.dumps(index).encode())}
    else:
        (top,) = descriptors
        top = {k: v for k, v in top.items() if k != "platform"}
    top["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    return layout


def rootfs_layer(tar_path: Path) -> bytes:
    """A layer from a rootfs tarball (mmdebstrap's), without its device nodes (`/dev`'s).

    Image layers carry no device nodes (the runtime makes `/dev`); the store refuses them.
    """
    out = io.BytesIO()
    with tarfile.open(tar_path) as source, tarfile.open(fileobj=out, mode="w") as tar:
        for member in source:
            if member.ischr() or member.isblk():
                continue
            tar.addfile(member, source.extractfile(member) if member.isfile() else None)
    return out.getvalue()


def bullseye_tar() -> Path:
    """A Debian bullseye minbase rootfs with python3 (3.9), built once with mmdebstrap."""
    target = cache_dir() / "bullseye-python3.tar"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # tox's parallel envs may all get here at once: one builds, the others wait for it
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            _build_bullseye(target)
    return target


def _build_bullseye(target: Path) -> None:
    partial = target.with_suffix(f".partial-{os.getpid()}.tar")
    subprocess.run(
        [
            "mmdebstrap",
            "--quiet",
            "--variant=minbase",
            f"--include={BULLSEYE_PACKAGES}",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            "bullseye",
            str(partial),
        ],
        check=True,
        timeout=300,
    )
    partial.rename(target)


def free_port() -> int:
    """A port from bind(0) on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LoopbackRegistry:
    """A `docker-registry` on 127.0.0.1 (a port from bind(0)), optionally with basic auth.

    Args:
        workdir: where its storage and config go.
        basic_auth: require htpasswd basic auth for `USER` / `PASSWORD`.
    """

    def __init__(self, workdir: Path, basic_auth: bool = False) -> None:
        self.workdir = workdir
        self.users = {USER: PASSWORD} if basic_auth else None
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LoopbackRegistry:
        """Start it and wait until `/v2/` answers."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        auth = ""
        if self.users is not None:
            (self.workdir / "htpasswd").write_text(f"{USER}:{PASSWORD_BCRYPT}\n")
            auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {self.workdir / 'htpasswd'}\n"
        (self.workdir / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {self.workdir / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n{auth}"
        )
        self._proc = subprocess.Popen(
            ["docker-registry", "serve", str(self.workdir / "config.yml")],
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "registry.log", "wb"),
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.5):
                    return self
            except OSError:
                if self._proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        log = (self.workdir / "registry.log").read_text(errors="replace")
        raise RuntimeError(f"docker-registry did not start: {log[-500:]}")

    def push(self, layout: Path, tag: str, name: str, multi: bool = False) -> str:
        """Push the OCI layout's `tag` as `name:tag`; returns the reference pushed."""
        ref = f"{self.host}/{name}:{tag}"
        command = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
        if self.users:
            user, password = next(iter(self.users.items()))
            command += ["--dest-creds", f"{user}:{password}"]
        if multi:
            command.append("--all")
        subprocess.run(
            [*command, f"oci:{layout}:{tag}", f"docker://{ref}"],
            check=True,
            capture_output=True,
            timeout=120,
            env={"PATH": os.environ["PATH"], "HOME": str(self.workdir)},
        )
        return ref

    def stop(self) -> None:
        """Stop it."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


def write_dir_layout(target: Path, image: Image) -> str:
    """Write `image` as skopeo's `dir:` layout (what `pull.Puller.copy` leaves); its digest."""
    oci = target.parent / f"{target.name}.oci"
    descriptor = _manifest(oci, image)
    target.mkdir(parents=True)
    for blob in (oci / "blobs" / "sha256").iterdir():
        shutil.copy(blob, target / blob.name)
    manifest = (oci / "blobs" / "sha256" / descriptor["digest"].split(":")[1]).read_bytes()
    (target / "manifest.json").write_bytes(manifest)
    (target / "version").write_text("Directory Transport Version: 1.1\n")
    shutil.rmtree(oci)
    return str(descriptor["digest"])
