"""Run `test_as_user.py` as two new ordinary users, as a developer on a laptop would (issue 42).

    python tests/nonroot/run_as_users.py [--junit FILE]      (as root; tox -e nonroot)

Standard library only (tox runs it without installing the package). As root it:

- copies the tree (its files as a clone has them) where every user can read it (a directory
  under /tmp, mode 0755; a CI clone may sit under /root);
- makes two users with ``useradd -m``: one with a subordinate id range (Debian's useradd gives
  every new user one) and one without (``-K SUB_UID_COUNT=0 -K SUB_GID_COUNT=0``), under the
  lock the local server and ``tests/local/test_non_root.py`` take for useradd;
- as each user (``runuser``), copies that copy into its home (as a clone would be), makes a
  venv there with the system's Python (``/usr/bin/python3 -m venv``: the system's is
  externally managed, PEP 668), installs its copy with the ``local`` extra and pytest, and
  runs its ``test_as_user.py`` with ``OSB_NONROOT_KIND`` set;
- where ``/dev/net/tun`` is not open to every user (a container's is 0600; distributions make
  it 0666), runs the user's tests in a mount namespace of their own in which a 0666 node
  is bound over it, as ``tests/local/test_non_root.py`` does: the host's file is left alone,
  and the node is made in a new directory only root enters;
- checks, once each user's run ended, that no process of the user or of its range is left
  (they are killed, and it fails, if any is);
- removes the users (with their homes) and the copy.

It writes one junit file of both runs (each test named ``range::...`` or ``no-range::...``),
which ``tests/run.py`` reads as it reads every env's, and exits non-zero if either run failed.
Not root: one skipped test says so (``CI=true`` fails on it).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "tests/nonroot/run_as_users.py"  # this file, as tox.ini names it
SUITE = "tests/nonroot/test_as_user.py"  # what it runs as each user
PYTHON = "/usr/bin/python3"  # the system's, as a user's venv is made from
RESERVE_LOCK = "/run/lock/osb-sync-useradd.lock"  # osb_sync.local.host.identity.RESERVE_LOCK
NO_RANGE = ("-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0")
KINDS = {"range": (), "no-range": NO_RANGE}
IGNORED = shutil.ignore_patterns(  # where there is no git to list the files
    ".git", ".tox", "__pycache__", "*.egg-info", "build", "dist", ".*", "reports", "htmlcov"
)
INSTALL_TIMEOUT = 300
RUN_TIMEOUT = 300
LOCK_TIMEOUT = 120


def say(message: str) -> None:
    print(f"run_as_users.py: {message}", flush=True)


def shadow(*command: str, lock_path: str = RESERVE_LOCK) -> subprocess.CompletedProcess[str]:
    """useradd or userdel, one at a time with the server's and the local suite's.

    The lock lives in /run/lock, which every user may write: it is opened without following
    a link (as the server opens it), must be root's own regular file, and is waited for
    `LOCK_TIMEOUT` seconds at most.

    Raises:
        RuntimeError: the lock is not root's file, or stays held.
        OSError: it is a link (ELOOP), or cannot be made.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    lock = os.open(lock_path, flags, 0o600)
    try:
        info = os.fstat(lock)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != 0:
            raise RuntimeError(f"{lock_path} is not a file of root's: remove it (as root)")
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{lock_path} stayed locked {LOCK_TIMEOUT} s") from None
                time.sleep(0.1)
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    finally:
        os.close(lock)


def tree_files() -> list[str] | None:
    """The tree's files as a clone has them (tracked, and new ones git does not ignore), or
    None without git: the other envs write in the tree meanwhile (coverage files, hypothesis's
    database), which a copy of everything would race with."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        return None
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return [name for name in listed.stdout.decode().split("\0") if name] or None


def readable_copy() -> Path:
    """The tree, copied where every user reads it (files 0644 or 0755, directories 0755)."""
    where = Path(tempfile.mkdtemp(prefix="osb-nonroot-"))
    tree = where / "tree"
    files = tree_files()
    if files is None:
        shutil.copytree(ROOT, tree, ignore=IGNORED)
    for name in files or ():
        if (ROOT / name).is_file():  # not one deleted in the work tree
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    for item in (where, *where.rglob("*")):
        if not item.is_symlink():
            item.chmod(0o755 if item.is_dir() or os.access(item, os.X_OK) else 0o644)
    return tree


def tun_wrapper() -> tuple[list[str], Path | None]:
    """A command that runs its arguments where /dev/net/tun is a 0666 node, and the directory
    of that node (the caller removes it); ([], None) where the host's is that already. The
    directory is a new one only root enters (the bind is made as root, before `runuser`): no
    other user reaches the node on the host, also where this run is killed."""
    try:
        mode = os.stat("/dev/net/tun").st_mode
    except OSError:
        return [], None  # no tun at all: the internet test says what is missing
    if mode & 0o666 == 0o666:
        return [], None
    where = Path(tempfile.mkdtemp(prefix="osb-nonroot-tun-"))  # 0700
    node = where / "tun"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(10, 200))
    node.chmod(0o666)
    bind = 'mount --bind "$0" /dev/net/tun && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, str(node)], where


def has_range(name: str) -> bool:
    """Whether /etc/subuid gives `name` a range of 65536 ids."""
    for line in Path("/etc/subuid").read_text().splitlines():
        parts = line.split(":")
        if len(parts) == 3 and parts[0] == name and int(parts[2]) >= 65536:
            return True
    return False


def ranges_of(name: str, uid: int) -> set[int]:
    """The user's uid and every id of its subordinate ranges."""
    ids = {uid}
    for line in Path("/etc/subuid").read_text().splitlines():
        parts = line.split(":")
        if len(parts) == 3 and parts[0] in (name, str(uid)):
            ids |= set(range(int(parts[1]), int(parts[1]) + int(parts[2])))
    return ids


def processes_of(uids: set[int]) -> list[int]:
    """Live processes (not zombies) owned by one of `uids`."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            owner = os.stat(f"/proc/{entry}").st_uid
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if owner in uids and state != "Z":
            found.append(int(entry))
    return found


def as_user(
    name: str,
    command: list[str],
    env: dict[str, str],
    timeout: float,
    wrap: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `command` as the user `name` in its home, with only `env` (and PATH, HOME)."""
    home = os.path.expanduser(f"~{name}")
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    full = {"PATH": "/usr/bin:/bin", "HOME": home, "LC_ALL": "C.UTF-8", **env}
    variables = [f"{key}={value}" for key, value in full.items()]
    return subprocess.run(
        [*(wrap or []), runuser, "-u", name, "--", "env", "-i", *variables, *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=home,
        check=False,
    )


def failure(kind: str, name: str, text: str) -> ET.Element:
    """A junit test case of the driver's own that failed with `text`."""
    case = ET.Element("testcase", classname=f"{kind}::run_as_users", name=name)
    ET.SubElement(case, "failure", message=text[:200]).text = text
    return case


def run_kind(kind: str, tree: Path, wrap: list[str]) -> list[ET.Element]:
    """Make a user of `kind`, run the tests as it, remove it: its junit test cases."""
    name = f"osbci{kind[0]}{os.getpid()}"
    made = shadow("useradd", "-m", *KINDS[kind], name)
    if made.returncode != 0:
        return [failure(kind, "useradd", made.stderr)]
    started = time.monotonic()
    home = Path(os.path.expanduser(f"~{name}"))
    cases: list[ET.Element] = []
    try:
        if has_range(name) != (kind == "range"):
            return [failure(kind, "useradd", f"{name}: a range is {kind}'s opposite here")]
        cases = tests_as(name, kind, home, tree, wrap)
    except subprocess.TimeoutExpired as exc:
        cases.append(failure(kind, "timeout", f"{' '.join(map(str, exc.cmd))[-300:]}: {exc}"))
    finally:
        uids = ranges_of(name, home.stat().st_uid)
        deadline = time.monotonic() + 10  # what a stop SIGKILLed takes a moment to be gone
        while (left := processes_of(uids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if left:
            cmdlines = []
            for pid in left:
                try:
                    cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode())
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass  # it ended meanwhile
            cases.append(failure(kind, "nothing_left", f"left after the run: {cmdlines}"))
        say(f"{kind}: {time.monotonic() - started:.0f} s as {name}")
        shadow("userdel", "-r", name)
    return cases


def tests_as(name: str, kind: str, home: Path, tree: Path, wrap: list[str]) -> list[ET.Element]:
    """As the user `name`: copy the tree, make the venv, run the suite; its test cases."""
    venv, source = home / "venv", home / "osb_sync"  # its own copy, as a clone would be
    steps = [
        ["cp", "-R", str(tree), str(source)],
        [PYTHON, "-m", "venv", str(venv)],
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", f"{source}[local]", "pytest"],
    ]
    for step in steps:
        done = as_user(name, step, {}, INSTALL_TIMEOUT)
        if done.returncode != 0:
            return [failure(kind, "venv", f"{' '.join(step)}: {done.stdout}{done.stderr}")]
    junit = home / "junit.xml"
    test = [
        str(venv / "bin/python"),
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        "--import-mode=importlib",  # the venv's osb_sync, as the user installed it
        "-o",
        "addopts=",
        "-rs",
        f"--junitxml={junit}",
        str(source / SUITE),
    ]
    done = as_user(name, test, {"OSB_NONROOT_KIND": kind}, RUN_TIMEOUT, wrap)
    print(done.stdout + done.stderr, flush=True)
    cases = []
    if junit.is_file():
        for case in ET.parse(junit).iter("testcase"):
            case.set("classname", f"{kind}::{case.get('classname', '')}")
            cases.append(case)
    if done.returncode != 0 and not any(c.find("failure") is not None for c in cases):
        cases.append(failure(kind, "pytest", f"exit {done.returncode}: {done.stderr[-2000:]}"))
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--junit", type=Path, help="write both runs' junit file here")
    args = parser.parse_args(argv)
    suite = ET.Element("testsuite", name="nonroot")
    if os.geteuid() != 0:
        case = ET.SubElement(suite, "testcase", classname="run_as_users", name="users")
        reason = "needs root: it makes two users (useradd) and runs the tests as each (runuser)"
        ET.SubElement(case, "skipped", message=reason)
        say(reason)
    else:
        tree = readable_copy()
        wrap, private = tun_wrapper()
        try:
            for kind in KINDS:
                suite.extend(run_kind(kind, tree, wrap))
        finally:
            shutil.rmtree(tree.parent, ignore_errors=True)
            if private is not None:
                shutil.rmtree(private, ignore_errors=True)
    if args.junit is not None:
        args.junit.parent.mkdir(parents=True, exist_ok=True)
        whole = ET.Element("testsuites")
        whole.append(suite)
        ET.ElementTree(whole).write(args.junit, encoding="unicode")
    failed = [
        c
        for c in suite.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ]
    say(f"{len(list(suite.iter('testcase')))} tests, {len(failed)} failed")
    return 1 if failed or not len(suite) else 0


if __name__ == "__main__":
    sys.exit(main())
