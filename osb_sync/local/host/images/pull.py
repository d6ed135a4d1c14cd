"""From an image URI to a `dir:` copy of one image, with skopeo, and what went wrong if not.

Sources (`parse`): a registry reference as Docker reads it (a short name is Docker Hub's:
`python:3.9` is `docker.io/library/python:3.9`; a `docker://` prefix is accepted), an OCI layout
`oci:/DIR[:TAG]` and a `docker save` archive `docker-archive:/FILE.tar`. Local sources are read
only under the directories the operator allows (`local_image_paths`): any API-key holder could
otherwise read a server-readable tarball as an image.

`skopeo copy` fetches one image for the platform asked for (the host's by default, so a
manifest list without it fails as Docker's pull does) into a `dir:` layout, which keeps the
manifest's bytes: its sha256 is the digest the registry serves (skopeo checks it against a
digest given in the reference), and every blob is checked against its digest by skopeo and
again by `unpack.py`.

What the operator's environment must not give a pull (`Puller.environment`): skopeo runs with
a private HOME, XDG dirs and DOCKER_CONFIG (so neither `~/.docker/config.json`,
`~/.config/containers/auth.json`, `$XDG_RUNTIME_DIR/containers/auth.json` nor
`REGISTRY_AUTH_FILE` are read) and `--authfile` naming either a file written for this pull
with the create's `image.auth` (never on a command line: other host users read those) or the
server's configured `registry_auth_file`, or an empty one. TLS is verified, except for loopback
registries and those the operator lists (`insecure_registries`), where skopeo may also speak
plain HTTP, as Docker does.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOCKER_HUB = "docker.io"
PULL_TIMEOUT = 900.0
INSTALL_SKOPEO = "install skopeo (Debian/Ubuntu: apt-get install skopeo)"
ARCHES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:]+\])(?::[0-9]{1,5})?"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
# Reasons of `PullError`, and which skopeo messages (lowercased) mean each one.
NOT_FOUND = "IMAGE_NOT_FOUND"
UNAUTHORIZED = "IMAGE_UNAUTHORIZED"
NO_PLATFORM = "IMAGE_PLATFORM_UNAVAILABLE"
NETWORK = "IMAGE_REGISTRY_UNREACHABLE"
REFUSED = "IMAGE_REFUSED"
TOO_LARGE = "IMAGE_TOO_LARGE"  # past the image size limit (unpack.SizeLimit): a 413
TOOL_MISSING = "IMAGE_TOOL_MISSING"
PULL_FAILED = "IMAGE_PULL_FAILED"
# A pull's progress: (phase "download" or "unpack", bytes so far, total bytes or None).
Progress = Callable[[str, int, "int | None"], None]
PROGRESS_INTERVAL = 0.2  # seconds between two progress calls while skopeo downloads
CLASSES = (
    (NO_PLATFORM, ("no image found in image index", "no image found in manifest list")),
    (UNAUTHORIZED, ("unauthorized", "authentication required", "denied", "401", "403")),
    (NOT_FOUND, ("manifest unknown", "name unknown", "not found", "no such file", "404")),
    (
        NETWORK,
        (
            "connection refused",
            "no such host",
            "i/o timeout",
            "dial tcp",
            "tls",
            "certificate",
            "network is unreachable",
            "pinging container registry",
        ),
    ),
)


class PullError(Exception):
    """An image that cannot be had; `reason` is one of this module's reason names."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Source:
    """Where an image comes from.

    Attributes:
        transport: "docker", "oci" or "docker-archive".
        name: for a registry, `host/path` (`docker.io/library/python`); else the local path.
        tag: the tag (a registry's, or the OCI layout's ref name), "" for none.
        digest: a `sha256:...` pinned in the reference, "" for none.
    """

    transport: str
    name: str
    tag: str = ""
    digest: str = ""

    @property
    def host(self) -> str:
        """The registry's host[:port] ("" for a local source)."""
        return self.name.split("/", 1)[0] if self.transport == "docker" else ""

    @property
    def canonical(self) -> str:
        """The full reference (`docker.io/library/python:3.9`, `oci:/dir:tag`)."""
        if self.transport == "docker":
            return (
                self.name
                + (f":{self.tag}" if self.tag else "")
                + (f"@{self.digest}" if self.digest else "")
            )
        return f"{self.transport}:{self.name}" + (f":{self.tag}" if self.tag else "")

    def skopeo_ref(self) -> str:
        """The reference as skopeo's transports spell it."""
        if self.transport == "docker":
            return f"docker://{self.canonical}"
        return self.canonical


def parse(uri: str) -> Source:
    """The source an image URI names.

    Raises:
        ValueError: not a reference skopeo could read (what is wrong, in the URI's terms).
    """
    if uri.startswith(("oci:", "docker-archive:")):
        transport, _, rest = uri.partition(":")
        path, _, tag = rest.partition(":") if transport == "oci" else (rest, "", "")
        if not path.startswith("/") or "\0" in path:
            raise ValueError(f"{transport}: sources need an absolute path ({transport}:/PATH)")
        if tag and not re.fullmatch(_TAG, tag):
            raise ValueError(f"{tag!r} is not a valid tag")
        return Source(transport, os.path.normpath(path), tag)
    ref = uri[len("docker://") :] if uri.startswith("docker://") else uri
    match = re.fullmatch(rf"(?:({_HOST})/)?({_PATH})(?::({_TAG}))?(?:@({_DIGEST}))?", ref)
    if match is None:
        raise ValueError(
            f"{uri!r} is not an image reference ([REGISTRY/]NAME[:TAG][@sha256:DIGEST],"
            " oci:/DIR[:TAG] or docker-archive:/FILE)"
        )
    host, path, tag, digest = match.groups()
    if host is not None and not ("." in host or ":" in host or host == "localhost"):
        path, host = f"{host}/{path}", None  # `library/python`: a path, not a registry
    if host is None or host in ("index.docker.io", "registry-1.docker.io"):
        host = DOCKER_HUB
        if "/" not in path:
            path = f"library/{path}"
    return Source("docker", f"{host}/{path}", tag or ("" if digest else "latest"), digest or "")


def is_loopback(host: str) -> bool:
    """True for `localhost`, 127.0.0.0/8 and ::1 (with or without a port)."""
    name = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_platform() -> dict[str, str]:
    """This host's platform as OCI names it (`{"os": "linux", "arch": "amd64"}`)."""
    machine = os.uname().machine
    return {"os": "linux", "arch": ARCHES.get(machine, machine)}


def classify(stderr: str) -> str:
    """The reason a failed skopeo's message means (`PULL_FAILED` when none matches)."""
    text = stderr.lower()
    for reason, needles in CLASSES:
        for needle in needles:
            # a status code only as a word of its own: a port or request id holds digits too
            # (127.0.0.1:55403 is no 403)
            if re.search(rf"\b{needle}\b", text) if needle.isdigit() else needle in text:
                return reason
    return PULL_FAILED


def _skopeo_message(stderr: str) -> str:
    """skopeo's own words without its log prefix (`time=... level=fatal msg="..."`)."""
    found = re.findall(r'msg="((?:[^"\\]|\\.)*)"', stderr)
    text = found[-1].replace('\\"', '"') if found else stderr.strip()
    return text[-600:] or "no output"


@dataclass(frozen=True)
class Puller:
    """Runs skopeo for the server (see the module docstring).

    Attributes:
        scratch: a private directory (the store's) for skopeo's HOME and auth files.
        insecure_registries: host[:port]s where TLS is not verified (besides loopback).
        auth_file: the operator's own auth file (containers' auth.json format), or None.
        local_paths: directories under which `oci:` and `docker-archive:` sources may be read.
    """

    scratch: Path
    insecure_registries: tuple[str, ...] = ()
    auth_file: Path | None = None
    local_paths: tuple[Path, ...] = ()

    def check_source(self, source: Source) -> None:
        """Refuse a local source outside `local_paths`.

        Raises:
            PullError: REFUSED, naming the setting that allows it.
        """
        if source.transport == "docker":
            return
        path = Path(os.path.realpath(source.name))
        if not any(path == root or root in path.parents for root in self.local_paths):
            raise PullError(
                REFUSED,
                f"{source.transport}: images are read only under the server's local image"
                " paths (LocalServer(local_image_paths=...), osb-sync serve"
                " --allow-image-path DIR); none contains it",
            )

    def environment(self) -> dict[str, str]:
        """skopeo's environment: PATH and proxies from the server's, everything else private."""
        home = self.scratch / "skopeo-home"
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_RUNTIME_DIR": str(home / "run"),
            "DOCKER_CONFIG": str(home / "docker"),
            "LC_ALL": "C",
        }
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy"):
            if name in os.environ:
                env[name] = os.environ[name]
        return env

    def command(
        self, source: Source, target: Path, platform: dict[str, str], auth_file: Path
    ) -> list[str]:
        """The `skopeo copy` command line (no secret on it)."""
        return self._skopeo(source, platform, auth_file, "copy", f"dir:{target}")

    def _skopeo(
        self, source: Source, platform: dict[str, str], auth_file: Path, verb: str, *rest: str
    ) -> list[str]:
        """A `skopeo copy` or `inspect` command line for `source` (no secret on it)."""
        tool = shutil.which("skopeo")
        if tool is None:
            raise PullError(TOOL_MISSING, f"pulling images needs skopeo: {INSTALL_SKOPEO}")
        command = [tool, "--override-os", platform.get("os", "linux")]
        arch = platform.get("arch", host_platform()["arch"])
        variant = ""
        if "/" in arch:
            arch, variant = arch.split("/", 1)
        command += ["--override-arch", arch]
        if variant:
            command += ["--override-variant", variant]
        if not Path("/etc/containers/policy.json").exists():
            command.append("--insecure-policy")  # no signature policy configured: none to apply
        command += [verb, *(["--quiet"] if verb == "copy" else [])]
        command += ["--retry-times", "1", "--authfile", str(auth_file)]
        if source.transport == "docker":
            insecure = is_loopback(source.host) or source.host in self.insecure_registries
            flag = "--src-tls-verify" if verb == "copy" else "--tls-verify"
            command.append(f"{flag}={'false' if insecure else 'true'}")
        return [*command, source.skopeo_ref(), *rest]

    def _total(self, source: Source, platform: dict[str, str], auth_file: Path) -> int | None:
        """The bytes of the image's layers (its manifest's, by `skopeo inspect --raw`; from a
        manifest list, the platform's), or None when it cannot say."""
        ref = source.skopeo_ref()
        try:
            for _ in range(2):  # a manifest list, then the platform's manifest
                done = subprocess.run(
                    [*self._skopeo(source, platform, auth_file, "inspect")[:-1], "--raw", ref],
                    env=self.environment(),
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=60,
                )
                manifest = json.loads(done.stdout)
                if "layers" in manifest:
                    return sum(int(layer.get("size") or 0) for layer in manifest["layers"]) or None
                wanted = (platform.get("os", "linux"), platform.get("arch", ""))
                chosen = [
                    m["digest"]
                    for m in manifest.get("manifests") or []
                    if (m.get("platform", {}).get("os"), m.get("platform", {}).get("architecture"))
                    == wanted
                ]
                if not chosen or source.transport != "docker":
                    return None
                ref = f"docker://{source.name}@{chosen[0]}"
        except (OSError, ValueError, AttributeError, TypeError, KeyError):
            return None  # no usable manifest: the bar shows bytes only
        except (subprocess.TimeoutExpired, PullError):
            return None  # the copy that follows says what is wrong
        return None

    def _auth(self, source: Source, auth: dict[str, Any] | None, folder: Path) -> Path:
        """The `--authfile` of this pull: the create's credentials, the operator's, or none."""
        if auth and source.transport == "docker":
            token = f"{auth.get('username', '')}:{auth.get('password', '')}"
            hosts = {source.host}
            if source.host == DOCKER_HUB:
                hosts.add("https://index.docker.io/v1/")
            entries = {h: {"auth": base64.b64encode(token.encode()).decode()} for h in hosts}
            path = folder / "auth.json"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump({"auths": entries}, out)
            return path
        if self.auth_file is not None:
            return self.auth_file
        path = folder / "empty-auth.json"
        path.write_text('{"auths": {}}')
        return path

    def copy(
        self,
        source: Source,
        target: Path,
        platform: dict[str, str],
        auth: dict[str, Any] | None = None,
        progress: Progress | None = None,
    ) -> str:
        """Copy the image into `target` (a `dir:` layout, made here); its manifest digest.

        Args:
            source: what to pull (`check_source` first).
            target: a directory that does not exist yet.
            platform: `{"os", "arch"}` to choose from a manifest list.
            auth: the create's `image.auth` (`username`, `password`), or None.
            progress: called with the bytes downloaded so far, every `PROGRESS_INTERVAL`
                seconds (and the layers' total, from `skopeo inspect`, when it tells).

        Raises:
            PullError: the reason and skopeo's message (never the credentials).
        """
        self.check_source(source)
        self.scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.scratch, prefix="auth-") as folder:
            auth_file = self._auth(source, auth, Path(folder))
            command = self.command(source, target, platform, auth_file)
            total = self._total(source, platform, auth_file) if progress is not None else None
            with open(Path(folder) / "stderr", "w+b") as errors:
                proc = subprocess.Popen(
                    command,
                    env=self.environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                )
                deadline = time.monotonic() + PULL_TIMEOUT
                while proc.poll() is None:
                    if time.monotonic() > deadline:
                        proc.kill()
                        proc.wait()
                        raise PullError(
                            NETWORK,
                            f"{source.canonical} was not pulled within {PULL_TIMEOUT:.0f} s",
                        )
                    if progress is not None:
                        progress("download", _tree_size(target), total)
                    try:
                        proc.wait(PROGRESS_INTERVAL)
                    except subprocess.TimeoutExpired:
                        pass
                errors.seek(0)
                stderr = errors.read().decode(errors="replace")
        if proc.returncode != 0:
            raise PullError(classify(stderr), f"{source.canonical}: {_skopeo_message(stderr)}")
        if progress is not None:
            progress("download", _tree_size(target), total)
        try:
            manifest = (target / "manifest.json").read_bytes()
        except OSError as exc:
            raise PullError(PULL_FAILED, f"skopeo wrote no manifest: {exc}") from None
        # A digest in the reference is checked by skopeo against what it names (a manifest
        # list's, when it names one); this is the digest of the image chosen from it.
        return "sha256:" + hashlib.sha256(manifest).hexdigest()


def _tree_size(path: Path) -> int:
    """The bytes of the files under `path` (0 while it does not exist)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total
