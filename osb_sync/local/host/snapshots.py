"""Snapshots of the local server: a sandbox's writable directories, copied, restorable by id.

A sandbox of the host's view has no image layer of its own: its root is the host's, read-only
(`bwrap.py`). What it changed lives in its writable directories, its home and its `/tmp`:
a snapshot is a copy of both (`cp -a`: modes, owners, links and times kept), taken with the
sandbox frozen so the copy is of one moment (as `docker commit` pauses a container), plus the
create fields a restore starts from (its image URI as asked, entrypoint and resource limits).
A create with `snapshotId` gets a new container whose directories are filled from the copy
before the create answers. (A sandbox of an image writes in its own writable layer instead,
which a snapshot does not copy.)

States follow the released server: `Creating` (the copy runs in the background), `Ready`,
`Failed`; a snapshot still `Creating` cannot be deleted (409). The store (`SnapshotStore`) and
the routes (`Snapshots`, which hold the sandboxes' table) are here; the registry restores one
into a create (`registry.py`).
"""

from __future__ import annotations

import logging
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..http.bodies import rfc3339
from ..http.exchange import Exchange, HttpError, error
from .sandboxes import Sandboxes, paginated
from .validation import query_int, read_json, unprocessable_body

logger = logging.getLogger("osb_sync.local")

SNAPSHOTS_DIR = ".snapshots"  # under the server's root, beside the sandboxes
COPY_TIMEOUT = 600.0
# The create fields a restore starts from (the request's own fields win).
RESTORED_FIELDS = ("image", "entrypoint", "resourceLimits", "env")


def snapshot_not_found(snapshot_id: str) -> HttpError:
    """The released server's 404 for an unknown snapshot."""
    return error(404, "SNAPSHOT::NOT_FOUND", f"Snapshot {snapshot_id} not found.")


@dataclass
class Snapshot:
    """One snapshot: its API data and the directory holding its copy."""

    id: str
    sandbox_id: str
    name: str | None
    source: dict[str, Any]
    files: Path
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    state: str = "Creating"
    message: str = "The sandbox's writable directories are being copied."
    transition_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    def view(self) -> dict[str, Any]:
        """The released server's `Snapshot` object."""
        data: dict[str, Any] = {
            "id": self.id,
            "sandboxId": self.sandbox_id,
            "status": {
                "state": self.state,
                "reason": f"SNAPSHOT_{self.state.upper()}",
                "message": self.message,
                "lastTransitionAt": rfc3339(self.transition_at),
            },
            "createdAt": rfc3339(self.created_at),
        }
        if self.name is not None:
            data["name"] = self.name
        return data


def copy_tree(source: Path, target: Path) -> None:
    """Copy the contents of `source` into `target` with `cp -a` (modes, owners, links, times).

    Raises:
        OSError: the copy failed (its message is cp's).
    """
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["cp", "-a", "--", f"{source}/.", str(target)],
        capture_output=True,
        timeout=COPY_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise OSError(done.stderr.decode(errors="replace").strip() or f"cp exit {done.returncode}")


class SnapshotStore:
    """Every snapshot of one server (one lock); their copies under `root/.snapshots`."""

    def __init__(self, root: Path) -> None:
        self.root = root / SNAPSHOTS_DIR
        self._lock = threading.Lock()
        self._snapshots: dict[str, Snapshot] = {}

    def take(
        self,
        sandbox_id: str,
        name: str | None,
        source: dict[str, Any],
        dirs: dict[str, Path],
        frozen: Callable[[Callable[[], None]], None],
        hold: ExitStack | None = None,
    ) -> Snapshot:
        """Start a snapshot of `dirs` (name -> the sandbox's host directory); returns it
        `Creating`. The copy runs in a thread, inside `frozen` (which pauses the sandbox
        around the call it is given)."""
        snapshot_id = f"snap-{secrets.token_hex(8)}"
        snapshot = Snapshot(
            id=snapshot_id,
            sandbox_id=sandbox_id,
            name=name,
            source={k: source[k] for k in RESTORED_FIELDS if source.get(k) is not None},
            files=self.root / snapshot_id,
        )
        with self._lock:
            self._snapshots[snapshot_id] = snapshot

        def copy() -> None:
            for label, directory in dirs.items():
                copy_tree(directory, snapshot.files / label)

        def run() -> None:
            try:
                with hold or ExitStack():
                    frozen(copy)
            except Exception as exc:  # noqa: BLE001 (the snapshot says why it failed)
                logger.warning("local server: snapshot %s failed: %s", snapshot_id, exc)
                self._settle(snapshot, "Failed", f"The copy failed: {exc}")
                shutil.rmtree(snapshot.files, ignore_errors=True)
                return
            self._settle(snapshot, "Ready", "The snapshot can be restored.")

        threading.Thread(target=run, name="osb-local-snapshot", daemon=True).start()
        return snapshot

    def _settle(self, snapshot: Snapshot, state: str, message: str) -> None:
        with self._lock:
            snapshot.state, snapshot.message = state, message
            snapshot.transition_at = datetime.now(timezone.utc)

    def get(self, snapshot_id: str) -> Snapshot:
        """The snapshot `snapshot_id`; 404 when there is none."""
        with self._lock:
            snapshot = self._snapshots.get(snapshot_id)
        if snapshot is None:
            raise snapshot_not_found(snapshot_id)
        return snapshot

    def matching(
        self, sandbox_id: str | None, name: str | None, states: set[str]
    ) -> list[dict[str, Any]]:
        """The views of the snapshots the filters keep, newest first."""
        with self._lock:
            chosen = [
                s
                for s in self._snapshots.values()
                if (sandbox_id is None or s.sandbox_id == sandbox_id)
                and (name is None or s.name == name)
                and (not states or s.state.lower() in states)
            ]
            chosen.sort(key=lambda s: s.created_at, reverse=True)
            return [s.view() for s in chosen]

    def delete(self, snapshot_id: str) -> None:
        """Forget a snapshot and remove its copy; 404 if unknown, 409 while it is Creating."""
        with self._lock:
            snapshot = self._snapshots.get(snapshot_id)
            if snapshot is None:
                raise snapshot_not_found(snapshot_id)
            if snapshot.state == "Creating":
                raise error(
                    409,
                    "SNAPSHOT::INVALID_STATE",
                    f"Snapshot {snapshot_id} is still being created; delete it once it is Ready.",
                )
            del self._snapshots[snapshot_id]
        shutil.rmtree(snapshot.files, ignore_errors=True)

    def ready(self, snapshot_id: str) -> Snapshot:
        """The snapshot a create restores; 404 if unknown, 409 unless it is Ready."""
        snapshot = self.get(snapshot_id)
        if snapshot.state != "Ready":
            raise error(
                409,
                "SNAPSHOT::NOT_READY",
                f"Snapshot {snapshot_id} is {snapshot.state}: a sandbox is created from a Ready "
                "snapshot only.",
            )
        return snapshot

    def restore(self, snapshot: Snapshot, dirs: dict[str, Path]) -> None:
        """Fill a new sandbox's directories from the copy.

        Raises:
            OSError: the copy failed.
        """
        for label, directory in dirs.items():
            if (snapshot.files / label).is_dir():
                copy_tree(snapshot.files / label, directory)

    def close(self) -> None:
        """Remove every copy (server stop)."""
        shutil.rmtree(self.root, ignore_errors=True)


class Snapshots:
    """The handlers of the snapshot routes: a store of their own, the sandboxes they copy."""

    def __init__(self, sandboxes: Sandboxes, root: Path) -> None:
        self.sandboxes = sandboxes
        self.store = SnapshotStore(root)

    def create(self, ex: Exchange) -> None:
        """POST /sandboxes/{id}/snapshots: copy its writable directories (frozen); 202."""
        body = read_json(ex) if ex.declared_length or ex.headers.get("Transfer-Encoding") else None
        name = body.get("name") if isinstance(body, dict) else None
        if body is not None and not isinstance(body, dict):
            raise unprocessable_body("a CreateSnapshotRequest object or nothing", body)
        if name is not None and (not isinstance(name, str) or not name):
            raise unprocessable_body("name: a non-empty string", name)
        sandbox = self.sandboxes.get(ex.params["id"])
        if sandbox.state != "Running":
            raise error(
                409,
                "DOCKER::SANDBOX_NOT_RUNNING",
                f"Sandbox {sandbox.id} is {sandbox.state}: only a Running sandbox is snapshotted.",
            )
        lock = self.sandboxes.lock

        def frozen(copy: Callable[[], None]) -> None:
            # one moment, as docker commit pauses the container (unless it is paused already)
            with lock:
                freeze = sandbox.state == "Running" and not sandbox.removing
                if freeze:
                    sandbox.container.pause()
            try:
                copy()
            finally:
                # thawed unless paused by its owner meanwhile (then it stays paused)
                with lock, suppress(OSError):
                    if freeze and sandbox.state == "Running" and not sandbox.removing:
                        sandbox.container.resume()

        hold = ExitStack()
        try:
            dirs = sandbox.container.snapshot_dirs(hold)
            snapshot = self.store.take(sandbox.id, name, sandbox.body, dirs, frozen, hold)
        except BaseException:
            hold.close()
            raise
        self.sandboxes.journal.record(sandbox.id, f"snapshot {snapshot.id} started")
        ex.send_json(202, snapshot.view(), {"Location": f"/v1/snapshots/{snapshot.id}"})

    def list(self, ex: Exchange) -> None:
        """GET /snapshots: `sandboxId`, `name` and `state` filters, pagination, newest first."""
        states = {s.lower() for s in ex.query.get("state", []) if s}
        chosen = self.store.matching(ex.arg("sandboxId"), ex.arg("name"), states)
        page = query_int(ex.arg("page"), "page", 1, 1, None)
        size = query_int(ex.arg("pageSize"), "pageSize", 20, 1, 200)
        ex.send_json(
            200, paginated(chosen[(page - 1) * size : page * size], len(chosen), page, size)
        )

    def show(self, ex: Exchange) -> None:
        """GET /snapshots/{id}."""
        ex.send_json(200, self.store.get(ex.params["id"]).view())

    def delete(self, ex: Exchange) -> None:
        """DELETE /snapshots/{id}: 204; 409 while it is still Creating."""
        self.store.delete(ex.params["id"])
        ex.send(204)
