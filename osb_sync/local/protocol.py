"""The messages between the local server and the execds of its sandboxes, declared once.

Both sides of the security line import this module (`tests/unit/test_layers.py` names it
shared, beside `http/`); it imports nothing but the standard library, and it runs on an image's
own python3 from 3.9 on (`execd/main.py` does): no `match`, no `kw_only` or `slots=True`.

On execd's standard input the server writes one JSON object a line:

- `Start`, as the container starts (bwrap, or the execd template, runs `execd/main.py`): the
  working and state directories, the ports, heartbeat and grace seconds, the file size limit,
  the image's User, an execd binary and its Jupyter;
- `Claim`, once a create takes the container (a warm spare waits for it up to then): execd's
  access token, the sandbox's environment, its entrypoint, an address space limit. EOF instead
  of a claim: the spare was never needed.

On the control socket of the execd template (`execd/template.py`, a SOCK_SEQPACKET socket, one
message a packet) the server sends `TemplateSetup` once, then a `Fork` per sandbox with its
descriptors; the template answers each with `ForkAnswer` (the execd's host pid, or why not).

A decoder checks every field's type and refuses a message of another shape with `ValueError`
naming the message and the field, never echoing a value. A `Claim`'s `repr` shows neither the
token nor the environment's values (which may hold the sandbox's secrets).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any


def _object(data: bytes, what: str) -> dict[str, Any]:
    try:
        found = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        raise ValueError(f"{what}: not JSON") from None
    if not isinstance(found, dict):
        raise ValueError(f"{what}: not a JSON object")
    return found


def _int(message: dict[str, Any], name: str, what: str) -> int:
    value = message.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what}: {name} must be an integer")
    return value


def _number(message: dict[str, Any], name: str, what: str) -> float:
    value = message.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what}: {name} must be a finite number")
    return float(value)


def _text(message: dict[str, Any], name: str, what: str) -> str:
    value = message.get(name)
    if not isinstance(value, str):
        raise ValueError(f"{what}: {name} must be a string")
    return value


def _optional_text(message: dict[str, Any], name: str, what: str) -> str | None:
    return None if message.get(name) is None else _text(message, name, what)


def _optional_int(message: dict[str, Any], name: str, what: str) -> int | None:
    return None if message.get(name) is None else _int(message, name, what)


def _strings(value: Any, name: str, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{what}: {name} must be a list of strings")
    return value


@dataclass(frozen=True)
class Start:
    """The start line: what execd needs before any create claims its container."""

    home: str  # where commands run by default (the image's WorkingDir, else the home)
    run_dir: str  # execd's state directory
    execd_port: int  # 0: an ephemeral port (no container)
    jupyter_port: int
    ping_interval: float  # seconds between heartbeats of a stream
    command_grace: float  # seconds /command keeps its stream open after its last event
    file_size_limit: int = 0  # RLIMIT_FSIZE of execd and what it starts (0: none)
    oom_control: str | None = None  # the memory group's OOM counter, as execd sees it
    user: tuple[int, int] | None = None  # the image's User (uid, gid); None: root
    execd_binary: str | None = None  # run this binary instead of our execd
    jupyter: str | None = None  # and this Jupyter server behind it
    python: str | None = None  # what runs code contexts (the image's python3); None: execd's

    def encode(self) -> bytes:
        """The line (with its newline)."""
        message = {
            "home": self.home,
            "run_dir": self.run_dir,
            "execd_port": self.execd_port,
            "jupyter_port": self.jupyter_port,
            "ping_interval": self.ping_interval,
            "command_grace": self.command_grace,
            "file_size_limit": self.file_size_limit,
            "oom_control": self.oom_control,
            "user": list(self.user) if self.user is not None else None,
            "execd_binary": self.execd_binary,
            "jupyter": self.jupyter,
            "python": self.python,
        }
        return json.dumps(message).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes) -> Start:
        """The start line `line`; ValueError naming the field when it is of another shape."""
        what = "the start line"
        message = _object(line, what)
        user = message.get("user")
        if user is not None and (
            not isinstance(user, list)
            or len(user) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in user)
        ):
            raise ValueError(f"{what}: user must be a [uid, gid] pair of integers")
        return cls(
            home=_text(message, "home", what),
            run_dir=_text(message, "run_dir", what),
            execd_port=_int(message, "execd_port", what),
            jupyter_port=_int(message, "jupyter_port", what),
            ping_interval=_number(message, "ping_interval", what),
            command_grace=_number(message, "command_grace", what),
            file_size_limit=_int(message, "file_size_limit", what),
            oom_control=_optional_text(message, "oom_control", what),
            user=(user[0], user[1]) if user is not None else None,
            execd_binary=_optional_text(message, "execd_binary", what),
            jupyter=_optional_text(message, "jupyter", what),
            python=_optional_text(message, "python", what),
        )


@dataclass(frozen=True)
class Claim:
    """The claim line: what makes a started container a sandbox's (never in its `repr`: the
    token and the environment's values)."""

    token: str = field(repr=False)  # execd's access token
    env: dict[str, str] = field(repr=False)  # the environment of what execd starts
    entrypoint: tuple[str, ...] | None = None  # started once execd serves; None: nothing
    address_space_limit: int | None = None  # RLIMIT_AS of what execd starts, bytes
    process_limit: int | None = None  # RLIMIT_NPROC of execd itself, from the claim on

    def encode(self) -> bytes:
        """The line (with its newline)."""
        message = {
            "token": self.token,
            "env": self.env,
            "entrypoint": list(self.entrypoint) if self.entrypoint is not None else None,
            "address_space_limit": self.address_space_limit,
            "process_limit": self.process_limit,
        }
        return json.dumps(message).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes) -> Claim:
        """The claim line `line`; ValueError naming the field when it is of another shape."""
        what = "the claim line"
        message = _object(line, what)
        env = message.get("env")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError(f"{what}: env must map names to strings")
        entrypoint = message.get("entrypoint")
        return cls(
            token=_text(message, "token", what),
            env=env,
            entrypoint=None
            if entrypoint is None
            else tuple(_strings(entrypoint, "entrypoint", what)),
            address_space_limit=_optional_int(message, "address_space_limit", what),
            process_limit=_optional_int(message, "process_limit", what),
        )


@dataclass(frozen=True)
class TemplateSetup:
    """The execd template's first message: the confinement of every execd it forks."""

    capabilities: int  # bit N: capability N (bounding, effective, permitted, ... sets)
    seccomp: bytes | None  # the filter program bwrap loads (None: none)
    home: str  # the execd's working directory
    package_view: str  # where a container sees the package (`bwrap.PACKAGE_VIEW`)

    def encode(self) -> bytes:
        """The message."""
        message = {
            "capabilities": self.capabilities,
            "seccomp": self.seccomp.hex() if self.seccomp is not None else None,
            "home": self.home,
            "package_view": self.package_view,
        }
        return json.dumps(message).encode()

    @classmethod
    def decode(cls, data: bytes) -> TemplateSetup:
        """The set-up message; ValueError naming the field when it is of another shape."""
        what = "the template's set-up"
        message = _object(data, what)
        seccomp = _optional_text(message, "seccomp", what)
        try:
            program = bytes.fromhex(seccomp) if seccomp is not None else None
        except ValueError:
            raise ValueError(f"{what}: seccomp must be hexadecimal") from None
        return cls(
            capabilities=_int(message, "capabilities", what),
            seccomp=program,
            home=_text(message, "home", what),
            package_view=_text(message, "package_view", what),
        )


@dataclass(frozen=True)
class Fork:
    """A request to the execd template: fork an execd into the namespaces of `init` (the
    container's init, bwrap's child) and into the cgroups whose `cgroup.procs` files `groups`
    names (the sandbox's), working in `home` (bwrap's `--chdir`; None: the set-up's); its
    descriptors travel with it (`FORK_FDS`)."""

    init: int
    groups: tuple[str, ...] = ()
    home: str | None = None

    def encode(self) -> bytes:
        """The message."""
        message = {"init": self.init, "groups": list(self.groups), "home": self.home}
        return json.dumps(message).encode()

    @classmethod
    def decode(cls, data: bytes) -> Fork:
        """The request; ValueError naming the field when it is of another shape."""
        what = "a fork request"
        message = _object(data, what)
        groups = _strings(message.get("groups", []), "groups", what)
        home = _optional_text(message, "home", what)
        return cls(init=_int(message, "init", what), groups=tuple(groups), home=home)


# A Fork's descriptors, in order: init's pidfd, execd's standard input (read end), its
# standard error, the relay socket, the ready pipe (write end), the exit pipe (write end).
FORK_FDS = 6


@dataclass(frozen=True)
class ForkAnswer:
    """The execd template's answer to a `Fork`: the execd's host pid, or why there is none."""

    pid: int | None = None
    error: str | None = None

    def encode(self) -> bytes:
        """The message."""
        if self.pid is not None:
            return json.dumps({"pid": self.pid}).encode()
        return json.dumps({"error": self.error or "unknown"}).encode()

    @classmethod
    def decode(cls, data: bytes) -> ForkAnswer:
        """The answer; ValueError naming the field when it is of another shape."""
        what = "the template's answer"
        message = _object(data, what)
        if message.get("pid") is not None:
            return cls(pid=_int(message, "pid", what))
        return cls(error=_text(message, "error", what))
