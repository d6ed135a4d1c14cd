"""The examples start with one command and run submitted code through their pools."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def post_when_up(url: str, code: str, process: subprocess.Popen[bytes]) -> requests.Response:
    deadline = time.monotonic() + 60
    while True:
        try:
            return requests.post(url, data=code, timeout=30)
        except requests.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.parametrize(
    ("script", "framework"), [("flask_app.py", "flask"), ("django_app.py", "django")]
)
def test_example_runs_submitted_code(script: str, framework: str, tmp_path: Path) -> None:
    pytest.importorskip(framework)
    # the conftest removed OPEN_SANDBOX_API_BASE: the example starts its own local server
    port = free_port()
    log = (tmp_path / "server.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / script)],
        env={**os.environ, "PORT": str(port), "POOL_SIZE": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/run"
    try:
        answer = post_when_up(url, "print(6 * 7)", process)
        assert answer.status_code == 200 and answer.json()["stdout"] == "42\n"
        empty = requests.post(url, data="", timeout=30)
        assert empty.status_code == 400 and "empty" in empty.json()["error"]
        raised = requests.post(url, data="1/0", timeout=30).json()
        assert raised["error"]["name"] == "ZeroDivisionError"
        flood = requests.post(url, data="print('x' * 100_000)", timeout=30).json()
        assert flood["error"]["name"] == "OutputLimitExceeded" and flood["stdout"] == ""
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
            log.close()
    assert process.returncode == 0, (tmp_path / "server.log").read_text()


@pytest.mark.parametrize(
    ("script", "framework"), [("flask_app.py", "flask"), ("django_app.py", "django")]
)
def test_example_cleans_up_on_sigterm(script: str, framework: str, tmp_path: Path) -> None:
    pytest.importorskip(framework)
    from tests.leftovers import local_dirs, processes_under, wait_until

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / script)],
        env={**os.environ, "PORT": str(port), "POOL_SIZE": "2", "TMPDIR": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        answer = post_when_up(f"http://127.0.0.1:{port}/run", "print(1)", process)
        assert answer.status_code == 200
        assert wait_until(lambda: processes_under(tmp_path), timeout=30)  # pooled sandboxes
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert wait_until(lambda: not processes_under(tmp_path), timeout=10)
    assert local_dirs(tmp_path) == []


def test_flask_create_app_fails_at_start_up_without_a_server_and_answers_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("flask")
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delenv("OPEN_SANDBOX_API_BASE", raising=False)
    import flask_app

    with pytest.raises(RuntimeError, match="OPEN_SANDBOX_API_BASE"):
        flask_app.create_app()
    app = flask_app.create_app("http://127.0.0.1:9/v1")  # never reached: the body is refused
    too_big = app.test_client().post("/run", data=b"x" * (flask_app.MAX_CODE_BYTES + 1))
    assert too_big.status_code == 413
    assert f"{flask_app.MAX_CODE_BYTES}-byte limit" in too_big.get_json()["error"]


DJANGO_ERRORS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import django_app
django_app.configure("http://127.0.0.1:9/v1")  # never reached: every request here is refused
from django.test import Client
client = Client(raise_request_exception=False)
too_big = client.post("/run", b"x" * (django_app.MAX_CODE_BYTES + 1), content_type="text/plain")
answers = {
    "too_big": too_big,
    "empty": client.post("/run", b"", content_type="text/plain"),
    "get": client.get("/run"),
    "missing": client.get("/nowhere"),
}
from django.test import RequestFactory
from django.urls import get_resolver
request = RequestFactory().get("/run")
answers["400"] = get_resolver().resolve_error_handler(400)(request, ValueError("x"))
answers["500"] = get_resolver().resolve_error_handler(500)(request)
shown = {k: [r.status_code, r["Content-Type"], r.content.decode()] for k, r in answers.items()}
print(json.dumps(shown))
"""


def test_django_example_answers_every_error_with_json() -> None:
    """413 for a body too big (Django's own answer is a 400 page), 400, 405, 404, and Django's
    400 and 500 handlers: all JSON."""
    pytest.importorskip("django")
    env = {k: v for k, v in os.environ.items() if k != "OPEN_SANDBOX_API_BASE"}
    done = subprocess.run(
        [sys.executable, "-c", DJANGO_ERRORS, str(EXAMPLES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout.splitlines()[-1])
    statuses = {name: status for name, (status, _, _) in answers.items()}
    expected = {"too_big": 413, "empty": 400, "get": 405, "missing": 404, "400": 400, "500": 500}
    assert statuses == expected
    for name, (_, content_type, body) in answers.items():
        assert content_type == "application/json" and "error" in json.loads(body), name
    assert str(64 * 1024) in json.loads(answers["too_big"][2])["error"]


def test_django_example_has_a_wsgi_application_read_from_the_environment(
    tmp_path: Path,
) -> None:
    """Issue 48: ``gunicorn django_app:application`` finds a WSGI callable, configured from
    OPEN_SANDBOX_API_BASE, whose view runs code."""
    pytest.importorskip("django")
    from osb_sync.local import LocalServer

    call = (
        "import io, json, django_app\n"
        "app = django_app.application\n"
        "said = []\n"
        "env = {'REQUEST_METHOD': 'POST', 'PATH_INFO': '/run', 'SERVER_NAME': '127.0.0.1',\n"
        "       'SERVER_PORT': '80', 'wsgi.input': io.BytesIO(b'print(6 * 7)'),\n"
        "       'CONTENT_LENGTH': '12', 'wsgi.url_scheme': 'http', 'HTTP_HOST': '127.0.0.1'}\n"
        "body = b''.join(app(env, lambda status, headers: said.append(status)))\n"
        "print(said[0], json.loads(body)['stdout'], end='')\n"
    )
    with LocalServer(unenforced_network_policy="accept") as server:
        env = {**os.environ, "OPEN_SANDBOX_API_BASE": server.api_base, "POOL_SIZE": "1"}
        ran = subprocess.run(
            [sys.executable, "-c", call],
            cwd=EXAMPLES,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert (ran.returncode, ran.stdout) == (0, "200 OK 42\n"), ran.stderr
    unset = {k: v for k, v in os.environ.items() if k != "OPEN_SANDBOX_API_BASE"}
    refused = subprocess.run(
        [sys.executable, "-c", "import django_app; django_app.application"],
        cwd=EXAMPLES,
        env=unset,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1 and "set OPEN_SANDBOX_API_BASE" in refused.stderr


def test_flask_example_reads_the_pool_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 48: OPENSANDBOX_POOL_REDIS_URL shares the example's pool through Redis."""
    pytest.importorskip("flask")
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("OPENSANDBOX_POOL_REDIS_URL", "redis://127.0.0.1:1/0")
    import flask_app

    app = flask_app.create_app("http://127.0.0.1:1/v1")
    assert app.config["OPENSANDBOX_POOL_REDIS_URL"] == "redis://127.0.0.1:1/0"
    assert app.extensions["opensandbox"].store is not None
