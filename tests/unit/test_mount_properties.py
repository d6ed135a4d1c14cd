"""bwrap is led nowhere outside an image's root by its links and a create's volumes (issue 37,
after the attack: findings 1 to 3), checked with hypothesis (bounded and derandomized: see
tests/properties.py).

Each example is an image's root with links (at the server's mount points and elsewhere: to
`/`, into procfs and `/dev`, to `/oldroot/...`, to other mount points), volumes whose content a
sandbox wrote (links to `/oldroot/...`, named as the server's mount points) and a WorkingDir;
`image_options` gives bwrap's options, or refuses. Then a child process does what bwrap does
with them, by the same system calls, in a world of its own: a private mount namespace,
chrooted into a directory holding `newroot` (the image's root) and `oldroot` (the host: here a
decoy); each mount point made with `mkdir -p` or `creat` through whatever links are there, then
procfs, a tmpfs, `/dev`'s links or the source mounted on it. The kernel resolves every path,
as it does for bwrap. Every mount point must be below `/newroot` and nothing of the decoy may
change. Root only (a mount namespace, chroot), as CI runs the tox envs. The attack's findings
are explicit examples besides the generated ones.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from osb_sync.local.host import bwrap, volumes
from osb_sync.local.host.errors import FieldError, VolumeError
from osb_sync.local.host.images.config import ConfigError, ImageConfig
from osb_sync.local.host.images.rootfs import image_options
from osb_sync.local.host.images.store import StoredImage
from tests.imagekit import snapshot
from tests.properties import bounded

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace and chroot need root")

CLONE_NEWNS = 0x20000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 1 << 18
BINDS = frozenset(("--bind", "--ro-bind", "--bind-try", "--ro-bind-try", "--dev-bind"))
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "core": "/proc/kcore"}
DEV_LINKS["ptmx"] = "pts/ptmx"

# Links of an image: at the server's mount points and elsewhere, to what leads out.
NAMES = ("proc", "dev", "run", "opt", "etc", "data", "x", "w")
TARGETS = ("/", ".", "/self/root/oldroot/t", "/proc/self/root/oldroot/t", "/oldroot/t")
TARGETS += ("../oldroot/t", "/data", "/data/sub", "/run", "/opt/osb-sync", "/dev/fd", "/proc")
# What a sandbox wrote in every volume: names of the server's mount points and their parents,
# each a link to the decoy (a directory there, or a file's name there).
PLANTED = ("w", "sub", "y", "app", "osb-execd", "osb-oom-control", "osb-sync", "execd", "lib")
WORKDIRS = ("/", "/w/x", "/workspace/app", "/data/app", "/x/y/z", "/../oldroot/t/x")
WORKDIRS += ("/proc/self/root/oldroot/t/x",)

single = st.tuples(st.sampled_from(NAMES), st.sampled_from(TARGETS)).map(lambda link: [link])
# procfs at `/` needs a second link to lead through it
through_procfs = st.builds(
    lambda root, name: [("proc", root), (name, "/self/root/oldroot/t")],
    st.sampled_from(("/", ".", "..", "/etc/..")),
    st.sampled_from(("dev", "run", "opt")),
)
# a volume's mountPath (`/data`) moved onto the server's own
moved_volume = st.sampled_from(("/", ".", "/run", "/opt", "/opt/osb-sync", "/proc", "/dev"))
moved_volume = moved_volume.map(lambda target: [("data", target)])
links = st.lists(st.one_of(single, through_procfs, moved_volume), max_size=3).map(
    lambda moves: list({name: target for move in moves for name, target in move}.items())
)
mount_paths = st.lists(
    st.sampled_from(("/data", "/data/sub/y", "/x/y", "/workspace", "/w")), max_size=2, unique=True
)


def _world(top: Path, links: Sequence[tuple[str, str]]) -> None:
    """`top/newroot` (the image's root), `top/oldroot` (the decoy host), `top/vols/*`."""
    root = top / "newroot"
    names = {name for name, _ in links}
    for folder in ("usr/bin", "etc", "srv", "run", "opt", "var"):
        if not any(folder == n or folder.startswith(n + "/") for n in names):
            (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "usr/bin/python3").write_bytes(b"")
    for name, target in links:  # (never through a link: `/` is the host's here)
        *folders, base = name.split("/")
        where = root
        for folder in folders:
            where = where / folder
            if where.is_symlink():
                break
            where.mkdir(exist_ok=True)
        else:
            if not os.path.lexists(where / base):
                (where / base).symlink_to(target)
    decoy = top / "oldroot"
    (decoy / "t").mkdir(parents=True)
    (decoy / "t").chmod(0o777)
    (decoy / "t" / "f").write_bytes(b"host's")
    (decoy / ".decoy").write_bytes(b"")
    for name in ("a", "b"):
        (top / "vols" / name).mkdir(parents=True)
        for link in PLANTED:  # (a file's mount point is made by creat: through a link too)
            file = link in ("osb-oom-control", "execd")
            (top / "vols" / name / link).symlink_to(f"/oldroot/t/{link}" if file else "/oldroot/t")


def _in_world(top: Path, options: list[str]) -> list[tuple[str, list[str | None]]]:
    """bwrap's `options`, each a (name, arguments), its sources made paths of the world: a
    source outside it becomes a stand-in of its kind (None: missing)."""
    out: list[tuple[str, list[str | None]]] = []
    index, made = 0, 0
    while index < len(options):
        name = options[index]
        count = bwrap.OPTION_ARGS[name][0]
        args: list[str | None] = list(options[index + 1 : index + 1 + count])
        index += 1 + count
        source = args[0] if name in BINDS else None
        if source is not None and source.startswith(f"{top}/"):
            args[0] = source[len(str(top)) :]
        elif source is not None and os.path.lexists(source):
            made += 1
            stand_in = top / "sources" / str(made)
            stand_in.parent.mkdir(exist_ok=True)
            if os.path.isdir(source):
                stand_in.mkdir()
            else:
                stand_in.write_bytes(b"")
            args[0] = f"/sources/{made}"
        elif source is not None:
            args[0] = None
        out.append((name, args))
    return out


def _bwrap(options: list[tuple[str, list[str | None]]]) -> None:
    """What bwrap does with `options` in the mount namespace of `/newroot`, up to its first
    failure (where bwrap dies); exit 2 at a mount point that is not below `/newroot`."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

    def mount(source: str | None, target: str, kind: str | None, flags: int = 0) -> None:
        encoded = [None if v is None else v.encode() for v in (source, target, kind)]
        if libc.mount(*encoded, flags, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount {target}")

    def made(path: str) -> None:  # the path resolved as the kernel does, in this world
        if not (os.path.realpath(path) + "/").startswith("/newroot/"):
            print(f"bwrap would have made {path} at {os.path.realpath(path)}", file=sys.stderr)
            os._exit(2)

    rooted = False
    for name, args in options:
        if name in ("--chdir", "--remount-ro") or bwrap.OPTION_ARGS[name][1] is None:
            continue
        dest = args[-1]
        assert dest is not None
        target = "/newroot" + dest
        try:
            if name in BINDS:
                source = args[0]
                if source is None:
                    continue  # (-try: missing)
                if dest == "/" and not rooted:
                    rooted = True  # the image's root, /newroot itself
                    continue
                if os.path.isdir(source):
                    os.makedirs(target, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
                made(target)
                mount(source, target, None, MS_BIND | MS_REC)
            elif name in ("--bind-data", "--ro-bind-data", "--file"):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
                made(target)
            elif name == "--proc":
                os.makedirs(target, exist_ok=True)
                made(target)
                mount("proc", target, "proc")
            elif name in ("--dev", "--tmpfs", "--mqueue"):
                os.makedirs(target, exist_ok=True)
                made(target)
                mount("tmpfs", target, "tmpfs")
                if name == "--dev":
                    for folder in ("shm", "pts"):
                        os.mkdir(f"{target}/{folder}")
                    for link, to in DEV_LINKS.items():
                        os.symlink(to, f"{target}/{link}")
            elif name == "--dir":
                os.makedirs(target, exist_ok=True)
                made(target)
        except OSError:
            return


def _as_bwrap(top: Path, options: list[tuple[str, list[str | None]]]) -> int:
    """Run `_bwrap` in a child chrooted into `top` with a mount namespace of its own; its exit
    status (0: it ran, 2: it led bwrap out)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            if (
                libc.unshare(CLONE_NEWNS) != 0
                or libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0
            ):
                os._exit(3)
            os.chroot(top)
            os.chdir("/")
            if os.path.exists("/oldroot/.decoy"):  # (else not chrooted: do nothing)
                _bwrap(options)
                code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@bounded(200)
@given(links, mount_paths, st.sampled_from(WORKDIRS))
@example([("proc", "/"), ("dev", "/self/root/oldroot/t")], [], "/")  # the attack's 1
@example([("data", "/")], ["/data"], "/w/x")  # its 2
@example([("data", "/run")], ["/data"], "/")  # its 2: the OOM counter
@example([], ["/data", "/data/sub/y"], "/")  # its 3
def test_bwrap_is_led_nowhere_outside_the_images_root(
    links: list[tuple[str, str]], mount_paths: list[str], workdir: str
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        top = Path(scratch)
        _world(top, links)
        before = snapshot(top / "oldroot")
        claims = [
            {"name": name, "host": {"path": str(top / "vols" / name)}, "mountPath": path}
            for name, path in zip("ab", mount_paths, strict=False)
        ]
        image = StoredImage(
            "sha256:0", "x", top, ImageConfig(working_dir=workdir), "/usr/bin/python3", 0
        )
        (top / "state").mkdir()
        (top / "file").write_bytes(b"")  # the execd binary, the OOM counter
        extra = ["--ro-bind", str(top / "file"), "/opt/opensandbox/execd"]
        extra += ["--ro-bind-try", str(top / "file"), "/run/osb-oom-control"]
        layer: Any = SimpleNamespace(root=top / "newroot")
        try:
            binds = volumes.mounts(claims, (top / "vols",), top, isolated=True)
        except (FieldError, VolumeError):
            return  # refused: nothing made
        try:
            sources = [claim["host"]["path"] for claim in claims]
            mounts = [
                a for s, b in zip(sources, binds, strict=True) for a in ("--bind", s, b.target)
            ]
            options = image_options(layer, image, top / "state", 3, mounts, extra, binds)
        except (ConfigError, VolumeError):
            return
        finally:
            volumes.close(binds)
        assert _as_bwrap(top, _in_world(top, options)) == 0
        assert snapshot(top / "oldroot") == before
