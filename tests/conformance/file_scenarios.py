"""Scenarios about files, metrics and the access token."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from osb_sync import FileInfo, Files, Sandbox

from .execds import TOKEN_HEADER, Target, impatient
from .outcome import Outcome, digest, file_outcome, raised

MIB = 1024 * 1024
SILENCE = 3.0  # how long to wait for an answer real execd never sends


def payload(size: int, seed: int) -> bytes:
    """Binary data with every byte value, the same on both sides."""
    return random.Random(seed).randbytes(size)


def stat(files: Files, path: str, folder: str) -> Outcome:
    return file_outcome(files.info(path)[path], folder)


def binary_roundtrip(t: Target) -> Outcome:
    files = t.sandbox.files
    folder = t.fresh_dir()
    data = payload(3 * MIB + 17, seed=1)
    blob = folder + "/nested/blob.bin"
    files.write(blob, data, mode=0o640)
    outcome: Outcome = {
        "read": digest(files.read_bytes(folder + "/nested/blob.bin", max_bytes=4 * MIB)),
        "range": digest(b"".join(files.iter_bytes(folder + "/nested/blob.bin", start=MIB + 3))),
        "info": stat(files, folder + "/nested/blob.bin", folder),
        "range_at_end": raised(lambda: list(files.iter_bytes(blob, start=len(data)))),
        "range_past_end": raised(lambda: list(files.iter_bytes(blob, start=len(data) + 10))),
        "over_cap": raised(lambda: files.read_bytes(folder + "/nested/blob.bin", max_bytes=MIB)),
    }
    upload = payload(2 * MIB + 5, seed=2)
    with tempfile.TemporaryDirectory() as local:
        source, target = Path(local) / "up.bin", Path(local) / "down.bin"
        source.write_bytes(upload)
        files.upload(source, folder + "/up.bin", mode=0o755)
        written = files.download(folder + "/up.bin", target)
        outcome["upload_download"] = (written, digest(target.read_bytes()))
    outcome["uploaded"] = stat(files, folder + "/up.bin", folder)
    files.write(folder + "/empty", b"")
    outcome["empty"] = digest(files.read_bytes(folder + "/empty"))
    files.write(folder + "/text.txt", "h\u00e9llo\n")
    outcome["text"] = files.read_text(folder + "/text.txt")
    files.write_many([(folder + "/m1", b"one"), (folder + "/m2", b"two", 0o600)])
    infos = files.info(folder + "/m1", folder + "/m2")
    outcome["write_many"] = {
        k.replace(folder, "<dir>"): file_outcome(v, folder) for k, v in infos.items()
    }
    return outcome


def listing(t: Target) -> Outcome:
    files = t.sandbox.files
    folder = t.fresh_dir()
    files.write(folder + "/a.txt", b"aaa")
    files.write(folder + "/b.py", b"print()", mode=0o755)
    files.write(folder + "/sub/c.txt", b"c" * 1000)
    files.mkdir(folder + "/emptydir", mode=0o700)

    def entries(infos: list[FileInfo]) -> list[Outcome]:
        return sorted((file_outcome(i, folder) for i in infos), key=lambda o: o["path"])

    return {
        "depth1": entries(files.list(folder)),
        "depth2": entries(files.list(folder, depth=2)),
        "search_txt": entries(files.search(folder, "*.txt")),
        "search_all": entries(files.search(folder)),
        "info_dir": stat(files, folder + "/sub", folder),
        "exists": (files.exists(folder + "/a.txt"), files.exists(folder + "/nope")),
    }


def move_chmod_remove(t: Target) -> Outcome:
    files = t.sandbox.files
    folder = t.fresh_dir()
    files.write(folder + "/f.txt", b"content")
    files.mkdir(folder + "/d")
    files.move(folder + "/f.txt", folder + "/d/g.txt")
    outcome: Outcome = {
        "moved": (files.exists(folder + "/f.txt"), files.read_bytes(folder + "/d/g.txt")),
    }
    files.chmod(folder + "/d/g.txt", 0o600)
    outcome["chmod_file"] = oct(files.info(folder + "/d/g.txt")[folder + "/d/g.txt"].mode)
    files.chmod(folder + "/d", 0o711)
    outcome["chmod_dir"] = oct(files.info(folder + "/d")[folder + "/d"].mode)
    files.chmod(folder + "/d", 0o755)
    outcome["replace"] = files.replace(folder + "/d/g.txt", "t", "T")
    outcome["replaced"] = files.read_text(folder + "/d/g.txt")
    files.remove(folder + "/d/g.txt")
    outcome["removed"] = files.exists(folder + "/d/g.txt")
    files.move(folder + "/d", folder + "/e")
    outcome["dir_moved"] = (files.exists(folder + "/d"), files.exists(folder + "/e"))
    files.rmtree(folder + "/e")
    outcome["rmtree"] = files.exists(folder + "/e")
    return outcome


def missing_files(t: Target) -> Outcome:
    files = t.sandbox.files
    folder = t.fresh_dir()
    files.mkdir(folder)
    gone = folder + "/missing"
    outcome: Outcome = {
        "read": raised(lambda: files.read_bytes(gone)),
        "range": raised(lambda: list(files.iter_bytes(gone, start=5))),
        "info": raised(lambda: files.info(gone)),
        "info_one_missing": raised(lambda: files.info(folder, gone)),
        "list": raised(lambda: files.list(gone)),
        "search": raised(lambda: files.search(gone, "*")),
        "move": raised(lambda: files.move(gone, folder + "/x")),
        "chmod": raised(lambda: files.chmod(gone, 0o600)),
        "replace": raised(lambda: files.replace(gone, "a", "b")),
        "remove": raised(lambda: files.remove(gone)),
        "rmtree": raised(lambda: files.rmtree(gone)),
    }
    files.write(folder + "/plain", b"x")
    outcome["write_under_a_file"] = raised(lambda: files.write(folder + "/plain/child", b"y"))
    outcome["mkdir_over_a_file"] = raised(lambda: files.mkdir(folder + "/plain"))
    outcome["mkdir_existing"] = raised(lambda: files.mkdir(folder))
    outcome["search_no_match"] = files.search(folder, "*.nothing")
    files.write(folder + "/full/inner.txt", b"z")
    outcome["remove_full_dir"] = raised(lambda: files.remove(folder + "/full"))
    outcome["full_dir_after"] = files.exists(folder + "/full/inner.txt")
    with impatient(t, SILENCE) as handle:
        outcome["read_dir"] = raised(lambda: handle.files.read_bytes(folder))
    return outcome


def metrics(t: Target) -> Outcome:
    sample = t.sandbox.metrics()
    return {
        "cpu_count_positive": sample.cpu_count > 0,
        "cpu_used_pct_in_range": 0 <= sample.cpu_used_pct <= 100 * sample.cpu_count,
        "mem_total_positive": sample.mem_total_mib > 0,
        "mem_used_below_total": 0 < sample.mem_used_mib <= sample.mem_total_mib,
        "timestamp_ms": sample.timestamp is not None and sample.timestamp > 10**12,
    }


def token_required(t: Target) -> Outcome:
    outcome: Outcome = {}
    for name, headers in {"none": {}, "wrong": {TOKEN_HEADER: "wrong-token"}}.items():
        outcome[name] = refusals(t.handle(headers))
    outcome["with_token"] = t.sandbox.ping()
    return outcome


def refusals(handle: Sandbox) -> Outcome:
    return {
        "ping": handle.ping(),
        "code": raised(lambda: handle.run_code("1")),
        "command": raised(lambda: handle.commands.run("true")),
        "files": raised(lambda: handle.files.info("/")),
        "metrics": raised(handle.metrics),
    }
