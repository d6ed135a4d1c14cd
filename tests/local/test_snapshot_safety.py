"""Snapshots against a root server's detached disks (issue 50's attack): a copy that outlives
its sandbox's delete, and a restore into a sandbox whose code runs.

A root server reaches a live sandbox's disk through a descriptor of it (`/proc/PID/fd/N`,
`container._detach_disk`); a delete closes it, and the next disk takes the number. Restores
copy as the server (`cp -a`, root): nothing of the sandbox's may run before they are done.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from osb_sync.local.host import snapshots
from tests.local.support import CREATE_BODY, Box, local_server, sandbox_of, texts, wait_for
from tests.local.test_disk import require_disk

pytestmark = pytest.mark.local


def test_a_snapshot_copy_outliving_its_sandbox_copies_that_sandbox_only(
    make_box: Any, http: requests.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy (a thread) starts from paths taken at the POST; the sandbox is deleted while
    it runs (a big home) and new sandboxes start: the snapshot holds the first one's files,
    never another's (the copy names the disk through a descriptor of its own)."""
    require_disk()
    go, entered = threading.Event(), threading.Event()
    real = snapshots.copy_tree

    def slow_copy(source: Path, target: Path) -> None:
        entered.set()
        go.wait(60)
        real(source, target)

    monkeypatch.setattr(snapshots, "copy_tree", slow_copy)
    with local_server(command_grace=0, spare_containers=0) as server:
        first = make_box(server)
        assert texts(first.command("echo first > ~/data")) == []
        fd = sandbox_of(server, first.id).container._disk_fd
        made = http.post(f"{server.api_base}/sandboxes/{first.id}/snapshots", json={}, timeout=30)
        assert made.status_code == 202, made.text
        assert entered.wait(30)
        deleted = http.delete(f"{server.api_base}/sandboxes/{first.id}", timeout=30)
        assert deleted.status_code == 204
        numbers = []
        for _ in range(4):  # the lowest free number is the deleted disk's, once it is free
            other = make_box(server)
            assert texts(other.command("echo other > ~/data")) == []
            numbers.append(sandbox_of(server, other.id).container._disk_fd)
        go.set()
        url = f"{server.api_base}/snapshots/{made.json()['id']}"

        def state() -> str:
            return str(http.get(url, timeout=10).json()["status"]["state"])

        assert wait_for(lambda: state() != "Creating", 30)
        assert state() == "Ready", http.get(url, timeout=10).text
        assert server.root_dir is not None
        copied = server.root_dir / ".snapshots" / made.json()["id"] / "home" / "data"
        assert copied.read_text() == "first\n", (fd, numbers)


def test_a_restore_is_done_before_the_sandbox_s_code_runs(
    http: requests.Session, tmp_path: Path
) -> None:
    """A restored sandbox's entrypoint plants links at the snapshot's names from its first
    moment: the restore (cp -a as root) must be over by then, or it writes a host file."""
    require_disk()
    victim = tmp_path / "victim"
    victim.write_text("original\n")
    victim.chmod(0o600)
    plant = f"while [ ! -e /tmp/stop ]; do ln -sfn {victim} ~/f; done; sleep 100000"
    body = {**CREATE_BODY, "entrypoint": ["/bin/sh", "-c", plant]}
    with local_server(command_grace=0, spare_containers=0) as server:
        api = server.api_base
        box = Box(server, http, body)
        source = box.id
        texts(box.command("touch /tmp/stop; sleep 0.3; rm -f ~/f; echo FROM-SNAPSHOT > ~/f"))
        snap = http.post(f"{api}/sandboxes/{source}/snapshots", json={}, timeout=30).json()["id"]
        url = f"{api}/snapshots/{snap}"
        assert wait_for(lambda: http.get(url, timeout=10).json()["status"]["state"] == "Ready", 30)
        for _ in range(3):
            restored = http.post(f"{api}/sandboxes", json={"snapshotId": snap}, timeout=60)
            assert restored.status_code == 202, restored.text
            assert victim.read_text() == "original\n", "a restore wrote through a planted link"
        assert oct(victim.stat().st_mode & 0o777) == "0o600" and victim.stat().st_uid == 0
