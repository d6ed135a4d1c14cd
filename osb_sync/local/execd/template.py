"""The execd template of a local server: one Python with execd's modules imported, that forks
each sandbox's execd into the namespaces bubblewrap made for it.

Why: every other execd is a new interpreter that imports its HTTP stack (~80 ms of CPU) and
keeps a private copy of it (~12 MiB); a forked one shares the template's pages until it writes
them. Run by the server (`host/execd_template.py`) as `python -I -S template.py CONTROL_FD`,
outside every sandbox, as the server's user (root, or one who owns the sandboxes' user
namespaces: setns(2) gives it every capability there), in `/`, with the environment a sandbox's
execd has (bwrap's `--clearenv --setenv`: what `/proc/<pid>/environ` shows of its execd is this
process's). On CONTROL_FD, a SOCK_SEQPACKET socket to the server, the first message is the
set-up (`protocol.TemplateSetup`: the capabilities MASK, the seccomp filter, the home, the
package's view); every later one a request, answered in order: a `protocol.Fork` of init's pid
with `protocol.FORK_FDS` descriptors (init's pidfd, then execd's standard input, its standard
error, the relay socket, the ready pipe and the exit pipe, all write or read ends as `main.py`
and the placeholder use them), answered `protocol.ForkAnswer` (the execd's host pid, with a
pidfd of the execd; or why not). EOF on it ends the template.

For a request the template forks a child that keeps only that request's descriptors, joins the
sandbox's cgroups (the request names their `cgroup.procs` files), joins every namespace of init
(bwrap's child) at once through its pidfd (setns(2), Linux 5.8), refusing to go on if init's
user, mount, PID, network, IPC or UTS namespace is the host's, takes init's resource limits
(those the server gave bwrap), forks the execd (a process of the PID namespace) and exits. The
execd takes what bubblewrap gives the process it starts: its descriptors as 0-4 (stdout on
/dev/null), the rest closed; a new session; uid and gid 0 of the namespace and no supplementary
groups (where the namespace denies setgroups, a server's own-uid map, the server's, as bwrap's
child and execd keep them); MASK as its bounding, effective, permitted, inheritable and ambient
capabilities; no_new_privs; the home as its working directory; default signal handling; and the
seccomp filter, loaded last. Then it runs `main.main` and exits with its code. The template is
its subreaper (the middle child's exit hands the execd to it): it waits for its end on a pidfd,
reaps it and writes its exit status (128+N for signal N, as bwrap reports one) to the exit
pipe, where the container's placeholder reads it and exits with it. Once the template is gone
nobody writes it: the server sees the execd's end on its pidfd.

Nothing of the server crosses: the template is its own process, started clean, holding only
these modules and, while it forks, one request's descriptors. The execds forked from it share
its hash seed (`random` is reseeded in each). Nothing of a container crosses into it either:
the forked child imports nothing more from files (`seal_imports`), as the template's paths
name, in a container of an image, the image's files; the request's working directory is the
container's (an image's WorkingDir).
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import importlib.machinery
import os
import resource
import selectors
import signal
import socket
import sys
import traceback
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from osb_sync.local.execd import main
else:  # run by path with -I: this directory is not on sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import main

    del sys.path[0]
# importable once `main` is (it loads the package without the client)
from osb_sync.local.protocol import FORK_FDS, Fork, ForkAnswer, TemplateSetup

PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
CAPABILITY_VERSION_3 = 0x20080522
# (name in /proc/<pid>/ns, CLONE_NEW* flag); cgroup last: the only one init may share
NAMESPACES = (
    ("user", 0x10000000),
    ("mnt", 0x00020000),
    ("pid", 0x20000000),
    ("net", 0x40000000),
    ("ipc", 0x08000000),
    ("uts", 0x04000000),
    ("cgroup", 0x02000000),
)
MESSAGE_SIZE = 1 << 16

_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, *[ctypes.c_ulong] * 4]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, arg: int = 0, arg3: int = 0) -> None:
    """prctl(2), raising OSError."""
    _check(_libc.prctl(option, arg, arg3, 0, 0), f"prctl({option})")


def enter_namespaces(pidfd: int, init: int) -> None:
    """Join every namespace of process `init` (named by `pidfd`) that this process is not in.

    Raises:
        OSError: init shares one of the namespaces that must be its own, or setns refused.
    """
    flags = 0
    for name, flag in NAMESPACES:
        if os.stat(f"/proc/{init}/ns/{name}").st_ino != os.stat(f"/proc/self/ns/{name}").st_ino:
            flags |= flag
        elif name != "cgroup":
            raise OSError(f"the container's init is in the host's {name} namespace")
    _check(_libc.setns(pidfd, flags), "setns")


def set_capabilities(mask: int) -> None:
    """Make `mask` the bounding, effective, permitted, inheritable and ambient sets."""
    with open("/proc/sys/kernel/cap_last_cap") as last:
        last_cap = int(last.read())
    for cap in range(last_cap + 1):
        if not mask >> cap & 1:
            prctl(PR_CAPBSET_DROP, cap)
    header = _CapHeader(CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    for index in (0, 1):
        part = mask >> (32 * index) & 0xFFFFFFFF
        data[index] = _CapData(part, part, part)
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    for cap in range(last_cap + 1):
        if mask >> cap & 1:
            prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap)


def load_seccomp(program: bytes) -> None:
    """Load the classic-BPF `program` (struct sock_filter[]) as this process's filter."""
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor not in `keep`: close_range(2) between them (the template holds
    two per live sandbox; one close(2) each from Python grew every fork with their number)."""
    low = 0
    for fd in sorted(keep):
        if fd > low:  # (CPython passes closerange(0, 0) on as close_range(0, ~0): all)
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def view_package(view: str) -> None:
    """Name the package's modules' files where the container sees them (`view`), as an execd
    started there would: its workers' command lines show no host path. The template does it
    once, before it forks: an execd that did it itself wrote to every module it has (their
    counts, their dictionaries), un-sharing ~0.7 MiB of the template's pages per sandbox."""
    host = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(main.__file__))))
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.startswith(host + os.sep):
            module.__file__ = view + path[len(host) :]


def _place(fds: list[int]) -> None:
    """Move `fds` (stdin, stderr, relay, ready) to 0, 2, 3, 4, /dev/null to 1; close the rest."""
    above = max(fds) + 1  # copies clear of every descriptor `fds` still holds
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, above) for fd in fds]
    null = fcntl.fcntl(os.open("/dev/null", os.O_WRONLY), fcntl.F_DUPFD, above)
    for fd, target in zip((high[0], null, *high[1:]), range(5), strict=True):
        os.dup2(fd, target)
    _close_all_but({0, 1, 2, 3, 4})


def _setgroups_denied() -> bool:
    """Whether this user namespace denies setgroups(2): a non-root server's own-uid map (the
    kernel's rule for a map written without privilege), whose processes keep the server's
    groups, as bwrap's do there."""
    with open("/proc/self/setgroups") as state:
        return state.read().strip() == "deny"


def seal_imports() -> None:
    """Import nothing more from files, only what is built into the interpreter: once in the
    container, the paths of the template's modules name the container's files (an image's,
    or none), which a forked execd must never load. What execd imports is imported before
    (`preload`), and a route that still wants a module more fails on it, alone."""
    sys.meta_path[:] = [
        finder
        for finder in sys.meta_path
        if finder in (importlib.machinery.BuiltinImporter, importlib.machinery.FrozenImporter)
    ]
    sys.path_importer_cache.clear()


def _execd(setup: TemplateSetup, fds: list[int], home: str | None) -> NoReturn:
    """The execd: take bwrap's confinement (see the module docstring), then serve."""
    code = 1
    try:
        _place(fds)
        os.setsid()
        if not _setgroups_denied():
            os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        set_capabilities(setup.capabilities)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the rest as Python set them at start
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        os.chdir(home or setup.home)
        if "random" in sys.modules:
            sys.modules["random"].seed()
        if setup.seccomp:
            load_seccomp(setup.seccomp)
        code = main.main(["main.py", "3", "4"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 (the container's log is the only place to say it)
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _lower(one: int, other: int) -> int:
    """The lower of two rlimit values (RLIM_INFINITY is the highest)."""
    if one == resource.RLIM_INFINITY:
        return other
    return one if other == resource.RLIM_INFINITY else min(one, other)


def take_limits(init: int) -> None:
    """Take the resource limits of process `init`: what the server gave bwrap, and so what an
    execd bwrap starts has (a limit it sets per sandbox included). Only ever lowered: a limit
    above this process's own hard one (which needs privilege) stays this process's."""
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            kind = getattr(resource, name)
            soft, hard = resource.prlimit(init, kind)
            hard = _lower(hard, resource.getrlimit(kind)[1])
            resource.setrlimit(kind, (_lower(soft, hard), hard))


def join_groups(groups: tuple[str, ...]) -> None:
    """Move this process into the cgroups whose `cgroup.procs` files `groups` names, while it
    still has the server's ids: cgroup v1 lets a server that is not root move only processes
    of its own uid, which the execd, root of a namespace mapped onto a range, is not."""
    for procs in groups:
        fd = os.open(procs, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)


def _middle(setup: TemplateSetup, request: Fork, fds: list[int], report: int) -> NoReturn:
    """The child between the template and the execd: join the sandbox's groups, enter init's
    namespaces, fork, report."""
    try:
        main.hide_memory()  # and the execd's, from its first moment in the namespaces
        seal_imports()
        _close_all_but({*fds, report})
        init = request.init
        join_groups(request.groups)  # the execd is born there
        enter_namespaces(fds[0], init)
        take_limits(init)
        pid = os.fork()
        if pid == 0:
            os.close(report)
            _execd(setup, fds[1:5], request.home)
        os.write(report, ForkAnswer(pid=pid).encode())
    except BaseException as exc:  # noqa: BLE001 (answered to the server)
        os.write(report, ForkAnswer(error=f"{type(exc).__name__}: {exc}").encode())
    os._exit(0)


def fork_execd(setup: TemplateSetup, request: Fork, fds: list[int]) -> ForkAnswer:
    """Fork one sandbox's execd for `request` (see the module docstring); the answer."""
    report_r, report_w = os.pipe()
    try:
        middle = os.fork()
        if middle == 0:
            os.close(report_r)
            _middle(setup, request, fds, report_w)
        os.close(report_w)
        report_w = -1
        answer = b""
        while chunk := os.read(report_r, 4096):
            answer += chunk
        os.waitpid(middle, 0)
    finally:
        os.close(report_r)
        if report_w >= 0:
            os.close(report_w)
    return ForkAnswer.decode(answer) if answer else ForkAnswer(error="the forking child died")


def _report(pid: int, exit_fd: int) -> None:
    """Reap the ended execd `pid` and write its exit status to its exit pipe."""
    try:
        _, status = os.waitpid(pid, 0)
        code = main.container_status(os.waitstatus_to_exitcode(status))
    except ChildProcessError:
        code = 1  # not ours to reap (cannot happen: the template is its subreaper)
    try:
        os.write(exit_fd, f"{code}\n".encode())
    except OSError:
        pass  # the container is gone already
    os.close(exit_fd)


def serve(control: socket.socket) -> None:
    """Answer the server's requests until it closes the socket.

    Each execd's end is seen on its pidfd, readable once it has exited: SIGCHLD is left to its
    default (no handler), so a sandbox that stops and continues its own execd, each time
    signalling its parent, never wakes the template.
    """
    setup = TemplateSetup.decode(control.recv(MESSAGE_SIZE))
    view_package(setup.package_view)  # once for every execd: their pages stay the template's
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    gc.freeze()  # the collector leaves the template's objects (and their pages) alone
    with selectors.DefaultSelector() as selector:
        selector.register(control, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj != control:  # an execd's pidfd: it ended
                    pid, exit_fd = key.data
                    selector.unregister(key.fileobj)
                    os.close(key.fd)
                    _report(pid, exit_fd)
                    continue
                message, fds, _, _ = socket.recv_fds(control, MESSAGE_SIZE, FORK_FDS)
                if not message:
                    return
                answer = ForkAnswer(error=f"a request needs its {FORK_FDS} descriptors")
                execd = -1
                try:
                    if len(fds) == FORK_FDS:
                        answer = fork_execd(setup, Fork.decode(message), fds)
                    if answer.pid is not None:
                        # not reaped before its pidfd says so: the pid is still the execd's
                        execd = os.pidfd_open(answer.pid)
                except ValueError as exc:  # a request of another shape
                    answer = ForkAnswer(error=str(exc))
                except OSError as exc:  # out of descriptors or processes: this request only
                    if answer.pid is not None:  # forked, but it could not be followed
                        os.kill(answer.pid, signal.SIGKILL)
                        os.waitpid(answer.pid, 0)
                    answer = ForkAnswer(error=f"{type(exc).__name__}: {exc}")
                finally:
                    for fd in fds[:-1] if answer.pid is not None else fds:
                        os.close(fd)
                if answer.pid is not None:
                    # never blocking: a sandbox may fill its placeholder's pipe
                    os.set_blocking(fds[-1], False)
                    selector.register(execd, selectors.EVENT_READ, (answer.pid, fds[-1]))
                    socket.send_fds(control, [answer.encode()], [execd])
                else:
                    control.send(answer.encode())


def preload() -> None:
    """Import what execd runs, and what the standard library imports as it goes (a forked
    execd imports nothing more: `seal_imports`): the codec of a host name given as text, the
    relay's `socket.create_connection(("127.0.0.1", port))`. (A traceback formatted there
    goes without the carets whose `ast` it cannot import.)"""
    main.load_package()
    import encodings.idna  # noqa: F401

    from osb_sync.local.execd import router, runner  # noqa: F401 (imported for the execds)
    from osb_sync.local.http import exchange, httpd  # noqa: F401


def run(argv: list[str]) -> int:
    """Import what execd runs (`preload`), then serve the socket on descriptor `argv[1]`."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the server's spawner thread started it
    preload()
    serve(socket.socket(fileno=int(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv))
