"""The store's unpacks and removals for a server that is not root but has an id range.

An image's files belong to the sandboxes' id range, its id N the range's N (`unpack.in_range`),
so that a sandbox's root owns what the image's root owns. A root server gives them those ids
with `fchown`. A server that is not root cannot (EPERM: the range is its subordinate ids, not
its own uid), nor could it remove such a tree again. So it unpacks and removes in a child
process that has joined a user namespace mapping the range as ids 0 to `count - 1` and the
server's own uid and gid as `count` (newuidmap and newgidmap allow a user its own id beside its
subordinate ones; `identity.store_namespace`). There the child holds every capability over
files of either owner and no other: an image's id N, N inside, is stored as the range's N, as a
root server stores it, and the store's own directories stay the server's.

The child is a fresh interpreter (`setns` into a user namespace needs a single thread) that
runs the same unpacker (`unpack.unpack`) and answers one JSON line on its stdout; its errors
come back as the unpacker's (`UnpackError`, `TooLarge`, `OSError`).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import identity
from .unpack import (
    UNPACK_TIMEOUT,
    OwnerMap,
    SizeLimit,
    TooLarge,
    Unpacked,
    UnpackError,
    in_range,
    server_owned,
    unpack,
)

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
REMOVE_TIMEOUT = 600.0  # a removal's or a copy's seconds
SPARE_SECONDS = 30.0  # the child's start and answer, past the unpacker's own timeout
# Run as `python -I -S -c CHILD USERNS_FD PACKAGE_PARENT SERVER_PID`, the request on stdin.
CHILD = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.setns(int(sys.argv[1]), 0x10000000) != 0:  # CLONE_NEWUSER
    sys.exit(f"setns: {os.strerror(ctypes.get_errno())}")
os.close(int(sys.argv[1]))
try:
    os.setgroups([])  # the user's other groups show as nogroup: none kept
except OSError:
    pass
os.setresgid(0, 0, 0)  # the range's root, which keeps its capabilities across exec (cp)
os.setresuid(0, 0, 0)
sys.path.append(sys.argv[2])  # after the standard library: nothing there shadows it
from osb_sync.local.host.images import inside
inside.die_with_parent(int(sys.argv[3]))  # after the id changes, which clear it
print(inside.serve(sys.stdin.read()))
"""


def die_with_parent(parent: int | None = None) -> None:
    """Have the kernel kill this process when its parent ends (the child's, once its ids are
    set: a server killed mid-unpack or mid-copy left its worker running on as the range's
    root); `parent`: the pid it must still be, else it exits now."""
    if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if parent is not None and os.getppid() != parent:
        os._exit(1)  # it ended before


class RangeWork:
    """Unpacks and removals of the store of a server that is not root, in its range
    (`ids`: the range with its `newuidmap` and `newgidmap`)."""

    def __init__(self, ids: identity.IdRange) -> None:
        self.ids = ids

    def unpack(
        self, layout: Path, rootfs: Path, limit: SizeLimit, timeout: float = UNPACK_TIMEOUT
    ) -> Unpacked:
        """`unpack.unpack` with the range's owners.

        Raises:
            UnpackError: the image was refused (TooLarge past `limit`).
            OSError: the disk said no, or the namespace or the child failed.
        """
        request = {
            "op": "unpack",
            "layout": str(layout),
            "rootfs": str(rootfs),
            "count": self.ids.count,
            "limit": [limit.total, limit.ratio, limit.floor],
            "timeout": timeout,
        }
        answer = self._run(request, timeout + SPARE_SECONDS)
        return Unpacked(answer["config"], int(answer["size"]), tuple(answer["skipped"]))

    def copy(self, source: Path, target: Path, admit: tuple[Path, ...] = ()) -> None:
        """`cp -a --reflink=auto` of a tree with the range's owners (an image's writable copy
        for a sandbox) to the new `target`, after letting the range's root group search each
        of the server's directories `admit` (as `identity.admit` does for a root server:
        bwrap, as the range's root, binds `target` by name).

        Raises:
            OSError: it could not be copied.
        """
        cp = shutil.which("cp") or "/bin/cp"
        request = {
            "op": "copy",
            "cp": cp,
            "source": str(source),
            "target": str(target),
            "admit": [str(path) for path in admit],
        }
        self._run(request, REMOVE_TIMEOUT)

    def remove(self, path: Path) -> None:
        """`rm -rf` of a tree with the range's owners (of any depth; a link is not followed).

        Raises:
            OSError: it could not be removed.
        """
        rm = shutil.which("rm") or "/bin/rm"
        self._run({"op": "remove", "rm": rm, "path": str(path)}, REMOVE_TIMEOUT)

    def _run(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The worker's answer to `request`; its error raised (`_error`)."""
        userns = identity.store_namespace(self.ids)
        package = str(Path(__file__).resolve().parents[4])  # where `osb_sync` is
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-S", "-c", CHILD, str(userns), package, str(os.getpid())],
                input=json.dumps(request).encode(),
                pass_fds=(userns,),
                capture_output=True,
                timeout=timeout,
                env={"LC_ALL": "C.UTF-8"},
            )
        except subprocess.TimeoutExpired:
            raise OSError(f"the store's {request['op']} took over {timeout:.0f} s") from None
        finally:
            os.close(userns)
        try:
            answer = json.loads(done.stdout)
            if not isinstance(answer, dict):
                raise ValueError("not an object")
        except ValueError:
            said = done.stderr.decode(errors="replace").strip()[-300:] or f"exit {done.returncode}"
            raise OSError(f"the store's {request['op']} in the id range failed: {said}") from None
        if "error" in answer:
            raise _error(answer)
        return answer


def _error(answer: dict[str, Any]) -> Exception:
    message = str(answer.get("message", ""))
    if answer["error"] == "too-large":
        return TooLarge(
            message, int(answer["limit"]), int(answer["unpacked"]), int(answer["packed"])
        )
    if answer["error"] == "refused":
        return UnpackError(message)
    if answer.get("errno"):
        return OSError(int(answer["errno"]), message, answer.get("filename"))
    return OSError(message)


def serve(text: str) -> str:
    """The child's side (inside the namespace): one request (JSON) done, its answer (JSON)."""
    request = json.loads(text)
    with_me = functools.partial(die_with_parent, os.getpid())  # its cp or rm dies with it
    try:
        if request["op"] == "remove":  # rm: a tree of any depth (a sandbox nests at will)
            argv = [request["rm"], "-rf", "--one-file-system", "--", request["path"]]
            removed = subprocess.run(argv, capture_output=True, preexec_fn=with_me)
            if removed.returncode != 0:
                said = removed.stderr.decode(errors="replace").strip()[-300:]
                raise OSError(f"{request['path']} could not be removed: {said}")
            return json.dumps({})
        if request["op"] == "copy":
            for path in request["admit"]:  # the server's, mode and group as `identity.admit`
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    os.fchown(fd, -1, 0)
                    os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | 0o010)
                finally:
                    os.close(fd)
            argv = [request["cp"], "-a", "--reflink=auto", request["source"], request["target"]]
            copied = subprocess.run(argv, capture_output=True, preexec_fn=with_me)
            if copied.returncode != 0:
                said = copied.stderr.decode(errors="replace").strip()[-300:]
                raise OSError(f"the image could not be copied: {said}")
            return json.dumps({})
        count = int(request["count"])

        def owner(uid: int, gid: int) -> tuple[int, int] | None:
            # past the range: the server's own ids (`count` here), as `unpack.in_range` leaves
            # it to a root server; a sandbox sees them as nobody
            return (uid, gid) if 0 <= uid < count and 0 <= gid < count else (count, count)

        total, ratio, floor = request["limit"]
        unpacked = unpack(
            Path(request["layout"]),
            Path(request["rootfs"]),
            owner,
            SizeLimit(total, ratio, floor),
            float(request["timeout"]),
        )
        answer = {"config": unpacked.config, "size": unpacked.size, "skipped": unpacked.skipped}
        return json.dumps(answer)
    except TooLarge as exc:
        fields = {"limit": exc.limit, "unpacked": exc.unpacked, "packed": exc.packed}
        return json.dumps({"error": "too-large", "message": str(exc), **fields})
    except UnpackError as exc:
        return json.dumps({"error": "refused", "message": str(exc)})
    except OSError as exc:
        name = None if exc.filename is None else os.fsdecode(exc.filename)
        fault = {"errno": exc.errno, "message": exc.strerror or str(exc), "filename": name}
        return json.dumps({"error": "os", **fault})


def of_host() -> RangeWork | None:
    """The `RangeWork` of this process's user: where it is not root and has a range."""
    if os.geteuid() == 0:
        return None
    ids = identity.host_range()
    return for_ids(ids)[1] if isinstance(ids, identity.IdRange) else None


def for_ids(ids: identity.IdRange | None) -> tuple[OwnerMap, RangeWork | None]:
    """How a store of a server with `ids` (None: not isolated) owns an image's files: the
    owner map of an unpack in this process, or the `RangeWork` that unpacks in the range."""
    if ids is None:
        return server_owned, None
    if ids.helpers is not None and not ids.own:
        return server_owned, RangeWork(ids)
    return in_range(ids.uid, ids.gid, ids.count), None
