"""The execd template (`host/execd_template.py`, `execd/template.py`): a root server forks each
default sandbox's execd into the namespaces bwrap made, with what bwrap gives the process it
starts.

Every figure is read from the host's /proc, by host pid: the placeholder (bwrap's child, PID 2
of the sandbox) is the reference for what bwrap gives.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import requests

from osb_sync.local import LocalServer
from osb_sync.local.host import bwrap, execd_template
from tests.local.support import (
    CREATE_BODY,
    Box,
    alive,
    local_server,
    require_isolation,
    sandbox_of,
    texts,
    wait_for,
)

CONFINEMENT = (
    "Uid",
    "Gid",
    "Groups",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
)
NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")


def require_template() -> None:
    """Skip where default sandboxes do not get their execd from the template (not root, an
    old kernel); fail where they cannot be isolated under OSB_REQUIRE_ISOLATION=1."""
    require_isolation()
    if not execd_template.usable(bwrap.probe(), None):
        pytest.skip("the execd template needs a root server on Linux 5.8 or later")


@pytest.fixture
def server() -> Iterator[LocalServer]:
    """An isolating root server, whose default sandboxes get their execd from the template."""
    require_template()
    with local_server(command_grace=0, spare_containers=0, isolation=True) as srv:
        yield srv


def status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as lines:
        return dict(line.rstrip("\n").split(":\t", 1) for line in lines if ":\t" in line)


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as raw:
        return raw.read().replace(b"\0", b" ").decode(errors="replace")


def fd_targets(pid: int) -> dict[int, str]:
    found = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
    return found


def processes(server: LocalServer, box: Box) -> dict[str, int]:
    """The host pids of the box's init, placeholder and execd, and of the template."""
    sandbox = sandbox_of(server, box.id)
    assert sandbox is not None
    init = sandbox.container.init_pid
    assert init is not None
    found = {"init": init}
    for pid in sandbox.container.members():
        if cmdline(pid).startswith(" ".join(execd_template.PLACEHOLDER[:2])):
            found["placeholder"] = pid
        elif execd_template.BOOTSTRAP in cmdline(pid) and pid != init:
            found["execd"] = pid
    found["template"] = int(status(found["execd"])["PPid"])
    return found


def test_a_default_sandbox_s_execd_is_forked_from_the_template_confined_as_bwrap_confines(
    server: LocalServer, http: requests.Session
) -> None:
    box = Box(server, http, CREATE_BODY)
    pids = processes(server, box)
    execd, placeholder, template = pids["execd"], pids["placeholder"], pids["template"]
    assert execd_template.BOOTSTRAP in cmdline(template)
    assert os.readlink(f"/proc/{template}/ns/pid") == os.readlink("/proc/self/ns/pid")
    for name in NAMESPACES:
        assert os.readlink(f"/proc/{execd}/ns/{name}") == os.readlink(
            f"/proc/{pids['init']}/ns/{name}"
        ), name
    mine, reference = status(execd), status(placeholder)
    assert {k: mine[k] for k in CONFINEMENT} == {k: reference[k] for k in CONFINEMENT}
    assert reference["Seccomp"] == "2" and reference["NoNewPrivs"] == "1"
    assert int(mine["CapBnd"], 16) == execd_template.capability_mask()
    assert os.getsid(execd) == execd  # a session of its own, as bwrap's --new-session
    with open(f"/proc/{execd}/environ", "rb") as environ:
        assert sorted(environ.read().split(b"\0")[:-1]) == [
            f"HOME={bwrap.SANDBOX_HOME}".encode(),
            f"PATH={bwrap.SANDBOX_PATH}".encode(),
        ]
    assert os.readlink(f"/proc/{execd}/cwd") == bwrap.SANDBOX_HOME
    # It answers, and what it starts runs in the sandbox, as root there.
    assert texts(box.command("id -u; grep CapEff /proc/self/status")) == [
        "0",
        f"CapEff:\t{mine['CapEff']}",
    ]


def test_nothing_of_the_template_or_of_another_sandbox_crosses_into_an_execd(
    server: LocalServer, http: requests.Session
) -> None:
    boxes = [Box(server, http, CREATE_BODY) for _ in range(3)]
    seen = [processes(server, box) for box in boxes]
    template = seen[0]["template"]
    assert {pids["template"] for pids in seen} == {template}
    # The template holds its control socket and every sandbox's exit pipe; a placeholder
    # its exit pipe; none of them may be open in an execd.
    foreign = {t for t in fd_targets(template).values() if t.startswith(("pipe:", "socket:"))}
    for index, pids in enumerate(seen):
        targets = fd_targets(pids["execd"])
        assert {0, 1, 2, 3, 4} <= set(targets)
        assert targets[1] == "/dev/null"
        others = set()
        for other in seen[:index] + seen[index + 1 :]:
            others |= set(fd_targets(other["execd"]).values())
            others |= set(fd_targets(other["placeholder"]).values())
        shared = set(targets.values()) & (foreign | others)
        assert not {t for t in shared if t.startswith(("pipe:", "socket:"))}, shared
    assert [texts(box.code("print(6 * 7)")) for box in boxes] == [["42\n"]] * 3


def test_the_execd_s_exit_status_is_the_container_s(
    server: LocalServer, http: requests.Session
) -> None:
    box = Box(server, http, {**CREATE_BODY, "entrypoint": ["/bin/sh", "-c", "sleep 0.5; exit 7"]})
    sandbox = sandbox_of(server, box.id)
    assert sandbox is not None
    assert wait_for(lambda: sandbox.container.exit_code() is not None, timeout=30)
    assert sandbox.container.exit_code() == 7


def test_a_killed_template_is_started_again_and_its_sandboxes_keep_running(
    server: LocalServer, http: requests.Session
) -> None:
    first = Box(server, http, CREATE_BODY)
    old = processes(server, first)["template"]
    os.kill(old, signal.SIGKILL)
    assert wait_for(lambda: not alive(old), timeout=10)
    assert texts(first.command("echo still")) == ["still"]
    second = Box(server, http, CREATE_BODY)
    assert processes(server, second)["template"] != old
    assert texts(second.command("echo new")) == ["new"]


def test_the_template_ends_with_the_server_s_last_container(http: requests.Session) -> None:
    require_template()
    with local_server(command_grace=0, spare_containers=0, isolation=True) as srv:
        box = Box(srv, http, CREATE_BODY)
        template = processes(srv, box)["template"]
        assert http.delete(f"{srv.api_base}/sandboxes/{box.id}").status_code == 204
        assert wait_for(lambda: not os.path.exists(f"/proc/{template}"), timeout=10)
        # ... and a new create starts it again
        again = Box(srv, http, CREATE_BODY)
        assert texts(again.command("echo again")) == ["again"]


def test_the_kernel_release_decides_whether_setns_takes_a_pidfd() -> None:
    assert execd_template.kernel_joins_by_pidfd("5.8.0")
    assert execd_template.kernel_joins_by_pidfd("6.18.44-fc-v1147")
    assert not execd_template.kernel_joins_by_pidfd("5.7.19")
    assert not execd_template.kernel_joins_by_pidfd("4.19.0-26-amd64")
    assert not execd_template.kernel_joins_by_pidfd("not-a-release")


def test_an_execd_that_exits_after_its_template_died_makes_the_sandbox_failed(
    server: LocalServer, http: requests.Session
) -> None:
    box = Box(server, http, CREATE_BODY)
    pids = processes(server, box)
    os.kill(pids["template"], signal.SIGKILL)
    assert wait_for(lambda: not alive(pids["template"]), timeout=10)
    os.kill(pids["execd"], signal.SIGKILL)  # nobody is left to tell its placeholder
    url = f"{server.api_base}/sandboxes/{box.id}"
    assert wait_for(lambda: http.get(url).json()["status"]["state"] == "Failed", timeout=30)
    message = http.get(url).json()["status"]["message"]
    assert "execd" in message and "template" in message, message
