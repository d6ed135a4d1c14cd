"""A server that survives its own crash (issue 24, item 2): cgroup kill, reap at start, strays."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from osb_sync._cli import build_parser
from osb_sync.local.host import cgroup, container, options, recovery
from osb_sync.local.host.bwrap import probe
from osb_sync.local.host.container import Launch, SandboxContainer
from tests.local.serverproc import ServerProcess
from tests.local.support import CREATE_BODY, alive, local_server, require_isolation, wait_for


def needs_cgroups() -> None:
    require_isolation()
    if not cgroup.usable("pids"):
        pytest.skip("no writable pids cgroup here")


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line or working directory names `text`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                words = cmdline.read().decode(errors="replace")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if (text in words or cwd.startswith(text)) and alive(int(entry)):
            found.append(int(entry))
    return found


def mounts_below(path: Path) -> list[str]:
    return [p for p in recovery.mount_points() if p.startswith(str(path) + os.sep)]


def stray_in_group(group: Path) -> subprocess.Popen[bytes]:
    """A process in `group` that no parent's death ends (like an inner bwrap setting up)."""
    return subprocess.Popen(
        ["/bin/sh", "-c", f'echo $$ > "{group}/cgroup.procs" && exec sleep 600'],
        start_new_session=True,
    )


def test_a_launch_that_fails_while_bwrap_sets_up_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_cgroups()
    # The container cannot tell its init in time: the launch fails with bwrap mid-way.
    monkeypatch.setattr(container, "START_TIMEOUT", 0.02)
    sandbox_id = str(uuid.uuid4())
    box = SandboxContainer(sandbox_id, tmp_path, probe())
    with pytest.raises(RuntimeError):
        box.launch(1.0, 0.0, Launch(controllers=frozenset({"pids"})))
    groups = cgroup.leftover_groups(sandbox_id)
    assert groups, "the container made no groups"
    pids = {pid for group in groups for pid in cgroup.members(group)}
    started = time.monotonic()
    box.close()
    assert time.monotonic() - started < 4.0  # killed whole, not waited on for STOP_TIMEOUT
    assert not [pid for pid in pids if alive(pid)]
    assert cgroup.leftover_groups(sandbox_id) == []
    assert processes_mentioning(str(tmp_path)) == []


def test_a_start_on_a_state_directory_reaps_what_a_killed_server_left(tmp_path: Path) -> None:
    needs_cgroups()
    state = tmp_path / "state"
    log = tmp_path / "server.log"
    first = ServerProcess(root_dir=str(state))
    strays: list[subprocess.Popen[bytes]] = []
    try:
        with requests.Session() as http:
            ids = [
                http.post(f"{first.api_base}/sandboxes", json=CREATE_BODY, timeout=60).json()["id"]
                for _ in range(2)
            ]
        # What a kill mid-way leaves: a process stuck in a sandbox's group, a half-written
        # upload, a mount, and a create cut short (its directory and a group, no process).
        strays.append(stray_in_group(cgroup.parent_dir("pids") / ids[0]))
        # (a live sandbox's disk is reached through its home's link: `_detach_disk`)
        disk = Path(os.readlink(state / ids[1])).parent
        (disk / "execd" / "upload-0123456789abcdef").write_bytes(b"x" * (1 << 20))
        stray_mount = state / f"{ids[1]}.run" / "mnt"
        stray_mount.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "osb-test", str(stray_mount)], check=True
        )
        half = str(uuid.uuid4())
        (state / half).mkdir()
        (cgroup.parent_dir("pids") / half).mkdir()
        strays.append(stray_in_group(cgroup.parent_dir("pids") / half))
        first.kill()
        assert alive(strays[0].pid) and alive(strays[1].pid)
        left = set(recovery.sandbox_ids(state))  # its sandboxes' and spares' (their tmpfs too)
        assert {*ids, half} <= left and mounts_below(state)

        second = ServerProcess(root_dir=str(state), log=log)
        try:
            with requests.Session() as http:
                for sandbox_id in ids:
                    gone = http.get(f"{second.api_base}/sandboxes/{sandbox_id}", timeout=10)
                    assert gone.status_code == 404
            assert wait_for(lambda: not any(alive(p.pid) for p in strays), 10)
            for sandbox_id in (*ids, half):
                assert cgroup.leftover_groups(sandbox_id) == []
            assert [p for p in mounts_below(state) if any(i in p for i in left)] == []
            assert sorted(os.listdir(state)) == sorted(
                {recovery.LOCK_NAME, ".spares"} & set(os.listdir(state))
            )
            text = log.read_text()
            for sandbox_id in (*ids, half):
                assert text.count(f"reaped sandbox {sandbox_id}") == 1, text
        finally:
            assert second.stop() == 0
    finally:
        for stray in strays:
            stray.kill()
            stray.wait()


def test_a_second_server_cannot_take_a_live_servers_state_directory(tmp_path: Path) -> None:
    with local_server(root_dir=tmp_path, isolation=False):
        with pytest.raises(recovery.StateDirBusy, match="another local server"):
            local_server(root_dir=tmp_path, isolation=False).start()


def test_serve_takes_a_state_dir(tmp_path: Path) -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--state-dir", str(tmp_path)])
    assert options.keywords(args, api_key=None)["root_dir"] == str(tmp_path)


def test_a_start_removes_osb_local_directories_of_servers_that_are_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_tmp = {**os.environ, "TMPDIR": str(tmp_path)}
    killed = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from osb_sync.local import LocalServer;"
            " s = LocalServer(isolation=False).start(); print(s.root_dir, flush=True);"
            " sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env_tmp,
    )
    assert killed.stdout is not None
    dead_root = Path(killed.stdout.readline().decode().strip())
    (dead_root / "some-file").write_text("left behind")
    killed.kill()
    killed.wait()
    killed.stdin.close()  # type: ignore[union-attr]
    killed.stdout.close()
    held = tmp_path / "osb-local-held"
    held.mkdir()
    lock = recovery.claim(held)  # a live owner (this process)
    unknown = tmp_path / "osb-local-unknown"  # no lock file: an older version's, left alone
    unknown.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    try:
        assert dead_root.is_dir()
        with local_server(isolation=False) as server:
            assert server.root_dir is not None and server.root_dir.parent == tmp_path
            assert not dead_root.exists()
            assert held.is_dir() and unknown.is_dir()
    finally:
        os.close(lock)


@pytest.mark.slow
def test_eight_kills_under_create_and_upload_load_leave_nothing(tmp_path: Path) -> None:
    needs_cgroups()
    state = tmp_path / "state"
    seen: set[str] = set()
    stop = threading.Event()
    current: dict[str, str] = {}
    payload = os.urandom(4 << 20)

    def load() -> None:
        while not stop.is_set():
            base = current.get("api")
            if base is None:
                time.sleep(0.05)
                continue
            try:
                with requests.Session() as http:
                    made = http.post(f"{base}/sandboxes", json=CREATE_BODY, timeout=30)
                    if made.status_code != 202:
                        continue
                    sandbox_id = made.json()["id"]
                    seen.add(sandbox_id)
                    point = http.get(
                        f"{base}/sandboxes/{sandbox_id}/endpoints/44772", timeout=10
                    ).json()
                    files = {
                        "metadata": ("metadata", b'{"path": "big.bin"}', "application/json"),
                        "file": ("file", payload, "application/octet-stream"),
                    }
                    http.post(
                        f"http://{point['endpoint']}/files/upload",
                        files=files,
                        headers=point["headers"],
                        timeout=30,
                    )
                    if random.random() < 0.5:
                        http.delete(f"{base}/sandboxes/{sandbox_id}", timeout=30)
            except requests.RequestException:
                time.sleep(0.05)

    def watch() -> None:  # every id that ever had a directory, half-made ones too
        while not stop.is_set():
            seen.update(recovery.sandbox_ids(state)) if state.is_dir() else None
            time.sleep(0.02)

    threads = [threading.Thread(target=load) for _ in range(3)] + [threading.Thread(target=watch)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(8):
            server = ServerProcess(root_dir=str(state))
            current["api"] = server.api_base
            time.sleep(random.uniform(1.5, 3.5))
            current.pop("api")
            server.kill()
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    last = ServerProcess(root_dir=str(state))
    assert last.stop() == 0
    assert len(seen) >= 8
    assert processes_mentioning(str(state)) == []
    for sandbox_id in seen:
        assert cgroup.leftover_groups(sandbox_id) == [], sandbox_id
    assert mounts_below(state) == []
    left = {str(p.relative_to(state)) for p in state.rglob("*")}
    assert left <= {recovery.LOCK_NAME, ".spares"}, left
