"""Bring your own execd: the container runs a given execd binary (and Jupyter server).

A stand-in execd and `jupyter` (Python scripts) check the wiring without the real ones: the
flags and variables they are started with, the token the proxy passes on, a failed start, and
that delete leaves nothing. tests/sockets/conftest.py runs the client suites on the real execd.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import requests

from osb_sync._cli import main as cli_main
from osb_sync.local.host.execd_binary import ExecdBinary
from osb_sync.local.host.recovery import LOCK_NAME
from osb_sync.local.host.spares import SPARES_DIR
from tests.local.support import (
    CREATE_BODY,
    Box,
    alive,
    local_server,
    registry_of,
    require_isolation,
    sandbox_of,
    wait_for,
)

# Answers every GET with what it was started with; /ping needs EXECD_ACCESS_TOKEN's token.
FAKE_EXECD = """
import http.server, json, os, sys, urllib.request
port = int(sys.argv[sys.argv.index("--port") + 1])
if os.environ.get("FAIL"):
    print("execd stand-in fails on purpose, token", os.environ["EXECD_ACCESS_TOKEN"])
    sys.exit(3)

def jupyter_answers():
    host = os.environ.get("JUPYTER_HOST")
    if not host:
        return None
    url = host + "/api/kernelspecs?token=" + os.environ["JUPYTER_TOKEN"]
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.status

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        token = self.headers.get("X-EXECD-ACCESS-TOKEN")
        if token != os.environ["EXECD_ACCESS_TOKEN"]:
            self.send_response(401)
            self.end_headers()
            return
        if self.path == "/broken":  # a chunked answer cut off before its last chunk
            self.wfile.write(b"HTTP/1.1 200 OK\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n")
            self.wfile.write(b"5\\r\\nhello\\r\\n")
            self.close_connection = True
            return
        body = json.dumps({
            "argv": sys.argv[1:],
            "cwd": os.getcwd(),
            "jupyter": jupyter_answers(),
            "jupyter_port": os.environ.get("JUPYTER_PORT"),
            "envs_file": os.path.isfile(os.environ.get("EXECD_ENVS", "")),
            "pid": os.getpid(),
            "sandbox_env": os.environ.get("GREETING"),
        }).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

# `jupyter notebook --port=N --NotebookApp.token=T ...`: /api/kernelspecs answers with T only.
FAKE_JUPYTER = """
import http.server, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[2:] if "=" in a)
token = args["NotebookApp.token"]

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path.endswith("token=" + token) else 403)
        self.end_headers()

http.server.ThreadingHTTPServer((args["ip"], int(args["port"])), Handler).serve_forever()
"""


def script(path: Path, source: str) -> str:
    path.write_text(f"#!{sys.executable}\n{source}")
    path.chmod(0o755)
    return str(path)


def fake_venv(root: Path) -> str:
    """A venv-shaped folder whose bin/jupyter is the stand-in; its home is this interpreter."""
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\nversion = 3\n")
    return script(root / "bin" / "jupyter", FAKE_JUPYTER)


@pytest.fixture
def execd(tmp_path: Path) -> str:
    return script(tmp_path / "execd", FAKE_EXECD)


def test_paths_are_checked_and_the_venvs_interpreter_is_bound(tmp_path: Path, execd: str) -> None:
    with pytest.raises(ValueError, match="not an executable file"):
        ExecdBinary.checked(tmp_path / "missing")
    (tmp_path / "lonely").mkdir()
    lonely = script(tmp_path / "lonely" / "jupyter", "")
    with pytest.raises(ValueError, match=r"pyvenv\.cfg"):
        ExecdBinary.checked(execd, lonely)
    binary = ExecdBinary.checked(execd, fake_venv(tmp_path / "venv"))
    home_prefix = str(Path(sys.executable).parent.resolve().parent)
    assert binary.read_only_paths() == [execd, str(tmp_path / "venv"), home_prefix]
    with pytest.raises(ValueError, match=r"pass execd \(or execd_image\) too"):
        local_server(jupyter=binary.jupyter)


@pytest.mark.parametrize("spares", [1, 0])  # a claimed spare starts the binary at its claim
def test_the_binary_runs_on_44772_with_the_token_and_jupyter_behind_it(
    tmp_path: Path,
    execd: str,
    http: requests.Session,
    caplog: pytest.LogCaptureFixture,
    spares: int,
) -> None:
    require_isolation()
    jupyter = fake_venv(tmp_path / "venv")
    with local_server(
        execd=execd, jupyter=jupyter, min_timeout=1, spare_containers=spares
    ) as server:
        box = Box(server, http, {**CREATE_BODY, "env": {"GREETING": "hello"}})
        assert registry_of(server).spares.claimed == spares  # type: ignore[union-attr]
        assert f"execd: {execd}, Jupyter {jupyter}." in box.created["status"]["message"]
        seen = box.call("GET", "/ping").json()  # the proxy passed the token on
        assert seen["argv"] == ["--port", "44772"]
        assert seen["jupyter"] == 200 and seen["jupyter_port"] == "44771"
        assert seen["envs_file"] and seen["sandbox_env"] == "hello"
        assert seen["cwd"] == "/home/sandbox"
        assert http.get(box.base + "/ping").status_code == 401  # the server's own check
        with caplog.at_level(logging.ERROR, "osb_sync.local"):
            broken = http.get(box.base + "/broken", headers=box.headers, stream=True)
            assert broken.status_code == 200
            with pytest.raises(requests.exceptions.ChunkedEncodingError):
                broken.content  # noqa: B018 (the proxy cut its answer off too)
        assert caplog.records == []  # an upstream that broke off is no server error
        sandbox = sandbox_of(server, box.id)  # type: ignore[union-attr]
        assert sandbox is not None
        members = sandbox.container.members()
        assert len(members) >= 4  # init, main, jupyter, execd
        assert http.delete(f"{server.api_base}/sandboxes/{box.id}").status_code == 204
        assert wait_for(lambda: not any(alive(pid) for pid in members), 10)


def test_a_binary_that_fails_is_a_500_with_its_log_and_leaves_nothing(
    execd: str, http: requests.Session
) -> None:
    require_isolation()
    with local_server(execd=execd) as server:
        created = http.post(
            f"{server.api_base}/sandboxes", json={**CREATE_BODY, "env": {"FAIL": "1"}}
        )
        assert created.status_code == 500, created.text
        message = created.json()["message"]
        assert "execd exited with status 3" in message
        assert "execd stand-in fails on purpose, token ***" in message  # no token shown
        assert server.root_dir is not None
        assert [
            p.name for p in server.root_dir.iterdir() if p.name not in (SPARES_DIR, LOCK_NAME)
        ] == []
        listed = http.get(f"{server.api_base}/sandboxes").json()
        assert listed["items"] == []


def test_without_isolation_a_binary_is_refused(execd: str) -> None:
    with pytest.raises(RuntimeError, match="needs isolated sandboxes"):
        local_server(execd=execd, isolation=False).start()


def test_serve_names_a_bad_execd_path_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "execd"
    assert cli_main(["serve", "--port", "0", "--execd", str(missing)]) == 125
    err = capsys.readouterr().err
    assert f"execd {str(missing)!r} is not an executable file" in err
    assert err.count("\n") == 1
