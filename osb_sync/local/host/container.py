"""A sandbox's container on the host side: start, reach, pause, resume and delete it.

The container's main process is `execd/main.py` (our execd, JUPYTER_PORT and a relay, then the
sandbox's entrypoint, whose end ends it: `entrypoint.py`), started under bubblewrap
(`bwrap.py`), or as a plain subprocess where isolation is impossible; where its root view
allows (`RootView.template`: the default one, an image with the placeholder's shells), bwrap
runs a placeholder and the execd template forks execd into the container's namespaces
(`execd_template.py`: a new Python per sandbox costs ~80 ms and ~12 MiB). The server reaches
the container only through a listening Unix socket it makes in a host directory the sandbox
cannot see and hands to the main process as an inherited descriptor.

bwrap runs with `--die-with-parent`, which fires when the *thread* that started it ends: every
container starts from one long-lived spawner thread, never from a request's handler thread.
Deleting a container kills the init process of its PID namespace (every process in it dies with
it, whatever it did to escape its group); pause freezes its freezer cgroup where one can be made,
else stops every process of the namespace. A sandbox that may reach the internet gets
`slirp4netns`, behind nftables tables in its own network namespace that keep it from every
address of this host (`firewall.py`); a deny-all one keeps loopback only.

A root server's sandbox writes on one tmpfs of its own (`disk.py`), mounted at `disk/` of its
run directory: its writable directories, its home (the `<id>` directory of the server's root is
a relative link to `<id>.run/disk/home`, so the pair can move as a spare's do) and an image's
writable layer. Deleting the sandbox detaches the tmpfs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from ..protocol import Claim, Start
from . import (
    bwrap,
    disk,
    egress,
    execd_template,
    identity,
    logs,
    package,
    seccomp,
    spawn,
    staging,
    volumes,
)
from .cgroup import Cgroup
from .cgroup import parent_dir as cgroup_parent_dir
from .cgroup2 import Group as Cgroup2
from .cgroup2 import groups as make_groups
from .execd_binary import ExecdBinary
from .images.config import ConfigError
from .limits import Plan, limit_processes
from .outbound import Outbound
from .rootview import HostView, Places, RootView
from .spawn import SPAWNER, pidfd, read_until, signal_pids
from .volumes import Bind

logger = logging.getLogger("osb_sync.local")

# Run by path, never imported here: execd/ is the sandbox side of the security line.
MAIN_SCRIPT = str(Path(__file__).parents[1] / "execd" / "main.py")
IN_CONTAINER_JUPYTER_PORT = 44771
IN_CONTAINER_EXECD_PORT = 44772
START_TIMEOUT = 30.0
START_ATTEMPTS = 3
BINARY_START_TIMEOUT = 60.0  # a Jupyter server takes seconds to start, more on a busy machine
STOP_TIMEOUT = 5.0
OOM_CONTROL = "/run/osb-oom-control"  # the sandbox's memory.oom_control, as execd sees it
HOME_NAME = "home-sandbox"  # the home's directory on the sandbox's tmpfs (beside "home")


@dataclass(frozen=True)
class Launch:
    """What is fixed when a container starts.

    A cold start gives its `plan` (limits written before its processes join the groups); a
    spare gives the server's limit `controllers` (groups made, configured at claim).
    """

    binary: ExecdBinary | None = None  # an execd binary to run instead of ours
    mounts: tuple[Bind, ...] = ()  # its volumes, opened (see `volumes.py`)
    plan: Plan | None = None
    controllers: frozenset[str] = frozenset()
    view: RootView = field(default_factory=HostView)  # the host's view, or an image's


@dataclass(frozen=True)
class Assignment:
    """What a create gives a launched container at its claim (a spare's, or a cold start's)."""

    token: str = field(repr=False)  # execd's access token
    env: dict[str, str] = field(repr=False)  # the sandbox's variables
    entrypoint: tuple[str, ...] | None = None  # started once execd serves (`entrypoint.py`)
    limits: Plan = field(default_factory=Plan)  # a spare writes them at claim
    internet: bool = False  # outbound access (slirp4netns) instead of loopback only
    rules: egress.Rules | None = None  # by name only (`egress.py`)


def _memfd(fds: contextlib.ExitStack, name: str, data: bytes) -> int:
    """A descriptor holding `data`, read from 0 (inherited only through pass_fds), closed
    with `fds`."""
    fd = os.memfd_create(name, 0)
    fds.callback(os.close, fd)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class SandboxContainer:
    """The container (or, without isolation, the process) that runs one sandbox's execd."""

    def __init__(
        self,
        sandbox_id: str,
        root: Path,
        support: bwrap.Support,
        log_budget: logs.LogBudget | None = None,
    ) -> None:
        self.home = root / sandbox_id
        self.run_dir = root / f"{sandbox_id}.run"
        self.support = support
        self.isolated = support.bwrap is not None
        self.ids = support.ids if self.isolated else None
        if self.isolated and self.ids is None:
            raise RuntimeError("an isolated sandbox needs an id range (bwrap.probe finds it)")
        self._disk = disk.mode(support, False)
        self._disk_size = (disk.DEFAULT_BYTES, disk.DEFAULT_INODES)  # what it has now
        root.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(mode=0o700)
        self._dir_fd = -1
        self._disk_fd = -1  # its tmpfs's root, once detached from the server's namespace
        try:
            self._make_dirs(root)
            self._dir_fd = os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY)
            self._relay = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except BaseException:
            # EMFILE at a server's descriptor limit, a full disk: nothing of it may outlive
            # this (a mounted tmpfs would hold its directory past the server's own removal)
            if self._dir_fd >= 0:
                os.close(self._dir_fd)
            self._remove_dirs()
            raise
        # Through the directory's descriptor, the path stays short (a socket path holds ~107
        # bytes), however long the root directory's name.
        self._relay_path = f"/proc/self/fd/{self._dir_fd}/relay.sock"
        self.init_pid: int | None = None
        self._init_fd = -1  # a pidfd of init: a pid can be reused once its process is gone
        self._netns = -1  # its network namespace, which the firewall and slirp4netns enter
        self._proc: subprocess.Popen[bytes] | None = None
        self.on_event: Callable[[str], None] | None = None  # a line for its events
        self._outbound = Outbound(self._event)  # its way out, once it has internet access
        self._cgroup: Cgroup | Cgroup2 | None = None
        self._limits = Plan()
        self._settings = Launch()
        self._frozen = False
        self._closed = False
        self._ready_r = -1
        self._log_budget = log_budget  # its server's, for every container's log
        self._log: logs.ContainerLog | None = None  # its processes' standard error
        self._held = contextlib.ExitStack()  # what its root view keeps while it lives
        self._root_note = ""  # what the status says of its root (an image's)
        self._volume_note = ""  # what it says of its volumes (`_volume_binds`)
        self._staging = staging.Staging(self.ids)  # host binds while bwrap starts
        self.launched_at = 0.0  # time.monotonic() when its main process started
        self._execd_in: BinaryIO | None = None  # execd's stdin where the template forked it
        self._forked: execd_template.Forked | None = None  # that execd
        self._held_template = False
        self._lock = threading.Lock()

    def _make_dirs(self, root: Path) -> None:
        """The home, the run directory's tree and, on a root server, the disk's tmpfs."""
        if self._disk == "tmpfs" and self.ids is not None:
            self._data.mkdir()
            disk.mount(self._data, *self._disk_size, self.ids.gid)
            self._writable(bwrap.SANDBOX_HOME).mkdir()
            self.home.symlink_to(Path(self.run_dir.name, disk.MOUNT_DIR, HOME_NAME))
        else:
            self.home.mkdir()
        for place in bwrap.WRITABLE:  # the home is made above
            if place != bwrap.SANDBOX_HOME:
                self._writable(place).mkdir()
        self._writable("/tmp").chmod(0o1777)  # noqa: S108 (the container's own /tmp)
        if self.ids is not None:
            # bwrap runs as the range's root: it must reach and write these (a root server's)
            identity.admit(root, self.ids)
            identity.admit(self.run_dir, self.ids)
            for place in bwrap.WRITABLE:
                identity.give(self._writable(place), self.ids)

    def _remove_dirs(self) -> None:
        """Undo `_make_dirs` (all or part of it): unmount the disk, remove the directories."""
        if self._disk == "tmpfs":
            self.home.unlink(missing_ok=True)  # before its descriptor's number is free
            if self._disk_fd >= 0:  # its files go with bwrap's namespace
                os.close(self._disk_fd)
                self._disk_fd = -1
            else:
                disk.unmount(self._data)  # its files go with it
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def launch(self, ping: float, grace: float, settings: Launch) -> None:
        """Start the container up to its claim (a warm spare); RuntimeError if it does not.

        Args:
            ping: execd's heartbeat interval, seconds.
            grace: seconds /command keeps its stream open after the terminal event.
            settings: what is fixed when bwrap starts (binds, execd binary, limit groups, the
                root view).
        """
        self._settings = settings
        self._limits = settings.plan or Plan()
        if self._disk == "per-directory" and not isinstance(settings.view, HostView):
            self._disk = "none"  # an image's root is its copy, no tmpfs (`disk.mode`)
        if self._limits.disk is not None and self._limits.disk != self._disk_size:
            if self._disk == "tmpfs":
                disk.resize(self._data, *self._limits.disk)
            self._disk_size = self._limits.disk
        self._relay.bind(self._relay_path)
        os.chmod(self._relay_path, 0o600)
        self._relay.listen(128)
        self._ready_r, ready_w = os.pipe()  # its read end is the container's (claim, close)
        deadline = time.monotonic() + START_TIMEOUT
        view = settings.view
        # The template's execds share one filter and capability set: not a guarded one's.
        templated = (
            view.template
            and not self._guarded
            and execd_template.usable(self.support, settings.binary)
        )
        try:
            with contextlib.ExitStack() as fds:  # every descriptor of this start
                fds.callback(self._started)
                child = fds.enter_context(contextlib.ExitStack())  # the ends it inherits
                (fds if templated else child).callback(os.close, ready_w)
                info_r, info_w = os.pipe()
                fds.callback(os.close, info_r)
                child.callback(os.close, info_w)
                block_r, block_w = os.pipe()  # bwrap waits on it for its namespace's id maps
                child.callback(os.close, block_r)
                fds.callback(os.close, block_w)
                userns = -1  # not root: a namespace mapped before bwrap joins it
                if self.isolated and self.ids is not None and not self.ids.by_root:
                    userns = identity.user_namespace(self.ids)
                    child.callback(os.close, userns)
                execd_r = self._spawn(fds, templated, (ready_w, info_w, block_r), userns)
                child.close()  # the child has its copies: their ends read EOF once it is gone
                if not templated:
                    self._send(self._start(ping, grace))
                if self.isolated and self.ids is not None:
                    self._map_ids(info_r, block_w, deadline)
                if templated:
                    self._fork_execd(ready_w, execd_r, deadline)
                    self._send(self._start(ping, grace))
                if read_until(self._ready_r, b"\n", deadline) != b"ready\n":
                    raise RuntimeError(f"the sandbox's execd did not start: {self._log_tail()}")
                self._open_netns()
                if self._disk == "per-directory":  # before anything of the sandbox's runs
                    self._limit_disk_inside(*self._disk_size)
        except ConfigError:
            raise  # the image's: the create names it (`registry.py`)
        except (OSError, ValueError, KeyError) as exc:
            raise RuntimeError(
                f"the sandbox's container did not start ({exc}): {self._log_tail()}"
            ) from None

    def _spawn(
        self, fds: contextlib.ExitStack, templated: bool, ends: tuple[int, int, int], userns: int
    ) -> int:
        """Start the main process: bwrap (the template forks execd into it later), or, where
        nothing is isolated, execd itself; `ends` are the child's ready, info and block ends,
        `userns` the user namespace it joins (-1: it makes one). Returns the read end of
        execd's standard input where the template forks it, else -1."""
        ready_w, info_w, block_r = ends
        view = self._settings.view
        log = self._log = logs.ContainerLog(self._log_budget)
        command = [str(self._relay.fileno()), str(ready_w)]
        passed: list[int] = [info_w, block_r]  # what the child inherits
        execd_r = -1
        if templated:
            execd_template.TEMPLATE.hold()
            self._held_template = True
            execd_r, execd_w = os.pipe()
            fds.callback(os.close, execd_r)
            self._execd_in = os.fdopen(execd_w, "wb")
        else:
            passed = [self._relay.fileno(), ready_w, *passed]
        # As the range's root where the server writes the maps (root): bwrap refuses,
        # as uid 0, to map ids other than its own.
        as_range = self.ids is not None and self.ids.by_root
        if self.isolated:
            files = view.identity_files()
            passwd = _memfd(fds, "passwd", files[0]) if files else -1
            group = _memfd(fds, "group", files[1]) if files else -1
            caps = bwrap.VOLUME_CAPABILITIES if self._guarded else bwrap.CAPABILITIES
            ident = bwrap.identity_options(block_r, passwd, group, userns, caps)
            options = self._options(fds, info_w, ident)
            main = view.main_command(MAIN_SCRIPT)
            if templated:  # the template forks execd; bwrap runs the placeholder
                main, command = execd_template.placeholder(userns), []
            argv = [self.support.bwrap or "bwrap", "--args", str(options[0]), *main, *command]
            passed += [*options, *(fd for fd in (passwd, group, userns) if fd >= 0)]
            if not staging.available() and not self._mounts_inside:
                passed += [bind.fd for bind in self._settings.mounts]  # bwrap's --bind-fd
            self._make_cgroups()
            if self._cgroup is not None and not as_range:  # v1: only its own processes
                argv = self._cgroup.joining(argv)
        else:
            argv = [sys.executable, "-I", "-S", package.pinned(MAIN_SCRIPT), *command]
        as_ids = spawn.as_ids(argv, self.ids.uid, self.ids.gid) if as_range and self.ids else None
        setids, argv = as_range and as_ids is None, as_ids or argv
        self._proc = SPAWNER.run(
            lambda: subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE if templated else subprocess.DEVNULL,
                stderr=log.writer,
                pass_fds=passed,
                # not its disk (detached once bwrap runs): recovery finds it by its cwd
                cwd=self.run_dir if self.isolated else self.home,
                env=dict(bwrap.BWRAP_ENV) if self.isolated else self._plain_env(),
                start_new_session=True,
                user=self.ids.uid if setids and self.ids else None,
                group=self.ids.gid if setids and self.ids else None,
                extra_groups=[] if setids else None,
            )
        )
        self.launched_at = time.monotonic()
        return execd_r

    def _map_ids(self, info_r: int, block_w: int, deadline: float) -> None:
        """Once bwrap made its namespaces: put it and its child in the sandbox's groups, write
        the namespace's id maps, and let it go on."""
        assert self._proc is not None and self.ids is not None
        info = read_until(info_r, b"}", deadline)
        self.init_pid = int(json.loads(info)["child-pid"])
        self._init_fd = pidfd(self.init_pid)
        if self.ids.by_root:  # else once it runs: `_open_netns`
            self._netns = spawn.namespace(self._init_fd, self.init_pid, "net")
        # Nothing of the sandbox's runs before this write: bwrap and its child (the only
        # processes yet) join the groups, then the namespace gets its ids.
        if self._cgroup is not None and self.ids.by_root:  # else joined before bwrap ran
            self._cgroup.join(self._proc.pid)
            self._cgroup.join(self.init_pid)
        if self.ids.by_root:  # else mapped before bwrap joined it
            identity.write_maps(self.init_pid, self.ids)
        elif self._mounts_inside and self._settings.mounts:
            # bwrap's child waits on the block pipe with its mounts made, its old root gone
            # and nothing run yet (dumpable again: its namespaces are the server's to open).
            spawn.await_pipe_read(self._init_fd, self.init_pid, deadline)
            mntns = spawn.namespace(self._init_fd, self.init_pid, "mnt")
            try:
                userns = spawn.owning_user_namespace(mntns)
                try:
                    volumes.mount_inside(userns, mntns, self._settings.mounts)
                except BaseException:
                    # bwrap's child takes the block pipe's end for a go: it must not run
                    # with some of its volumes missing
                    signal.pidfd_send_signal(self._init_fd, signal.SIGKILL)
                    raise
                finally:
                    os.close(userns)
            finally:
                os.close(mntns)
        os.write(block_w, b"1")

    def _limit_processes(self, count: int) -> None:
        """`limits.limit_processes` for this sandbox's processes (OSError if refused)."""
        if self.init_pid is None:
            raise OSError("the sandbox's init is not known")
        ranged_root = self.ids is not None and self.ids.by_root
        limit_processes(spawn.pids_in_namespace(self.init_pid), count, ranged_root)

    def _limit_disk_inside(self, size: int, inodes: int) -> None:
        """`disk.limit_inside` for this sandbox (a server not root; OSError if refused)."""
        if self.init_pid is None:
            raise OSError("the sandbox's init is not known")
        disk.limit_inside(self._init_fd, self.init_pid, size, inodes)

    def _open_netns(self) -> None:
        """Hold the network namespace of a sandbox of a server that is not root, once it runs.

        Not before: bwrap's child, switching to the joined namespace's root
        (`identity.user_namespace`), is briefly not dumpable, and its `/proc` entries are not
        the server's to open.
        """
        if self._netns < 0 and self.init_pid is not None:
            self._netns = spawn.namespace(self._init_fd, self.init_pid, "net")

    def _started(self) -> None:
        """What a start holds only until bwrap has its copies (or failed): the staged binds,
        the log's write end (its processes, and the template, hold theirs), and the disk's
        mount (`_detach_disk`)."""
        self._staging.release()
        self._detach_disk()
        if self._log is not None:
            self._log.release_writer()

    def _detach_disk(self) -> None:
        """Once bwrap has its copy, take the sandbox's tmpfs (and an image's overlay on it) out
        of the server's mount namespace, which every bwrap copies (and bwrap 0.8 reads again
        after each bind: starts grew with live sandboxes, issue 50); a descriptor reaches it."""
        if self._disk != "tmpfs" or self._disk_fd >= 0 or not self._data.is_dir():
            return
        try:
            self._disk_fd = disk.detach(self._data)
        except OSError as exc:  # it keeps its mount: slower starts, nothing lost
            logger.warning("local server: a sandbox's disk stays mounted: %s", exc)
            return
        # the home's link names the disk through the descriptor now (relative, it would lead
        # to the empty directory the mount was on)
        link = self.run_dir / "home.link"
        link.symlink_to(self._data / HOME_NAME)
        link.rename(self.home)

    def _fork_execd(self, ready_w: int, execd_r: int, deadline: float) -> None:
        """Once the placeholder is up, have the template fork execd into the namespaces."""
        assert self._proc is not None and self._proc.stdout is not None
        assert self._proc.stdin is not None and self.init_pid is not None
        with self._proc.stdout:
            if read_until(self._proc.stdout.fileno(), b"\n", deadline) != b"up\n":
                raise RuntimeError(f"the sandbox's container did not start: {self._log_tail()}")
        if self._init_fd < 0:
            raise RuntimeError("the sandbox's init has no pidfd: the template cannot join it")
        assert self._log is not None
        fds = (self._init_fd, execd_r, self._log.writer, self._relay.fileno(), ready_w)
        # The template's child joins them before it forks the execd: a server that is not root
        # could not move it there once it is the range's root.
        groups = (
            [str(d / "cgroup.procs") for d in self._cgroup.dirs.values()] if self._cgroup else []
        )
        self._forked = execd_template.TEMPLATE.fork(
            self.init_pid,
            (*fds, self._proc.stdin.fileno()),
            self.support.seccomp,
            groups,
            self._settings.view.home(self._plain_home),
        )

    def claim(self, assignment: Assignment) -> None:
        """Make a launched container the sandbox's: network, env and token; then it serves.

        Raises:
            RuntimeError: the container died, or its execd did not start serving.
        """
        binary = self._settings.binary
        deadline = time.monotonic() + START_TIMEOUT + (BINARY_START_TIMEOUT if binary else 0)
        try:
            if assignment.internet and self.support.slirp and self.init_pid is not None:
                self._connect(deadline, assignment.rules)
            claim = Claim(
                assignment.token,
                self._settings.view.environment(assignment.env, self._plain_home),
                assignment.entrypoint,
                self._limits.address_space,
                self._limits.processes,
            )
            if self._limits.processes is not None:
                self._limit_processes(self._limits.processes)
            self._send(claim)
            if read_until(self._ready_r, b"\n", deadline) != b"serving\n":
                raise RuntimeError(f"the sandbox's execd did not start: {self._log_tail()}")
        except (OSError, ValueError) as exc:
            raise RuntimeError(
                f"the sandbox's container did not start ({exc}): {self._log_tail()}"
            ) from None
        finally:
            os.close(self._ready_r)
            self._ready_r = -1

    def set_internet(self, internet: bool, rules: egress.Rules | None = None) -> bool:
        """Give the running container outbound access (slirp4netns), by name only where
        `rules` (`egress.py`), or take it away.

        Taking it away stops slirp4netns: its tap device, the namespace's only way out, goes
        with it, and the sandbox keeps loopback only. Returns whether it has outbound access
        now (False where slirp4netns is missing or the container is not isolated).

        Raises:
            ProcessLookupError: the container has exited (its network is nobody's business).
            RuntimeError, OSError: slirp4netns did not start, or the tables could not change.
        """
        with self._lock:
            if self._closed or self.init_pid is None:
                return False
            if not self.alive() or (self._init_fd >= 0 and spawn.exited(self._init_fd)):
                raise ProcessLookupError("the sandbox's container has exited")
            if internet and not self._outbound.connected and self.support.slirp:
                self._connect(time.monotonic() + START_TIMEOUT, rules)
            elif internet and self._outbound.connected:
                self._outbound.change(rules)
            elif not internet:
                self._outbound.disconnect()
            return self._outbound.connected

    def _event(self, line: str) -> None:
        report = self.on_event
        if report is not None:
            report(line)

    def _connect(self, deadline: float, rules: egress.Rules | None = None) -> None:
        """Give the running container its way out (`outbound.py`), by name only where `rules`.

        Raises:
            RuntimeError: the firewall's tools are missing or failed, or slirp4netns did not
                configure the network.
        """
        assert self.support.slirp is not None and self._netns >= 0 and self.ids is not None
        self._outbound.connect(
            self.support.firewall, self.support.slirp, self._netns, self.ids, deadline, rules
        )

    @property
    def network(self) -> str:
        """How the sandbox reaches out: "slirp4netns", or "none" (loopback only)."""
        return self._outbound.network

    def apply_limits(self, plan: Plan) -> None:
        """Write `plan`'s cgroup limits into a launched spare's (unconfigured) groups.

        Raises:
            RuntimeError: a group is missing, or the kernel refused a value (a memory limit
                below what the spare already uses: EBUSY).
        """
        if self._settings.plan is not None:
            return  # a cold start: written before its processes joined
        if plan.disk is not None and plan.disk != self._disk_size:
            try:
                if self._disk == "tmpfs":
                    disk.resize(self._disk_fd if self._disk_fd >= 0 else self._data, *plan.disk)
                elif self._disk == "per-directory":
                    self._limit_disk_inside(*plan.disk)
                else:
                    raise OSError("it has no disk limit")
            except OSError as exc:
                raise RuntimeError(f"the spare's disk could not be resized: {exc}") from None
            self._disk_size = plan.disk
        missing = set(plan.cgroup) - set(self._cgroup.dirs if self._cgroup else ())
        if missing:
            raise RuntimeError(f"the spare has no {', '.join(sorted(missing))} group")
        try:
            if self._cgroup is not None:
                self._cgroup.configure(plan.cgroup)
        except OSError as exc:
            raise RuntimeError(f"the spare's limits could not be written: {exc}") from None
        self._limits = plan

    def move_to(self, root: Path) -> None:
        """Move the sandbox's host directories under `root` (a claimed spare's, isolated only).

        The container keeps its binds: mounts follow the directories, not their names.
        """
        assert self.isolated
        home, run_dir = root / self.home.name, root / self.run_dir.name
        self.home.rename(home)
        self.home = home
        self.run_dir.rename(run_dir)
        self.run_dir = run_dir

    def alive(self) -> bool:
        """True while the container's main process runs."""
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        """The main process's exit code once it ended (bwrap: 128+N for signal N), else None."""
        return self._proc.poll() if self._proc is not None else None

    def execd_lost(self) -> bool:
        """Whether the template's execd ended after the template did, its exit reported to
        nobody (bwrap's placeholder waits on): the container is dead all the same."""
        with self._lock:  # close() closes the pidfd after it marked the container closed
            if self._closed or self._forked is None or not self._forked.lost():
                return False
        assert self._proc is not None
        try:  # a status the template wrote just before it ended is on its way
            self._proc.wait(0.2)
        except subprocess.TimeoutExpired:
            return True
        return False

    def group(self, controller: str) -> Path | None:
        """The sandbox's group of `controller`, if it has one."""
        return self._cgroup.dirs.get(controller) if self._cgroup is not None else None

    def _send(self, message: Start | Claim) -> None:
        """Write one line to execd's standard input (bwrap's, unless the template forked it)."""
        assert self._proc is not None and self._proc.stdin is not None
        target = self._execd_in or self._proc.stdin
        target.write(message.encode())
        target.flush()

    @property
    def _data(self) -> Path:
        """Where the sandbox's writable directories are: its tmpfs (once detached, through
        its descriptor: a path the server's children can follow too), else its run directory."""
        if self._disk_fd >= 0:
            return Path(f"/proc/{os.getpid()}/fd/{self._disk_fd}")
        return self.run_dir / disk.MOUNT_DIR if self._disk == "tmpfs" else self.run_dir

    def _writable(self, place: str) -> Path:
        """The host directory of the sandbox's writable `place` (one of `bwrap.WRITABLE`)."""
        if place == bwrap.SANDBOX_HOME:
            return self._data / HOME_NAME if self._disk == "tmpfs" else self.home
        if place == bwrap.EXECD_STATE_DIR:
            return self._data / "execd"
        return self._data / place.strip("/")

    def snapshot_dirs(self, hold: contextlib.ExitStack | None = None) -> dict[str, Path]:
        """The sandbox's writable host directories a snapshot copies: home and /tmp. With
        `hold`, a detached disk is named through a descriptor of its own that `hold` closes:
        a delete meanwhile closes the container's, whose number the next one reuses."""
        if hold is not None and self._disk_fd >= 0:
            fd = os.dup(self._disk_fd)
            hold.callback(os.close, fd)
            base = Path(f"/proc/{os.getpid()}/fd/{fd}")
            return {"home": base / HOME_NAME, "tmp": base / "tmp"}
        return {"home": self._writable(bwrap.SANDBOX_HOME), "tmp": self._writable("/tmp")}  # noqa: S108

    def _options(self, fds: contextlib.ExitStack, info_fd: int, ident: list[str]) -> list[int]:
        """bwrap's options, NUL-terminated in a descriptor (for `--args`, read from 0), and the
        seccomp filter's: the descriptors bwrap reads, the first for `--args`, closed with
        `fds`."""
        if self.ids is not None and self.ids.by_root:
            writable = bwrap.writable_binds([(self._writable(p), p) for p in bwrap.WRITABLE])
        else:
            sizes = None
            if self._disk == "per-directory":
                sizes = {p: limit[0] for p, limit in disk.split(*self._disk_size).items()}
            writable = bwrap.writable_tmpfs(bwrap.WRITABLE, sizes)
        places = Places(
            tuple(writable),
            self._data,
            self._writable(bwrap.EXECD_STATE_DIR),
            self._disk == "tmpfs",
        )
        binary, (mounts, binds) = self._settings.binary, self._volume_binds()
        extra = [*(binary.bwrap_args() if binary else []), *self._oom_bind()]
        passed: list[int] = []
        if self.support.seccomp is not None:
            guarded = seccomp.host_program(setid=True) if self._guarded else None
            passed.append(_memfd(fds, "seccomp", guarded or self.support.seccomp))
            extra = ["--seccomp", str(passed[0]), *extra]
        view = self._settings.view
        options, self._root_note = view.options(
            places, info_fd, ident, extra, mounts, binds, self._held
        )
        if staging.available():
            options = bwrap.staged(options, self._staging.add, self.ids)
        data = b"".join(os.fsencode(a) + b"\0" for a in options)
        return [_memfd(fds, "bwrap-options", data), *passed]

    @property
    def _guarded(self) -> bool:
        """Whether the sandbox has a writable volume: its files reach the host, so no set-id
        mode and no file capability is made (`seccomp.SETID_CALLS`, `bwrap.VOLUME_CAPABILITIES`).
        """
        return any(not bind.read_only for bind in self._settings.mounts)

    @property
    def _mounts_inside(self) -> bool:
        """Whether the server mounts the volumes into the sandbox's namespace itself
        (`volumes.mount_inside`): a server that is not root, whose sandboxes' root is an id of
        its range, which bwrap's `--bind-fd` would look up the volume's path as."""
        return not staging.available() and self.ids is not None and not self.ids.own

    def _volume_binds(self) -> tuple[list[str], list[Bind]]:
        """bwrap arguments that mount the sandbox's volumes from their descriptors, and the
        volumes as mounted (`Bind.mapped` None where they are not ID-mapped).

        A root server binds each descriptor onto its staging directory (`staging.py`: the
        kernel mounts the very directory the descriptor holds), ID-mapped where
        `volumes.ownership` says so, and bwrap binds that, a path no sandbox can write; any
        other server cannot mount on the host: bwrap makes the mount point and the server
        mounts the descriptor's directory there (`_mounts_inside`), or, without a range, hands
        bwrap the descriptor (`--bind-fd`, which refuses a directory other than the
        descriptor's). What the status says of each volume goes to `_volume_note`, a mapping
        the kernel refused too (the volume is then bound as it is).
        """
        args: list[str] = []
        binds: list[Bind] = []
        self._volume_note = ""
        for bind in self._settings.mounts:
            if staging.available():
                source, note, mapped = self._stage_volume(bind)
                self._volume_note += note
                args += ["--ro-bind" if bind.read_only else "--bind", source, bind.target]
            else:
                self._volume_note += bind.note
                # bwrap makes the mount point; the server mounts it (`_map_ids`)
                args += ["--dir", bind.target] if self._mounts_inside else bind.bwrap_args()
                mapped = False
            binds.append(bind if mapped else replace(bind, mapped=None))
        return args, binds

    def _stage_volume(self, bind: Bind) -> tuple[str, str, bool]:
        """Stage `bind` (a root server's), ID-mapped as it asks where the kernel and its file
        system allow, else as it is: its staging path, what the status says of it, and whether
        it is ID-mapped."""
        if bind.mapped is not None and self.ids is not None:
            uid, gid = bind.mapped
            userns = -1
            try:
                userns = identity.mount_namespace(
                    identity.mount_map(uid, self.ids.uid), identity.mount_map(gid, self.ids.gid)
                )
                source = self._staging.add_fd(bind.fd, True, bind.read_only, True, userns)
                return source, bind.note, True
            except OSError as exc:
                why = exc.strerror or str(exc)
            finally:
                if userns >= 0:
                    os.close(userns)
            note = (
                f" Volume {bind.name!r} is NOT ID-mapped ({why}: ID-mapped mounts need Linux 5.12"
                " and a file system that has them, such as ext4, xfs, btrfs or tmpfs): the"
                f" sandbox's root writes there as host uid {self.ids.uid}, where that id may."
            )
            return self._staging.add_fd(bind.fd, True, bind.read_only, volume=True), note, False
        return self._staging.add_fd(bind.fd, True, bind.read_only, volume=True), bind.note, False

    def _oom_bind(self) -> list[str]:
        """bwrap arguments that show execd its memory group's OOM counter (read-only)."""
        wanted = {*self._limits.cgroup, *self._settings.controllers}
        if "memory" not in wanted:
            return []
        place = self.support.cgroups
        group = cgroup_parent_dir("memory", place) / self.home.name
        counter = group / ("memory.events" if place.version == 2 else "memory.oom_control")
        return ["--ro-bind-try", str(counter), OOM_CONTROL]

    def _make_cgroups(self) -> None:
        """Make the sandbox's groups and write its limits (its processes join at launch)."""
        wanted = {*self._limits.cgroup, *self._settings.controllers}
        controllers = (("freezer",) if self.support.freezer else ()) + tuple(sorted(wanted))
        if controllers:
            self._cgroup = make_groups(self.home.name, controllers, self.support.cgroups)
            self._cgroup.configure(self._limits.cgroup)

    @property
    def _freezer(self) -> Cgroup | Cgroup2 | None:
        return self._cgroup if self._cgroup is not None and "freezer" in self._cgroup.dirs else None

    def _plain_env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}

    @property
    def _plain_home(self) -> str | None:
        """Its host directory where it is a plain process (no isolation), else None."""
        return None if self.isolated else str(self.home)

    def _start(self, ping: float, grace: float) -> Start:
        binary = self._settings.binary
        return Start(
            home=self._settings.view.home(self._plain_home),
            run_dir=bwrap.EXECD_STATE_DIR if self.isolated else str(self.run_dir / "execd"),
            execd_port=IN_CONTAINER_EXECD_PORT if self.isolated else 0,
            jupyter_port=IN_CONTAINER_JUPYTER_PORT if self.isolated else 0,
            ping_interval=ping,
            command_grace=grace,
            file_size_limit=bwrap.FILE_SIZE_LIMIT if self.isolated else 0,
            oom_control=OOM_CONTROL if self._oom_bind() else None,
            user=self._settings.view.user,
            execd_binary=binary.command if binary else None,
            jupyter=binary.jupyter if binary else None,
            python=self._settings.view.python,
        )

    def _log_tail(self) -> str:
        return self.log_tail(2000).strip()[-500:] or "no output"

    def log_tail(self, limit: int) -> str:
        """The container's standard error from the first whole line of its last `limit` bytes
        ("" once it is closed)."""
        with self._lock:  # close() marks it closed under the lock before the descriptor goes
            if self._closed or self._log is None:
                return ""
            return self._log.tail(limit)

    def status_note(self, internet: bool) -> str:
        """What this sandbox's isolation and network are, for its status message."""
        if not self.isolated:
            return (
                f" WARNING: this sandbox is NOT isolated ({self.support.problem}): its code runs"
                " as the server's user, with the host's files, processes and network. To"
                f" isolate sandboxes, {self.support.fix}."
            )
        pause = "freezer cgroup" if self._freezer is not None else "signals"
        if self.support.seccomp is not None:
            seccomp_note = (
                "seccomp filter (io_uring, userfaultfd, perf_event_open, bpf, keyrings, kexec,"
                " modules and new user namespaces refused)"
            )
            if self._guarded:
                seccomp_note += (
                    "; with a writable volume, no set-id mode (chmod, open, mknod) and no file"
                    " capability (no CAP_SETFCAP): nothing it writes there is privileged on"
                    " the host"
                )
        else:
            seccomp_note = f"NO seccomp filter ({platform.machine()} has no table)"
        ids = self.ids
        assert ids is not None
        system = self._settings.view.system
        if ids.own:
            mapped = (
                f" its only id, root, mapped to the server's own uid {ids.uid} and gid {ids.gid}"
                f" (root inside is your user outside: {ids.no_range}; its code acts as your"
                " user on what the sandbox reaches, its volumes and any network it is given;"
                " other ids show as nobody; for a root that is not you, "
                f"{ids.range_fix}),"
            )
        else:
            mapped = (
                f" its ids 0-{ids.count - 1} mapped to unprivileged host ids"
                f" {ids.uid}-{ids.uid + ids.count - 1} (root inside is uid {ids.uid} outside),"
            )
        note = (
            " Isolation: bubblewrap container with private user, PID, mount, network, IPC and"
            f" UTS namespaces,{mapped} Docker's default capabilities inside its user namespace"
            f" only, {system}, /proc masked, {seccomp_note}; pause by {pause}."
        )
        note += self._root_note + self._volume_note
        if internet and self.network == "slirp4netns":
            note += (
                " Network: outbound through slirp4netns; no address of this host (its loopback,"
                " its interfaces'), link-local, metadata, multicast or broadcast address is"
                " reachable (nftables in the sandbox's own network namespace)."
            )
        elif internet:
            note += (
                " Network: NONE (loopback only): slirp4netns is not installed"
                " (apt-get install slirp4netns)."
            )
        return note

    def connect(self, port: int, timeout: float = 10.0) -> socket.socket:
        """A socket connected to 127.0.0.1:`port` inside the sandbox; OSError on failure."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            with self._lock:  # the path names a descriptor: once closed, its number is reused
                if self._closed:
                    raise ConnectionRefusedError("the sandbox is being deleted")
                sock.connect(self._relay_path)
            sock.sendall(b"%d\n" % port)
            answer = b""
            # The server holds the listening socket: a dead container's backlog accepts, and
            # nobody answers. Look at its main process while waiting, not only at the end.
            waited_until = time.monotonic() + timeout
            sock.settimeout(min(timeout, 0.25))
            while not answer.endswith(b"\n"):
                try:
                    byte = sock.recv(1)
                except TimeoutError:
                    if not self.alive():
                        raise ConnectionRefusedError("the sandbox's container exited") from None
                    if time.monotonic() >= waited_until:
                        raise
                    continue
                if not byte:
                    break
                answer += byte
            if not answer.startswith(b"ok"):
                raise ConnectionRefusedError(answer.decode(errors="replace").strip() or "closed")
            sock.settimeout(None)
            return sock
        except BaseException:
            sock.close()
            raise

    def members(self) -> list[int]:
        """The host pids of the sandbox's processes (its PID namespace, or its process tree).

        A server that is not root cannot read the namespace of an execd the template forked
        (not dumpable, and its memory the template's, of the host's user namespace: only host
        root may), so that one is named by its pidfd.
        """
        if self.init_pid is not None:
            alive = self._proc is not None and self._proc.poll() is None
            found = spawn.pids_in_namespace(self.init_pid) if alive else []
            forked = self._forked
            if found and forked is not None and forked.pid not in found:
                with contextlib.suppress(OSError):  # its pidfd, closed by a delete meanwhile
                    if not spawn.exited(forked.pidfd):
                        found.append(forked.pid)
            return found
        return spawn.descendants(self._proc.pid) if self._proc is not None else []

    def _signal(self, sig: int) -> None:
        """Send `sig` to every process of the sandbox (the forked execd through its pidfd)."""
        pids, forked = self.members(), self._forked
        if forked is not None and forked.pid in pids:
            pids.remove(forked.pid)
            with contextlib.suppress(OSError):  # ended, or its pidfd closed by a delete
                signal.pidfd_send_signal(forked.pidfd, sig)
        signal_pids(pids, sig)

    def pause(self) -> None:
        """Freeze every process of the sandbox."""
        if self._freezer is not None:
            self._freezer.freeze(True)
        else:
            self._signal(signal.SIGSTOP)
        self._frozen = True

    def resume(self) -> None:
        """Let every process of the sandbox run again."""
        if self._freezer is not None:
            self._freezer.freeze(False)
        else:
            self._signal(signal.SIGCONT)
        self._frozen = False

    def close(self) -> None:
        """Kill every process of the sandbox and remove its directories; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._frozen:
            try:
                self.resume()  # a frozen process cannot die
            except OSError:
                pass
        if self._proc is not None:
            self._stop_main(self._proc)
        if self._execd_in is not None:
            try:
                self._execd_in.close()
            except OSError:
                pass  # execd died with unread lines
        if self._held_template:
            execd_template.TEMPLATE.release()
        if self._forked is not None:
            os.close(self._forked.pidfd)
        self._outbound.close()
        if self._netns >= 0:
            os.close(self._netns)
        if self._cgroup is not None:
            # What the namespace's init did not take with it: an inner bwrap still setting up
            # (it has no init yet), or a container whose main process was never told its init.
            self._cgroup.kill()
            self._cgroup.remove()
        self._relay.close()
        if self._ready_r >= 0:
            os.close(self._ready_r)
            self._ready_r = -1
        os.close(self._dir_fd)
        self._staging.release()  # before the removal below, which must not reach a bind's files
        if self._log is not None:
            self._log.close()
        self._held.close()  # an image's layer and hold (a tmpfs's unmount takes its files)
        self._remove_dirs()

    def _stop_main(self, proc: subprocess.Popen[bytes]) -> None:
        if self.init_pid is not None:
            # the PID namespace ends with its init (whose pid is its while bwrap waits for it)
            spawn.kill_init(self._init_fd, self.init_pid, proc.poll() is None)
            self._init_fd = -1
        elif self.isolated:
            # No init known yet: bwrap is still setting up, and its child may not have joined
            # the sandbox's groups (it joins while it waits for its id maps). Both are still in
            # bwrap's process group (the child's own session comes later): one kill takes both
            # at once, where killing bwrap first would leave a child just made to the host.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            signal_pids(spawn.descendants(proc.pid), signal.SIGKILL)
            if self._cgroup is not None:
                self._cgroup.kill()
        elif proc.stdin is not None:
            proc.stdin.close()  # the plain main kills what it started, then exits
        try:
            # bwrap outside exits once it has reaped init (killed first, init would be left
            # to the host's pid 1 as a zombie)
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            if self.init_pid is None:
                signal_pids(spawn.descendants(proc.pid), signal.SIGKILL)
            proc.kill()
            proc.wait()
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
