"""execd emulation: stream framing, code contexts, commands, sessions, interrupts."""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

import pytest

from osb_sync import Client
from osb_sync.local import LocalServer
from osb_sync.local.http.exchange import EventStream
from tests.local.support import Box, local_server, parse_events, texts, wait_for


def raw_stream(box: Box, path: str, body: dict[str, Any]) -> tuple[list[bytes], list[float]]:
    """POST with http.client and return the HTTP chunks as they arrived, with arrival times."""
    host, _, rest = box.base.removeprefix("http://").partition("/")
    conn = http.client.HTTPConnection(host, timeout=10)
    started = time.monotonic()
    conn.request(
        "POST",
        f"/{rest}{path}",
        body=json.dumps(body),
        headers={**box.headers, "Content-Type": "application/json"},
    )
    answer = conn.getresponse()
    assert answer.status == 200
    assert answer.getheader("Transfer-Encoding") == "chunked"
    assert answer.getheader("Cache-Control") == "no-cache"
    chunks, times = [], []
    while chunk := answer.read1(65536):
        chunks.append(chunk)
        times.append(time.monotonic() - started)
    conn.close()
    return chunks, times


def test_token_required(box: Box) -> None:
    for headers in ({}, {"X-EXECD-ACCESS-TOKEN": "wrong"}):
        answer = box.http.get(box.base + "/ping", headers=headers)
        assert answer.status_code == 401
        assert answer.json() == {
            "error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"
        }
    ping = box.call("GET", "/ping")
    assert (ping.status_code, ping.content) == (200, b"")
    via_v1 = box.http.get(
        box.base.replace("/sandboxes/", "/v1/sandboxes/") + "/ping", headers=box.headers
    )
    assert via_v1.status_code == 200


def test_code_framing_is_bare_json(box: Box) -> None:
    chunks, _ = raw_stream(box, "/code", {"code": "print('hi')", "context": {"language": "python"}})
    for chunk in chunks:
        assert chunk.endswith(b"}\n\n") and chunk.startswith(b"{")
        assert not chunk.startswith(b"data:")
    events = parse_events(b"".join(chunks))
    assert events[0]["type"] == "init" and events[1] == {
        **events[1],
        "type": "ping",
        "text": "pong",
    }
    assert all(isinstance(e["timestamp"], int) for e in events)
    assert "".join(texts(events)) == "hi\n"
    assert events[-1]["type"] == "execution_complete"


def test_live_output_and_pings(box: Box) -> None:
    code = "import time\nprint(1)\ntime.sleep(2)\nprint(2)"
    chunks, times = raw_stream(box, "/code", {"code": code, "context": {"language": "python"}})
    events = [json.loads(c) for c in chunks]
    stdout = [i for i, e in enumerate(events) if e["type"] == "stdout"]
    assert "".join(events[i]["text"] for i in stdout) == "1\n2\n"
    second = next(i for i in stdout if "2" in events[i]["text"])
    # live: "1" arrives while the code sleeps, not with "2" (a gap, not an absolute time)
    assert events[stdout[0]]["text"].startswith("1") and times[second] - times[stdout[0]] > 1.0
    assert sum(e["type"] == "ping" for e in events) >= 5  # interval 0.2 s over 2 s


def test_state_result_and_errors(box: Box) -> None:
    box.code("x = 20")
    events = box.code("y = x + 1\ny * 2")
    kinds = [e["type"] for e in events if e["type"] != "ping"]
    assert kinds == ["init", "execution_count", "result", "execution_complete"]
    assert next(e for e in events if e["type"] == "result")["results"] == {"text": "42"}
    assert isinstance(
        next(e for e in events if e["type"] == "execution_count")["execution_count"], int
    )
    assert "result" not in [e["type"] for e in box.code("x;")]
    failed = [e for e in box.code("def f():\n    return 1/0\nf()") if e["type"] != "ping"]
    assert [e["type"] for e in failed] == ["init", "status", "error", "execution_complete"]
    assert failed[1]["text"] == "error"
    err = failed[2]["error"]
    assert (err["ename"], err["evalue"]) == ("ZeroDivisionError", "division by zero")
    assert any("return 1/0" in line for line in err["traceback"])
    syntax = [e for e in box.code("def (") if e["type"] == "error"]
    assert syntax[0]["error"]["ename"] == "SyntaxError"


def test_contexts(box: Box) -> None:
    created = box.call("POST", "/code/context", json={"language": "python"}).json()
    assert set(created) == {"id", "language"} and len(created["id"]) == 32
    other = box.call("POST", "/code/context", json={"language": "python"}).json()["id"]
    box.code("v = 'one'", id=created["id"])
    box.code("v = 'two'", id=other)
    assert "".join(texts(box.code("print(v)", id=created["id"]))) == "one\n"
    init = box.code("1", id=created["id"])[0]
    assert init == {**init, "type": "init", "text": created["id"]}
    listed = box.call("GET", "/code/contexts", params={"language": "python"}).json()
    assert {c["id"] for c in listed} >= {created["id"], other}
    assert box.call("GET", f"/code/contexts/{created['id']}").json() == created
    assert box.call("DELETE", f"/code/contexts/{created['id']}").status_code == 200
    missing = box.call("GET", f"/code/contexts/{created['id']}")
    assert (missing.status_code, missing.json()["code"]) == (404, "CONTEXT_NOT_FOUND")
    assert box.call("DELETE", "/code/contexts").json()["code"] == "MISSING_QUERY"
    assert box.call("DELETE", "/code/contexts", params={"language": "python"}).status_code == 200
    assert box.call("GET", "/code/contexts").json() == []
    unknown = box.call(
        "POST", "/code", json={"code": "1", "context": {"id": "x", "language": "python"}}
    )
    assert (unknown.status_code, unknown.json()["code"]) == (500, "RUNTIME_ERROR")


def test_busy_context(box: Box) -> None:
    context_id = box.call("POST", "/code/context", json={"language": "python"}).json()["id"]
    slow = threading.Thread(
        target=box.code, args=("import time; time.sleep(1.5)",), kwargs={"id": context_id}
    )
    slow.start()
    time.sleep(0.5)
    response = box.call(
        "POST", "/code", json={"code": "1", "context": {"id": context_id, "language": "python"}}
    )
    slow.join()
    assert response.status_code == 200
    assert response.content.endswith(
        b'{"code":"RUNTIME_ERROR","message":"error running codes session is busy"}'
    )
    events = parse_events(response.content)
    assert events[0]["type"] == "init" and events[-1]["code"] == "RUNTIME_ERROR"


def test_interrupt(box: Box) -> None:
    context_id = box.call("POST", "/code/context", json={"language": "python"}).json()["id"]
    box.code("counter = 1", id=context_id)
    result: list[list[dict[str, Any]]] = []
    run = threading.Thread(
        target=lambda: result.append(
            box.code("import time\nwhile True: time.sleep(0.05)", id=context_id)
        )
    )
    run.start()
    time.sleep(0.5)
    assert box.call("DELETE", "/code", params={"id": context_id}).status_code == 200
    run.join(5)
    errors = [e for e in result[0] if e["type"] == "error"]
    assert errors[0]["error"]["ename"] == "KeyboardInterrupt"
    assert result[0][-1]["type"] == "execution_complete"
    assert "".join(texts(box.code("print(counter)", id=context_id))) == "1\n"  # state survived
    assert box.call("DELETE", "/code").status_code == 400


def test_bash_language_and_languageless_code(box: Box) -> None:
    events = box.code("echo one; echo two >&2; pwd", language="bash")
    assert "".join(texts(events)) == f"one\n{box.home}\n"
    assert "".join(texts(events, "stderr")) == "two\n"
    failed = box.code("exit 4", language="bash")
    assert [e["error"]["evalue"] for e in failed if e["type"] == "error"] == ["4"]
    shell = box.stream("/code", {"code": "printf 'a\\nb\\n'"})
    assert texts(shell) == ["a\n", "b\n"]  # a command's events: execd 1.1.1's form
    assert len(shell[0]["text"]) == 32


def test_command_lines_and_exit(box: Box) -> None:
    events = box.command("printf 'a\\n\\nb\\n'; echo oops >&2")
    assert events[0]["type"] == "init" and len(events[0]["text"]) == 32
    assert texts(events) == ["a", "\n", "b"]
    # execd 1.1.1's form (#2033): each line with its terminator, CR ending one too
    assert [e["text"] for e in events if e["type"] == "stdout"] == ["a\n", "\n", "b\n"]
    crlf = box.command("printf 'x\\r\\ny\\rz'")
    assert [e["text"] for e in crlf if e["type"] == "stdout"] == ["x\r\n", "y\r", "z"]
    assert texts(events, "stderr") == ["oops"]
    assert events[-1]["type"] == "execution_complete"
    failed = box.command("echo partial; exit 7")
    assert failed[-1]["type"] == "error"
    assert failed[-1]["error"] == {
        "ename": "CommandExecError",
        "evalue": "7",
        "traceback": ["exit status 7"],
    }
    assert "execution_complete" not in [e["type"] for e in failed]
    status = box.call("GET", f"/command/status/{failed[0]['text']}").json()
    assert (status["running"], status["exit_code"], status["error"]) == (False, 7, "exit status 7")


def test_command_env_cwd_and_validation(box: Box) -> None:
    box.call("POST", "/directories", json={"sub": {"mode": 755}})
    events = box.command("echo $FOO; pwd; echo $HOME", envs={"FOO": "bar"}, cwd="sub")
    assert texts(events) == ["bar", f"{box.home}/sub", box.home]
    for body in (
        {"command": ""},
        {"command": "true", "timeout": 0},
        {"command": "true", "cwd": "nope"},
    ):
        answer = box.call("POST", "/command", json=body)
        assert (answer.status_code, answer.json()["code"]) == (400, "INVALID_REQUEST_BODY")


def test_command_timeout(box: Box) -> None:
    started = time.monotonic()
    events = box.command("echo start; sleep 10", timeout=300)
    assert time.monotonic() - started < 3
    assert texts(events) == ["start"]
    assert events[-1]["error"]["evalue"] == "-1"
    assert events[-1]["error"]["traceback"] == ["signal: killed"]


def test_command_grace_keeps_stream_open(make_box: Any) -> None:
    with local_server(command_grace=3.0) as graceful:
        box = make_box(graceful)
        started = time.monotonic()
        chunks, times = raw_stream(box, "/command", {"command": "true"})
        types = [json.loads(chunk)["type"] for chunk in chunks]
        complete_at = times[types.index("execution_complete")]
        assert complete_at < 2.5 and time.monotonic() - started >= 3.0  # the event, then EOF


def test_background_command_status_and_logs(box: Box) -> None:
    events = box.command("echo one; sleep 0.3; echo two >&2; exit 3", background=True)
    assert [e["type"] for e in events if e["type"] != "ping"] == ["init", "execution_complete"]
    command_id = events[0]["text"]
    status = box.call("GET", f"/command/status/{command_id}").json()
    assert status["running"] is True and "exit_code" not in status and "finished_at" not in status
    url = f"/command/status/{command_id}"
    assert wait_for(lambda: not box.call("GET", url).json()["running"])
    status = box.call("GET", url).json()
    assert (status["exit_code"], status["content"]) == (
        3,
        "echo one; sleep 0.3; echo two >&2; exit 3",
    )
    logs = box.call("GET", f"/command/{command_id}/logs", params={"cursor": 0})
    assert logs.text == "one\ntwo\n"
    cursor = int(logs.headers["EXECD-COMMANDS-TAIL-CURSOR"])
    assert cursor == len(b"one\ntwo\n")
    tail = box.call("GET", f"/command/{command_id}/logs", params={"cursor": 4})
    assert tail.text == "two\n"
    assert box.call("GET", f"/command/{command_id}/logs", params={"cursor": cursor}).text == ""
    foreground = box.command("true")[0]["text"]
    assert box.call("GET", f"/command/{foreground}/logs").status_code == 400
    assert box.call("GET", "/command/nope/logs").status_code == 400
    missing = box.call("GET", "/command/status/nope")
    assert (missing.status_code, missing.json()["code"]) == (404, "INVALID_REQUEST_BODY")


def test_a_background_command_ends_though_a_child_holds_its_output(box: Box) -> None:
    command = "echo first; (sleep 3; echo later) & echo last"
    command_id = box.command(command, background=True)[0]["text"]
    url, logs = f"/command/status/{command_id}", f"/command/{command_id}/logs"
    started = time.monotonic()
    assert wait_for(lambda: not box.call("GET", url).json()["running"])
    assert time.monotonic() - started < 2.5  # the exit, not the child's end, ends the command
    assert box.call("GET", logs).text == "first\nlast\n"  # all of it once done
    assert wait_for(lambda: box.call("GET", logs).text == "first\nlast\nlater\n", timeout=15)


def test_a_background_command_is_killed_at_its_timeout(box: Box) -> None:
    command_id = box.command("echo start; sleep 30", background=True, timeout=300)[0]["text"]
    url = f"/command/status/{command_id}"
    assert wait_for(lambda: not box.call("GET", url).json()["running"], timeout=10)
    assert box.call("GET", url).json()["exit_code"] == -1
    assert box.call("GET", f"/command/{command_id}/logs").text == "start\n"


def test_interrupt_command(box: Box) -> None:
    command_id = box.command("sleep 30", background=True)[0]["text"]
    assert box.call("DELETE", "/command", params={"id": command_id}).status_code == 200
    url = f"/command/status/{command_id}"
    assert wait_for(lambda: not box.call("GET", url).json()["running"])
    assert box.call("GET", url).json()["exit_code"] == -1
    unknown = box.call("DELETE", "/command", params={"id": "nope"})
    assert (unknown.status_code, unknown.json()) == (
        500,
        {"code": "RUNTIME_ERROR", "message": "no such session"},
    )


def test_sessions(box: Box) -> None:
    session_id = box.call("POST", "/session").json()["session_id"]
    run = f"/session/{session_id}/run"
    box.stream(run, {"command": "mkdir -p deep && cd deep && export X=42"})
    events = box.stream(run, {"command": "pwd; echo $X; echo err >&2; printf tail"})
    assert texts(events) == [f"{box.home}/deep", "42", "err", "tail"]
    assert events[0]["text"] == session_id and events[-1]["type"] == "execution_complete"
    failed = box.stream(run, {"command": "false"})
    assert failed[-1]["error"]["evalue"] == "1"
    timed_out = box.call("POST", run, json={"command": "sleep 5", "timeout": 200})
    assert timed_out.content.endswith(b'timeout after 0.2s"}')
    # The timeout killed the session's shell: later runs say so (not a dropped connection).
    after = box.call("POST", run, json={"command": "true"})
    assert after.content.endswith(b'error running in session. session exited"}')
    assert box.call("DELETE", f"/session/{session_id}").status_code == 200
    assert box.call("POST", run, json={"command": "true"}).status_code == 404


def test_metrics(box: Box) -> None:
    started = time.monotonic()
    metrics = box.call("GET", "/metrics").json()
    assert time.monotonic() - started < 0.5
    assert set(metrics) == {
        "cpu_count",
        "cpu_used_pct",
        "mem_total_mib",
        "mem_used_mib",
        "timestamp",
    }
    assert metrics["cpu_count"] >= 1 and metrics["mem_total_mib"] > 0


def test_unknown_execd_route(box: Box) -> None:
    assert box.call("GET", "/nope").status_code == 404


def test_a_session_is_free_as_soon_as_its_run_reported_its_end(
    client_server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client sends the next run the moment it reads the terminal event: a server thread
    # that lingers after writing that event must not hold the session any more.
    write = EventStream.event

    def linger_after_the_end(self: EventStream, event: dict[str, Any]) -> None:
        write(self, event)
        if event.get("type") in ("execution_complete", "error"):
            time.sleep(0.5)

    monkeypatch.setattr(EventStream, "event", linger_after_the_end)
    with Client(client_server.api_base) as client, client.create_sandbox() as sandbox:
        with sandbox.commands.session() as session:
            results = [session.run("echo x") for _ in range(3)]
    assert [(r.exit_code, r.error) for r in results] == [(0, None)] * 3


RICH = """
class R:
    def _repr_html_(self): return '<b>r</b>'
    def _repr_png_(self): return bytes(range(4))
    def _repr_json_(self): return {'r': 1}
    def _repr_markdown_(self): return object()  # not JSON: left out
    def _repr_latex_(self): raise ValueError('no latex')
    def __repr__(self): return 'R()'
"""


def test_results_carry_rich_forms_and_input_is_refused_as_by_a_kernel(
    client_server: LocalServer,
) -> None:
    with Client(client_server.api_base) as client, client.create_sandbox() as sandbox:
        rich = sandbox.run_code(RICH + "R()")
        a_class = sandbox.run_code("R")
        asked = sandbox.run_code("input()")
    forms = {"text/html": "<b>r</b>", "image/png": "AAECAw==", "application/json": {"r": 1}}
    assert rich.results == [{"text": "R()", **forms}]
    assert a_class.results == [{"text": "<class '__main__.R'>"}]
    assert asked.error is not None
    assert (asked.error.name, asked.error.value) == (
        "StdinNotImplementedError",
        "raw_input was called, but this frontend does not support input requests.",
    )


def test_command_argv_as_execd_1_1_1(box: Box) -> None:
    """Issue 45: `argv` runs without a shell, arguments unchanged; the 400s of #1760."""
    code = "import json, sys; print(json.dumps(sys.argv[1:]))"
    args = ["a b", "$HOME", "", "*"]
    events = box.stream("/command", {"argv": ["python3", "-c", code, *args]})
    assert "".join(e["text"] for e in events if e["type"] == "stdout") == json.dumps(args) + "\n"
    status = box.call("GET", f"/command/status/{events[0]['text']}").json()
    assert json.loads(status["content"]) == ["python3", "-c", code, *args]
    missing = box.stream("/command", {"argv": ["no-such-program-xyz"]})
    assert [e["type"] for e in missing if e["type"] != "ping"] == ["init", "error"]
    assert "executable file not found" in missing[-1]["error"]["evalue"]
    for body, message in (
        ({"command": "true", "argv": ["true"]}, "exactly one of"),
        ({}, "exactly one of"),
        ({"command": ""}, "exactly one of"),
        ({"argv": "true"}, "exactly one of"),
        ({"argv": ["true", None]}, "argv elements must be strings"),
        ({"argv": []}, "non-empty executable"),
        ({"argv": [""]}, "non-empty executable"),
        ({"argv": ["true", "a\0b"]}, "must not contain NUL"),
        ({"argv": ["true"], "gid": 1}, "uid is required when gid is provided"),
    ):
        answer = box.call("POST", "/command", json=body)
        assert answer.status_code == 400, body
        assert (
            answer.json()["code"] == "INVALID_REQUEST_BODY" and message in answer.json()["message"]
        )
