"""The osb-sync verbs of issue 28 (exec -i/-e/-w/-u/-t/-d, cp, logs, pause, resume, renew,
inspect, ls, rm, stats, help, completion) and one test per message of its items 4-6."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from osb_sync import ApiError, Client, Sandbox, _cli_copy
from osb_sync._cli import main
from osb_sync._cli_output import EXIT_STATUSES, cli_terms, new_lines, status_summary
from osb_sync.local import LocalServer
from tests.fakeserver import FakeServer
from tests.sockets.test_cli import OWN_ERROR, one_line, osb, osb_process


@pytest.fixture
def server(shared_server: LocalServer) -> LocalServer:
    return shared_server


@pytest.fixture
def sid(shared_sandbox: Sandbox) -> str:
    return shared_sandbox.id


def api(server: LocalServer) -> tuple[str, str]:
    return ("--api-base", server.api_base)


# -- exec -----------------------------------------------------------------------------------


def test_exec_i_gives_the_command_standard_input(server: LocalServer, sid: str) -> None:
    proc = osb(
        "exec", *api(server), "-i", sid, "cat; echo; ls /tmp | grep -c osb-stdin; true", stdin="hi"
    )
    assert (proc.returncode, proc.stdout) == (0, "hi\n0\n"), proc.stderr  # nothing left behind
    assert osb("exec", *api(server), sid, "cat", stdin="dropped").stdout == ""  # no -i: none
    piped = osb_process(
        "exec", *api(server), "-i", sid, "cat", input="from a pipe\n", capture_output=True
    )
    assert (piped.returncode, piped.stdout) == (0, "from a pipe\n"), piped.stderr


def test_exec_e_w_and_u(server: LocalServer, sid: str) -> None:
    proc = osb(
        "exec", *api(server), "-e", "A=1", "-e", "B=two", "-w", "/tmp", sid, "echo $A$B; pwd"
    )
    assert (proc.returncode, proc.stdout) == (0, "1two\n/tmp\n"), proc.stderr
    me = osb("exec", *api(server), "-u", str(os.getuid()), sid, "id -u")
    assert me.returncode == 0 and me.stdout.strip().isdigit(), me.stderr
    bad = osb("exec", *api(server), "-u", "root", sid, "true")
    assert bad.returncode == OWN_ERROR and "numeric UID" in one_line(bad)


def test_exec_t_runs_on_a_terminal_and_it_needs_one_for_input(
    server: LocalServer, sid: str
) -> None:
    proc = osb("exec", *api(server), "-t", sid, "tty; exit 3")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("/dev/pts/") and proc.stdout.endswith("\r\n")
    piped = osb("exec", *api(server), "-it", sid, "true")  # stdin is no terminal here
    assert (piped.returncode, one_line(piped)) == (1, "the input device is not a TTY")
    both = osb("exec", *api(server), "-t", "-u", "0", sid, "true")
    assert both.returncode == OWN_ERROR and "-u does not go with -t" in one_line(both)


def test_exec_d_prints_an_id_and_logs_follow_it(server: LocalServer, sid: str) -> None:
    started = osb("exec", *api(server), "-d", sid, "echo one; sleep 0.3; echo two")
    assert started.returncode == 0, started.stderr
    command_id = started.stdout.strip()
    followed = osb("logs", *api(server), "-f", sid, command_id)
    assert (followed.returncode, followed.stdout) == (0, "one\ntwo\n"), followed.stderr
    assert osb("logs", *api(server), sid, command_id).stdout == "one\ntwo\n"
    tail = osb("logs", *api(server), "--tail", "1", sid, command_id)
    assert tail.returncode == OWN_ERROR and "without COMMAND_ID" in one_line(tail)


def to_the_sandbox_log(sandbox: Sandbox, *lines: str) -> None:
    """Append lines to the container's standard error (its init's), as docker logs shows."""
    text = "".join(f"{line}\n" for line in lines)
    assert sandbox.commands.run(f"printf '{text}' >> /proc/1/fd/2").exit_code == 0


def test_logs_without_a_command_id_shows_the_sandbox_log(server: LocalServer) -> None:
    if not server.isolated:
        pytest.skip("needs isolation: outside a sandbox, /proc/1 is the host's init")
    with Client(server.api_base) as client, client.create_sandbox() as sandbox:
        to_the_sandbox_log(sandbox, "line1", "line2", "line3")
        whole = osb("logs", *api(server), sandbox.id)
        assert (whole.returncode, whole.stdout) == (0, "line1\nline2\nline3\n"), whole.stderr
        tail = osb("logs", *api(server), "--tail", "2", sandbox.id)
        assert (tail.returncode, tail.stdout) == (0, "line2\nline3\n"), tail.stderr
    gone = osb("logs", *api(server), sandbox.id)  # the local server keeps a deleted one's
    assert (gone.returncode, gone.stdout) == (0, "line1\nline2\nline3\n"), gone.stderr
    bad = osb("logs", *api(server), "--tail", "0", sandbox.id)
    assert bad.returncode == OWN_ERROR and "from 1 to 10000" in bad.stderr
    missing = osb("logs", *api(server), "no-such-sandbox")
    assert missing.returncode == 1, missing.stderr


def test_logs_f_of_a_sandbox_polls_until_it_is_deleted(server: LocalServer) -> None:
    if not server.isolated:
        pytest.skip("needs isolation: outside a sandbox, /proc/1 is the host's init")
    with Client(server.api_base) as client:
        sandbox = client.create_sandbox()
        try:
            to_the_sandbox_log(sandbox, "before", "same")
            out: list[subprocess.CompletedProcess[str]] = []
            follower = threading.Thread(
                target=lambda: out.append(osb_process("logs", *api(server), "-f", sandbox.id))
            )
            follower.start()
            time.sleep(3)  # at least one poll after the first window
            to_the_sandbox_log(sandbox, "same", "after")
            time.sleep(3)
        finally:
            client.delete_sandbox(sandbox)
        follower.join(60)
    assert not follower.is_alive() and out, "logs -f did not end with its sandbox"
    assert (out[0].returncode, out[0].stdout) == (0, "before\nsame\nsame\nafter\n"), out[0]


def test_logs_of_a_server_without_diagnostics_says_so_in_cli_terms() -> None:
    with FakeServer() as fake:

        @fake.route("GET", "/v1/sandboxes/sb1/diagnostics/logs")
        def _(req: Any) -> None:
            req.send_json(501, {"code": "NOT_IMPLEMENTED", "message": "not on this runtime"})

        proc = osb("logs", "--api-base", fake.api_base, "sb1")
    line = one_line(proc)
    assert proc.returncode == OWN_ERROR, proc.stderr
    assert "does not serve (HTTP 501)" in line and "osb-sync logs ID COMMAND_ID" in line, line


def test_max_output_takes_units_and_stops_with_125(server: LocalServer, sid: str) -> None:
    proc = osb(
        "exec", *api(server), "--max-output", "1KiB", sid, "head -c 100000 /dev/zero | tr '\\0' y"
    )
    assert proc.returncode == OWN_ERROR
    last = proc.stderr.splitlines()[-1]
    assert "the run's output exceeded 1024 bytes" in last and "raise --max-output" in last, last
    assert len(proc.stdout) <= 1024  # live echo: the lines that fit (here none: one long line)
    bad = osb("exec", *api(server), "--max-output", "lots", sid, "true")
    assert bad.returncode == OWN_ERROR and "a size such as 20MB" in bad.stderr


def test_max_output_counts_the_output_not_its_events(server: LocalServer, sid: str) -> None:
    """Issue 28's case: 300 000 lines of "y" (600 kB of output, about 16 MB of events) pass
    whole under a 1 MB cap, and the remote status with them."""
    proc = osb("exec", *api(server), "--max-output", "1MB", sid, "yes | head -n 300000; exit 3")
    assert proc.returncode == 3, proc.stderr[-500:]
    assert proc.stdout == "y\n" * 300_000


# -- cp -------------------------------------------------------------------------------------


def test_cp_a_file_both_ways(server: LocalServer, sid: str, tmp_path: Path) -> None:
    (tmp_path / "in.bin").write_bytes(b"\x00\x01binary")
    assert osb("cp", *api(server), str(tmp_path / "in.bin"), f"{sid}:/tmp/in.bin").returncode == 0
    out = tmp_path / "out.bin"
    assert osb("cp", *api(server), f"{sid}:/tmp/in.bin", str(out)).returncode == 0
    assert out.read_bytes() == b"\x00\x01binary"
    missing = osb("cp", *api(server), f"{sid}:/tmp/no-such", str(out))
    assert missing.returncode == 1 and "no such file" in one_line(missing)
    both = osb("cp", *api(server), str(out), str(out))
    assert both.returncode == OWN_ERROR and "SANDBOX:PATH" in one_line(both)


def test_cp_a_directory_both_ways(server: LocalServer, sid: str, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / "sub" / "b.txt").write_text("b")
    assert osb("cp", *api(server), str(tree), f"{sid}:/tmp/tree").returncode == 0
    back = tmp_path / "back"
    assert osb("cp", *api(server), f"{sid}:/tmp/tree", str(back)).returncode == 0
    assert (back / "a.txt").read_text() == "a" and (back / "sub" / "b.txt").read_text() == "b"


def test_cp_dash_is_a_tar_stream_both_ways(server: LocalServer, sid: str) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        member = tarfile.TarInfo("d/x.txt")
        member.size = 3
        archive.addfile(member, io.BytesIO(b"xyz"))
    env = {**os.environ, "OPEN_SANDBOX_API_BASE": server.api_base}
    base = [sys.executable, "-m", "osb_sync", "cp"]
    up = subprocess.run(
        [*base, "-", f"{sid}:/tmp/t"],
        input=buffer.getvalue(),
        env=env,
        capture_output=True,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    down = subprocess.run(
        [*base, f"{sid}:/tmp/t/d", "-"], env=env, capture_output=True, check=False
    )
    assert down.returncode == 0, down.stderr
    with tarfile.open(fileobj=io.BytesIO(down.stdout)) as archive:
        handle = archive.extractfile("d/x.txt")
        assert handle is not None and handle.read() == b"xyz"


# Names any file system allows that a header or a path string could get wrong (issue 49).
ODD_NAMES = ["файл.txt", "文件 名.txt", 'q"uote', "back\\slash", "semi;colon=1", "new\nline"]


def test_cp_keeps_any_file_name_both_ways(server: LocalServer, sid: str, tmp_path: Path) -> None:
    tree = tmp_path / "odd"
    tree.mkdir()
    for number, name in enumerate(ODD_NAMES):
        (tree / name).write_text(f"content {number}")
    assert osb("cp", *api(server), str(tree), f"{sid}:/tmp/odd").returncode == 0
    back = tmp_path / "back"
    out = osb("cp", *api(server), f"{sid}:/tmp/odd", str(back))
    assert out.returncode == 0, out.stderr
    assert sorted(os.listdir(back)) == sorted(ODD_NAMES)
    for number, name in enumerate(ODD_NAMES):
        assert (back / name).read_text() == f"content {number}"
    single = tmp_path / "single"
    one = osb("cp", *api(server), f"{sid}:/tmp/odd/{ODD_NAMES[0]}", str(single))
    assert one.returncode == 0 and single.read_text() == "content 0"


def test_cp_in_refuses_a_name_that_is_not_utf8_before_copying(
    server: LocalServer, sid: str, tmp_path: Path
) -> None:
    """execd's API carries names as JSON text: a name of other bytes cannot cross it (it was a
    400 from execd half-way through the copy, after the files before it)."""
    tree = tmp_path / "bytes"
    tree.mkdir()
    (tree / "a.txt").write_text("a")
    with open(os.path.join(os.fsencode(tree), b"\xff\xfe.txt"), "wb") as handle:
        handle.write(b"x")
    refused = osb("cp", *api(server), str(tree), f"{sid}:/tmp/bytes")
    assert refused.returncode == 1 and "not UTF-8" in refused.stderr, refused.stderr
    assert "\\xff\\xfe.txt" in refused.stderr and "nothing was copied" in refused.stderr
    with Client(server.api_base) as client:
        assert not client.connect(sid).files.exists("/tmp/bytes")


def test_cp_keeps_modes_and_empty_directories(
    server: LocalServer, sid: str, tmp_path: Path
) -> None:
    """Issue 49 row 1 (in part): empty directories going in, modes both ways."""
    tree = tmp_path / "modes"
    (tree / "sub").mkdir(parents=True)
    (tree / "empty" / "deeper").mkdir(parents=True)
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "run.sh").chmod(0o755)
    (tree / "sub" / "private.txt").write_text("p")
    (tree / "sub" / "private.txt").chmod(0o600)
    (tree / "empty").chmod(0o750)
    assert osb("cp", *api(server), str(tree), f"{sid}:/tmp/modes").returncode == 0
    with Client(server.api_base) as client:
        files = client.connect(sid).files
        found = files.info("/tmp/modes/run.sh", "/tmp/modes/sub/private.txt", "/tmp/modes/empty")
        assert [info.mode for info in found.values()] == [0o755, 0o600, 0o750]
        assert files.info("/tmp/modes/empty/deeper")["/tmp/modes/empty/deeper"].type == "directory"
        # mtimes coming out: the file's own, not the copy's (1e9: 2001-09-09)
        touched = client.connect(sid).commands.run("touch -d @1000000000 /tmp/modes/run.sh")
        assert touched.exit_code == 0
    back = tmp_path / "back"
    assert osb("cp", *api(server), f"{sid}:/tmp/modes", str(back)).returncode == 0
    assert (back / "run.sh").stat().st_mode & 0o7777 == 0o755
    assert (back / "run.sh").stat().st_mtime == 1_000_000_000
    assert (back / "sub" / "private.txt").stat().st_mode & 0o7777 == 0o600
    single = tmp_path / "single.sh"
    assert osb("cp", *api(server), f"{sid}:/tmp/modes/run.sh", str(single)).returncode == 0
    assert single.stat().st_mode & 0o7777 == 0o755
    assert single.stat().st_mtime == 1_000_000_000
    env = {**os.environ, "OPEN_SANDBOX_API_BASE": server.api_base}
    down = subprocess.run(
        [sys.executable, "-m", "osb_sync", "cp", f"{sid}:/tmp/modes", "-"],
        env=env,
        capture_output=True,
        check=False,
    )
    assert down.returncode == 0, down.stderr
    with tarfile.open(fileobj=io.BytesIO(down.stdout)) as archive:
        assert archive.getmember("modes/run.sh").mtime == 1_000_000_000
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, mode in [("t/hollow", 0o711), ("t/hollow/in", 0o700)]:
            member = tarfile.TarInfo(name)
            member.type, member.mode = tarfile.DIRTYPE, mode
            archive.addfile(member)
    up = subprocess.run(
        [sys.executable, "-m", "osb_sync", "cp", "-", f"{sid}:/tmp/tarmodes"],
        input=buffer.getvalue(),
        env=env,
        capture_output=True,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    with Client(server.api_base) as client:
        found = client.connect(sid).files.info(
            "/tmp/tarmodes/t/hollow", "/tmp/tarmodes/t/hollow/in"
        )
        assert [(info.type, info.mode) for info in found.values()] == [
            ("directory", 0o711),
            ("directory", 0o700),
        ]


def test_cp_in_keeps_mtimes_and_streams_a_large_tar_member(
    server: LocalServer, sid: str, tmp_path: Path
) -> None:
    """Issue 49 row 1: mtimes going in (execd sets none: ``touch`` in the sandbox does), and a
    tar on stdin whose large member is streamed, not held (its memory: bench_cp.py)."""
    tree = tmp_path / "times"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.txt").write_text("a")
    os.utime(tree / "sub" / "a.txt", (1_000_000_000, 1_000_000_000))
    os.utime(tree / "sub", (1_100_000_000, 1_100_000_000))
    single = tmp_path / "one.txt"
    single.write_text("1")
    os.utime(single, (1_050_000_000, 1_050_000_000))
    assert osb("cp", *api(server), str(tree), f"{sid}:/tmp/times").returncode == 0
    assert osb("cp", *api(server), str(single), f"{sid}:/tmp/one.txt").returncode == 0
    big = os.urandom(3 << 20)  # past SPOOL_FROM: a request of its own, read as it is sent
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data, mtime in [("t/small", b"s", 1_200_000_000), ("t/big", big, 1_300_000_000)]:
            member = tarfile.TarInfo(name)
            member.size, member.mtime, member.mode = len(data), mtime, 0o640
            archive.addfile(member, io.BytesIO(data))
        member = tarfile.TarInfo("t")
        member.type, member.mtime, member.mode = tarfile.DIRTYPE, 1_400_000_000, 0o750
        archive.addfile(member)
    env = {**os.environ, "OPEN_SANDBOX_API_BASE": server.api_base}
    up = subprocess.run(
        [sys.executable, "-m", "osb_sync", "cp", "-", f"{sid}:/tmp/tartimes"],
        input=buffer.getvalue(),
        env=env,
        capture_output=True,
        check=False,
    )
    assert up.returncode == 0 and up.stderr == b"", up.stderr
    with Client(server.api_base) as client:
        files = client.connect(sid).files
        wanted = {
            "/tmp/times/sub/a.txt": 1_000_000_000,
            "/tmp/times/sub": 1_100_000_000,
            "/tmp/one.txt": 1_050_000_000,
            "/tmp/tartimes/t/small": 1_200_000_000,
            "/tmp/tartimes/t/big": 1_300_000_000,
            "/tmp/tartimes/t": 1_400_000_000,
        }
        found = files.info(*wanted)
        got = {p: int(i.modified_at.timestamp()) for p, i in found.items() if i.modified_at}
        assert got == wanted
        assert files.read_bytes("/tmp/tartimes/t/big", max_bytes=4 << 20) == big
        assert found["/tmp/tartimes/t/big"].mode == 0o640


def test_cp_in_copies_symlinks_as_links_never_what_they_point_to(
    server: LocalServer, sid: str, tmp_path: Path
) -> None:
    """Issue 49 row 1: a symlink going in was followed (its target's bytes uploaded, a link to
    a directory or a dangling one dropped) and a tar's symlink member skipped."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the host's only")
    tree = tmp_path / "links"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "real.txt").write_text("real")
    wanted = {"rel": "sub/real.txt", "to-dir": "sub", "dangling": "/no/such", "out": str(secret)}
    for name, text in wanted.items():
        (tree / name).symlink_to(text)
    assert osb("cp", *api(server), str(tree), f"{sid}:/tmp/links").returncode == 0
    single = osb("cp", *api(server), str(tree / "rel"), f"{sid}:/tmp/single-link")
    assert single.returncode == 0, single.stderr
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        member = tarfile.TarInfo("t/l")
        member.type, member.linkname = tarfile.SYMTYPE, "../elsewhere"
        archive.addfile(member)
    env = {**os.environ, "OPEN_SANDBOX_API_BASE": server.api_base}
    up = subprocess.run(
        [sys.executable, "-m", "osb_sync", "cp", "-", f"{sid}:/tmp/tarlinks"],
        input=buffer.getvalue(),
        env=env,
        capture_output=True,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    paths = [f"/tmp/links/{name}" for name in wanted] + ["/tmp/single-link", "/tmp/tarlinks/t/l"]
    with Client(server.api_base) as client:
        sandbox = client.connect(sid)
        assert [i.type for i in sandbox.files.info(*paths).values()] == ["symlink"] * len(paths)
        said = sandbox.commands.run(["readlink", *paths]).stdout.splitlines()
        assert said == [*wanted.values(), "sub/real.txt", "../elsewhere"]
        assert sandbox.files.read_bytes("/tmp/links/sub/real.txt") == b"real"


@pytest.mark.parametrize("swapped", ["a.txt", "sub"])
def test_cp_in_never_reads_through_a_link_swapped_in_during_the_copy(
    server: LocalServer,
    sid: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    swapped: str,
) -> None:
    """A file or a directory of SRC that another process replaces with a symlink between the
    walk and the upload (a tree others may write to) must not send what the link points to:
    the host's file that the user may read and the sandbox may not."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "a.txt").write_text("the host's only")
    (secrets / "b.txt").write_text("the host's only")
    tree = tmp_path / f"swap-{swapped}"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("a")
    (tree / "sub" / "b.txt").write_text("b")
    walk = _cli_copy._walk

    def racing(top: Path) -> Any:
        found = walk(top)
        victim = tree / swapped
        if victim.is_dir():
            shutil.rmtree(victim)
            victim.symlink_to(secrets)
        else:
            victim.unlink()
            victim.symlink_to(secrets / "a.txt")
        return found

    monkeypatch.setattr(_cli_copy, "_walk", racing)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(["cp", *api(server), str(tree), f"{sid}:/tmp/swap-{swapped}"])
    assert status == 1, err.getvalue()
    assert "symlink" in err.getvalue(), err.getvalue()
    with Client(server.api_base) as client:
        found = client.connect(sid).commands.run(["grep", "-rl", "host's only", "/tmp"])
        assert found.stdout == "", found.stdout


def test_cp_in_of_a_tar_keeps_dotted_names_and_says_what_it_skips(
    server: LocalServer, sid: str
) -> None:
    """A member named "..foo" (or "...") was dropped as if it climbed out; one that climbs
    out, a hard link and a FIFO were dropped without a word."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in ("..foo", "d/...", "a/../../up"):
            member = tarfile.TarInfo(name)
            member.size = len(name)
            archive.addfile(member, io.BytesIO(name.encode()))
        hard = tarfile.TarInfo("hard")
        hard.type, hard.linkname = tarfile.LNKTYPE, "..foo"
        fifo = tarfile.TarInfo("fifo")
        fifo.type = tarfile.FIFOTYPE
        archive.addfile(hard)
        archive.addfile(fifo)
    env = {**os.environ, "OPEN_SANDBOX_API_BASE": server.api_base}
    up = subprocess.run(
        [sys.executable, "-m", "osb_sync", "cp", "-", f"{sid}:/tmp/dotted"],
        input=buffer.getvalue(),
        env=env,
        capture_output=True,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    said = up.stderr.decode()
    for skipped in ("a/../../up", "hard", "fifo"):
        assert f"skipped '{skipped}'" in said, said
    with Client(server.api_base) as client:
        files = client.connect(sid).files
        assert files.read_bytes("/tmp/dotted/..foo") == b"..foo"
        assert files.read_bytes("/tmp/dotted/d/...") == b"d/..."


@pytest.mark.parametrize("cut", ["truncated", "not a tar"])
def test_cp_in_of_a_broken_tar_says_so_without_a_traceback(
    server: LocalServer, sid: str, cut: str
) -> None:
    """`tar cf - DIR | osb-sync cp - SB:DIR` where tar died half way (or stdin is no tar):
    tarfile's ReadError came out as a traceback."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        small, big = tarfile.TarInfo("small"), tarfile.TarInfo("big")
        small.size, big.size = 5, 3 << 20
        archive.addfile(small, io.BytesIO(b"small"))
        archive.addfile(big, io.BytesIO(b"x" * (3 << 20)))
    data = buffer.getvalue()[: 2 << 20] if cut == "truncated" else b"hello\n" * 1000
    up = subprocess.run(
        [sys.executable, "-m", "osb_sync", "cp", "-", f"{sid}:/tmp/broken-{cut[:3]}"],
        input=data,
        env={**os.environ, "OPEN_SANDBOX_API_BASE": server.api_base},
        capture_output=True,
        check=False,
    )
    said = up.stderr.decode()
    assert up.returncode == 1 and "Traceback" not in said, said
    assert "tar" in said and len(said.splitlines()) == 1, said


def _tree_of(root: Path) -> dict[str, tuple[object, ...]]:
    """What a round trip keeps: files (bytes, mode, mtime), symlinks (their text), empty and
    other directories (mode, mtime)."""
    found: dict[str, tuple[object, ...]] = {}
    for parent, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(parent, name)
            info = path.lstat()
            rest = str(path.relative_to(root))
            if path.is_symlink():
                found[rest] = ("link", os.readlink(path))
            elif path.is_dir() and not any(path.iterdir()):
                found[rest] = ("empty", info.st_mode & 0o777, int(info.st_mtime))
            elif path.is_dir():
                found[rest] = ("dir", info.st_mode & 0o777, int(info.st_mtime))
            else:
                found[rest] = ("file", path.read_bytes(), info.st_mode & 0o777, int(info.st_mtime))
    return found


def cp_round_trip(api_base: str, sid: str, tmp_path: Path) -> None:
    """Issue 49's "done when": a tree of a symlink, an empty directory, a 0755 script, a file
    with a space, one with a non-ASCII name and one with a newline, mtimes kept, both ways
    and through ``-`` (on our execd here, on the real one in test_integration.py)."""
    tree = tmp_path / "tree"
    (tree / "empty").mkdir(parents=True)
    (tree / "sub").mkdir()
    for name, mode in [("run.sh", 0o755), ("a file", 0o644), ("файл", 0o600), ("new\nline", 0o640)]:
        (tree / "sub" / name).write_text(name)
        (tree / "sub" / name).chmod(mode)
        os.utime(tree / "sub" / name, (1_000_000_000, 1_000_000_000))
    (tree / "link").symlink_to("sub/run.sh")
    (tree / "empty").chmod(0o750)
    os.utime(tree / "empty", (1_100_000_000, 1_100_000_000))
    (tree / "sub").chmod(0o711)
    os.utime(tree / "sub", (1_200_000_000, 1_200_000_000))
    wanted = _tree_of(tree)
    base = [sys.executable, "-m", "osb_sync", "cp", "--api-base", api_base]

    def cp(src: str, dest: str, given: bytes | None = None) -> bytes:
        done = subprocess.run([*base, src, dest], input=given, capture_output=True, check=False)
        assert done.returncode == 0 and done.stderr == b"", done.stderr
        return done.stdout

    cp(str(tree), f"{sid}:/tmp/rt")
    cp(f"{sid}:/tmp/rt", str(tmp_path / "back"))
    assert _tree_of(tmp_path / "back") == wanted
    cp("-", f"{sid}:/tmp/rt2", cp(f"{sid}:/tmp/rt", "-"))
    cp(f"{sid}:/tmp/rt2/rt", str(tmp_path / "again"))
    assert _tree_of(tmp_path / "again") == wanted


def test_cp_of_a_src_that_is_a_symlink_copies_the_link(
    server: LocalServer, sid: str, tmp_path: Path
) -> None:
    """As docker cp without -L: the link, not what it points to (it was refused)."""
    with Client(server.api_base) as client:
        made = client.connect(sid).commands.run("ln -sfn '../a\nb' /tmp/src-link")
        assert made.exit_code == 0, made.stderr
    assert osb("cp", *api(server), f"{sid}:/tmp/src-link", str(tmp_path)).returncode == 0
    assert os.readlink(tmp_path / "src-link") == "../a\nb"
    out = osb("cp", *api(server), f"{sid}:/tmp/src-link", str(tmp_path / "named"))
    assert out.returncode == 0 and os.readlink(tmp_path / "named") == "../a\nb"
    env = {**os.environ, "OPEN_SANDBOX_API_BASE": server.api_base}
    tarred = subprocess.run(
        [sys.executable, "-m", "osb_sync", "cp", f"{sid}:/tmp/src-link", "-"],
        env=env,
        capture_output=True,
        check=False,
    )
    assert tarred.returncode == 0, tarred.stderr
    with tarfile.open(fileobj=io.BytesIO(tarred.stdout)) as archive:
        member = archive.getmember("src-link")
        assert member.issym() and member.linkname == "../a\nb"


def test_cp_out_of_many_empty_directories_asks_their_modes_in_batches(
    server: LocalServer, sid: str, tmp_path: Path
) -> None:
    with Client(server.api_base) as client:
        made = client.connect(sid).commands.run("mkdir -p -m 0701 /tmp/many/d{1..150}/e")
        assert made.exit_code == 0, made.stderr
    assert osb("cp", *api(server), f"{sid}:/tmp/many", str(tmp_path / "many")).returncode == 0
    found = sorted((tmp_path / "many").glob("d*/e"))
    assert len(found) == 150 and {p.stat().st_mode & 0o777 for p in found} == {0o701}


def test_cp_round_trips_links_empty_directories_modes_and_mtimes(
    server: LocalServer, sid: str, tmp_path: Path
) -> None:
    cp_round_trip(server.api_base, sid, tmp_path)


# -- managing sandboxes ---------------------------------------------------------------------


def test_pause_resume_renew_inspect_stats(server: LocalServer) -> None:
    created = osb("create", *api(server), "--metadata", "t=verbs")
    sandbox_id = created.stdout.strip()
    try:
        assert osb("pause", *api(server), sandbox_id).stdout == f"paused {sandbox_id}\n"
        assert sandbox_id in osb("list", *api(server), "--state", "paused", "-q").stdout
        assert osb("resume", *api(server), sandbox_id).returncode == 0
        renewed = osb("renew", *api(server), "--lifetime", "600", sandbox_id, "--json")
        assert json.loads(renewed.stdout)[0]["expires_at"], renewed.stderr
        inspected = osb("inspect", *api(server), sandbox_id, "no-such")
        assert inspected.returncode == 1 and json.loads(inspected.stdout)[0]["id"] == sandbox_id
        stats = osb("stats", *api(server), sandbox_id, "--json")
        shape = json.loads(stats.stdout)[0]
        assert stats.returncode == 0 and (shape["sandbox"] or shape["host"]), stats.stdout
        assert osb("pause", *api(server), "no-such").returncode == 1
    finally:
        osb("rm", *api(server), sandbox_id)


def test_create_allow_names_the_only_hosts_and_inspect_shows_the_policy(
    server: LocalServer,
) -> None:
    created = osb("create", *api(server), "--allow", "allowed.test", "--allow", "*.wild.test")
    sandbox_id = created.stdout.strip()
    try:
        assert created.returncode == 0, created.stderr
        inspected = osb("inspect", *api(server), sandbox_id)
        policy = json.loads(inspected.stdout)[0]["network_policy"]
        assert policy == {
            "defaultAction": "deny",
            "egress": [
                {"action": "allow", "target": "allowed.test"},
                {"action": "allow", "target": "*.wild.test"},
            ],
            "mode": "deny_all_with_rules",
        }
        plain = osb("inspect", *api(server), osb("create", *api(server)).stdout.strip())
        shape = json.loads(plain.stdout)[0]
        osb("rm", *api(server), shape["id"])
        assert shape["network_policy"]["mode"] == "deny_all"  # the client's default
    finally:
        osb("rm", *api(server), sandbox_id)
    both = osb("create", *api(server), "--allow", "allowed.test", "--allow-internet")
    assert both.returncode == 125 and "give one of them" in both.stderr, both.stderr  # usage


def test_stats_without_the_servers_extension_shows_execds_figures_as_the_hosts() -> None:
    # OpenSandbox's server: no GET /sandboxes/{id}/stats (FastAPI's 404), and a Sandbox
    # object without resourceLimits; its execd's /metrics reads the host's /proc.
    with FakeServer() as fake:
        execd = "/sandboxes/sb1/proxy/44772"

        @fake.route("GET", "/v1/sandboxes/sb1")
        def _(req: Any) -> None:
            running = {"state": "Running", "reason": "", "message": ""}
            created = "2026-12-06T10:00:00Z"
            req.send_json(200, {"id": "sb1", "status": running, "createdAt": created})

        @fake.route("GET", "/v1/sandboxes/sb1/stats")
        def _(req: Any) -> None:
            req.send_json(404, {"detail": "Not Found"})

        @fake.route("GET", "/v1/sandboxes/sb1/endpoints/44772")
        def _(req: Any) -> None:
            req.send_json(200, {"endpoint": f"127.0.0.1:{fake.server_address[1]}{execd}"})

        @fake.route("GET", f"{execd}/ping")
        def _(req: Any) -> None:
            req.send_raw(200, b"")

        @fake.route("GET", f"{execd}/metrics")
        def _(req: Any) -> None:
            host = {"cpu_count": 8, "cpu_used_pct": 12.5, "mem_total_mib": 24105.2}
            req.send_json(200, {**host, "mem_used_mib": 2048.0, "timestamp": 1})

        table = osb("stats", "--api-base", fake.api_base, "sb1")
        shaped = osb("stats", "--api-base", fake.api_base, "sb1", "--json")
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split() == ["ID", "CPUS", "MEM_LIMIT", "OF", "MEM_USED", "MEM%", "CPU", "PIDS"]
    assert row.split() == [
        "sb1",
        "-",
        "-",
        "host",
        "2048.0/24105.2MiB",
        "8.5",
        "12.5%",
        "of",
        "8",
        "-",
    ]
    shape = json.loads(shaped.stdout)[0]
    assert shape["limits"] == {"cpu": None, "memory_mib": None, "given": {}}
    assert shape["sandbox"] is None and shape["host"]["mem_total_mib"] == 24105.2


def test_ls_q_states_in_any_case_and_rm_by_label(server: LocalServer) -> None:
    ids = [osb("create", *api(server), "--metadata", "batch=rm").stdout.strip() for _ in range(2)]
    listed = osb("ls", *api(server), "-q", "--state", "running", "--metadata", "batch=rm")
    assert sorted(listed.stdout.split()) == sorted(ids), listed.stderr
    typo = osb("ls", *api(server), "--state", "runing")
    assert typo.returncode == OWN_ERROR and "did you mean 'Running'?" in typo.stderr
    removed = osb("rm", *api(server), "--metadata", "batch=rm", "--json")
    assert sorted(o["id"] for o in json.loads(removed.stdout)) == sorted(ids)
    assert osb("ls", *api(server), "-q", "--metadata", "batch=rm").stdout == ""
    neither = osb("rm", *api(server))
    assert neither.returncode == OWN_ERROR and "--all" in one_line(neither)


def test_rm_all_deletes_every_sandbox() -> None:
    with LocalServer(unenforced_network_policy="accept") as own:
        for _ in range(2):
            osb("create", "--api-base", own.api_base)
        refused = osb("rm", "--all", "--api-base", own.api_base)  # no terminal: no question
        assert refused.returncode == OWN_ERROR and "--yes" in one_line(refused)
        assert len(osb("ls", "-q", "--api-base", own.api_base).stdout.split()) == 2
        assert osb("rm", "--all", "--yes", "--api-base", own.api_base).returncode == 0
        assert osb("ls", "-q", "--api-base", own.api_base).stdout == ""


def test_several_ids_and_not_found_exits_1(server: LocalServer, sid: str) -> None:
    got = osb("get", *api(server), sid, "no-such", "--json")
    assert got.returncode == 1 and [s["id"] for s in json.loads(got.stdout)] == [sid]
    assert one_line(got).startswith("osb-sync: error: no sandbox no-such (sandboxes expire")
    assert osb("delete", *api(server), "no-such").returncode == 1


# -- help, completion, did you mean --------------------------------------------------------


def test_help_exit_codes_prints_the_table() -> None:
    proc = osb("help", "exit-codes")
    assert proc.returncode == 0 and proc.stdout.strip() == EXIT_STATUSES.strip()
    for status in ("124", "125", "128+n", "141"):
        assert status in proc.stdout
    assert "osb-sync help exit-codes" in osb("--help").stdout
    assert "README" not in osb("--help").stdout


def test_help_of_a_command_and_of_nothing_known() -> None:
    assert "SANDBOX:PATH" in osb("help", "cp").stdout
    unknown = osb("help", "exti-codes")
    assert unknown.returncode == OWN_ERROR and "did you mean 'exit-codes'?" in unknown.stderr


def test_an_unknown_command_says_did_you_mean() -> None:
    proc = osb("lsit")
    assert proc.returncode == OWN_ERROR and "(did you mean 'list'?)" in proc.stderr


def test_help_never_says_default_none() -> None:
    for command in ("run", "exec", "create", "list", "delete", "cp", "serve", "renew"):
        text = osb(command, "--help").stdout
        assert "(default: None)" not in text and "(default: False)" not in text, command
        assert "default: 300) (default" not in text


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts(shell: str) -> None:
    pytest.importorskip("shtab")
    proc = osb("completion", shell)
    assert proc.returncode == 0 and "osb-sync" in proc.stdout and "inspect" in proc.stdout


# -- messages (items 4-6) -------------------------------------------------------------------


def test_status_summary_is_silent_when_all_is_enforced_and_one_line_when_not() -> None:
    full = (
        "Sandbox container started successfully. Isolation: bubblewrap container with ... "
        "Limits enforced: memory=2Gi (cgroup); not enforced: none."
    )
    assert status_summary(full, verbose=False) is None
    assert status_summary(full, verbose=True) == full
    gap = full.replace("not enforced: none", "not enforced: cpu=1, pids=512")
    assert status_summary(gap, verbose=False) == (
        "limits NOT enforced: cpu=1, pids=512 (-v: the server's whole status message)"
    )
    bare = "Sandbox container started successfully. WARNING: this sandbox is NOT isolated (x)."
    assert "NOT isolated" in (status_summary(bare, verbose=False) or "")
    assert status_summary(bare, verbose=False, said_unisolated=True) is None
    assert status_summary("Sandbox container started successfully.", verbose=True) is None
    reasons = full.replace(
        "not enforced: none",
        "not enforced: cpu=0.5 (no writable cpu cgroup), pids=512 (no writable pids cgroup;"
        " RLIMIT_NPROC counts a whole user's processes), inodes=100000 (no tmpfs)",
    )
    assert status_summary(reasons, verbose=False) == (
        "limits NOT enforced: cpu=0.5, pids=512, inodes=100000 (-v: the server's whole status"
        " message)"
    )
    own = full.replace("with ...", "with its only id, root, ... (root inside is your user outside:")
    assert status_summary(own, verbose=False) == (
        "root inside is your user outside (no subordinate id range) (-v: the server's whole"
        " status message)"
    )


def test_log_lines_carry_the_program_name_and_a_moot_busy_line_is_dropped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from osb_sync._cli_logging import configure_logging, dropped_log_lines
    from osb_sync._cli_run import MOOT_AFTER_INTERRUPT

    busy = "interrupting it failed: its context may still be busy"
    configure_logging(debug=False)
    with dropped_log_lines(MOOT_AFTER_INTERRUPT):  # what run does, unless --keep
        logging.getLogger("osb_sync.x").warning("could not delete sandbox %s", "s1")
        logging.getLogger("osb_sync.x").warning(busy)
    assert capsys.readouterr().err == "osb-sync: warning: could not delete sandbox s1\n"
    logging.getLogger("osb_sync.x").warning(busy)  # elsewhere it is not moot
    assert capsys.readouterr().err == f"osb-sync: warning: {busy}\n"


def test_cli_messages_name_flags_not_keywords() -> None:
    egress = "Hint: pass allow_internet_access=True or configure egress on the server."
    assert "--allow-internet" in cli_terms(egress) and "allow_internet_access" not in cli_terms(
        egress
    )
    serve = "start the local server with unenforced_network_policy='accept' to run without it."
    assert "osb-sync serve --allow-unenforced-network-policy" in cli_terms(serve)
    assert "raise --max-output" in cli_terms("(raise max_output_bytes to allow more)")


def test_serve_no_isolation_warns_in_cli_terms_without_a_fix_to_install() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "osb_sync", "serve", "--port", "0", "--no-isolation"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        warning = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert "NOT isolated (turned off by --no-isolation)" in warning, warning
    assert "isolation=False" not in warning and "install bubblewrap" not in warning, warning


def test_an_invalid_parameter_gets_the_egress_hint_only_for_the_network_policy(
    server: LocalServer,
) -> None:
    with Client(server.api_base) as client, pytest.raises(ApiError) as caught:
        client.create_sandbox(resource_limits={"memory": "lots"})
    assert "egress" not in str(caught.value) and "allow_internet_access" not in str(caught.value)


def test_lifetime_below_the_servers_minimum_names_the_flag(server: LocalServer) -> None:
    proc = osb("create", *api(server), "--lifetime", "10")
    assert proc.returncode == OWN_ERROR and "--lifetime" in one_line(proc)


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (
            ("run", "--timeout", "-1", "print(1)"),
            "--timeout: a positive number of seconds, got '-1'",
        ),
        (("create", "--lifetime", "0"), "--lifetime: a positive number of seconds, got '0'"),
        (("serve", "--api-key", "k"), "serve takes no --api-key: a command line shows in `ps`"),
    ],
)
def test_bad_values_are_refused_in_the_flags_terms(args: tuple[str, ...], text: str) -> None:
    proc = osb(*args)
    assert proc.returncode == OWN_ERROR and text in proc.stderr, proc.stderr


def test_an_api_base_ending_in_v2_suggests_v1() -> None:
    with FakeServer() as fake:
        proc = osb("list", "--api-base", fake.url + "/v2")
    assert one_line(proc).endswith(f"(the API base usually ends in /v1: {fake.url}/v1?)")


def test_a_missing_key_names_the_variable_and_the_flag() -> None:
    with LocalServer(api_key="the-right-key", unenforced_network_policy="accept") as keyed:
        proc = osb("list", "--api-base", keyed.api_base)
    line = one_line(proc)
    assert "401" in line and "set OPEN_SANDBOX_API_KEY or pass --api-key" in line, line


def test_a_busy_port_names_it_and_the_fix() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = osb_process("serve", "--port", str(port))
    assert proc.returncode == OWN_ERROR
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in proc.stderr
    assert "--port 0" in proc.stderr and "Errno" not in proc.stderr


def test_sys_exit_in_run_exits_with_its_status() -> None:
    assert osb("run", "import sys; sys.exit(3)").returncode == 3
    quiet = osb("run", "import sys; sys.exit(0)")
    assert (quiet.returncode, quiet.stderr) == (0, "")


def test_a_closed_pipe_is_quiet(server: LocalServer, sid: str) -> None:
    env = {**os.environ, "OPEN_SANDBOX_API_BASE": server.api_base}
    script = f"{sys.executable} -m osb_sync exec {sid} 'seq 1 200000' | head -n 1"
    script += "; echo ${PIPESTATUS[0]}"
    proc = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert proc.stdout.split() == ["1", "141"] and proc.stderr == "", proc.stderr


def test_version_loads_neither_requests_nor_the_client() -> None:
    code = (
        "import sys, runpy\nsys.argv = ['osb-sync', '--version']\n"
        "try:\n    runpy.run_module('osb_sync', run_name='__main__')\nexcept SystemExit:\n"
        "    print(sorted(m for m in sys.modules if m in ('requests', 'osb_sync._client')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.stdout.strip().endswith("[]"), proc.stdout + proc.stderr


# -- languages (item 7) ---------------------------------------------------------------------


def test_a_language_the_local_server_cannot_run_is_a_400_listing_what_it_can(
    server: LocalServer, sid: str
) -> None:
    with Client(server.api_base) as client:
        sandbox = client.connect(sid)
        with pytest.raises(ApiError) as ran:
            sandbox.run_code("1", language="java")
        with pytest.raises(ApiError) as made:
            sandbox.contexts.create("go")
    for caught in (ran, made):
        assert caught.value.status_code == 400, caught.value
        assert "the local server runs python, bash" in str(caught.value)


def test_run_on_the_embedded_server_refuses_a_language_before_creating() -> None:
    proc = osb("run", "--language", "java", "class A {}")
    assert proc.returncode == OWN_ERROR
    assert "runs python, bash, not java" in one_line(proc) and "--api-base" in proc.stderr


def test_new_lines_follow_the_overlap_of_two_windows() -> None:
    assert new_lines(["a\n", "b\n"], ["a\n", "b\n", "b\n", "c\n"]) == ["b\n", "c\n"]
    assert new_lines(["a\n", "b\n", "c\n"], ["b\n", "c\n", "d\n"]) == ["d\n"]  # slid by one
    assert new_lines(["a\n"], ["a\n"]) == []
    assert new_lines([], ["x\n"]) == ["x\n"]
