"""What an image's config asks of its container: Env, WorkingDir, User, Entrypoint and Cmd.

As Docker reads them: `Env` is `NAME=value` lines (PATH defaults to Docker's when the image
sets none); `WorkingDir` defaults to `/`; `User` is `user[:group]`, each a name (looked up in the
image's own `/etc/passwd` and `/etc/group`, never the host's) or a number, default root.
The sandbox's command is OpenSandbox's rule: the create's `entrypoint` replaces the image's
Entrypoint and Cmd; without one, Entrypoint + Cmd (`effective_entrypoint`).

`python3` is looked up on the image's PATH inside its root, links resolved inside the root,
never on the host: execd runs with it. So is `jupyter` (`find_jupyter`), which counts only
with a kernelspec named `python` (the one the real execd asks its Jupyter for, as the
official code-interpreter image installs it) in a place Jupyter looks: `$JUPYTER_PATH` of the
image's Env, the prefix of its `jupyter` (a venv or conda), `/root/.local`, `/usr/local` and
`/usr` (each `share/jupyter/kernels/python/kernel.json`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

DOCKER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LINK_HOPS = 40


class ConfigError(ValueError):
    """The image's config names something its root does not have (a user, a group)."""


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
        """The fields from a config blob (`{"config": {"Env": [...], ...}, ...}`)."""
        config = blob.get("config") or {}
        env: dict[str, str] = {}
        for line in config.get("Env") or []:
            if isinstance(line, str) and "=" in line:
                name, _, value = line.partition("=")
                env[name] = value
        env.setdefault("PATH", DOCKER_PATH)
        return cls(
            env=tuple(env.items()),
            working_dir=str(config.get("WorkingDir") or "/"),
            user=str(config.get("User") or ""),
            entrypoint=tuple(str(a) for a in config.get("Entrypoint") or ()),
            cmd=tuple(str(a) for a in config.get("Cmd") or ()),
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
        passwd = _table(rootfs / "etc" / "passwd")
        if user.isdigit():
            uid = int(user)
            gid = next((int(f[3]) for f in passwd if f[2] == user and f[3].isdigit()), uid)
        else:
            found = next((f for f in passwd if f[0] == user), None)
            if found is None or not (found[2].isdigit() and found[3].isdigit()):
                raise ConfigError(f"the image's User {user!r} is not in its /etc/passwd")
            uid, gid = int(found[2]), int(found[3])
        if group:
            if group.isdigit():
                gid = int(group)
            else:
                row = next((f for f in _table(rootfs / "etc" / "group") if f[0] == group), None)
                if row is None or not row[2].isdigit():
                    raise ConfigError(f"the image's group {group!r} is not in its /etc/group")
                gid = int(row[2])
        return uid, gid


def _table(path: Path) -> list[list[str]]:
    try:
        if os.path.islink(path):
            return []  # never follow a link of the image on the host
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line.split(":") for line in text.splitlines() if line.count(":") >= 3]


def resolve_in_root(rootfs: Path, path: str) -> PurePosixPath | None:
    """Where `path` (absolute, the container's) leads inside `rootfs`, links followed there.

    Returns:
        The container path of what it names, or None when nothing is there.
    """
    parts = list(PurePosixPath(path).parts[1:])
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        if part == ".":
            continue
        here = rootfs.joinpath(*done, part)
        try:
            mode = os.lstat(here).st_mode
        except OSError:
            return None
        if stat.S_ISLNK(mode):
            hops += 1
            if hops > LINK_HOPS:
                return None
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            parts = list(PurePosixPath(target).parts[1 if target.startswith("/") else 0 :]) + parts
            continue
        done.append(part)
    return PurePosixPath("/", *done)


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
