"""The local server's released-API helpers, without sandboxes: network policy merging and
status, the snapshot store's states, pool capacity checks, the refused create fields."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from osb_sync.local.host import network
from osb_sync.local.host.limits import Plan
from osb_sync.local.host.pools import PoolStore, check_capacity
from osb_sync.local.host.registry import CreatePlan, check_local_fields
from osb_sync.local.host.snapshots import SnapshotStore
from osb_sync.local.http.exchange import HttpError


def test_patch_merges_by_target_and_the_first_of_two_wins() -> None:
    policy = {"defaultAction": "deny", "egress": [{"action": "deny", "target": "a.test"}]}
    merged = network.patched(
        policy,
        [
            {"action": "allow", "target": "a.test"},
            {"action": "deny", "target": "a.test"},
            {"action": "deny", "target": "b.test"},
        ],
    )
    assert merged["egress"] == [
        {"action": "allow", "target": "a.test"},
        {"action": "deny", "target": "b.test"},
    ]
    assert network.needs(merged) == "rules"  # an exception to deny-all: enforced by name
    assert network.without(merged, ["a.test"])["egress"] == [{"action": "deny", "target": "b.test"}]
    assert network.needs(network.without(merged, ["a.test"])) == "deny-all"


def test_status_modes() -> None:
    assert network.status({})["mode"] == "allow_all"  # no policy: allow-all, as the spec says
    assert network.status({"defaultAction": "deny"})["policy"] == {
        "defaultAction": "deny", "egress": [],
    }  # fmt: skip
    rules = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "x"}]}
    assert network.status(rules)["mode"] == "deny_all_with_rules"


def test_a_snapshot_cannot_be_deleted_while_it_is_made(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (home / "f.txt").write_text("x")
    release = threading.Event()

    def frozen(copy):  # type: ignore[no-untyped-def]
        release.wait(10)
        copy()

    snapshot = store.take("sbx", "n", {"image": {"uri": "i"}, "token": "t"}, {"home": home}, frozen)
    assert snapshot.source == {"image": {"uri": "i"}}  # only the restored fields are kept
    with pytest.raises(HttpError) as busy:
        store.delete(snapshot.id)
    assert busy.value.status == 409
    with pytest.raises(HttpError) as not_ready:
        store.ready(snapshot.id)
    assert not_ready.value.status == 409
    release.set()
    for _ in range(500):
        if store.get(snapshot.id).state != "Creating":
            break
        threading.Event().wait(0.01)
    assert store.ready(snapshot.id).state == "Ready"
    target = tmp_path / "restored"
    store.restore(snapshot, {"home": target})
    assert (target / "f.txt").read_text() == "x"
    store.delete(snapshot.id)
    with pytest.raises(HttpError) as gone:
        store.get(snapshot.id)
    assert gone.value.status == 404


@pytest.mark.parametrize(
    ("spec", "status"),
    [
        ({"bufferMax": 1, "bufferMin": 2, "poolMax": 3, "poolMin": 0}, 400),
        ({"bufferMax": 1, "bufferMin": 0, "poolMax": 3}, 422),
        ({"bufferMax": -1, "bufferMin": 0, "poolMax": 3, "poolMin": 0}, 422),
        ([], 422),
    ],
)
def test_pool_capacity_is_checked(spec: object, status: int) -> None:
    with pytest.raises(HttpError) as info:
        check_capacity(spec)
    assert info.value.status == status


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("secureAccess", True),
        ("credentialProxy", {"enabled": True}),
        ("lifecycle", {"preStart": {"command": ["x"]}}),
        ("templateId", "tpl"),
        ("platform", {"os": "linux", "arch": "riscv64"}),
    ],
)
def test_create_fields_the_local_server_cannot_honour(field: str, value: object) -> None:
    with pytest.raises(HttpError) as info:
        check_local_fields({field: value})
    assert info.value.status == 400 and field in info.value.body["message"]
    check_local_fields({"secureAccess": False, "credentialProxy": {"enabled": False}})


def test_a_pool_counts_the_sandboxes_creates_reserved_against_its_pool_max() -> None:
    class Spares:  # a SparePool's part the store uses, without containers
        count = 0

        def fill(self) -> None:
            pass

        def ready(self) -> list[object]:
            return []

        def close(self) -> None:
            pass

    store = PoolStore(lambda count: Spares())  # type: ignore[arg-type,return-value]
    capacity = {"bufferMax": 1, "bufferMin": 0, "poolMax": 2, "poolMin": 0}
    store.create("p", {}, capacity)
    first, second = store.reserve("p"), store.reserve("p")  # two creates under way
    with pytest.raises(HttpError) as exhausted:
        store.reserve("p")  # a third, concurrent: poolMax counts the two reservations
    assert (exhausted.value.status, exhausted.value.body["code"]) == (409, "POOL::EXHAUSTED")
    store.cancel(second)  # its create failed: the reservation is given back
    store.allocate(first, "sbx-1")  # the other's sandbox is made
    third = store.reserve("p")
    assert store.get("p").view()["status"]["allocated"] == 1 and third.reserved == 1
    with pytest.raises(HttpError):
        store.reserve("p")
    store.release("sbx-1")  # the sandbox is gone
    store.reserve("p")


def test_a_create_plans_repr_shows_neither_its_env_nor_its_image_credentials() -> None:
    secret, password = "value-of-a-secret-variable", "registry-password-never-shown"
    body = {
        "image": {"uri": "r.test/x:1", "auth": {"username": "u", "password": password}},
        "env": {"API_KEY": secret},
    }
    plan = CreatePlan(body, Plan(), False, "", (), {"API_KEY": secret}, None, None, None, None)
    for shown in (repr(plan), str(plan), f"{plan!r}"):
        assert secret not in shown and password not in shown, shown
    assert "CreatePlan(" in repr(plan)
