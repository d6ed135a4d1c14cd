"""What an image's config asks of its container: Env, WorkingDir, User, Entrypoint and Cmd.

As Docker reads them: `Env` is `NAME=value` lines (PATH defaults to Docker's when the image
sets none); `WorkingDir` defaults to `/`; `User` is `user[:group]`, each a name (looked up in the
image's own `/etc/passwd` and `/etc/group`, never the host's) or a number, default root.
The sandbox's command is OpenSandbox's rule: the create's `entrypoint` replaces the image's
Entrypoint and Cmd; without one, Entrypoint + Cmd (`effective_entrypoint`).

`python3` is looked up on the image's PATH inside its root, links resolved inside the root,
never on the host: execd runs with it.
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
    for folder in config.environment.get("PATH", DOCKER_PATH).split(":"):
        if not folder.startswith("/"):
            continue
        found = resolve_in_root(rootfs, f"{folder}/python3")
        if found is None:
            continue
        mode = os.lstat(rootfs.joinpath(*found.parts[1:])).st_mode
        if stat.S_ISREG(mode) and mode & 0o111:
            return f"{folder}/python3"
    return None
