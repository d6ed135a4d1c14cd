"""A sandbox's root: what differs between one on the host's view and one on an image's.

A container asks its `RootView`, chosen once by the create (`container.Launch.view`), for
everything that differs between the two: bwrap's options (their shared part, namespaces,
identity, /proc and /dev, written once: `bwrap.confined`), the environment and working
directory of what execd starts, its user, the main command, its entrypoint, what the status
message says. `HostView` is the host's read-only view (`bwrap.py`), with the sandbox's own
writable directories (or, where nothing is isolated, a plain process's view of the host);
`rootfs.ImageView` an image's root over a writable layer (`images/rootfs.py`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from . import bwrap, identity
from .volumes import Bind


@dataclass(frozen=True)
class Places:
    """Where a container's own directories are on the host, for its root view's options."""

    writable: tuple[str, ...]  # bwrap options that mount its `WRITABLE` directories
    data: Path  # the directory its writable directories are in (an image's layer goes there)
    state: Path  # execd's state directory (`EXECD_STATE_DIR` inside)
    tmpfs: bool  # `data` is the sandbox's own tmpfs (`disk.py`): its unmount takes the files


class RootView(Protocol):
    """What differs between a sandbox on the host's view (`HostView`) and one on an image's
    root (`rootfs.ImageView`); chosen once, by the create, in its `container.Launch`."""

    @property
    def system(self) -> str:
        """What its system directories are, for the status message."""

    @property
    def template(self) -> bool:
        """Whether the execd template may fork its execd (`execd_template.py`)."""

    @property
    def user(self) -> tuple[int, int] | None:
        """(uid, gid) that what execd starts runs as (None: the sandbox's root)."""

    @property
    def python(self) -> str | None:
        """The interpreter of its code contexts (None: the one execd runs on)."""

    def identity_files(self) -> tuple[bytes, bytes] | None:
        """Its /etc/passwd and /etc/group, or None for the root's own."""

    def options(
        self,
        places: Places,
        info_fd: int,
        ident: Sequence[str],
        extra: Sequence[str],
        mounts: Sequence[str],
        binds: Sequence[Bind],
        held: contextlib.ExitStack,
    ) -> tuple[list[str], str]:
        """bwrap's options (`bwrap.confined`'s, and its root) and what the status message says
        of its root; what it keeps while the container lives goes with `held`."""

    def home(self, plain_home: str | None) -> str:
        """Where execd runs commands by default (`plain_home`: the unisolated host directory)."""

    def environment(self, sandbox_env: dict[str, str], plain_home: str | None) -> dict[str, str]:
        """The environment of what execd starts, the sandbox's own `sandbox_env` last."""

    def main_command(self, script: str) -> list[str]:
        """The container's main process, running execd's `script`."""

    def entrypoint(self, given: list[str]) -> list[str]:
        """The entrypoint it runs, given the create's (`entrypoint.py`)."""


@dataclass(frozen=True)
class HostView:
    """The root of a sandbox without an image: the host's, read-only (see the module
    docstring), with its own writable directories; or, where it is not isolated, a plain
    process's view of the host (`plain_home` given: its host directory).

    One of the two root views (`RootView`), `rootfs.ImageView` the other.
    """

    system: ClassVar[str] = "read-only system directories"
    template: ClassVar[bool] = True  # the execd template may fork its execd
    user: ClassVar[tuple[int, int] | None] = None  # what execd starts runs as its root
    python: ClassVar[str | None] = None  # code contexts run on execd's interpreter

    def identity_files(self) -> tuple[bytes, bytes] | None:
        """Its /etc/passwd and /etc/group (the sandbox's root and its home)."""
        return identity.passwd_file(bwrap.SANDBOX_HOME), identity.group_file()

    def options(
        self,
        places: Places,
        info_fd: int,
        ident: Sequence[str],
        extra: Sequence[str],
        mounts: Sequence[str],
        binds: Sequence[Bind],
        held: contextlib.ExitStack,
    ) -> tuple[list[str], str]:
        """bwrap's options (`container_options`), and what the status says of its root."""
        return bwrap.container_options(places.writable, info_fd, ident, mounts, extra), ""

    def home(self, plain_home: str | None) -> str:
        """Where execd runs commands by default."""
        return plain_home or bwrap.SANDBOX_HOME

    def environment(self, sandbox_env: dict[str, str], plain_home: str | None) -> dict[str, str]:
        """The environment of what execd starts: a login's basics, then the sandbox's own."""
        home = self.home(plain_home)
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin") if plain_home else bwrap.SANDBOX_PATH,
            **{k: os.environ[k] for k in ("LANG", "LC_ALL", "TZ") if k in os.environ},
            "HOME": home,
            "SHELL": "/bin/bash",
            "PWD": home,
            **sandbox_env,
        }

    def main_command(self, script: str) -> list[str]:
        """The container's main process (`bwrap.main_command`)."""
        return bwrap.main_command(script)

    def entrypoint(self, given: list[str]) -> list[str]:
        """The entrypoint a sandbox runs: the one its create gives."""
        return given
