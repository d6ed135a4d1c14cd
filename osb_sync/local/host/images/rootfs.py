"""A sandbox's root over an image: a writable layer on the shared image, and its bwrap view.

The layer (`Layer`): an overlay (the store's rootfs below, the sandbox's own upper and work
directories in its run directory) where the server may mount one (it has CAP_SYS_ADMIN: root,
as in CI), else a copy of the image (`cp -a --reflink=auto`: instant on btrfs and xfs, a real
copy elsewhere). bwrap 0.8 has no `--overlay`, and mounting one inside the sandbox's own user
namespace needs a step between its namespaces and its exec that bwrap does not offer: that
mount waits for the user namespace the sandbox id range brings. Overlay mounts are nosuid and
nodev; a server that dies leaves its mounts to the crash recovery of the next start.

The view (`image_options`) is the image's root as the container's `/`, writable, with
`/proc` (masked as Docker's), `/dev`, execd's state directory, our package read-only at
`bwrap.PACKAGE_VIEW`, the host's `resolv.conf` and `hosts` (as Docker gives them), the
sandbox's volume binds and the image's WorkingDir (its User is execd's to switch to: the
container's root is the range's root, `bwrap.identity_options`).

bwrap makes every mount point and directory of that view while the host's root is still its
`/oldroot` and the image's root its `/newroot`, following whatever links it meets: an image's
`srv -> /oldroot/tmp`, or a WorkingDir of `/../oldroot/tmp/x`, would have it make directories
on the host, as the range's root. So every destination of the options `image_options` builds
(read from the list itself, `confine`: a mount added later is covered) is resolved inside the
image's root as the container sees it (`config.locate`), in the order bwrap makes them, and
bwrap gets a path without a link in it, whose missing components it makes in the image's root.
The rule: bwrap makes nothing through what is not the image's root as unpacked, nor through
what a sandbox may write. So:

- No mount lands on `/` but the image's root itself (`proc -> /` would put procfs there, and
  `/self/root` of it leads out).
- Below a mount made earlier nothing is the image's: the server's own mounts there (/proc's
  masks) are kept as written, a directory made there or a path an image's link leads there is
  refused (procfs' `/proc/self/root` leads out), as is a path with a file in the middle:
  `IMAGE_CONFIG_INVALID`, naming the path. An image's link may move the server's mounts within
  its root (`run -> /` puts the state directory at `/osb-execd`, which the container sees at
  `/run/osb-execd`): that leaves nothing.
- The volumes come last (their content is a sandbox's to write): after the server's mounts and
  the WorkingDir's `--dir`, and one lands neither on `/`, nor at, above or below a mount made
  before it (the server's, or another volume: `volumes.py` refuses nested mountPaths as
  written; here, where the image's links lead them), nor where `volumes.clash` says no volume
  may be: `INVALID_MOUNT_PATH` (a `VolumeError`), naming both.
- A WorkingDir in a volume, as the container sees it, is made in the volume by descriptor
  (`volumes.make_inside`) instead of by bwrap; `--chdir` is not resolved here at all: bwrap
  changes directory after `pivot_root`, with the host detached, in the container's own view.

The container's main process (relay, claim, liveness: `execd/main.py`) is forked by the execd
template (`ImageView.template`: where the image has the placeholder's shells), or runs on the
image's python3; either way the sandbox's code contexts run on that python3 (`ImageView.python`).
An image without one (it then runs the real execd binary) gets the server's own
interpreter instead (`host_interpreter`): its prefix and the directories of its libraries,
read-only under `HOST_VIEW`, started by the host's dynamic loader with those directories as
its library path, so that nothing of the image's `/lib` is needed and nothing leaks into the
environment of the processes it starts. That is the read-only host view every default
sandbox has, under another path.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import stat
import struct
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from errno import EINVAL, ENOENT
from pathlib import Path
from typing import ClassVar

from .. import bwrap, volumes
from ..rootview import Places
from .config import ConfigError, Located, is_executable, locate, resolve_in_root
from .inside import RangeWork
from .store import StoredImage, hold

HOST_VIEW = f"{bwrap.OWN_DIR}/host"  # the server's interpreter, for images without python3
PLACEHOLDER_SHELLS = ("/bin/sh", "/bin/bash")  # `execd_template.placeholder`'s, in the image
PT_INTERP = 3
MS_NOSUID = 2
MS_NODEV = 4
MNT_DETACH = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class Layer:
    """The writable root of one sandbox over `image`, made under `run_dir`.

    Raises (at construction):
        OSError: neither an overlay nor a copy could be made.
    """

    def __init__(self, image: StoredImage, run_dir: Path, inside: RangeWork | None = None) -> None:
        self.root = run_dir / "root"
        self.kind = "copy"
        self._mounted = False
        self._inside = inside
        lower = str(image.rootfs)
        upper, work = run_dir / "upper", run_dir / "work"
        if os.geteuid() == 0 and not any(c in lower + str(run_dir) for c in ",:\\"):
            for folder in (self.root, upper, work):
                folder.mkdir(mode=0o755)
            # the merged root is the upper's: the image's root owns it (as in the image), so
            # the sandbox's root (and bwrap, making mount points) can write at `/`
            below = os.stat(lower)
            os.chown(upper, below.st_uid, below.st_gid)
            os.chmod(upper, below.st_mode & 0o7777)
            data = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
            if (
                _libc.mount(b"overlay", bytes(self.root), b"overlay", MS_NOSUID | MS_NODEV, data)
                == 0
            ):
                self.kind, self._mounted = "overlay", True
                return
            self.root.rmdir()
        if inside is not None:  # the image's owners are the range's (`inside.py`)
            try:
                inside.copy(image.rootfs, self.root, (run_dir.parent, run_dir))
            except OSError:  # what it copied is the range's: the user could not remove it
                if os.path.lexists(self.root):
                    with contextlib.suppress(OSError):
                        inside.remove(self.root)
                raise
            return
        done = subprocess.run(
            ["cp", "-a", "--reflink=auto", lower, str(self.root)], capture_output=True
        )
        if done.returncode != 0:
            raise OSError(f"the image could not be copied: {done.stderr.decode(errors='replace')}")

    def close(self) -> None:
        """Unmount the overlay (if any); the run directory's removal takes the rest. One on
        a sandbox's tmpfs left the server's namespace with it (`container._detach_disk`)."""
        if self._mounted:
            if _libc.umount2(bytes(self.root), MNT_DETACH) != 0:
                errno = ctypes.get_errno()
                if errno not in (EINVAL, ENOENT):  # not a mount point (any longer)
                    raise OSError(errno, f"umount {self.root}: {os.strerror(errno)}")
            self._mounted = False

    def remove(self) -> None:
        """Unmount and delete the layer (its files may be read-only)."""
        self.close()
        for name in ("root", "upper", "work"):
            path = self.root.parent / name
            if path.exists() and self._inside is not None:
                with contextlib.suppress(OSError):
                    self._inside.remove(path)
            if path.exists():  # rm: a tree of any depth (its sandbox nests at will)
                subprocess.run(["chmod", "-R", "u+rwX", "--", str(path)], capture_output=True)
                argv = ["rm", "-rf", "--one-file-system", "--", str(path)]
                subprocess.run(argv, capture_output=True)


@dataclass(frozen=True)
class ImageView:
    """The root of a sandbox that runs `image`: a writable layer over it (`Layer`) and its view
    (`image_options`); what execd starts runs as the image's User, `ids` (uid, gid).

    One of the two root views (`rootview.RootView`), `rootview.HostView` the other.
    """

    image: StoredImage
    ids: tuple[int, int] = (0, 0)
    inside: RangeWork | None = None  # a server that is not root: its range's copies
    system: ClassVar[str] = "a writable image root"

    @property
    def template(self) -> bool:
        """Whether the execd template may fork its execd (the server's interpreter, its code
        contexts on the image's python3: `python`): where the image has the shells bwrap's
        placeholder runs on (`execd_template.placeholder`: /bin/sh, or /bin/bash for a server
        that is not root). Else its execd runs on the image's python3, as bwrap starts it."""
        root = self.image.rootfs
        return all(is_executable(root, shell) for shell in PLACEHOLDER_SHELLS)

    @property
    def python(self) -> str | None:
        """What runs its code contexts: the image's python3 (the image asked for runs the
        user's code, whatever runs execd)."""
        return self.image.python

    @property
    def user(self) -> tuple[int, int] | None:
        """The image's User, for what execd starts (None: root)."""
        return self.ids if any(self.ids) else None

    def identity_files(self) -> tuple[bytes, bytes] | None:
        """None: the image keeps its own /etc/passwd and /etc/group."""
        return None

    def options(
        self,
        places: Places,
        info_fd: int,
        ident: Sequence[str],
        extra: Sequence[str],
        mounts: Sequence[str],
        binds: Sequence[volumes.Bind],
        held: contextlib.ExitStack,
    ) -> tuple[list[str], str]:
        """bwrap's options (`image_options`) over a layer made in `places.data`, and what the
        status says of the image; the image's hold and the layer go with `held`.

        Raises:
            OSError: the layer could not be made.
            The errors of `image_options`.
        """
        held.callback(os.close, hold(self.image))  # against the store's eviction
        layer = Layer(self.image, places.data, self.inside)
        held.callback(layer.close if places.tmpfs else layer.remove)  # a tmpfs takes the files
        options = image_options(
            layer, self.image, places.state, info_fd, mounts, extra, binds, ident
        )
        python = self.image.python or "no python3: the server's interpreter runs its main process"
        return options, f" Image: {self.image.pinned} ({python}), writable layer: {layer.kind}."

    def home(self, plain_home: str | None) -> str:
        """Where execd runs commands by default: the image's WorkingDir."""
        return self.image.config.working_dir or "/"

    def environment(self, sandbox_env: dict[str, str], plain_home: str | None) -> dict[str, str]:
        """The image's Env, as Docker gives it (HOME: root's, unless the image sets it), then
        the sandbox's own."""
        home = "/root" if self.ids[0] == 0 else "/"
        config = self.image.config
        return {"HOME": home, **config.environment, "PWD": self.home(None), **sandbox_env}

    def main_command(self, script: str) -> list[str]:
        """The container's main process: `script` on the image's python3 (`main_interpreter`)."""
        return [*main_interpreter(self.image), "-I", "-S", bwrap.in_container(script)]

    def entrypoint(self, given: list[str]) -> list[str]:
        """The entrypoint a sandbox runs: the create's, else the image's Entrypoint + Cmd."""
        return self.image.config.effective_entrypoint(given)


def image_options(
    layer: Layer,
    image: StoredImage,
    state: Path,
    info_fd: int,
    mounts: Sequence[str] = (),
    extra: Sequence[str] = (),
    binds: Sequence[volumes.Bind] = (),
    ident: Sequence[str] = ("--cap-drop", "ALL"),
) -> list[str]:
    """The bwrap options of a sandbox running `image` in `layer` (see the module docstring):
    `bwrap.confined`'s, with the image's root as `/`.

    Args:
        mounts: the sandbox's volumes' options, one for each of `binds`, in their order.
        extra: options of the server's own (an execd binary's binds, the OOM counter's).
        ident: `bwrap.identity_options`.

    Raises:
        ConfigError: a destination the image's root makes impossible (`confine`).
        VolumeError: a volume the image's links lead where no volume may be (`confine`),
            or its WorkingDir missing in a read-only volume.
    """
    root = layer.root
    path = {"PATH": image.config.environment.get("PATH", "")}
    options = bwrap.confined(info_fd, ident, path, ["--bind", str(root), "/"], [])
    etc = resolve_in_root(root, "/etc")
    if etc is not None and root.joinpath(*etc.parts[1:]).is_dir():  # (no link left in `etc`)
        for name in ("resolv.conf", "hosts"):
            options += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    options += ["--bind", str(state), bwrap.EXECD_STATE_DIR]
    # its parent searchable by all (bwrap would make it 0700): an image's User runs it too
    parent = os.path.dirname(bwrap.PACKAGE_VIEW)
    options += ["--perms", "0755", "--dir", parent]
    options += ["--ro-bind", bwrap.package_dir(), bwrap.PACKAGE_VIEW]
    if image.python is None:
        options += host_interpreter()[0]
    options += extra
    workdir = image.config.working_dir or "/"
    held = _in_volume(root, workdir, binds)
    if held is None and workdir != "/":
        options += ["--dir", workdir]  # Docker makes a missing WorkingDir too
    options = confine(root, [*options, *mounts], [bind.name for bind in binds])
    if held is not None:  # in the volume (bwrap would make it in the image, under the mount)
        volumes.make_inside(*held, f"the image's WorkingDir {workdir!r}")
    return [*options, "--chdir", workdir]


def _in_volume(
    root: Path, workdir: str, binds: Sequence[volumes.Bind]
) -> tuple[volumes.Bind, tuple[str, ...]] | None:
    """The volume the WorkingDir `workdir` is in, as the container sees it, and its place
    there (components); None when it is the image's."""
    targets = {str(locate(root, bind.target).path): bind for bind in binds}
    found = locate(root, workdir, targets)
    target = found.below or str(found.path)
    if target not in targets:
        return None
    return targets[target], found.path.relative_to(target).parts


DIRECTORIES = frozenset(("--dir", "--proc", "--dev", "--tmpfs", "--mqueue"))
KEPT_BELOW_MOUNTS = bwrap.MOUNTS | {"--remount-ro"}  # as written, when written so


def confine(root: Path, options: Sequence[str], names: Sequence[str] = ()) -> list[str]:
    """`options` with each destination resolved inside the image's root `root` (see the
    module docstring; `bwrap.OPTION_ARGS` says which arguments are destinations), in the
    order bwrap makes them; the last `len(names)` options are the volumes of those names.

    Raises:
        ConfigError: a destination the image makes impossible, named.
        VolumeError: `INVALID_MOUNT_PATH`, a volume the image's links lead at, above or below
            another mount, or onto what no volume may cover.
        ValueError: an option bwrap 0.8 does not have, or `--symlink` (a link made there
            would be followed by what comes after it, unseen here).
    """
    out = list(options)
    starts: list[int] = []  # where each option is
    index = 0
    while index < len(out):
        if out[index] not in bwrap.OPTION_ARGS or out[index] == "--symlink":
            raise ValueError(f"confine: no rule for the bwrap option {out[index]!r}")
        starts.append(index)
        index += 1 + bwrap.OPTION_ARGS[out[index]][0]
    volume_at = dict(zip(starts[len(starts) - len(names) :], names, strict=True)) if names else {}
    mounted: list[tuple[str, str | None]] = []  # each mount's path and volume (None: ours)
    rooted = False  # the image's root is mounted (the first mount, at `/`)
    for start in starts:
        name = out[start]
        place = bwrap.OPTION_ARGS[name][1]
        if place is None or name == "--chdir":  # (bwrap chdirs in the container's own view)
            continue
        given = out[start + 1 + place]
        found = locate(root, given, [path for path, _ in mounted])
        path = str(found.path)
        volume = volume_at.get(start)
        if volume is not None:
            _check_volume(volume, given, found, mounted)
        elif name in bwrap.MOUNTS and path == "/":
            if rooted or mounted:  # only the image's root itself
                raise ConfigError(
                    f"the container path {given!r} leads to the container's root: the image's"
                    " links would have the server mount over it"
                )
            rooted = True
            continue
        if found.below:
            if any(kind and volumes.relation(path, m) == "inside" for m, kind in mounted):
                raise ConfigError(f"the container path {given!r} leads into a volume")
            if found.linked or name not in KEPT_BELOW_MOUNTS:
                raise ConfigError(
                    f"the container path {given!r} leads below {found.below!r}, where the"
                    " server mounts something: the image can make nothing there"
                )
        if name in DIRECTORIES and found.mode and not stat.S_ISDIR(found.mode):
            raise ConfigError(f"the container path {given!r} is no directory in the image")
        out[start + 1 + place] = path
        if name in bwrap.MOUNTS:
            mounted.append((path, volume))
    return out


def _check_volume(
    volume: str, given: str, found: Located, mounted: Sequence[tuple[str, str | None]]
) -> None:
    """Refuse the volume `volume` at `given` where `found` says it leads, if that is the
    root, at, above or below a mount made before it, or onto what no volume may cover."""
    path = str(found.path)
    leads = f"mountPath {given!r} of volume {volume!r} leads" + (
        ", through the image's links," if found.linked else ""
    )
    if path == "/":
        raise volumes.invalid_mount_path(f"{leads} to the container's root")
    for other, owner in mounted:
        where = volumes.relation(path, other)
        if where and owner is not None:
            raise volumes.invalid_mount_path(
                f"{leads} to {path!r}, {where} the mountPath of volume {owner!r}"
                f" ({other!r}): {volumes.NOT_NESTED}"
            )
        if where:
            raise volumes.invalid_mount_path(
                f"{leads} to {path!r}, {where} {other!r}, where the server mounts its own"
            )
    why = volumes.clash(path)
    if why:
        raise volumes.invalid_mount_path(f"{leads} to {path!r}, which {why}")


def main_interpreter(image: StoredImage) -> list[str]:
    """The command, inside `image`'s view, that runs the container's main Python program."""
    if image.python is not None:
        return [image.python]
    return list(host_interpreter()[1])


@functools.cache
def host_interpreter() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(bwrap options, command) that run the server's interpreter in a root without one.

    The interpreter is the server's (a venv's base: the main program runs with `-I -S`, the
    standard library only), found from `HOST_VIEW` by its own path there (its prefix is found
    from it). Its loader (`PT_INTERP`) runs it with `--library-path`: the directories the
    host's loader resolves its libraries to (its own `libpython` first), then the loader's
    (the system's libraries, which the standard library's extension modules load) and the
    prefix's `lib`.

    Raises:
        OSError: the interpreter or its loader cannot be read.
    """
    python, prefix = os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)
    loader = _elf_interpreter(python)
    folders: list[str] = []
    if loader is not None:
        loader = os.path.realpath(loader)
        listed = subprocess.run(
            [loader, "--list", python], capture_output=True, text=True, timeout=30, check=False
        ).stdout
        for line in listed.splitlines():
            _, arrow, rest = line.partition(" => ")
            if arrow and rest.startswith("/"):
                folders.append(os.path.dirname(os.path.realpath(rest.split(" (")[0])))
        folders.append(os.path.dirname(loader))
    folders.append(os.path.join(prefix, "lib"))
    path = [f for f in dict.fromkeys(folders) if os.path.isdir(f)]
    trees = bwrap.without_home(bwrap.outermost([prefix, *path]))
    options: list[str] = []
    for tree in trees:
        options += ["--ro-bind", tree, HOST_VIEW + tree]
    command = [HOST_VIEW + python]
    if loader is not None:
        library_path = ":".join(HOST_VIEW + f for f in path)
        command = [HOST_VIEW + loader, "--library-path", library_path, *command]
    return tuple(options), tuple(command)


def _elf_interpreter(path: str) -> str | None:
    """The loader an ELF executable names (its `PT_INTERP`), None for a static one."""
    with open(path, "rb") as file:
        head = file.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only, as the hosts we run on
            raise OSError(f"{path} is not a 64-bit ELF executable")
        order = "<" if head[5] == 1 else ">"
        (phoff,) = struct.unpack_from(order + "Q", head, 32)
        entry_size, count = struct.unpack_from(order + "HH", head, 54)
        for index in range(count):
            file.seek(phoff + index * entry_size)
            kind, _, offset, _, _, size = struct.unpack(order + "IIQQQQ", file.read(40))
            if kind == PT_INTERP:
                file.seek(offset)
                return file.read(size).rstrip(b"\0").decode()
    return None
