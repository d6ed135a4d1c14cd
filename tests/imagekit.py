"""Images for the image tests, built without Docker, and loopback registries to push them to.

An image here is an OCI layout directory written by `write_layout` (layers are tar.gz blobs
made with `tarfile`; a rootfs from `mmdebstrap` becomes one layer: Debian bullseye with
python3, or bookworm with Jupyter for `interpreter_image`), pushed with `skopeo copy`
to a `docker-registry` (the distribution registry) on 127.0.0.1, one anonymous and one with
htpasswd basic auth, and one with bearer tokens (`auth: token`) issued by `TokenService`, a
small token server of the tests' own (stdlib http.server; tokens are JWTs signed RS256 with
the `openssl` CLI by a self-signed certificate it makes, which the registry trusts through
`rootcertbundle`). Built images are cached under `$XDG_CACHE_HOME/osb-sync-test-images`.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import gzip
import hashlib
import http.server
import io
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import tarfile
import threading
import time
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
TOOLS = ("skopeo", "docker-registry", "openssl")
# OSB_REQUIRE_IMAGES=1 (CI): the image tests fail instead of skipping without their tools.
REQUIRE_IMAGES = os.environ.get("OSB_REQUIRE_IMAGES") == "1"
# The mmdebstrap suite whose python3 (3.9) differs from every test interpreter.
BULLSEYE_PACKAGES = "python3,python3-six"
# What a code-interpreter image brings: a `jupyter` and notebook server, and ipykernel.
INTERPRETER_PACKAGES = "python3,python3-ipykernel,python3-notebook,jupyter-notebook,jupyter-core"
# Its build, in well under the 300 s bound: no Recommends; no byte-compiling of its 240
# packages while they are configured (their postinst skip it without py3compile), only of
# what Jupyter and the kernel import (one import at the end, bytecode written whatever the
# caller's PYTHONDONTWRITEBYTECODE: else each sandbox compiles it again in its own layer, a
# Jupyter start past 60 s on a busy machine); no MathJax (the notebook UI's, 45 MB) and no
# gdb (only debugpy's attach wants it).
INTERPRETER_OPTIONS = (
    '--aptopt=APT::Install-Recommends "false"',
    "--dpkgopt=path-exclude=/usr/bin/py3compile",
    "--dpkgopt=path-exclude=/usr/share/javascript/mathjax/*",
    "--dpkgopt=path-exclude=/usr/share/fonts/*",
    "--dpkgopt=path-exclude=/usr/bin/gdb*",
    '--customize-hook=chroot "$1" env -u PYTHONDONTWRITEBYTECODE python3'
    ' -c "import notebook.notebookapp, ipykernel.kernelapp"',
)
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
    pax: dict[str, str] = field(default_factory=dict)  # its pax header's records, as given


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
            info.pax_headers = dict(entry.pax)
            if entry.kind == "file":
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
            else:
                tar.addfile(info)
    return buffer.getvalue()


def extended_header(body: bytes, kind: bytes = tarfile.XHDTYPE) -> bytes:
    """A tar header of type `kind` (pax's `x` or `g`, GNU's long name `L`) holding `body`, of
    any content and size, padded: to put before the members of a `layer_bytes` tar."""
    pax = kind in (tarfile.XHDTYPE, tarfile.XGLTYPE)
    info = tarfile.TarInfo("././@PaxHeader" if pax else "././@LongLink")
    info.type, info.size = kind, len(body)
    return info.tobuf(format=tarfile.USTAR_FORMAT) + body + bytes(-len(body) % tarfile.BLOCKSIZE)


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
    raw_config: Any = None  # the config blob's "config", any JSON, instead of the fields above


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
    if image.raw_config is not None:
        config = image.raw_config
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


def snapshot(top: Path, skip: Sequence[str] = ()) -> dict[str, tuple[Any, ...]]:
    """Everything a change outside an image's root would show, of `top` and what is below it
    (links never followed; names in `skip` left out at any depth): each entry's type and mode,
    owner, mtime (`top`'s own excepted: a root made beside it changes it) and content (a
    file's bytes, a link's target, a directory's names)."""
    found: dict[str, tuple[Any, ...]] = {}

    def visit(path: Path, rel: str) -> None:
        info = path.lstat()
        mtime = None if not rel else info.st_mtime_ns
        content: Any = None
        if stat.S_ISLNK(info.st_mode):
            content = os.readlink(path)
        elif stat.S_ISREG(info.st_mode):
            content = path.read_bytes()
        elif stat.S_ISDIR(info.st_mode):
            content = sorted(set(os.listdir(path)) - set(skip))
        found[rel or "."] = (info.st_mode, info.st_uid, info.st_gid, mtime, content)
        if stat.S_ISDIR(info.st_mode):
            for name in content:
                visit(path / name, f"{rel}/{name}" if rel else name)

    visit(top, "")
    return found


def rootfs_layer(tar_path: Path) -> bytes:
    """A layer from a rootfs tarball (mmdebstrap's), as it is: with its device nodes (`/dev`'s,
    which the store skips, as debootstrap-made base images carry them)."""
    return tar_path.read_bytes()


def busybox_image(env: list[str]) -> Image:
    """An image without python3: the host's static busybox (Debian's busybox-static) as
    `/bin/busybox`, each of its applets a link to it in `/bin`, and an empty `/tmp`."""
    binary = shutil.which("busybox")
    if binary is None:
        raise RuntimeError("no busybox on PATH (apt-get install busybox-static)")
    applets = subprocess.run(
        [binary, "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    entries = [
        Entry("bin", kind="dir", mode=0o755),
        Entry("tmp", kind="dir", mode=0o1777),
        Entry("bin/busybox", data=Path(binary).read_bytes(), mode=0o755),
    ]
    entries += [  # its list names itself too
        Entry(f"bin/{name}", kind="symlink", target="busybox")
        for name in applets
        if name != "busybox"
    ]
    return Image([layer_bytes(entries)], env=env)


def bullseye_tar() -> Path:
    """A Debian bullseye minbase rootfs with python3 (3.9), built once with mmdebstrap."""
    return _rootfs_tar("bullseye-python3.tar", "bullseye", BULLSEYE_PACKAGES)


def interpreter_tar() -> Path:
    """A code-interpreter-shaped rootfs: Debian bookworm, python3, ipykernel and notebook.

    Its kernelspec named `python` (the real execd's) comes from `interpreter_image`'s layer.
    """
    return _rootfs_tar(
        "bookworm-jupyter-v3.tar", "bookworm", INTERPRETER_PACKAGES, *INTERPRETER_OPTIONS
    )


def _rootfs_tar(name: str, suite: str, packages: str, *options: str) -> Path:
    target = cache_dir() / name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # tox's parallel envs may all get here at once: one builds, the others wait for it
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            _mmdebstrap(target, suite, packages, options)
    return target


def _mmdebstrap(target: Path, suite: str, packages: str, options: Sequence[str]) -> None:
    partial = target.with_suffix(f".partial-{os.getpid()}.tar")
    subprocess.run(
        [
            "mmdebstrap",
            "--quiet",
            "--variant=minbase",
            f"--include={packages}",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            *options,
            suite,
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


OPENSSL_CERT = ("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2")
OPENSSL_CERT += ("-subj", "/CN=osb-test-token")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenService:
    """A registry token server on 127.0.0.1 (a port from bind(0)) for `USER` / `PASSWORD`.

    `GET /token?service=...&scope=repository:NAME:ACTIONS` with those credentials (basic auth)
    answers a JWT granting the actions asked; wrong credentials answer 401; none, a token
    granting nothing (anonymous). `issued` and `refused` count the answers.
    """

    SERVICE = "osb-test-registry"
    ISSUER = "osb-test-token-issuer"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.key = workdir / "token-key.pem"
        self.cert = workdir / "token-cert.pem"
        self.issued = 0
        self.refused = 0
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def realm(self) -> str:
        """The URL the registry sends clients to."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/token"

    def start(self) -> TokenService:
        """Make the key and certificate, then serve in a thread."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [*OPENSSL_CERT, "-keyout", str(self.key), "-out", str(self.cert)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = service.answer(self.path, self.headers.get("Authorization", ""))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def answer(self, path: str, authorization: str) -> tuple[int, dict[str, Any]]:
        """(status, JSON body) of a token request."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        subject = ""
        if authorization:
            scheme, _, encoded = authorization.partition(" ")
            try:
                user, _, password = base64.b64decode(encoded).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user = password = ""
            if scheme.lower() != "basic" or (user, password) != (USER, PASSWORD):
                self.refused += 1
                return 401, {"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]}
            subject = user
        access = []
        for scope in query.get("scope", []) if subject else []:
            kind_name, _, actions = scope.rpartition(":")
            kind, _, name = kind_name.partition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        token = self.sign(subject, access)
        self.issued += 1
        return 200, {"token": token, "access_token": token, "expires_in": 300}

    def sign(self, subject: str, access: list[dict[str, Any]]) -> str:
        """A JWT for `subject` granting `access`, signed RS256 with `openssl dgst`."""
        pem = self.cert.read_text().split("-----")[2]
        header = {"typ": "JWT", "alg": "RS256", "x5c": ["".join(pem.split())]}
        now = int(time.time())
        claims = {
            "iss": self.ISSUER,
            "sub": subject,
            "aud": self.SERVICE,
            "exp": now + 300,
            "nbf": now - 30,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        signing = ".".join(_b64url(json.dumps(part).encode()) for part in (header, claims))
        signature = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", str(self.key)],
            input=signing.encode(),
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout
        return f"{signing}.{_b64url(signature)}"

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class LoopbackRegistry:
    """A `docker-registry` on 127.0.0.1 (a port from bind(0)), optionally with basic auth.

    Args:
        workdir: where its storage and config go.
        basic_auth: require htpasswd basic auth for `USER` / `PASSWORD`.
        token: require bearer tokens of this (started) token service instead.
    """

    def __init__(
        self, workdir: Path, basic_auth: bool = False, token: TokenService | None = None
    ) -> None:
        self.workdir = workdir
        self.users = {USER: PASSWORD} if basic_auth or token else None
        self.token = token
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LoopbackRegistry:
        """Start it and wait until `/v2/` answers."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        auth = ""
        if self.token is not None:
            auth = (
                f"auth:\n  token:\n    realm: {self.token.realm}\n"
                f"    service: {self.token.SERVICE}\n    issuer: {self.token.ISSUER}\n"
                f"    rootcertbundle: {self.token.cert}\n"
            )
        elif self.users is not None:
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


# The kernelspec the real execd asks Jupyter for ("python"; Debian's ipykernel installs only
# "python3"), as the official code-interpreter image has it.
PYTHON_KERNELSPEC = {
    "argv": ["/usr/bin/python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
    "display_name": "Python",
    "language": "python",
}


def interpreter_image(env: list[str]) -> Image:
    """A code-interpreter-shaped image: `interpreter_tar` and a kernelspec named `python`."""
    spec = json.dumps(PYTHON_KERNELSPEC).encode()
    kernel = layer_bytes([Entry("usr/share/jupyter/kernels/python/kernel.json", data=spec)])
    return Image([rootfs_layer(interpreter_tar()), kernel], env=env)
