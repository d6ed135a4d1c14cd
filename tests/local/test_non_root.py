"""The local server run by an ordinary user (issue 42): a user with a subordinate id range, in
the system's own Python, runs code in a sandbox whose root is an id of that range outside, with
Docker's capabilities and seccomp, never the user itself nor host root. A user without a range
runs code as root inside that is the user outside, and the sandbox reaches nothing of the
user's: not its home, its keys, the server's state directory or API key file.

The tests make the users (`useradd -m`, which gives one a range on Debian; `-K SUB_UID_COUNT=0`
none) and run the server as each with `runuser`: they need root, and skip otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from osb_sync import ApiError, Client
from osb_sync.local.host import identity
from tests.local.fakenet import ZONE, FakeInternet, Relay, fetch_code, parse_result
from tests.local.serverproc import CHECKOUT, ServerProcess, descendants
from tests.local.support import CREATE_BODY, Box, require_slirp, texts, wait_for
from tests.local.test_confinement import DOCKER_CAPS
from tests.local.test_host_firewall import (  # noqa: F401 (fixtures)
    CAP_NET_ADMIN,
    Control,
    control,
    heard_by,
    host_addresses,
    host_listener,
    probe,
)
from tests.nonroot import run_as_users

PYTHON = "/usr/bin/python3"  # what a user's venv is made from (the system's is PEP 668's)
SSH_KEY = "ssh-key-of-the-user-3c1f"
API_KEY = "api-key-of-the-server-9d2e"
# Run in the sandbox, as root there (the user outside): what of the user's it can reach by
# name, through any process's descriptors (their targets, and `..` from each directory one:
# a directory of the host's tree climbs to its root), or in any environment or command line.
REACH = """
import json, os, sys
home, state = sys.argv[1], sys.argv[2]
secrets = [word[::-1] for word in sys.argv[3:]]  # given reversed: its own argv holds neither
found = {"named": [p for p in (home, state, "/proc/1/root" + home) if os.path.exists(p)]}
targets, dirs, climbed, leaked = [], [], [], []
for pid in filter(str.isdigit, os.listdir("/proc")):
    for name in ("environ", "cmdline"):
        try:
            text = open(f"/proc/{pid}/{name}", "rb").read().decode(errors="replace")
        except OSError:
            continue
        leaked += [f"{pid}/{name}" for secret in secrets if secret in text]
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        link = f"/proc/{pid}/fd/{fd}"
        try:
            targets.append(os.readlink(link))
            where = os.open(link, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        dirs.append(targets[-1])
        for _ in range(16):
            up = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=where)
            os.close(where)
            where = up
        if os.path.exists(f"/proc/self/fd/{where}{home}"):
            climbed.append(targets[-1])
        os.close(where)
found.update(targets=targets, dirs=dirs, climbed=climbed, leaked=leaked)
print(json.dumps(found))
"""


def _as(user: str, path: str, *command: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [shutil.which("runuser") or "runuser", "-u", user, "--", *command],
        capture_output=True,
        timeout=60,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": path},
    )


@pytest.fixture(scope="module")
def package_copy() -> Iterator[str]:
    """This checkout's package, copied where any user can read it: the checkout itself may be
    under a directory only root enters (a CI clone under /root, say)."""
    where = Path(tempfile.mkdtemp(prefix="osb-non-root-"))  # in /tmp, which every user enters
    try:
        shutil.copytree(Path(CHECKOUT) / "osb_sync", where / "osb_sync",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        for item in (where, *where.rglob("*")):
            item.chmod(0o755 if item.is_dir() else 0o644)
        yield str(where)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _shadow(*command: str) -> subprocess.CompletedProcess[str]:
    """useradd or userdel under the server's own lock (`identity.RESERVE_LOCK`): parallel
    suites and servers making their user must not race on /etc/passwd (taken as CI's
    non-root run takes it: /run/lock is every user's)."""
    return run_as_users.shadow(*command, lock_path=identity.RESERVE_LOCK)


def range_of(name: str) -> tuple[pwd.struct_passwd, int, int]:
    """User `name`'s passwd entry and the first uid and gid of its subordinate range."""
    user = pwd.getpwnam(name)
    start = identity.pick(identity.SUBUID.read_text(), (name,), user.pw_uid)
    gid = identity.pick(identity.SUBGID.read_text(), (name,), user.pw_gid)
    assert start is not None and gid is not None, name
    return user, start, gid


def _owner(pid: int) -> int | None:
    try:
        return Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return None  # gone


def _live(pid: int, uids: set[int]) -> bool:
    """Whether `pid` is a process (not a zombie) of one of `uids`."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z" and _owner(pid) in uids


@contextlib.contextmanager
def _new_user(package_copy: str, name: str, *options: str) -> Iterator[str]:
    """A new user made by `useradd -m *options`, removed (with its home) after the module."""
    if os.geteuid() != 0:
        pytest.skip("makes a user (useradd) and runs a server as it (runuser): needs root")
    missing = [t for t in ("useradd", "userdel", "runuser", "newuidmap") if not shutil.which(t)]
    if missing or not os.path.exists(PYTHON):
        pytest.skip(f"needs {', '.join(missing) or PYTHON}")
    made = _shadow("useradd", "-m", *options, name)
    assert made.returncode == 0, made.stderr
    try:
        imported = _as(name, package_copy, PYTHON, "-c", "import osb_sync.local")
        assert imported.returncode == 0, imported.stderr  # the package's copy, as the user
        yield name
    finally:
        _shadow("userdel", "-r", name)


@pytest.fixture(scope="module")
def ranged_user(package_copy: str) -> Iterator[str]:
    """A new user with a subordinate id range, removed (with its home) after the module."""
    with _new_user(package_copy, f"osbt{os.getpid()}") as name:
        if not identity.pick(identity.SUBUID.read_text(), (name,), -1):
            pytest.skip(f"useradd gave {name} no range of subordinate ids in /etc/subuid")
        yield name


@pytest.fixture(scope="module")
def rangeless_user(package_copy: str) -> Iterator[str]:
    """A new user without a subordinate id range, with an SSH key and an API key file in its
    home (mode 700 both), removed after the module."""
    nothing = ("-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0")
    with _new_user(package_copy, f"osbn{os.getpid()}", *nothing) as name:
        user = pwd.getpwnam(name)
        for path in (identity.SUBUID, identity.SUBGID):
            assert not identity.ranges(path.read_text(), (name, str(user.pw_uid))), path
        home = Path(user.pw_dir)
        for secret, text in ((".ssh/id_ed25519", SSH_KEY), ("api-key", API_KEY)):
            (home / secret).parent.mkdir(mode=0o700, exist_ok=True)
            (home / secret).write_text(text + "\n")
        for path in (home / ".ssh", home / ".ssh/id_ed25519", home / "api-key"):
            os.chown(path, user.pw_uid, user.pw_gid)
        yield name


def test_a_user_with_a_range_runs_code_as_an_id_of_its_range(
    ranged_user: str, package_copy: str
) -> None:
    user, start, _ = range_of(ranged_user)
    ids = {user.pw_uid, *range(start, start + identity.COUNT)}
    server = ServerProcess(user=ranged_user, python=PYTHON, path=package_copy)
    try:
        with Client(server.api_base) as client, client.create_sandbox() as sandbox:
            assert sandbox.run_code("print(6*7)").stdout == "42\n"
            status = sandbox.commands.run("id -u; id -G; cat /proc/self/status").stdout
            uid, gid, fields = status.split("\n", 2)  # id -G: no group of the user's
            found = dict(line.split(":\t", 1) for line in fields.splitlines() if ":\t" in line)
            assert (uid, gid) == ("0", "0"), status
            assert int(found["CapEff"], 16) == DOCKER_CAPS, found["CapEff"]
            assert found["Seccomp"].strip() == "2", found["Seccomp"]
            owners = {_owner(pid) for pid in descendants(server.pid)} - {None}
            # The server and bwrap's monitor are the user's; the sandbox's are the range's.
            assert start in owners, owners
            assert owners <= ids, owners
    finally:
        assert server.stop() == 0
    left = {pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if _live(pid, ids)}
    assert not left, left  # nothing of the user's nor its sandboxes' outlives the server


def test_a_user_with_a_range_mounts_a_writable_volume_as_the_range_s_root(
    ranged_user: str, package_copy: str, tmp_path: Path
) -> None:
    user, start, _ = range_of(ranged_user)
    state = Path(user.pw_dir) / "state"
    Path(user.pw_dir).chmod(0o700)  # as adduser makes homes: the range's root cannot search it
    server = ServerProcess(
        log=tmp_path / "server.log",
        user=ranged_user,
        python=PYTHON,
        path=package_copy,
        root_dir=str(state),
    )
    try:
        volume = {"name": "work", "pvc": {"claimName": "work"}, "mountPath": "/work"}
        with Client(server.api_base) as client:
            with client.create_sandbox(volumes=[volume]) as sandbox:
                message = sandbox.info().message or ""
                assert f"writes there as host uid {start}" in message, message
                # Documented: the claim is the user's; made writable by it, the range's root
                # writes there, as that id outside.
                claim = state / "volumes/work"
                assert claim.stat().st_uid == user.pw_uid
                claim.chmod(0o777)
                sandbox.files.write("/work/note", "kept")
                assert (claim / "note").read_text() == "kept"
                mounts = sandbox.commands.run("grep ' /work ' /proc/self/mountinfo").stdout
                assert {"nosuid", "nodev"} <= set(mounts.split()[5].split(",")), mounts
                assert (claim / "note").stat().st_uid == start
            with client.create_sandbox(volumes=[{**volume, "readOnly": True}]) as reader:
                ran = reader.commands.run("cat /work/note; touch /work/new")
                assert ran.stdout == "kept", ran
                assert "Read-only file system" in ran.stderr, ran
    finally:
        assert server.stop() == 0


# Sandbox A's swapper: `sub` (a directory) and `alt` (a symlink to TARGET, the user's home)
# trade places, as fast as Python calls renameat2, until the sandbox ends.
SWAPPER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("/work/sub", exist_ok=True)
open("/work/sub/inside.txt", "w").write("inside")
os.symlink(sys.argv[1], "/work/alt")
while True:  # AT_FDCWD = -100, RENAME_EXCHANGE = 2
    if libc.renameat2(-100, b"/work/sub", -100, b"/work/alt", 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
"""


def test_a_user_with_a_range_never_mounts_a_swapped_sub_path_s_target(
    ranged_user: str, package_copy: str, tmp_path: Path
) -> None:
    """Sandbox A swaps a directory of a claim with a symlink to the user's home while sandbox B
    is created with that directory as its subPath: B gets the directory or a 400, never the
    home (the server mounts what it opened, no name is looked up again)."""
    user = pwd.getpwnam(ranged_user)
    home, state = Path(user.pw_dir), Path(user.pw_dir) / "state"
    home.chmod(0o700)
    (home / "secret.txt").write_text("secret")
    server = ServerProcess(
        log=tmp_path / "server.log", user=ranged_user, python=PYTHON, path=package_copy,
        root_dir=str(state),
    )  # fmt: skip
    claim = state / "volumes/race"
    made = refused = 0
    try:
        volume = {"name": "race", "pvc": {"claimName": "race"}, "mountPath": "/work"}
        with Client(server.api_base) as client, client.create_sandbox(volumes=[volume]) as a:
            claim.chmod(0o777)  # the range's root writes there (the claim is the user's)
            a.commands.start(["python3", "-c", SWAPPER, str(home)])
            kinds: set[int] = set()
            deadline = time.monotonic() + 20
            while len(kinds) < 2 and time.monotonic() < deadline:
                with contextlib.suppress(FileNotFoundError):
                    kinds.add(stat.S_IFMT(os.lstat(claim / "sub").st_mode))
            assert kinds == {stat.S_IFDIR, stat.S_IFLNK}, "A does not swap: this proves nothing"
            deadline = time.monotonic() + 60
            while made < 5 and made + refused < 200 and time.monotonic() < deadline:
                sub = {**volume, "subPath": "sub", "mountPath": "/data"}
                try:
                    b = client.create_sandbox(volumes=[sub])
                except ApiError as exc:
                    assert exc.code == "VOLUME::INVALID_SUB_PATH", exc  # the swap seen
                    refused += 1
                    continue
                with b:
                    made += 1
                    seen = b.commands.run("ls /data").stdout.split()
                    assert seen == ["inside.txt"], seen  # never the home's secret.txt
    finally:
        assert server.stop() == 0
    print(f"swap: {made} B created, {refused} refused")
    assert made >= 1, f"no B created in 60 s ({refused} refused): this proves too little"


def test_a_user_without_a_range_is_root_inside_and_reaches_nothing_of_its_own(
    rangeless_user: str, package_copy: str, tmp_path: Path
) -> None:
    user = pwd.getpwnam(rangeless_user)
    home, state = user.pw_dir, f"{user.pw_dir}/state"
    log = tmp_path / "server.log"
    server = ServerProcess(
        log=log,
        user=rangeless_user,
        python=PYTHON,
        path=package_copy,
        api_key=API_KEY,
        root_dir=state,
    )
    assert "root inside is your user outside" in log.read_text()  # said once, at start
    try:
        volume = {"name": "work", "pvc": {"claimName": "work"}, "mountPath": "/work"}
        with (
            Client(server.api_base, API_KEY) as client,
            client.create_sandbox(volumes=[volume]) as sandbox,
        ):
            message = sandbox.info().message or ""
            assert "root inside is your user outside" in message, message
            assert re.search(
                rf"usermod --add-subuids (\d+-\d+) --add-subgids \1 {rangeless_user}", message
            )
            ran = sandbox.run_code("print(6*7)")
            assert ran.stdout == "42\n", ran
            sandbox.files.write("/work/note", "kept")  # its volume, the user's outside
            assert (Path(state) / "volumes/work/note").read_text() == "kept"
            ids = sandbox.commands.run("id -u; id -g; cat /proc/self/uid_map").stdout.split()
            assert ids == ["0", "0", "0", str(user.pw_uid), "1"], ids
            words = [REACH, home, state, API_KEY[::-1], SSH_KEY[::-1]]
            found = json.loads(sandbox.commands.run(f"python3 -c {shlex.join(words)}").stdout)
            assert found["named"] == [], found
            assert found["targets"], found  # the walk saw descriptors
            assert not [t for t in found["targets"] if t.startswith((home, state))], found
            assert found["climbed"] == [], found
            assert found["leaked"] == [], found
            owners = {_owner(pid) for pid in descendants(server.pid)} - {None}
            assert owners == {user.pw_uid}, owners  # the server, bwrap and the sandbox
    finally:
        assert server.stop() == 0
    pids = map(int, filter(str.isdigit, os.listdir("/proc")))
    left = {pid for pid in pids if _live(pid, {user.pw_uid})}
    assert not left, left


def test_require_id_range_refuses_a_user_without_one_with_the_usermod_line(
    rangeless_user: str, package_copy: str
) -> None:
    server = ServerProcess(
        user=rangeless_user, python=PYTHON, path=package_copy, require_id_range=True
    )
    try:
        refused = requests.post(f"{server.api_base}/sandboxes", json=CREATE_BODY, timeout=60)
        assert refused.status_code == 503, refused.text
        message = refused.json()["message"]
        assert "has no range of 65536 subordinate ids" in message, message
        fix = re.search(
            rf"usermod --add-subuids (\d+)-\d+ --add-subgids \S+ {rangeless_user}", message
        )
        assert fix is not None, message
        lines = (identity.SUBUID.read_text() + identity.SUBGID.read_text()).split()
        taken = [line.split(":")[1:] for line in lines if line.count(":") == 2]
        assert all(int(fix[1]) >= int(start) + int(count) for start, count in taken), message
        assert "bubblewrap" not in message and "sysctl" not in message, message
    finally:
        assert server.stop() == 0


# Run as a user: POST a create to the server (argv[1]), print the status and the body.
POST = """
import sys, urllib.error, urllib.request
request = urllib.request.Request(sys.argv[1], sys.argv[2].encode(), method="POST")
request.add_header("Content-Type", "application/json")
try:
    with urllib.request.urlopen(request, timeout=60) as answer:
        print(answer.status, answer.read().decode())
except urllib.error.HTTPError as failed:
    print(failed.code, failed.read().decode())
"""


@pytest.fixture(scope="module")
def other_user(package_copy: str) -> Iterator[str]:
    """Another local user, removed after the module."""
    with _new_user(package_copy, f"osbo{os.getpid()}") as name:
        yield name


def test_a_keyless_server_of_a_user_without_a_range_answers_no_other_user(
    rangeless_user: str, other_user: str, package_copy: str
) -> None:
    """Its sandboxes' root is the user: another local user who reaches its loopback port
    must not run code as it (here: plant a file in its volume as the user)."""
    server = ServerProcess(user=rangeless_user, python=PYTHON, path=package_copy)
    planted = server.root / "volumes/work/planted"
    deny = {"networkPolicy": {"defaultAction": "deny"}}  # what the client sends by default
    body = {
        **CREATE_BODY,
        **deny,
        "entrypoint": ["/bin/sh", "-c", "echo x > /work/planted; sleep 60"],
        "volumes": [{"name": "work", "pvc": {"claimName": "work"}, "mountPath": "/work"}],
    }
    url = f"{server.api_base}/sandboxes"
    try:
        other = _as(other_user, package_copy, PYTHON, "-c", POST, url, json.dumps(body))
        status, _, text = other.stdout.decode().partition(" ")
        assert status == "403", other
        assert "uid" in text and "api_key" in text, text  # who it answers, and the fix
        own = _as(
            rangeless_user,
            package_copy,
            PYTHON,
            "-c",
            POST,
            url,
            json.dumps({**CREATE_BODY, **deny}),
        )
        assert own.stdout.decode().startswith("202 "), own  # its own user still creates
        assert not planted.exists()
    finally:
        assert server.stop() == 0


START = """
import sys
from osb_sync.local import LocalServer
try:
    LocalServer(root_dir=sys.argv[1]).start().stop()
    print("started")
except RuntimeError as exc:
    print(exc)
"""


def test_a_state_directory_another_user_may_write_is_refused(
    rangeless_user: str, other_user: str, package_copy: str
) -> None:
    """A state directory at a shared path (/tmp/x) that another user made first, or that is
    writable by others: they could swap its entries (run directories, volumes) for links."""
    owners = {"another user's": other_user, "writable by all": rangeless_user}
    for what, owner in owners.items():
        state = Path(tempfile.mkdtemp(prefix="osb-state-"))
        try:
            shutil.chown(state, owner, owner)
            state.chmod(0o777)
            started = _as(rangeless_user, package_copy, PYTHON, "-c", START, str(state))
            said = started.stdout.decode()
            assert "started" not in said and str(state) in said, (what, started)
            assert not (state / ".osb-server.lock").exists(), what
        finally:
            shutil.rmtree(state)


# Run in a sandbox: its processes' pid namespaces, and every environment it can read.
PEERS = """
import json, os
pids = [p for p in os.listdir("/proc") if p.isdigit()]
own = os.readlink("/proc/self/ns/pid")
others, environ = [], ""
for pid in pids:
    try:
        if os.readlink(f"/proc/{pid}/ns/pid") != own:
            others.append(pid)
        environ += open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
    except OSError:
        pass
print(json.dumps({"pids": pids, "others": others, "environ": environ,
                  "run_user": os.path.exists("/run/user"),
                  "userns": os.readlink("/proc/self/ns/user")}))
"""


def test_a_sandbox_sees_no_other_process_nor_the_users_session(
    rangeless_user: str, package_copy: str
) -> None:
    """Same uid as the server and as each other: a sandbox must still see only its own
    processes (no pid to signal or trace), and nothing of the session the server ran in."""
    uid = pwd.getpwnam(rangeless_user).pw_uid
    session = {
        "HOME": pwd.getpwnam(rangeless_user).pw_dir,
        "SSH_AUTH_SOCK": f"/run/user/{uid}/ssh-agent.socket",
        "XDG_RUNTIME_DIR": f"/run/user/{uid}",
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path=/run/user/{uid}/bus",
        "DISPLAY": ":0",
        "GITHUB_TOKEN": "token-of-the-user-5a7b",
    }
    server = ServerProcess(user=rangeless_user, python=PYTHON, path=package_copy, env=session)
    try:
        given = Path(f"/proc/{server.pid}/environ").read_bytes()
        assert session["GITHUB_TOKEN"].encode() in given  # the server's session has them
        with Client(server.api_base) as client:
            with client.create_sandbox() as first, client.create_sandbox() as second:
                first.commands.run("sleep 30 >/dev/null 2>&1 &")  # a process to find
                ran = second.commands.run(f"python3 -c {shlex.quote(PEERS)}")
                seen = json.loads(ran.stdout)
                assert seen["others"] == [] and len(seen["pids"]) < 10, seen
                assert "PATH=" in seen["environ"], seen  # the walk read environments
                for name, value in session.items():
                    assert value not in seen["environ"], name
                assert not seen["run_user"], seen
                # No process of a sandbox's holds a namespace: bwrap leaves `--userns FD` open
                # for what it starts.
                held = []
                for pid in descendants(server.pid):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{pid}/ns/user") == seen["userns"]:
                            fds = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
                            held += [(pid, fd) for fd in fds if ":[" in fd]
                assert len(held) > 2, held  # its descriptors were read (pipes, sockets)
                spaces = ("user:", "net:", "mnt:", "pid:")
                assert not [h for h in held if h[1].startswith(spaces)], held
    finally:
        assert server.stop() == 0


# Run in the sandbox: TCP to the control's far end, lingering before the close (slirp4netns
# may pass a quick close ahead of the data), and UDP, a few times each.
THROUGH = r"""
import socket, sys, time
target, port = sys.argv[1], int(sys.argv[2])
for _ in range(3):
    try:
        with socket.create_connection((target, port), timeout=5) as conn:
            conn.sendall(f"tcp {target}\n".encode())
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(0.5)
            conn.recv(1)  # the listener's close, or the timeout
    except TimeoutError:
        pass
    except OSError as exc:
        print(exc)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(f"udp {target}\n".encode(), (target, port))
    time.sleep(0.2)
"""


@contextlib.contextmanager
def tun_of_mode(mode: int) -> Iterator[tuple[str, ...]]:
    """A command that runs its arguments (a server) in a mount namespace of their own whose
    /dev/net/tun is a node of `mode`: distributions make it 0666, a container (this machine
    kind) 0600; the host's own is left as it is."""
    where = Path(tempfile.mkdtemp(prefix="osb-tun-"))
    node = where / "tun"
    try:
        os.mknod(node, stat.S_IFCHR | mode, os.makedev(10, 200))
        node.chmod(mode)
        where.chmod(0o755)
        bind = 'mount --bind "$0" /dev/net/tun && exec "$@"'
        yield ("unshare", "--mount", "--propagation", "private", "sh", "-c", bind, str(node))
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.parametrize("who", ["ranged_user", "rangeless_user"])
def test_a_non_root_server_s_internet_sandbox_reaches_the_internet_but_no_host_address(
    who: str,
    package_copy: str,
    request: pytest.FixtureRequest,
) -> None:
    """slirp4netns and the firewall join the sandbox's user namespace (the user's, or its
    range's root's); its root still has no CAP_NET_ADMIN over the tables that keep it from
    the host, its loopback through slirp4netns's 10.0.2.2 included."""
    require_slirp()
    user = request.getfixturevalue(who)
    port, heard = request.getfixturevalue("host_listener")
    wall: Control = request.getfixturevalue("control")
    with tun_of_mode(0o666) as wrap, requests.Session() as http:
        server = ServerProcess(
            user=user, python=PYTHON, path=package_copy, wrap=wrap, api_key=API_KEY
        )
        http.headers["OPEN-SANDBOX-API-KEY"] = API_KEY
        try:
            box = Box(server, http, CREATE_BODY)  # type: ignore[arg-type]
            assert "outbound through slirp4netns" in box.created["status"]["message"]
            shown = "".join(texts(box.command("ip -4 addr show tap0; ip route")))
            assert "inet 10.0.2.100/24" in shown and "default via 10.0.2.2 dev tap0" in shown
            changed = texts(box.command("nft flush ruleset 2>&1; nft list ruleset 2>&1"))
            status = texts(box.command("grep -E '^Cap(Eff|Bnd)' /proc/self/status"))
            nested = texts(box.command("unshare -rn true 2>&1; echo $?"))
            targets = [*host_addresses(), "0.0.0.0", "10.0.2.2", wall.far_end]
            assert "127.0.0.1" in targets and wall.host_end in targets, targets
            said = probe(box, targets, port)
            through = shlex.join(["python3", "-c", THROUGH, wall.far_end, str(port)])
            failed = texts(box.command(through))
            ways = {f"tcp {wall.far_end}", f"udp {wall.far_end}"}
            from_far_end = heard_by(wall, ways, 30)
            # Internet taken away and given back: the tap device removed and made again,
            # the tables loaded again, through the same user namespace; the host stays out.
            policy = f"{server.api_base}/sandboxes/{box.id}/networkpolicy"
            for action in ("deny", "allow"):
                toggled = http.put(policy, json={"defaultAction": action}, timeout=60)
                assert toggled.status_code == 200, toggled.text
            again = probe(box, [wall.host_end, "127.0.0.1", "10.0.2.2"], port)
            route = "".join(texts(box.command("ip route")))
            time.sleep(0.5)  # what a packet through slirp4netns would take, many times over
        finally:
            assert server.stop() == 0
    assert not heard, f"the host heard {heard}; the sandbox said {said}, then {again}"
    assert "default via 10.0.2.2 dev tap0" in route, route
    assert all(again[f"tcp {t}"] != "connected" for t in ("127.0.0.1", "10.0.2.2")), again
    # through slirp4netns, to an address not the host's
    assert ways <= set(from_far_end), (from_far_end, failed, said)
    for target in targets[:-1]:
        assert said[f"tcp {target}"] != "connected", (target, said)
    assert any("Operation not permitted" in line for line in changed), changed
    assert nested[-1] != "0", nested
    for line in status:
        assert not int(line.split()[1], 16) >> CAP_NET_ADMIN & 1, line


def test_a_host_whose_tun_only_root_opens_refuses_a_non_root_internet_sandbox_saying_so(
    ranged_user: str, package_copy: str
) -> None:
    """A container's /dev/net/tun (0600): the create fails naming the file and its fix; a
    deny-all sandbox still runs."""
    require_slirp()
    with tun_of_mode(0o600) as wrap:
        server = ServerProcess(user=ranged_user, python=PYTHON, path=package_copy, wrap=wrap)
        try:
            url = f"{server.api_base}/sandboxes"
            refused = requests.post(url, json=CREATE_BODY, timeout=60)
            assert refused.status_code == 500, refused.text
            assert "chmod 0666 /dev/net/tun" in refused.json()["message"], refused.text
            deny = {**CREATE_BODY, "networkPolicy": {"defaultAction": "deny"}}
            assert requests.post(url, json=deny, timeout=60).status_code == 202
        finally:
            assert server.stop() == 0


def test_a_user_s_sandbox_with_rules_reaches_the_allowed_names_only(
    ranged_user: str, package_copy: str
) -> None:
    """Egress by name for an ordinary user's server (its resolver's sockets made through
    nsenter, its sets loaded in the user namespace), in the fake internet (`fakenet.py`)."""
    require_slirp()
    internet = FakeInternet()
    server = relay = None
    try:
        with tun_of_mode(0o666) as tun:
            wrap = (*internet.wrap(), *tun)
            server = ServerProcess(user=ranged_user, python=PYTHON, path=package_copy, wrap=wrap)
        relay = Relay(internet.server, server.port)
        shim = SimpleNamespace(
            api_base=f"http://127.0.0.1:{relay.port}/v1", root_dir=str(server.root), isolated=True
        )
        policy = {"egress": [{"action": "allow", "target": "allowed.test"}]}
        with requests.Session() as http:
            box = Box(shim, http, {**CREATE_BODY, "networkPolicy": policy})  # type: ignore[arg-type]
            code = fetch_code(["allowed.test", "denied.test", ZONE["denied.test"]])
            events = box.command(f"python3 -I -c {shlex.quote(code)}")
            journal = f"{shim.api_base}/sandboxes/{box.id}/diagnostics/events"
            refused = f"egress denied: {ZONE['denied.test']}:80/tcp"
            seen = wait_for(lambda: refused in http.get(journal).text, 10)
            http.delete(f"{shim.api_base}/sandboxes/{box.id}")
        assert parse_result("".join(texts(events))) == {
            "allowed.test": "ok:allowed.test",
            "denied.test": "dns",
            ZONE["denied.test"]: "net",
        }
        assert seen  # its refused packets read too (the log socket made in its namespace)
    finally:
        if relay is not None:
            relay.close()
        if server is not None:
            server.stop()
        internet.close()


IMAGE_RUN = """
import json, sys, urllib.request
api, layout = sys.argv[1], sys.argv[2]
def call(method, url, body=None, headers=None):
    data = json.dumps(body).encode() if body else None
    request = urllib.request.Request(url, data, method=method)
    request.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as failed:
        return failed.code, failed.read().decode()
body = {"image": {"uri": f"oci:{layout}:v1"}, "entrypoint": ["/bin/sh"], "resourceLimits": {},
        "networkPolicy": {"defaultAction": "deny"}}
status, text = call("POST", f"{api}/sandboxes", body)
if status != 202:
    sys.exit(f"create: {status} {text}")
sandbox = json.loads(text)["id"]
status, text = call("GET", f"{api}/sandboxes/{sandbox}/endpoints/44772")
endpoint = json.loads(text)
command = ("cat /etc/debian_version; python3 -c 'import sys; print(sys.version_info[:2])';"
           " stat -c %u:%g /etc/passwd /usr/bin")
status, text = call("POST", f"http://{endpoint['endpoint']}/command", {"command": command},
                    endpoint.get("headers"))
print(json.dumps([json.loads(line) for line in text.split("\\n") if line.strip()]))
if sys.argv[3:] != ["keep"]:
    call("DELETE", f"{api}/sandboxes/{sandbox}")
"""


PRUNE = """
import types
from osb_sync._cli_images import _store
print(_store(types.SimpleNamespace(keywords={"image_store_size": 1 << 30})).prune())
"""


@pytest.mark.parametrize("who", ["rangeless_user", "ranged_user"])
def test_a_user_runs_an_image_sandbox(
    who: str, package_copy: str, request: pytest.FixtureRequest
) -> None:
    """An image sandbox of a server that is not root has no disk limit (its /tmp is the
    image's, no tmpfs to remount): its create used to fail "the sandbox's disk limits could
    not be set (/tmp: Invalid argument)". The image's own files and python3 answer, its root
    owns the image's files, and nothing is left once the server stops.

    A user with a range: the image's files belong to the range, as a root server's store has
    them (`images/inside.py`); the pull used to fail with EPERM at the first fchown, and
    `osb-sync images prune`'s store removes the image again."""
    from tests import imagekit

    user: str = request.getfixturevalue(who)
    info = pwd.getpwnam(user)
    work = Path(tempfile.mkdtemp(prefix="osb-non-root-image-"))  # every user enters /tmp
    try:
        image = imagekit.Image(
            [imagekit.rootfs_layer(imagekit.bullseye_tar())], env=["PATH=/usr/bin:/bin"]
        )
        imagekit.write_layout(work / "bullseye", "v1", [image])
        for item in (work, *work.rglob("*")):
            item.chmod(0o755 if item.is_dir() else 0o644)
        server = ServerProcess(
            user=user,
            python=PYTHON,
            path=package_copy,
            local_image_paths=[str(work)],
        )
        try:
            runuser = shutil.which("runuser") or "runuser"
            ran = subprocess.run(
                [runuser, "-u", user, "--", PYTHON, "-c", IMAGE_RUN,
                 server.api_base, str(work / "bullseye")],
                capture_output=True, timeout=600, cwd="/",
                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": package_copy},
            )  # fmt: skip
            assert ran.returncode == 0, ran.stderr.decode()[-2000:]
            events = json.loads(ran.stdout)
            out = "".join(e.get("text", "") for e in events if e.get("type") == "stdout")
            assert out.startswith("11."), events  # bullseye's, not the host's
            assert "(3, 9)" in out, events  # the image's python3
            assert out.split()[-2:] == ["0:0", "0:0"], events  # the image's root owns them
        finally:
            assert server.stop() == 0
        left = [p for p in Path("/tmp").glob("osb-local-*") if p.stat().st_uid == info.pw_uid]
        assert left == [], left
        store = Path(info.pw_dir, ".cache", "osb-sync", "images", "images")
        (stored,) = store.glob("sha256-*")
        owner = (stored / "rootfs" / "etc" / "passwd").stat()
        if who == "ranged_user":
            assert (owner.st_uid, owner.st_gid) == range_of(user)[1:]
        else:
            assert (owner.st_uid, owner.st_gid) == (info.pw_uid, info.pw_gid)
        pruned = subprocess.run(  # `osb-sync images prune`'s store (the CLI needs requests)
            [runuser, "-u", user, "--", PYTHON, "-c", PRUNE],
            capture_output=True, timeout=120, cwd="/",
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": package_copy},
        )  # fmt: skip
        assert pruned.returncode == 0, pruned.stderr.decode()[-2000:]
        assert list(store.iterdir()) == [] and list(store.parent.joinpath("tmp").iterdir()) == []
    finally:
        shutil.rmtree(work, ignore_errors=True)


RANGE_WORK = """
import json, sys
from pathlib import Path
from osb_sync.local.host import identity
from osb_sync.local.host.images.inside import RangeWork
from osb_sync.local.host.images.unpack import SizeLimit, TooLarge, UnpackError
work, layouts, out = RangeWork(identity.host_range()), Path(sys.argv[1]), Path(sys.argv[2])
said = {}
for name in ("good", "escape", "bomb"):
    try:
        done = work.unpack(layouts / name, out / name, SizeLimit(64 << 20, floor=64 << 10))
        said[name] = ["ok", done.size]
    except TooLarge as exc:
        said[name] = ["too-large", str(exc), exc.unpacked > 100 * exc.packed]
    except UnpackError as exc:
        said[name] = ["refused", str(exc)]
if sys.argv[3:] == ["remove"]:
    for name in ("good", "escape", "bomb"):
        work.remove(out / name)
print(json.dumps(said))
"""


def test_a_user_with_a_range_unpacks_in_its_range_what_root_would_and_refuses_the_rest(
    ranged_user: str, package_copy: str
) -> None:
    """The store's unpacks of a server that is not root but has a range run in a user
    namespace of the range (`images/inside.py`): an image's ids are the range's, an id past
    it the user's own, and a refusal comes back typed, as the unpacker's in the server: a
    member leading out (UnpackError, nothing made outside) and a decompression bomb
    (TooLarge, with its figures). The range's trees are removed again in the namespace."""
    from tests.imagekit import Entry, Image, layer_bytes, write_dir_layout

    user, start, gid = range_of(ranged_user)
    work = Path(tempfile.mkdtemp(prefix="osb-range-work-"))
    try:
        owned = {"uid": "1000", "gid": "1001"}
        far = {"uid": "70000", "gid": "70000"}  # past the range's 65536 ids
        images = {
            "good": [Entry("d", "dir", mode=0o700), Entry("d/f", data=b"x", pax=owned),
                     Entry("far", data=b"y", pax=far)],
            "escape": [Entry("h", "link", target="../outside")],
            "bomb": [Entry("z", data=bytes(4 << 20))],
        }  # fmt: skip
        for name, entries in images.items():
            write_dir_layout(work / "layouts" / name, Image([layer_bytes(entries)]))
        for item in (work, *work.rglob("*")):
            item.chmod(0o755 if item.is_dir() else 0o644)
        (work / "out").mkdir(mode=0o700)
        os.chown(work / "out", user.pw_uid, user.pw_gid)

        def run(*more: str) -> dict[str, list[object]]:
            done = _as(ranged_user, package_copy, PYTHON, "-c", RANGE_WORK,
                       str(work / "layouts"), str(work / "out"), *more)  # fmt: skip
            assert done.returncode == 0, done.stderr.decode()[-2000:]
            said: dict[str, list[object]] = json.loads(done.stdout)
            return said

        said = run()
        assert said["good"][0] == "ok", said
        assert said["escape"][0] == "refused" and "'..' component" in str(said["escape"]), said
        assert said["bomb"][:1] == ["too-large"] and said["bomb"][2] is True, said
        assert "a decompression bomb" in str(said["bomb"][1]), said
        good = work / "out" / "good"
        found = {
            p.name: (p.lstat().st_uid, p.lstat().st_gid)
            for p in (good, good / "d", good / "d" / "f", good / "far")
        }
        assert found["d"] == (start, gid) and found["f"] == (start + 1000, gid + 1001), found
        assert found["far"] == (user.pw_uid, user.pw_gid), found  # past the range: the user's
        assert not (work / "outside").exists() and not (work / "out" / "outside").exists()
        for name in ("good", "escape", "bomb"):
            shutil.rmtree(work / "out" / name)
        run("remove")
        assert list((work / "out").iterdir()) == []
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_killed_server_s_image_copy_in_its_range_is_removed_by_the_next(
    ranged_user: str, package_copy: str
) -> None:
    """A server of a user with a range, killed with an image sandbox live, leaves that image's
    copy (the range's files, which the user cannot remove by itself); the user's next server
    removes it with the rest of the dead one's directory."""
    from tests import imagekit

    user = pwd.getpwnam(ranged_user)
    work = Path(tempfile.mkdtemp(prefix="osb-non-root-image-"))

    def mine() -> set[Path]:  # the servers' directories (not the package's copies)
        found = Path("/tmp").glob("osb-local-*")
        return {p for p in found if p.stat().st_uid == user.pw_uid and "package" not in p.name}

    try:
        image = imagekit.Image([imagekit.rootfs_layer(imagekit.bullseye_tar())])
        imagekit.write_layout(work / "bullseye", "v1", [image])
        for item in (work, *work.rglob("*")):
            item.chmod(0o755 if item.is_dir() else 0o644)
        before = mine()
        server = ServerProcess(
            user=ranged_user, python=PYTHON, path=package_copy, local_image_paths=[str(work)]
        )
        try:
            ran = _as(ranged_user, package_copy, PYTHON, "-c", IMAGE_RUN,
                      server.api_base, str(work / "bullseye"), "keep")  # fmt: skip
            assert ran.returncode == 0, ran.stderr.decode()[-2000:]
        finally:
            python = [pid for pid in descendants(server.pid) if _owner(pid) == user.pw_uid]
            os.kill(min(python), signal.SIGKILL)  # the server below runuser, not its sandbox
            server.kill()
        (left,) = mine() - before
        copies = list(left.glob("*/root/etc/passwd"))
        assert copies and copies[0].stat().st_uid != user.pw_uid, copies  # the range's
        again = ServerProcess(user=ranged_user, python=PYTHON, path=package_copy)
        assert again.stop() == 0
        assert not left.exists(), sorted(str(p) for p in left.rglob("*"))[:20]
    finally:
        shutil.rmtree(work, ignore_errors=True)
