"""A sandbox's confinement as a container runtime's (issue 22): one test per row of its table.

Each test plays model-written code in a deny-all sandbox, as `test_isolation.py` does, and
asserts on what got through. Row numbers are those of the issue's table; each test failed on
the server before it (where the row's finding was reproduced by hand).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from osb_sync import Client, Sandbox
from osb_sync.local import LocalServer
from osb_sync.local.host import bwrap
from tests.local.isolation_probes import assert_all_failed, isolating_server, probe, unique

CANARY_VARIABLE = "OSB_TEST_SERVER_SECRET"
# Docker's default read-only and masked /proc entries (those this kernel has are tried).
DOCKER_READ_ONLY = ("bus", "fs", "irq", "sys", "sysrq-trigger")
DOCKER_MASKED_FILES = ("kcore", "keys", "latency_stats", "sched_debug", "timer_list", "timer_stats")


@pytest.fixture(scope="module")
def canary_value() -> Iterator[str]:
    """A secret in the server's environment (set before the module's server starts)."""
    value = unique("server-environment-canary")
    os.environ[CANARY_VARIABLE] = value
    try:
        yield value
    finally:
        del os.environ[CANARY_VARIABLE]


@pytest.fixture(scope="module")
def server(canary_value: str) -> Iterator[LocalServer]:
    """One isolating server, started with the canary in its environment."""
    srv = isolating_server()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: LocalServer) -> Iterator[Client]:
    """A client of `server`."""
    with Client(api_base=server.api_base) as cli:
        yield cli


@pytest.fixture
def sandbox(client: Client) -> Iterator[Sandbox]:
    """A deny-all sandbox, deleted after the test."""
    with client.create_sandbox() as box:
        yield box


EVERY_PROCESS = """
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
def readable(path):
    try:
        return read(path)
    except OSError:
        return None
def links(pid):
    found = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for name in names:
        try:
            found[name] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            pass
    return found
"""


# -- row 1: the server's environment --------------------------------------------------------------


def test_row1_no_process_of_the_sandbox_has_the_servers_environment(
    sandbox: Sandbox, canary_value: str
) -> None:
    outcomes = probe(
        sandbox,
        EVERY_PROCESS + 'attempt("environs", lambda: {p: readable(f"/proc/{p}/environ") '
        "for p in pids})",
    )
    environs = outcomes["environs"]["value"]
    assert environs["1"] is not None  # bwrap, PID 1: readable, so it must be clean
    names = {entry.split("=", 1)[0] for entry in environs["1"].split("\0") if entry}
    assert names <= {"PATH", "LC_ALL"}, names
    assert not [pid for pid, text in environs.items() if text and canary_value in text]


# -- row 2: host sysctls (the /proc part; the identity part is item 1) ----------------------------


def test_row2_proc_sys_and_the_others_are_read_only(sandbox: Sandbox) -> None:
    present = [n for n in DOCKER_READ_ONLY if os.path.lexists(f"/proc/{n}")]
    assert "sys" in present
    outcomes = probe(
        sandbox,
        f"for name in {present!r}:\n"
        '    attempt(name, lambda n=name: os.statvfs(f"/proc/{n}").f_flag & os.ST_RDONLY '
        'or "writable")\n'
        "def write_back(path):\n"  # the value it holds: harmless where the write goes through
        '    with open(path, "r+") as f:\n'
        "        value = f.read()\n"
        "        f.seek(0)\n"
        "        f.write(value)\n"
        '        return "written"\n'
        'attempt("core_pattern written", write_back, "/proc/sys/kernel/core_pattern")',
    )
    written = outcomes.pop("core_pattern written")
    assert not written["ok"], written
    assert all(o["ok"] and o["value"] == os.ST_RDONLY for o in outcomes.values()), outcomes


# -- row 3: keyrings (the /proc part; keyctl is refused by the seccomp filter) --------------------


def test_row3_proc_keys_and_the_other_masked_entries_show_nothing(sandbox: Sandbox) -> None:
    masked = [n for n in DOCKER_MASKED_FILES if os.path.lexists(f"/proc/{n}")]
    assert "keys" in masked
    outcomes = probe(
        sandbox,
        f"for name in {masked!r}:\n"
        '    attempt(name, lambda n=name: read(f"/proc/{n}") or None)\n'
        '_outcomes = {k: v for k, v in _outcomes.items() if v["ok"] and v["value"]}',
    )
    assert_all_failed(outcomes)


# -- row 12: host paths in command lines and descriptors ------------------------------------------


def test_row12_no_host_path_in_command_lines_or_descriptors(
    server: LocalServer, sandbox: Sandbox
) -> None:
    outcomes = probe(
        sandbox,
        EVERY_PROCESS + 'attempt("seen", lambda: {p: [readable(f"/proc/{p}/cmdline"), links(p)] '
        "for p in pids})",
    )
    seen: dict[str, Any] = outcomes["seen"]["value"]
    assert seen["1"][0] and seen["1"][1]  # bwrap's command line and descriptors were read
    host_paths = [str(server.root_dir), bwrap.package_dir()]
    found = [(pid, path) for pid, what in seen.items() for path in host_paths if path in repr(what)]
    assert not found, f"host paths seen in the sandbox: {found}"


# -- rows 6-9 and KEYCTL_READ of row 3: the seccomp filter ----------------------------------------

SYSCALLS = """
import ctypes, errno, platform
libc = ctypes.CDLL(None, use_errno=True)
NUMBERS = {
    "x86_64": {"io_uring_setup": 425, "userfaultfd": 323, "perf_event_open": 298, "bpf": 321,
               "keyctl": 250, "add_key": 248, "request_key": 249, "kexec_load": 246},
    "aarch64": {"io_uring_setup": 425, "userfaultfd": 282, "perf_event_open": 241, "bpf": 280,
                "keyctl": 219, "add_key": 217, "request_key": 218, "kexec_load": 104},
}[platform.machine()]
def call(nr, *args):
    # every call with null or zero arguments: harmless where it goes through
    ctypes.set_errno(0)
    result = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    if result < 0:
        raise OSError(ctypes.get_errno(), errno.errorcode.get(ctypes.get_errno(), "?"))
    return result
"""


def test_rows_6_to_9_refused_system_calls_fail_with_eperm_or_enosys(sandbox: Sandbox) -> None:
    outcomes = probe(
        sandbox,
        SYSCALLS
        + 'attempt("io_uring_setup", call, NUMBERS["io_uring_setup"], 1, 0)\n'
        + 'attempt("userfaultfd", call, NUMBERS["userfaultfd"], 0)\n'
        + 'attempt("perf_event_open", call, NUMBERS["perf_event_open"], 0, 0, -1, -1, 0)\n'
        + 'attempt("bpf", call, NUMBERS["bpf"], 0, 0, 0)\n'
        # KEYCTL_GET_KEYRING_ID (0) of the session keyring (-3): the first step to list keys
        + 'attempt("keyctl", call, NUMBERS["keyctl"], 0, -3, 0)\n'
        + 'attempt("add_key", call, NUMBERS["add_key"], 0, 0, 0, 0, 0)\n'
        + 'attempt("request_key", call, NUMBERS["request_key"], 0, 0, 0, 0)\n'
        + 'attempt("kexec_load", call, NUMBERS["kexec_load"], 0, 0, 0, 0)',
    )
    assert_all_failed(outcomes)
    codes = {name: o["error"].split("]")[0].split("[")[-1] for name, o in outcomes.items()}
    assert set(codes.values()) <= {"Errno 1", "Errno 38"}, codes  # EPERM, ENOSYS


def test_row6_no_nested_user_namespace(sandbox: Sandbox) -> None:
    outcomes = probe(
        sandbox,
        SYSCALLS + 'attempt("unshare -U", lambda: subprocess.run(["unshare", "-U", "true"], '
        "capture_output=True, text=True, check=True).returncode)\n"
        "def unshare_user():\n"
        "    if libc.unshare(0x10000000) != 0:\n"
        '        raise OSError(ctypes.get_errno(), "unshare")\n'
        '    return "unshared"\n'
        'attempt("unshare(CLONE_NEWUSER)", unshare_user)\n'
        'attempt("a thread still starts", lambda: __import__("threading").Thread(target=print)'
        '.start() or "started")',
    )
    started = outcomes.pop("a thread still starts")
    assert started["ok"], started
    assert_all_failed(outcomes)


# -- items 1-2 (rows 2, 3 and 5): root inside is an unprivileged host range -----------------------

# Docker's default capability set (its 14) as a CapEff mask: CHOWN DAC_OVERRIDE FOWNER FSETID
# KILL SETGID SETUID SETPCAP NET_BIND_SERVICE NET_RAW SYS_CHROOT MKNOD AUDIT_WRITE SETFCAP.
DOCKER_CAPS = 0xA80425FB


def host_range() -> tuple[int, int]:
    """(first uid, first gid) of the host ids this machine's sandboxes map to."""
    ids = bwrap.probe().ids
    assert ids is not None
    return ids.uid, ids.gid


def test_sandbox_ids_map_to_an_unprivileged_range_never_root_nor_the_server(
    sandbox: Sandbox,
) -> None:
    uid, gid = host_range()
    outcomes = probe(
        sandbox,
        'attempt("uid_map", read, "/proc/self/uid_map")\n'
        'attempt("gid_map", read, "/proc/self/gid_map")\n'
        'attempt("ids", lambda: [os.getuid(), os.getgid(), os.geteuid()])\n'
        'attempt("caps", lambda: [l for l in read("/proc/self/status").splitlines() '
        'if l.startswith("CapEff")][0].split()[1])\n'
        'attempt("passwd", lambda: [l.split(":")[0] for l in read("/etc/passwd").splitlines()])\n'
        'attempt("group", lambda: [l.split(":")[0] for l in read("/etc/group").splitlines()])',
    )
    assert outcomes["ids"]["value"] == [0, 0, 0]
    assert outcomes["uid_map"]["value"].split() == ["0", str(uid), "65536"]
    assert outcomes["gid_map"]["value"].split() == ["0", str(gid), "65536"]
    assert uid > 0 and gid > 0 and not uid <= os.geteuid() < uid + 65536
    assert int(outcomes["caps"]["value"], 16) == DOCKER_CAPS, outcomes["caps"]
    assert outcomes["passwd"]["value"] == ["root", "nobody"]
    assert outcomes["group"]["value"] == ["root", "nogroup"]


def test_row2_host_sysctls_and_mounts_stay_out_of_reach_of_sandbox_root(sandbox: Sandbox) -> None:
    outcomes = probe(
        sandbox,
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def remount_proc_sys():\n"  # MS_REMOUNT|MS_BIND: needs CAP_SYS_ADMIN, not in the set
        '    if libc.mount(None, b"/proc/sys", None, 32 | 4096, None) != 0:\n'
        '        raise OSError(ctypes.get_errno(), "mount")\n'
        '    return "remounted"\n'
        'attempt("remount /proc/sys", remount_proc_sys)\n'
        'attempt("sethostname", lambda: __import__("socket").sethostname("x") or "set")\n'
        'attempt("write a host-root file", write, "/usr/osb-sandbox-was-here")',
    )
    assert_all_failed(outcomes)


def test_row5_a_setuid_file_planted_in_a_host_volume_is_not_host_roots(tmp_path: Any) -> None:
    uid, gid = host_range()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, uid, gid)  # what an operator does to let sandboxes write it (the guide)
    tmp_path.chmod(0o755)
    srv = isolating_server(allowed_host_paths=[str(tmp_path)])
    try:
        with (
            Client(api_base=srv.api_base) as cli,
            cli.create_sandbox(
                volumes=[
                    {"name": "shared", "host": {"path": str(shared)}, "mountPath": "/mnt/shared"}
                ]
            ) as box,
        ):
            outcomes = probe(
                box,
                "import shutil\n"
                'shutil.copy("/bin/true", "/mnt/shared/planted")\n'
                'attempt("setuid", os.chmod, "/mnt/shared/planted", 0o4755)\n'
                'attempt("nosuid", lambda: bool(os.statvfs("/mnt/shared").f_flag & os.ST_NOSUID))\n'
                'attempt("nodev", lambda: bool(os.statvfs("/mnt/shared").f_flag & os.ST_NODEV))\n'
                'attempt("mknod", os.mknod, "/mnt/shared/null", 0o20666, os.makedev(1, 3))',
            )
    finally:
        srv.stop()
    planted = os.stat(shared / "planted")
    assert (planted.st_uid, planted.st_gid) == (uid, gid)  # nobody of consequence on the host
    assert not planted.st_mode & 0o6000  # not even setuid to the range's root (issue 43)
    assert not outcomes["setuid"]["ok"] and "PermissionError" in outcomes["setuid"]["error"]
    assert outcomes["nosuid"] == {"ok": True, "value": True}
    assert outcomes["nodev"] == {"ok": True, "value": True}
