"""The client against the local server, over real loopback sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import urllib3

import osb_sync
from osb_sync import ApiError, Client, NotFoundError, OutputLimitExceeded
from osb_sync.local import LocalServer
from tests import realexecd
from tests.sockets.test_cli import osb
from tests.sockets.test_cli_verbs import cp_round_trip


@pytest.fixture(scope="module")
def local() -> Iterator[LocalServer]:
    with LocalServer(
        **realexecd.server_options(),
        min_timeout=1,
        ping_interval=0.5,
        command_grace=0,
        unenforced_network_policy="accept",
    ) as srv:
        yield srv


@pytest.fixture
def client(local: LocalServer) -> Iterator[Client]:
    with Client(local.api_base, read_timeout=20) as c:
        yield c


class TcpConnects:
    """Counts TCP connections urllib3 opens (a pooled connection object may reconnect)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def wrap(self, real: Callable[..., socket.socket]) -> Callable[..., socket.socket]:
        def create_connection(*args: Any, **kwargs: Any) -> socket.socket:
            with self._lock:
                self.count += 1
            return real(*args, **kwargs)

        return create_connection


@pytest.fixture
def tcp(monkeypatch: pytest.MonkeyPatch) -> TcpConnects:
    counter = TcpConnects()
    real = urllib3.util.connection.create_connection
    monkeypatch.setattr(urllib3.util.connection, "create_connection", counter.wrap(real))
    return counter


def run_when_free(
    sandbox: osb_sync.Sandbox, code: str, fresh_context: bool = False
) -> osb_sync.ExecutionResult:
    """Like real execd, a context stays busy while an interrupted run winds down."""
    deadline = time.monotonic() + 10
    context = sandbox.contexts.create("python") if fresh_context else None
    while True:
        result = sandbox.run_code(code, context=context)
        busy = result.error is not None and "session is busy" in result.error.value
        if not busy or time.monotonic() > deadline:
            return result
        time.sleep(0.1)


def joined_stdout(arrivals: list[tuple[str, float]]) -> dict[str, str]:
    return {"stdout": "".join(text for text, _ in arrivals)}


def test_create_run_delete(client: Client) -> None:
    with client.create_sandbox() as sandbox:
        code = "import sys\nprint('hi')\nprint('err', file=sys.stderr)\n6*7"
        expected = {"stdout": "hi\n", "stderr": "err\n", "results": [{"text": "42"}]}
        result = realexecd.run_expecting(sandbox, code, "create_run_delete", **expected)
        assert (result.stdout, result.stderr) == ("hi\n", "err\n")
        assert result.results == [{"text": "42"}] and result.execution_count is not None
        sandbox_id = sandbox.id
    with pytest.raises(NotFoundError):
        client.get_sandbox(sandbox_id)
    assert client.delete_sandbox(sandbox_id) is False


def test_state_survives_between_runs_and_errors_are_returned(client: Client) -> None:
    with client.create_sandbox() as sandbox:
        sandbox.run_code("x = 20")
        result = realexecd.run_expecting(
            sandbox, "x + 22", "state", setup="x = 20", results=[{"text": "42"}]
        )
        assert result.results == [{"text": "42"}]
        result = sandbox.run_code("1/0")
        assert result.error is not None and result.error.name == "ZeroDivisionError"
        assert any("ZeroDivisionError" in line for line in result.error.traceback)


@pytest.mark.ours_only(
    "run-execd's Jupyter venv has no bash kernel (the official image installs one): real "
    "execd never answers /code in bash without it"
)
def test_bash_language(client: Client) -> None:
    with client.create_sandbox() as sandbox:
        assert sandbox.run_code("echo $((6*7))", language="bash").stdout == "42\n"


def test_output_streams_live(client: Client) -> None:
    with client.create_sandbox() as sandbox:
        code = "import time\nprint(1, flush=True)\ntime.sleep(1)\nprint(2)"

        def attempt(number: int) -> list[tuple[str, float]]:
            context = sandbox.contexts.create("python") if number else None
            started = time.monotonic()
            arrivals: list[tuple[str, float]] = []
            with sandbox.stream_code(code, context=context) as stream:
                for event in stream:
                    if event.type == "stdout":
                        arrivals.append((event.text or "", time.monotonic() - started))
            return arrivals

        arrivals = realexecd.until_complete(
            "streams_live", attempt, joined_stdout, {"stdout": "1\n2\n"}
        )
        # Joined text, not event boundaries (a server may coalesce or split output events).
        assert "".join(text for text, _ in arrivals) == "1\n2\n"
        first_at = next(at for text, at in arrivals if "1" in text)
        second_at = next(at for text, at in arrivals if "2" in text)
        assert second_at - first_at >= 0.7  # "1" came live, before the 1 s sleep ended


def test_leaving_a_stream_interrupts_the_run(client: Client) -> None:
    with client.create_sandbox() as sandbox:
        with sandbox.stream_code("import time\nprint('go', flush=True)\ntime.sleep(60)") as s:
            for event in s:
                if event.type == "stdout":
                    break
        started = time.monotonic()
        first = run_when_free(sandbox, "print('free')")
        freed_after = time.monotonic() - started
        result = realexecd.until_complete(
            "leaving_a_stream",
            lambda n: run_when_free(sandbox, "print('free')", fresh_context=True) if n else first,
            vars,
            {"stdout": "free\n"},
        )
        assert result.stdout == "free\n" and freed_after < 5


def test_run_deadline_interrupts(client: Client) -> None:
    with client.create_sandbox() as sandbox:
        with pytest.raises(osb_sync.SandboxTimeoutError):
            sandbox.run_code("import time\ntime.sleep(30)", timeout=1.0)
        after = realexecd.until_complete(
            "deadline",
            lambda n: run_when_free(sandbox, "print('after')", fresh_context=n > 0),
            vars,
            {"stdout": "after\n"},
        )
        assert after.stdout == "after\n"


@pytest.mark.ours_only(
    "Jupyter's IOPub data rate limit (1 MB/s by default; the image's entrypoint flags keep it) "
    "drops a 50 MB print before real execd sees it"
)
def test_output_flood_is_capped_and_the_run_interrupted(client: Client, tcp: TcpConnects) -> None:
    with client.create_sandbox() as sandbox:
        sandbox.run_code("print('warm')")
        before = tcp.count
        with pytest.raises(OutputLimitExceeded):
            sandbox.run_code("print('x' * 50_000_000)")
        # The flood came over the one pooled connection; the interrupt that followed had to
        # open a new one: the capped connection was dropped, not handed back half-read.
        assert tcp.count == before + 1
        after = run_when_free(sandbox, "print('next')")
        assert after.stdout == "next\n", after


# Each sandbox of a real execd starts a Jupyter server (seconds, ~100 MB): fewer at once.
# 32 threads on one connection pool: tests/sockets/test_sockets.py (a fake server)
THREADS = 6 if realexecd.in_use() else 8


def test_threads_each_in_its_own_sandbox(client: Client, tcp: TcpConnects) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            with client.create_sandbox() as sandbox:
                for i in range(5):
                    expected = [{"text": str(n * 100 + i)}]
                    code = f"{n} * 100 + {i}"
                    result = realexecd.run_expecting(
                        sandbox, code, f"threads {n}", results=expected
                    )
                    assert result.results == expected
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    print(f"TCP connections by {THREADS} threads x (create + 5 runs + delete): {tcp.count}")
    assert 1 <= tcp.count <= 2 * THREADS  # over 7 requests a thread: most reuse one


def test_sandbox_expires_after_its_timeout(client: Client) -> None:
    sandbox = client.create_sandbox(timeout=1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            client.get_sandbox(sandbox.id)
        except NotFoundError:
            return
        time.sleep(0.2)
    pytest.fail("the sandbox did not expire")


def test_api_key_is_required_when_configured() -> None:
    with LocalServer(
        **realexecd.server_options(), api_key="s3cret-key", unenforced_network_policy="accept"
    ) as srv:
        with Client(srv.api_base, api_key="") as anonymous, pytest.raises(ApiError) as info:
            anonymous.create_sandbox()
        assert info.value.status_code == 401 and info.value.code == "MISSING_API_KEY"
        with Client(srv.api_base, api_key="wrong-key") as wrong, pytest.raises(ApiError) as info:
            wrong.create_sandbox()
        assert info.value.code == "INVALID_API_KEY" and "wrong-key" not in str(info.value)
        with Client(srv.api_base, api_key="s3cret-key") as good:
            result = realexecd.until_complete(
                "api_key", lambda n: good.code_interpreter_tool("print(1)"), vars, {"stdout": "1\n"}
            )
            assert result.stdout == "1\n"


def test_paused_sandbox_refuses_to_run(client: Client) -> None:
    with client.create_sandbox() as sandbox:
        sandbox.pause()
        with pytest.raises(osb_sync.OpenSandboxError):
            sandbox.run_code("print(1)")
        sandbox.resume()
        assert realexecd.run_expecting(sandbox, "print(1)", "paused", stdout="1\n").stdout == "1\n"


def test_pending_then_running() -> None:
    with LocalServer(
        **realexecd.server_options(), pending_seconds=0.3, unenforced_network_policy="accept"
    ) as srv:
        with Client(srv.api_base) as c:
            started = time.monotonic()
            with c.create_sandbox(poll_interval=0.1) as sandbox:
                assert time.monotonic() - started >= 0.25
                result = realexecd.run_expecting(sandbox, "print(1)", "pending", stdout="1\n")
                assert result.stdout == "1\n"


def test_execd_token_is_required(client: Client) -> None:
    with client.create_sandbox() as sandbox:
        stranger = osb_sync.Sandbox.from_execd(sandbox.execd_url)
        with pytest.raises(ApiError) as info:
            stranger.run_code("print(1)")
        assert info.value.status_code == 401


def test_readme_example_runs(local: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.rst").read_text()
    lines = readme.split(".. code-block:: python\n", 1)[1].splitlines()
    body = []
    for line in lines[1:]:
        if line and not line.startswith("    "):
            break
        body.append(line[4:])
    code = "\n".join(body)
    monkeypatch.setenv("OPEN_SANDBOX_API_BASE", local.api_base)  # the example's Client() reads it
    namespace: dict[str, object] = {}
    exec(compile(code, "README.rst", "exec"), namespace)


def test_cp_round_trips_a_tree_on_this_execd(
    local: LocalServer, client: Client, tmp_path: Path
) -> None:
    """Issue 49: symlinks, empty directories, modes, mtimes and odd names through ``osb-sync
    cp``, both ways and through ``-``, on the real execd too (tox -e realexecd), whose API
    tells no link's text and sets no time: commands in the sandbox do."""
    with client.create_sandbox() as sandbox:
        cp_round_trip(local.api_base, sandbox.id, tmp_path)


def test_cp_out_of_a_name_that_is_not_utf8_says_so_and_copies_nothing(
    local: LocalServer, client: Client, tmp_path: Path
) -> None:
    """execd's API carries names as JSON text: ours sends such a name with a lone surrogate
    (refused as an invalid answer, the cause unsaid), the real one with U+FFFD, whose
    download then failed with "file not found" after the files before it were written. The
    copy is refused before anything is written, naming the file and what to do."""
    with client.create_sandbox() as sandbox:
        made = sandbox.commands.run(
            [
                "bash",
                "-c",
                "mkdir -p /tmp/nu && echo ok > /tmp/nu/a.txt && echo x > /tmp/nu/b$'\\xff'",
            ]
        )
        assert made.exit_code == 0, made.stderr
        for dest in (str(tmp_path / "out"), "-"):
            copied = osb("cp", "--api-base", local.api_base, f"{sandbox.id}:/tmp/nu", dest)
            assert copied.returncode == 1, copied.stderr
            assert "not UTF-8" in copied.stderr and "/tmp/nu/b" in copied.stderr, copied.stderr
            assert copied.stdout == ""
        assert not (tmp_path / "out").exists()
