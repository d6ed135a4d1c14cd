"""A server whose interpreter lives under /tmp (a venv or checkout there) still starts sandboxes."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.local.support import require_isolation

REPO = Path(__file__).resolve().parents[2]
# A venv made by a venv's python on 3.10 links its python to that venv (not bound in the
# container): make it from the real interpreter, as a user's venv is.
BASE_PYTHON = os.path.realpath(sys.executable)
SCRIPT = """
import json, urllib.request
from osb_sync.local import LocalServer

with LocalServer(isolation=True) as server:
    def call(method, url, body=None, headers=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.read()
    body = {
        "image": {"uri": "opensandbox/code-interpreter:v1.1.0"},
        "entrypoint": ["/bin/sh"],
        "resourceLimits": {},
    }
    box = json.loads(call("POST", server.api_base + "/sandboxes", body))
    endpoint = json.loads(call("GET", f"{server.api_base}/sandboxes/{box['id']}/endpoints/44772"))
    code = {"code": "import sys; print(sys.prefix)", "context": {"language": "python"}}
    raw = call("POST", "http://" + endpoint["endpoint"] + "/code", code, endpoint["headers"])
    events = [json.loads(block) for block in raw.split(b"\\n\\n") if block.strip()]
    print("".join(e["text"] for e in events if e.get("type") == "stdout"), end="")
"""


def test_a_server_run_by_a_venv_under_tmp_starts_sandboxes() -> None:
    require_isolation()
    venv = Path(tempfile.mkdtemp(prefix="osb-venv-"))  # under /tmp, like a tox env there
    venv.chmod(0o755)  # as a venv made by `python -m venv` is: sandboxes' root reads it
    try:
        subprocess.run(
            [BASE_PYTHON, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
            check=True,
            timeout=120,
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
        # the venv sees the base interpreter's packages; the server also needs this one's (tox)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *site.getsitepackages()])
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-c", SCRIPT],
            capture_output=True,
            text=True,
            env=env,
            cwd=venv,
            timeout=240,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout == f"{venv}\n"
    finally:
        shutil.rmtree(venv, ignore_errors=True)
