"""A fake execd on a FakeServer that runs real processes and speaks one of two generations.

``june``: the June build's events (one per line, terminator stripped, CR, LF and CRLF alike;
a blank line as ``"\\n"``); ``/command`` takes ``command`` only (``argv`` gets June's 400).
``released``: execd 1.1.1's (texts keep every ``\\r`` and ``\\n``; here one event per line, a
lone CR ending one; ``split_crlf`` also cuts each CRLF between two events); ``/command`` takes
exactly one of ``command`` and ``argv``. Wire facts: reference/opensandbox-1.1.1.md sections 3-5.
The lifecycle routes for ``SID`` point at it, so the CLI reaches it too.
"""

from __future__ import annotations

import re
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osb_sync.local.execd import envs_file
from tests.fakeserver import FakeServer, Request

SID = "sbx-forms"
TOKEN = "execd-token-forms"
EXECD_PATH = f"/sandboxes/{SID}/proxy/44772"
JUNE_ARGV_ERROR = (
    "invalid request, validation error Key: 'RunCommandRequest.Command' Error:Field "
    "validation for 'Command' failed on the 'required' tag"
)
ONE_OF = (
    "error parsing request, MAYBE invalid body format. exactly one of non-empty command or "
    "argv is required"
)


def june_texts(output: bytes) -> list[str]:
    """June's texts: one per line without its terminator, a blank line as a lone LF."""
    lines = re.split(rb"\r\n|\r|\n", output)
    if lines[-1] == b"":
        lines.pop()
    return [line.decode("utf-8", "replace") or "\n" for line in lines]


def released_texts(output: bytes, split_crlf: bool = False) -> list[str]:
    """1.1.1's texts: they join to the output; here one per line, terminators kept."""
    pieces = [p for p in re.findall(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", output) if p]
    if split_crlf:
        pieces = [q for p in pieces for q in re.split(rb"(?<=\r)(?=\n)", p)]
    return [p.decode("utf-8", "replace") for p in pieces]


@dataclass
class FakeExecd:
    """The fake's state: its form, its working directory, the commands it ran."""

    server: FakeServer
    form: str
    root: Path
    split_crlf: bool = False
    bodies: list[dict[str, Any]] = field(default_factory=list)
    background: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    identities: list[tuple[int, int]] = field(default_factory=list)  # files as a user

    def texts(self, output: bytes) -> list[str]:
        if self.form == "june":
            return june_texts(output)
        return released_texts(output, self.split_crlf)

    def run(self, body: dict[str, Any]) -> tuple[bytes, bytes, int]:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.root)}
        if self.form == "released":  # 1.1.1 rereads its EXECD_ENVS file for every command
            path = self.root / ".execd-envs"
            text = path.read_text() if path.exists() else ""
            env = {**env, "EXECD_ENVS": str(path), **envs_file.parse(text, env)}
        env.update(body.get("envs", {}))
        argv = body["argv"] if "argv" in body else ["bash", "-c", body["command"]]
        ran = subprocess.run(
            argv, cwd=self.root, env=env, capture_output=True, timeout=30, check=False
        )
        return ran.stdout, ran.stderr, ran.returncode

    def command(self, req: Request) -> None:
        body = req.json
        self.bodies.append(body)
        has_command, has_argv = bool(body.get("command")), "argv" in body
        if self.form == "june" and not has_command:
            req.send_json(400, {"code": "INVALID_REQUEST_BODY", "message": JUNE_ARGV_ERROR})
            return
        if has_command == has_argv or (has_argv and not isinstance(body["argv"], list)):
            req.send_json(400, {"code": "INVALID_REQUEST_BODY", "message": ONE_OF})
            return
        command_id = secrets.token_hex(8)
        stdout, stderr, code = self.run(body)
        req.start_stream()
        req.event(type="init", text=command_id)
        if body.get("background"):
            self.background[command_id] = (stdout + stderr, code)
            req.event(type="execution_complete")
            req.end_stream()
            return
        for name, output in (("stdout", stdout), ("stderr", stderr)):
            for text in self.texts(output):
                req.event(type=name, text=text)
        if code == 0:
            req.event(type="execution_complete", execution_time=1)
        else:
            error = {"ename": "CommandExecError", "evalue": str(code), "traceback": []}
            req.event(type="error", error=error)
        req.end_stream()

    def status(self, req: Request) -> None:
        command_id = req.route_path.rsplit("/", 1)[1]
        _, code = self.background[command_id]
        req.send_json(200, {"id": command_id, "running": False, "exit_code": code})

    def logs(self, req: Request) -> None:
        command_id = req.route_path.split("/")[-2]
        output, _ = self.background[command_id]
        cursor = int(req.query.get("cursor", ["0"])[0])
        headers = {"EXECD-COMMANDS-TAIL-CURSOR": str(len(output)), "Content-Type": "text/plain"}
        req.send_raw(200, output[cursor:], headers)


def serve_execd(server: FakeServer, form: str, root: Path, split_crlf: bool = False) -> FakeExecd:
    """Route ``server`` as the lifecycle server of ``SID`` and its execd of ``form``."""
    fake = FakeExecd(server, form, root, split_crlf)
    port = server.server_address[1]
    routes: dict[tuple[str, str], Any] = {
        ("GET", f"/v1/sandboxes/{SID}"): lambda req: req.send_json(
            200, {"id": SID, "status": {"state": "Running"}}
        ),
        ("GET", f"/v1/sandboxes/{SID}/endpoints/44772"): lambda req: req.send_json(
            200,
            {
                "endpoint": f"127.0.0.1:{port}{EXECD_PATH}",
                "headers": {"X-EXECD-ACCESS-TOKEN": TOKEN},
            },
        ),
        ("GET", f"{EXECD_PATH}/ping"): lambda req: req.send_raw(200, b""),
        ("POST", f"{EXECD_PATH}/command"): fake.command,
    }
    server.routes.update(routes)
    server.routes[("GET", "*")] = lambda req: _get(fake, req)
    return fake


AS_USER = re.compile(r"/v1/filesystem/(\d+)/(\d+)(/.*)")


def download(fake: FakeExecd, req: Request) -> None:
    """June's: the whole file, whatever the query; 1.1.1's: lines with offset/limit (#1030)."""
    target = fake.root / req.query["path"][0]
    if not target.is_file():
        req.send_json(404, {"code": "FILE_NOT_FOUND", "message": f"file not found: {target.name}"})
        return
    data = target.read_bytes()
    offset, limit = req.query.get("offset"), req.query.get("limit")
    if fake.form == "june" or (offset is None and limit is None):
        req.send_raw(200, data, {"Content-Type": "application/octet-stream"})
        return
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    first = int(offset[0]) if offset else 1
    chosen = lines[first - 1 :][: int(limit[0]) if limit else None]
    text = b"\n".join(line.removesuffix(b"\r") for line in chosen)
    req.send_raw(200, text, {"Content-Type": "text/plain; charset=utf-8"})


def _get(fake: FakeExecd, req: Request) -> None:
    path = req.route_path
    as_user = AS_USER.fullmatch(path.removeprefix(EXECD_PATH))
    if as_user and fake.form == "released":  # 1.1.1's files as a user (#2070)
        fake.identities.append((int(as_user[1]), int(as_user[2])))
        path = EXECD_PATH + as_user[3]
    if path == f"{EXECD_PATH}/files/download":
        download(fake, req)
    elif path.startswith(f"{EXECD_PATH}/command/status/"):
        fake.status(req)
    elif path.startswith(f"{EXECD_PATH}/command/") and path.endswith("/logs"):
        fake.logs(req)
    else:
        req.send_raw(404, b"404 page not found", {"Content-Type": "text/plain"})
