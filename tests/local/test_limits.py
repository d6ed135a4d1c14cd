"""resourceLimits: quantities, the cgroups that enforce them, and the status message that says so.

The enforcement tests need bubblewrap and writable cgroup v1 controllers (root): they skip
where either is missing, and fail instead under OSB_REQUIRE_ISOLATION=1.
"""

from __future__ import annotations

import errno
import json
import os
import resource
from decimal import Decimal
from typing import Any

import pytest
import requests

from osb_sync._cli import main as cli_main
from osb_sync.local import LocalServer
from osb_sync.local.host import cgroup, cgroup2, identity, limits
from osb_sync.local.host.errors import LimitError
from tests.local.support import (
    CREATE_BODY,
    REQUIRE_ISOLATION,
    Box,
    local_server,
    registry_of,
    require_isolation,
    sandbox_of,
    texts,
    wait_for,
)

LIMITED = {"memory": "128Mi", "cpu": "0.5", "pids": "64"}
ALLOCATE_256M = 'python3 -c \'b = b"x" * (256 << 20); print("allocated", len(b))\''
FORK_LOOP = """python3 - <<'EOF'
import os, time
children = []
try:
    while len(children) < 1000:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
except OSError as exc:
    print("stopped after", len(children), exc.errno)
for pid in children:
    os.kill(pid, 9)
EOF"""
BUSY_5S = """python3 - <<'EOF'
import time
start_wall, start_cpu = time.monotonic(), time.process_time()
while time.monotonic() - start_wall < 5:
    pass
print("fraction", (time.process_time() - start_cpu) / (time.monotonic() - start_wall))
EOF"""


@pytest.fixture
def limited_server(isolated_server: LocalServer) -> LocalServer:
    """An isolated server whose memory, cpu and pids controllers are writable (else skip)."""
    missing = set(limits.CONTROLLERS) - limits.writable_controllers()
    if missing:
        if REQUIRE_ISOLATION:
            pytest.fail(
                f"OSB_REQUIRE_ISOLATION=1 but cgroup controllers {missing} are not writable"
            )
        pytest.skip(f"cgroup controllers {sorted(missing)} are not writable here")
    return isolated_server


def limited_box(server: LocalServer, http: requests.Session, **resource: str) -> Box:
    return Box(server, http, {**CREATE_BODY, "resourceLimits": resource or LIMITED})


def output(events: list[dict[str, Any]]) -> str:
    return "".join(texts(events)) + "".join(texts(events, "stderr"))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("128Mi", 128 << 20),
        ("1Gi", 1 << 30),
        ("512M", 512 * 10**6),
        ("500m", Decimal("0.5")),
        ("0.5", Decimal("0.5")),
        ("2", 2),
        ("1.5Gi", 3 << 29),
    ],
)
def test_quantities_parse_like_kubernetes(text: str, value: Decimal) -> None:
    assert limits.quantity("x", text) == value


@pytest.mark.parametrize(
    ("resource", "says"),
    [
        ({"memory": "12Qi"}, "not a quantity"),
        ({"memory": "lots"}, "not a quantity"),
        ({"memory": "1k"}, "at least 32Mi"),
        ({"memory": "500m"}, "whole number of bytes"),
        ({"cpu": "1m"}, "between 10m"),
        ({"cpu": "2048"}, "between 10m"),
        ({"cpu": "-1"}, "not a quantity"),
        ({"pids": "2.5"}, "whole number"),
        ({"pids": "4"}, "from 16"),
        ({"pids": "1G"}, "from 16"),
        ({"ephemeral-storage": "lots"}, "not a quantity"),
        ({"ephemeral-storage": "1Mi"}, "at least 4Mi"),
        ({"ephemeral-storage": "16.5"}, "whole number of bytes"),
        ({"ephemeral-storage": "16Ei"}, "below 8Ei"),
        ({"inodes": "10"}, "from 512"),
        ({"inodes": "700.5"}, "from 512"),
        ({"inodes": "8Gi"}, "from 512"),
    ],
)
def test_bad_limits_answer_400_naming_the_value(
    local: LocalServer, http: requests.Session, resource: dict[str, str], says: str
) -> None:
    answer = http.post(
        f"{local.api_base}/sandboxes", json={**CREATE_BODY, "resourceLimits": resource}
    )
    assert answer.status_code == 400, answer.text
    assert says in answer.json()["message"]
    assert next(iter(resource)) in answer.json()["message"]


@pytest.mark.parametrize(
    ("resource", "says"),
    [
        ({"gpu\n2026-12-06 CRITICAL local server: FORGED": "1"}, "is not a resource name"),
        ({"x" * 64: "1"}, "is not a resource name"),
        ({"nvidia.com/gpu": "1\nFORGED"}, "not a quantity"),
        ({"nvidia.com/gpu": "1" * 65}, "not a quantity"),
    ],
)
def test_a_limit_the_server_does_not_know_is_still_a_resource_name_and_a_quantity(
    resource: dict[str, str], says: str
) -> None:
    # Named in the status, a refusal and the server's log: no forged line, no flood.
    with pytest.raises(LimitError, match=says) as refused:
        limits.parse(resource)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 300
    assert limits.parse({"nvidia.com/gpu": " 1 "}).texts["nvidia.com/gpu"] == "1"


def test_plan_never_claims_a_limit_without_its_controller() -> None:
    requested = limits.parse({"memory": "128Mi", "cpu": "500m", "gpu": "1"})
    bare = limits.plan(requested, frozenset())
    assert bare.message() == (
        " Limits enforced: none;"
        " not enforced: memory=128Mi (no writable memory cgroup: only RLIMIT_AS, per process,"
        " not the sandbox's total), cpu=500m (no writable cpu cgroup), pids=512 (no writable"
        " pids cgroup; RLIMIT_NPROC here counts a whole host user's processes, not a"
        " sandbox's), ephemeral-storage=1Gi (no per-sandbox filesystem here), inodes=100000"
        " (likewise), gpu=1 (not supported locally)."
    )
    assert bare.dropped == ["memory", "cpu", "gpu"]  # asked for; the rest are defaults
    assert bare.address_space == 128 << 20 and bare.processes is None
    one = limits.plan(requested, frozenset(), ids="one")
    assert "pids=512 (RLIMIT_NPROC in the sandbox's user namespace)" in one.enforced
    assert one.processes == 512 and "pids" not in one.dropped
    ranged = limits.plan(limits.parse({"pids": "64"}), frozenset(), ids="range")
    assert ranged.processes == 64  # set, but a sandbox that switches ids gets 64 per id
    assert ranged.unenforced[0].startswith("pids=64 (no writable pids cgroup; RLIMIT_NPROC holds")
    assert "per id inside only" in ranged.unenforced[0] and ranged.dropped == ["pids"]
    reserve = [identity.sandboxes_nproc(n) for n in (300, 96367, 10, resource.RLIM_INFINITY)]
    assert reserve == [236, 86731, 1, None]  # the user keeps a tenth, at least 64
    counted = [limits.nproc_per_namespace(r) for r in ("5.13.19", "5.14.0-1", "6.18.44-x", "?")]
    assert counted == [False, True, True, False]  # ucounts: per user namespace since 5.14
    full = limits.plan(requested, frozenset(limits.CONTROLLERS), "tmpfs")
    assert full.message().startswith(
        " Limits enforced: memory=128Mi (cgroup), cpu=500m (cgroup), pids=512 (cgroup),"
        " ephemeral-storage=1Gi (tmpfs for all it writes, in memory: charged to the writer's"
        " memory cgroup), inodes=100000 (tmpfs); not enforced: gpu=1"
    )
    assert full.disk == (1 << 30, 100_000)
    small = limits.parse({"ephemeral-storage": "64Mi"})
    unprivileged = limits.plan(small, frozenset(), "per-directory")
    assert unprivileged.disk == (64 << 20, 100_000)
    assert unprivileged.enforced[-2:] == [
        "ephemeral-storage=64Mi (tmpfs, in memory, split between the writable directories:"
        " /tmp and the home 40% each, the rest the other 20%)",
        "inodes=100000 (split likewise)",
    ]
    assert unprivileged.dropped == []
    assert limits.plan(limits.parse({"inodes": "5000"}), frozenset(), "none").dropped == ["inodes"]
    assert full.cgroup["cpu"]["cpu.cfs_quota_us"] == "50000"


def test_status_message_says_which_limits_are_enforced(
    limited_server: LocalServer, http: requests.Session
) -> None:
    box = limited_box(limited_server, http)
    assert box.created["status"]["message"].endswith(
        " Limits enforced: memory=128Mi (cgroup), cpu=0.5 (cgroup), pids=64 (cgroup),"
        " ephemeral-storage=1Gi (tmpfs for all it writes, in memory: charged to the writer's"
        " memory cgroup), inodes=100000 (tmpfs); not enforced: none."
    )
    got = http.get(f"{limited_server.api_base}/sandboxes/{box.id}").json()
    assert got["status"]["message"] == box.created["status"]["message"]


def test_memory_limit_stops_a_256mib_allocation(
    limited_server: LocalServer, http: requests.Session
) -> None:
    box = limited_box(limited_server, http)
    small = box.command('python3 -c \'b = b"x" * (32 << 20); print("allocated", len(b))\'')
    assert "allocated 33554432" in output(small)
    events = box.command(ALLOCATE_256M)
    assert "allocated" not in output(events)
    errors = [e for e in events if e["type"] == "error"]
    assert errors and ("killed" in str(errors[0]["error"]) or "MemoryError" in output(events)), (
        events
    )
    in_code = box.code("b = b'x' * (256 << 20)\nprint('allocated')")
    assert "allocated" not in output(in_code)
    assert [e for e in in_code if e["type"] == "error"], in_code
    assert "".join(texts(box.code("print(6 * 7)"))) == "42\n"  # the sandbox's execd survived


def test_fork_loop_stops_at_the_pids_cap(
    limited_server: LocalServer, http: requests.Session
) -> None:
    box = limited_box(limited_server, http)
    said = output(box.command(FORK_LOOP))
    assert "stopped after" in said, said
    forked = int(said.split("stopped after")[1].split()[0])
    assert 0 < forked < 64, said  # execd and the shell count too
    assert "allocated" not in said


def test_cpu_limit_holds_a_busy_loop_near_half_a_core(
    limited_server: LocalServer, http: requests.Session
) -> None:
    box = limited_box(limited_server, http)
    said = output(box.command(BUSY_5S, timeout=60000))
    fraction = float(said.split("fraction")[1].split()[0])
    print(f"CPU fraction under cpu=0.5 over 5 s: {fraction:.3f}")
    assert 0 < fraction < 0.75, said


def test_every_cgroup_is_gone_after_delete(
    limited_server: LocalServer, http: requests.Session
) -> None:
    box = limited_box(limited_server, http)
    groups = [cgroup.parent_dir(c) / box.id for c in (*limits.CONTROLLERS, "freezer")]
    assert all(group.is_dir() for group in groups)
    assert (groups[0] / "memory.limit_in_bytes").read_text().strip() == str(128 << 20)
    assert (groups[2] / "pids.max").read_text().strip() == "64"
    members = (groups[0] / "cgroup.procs").read_text().split()
    assert members and set(members) == set((groups[2] / "cgroup.procs").read_text().split())
    assert http.delete(f"{limited_server.api_base}/sandboxes/{box.id}").status_code == 204
    assert not [group for group in groups if group.exists()]


def test_without_controllers_memory_falls_back_to_rlimit_as_and_says_so(
    monkeypatch: pytest.MonkeyPatch, http: requests.Session
) -> None:

    require_isolation()
    arrange = cgroup2.arrange

    def no_limit_controllers(parent: str | None) -> tuple[cgroup.Place, frozenset[str], bool]:
        place, _, freezer = arrange(parent)
        return place, frozenset(), freezer

    monkeypatch.setattr(cgroup2, "arrange", no_limit_controllers)
    with local_server(ping_interval=0.2, command_grace=0, min_timeout=1, isolation=True) as srv:
        box = limited_box(srv, http)
        message = box.created["status"]["message"]
        assert (
            "memory=128Mi (no writable memory cgroup: only RLIMIT_AS, per process"
            in (message.split("not enforced: ")[1])
        )
        assert "cpu=0.5 (no writable cpu cgroup)" in message
        assert "pids=64 (no writable pids cgroup; RLIMIT_NPROC holds per id inside" in message
        every = "grep -h 'Max processes' /proc/[0-9]*/limits | awk '{print $3, $4}' | sort -u"
        assert output(box.command(every)).strip() == "64 64"  # its init's too, set by execd
        assert "(cgroup)" not in message
        assert not (cgroup.parent_dir("memory") / box.id).exists()
        events = box.command(ALLOCATE_256M)
        assert "MemoryError" in output(events), events


def test_leftover_groups_of_a_killed_server_are_swept(limited_server: LocalServer) -> None:
    stale = [cgroup.parent_dir(c) / "stale-osb-test" for c in limits.CONTROLLERS]
    fresh = cgroup.parent_dir("pids") / "fresh-osb-test"
    try:
        for group in (*stale, fresh):
            group.mkdir()
        for group in stale:
            os.utime(group, (1, 1))  # older than STALE_AFTER
        assert limits.writable_controllers() == frozenset(limits.CONTROLLERS)
        assert [group for group in stale if group.exists()] == []
        assert fresh.is_dir()  # may be a group another server is about to join
    finally:
        for group in (*stale, fresh):
            if group.exists():
                group.rmdir()


def ready_spare(server: LocalServer) -> Any:
    spares = registry_of(server).spares
    assert wait_for(lambda: spares.ready(), 60), "no spare became ready"
    return spares.ready()[0]


def container_of(server: LocalServer, box: Box) -> Any:
    sandbox = sandbox_of(server, box.id)
    assert sandbox is not None
    return sandbox.container


def test_a_claimed_spare_gets_its_limits_written_at_claim(
    limited_server: LocalServer, http: requests.Session
) -> None:
    spare = ready_spare(limited_server)
    memory = cgroup.parent_dir("memory") / spare.home.name
    assert memory.is_dir() and int((memory / "memory.limit_in_bytes").read_text()) > 1 << 40
    box = limited_box(limited_server, http)
    assert container_of(limited_server, box) is spare and box.id == spare.home.name
    assert (memory / "memory.limit_in_bytes").read_text().strip() == str(128 << 20)
    pids = cgroup.parent_dir("pids") / box.id
    assert (pids / "pids.max").read_text().strip() == "64"
    assert "allocated" not in output(box.command(ALLOCATE_256M))


def test_a_spare_that_refuses_its_limits_makes_way_for_a_cold_start(
    limited_server: LocalServer, http: requests.Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    spare = ready_spare(limited_server)
    configure = cgroup.Cgroup.configure

    def busy_on_a_live_group(self: cgroup.Cgroup, settings: dict[str, dict[str, str]]) -> None:
        procs = (next(iter(self.dirs.values())) / "cgroup.procs").read_text().split()
        if procs:  # what the kernel answers a memory limit below the group's usage
            raise OSError(errno.EBUSY, "Device or resource busy")
        configure(self, settings)

    monkeypatch.setattr(cgroup.Cgroup, "configure", busy_on_a_live_group)
    box = limited_box(limited_server, http)
    container = container_of(limited_server, box)
    assert container is not spare and not spare.alive() and not spare.home.exists()
    memory = cgroup.parent_dir("memory") / box.id
    assert (memory / "memory.limit_in_bytes").read_text().strip() == str(128 << 20)
    assert "".join(texts(box.code("print(6 * 7)"))) == "42\n"


def test_stats_shows_the_sandboxs_limits_and_its_usage_against_them(
    limited_server: LocalServer, http: requests.Session, capsys: pytest.CaptureFixture[str]
) -> None:
    box = limited_box(limited_server, http, memory="256Mi", cpu="500m", pids="64")
    box.code("held = b'x' * (64 << 20)")  # the code context's worker keeps it
    answer = http.get(f"{limited_server.api_base}/sandboxes/{box.id}/stats").json()
    assert answer["resourceLimits"] == {"memory": "256Mi", "cpu": "500m", "pids": "64"}
    assert (answer["source"], answer["memoryLimitBytes"]) == ("cgroup", 256 << 20)
    assert (answer["cpuLimit"], answer["pidsLimit"]) == (0.5, 64)
    assert 64 << 20 <= answer["memoryUsedBytes"] < 256 << 20, answer
    assert 0 < answer["pids"] <= 64 and answer["cpuSeconds"] > 0, answer
    missing = http.get(f"{limited_server.api_base}/sandboxes/no-such/stats")
    assert (missing.status_code, missing.json()["code"]) == (404, "DOCKER::SANDBOX_NOT_FOUND")

    assert cli_main(["--api-base", limited_server.api_base, "--json", "stats", box.id]) == 0
    shape = json.loads(capsys.readouterr().out)[0]
    assert shape["limits"] == {"cpu": 0.5, "memory_mib": 256, "given": answer["resourceLimits"]}
    assert shape["sandbox"]["mem_limit_mib"] == 256 and shape["host"] is None
    assert 64 <= shape["sandbox"]["mem_used_mib"] < 256
    assert cli_main(["--api-base", limited_server.api_base, "stats", box.id]) == 0
    header, row = capsys.readouterr().out.splitlines()
    cells = dict(zip(header.lower().split(), row.split(), strict=True))
    assert (cells["cpus"], cells["mem_limit"], cells["of"]) == ("0.5", "256.0MiB", "sandbox")
    assert 25 <= float(cells["mem%"]) < 100 and cells["pids"].endswith("/64"), row
