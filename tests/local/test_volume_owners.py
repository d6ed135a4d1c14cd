"""Volumes a sandbox's root writes as their directory's owner (issue 43): a root server
ID-maps each volume so that its directory's owner is the sandbox's root there.

The official OpenSandbox e2e flows that mount a volume and write to it (host read-write at
/mnt/host-data, pvc read-write at /mnt/pvc-data, pvc with `subPath` `datasets/train` at
/mnt/train: the sandbox reads the marker the test put there, writes a file, reads it back, and
sees a directory of the `subPath`'s content only; their markers, names and texts are the
official suite's) are ported here against a root server, through our client: with a directory an
ordinary host user owns (the default), with one host root owns under the opt-in
(`volume_root_is_host_root`), and with one host root owns without it (refused writes, and the
create's status saying why and what to do). Then what must hold whoever owns the directory:
nothing a sandbox makes there is set-id or carries a file capability on the host, read-only
stays read-only, and where the file system cannot ID-map a mount the status says so and the
volume is bound as before.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from osb_sync import Client, Sandbox
from osb_sync.local import LocalServer
from osb_sync.local.host import volumes
from tests.local.isolation_probes import isolating_server, probe

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="ID-mapped volumes need a root server")

OWNER = (4242, 4343)  # an ordinary host user and group (no names needed)
HOST_ROOT = (0, 0)
MARKER = "opensandbox-e2e-marker\n"
MOUNT = "/mnt/data"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """allowed/ (host volumes' tree) and volumes/ (pvcs), which the range may traverse."""
    root = tmp_path_factory.mktemp("owners")
    for part in ("allowed", "volumes"):
        (root / part).mkdir()
    root.chmod(0o755)
    root.parent.chmod(0o755)
    return root


def _server(base: Path, **options: Any) -> Iterator[LocalServer]:
    srv = isolating_server(
        allowed_host_paths=[str(base / "allowed")], volume_root=base / "volumes", **options
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def server(base: Path) -> Iterator[LocalServer]:
    """A root server as it starts by default."""
    yield from _server(base)


@pytest.fixture(scope="module")
def host_root_server(base: Path) -> Iterator[LocalServer]:
    """A root server that maps a volume host root owns to host root (the opt-in)."""
    yield from _server(base, volume_root_is_host_root=True)


def _directory(path: Path, owner: tuple[int, int], marker: str = MARKER) -> None:
    path.mkdir(parents=True)
    (path / "marker.txt").write_text(marker)
    os.chown(path, *owner)


@dataclass(frozen=True)
class Flow:
    """One of the official flows: its volume, the marker it reads, the file it writes."""

    directory: Path  # what is mounted, on the host
    volume: dict[str, Any]
    mount: str
    marker: str
    output: str  # a file name
    text: str  # what the sandbox writes there
    hidden: str = ""  # what the mount must not show (the rest of the volume)


def host_flow(base: Path, name: str, owner: tuple[int, int]) -> Flow:
    """The official host read-write flow: a host directory of `owner`'s at /mnt/host-data."""
    directory = base / "allowed" / name
    _directory(directory, owner)
    mount = "/mnt/host-data"
    volume = {"name": "test-host-vol", "host": {"path": str(directory)}, "mountPath": mount}
    return Flow(directory, volume, mount, MARKER, "sandbox-output.txt", "written-from-sandbox")


def pvc_flow(base: Path, name: str, owner: tuple[int, int]) -> Flow:
    """The official pvc read-write flow: a named volume made beforehand, `owner`'s."""
    directory = base / "volumes" / name
    _directory(directory, owner, "pvc-marker-data\n")
    mount = "/mnt/pvc-data"
    volume = {"name": "test-pvc-vol", "pvc": {"claimName": name}, "mountPath": mount}
    return Flow(directory, volume, mount, "pvc-marker-data\n", "pvc-output.txt", "written-to-pvc")


def sub_path_flow(base: Path, name: str, owner: tuple[int, int]) -> Flow:
    """The official pvc `subPath` flow: `datasets/train` of a named volume at /mnt/train,
    every directory `owner`'s."""
    _directory(base / "volumes" / name, owner, "pvc-marker-data\n")
    (base / "volumes" / name / "datasets").mkdir()
    os.chown(base / "volumes" / name / "datasets", *owner)
    directory = base / "volumes" / name / "datasets" / "train"
    _directory(directory, owner, "pvc-subpath-marker\n")
    mount = "/mnt/train"
    volume = {
        "name": "test-pvc-subpath",
        "pvc": {"claimName": name},
        "mountPath": mount,
        "subPath": "datasets/train",
    }
    marker, text = "pvc-subpath-marker\n", "subpath-write-test"
    return Flow(directory, volume, mount, marker, "output.txt", text, hidden="datasets")


FLOWS = pytest.mark.parametrize(
    "make", [host_flow, pvc_flow, sub_path_flow], ids=["host", "pvc", "pvc-subPath"]
)
MakeFlow = Callable[[Path, str, tuple[int, int]], Flow]


def sandbox(server: LocalServer, volume: dict[str, Any]) -> Any:
    """A sandbox with `volume` (a context manager), through our client."""
    return Client(api_base=server.api_base).create_sandbox(volumes=[volume])


def message(box: Sandbox) -> str:
    return box.info().message or ""


def write_and_read_back(box: Sandbox, flow: Flow) -> None:
    """The official flows' steps: read the marker, write a file, read it back; the mount is a
    directory (showing only the `subPath`'s content)."""
    assert box.commands.run(f"cat {flow.mount}/marker.txt").check().stdout == flow.marker
    box.commands.run(f"echo '{flow.text}' > {flow.mount}/{flow.output}").check()
    assert box.commands.run(f"cat {flow.mount}/{flow.output}").check().stdout == f"{flow.text}\n"
    assert box.commands.run(f"test -d {flow.mount} && echo OK").check().stdout == "OK\n"
    listed = box.commands.run(f"ls {flow.mount}/").check().stdout.split()
    assert "marker.txt" in listed and (not flow.hidden or flow.hidden not in listed), listed


@FLOWS
def test_a_directory_of_an_ordinary_user_is_written_as_that_user(
    server: LocalServer, base: Path, make: MakeFlow
) -> None:
    flow = make(base, f"user-{make.__name__}".replace("_", "-"), OWNER)
    with sandbox(server, flow.volume) as box:
        write_and_read_back(box, flow)
        assert "is ID-mapped" in message(box), message(box)
        made = box.commands.run(f"mkdir {flow.mount}/made && stat -c %u:%g {flow.mount}/made")
        assert made.check().stdout == "0:0\n"  # the directory's owner is the sandbox's root
    for name in (flow.output, "made"):
        info = os.stat(flow.directory / name)
        assert (info.st_uid, info.st_gid) == OWNER  # on the host, the directory's owner's


@FLOWS
def test_a_directory_of_host_root_is_written_as_host_root_under_the_opt_in(
    host_root_server: LocalServer, base: Path, make: MakeFlow
) -> None:
    flow = make(base, f"root-{make.__name__}".replace("_", "-"), HOST_ROOT)
    with sandbox(host_root_server, flow.volume) as box:
        write_and_read_back(box, flow)
        assert "writes as host ROOT" in message(box), message(box)
    info = os.stat(flow.directory / flow.output)
    assert (info.st_uid, info.st_gid) == HOST_ROOT


@FLOWS
def test_a_directory_of_host_root_is_not_host_roots_to_write_by_default(
    server: LocalServer, base: Path, make: MakeFlow
) -> None:
    flow = make(base, f"refused-{make.__name__}".replace("_", "-"), HOST_ROOT)
    with sandbox(server, flow.volume) as box:
        assert box.commands.run(f"cat {flow.mount}/marker.txt").check().stdout == flow.marker
        written = box.commands.run(f"echo '{flow.text}' > {flow.mount}/{flow.output}")
        status = message(box)
    assert written.exit_code != 0 and "Permission denied" in written.stderr
    assert not (flow.directory / flow.output).exists()
    assert "NOT writable by the sandbox's root" in status, status
    assert "chown" in status and "--volume-root-is-host-root" in status


def at_mount(flow: Flow) -> tuple[Path, dict[str, Any]]:
    """`flow`'s directory, and its volume at `MOUNT`, for the tests below."""
    return flow.directory, {**flow.volume, "mountPath": MOUNT}


SETID_PROBE = """
import shutil, stat
shutil.copy("/bin/true", "/mnt/data/planted")
attempt("chmod 4755", os.chmod, "/mnt/data/planted", 0o4755)
attempt("chmod 2755", os.chmod, "/mnt/data/planted", 0o2755)
attempt("fchmod 6755", lambda: os.fchmod(os.open("/mnt/data/planted", os.O_RDONLY), 0o6755))
attempt("open 4755", os.open, "/mnt/data/made-setuid", os.O_CREAT | os.O_WRONLY, 0o4755)
attempt("mknod 4755", os.mknod, "/mnt/data/mknod-setuid", stat.S_IFREG | 0o4755)
v2 = (0x02000001).to_bytes(4, "little") + (1 << 21).to_bytes(4, "little") + bytes(12)
attempt("file capability", os.setxattr, "/mnt/data/planted", "security.capability", v2)
attempt("chmod 755", os.chmod, "/mnt/data/planted", 0o755)
"""


def test_nothing_written_through_a_volume_is_set_id_or_capable_on_the_host(
    host_root_server: LocalServer, base: Path
) -> None:
    # The worst case: what the sandbox's root writes there is host root's (the opt-in).
    directory, volume = at_mount(host_flow(base, "setid", HOST_ROOT))
    try:
        with sandbox(host_root_server, volume) as box:
            outcomes = probe(box, SETID_PROBE)
            status = message(box)
        assert_nothing_privileged(directory, outcomes, status)
    finally:  # a failure leaves no host root's set-id or capable file behind
        shutil.rmtree(directory)


def assert_nothing_privileged(directory: Path, outcomes: dict[str, Any], status: str) -> None:
    """No probe that gives a set-id mode or a file capability got through; no file is so."""
    allowed = outcomes.pop("chmod 755")
    assert allowed == {"ok": True, "value": None}  # modes without set-id bits still work
    got_through = {name: o for name, o in outcomes.items() if o["ok"]}
    assert not got_through, got_through
    assert all("PermissionError" in o["error"] for o in outcomes.values()), outcomes
    for path in directory.iterdir():
        info = os.lstat(path)
        assert not info.st_mode & 0o6000, (path, oct(info.st_mode))
        assert "security.capability" not in os.listxattr(path), path
    planted = os.stat(directory / "planted")
    assert (planted.st_uid, planted.st_mode & 0o7777) == (0, 0o755)
    assert "no set-id mode" in status, status


def test_a_sandbox_without_a_writable_volume_still_makes_set_id_files(
    server: LocalServer,
) -> None:
    # The guard is a writable volume's: elsewhere a sandbox's set-id files stay its own.
    with Client(api_base=server.api_base).create_sandbox() as box:
        made = box.commands.run("touch /tmp/s && chmod 4755 /tmp/s && stat -c %a /tmp/s")
        assert made.check().stdout == "4755\n"


def test_a_read_only_volume_stays_read_only_when_mapped(server: LocalServer, base: Path) -> None:
    directory, volume = at_mount(host_flow(base, "read-only", OWNER))
    with sandbox(server, {**volume, "readOnly": True}) as box:
        assert box.commands.run(f"cat {MOUNT}/marker.txt").check().stdout == MARKER
        written = box.commands.run(f"echo x > {MOUNT}/output.txt")
        owner = box.commands.run(f"stat -c %u:%g {MOUNT}/marker.txt").check().stdout
    assert written.exit_code != 0 and "Read-only file system" in written.stderr
    assert owner == "65534:65534\n"  # the marker is host root's: nobody there, not root
    assert not (directory / "output.txt").exists()


@pytest.fixture
def ramfs(base: Path) -> Iterator[Path]:
    """A host volume's directory on ramfs (a file system without ID-mapped mounts)."""
    directory = base / "allowed" / "ramfs"
    directory.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "ramfs", str(directory)], check=True)
    try:
        (directory / "marker.txt").write_text(MARKER)
        os.chown(directory, *OWNER)
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


def test_a_file_system_without_id_mapped_mounts_is_bound_as_before_and_said(
    server: LocalServer, ramfs: Path
) -> None:
    volume = {"name": "data", "host": {"path": str(ramfs)}, "mountPath": MOUNT}
    with sandbox(server, volume) as box:
        assert box.commands.run(f"cat {MOUNT}/marker.txt").check().stdout == MARKER
        written = box.commands.run(f"echo x > {MOUNT}/output.txt")
        status = message(box)
    assert "NOT ID-mapped (mount_setattr: Invalid argument" in status, status
    assert written.exit_code != 0  # as before: the sandbox's root is not the owner
    assert not (ramfs / "output.txt").exists()


def test_a_directory_the_server_makes_in_a_mapped_volume_is_the_owners(
    server: LocalServer, base: Path
) -> None:
    # An image's WorkingDir inside a volume is made by the server (`volumes.make_inside`):
    # in an ID-mapped volume, as the directory's owner (the sandbox's root there), else it
    # would be nobody's inside, and not the sandbox's root's to write.
    directory, volume = at_mount(host_flow(base, "made-inside", OWNER))
    checked = volumes.checked([volume], True)
    binds = volumes.opened(checked, (base / "allowed",), base / "volumes")
    try:
        assert binds[0].mapped == OWNER
        volumes.make_inside(binds[0], ["work", "dir"], "the WorkingDir")
    finally:
        volumes.close(binds)
    for made in (directory / "work", directory / "work" / "dir"):
        info = os.stat(made)
        assert (info.st_uid, info.st_gid) == OWNER, made


REWRITE_PROBE = """
import mmap
def rewrite(path):  # a shared writable mapping: no write(2), so no file_remove_privs
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            m[0:4] = b"EVIL"
            m.flush()
    finally:
        os.close(fd)
    os.chmod(path, 0o755)  # an executable now (chmod keeps a file capability)
attempt("rewrite", rewrite, "/mnt/data/tool")
"""
CAPABILITY = (0x02000001).to_bytes(4, "little") + (1 << 21).to_bytes(4, "little") + bytes(12)


@pytest.mark.parametrize("kind", ["set-id", "capable"])
@pytest.mark.parametrize("owner", [OWNER, HOST_ROOT], ids=["user", "host-root"])
def test_a_privileged_file_already_in_a_volume_is_not_the_sandboxs_to_rewrite(
    host_root_server: LocalServer, base: Path, owner: tuple[int, int], kind: str
) -> None:
    # The kernel clears set-id bits and file capabilities on write(2), not on a write through
    # a shared mapping: a set-id or capable file of the directory's owner that the sandbox's
    # root could open for writing would run the sandbox's code as that owner on the host.
    directory, volume = at_mount(host_flow(base, f"privileged-{kind}-{owner[0]}", owner))
    tool = directory / "tool"
    shutil.copy("/bin/true", tool)
    os.chown(tool, *owner)
    if kind == "set-id":
        tool.chmod(0o4755)
    else:  # not executable: the sandbox would make it so
        tool.chmod(0o644)
        os.setxattr(tool, "security.capability", CAPABILITY)
    try:
        with sandbox(host_root_server, volume) as box:
            outcomes = probe(box, REWRITE_PROBE)
            status = message(box)
        privileged = tool.stat().st_mode & 0o6000 or os.listxattr(tool)
        assert not (tool.read_bytes().startswith(b"EVIL") and privileged)
        assert "PermissionError" in outcomes["rewrite"].get("error", ""), outcomes
        assert "is NOT ID-mapped: it holds 'tool'" in status, status
    finally:  # a failure leaves no privileged file behind
        shutil.rmtree(directory)


def test_a_privileged_file_of_an_id_the_mount_does_not_map_leaves_it_mapped(
    server: LocalServer, base: Path
) -> None:
    # Host root's set-id file in an ordinary user's directory (a copied root file system, say)
    # shows as nobody's there: the kernel lets no one write it through the mount.
    directory, volume = at_mount(host_flow(base, "foreign-setid", OWNER))
    tool = directory / "tool"
    shutil.copy("/bin/true", tool)
    tool.chmod(0o4755)
    try:
        with sandbox(server, volume) as box:
            outcomes = probe(box, REWRITE_PROBE)
            status = message(box)
        assert "PermissionError" in outcomes["rewrite"].get("error", ""), outcomes
        assert "'test-host-vol' is ID-mapped" in status, status
        assert not tool.read_bytes().startswith(b"EVIL") and tool.stat().st_mode & 0o4000
    finally:
        shutil.rmtree(directory)
