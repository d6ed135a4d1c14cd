"""Files as a user (execd 1.1.1, #2070): `/v1/filesystem/{uid}/{gid}/...` serves each file route
with the kernel checking every path and link as that user.

Real execd re-executes itself as a one-request worker with that uid and gid. The local execd
switches the file-system identity of the one thread that serves the request instead: Linux
keeps credentials per thread, and `setfsuid`/`setfsgid` (never broadcast to other threads, unlike
`setuid`) decide every permission check and new file's owner, while leaving the thread's
file-system capabilities out of its effective set (CAP_DAC_OVERRIDE, CAP_CHOWN, CAP_FOWNER, ...)
as long as its fsuid is not 0. The supplementary groups are set for the thread alone too (the
raw `setgroups` system call: glibc's wrapper would change every thread): those the account
database lists for the uid, none for an unknown uid. All of it is restored when the request is
answered; what a route would stage in execd's own directory (an upload's metadata) goes to a
temporary directory of the user's. An identity the thread cannot take (a uid the sandbox's
user namespace does not map, an execd that is not root, a machine without the calls) is a 503
`FILESYSTEM_IDENTITY_UNAVAILABLE`, as real execd answers; a uid or gid that is not a plain
decimal up to 4294967294, a 400.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import os
import platform
import pwd
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ..http.exchange import Exchange, HttpError, error
from .runner import SandboxRuntime

MAX_ID = 4294967294  # 4294967295 is reserved (-1)
PREFIX = "/v1/filesystem/{uid}/{gid}"
# The raw setgroups system call per machine (the thread's own groups only).
SETGROUPS = {"x86_64": 116, "aarch64": 159}

_libc = ctypes.CDLL(None, use_errno=True)


def parse_id(raw: str, name: str) -> int:
    """A uid or gid of the path: plain decimal digits, at most MAX_ID; 400 otherwise."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or int(raw) > MAX_ID:
        shown = raw[:20].encode("ascii", "backslashreplace").decode()
        message = f"invalid {name}: identity must be a decimal from 0 to {MAX_ID}, got {shown!r}"
        raise error(400, "INVALID_REQUEST_BODY", message)
    return int(raw)


def _unavailable(why: str) -> HttpError:
    return error(503, "FILESYSTEM_IDENTITY_UNAVAILABLE", f"cannot serve files as a user: {why}")


def _groups_of(uid: int, gid: int) -> list[int]:
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return [gid]
    return sorted(set(os.getgrouplist(name, gid)))


def _set_groups(groups: list[int]) -> None:
    number = SETGROUPS.get(platform.machine())
    if number is None:
        raise _unavailable(f"no per-thread setgroups on {platform.machine()}")
    array = (ctypes.c_uint * max(1, len(groups)))(*groups)
    if _libc.syscall(number, len(groups), array) != 0:
        raise _unavailable(f"setgroups: {os.strerror(ctypes.get_errno())}")


def _set_fs(call: Callable[[int], int], wanted: int, what: str) -> None:
    call(wanted)
    if call(-1 & 0xFFFFFFFF) != wanted:  # an invalid id only reports the current one
        raise _unavailable(f"{what} {wanted} cannot be taken (not mapped, or execd not root)")


@contextlib.contextmanager
def as_user(uid: int, gid: int) -> Iterator[None]:
    """This thread's file-system identity set to `uid`:`gid` (and the user's groups) for the
    block, then restored; 503 when it cannot be taken."""
    old_uid = _libc.setfsuid(-1 & 0xFFFFFFFF)
    old_gid = _libc.setfsgid(-1 & 0xFFFFFFFF)
    old_groups = os.getgroups()
    try:
        _set_groups(_groups_of(uid, gid))
        _set_fs(_libc.setfsgid, gid, "gid")
        _set_fs(_libc.setfsuid, uid, "uid")
        yield
    finally:
        _libc.setfsuid(old_uid)
        _libc.setfsgid(old_gid)
        with contextlib.suppress(HttpError):
            _set_groups(old_groups)


Handler = Callable[[SandboxRuntime, Exchange], None]


def served_as_user(runtime: SandboxRuntime, handler: Handler) -> Callable[[Exchange], None]:
    """`handler` as a route under PREFIX: it runs as the path's uid and gid."""

    def route(ex: Exchange) -> None:
        uid, gid = parse_id(ex.params["uid"], "uid"), parse_id(ex.params["gid"], "gid")
        with as_user(uid, gid):
            # what a route stages in execd's own directory goes to one of the user's
            with tempfile.TemporaryDirectory(prefix="osb-as-user-") as staging:
                view = copy.copy(runtime)
                view.run_dir = Path(staging)
                handler(view, ex)

    return route
