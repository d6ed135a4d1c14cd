"""What an image's config asks of its container: Env, WorkingDir, User, Entrypoint and Cmd.

As Docker reads them: `Env` is `NAME=value` lines (PATH defaults to Docker's when the image
sets none); `WorkingDir` defaults to `/` and is cleaned as Docker cleans it (`clean_path`:
made absolute, `.`, `..` and repeated slashes taken lexically, `..` stopping at `/`); `User` is
`user[:group]`, each a name (looked up in the image's own `/etc/passwd` and `/etc/group`, found
by `resolve_in_root`, never the host's) or a number (ASCII digits, below 2**32 - 1), default
root. A field of another type than Docker's refuses the image (`ConfigError`), as Docker does.
The sandbox's command is OpenSandbox's rule: the create's `entrypoint` replaces the image's
Entrypoint and Cmd; without one, Entrypoint + Cmd (`effective_entrypoint`).

Every path of the image is resolved as the container sees it (`locate`): inside the image's
root, an absolute link's target from that root, `..` stopping at it, each component checked by
`lstat` (the store's root is the server's: nothing changes it while it is read). So a link to
`/etc`, or to a host path, names the image's own files or nothing: never the host's.

`python3` is looked up on the image's PATH inside its root, links resolved inside the root,
never on the host: execd runs with it. So is `jupyter` (`find_jupyter`), which counts only
with a kernelspec named `python` (the one the real execd asks its Jupyter for, as the
official code-interpreter image installs it) in a place Jupyter looks: `$JUPYTER_PATH` of the
image's Env, the prefix of its `jupyter` (a venv or conda), `/root/.local`, `/usr/local` and
`/usr` (each `share/jupyter/kernels/python/kernel.json`).
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

DOCKER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LINK_HOPS = 40  # the kernel's limit (MAXSYMLINKS)
PATH_MAX = 4096  # the kernel's, with its NUL
LOCATE_STEPS = 4096  # components `locate` looks at, links' included
TABLE_LIMIT = 1 << 20  # bytes of /etc/passwd or /etc/group read
CONFIG_INVALID = "IMAGE_CONFIG_INVALID"
ID_LIMIT = (1 << 32) - 1  # uid_t's -1 is no id
_TABLE_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class ConfigError(ValueError):
    """The image's config names something its root does not have (a user, a group), or a
    path its root makes impossible."""


def clean_path(path: str) -> str:
    """`path` as Docker cleans a WorkingDir: absolute, `.`, `..` and `//` taken lexically."""
    return "/" + posixpath.normpath("/" + path).lstrip("/")


@dataclass(frozen=True)
class ImageConfig:
    """The fields of an image config a sandbox honours."""

    env: tuple[tuple[str, str], ...] = (("PATH", DOCKER_PATH),)
    working_dir: str = "/"
    user: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    @classmethod
    def from_blob(cls, blob: dict[str, Any]) -> ImageConfig:
        """The fields from a config blob (`{"config": {"Env": [...], ...}, ...}`).

        Raises:
            ConfigError: a field of another type than Docker's (which refuses such a config):
                Env, Entrypoint and Cmd lists of strings, WorkingDir and User strings.
        """
        config = blob.get("config") or {}
        if not isinstance(config, dict):
            raise ConfigError("the image's config is not an object")
        env: dict[str, str] = {}
        for line in _strings(config, "Env"):
            if "=" in line:
                name, _, value = line.partition("=")
                env[name] = value
        env.setdefault("PATH", DOCKER_PATH)
        working_dir = clean_path(_string(config, "WorkingDir") or "/")
        if len(working_dir.encode()) >= PATH_MAX:
            raise ConfigError(f"the image's WorkingDir is longer than {PATH_MAX - 1} bytes")
        return cls(
            env=tuple(env.items()),
            working_dir=working_dir,
            user=_string(config, "User"),
            entrypoint=tuple(_strings(config, "Entrypoint")),
            cmd=tuple(_strings(config, "Cmd")),
        )

    @property
    def environment(self) -> dict[str, str]:
        """`env` as a dict."""
        return dict(self.env)

    def effective_entrypoint(self, given: list[str] | None) -> list[str]:
        """The sandbox's command: the create's `entrypoint`, else Entrypoint + Cmd."""
        return list(given) if given else [*self.entrypoint, *self.cmd]

    def ids(self, rootfs: Path) -> tuple[int, int]:
        """The (uid, gid) `User` names, looked up in the image's own files.

        Raises:
            ConfigError: a name the image's /etc/passwd or /etc/group does not have.
        """
        if not self.user:
            return 0, 0
        user, _, group = self.user.partition(":")
        passwd = _table(rootfs, "/etc/passwd")
        uid, gid = _id(user), None
        if uid is not None:
            rows = (_id(f[3]) for f in passwd if f[2] == user)
            gid = next((found for found in rows if found is not None), uid)
        else:
            row = next((f for f in passwd if f[0] == user), None)
            if row is not None:
                uid, gid = _id(row[2]), _id(row[3])
            if uid is None or gid is None:
                raise ConfigError(f"the image's User {user[:100]!r} is not in its /etc/passwd")
        if group:
            gid = _id(group)
            if gid is None:
                row = next((f for f in _table(rootfs, "/etc/group") if f[0] == group), None)
                gid = _id(row[2]) if row is not None else None
                if gid is None:
                    raise ConfigError(f"the image's group {group[:100]!r} is not in its /etc/group")
        return uid, gid


def _string(config: dict[str, Any], name: str) -> str:
    """The config's string `name` ("" when null or absent)."""
    value = config.get(name)
    if value is None or isinstance(value, str):
        return value or ""
    raise ConfigError(f"the image config's {name} is not a string: {str(value)[:100]!r}")


def _strings(config: dict[str, Any], name: str) -> list[str]:
    """The config's list of strings `name` (empty when null or absent)."""
    value = config.get(name)
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ConfigError(f"the image config's {name} is not a list of strings: {str(value)[:100]!r}")


def _id(text: str) -> int | None:
    """A user or group id written in decimal (ASCII digits, below 2**32 - 1), else None."""
    if text.isascii() and text.isdigit() and len(text) <= 10 and int(text) < ID_LIMIT:
        return int(text)
    return None


def _table(rootfs: Path, path: str) -> list[list[str]]:
    """The rows of the image's `path` (`/etc/passwd`, `/etc/group`); none where it has none.

    Raises:
        ConfigError: it is larger than TABLE_LIMIT.
    """
    found = resolve_in_root(rootfs, path)
    if found is None:
        return []
    try:  # (not blocking: a fifo's open waits for a writer)
        fd = os.open(rootfs.joinpath(*found.parts[1:]), _TABLE_OPEN)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        data = file.read(TABLE_LIMIT + 1)
    if len(data) > TABLE_LIMIT:
        raise ConfigError(f"the image's {path} is larger than {TABLE_LIMIT} bytes")
    text = data.decode(errors="replace")
    return [line.split(":") for line in text.splitlines() if line.count(":") >= 3]


@dataclass(frozen=True)
class Located:
    """Where a container path leads in an image's root (`locate`).

    Attributes:
        path: the container path it names, without any link or `..` in it.
        mode: what is there (`lstat`'s st_mode), 0 when nothing is yet or it is below a mount.
        linked: a link of the image was followed on the way.
        below: the mount (of those given) it lies below, "" when it is the image's own.
    """

    path: PurePosixPath
    mode: int
    linked: bool
    below: str


def locate(rootfs: Path, path: str, mounts: Collection[str] = ()) -> Located:
    """Where the container path `path` leads inside `rootfs`, as the container sees it.

    Links are followed inside the root (an absolute target from the root), `..` stops at the
    root, a missing component is kept with what follows it (bwrap, or the caller, makes them).
    Below a path of `mounts` (something else is mounted there) nothing of `rootfs` is looked at:
    the rest is taken as written. At most `LOCATE_STEPS` components are looked at, links'
    included (each step costs the same: the work is linear in them).

    Raises:
        ConfigError: a component that is no directory has more after it, the links loop
            (past LINK_HOPS), or the path is longer than PATH_MAX or takes more steps, naming
            `path` (never the host's path of `rootfs`).
    """
    shown = repr(path if len(path) <= 200 else path[:200] + "...")
    todo = deque(part for part in path.split("/") if part not in ("", "."))
    done: list[tuple[str, int]] = []  # each component's path ("/a/b") and mode (0: missing)
    hops = steps = 0
    while todo:
        steps += 1
        if steps > LOCATE_STEPS:
            raise ConfigError(
                f"the container path {shown} leads through more than {LOCATE_STEPS} components"
            )
        part = todo.popleft()
        if part == "..":
            if done:
                done.pop()
            continue
        above = done[-1][0] if done else ""
        here = f"{above}/{part}"
        if len(here.encode()) >= PATH_MAX:
            raise ConfigError(f"the container path {shown} leads past {PATH_MAX - 1} bytes")
        if (done and not done[-1][1]) or any(_within(above, m) for m in mounts):
            done.append((here, 0))  # not made yet, or not the image's: taken as written
            continue
        try:
            mode = os.lstat(f"{rootfs}{here}").st_mode
            target = os.readlink(f"{rootfs}{here}") if stat.S_ISLNK(mode) else ""
        except FileNotFoundError:
            mode, target = 0, ""
        except OSError as exc:
            raise ConfigError(
                f"the container path {shown} cannot be resolved: {exc.strerror}"
            ) from None
        if stat.S_ISLNK(mode):
            hops += 1
            if hops > LINK_HOPS:
                raise ConfigError(f"the container path {shown} leads through a loop of links")
            if target.startswith("/"):
                done.clear()
            todo.extendleft(reversed([p for p in target.split("/") if p not in ("", ".")]))
            continue
        if mode and not stat.S_ISDIR(mode) and todo:
            raise ConfigError(
                f"the container path {shown} cannot be made in the image: {here} is no directory"
            )
        done.append((here, mode))
    here = done[-1][0] if done else "/"
    below = next((m for m in mounts if here != m and _within(here, m)), "")
    return Located(PurePosixPath(here), done[-1][1] if done else stat.S_IFDIR, hops > 0, below)


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


def resolve_in_root(rootfs: Path, path: str) -> PurePosixPath | None:
    """Where `path` (absolute, the container's) leads inside `rootfs`, links followed there.

    Returns:
        The container path of what it names, or None when nothing is there.
    """
    try:
        found = locate(rootfs, path)
    except ConfigError:
        return None
    if not found.mode:
        return None
    return found.path


def find_python(rootfs: Path, config: ImageConfig) -> str | None:
    """The container path of the image's `python3` (on its PATH), or None."""
    return find_executable(rootfs, config, "python3")


def find_executable(rootfs: Path, config: ImageConfig, name: str) -> str | None:
    """The container path of the executable `name` on the image's PATH, or None."""
    for folder in config.environment.get("PATH", DOCKER_PATH).split(":"):
        if folder.startswith("/") and is_executable(rootfs, f"{folder}/{name}"):
            return f"{folder}/{name}"
    return None


def is_executable(rootfs: Path, path: str) -> bool:
    """True when the container path `path` names an executable regular file of `rootfs`."""
    found = resolve_in_root(rootfs, path)
    if found is None:
        return False
    mode = os.lstat(rootfs.joinpath(*found.parts[1:])).st_mode
    return stat.S_ISREG(mode) and bool(mode & 0o111)


def find_jupyter(rootfs: Path, config: ImageConfig) -> str | None:
    """The container path of the image's `jupyter`, when it has a kernelspec `python`, or None."""
    jupyter = find_executable(rootfs, config, "jupyter")
    if jupyter is None:
        return None
    found = resolve_in_root(rootfs, jupyter)
    prefixes = [str(PurePosixPath(jupyter).parent.parent)]
    if found is not None:
        prefixes.append(str(found.parent.parent))
    data = [p for p in config.environment.get("JUPYTER_PATH", "").split(":") if p]
    data += [f"{prefix}/share/jupyter" for prefix in (*prefixes, "/root/.local", "/usr/local")]
    data.append("/usr/share/jupyter")
    for folder in data:
        spec = resolve_in_root(rootfs, f"{folder}/kernels/python/kernel.json")
        if spec is not None and os.path.isfile(rootfs.joinpath(*spec.parts[1:])):
            return jupyter
    return None
