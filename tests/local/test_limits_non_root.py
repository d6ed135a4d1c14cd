"""Limits of a server that is not root (issue 42, item 3): a limit a create asks for is enforced
or reported, never silently dropped.

- With a cgroup v1 parent the test (as root) makes in the memory, pids, cpu and freezer
  hierarchies and gives the user (`chown -R`, what `--cgroup-parent`'s fix says), a 128 MiB
  memory limit holds, and the sandbox can neither see those files nor raise its limits.
- Without one, the create succeeds, its status names the limits not enforced, and the server
  logs one warning line; `require_limits` refuses it instead, naming the fix.
- The pids limit holds without any cgroup: RLIMIT_NPROC in the sandbox's own user namespace
  (Linux 5.14+ counts it there), so a fork loop stops near it and the user's own shells, under
  a small RLIMIT_NPROC of their own, still fork. It counts per id: a sandbox without a range
  has one; one with a range forks as many again from each id it switches to, as its status
  says (reported as not enforced, so `require_limits` refuses it there).
- The disk size and inode cap hold per writable directory (bwrap's `--tmpfs --size`, then a
  remount with `nr_inodes` from inside the sandbox's namespaces), cold and at a spare's claim.

Each runs a server as a fresh user (`test_non_root.py`'s fixtures): root only, like those.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from osb_sync import Client
from osb_sync.local.host import cgroup, identity, limits
from tests.local.serverproc import ServerProcess, descendants
from tests.local.support import CREATE_BODY
from tests.local.test_non_root import (  # noqa: F401 (fixtures)
    PYTHON,
    package_copy,
    ranged_user,
    rangeless_user,
)

ALLOCATE_256M = "python3 -c 'b = bytearray(256 << 20); print(\"allocated\", len(b))'"
# Forks until the kernel refuses (or 1000), holds the children `HOLD` seconds, then ends them.
HOLD = 8
FORK_AND_HOLD = f"""python3 - <<'EOF'
import os, time
children = []
try:
    while len(children) < 1000:
        pid = os.fork()
        if pid == 0:
            time.sleep({HOLD + 5})
            os._exit(0)
        children.append(pid)
except OSError as exc:
    print("stopped after", len(children), exc.errno, flush=True)
time.sleep({HOLD})
for pid in children:
    os.kill(pid, 9)
EOF"""
# Every process's RLIMIT_NPROC in a sandbox (soft hard), deduplicated.
EVERY_NPROC = "grep -h 'Max processes' /proc/[0-9]*/limits | awk '{print $3, $4}' | sort -u"
# Forks from 4 other ids (a range's sandbox has them; one without a range, none).
SWITCH_IDS = """python3 - <<'EOF'
import os, time
total, groups = 0, []
for uid in range(1000, 1004):
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.setpgid(0, 0)  # the parent ends its children by their group
        made = 0
        try:
            os.setgid(uid)
            os.setuid(uid)
            while made < 60:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                made += 1
        except OSError as exc:
            print("setuid refused" if made == 0 else "stopped", exc.errno, flush=True)
        os.write(w, str(made).encode())
        time.sleep(60)
        os._exit(0)
    os.close(w)
    total += int(os.read(r, 100) or 0)
    groups.append(child)
print("forked", total, flush=True)  # all held at once
for child in groups:
    os.killpg(child, 9)
    os.waitpid(child, 0)
EOF"""
# Run as the user, outside any sandbox: 40 children at once.
USER_FORKS = "for i in $(seq 40); do sleep 2 & done; wait && echo forked-40"
# Run in a sandbox: what of the cgroup files it can reach or change.
HOSTILE = """
ls /sys/fs/cgroup 2>&1 | head -1
for fs in cgroup cgroup2; do mount -t $fs -o memory none /mnt 2>&1 | head -1 || true; done
python3 -c 'import resource; resource.setrlimit(resource.RLIMIT_NPROC, (1 << 20, 1 << 20))' \
  2>&1 | tail -1
"""


WARNING = "runs WITHOUT the limits it asked for"
DENY = {"defaultAction": "deny"}


@contextlib.contextmanager
def delegated(user: str) -> Iterator[cgroup.Place]:
    """A cgroup parent in the memory, pids, cpu and freezer hierarchies, under this process's
    own groups (the server, its child, starts there), given to `user` as an operator would
    (`chown -R`); removed after, with whatever groups are left in it."""
    place = cgroup.Place(f"osb-test-{os.getpid()}")
    if not all(cgroup.usable(c) for c in cgroup.CONTROLLERS):
        pytest.skip("makes cgroup v1 groups for a user: needs writable v1 controllers (root)")
    entry = pwd.getpwnam(user)
    made: list[Path] = []
    try:
        for controller in cgroup.CONTROLLERS:
            base = place.base(controller)
            base.mkdir()
            made.append(base)
            for path in (base, *base.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        yield place
    finally:
        for base in made:
            for group in sorted(base.rglob("*"), key=lambda p: -len(p.parts)):
                if group.is_dir():
                    cgroup.remove_groups([group])
            base.rmdir()


def _warnings(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if WARNING in line]


@pytest.mark.parametrize("who", ["ranged_user", "rangeless_user"])
def test_a_delegated_cgroup_parent_holds_a_non_root_sandbox_s_memory_limit(
    who: str,
    request: pytest.FixtureRequest,
    package_copy: str,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    user = request.getfixturevalue(who)
    log = tmp_path / "server.log"
    asked = {"memory": "128Mi", "cpu": "0.5", "pids": "64"}
    with delegated(user) as place:
        server = ServerProcess(
            log=log,
            user=user,
            python=PYTHON,
            path=package_copy,
            cgroup_parent=place.parent,
            require_limits=True,  # nothing is refused: every limit asked for holds
        )
        try:
            with (
                Client(server.api_base) as client,
                client.create_sandbox(resource_limits=asked) as sandbox,
            ):
                message = sandbox.info().message or ""
                assert "memory=128Mi (cgroup), cpu=0.5 (cgroup), pids=64 (cgroup)" in message
                assert "pause by freezer cgroup" in message, message
                groups = {c: cgroup.parent_dir(c, place) / sandbox.id for c in cgroup.CONTROLLERS}
                limit = groups["memory"] / "memory.limit_in_bytes"
                assert limit.read_text().strip() == str(128 << 20)
                assert (groups["pids"] / "pids.max").read_text().strip() == "64"
                assert sandbox.run_code("print(6*7)").stdout == "42\n"
                # Every process of the sandbox (bwrap and all below it) is in its four
                # groups: none outside, none half in. (The server's own short-lived helpers,
                # and the warm spare's start, are in other groups.)
                python = _server_python(server.pid)
                names = {pid: _sandbox_groups(pid) for pid in descendants(python)}
                mine = {pid for pid, found in names.items() if sandbox.id in found}
                assert all(names[pid] == {sandbox.id} for pid in mine), names
                assert len(mine) >= 3, names  # bwrap, its child, execd
                below = {child for pid in mine for child in descendants(pid)} & set(names)
                assert below <= mine, (below - mine, names)
                assert mine <= set(cgroup.members(groups["memory"]))
                ran = sandbox.commands.run(ALLOCATE_256M)
                assert "allocated" not in ran.stdout and ran.exit_code != 0, ran
                tried = sandbox.commands.run(HOSTILE).stdout
                assert "No such file or directory" in tried, tried  # no cgroup tree inside
                assert "mounted" not in tried and tried.count("mount:") == 2, tried
                assert limit.read_text().strip() == str(128 << 20)  # untouched
                assert sandbox.run_code("print(6*7)").stdout == "42\n"  # execd survived
            assert not [group for group in groups.values() if group.exists()]
        finally:
            assert server.stop() == 0
    assert _warnings(log) == []


def test_without_a_delegated_cgroup_a_non_root_server_names_what_it_does_not_enforce(
    ranged_user: str,  # noqa: F811 (the fixture)
    package_copy: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    asked = {"memory": "128Mi", "cpu": "0.5"}
    server = ServerProcess(log=log, user=ranged_user, python=PYTHON, path=package_copy)
    try:
        with Client(server.api_base) as client:
            with client.create_sandbox(resource_limits=asked) as sandbox:
                message = sandbox.info().message or ""
                unenforced = message.partition("; not enforced: ")[2]
                assert "pids=512 (no writable pids cgroup; RLIMIT_NPROC holds per id" in (
                    unenforced  # a default: reported, no warning
                )
                assert "memory=128Mi (no writable memory cgroup" in unenforced, message
                assert "cpu=0.5 (no writable cpu cgroup)" in unenforced, message
            with client.create_sandbox(resource_limits={"ephemeral-storage": "64Mi"}) as quiet:
                assert "ephemeral-storage=64Mi (tmpfs, in memory" in (quiet.info().message or "")
    finally:
        assert server.stop() == 0
    warned = _warnings(log)
    assert len(warned) == 1, log.read_text()  # one line, for the create that asked
    for said in ("memory=128Mi", "cpu=0.5", f"chown -R {ranged_user}", "--cgroup-parent /osb-"):
        assert said in warned[0], warned

    strict = ServerProcess(user=ranged_user, python=PYTHON, path=package_copy, require_limits=True)
    try:
        body = {**CREATE_BODY, "resourceLimits": {"memory": "128Mi"}}
        refused = requests.post(f"{strict.api_base}/sandboxes", json=body, timeout=60)
        assert refused.status_code == 503, refused.text
        assert refused.json()["code"] == "SANDBOX::LIMITS_UNENFORCEABLE", refused.text
        said = refused.json()["message"]
        assert "memory=128Mi" in said and f"chown -R {ranged_user}" in said, said
        assert "--cgroup-parent" in said, said
        body = {**CREATE_BODY, "resourceLimits": {"pids": "64"}}
        per_id = requests.post(f"{strict.api_base}/sandboxes", json=body, timeout=60)
        assert per_id.status_code == 503, per_id.text  # a range's RLIMIT_NPROC is per id
        assert "RLIMIT_NPROC holds per id inside only" in per_id.json()["message"]
        held = {**CREATE_BODY, "resourceLimits": {"inodes": "5000"}, "networkPolicy": DENY}
        plain = requests.post(f"{strict.api_base}/sandboxes", json=held, timeout=60)
        assert plain.status_code == 202, plain.text  # inodes hold; the defaults are not asked
        requests.delete(f"{strict.api_base}/sandboxes/{plain.json()['id']}", timeout=60)
    finally:
        assert strict.stop() == 0


@pytest.mark.parametrize("who", ["ranged_user", "rangeless_user"])
def test_rlimit_nproc_stops_a_non_root_sandbox_s_fork_loop_and_spares_the_user_s_shells(
    who: str,
    request: pytest.FixtureRequest,
    package_copy: str,  # noqa: F811 (the fixture)
) -> None:
    if not limits.nproc_per_namespace():
        pytest.fail("this kernel counts RLIMIT_NPROC per host uid (before 5.14)")
    user = request.getfixturevalue(who)
    # The user's own RLIMIT_NPROC is small (300) for the server and for its shells: counted
    # per host uid, a sandbox's fork loop would use it all up.
    small = (shutil.which("prlimit") or "prlimit", "--nproc=300")
    server = ServerProcess(user=user, python=PYTHON, path=package_copy, wrap=small)
    said: list[str] = []
    try:
        with (
            Client(server.api_base) as client,
            client.create_sandbox(resource_limits={"pids": "64"}) as sandbox,
        ):
            message = sandbox.info().message or ""
            if who == "rangeless_user":  # one id: the whole sandbox
                assert "pids=64 (RLIMIT_NPROC in the sandbox's user namespace)" in message
            else:  # set too, but said to hold per id only
                assert "pids=64 (no writable pids cgroup; RLIMIT_NPROC holds per id" in message
            # Every process of the sandbox has it, its pid 1 too (one left at the server's
            # could be made to fork past it through ptrace)
            seen = sandbox.commands.run(EVERY_NPROC).stdout
            assert seen == "64 64\n", seen
            loop = threading.Thread(
                target=lambda: said.append(sandbox.commands.run(FORK_AND_HOLD).stdout)
            )
            loop.start()
            deadline = time.monotonic() + 30  # the loop holds HOLD s once it stopped
            while len(descendants(server.pid)) < 50 and time.monotonic() < deadline:
                time.sleep(0.2)
            shells = subprocess.run(
                [*small, "runuser", "-u", user, "--", "sh", "-c", USER_FORKS],
                capture_output=True,
                timeout=60,
                cwd="/",
            )
            held = len(descendants(server.pid))
            loop.join(60)
            assert said and "stopped after" in said[0], said
            forked = int(said[0].split("stopped after")[1].split()[0])
            assert 0 < forked < 64, said  # execd, its threads and the shell count too
            assert held >= 50, held  # the loop's children were there while the user forked
            assert shells.stdout == b"forked-40\n", shells
            raised = sandbox.commands.run(HOSTILE).stdout
            assert "not allowed to raise maximum limit" in raised, raised
            switched = sandbox.commands.run(SWITCH_IDS).stdout
            total = int(switched.split("forked")[1].split()[0])
            if who == "rangeless_user":
                assert "setuid refused" in switched and total < 64, switched  # no other id
            else:
                assert total > 64, switched  # what the status says: per id
            # More than the user's own hard limit: that one (execd may not raise it)
            with client.create_sandbox(resource_limits={"pids": "4194304"}) as large:
                assert large.commands.run("ulimit -u; ulimit -Hu").stdout == "300\n300\n"
    finally:
        assert server.stop() == 0


def _sandbox_groups(pid: int) -> set[str]:
    """The last parts of `pid`'s groups of the sandboxes' controllers (`{"<id>"}` in one
    sandbox's four groups)."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    paths = {c: path for _, names, path in (line.split(":", 2) for line in lines)
             for c in names.split(",")}  # fmt: skip
    return {paths[c].rpartition("/")[2] for c in cgroup.CONTROLLERS}


def _server_python(runuser: int) -> int:
    """The server's own process: `runuser`'s child."""
    children = [
        pid
        for pid in descendants(runuser)
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1] == str(runuser)
    ]
    assert len(children) == 1, children
    return children[0]


# Run in a sandbox: write 1 MiB at a time into every writable directory until each refuses,
# then make empty files likewise; print the totals, then each tmpfs's mount line.
FILL = """python3 - <<'EOF'
import json, os
places = ("/tmp", "/var", "/srv", "/mnt", "/opt", "/home", "/home/sandbox", "/run/osb-execd")
written, made, why = 0, 0, set()
for place in places:
    try:
        with open(f"{place}/big", "wb") as out:
            while True:
                out.write(b"x" * (1 << 20))
                out.flush()
                written += 1 << 20
    except OSError as exc:
        written += os.path.getsize(f"{place}/big") % (1 << 20)
        why.add(exc.strerror)
    os.unlink(f"{place}/big")
for place in places:
    try:
        while True:
            open(f"{place}/f{made}", "w").close()
            made += 1
    except OSError as exc:
        why.add(exc.strerror)
print(json.dumps({"written": written, "made": made, "why": sorted(why)}))
EOF
grep -E ' /(tmp|home) ' /proc/self/mountinfo
"""


@pytest.mark.parametrize("spares", [0, 1])
@pytest.mark.parametrize("who", ["ranged_user", "rangeless_user"])
def test_a_non_root_sandbox_s_disk_size_and_inodes_hold(
    who: str,
    spares: int,
    request: pytest.FixtureRequest,
    package_copy: str,  # noqa: F811 (the fixture)
) -> None:
    user = request.getfixturevalue(who)
    server = ServerProcess(
        user=user, python=PYTHON, path=package_copy, spare_containers=spares, require_limits=True
    )
    try:
        asked = {"ephemeral-storage": "16Mi", "inodes": "1000"}
        with (
            Client(server.api_base) as client,
            client.create_sandbox(resource_limits=asked) as sandbox,  # a spare's: at its claim
        ):
            message = sandbox.info().message or ""
            enforced = message.split("; not")[0]
            assert "ephemeral-storage=16Mi (tmpfs, in memory, split between the" in enforced
            assert "inodes=1000 (split likewise)" in enforced
            said = sandbox.commands.run(FILL).stdout
            found = json.loads(said.splitlines()[0])
            assert found["why"] == ["No space left on device"], said
            # All the writable directories together: the limit, not eight times it
            assert 14 << 20 < found["written"] <= 16 << 20, said
            assert 900 < found["made"] <= 1000, said  # their own entries count too
            mounts = said.splitlines()[1:]  # /tmp's and /home's
            assert len(mounts) == 2, said
            for line in mounts:
                assert "nosuid" in line and "nodev" in line, line  # kept by the remount
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("who", ["ranged_user", "rangeless_user"])
def test_the_sandboxes_together_leave_the_user_a_reserve_of_processes(
    who: str,
    request: pytest.FixtureRequest,
    package_copy: str,  # noqa: F811 (the fixture)
) -> None:
    user = request.getfixturevalue(who)
    small = (shutil.which("prlimit") or "prlimit", "--nproc=300")
    server = ServerProcess(user=user, python=PYTHON, path=package_copy, wrap=small)
    said: list[str] = []
    try:
        with Client(server.api_base) as client:
            boxes = [client.create_sandbox(resource_limits={"pids": "100"}) for _ in range(4)]
            try:
                loops = [
                    threading.Thread(
                        target=lambda b=b: said.append(b.commands.run(FORK_AND_HOLD).stdout)
                    )
                    for b in boxes
                ]
                for loop in loops:
                    loop.start()
                counts = [0]
                deadline = time.monotonic() + 30  # until the count stops growing
                while time.monotonic() < deadline:
                    time.sleep(1)
                    counts.append(len(descendants(server.pid)))
                    if counts[-1] > 150 and counts[-1] == counts[-2]:
                        break
                shells = subprocess.run(
                    [*small, "runuser", "-u", user, "--", "sh", "-c", USER_FORKS],
                    capture_output=True,
                    timeout=60,
                    cwd="/",
                )
                body = {**CREATE_BODY, "networkPolicy": DENY}
                another = requests.post(f"{server.api_base}/sandboxes", json=body, timeout=60)
                for loop in loops:
                    loop.join(60)
            finally:
                for box in boxes:
                    box.delete()
    finally:
        assert server.stop() == 0
    forked = [int(text.split("stopped after")[1].split()[0]) for text in said]
    assert len(forked) == 4 and all(count < 100 for count in forked), said
    # 4 x ~95 would pass the user's 300: they stopped together short of it
    assert sum(forked) <= 300 - identity.NPROC_RESERVE, (forked, counts)
    assert shells.stdout == b"forked-40\n", (shells, forked, counts)
    if another.status_code == 500:  # the budget was used up: the answer says whose and why
        assert "share at most 236 processes" in another.json()["message"], another.text
    else:
        assert another.status_code == 202, another.text


def test_a_killed_server_s_groups_under_its_cgroup_parent_are_reaped_by_the_next(
    rangeless_user: str,  # noqa: F811 (the fixture)
    package_copy: str,  # noqa: F811
) -> None:
    with delegated(rangeless_user) as place:
        first = ServerProcess(
            user=rangeless_user, python=PYTHON, path=package_copy, cgroup_parent=place.parent
        )
        body = {**CREATE_BODY, "resourceLimits": {"memory": "128Mi"}, "networkPolicy": DENY}
        made = requests.post(f"{first.api_base}/sandboxes", json=body, timeout=60)
        assert made.status_code == 202, made.text
        groups = [cgroup.parent_dir(c, place) / made.json()["id"] for c in cgroup.CONTROLLERS]
        assert all(group.is_dir() for group in groups)
        os.kill(_server_python(first.pid), signal.SIGKILL)  # no chance to clean up
        first.proc.wait(30)
        second = ServerProcess(
            user=rangeless_user, python=PYTHON, path=package_copy, cgroup_parent=place.parent
        )
        try:
            assert not [group for group in groups if group.exists()], groups  # reaped at start
        finally:
            assert second.stop() == 0


def test_a_cgroup_parent_the_user_was_not_given_refuses_to_start_naming_the_fix(
    ranged_user: str,  # noqa: F811 (the fixture)
    package_copy: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    log = tmp_path / "server.log"
    with pytest.raises(AssertionError, match="did not start"):
        ServerProcess(
            log=log,
            user=ranged_user,
            python=PYTHON,
            path=package_copy,
            cgroup_parent=f"/osb-nobody-gave-{os.getpid()}",
        )
    said = log.read_text()
    assert "is not this server's to use (missing, or not writable by it)" in said, said
    assert f"chown -R {ranged_user}" in said, said
