"""What sandbox isolation costs: create+run+delete wall, `osb-sync run` wall, memory per sandbox.

For each tree (this checkout and, with ``--baseline-commit``, that commit unpacked with
``git archive`` into a temporary directory and put first on ``PYTHONPATH``), in the same run:

- create + ``run_code("print(1)")`` + delete, wall, median of ``--cycles`` (>= 10): a worker
  process imports the tree's client and drives a server of the same tree running in its own
  process (``python -m osb_sync serve --port 0``); the trees' cycles are interleaved;
- ``python -m osb_sync run "print(1)"`` as a whole process (interpreter start, embedded server,
  sandbox, run, delete, exit), wall, median of ``--runs`` (>= 7), interleaved;
- memory per idle sandbox: RSS (and PSS) of the server process plus every process below it,
  with ``--sandboxes`` idle sandboxes minus with none, divided by their number; measured once
  after create only and once after each ran ``print(1)`` (its interpreter is then up).

Goal (issue 11): the isolated server within 1.5x of e886d5f on both walls.

    python benchmarks/bench_isolation.py [--baseline-commit e886d5f] [--json out.json]

Every process runs with a temporary directory as its working directory, so ``python -m`` never
imports another tree's package, and without OPEN_SANDBOX_* variables, so ``run`` starts its own
local server. Traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from _common import median

REPO = Path(__file__).resolve().parents[1]
SERVING = "serving http://"
GOAL_RATIO = 1.5


# -- the worker: runs with a tree's osb_sync first on sys.path ------------------------------------


def tree_rss(root_pid: int) -> dict[str, int]:
    """RSS and PSS (KiB) summed over `root_pid` and all its descendants, and their number."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    pending, total = [root_pid], {"rss_kib": 0, "pss_kib": 0, "processes": 0}
    while pending:
        pid = pending.pop()
        pending.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/smaps_rollup") as rollup:
                fields = dict(line.split(":", 1) for line in rollup if ":" in line[:20])
        except OSError:
            continue
        total["rss_kib"] += int(fields.get("Rss", "0 kB").split()[0])
        total["pss_kib"] += int(fields.get("Pss", "0 kB").split()[0])
        total["processes"] += 1
    return total


def settled_rss(root_pid: int) -> dict[str, int]:
    """`tree_rss` once the process tree stopped changing (median of 5 samples 0.2 s apart)."""
    samples = []
    for _ in range(5):
        samples.append(tree_rss(root_pid))
        time.sleep(0.2)
    return {key: int(median([s[key] for s in samples])) for key in samples[0]}


def start_server(workdir: str) -> tuple[subprocess.Popen[str], str]:
    """`python -m osb_sync serve` of the tree on sys.path; the process and its API base."""
    argv = [sys.executable, "-m", "osb_sync", "serve", "--host", "127.0.0.1", "--port", "0"]
    argv.append("--allow-unenforced-network-policy")
    proc = subprocess.Popen(argv, cwd=workdir, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if SERVING in line:
            api_base = "http://" + line.split(SERVING, 1)[1].split()[0]
            # Keep draining: a full pipe would block the server, a closed one break it.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, api_base
    proc.kill()
    raise RuntimeError("the local server did not start")


def worker() -> None:
    """Answer one JSON line per command read from stdin: `cycle`, `memory N`, `quit`."""
    import osb_sync

    proc, api_base = start_server(os.getcwd())  # the driver's temporary directory
    client = osb_sync.Client(api_base=api_base)
    try:
        with client.create_sandbox() as sandbox:
            message = client.get_sandbox(sandbox.id).message
        for line in sys.stdin:
            command, *args = line.split()
            if command == "quit":
                break
            if command == "cycle":
                answer = cycle(client)
            else:
                answer = memory_per_sandbox(client, proc.pid, int(args[0]))
            answer["status_message"] = message
            print(json.dumps(answer), flush=True)
    finally:
        client.close()
        proc.terminate()
        proc.wait(30)


def cycle(client: Any) -> dict[str, Any]:
    """Seconds of one create, `run_code("print(1)")` and delete, and of the three together."""
    started = time.perf_counter()
    sandbox = client.create_sandbox()
    created = time.perf_counter()
    try:
        result = sandbox.run_code("print(1)")
        ran = time.perf_counter()
    finally:
        sandbox.delete()
    deleted = time.perf_counter()
    assert result.stdout == "1\n", result
    return {
        "wall": deleted - started,
        "create": created - started,
        "run": ran - created,
        "delete": deleted - ran,
    }


def memory_per_sandbox(client: Any, server_pid: int, count: int) -> dict[str, Any]:
    """KiB per idle sandbox: the server's process tree with `count` sandboxes minus with none."""
    empty = settled_rss(server_pid)
    sandboxes = [client.create_sandbox() for _ in range(count)]
    try:
        created = settled_rss(server_pid)
        for sandbox in sandboxes:
            sandbox.run_code("print(1)")
        after_run = settled_rss(server_pid)
    finally:
        for sandbox in sandboxes:
            sandbox.delete()
    per = {
        f"{state}_{key}": (figures[key] - empty[key]) / count
        for state, figures in (("created", created), ("after_run", after_run))
        for key in ("rss_kib", "pss_kib")
    }
    return {**per, "processes_per_sandbox": (after_run["processes"] - empty["processes"]) / count}


# -- the driver -----------------------------------------------------------------------------------


def clean_env(tree: Path) -> dict[str, str]:
    """The environment of a process of `tree`: its package first, no remote server configured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPEN_SANDBOX_")}
    env["PYTHONPATH"] = str(tree)
    return env


class Tree:
    """One osb_sync source tree under test, and its worker process."""

    def __init__(self, name: str, path: Path, workdir: str) -> None:
        self.name, self.path, self.workdir = name, path, workdir
        self.worker = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            cwd=workdir,
            env=clean_env(path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.cycles: list[dict[str, float]] = []
        self.runs: list[float] = []
        self.memory: dict[str, Any] = {}
        self.status_message: str | None = None

    def ask(self, command: str) -> dict[str, Any]:
        assert self.worker.stdin is not None and self.worker.stdout is not None
        self.worker.stdin.write(command + "\n")
        self.worker.stdin.flush()
        line = self.worker.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker of {self.name} exited")
        answer: dict[str, Any] = json.loads(line)
        self.status_message = answer.pop("status_message")
        return answer

    def cycle_ms(self, part: str) -> float:
        """Median milliseconds of `part` (wall, create, run, delete) over the cycles."""
        return 1000 * median([c[part] for c in self.cycles])

    def cli_run(self) -> float:
        """Wall of `python -m osb_sync run "print(1)"` as a whole process."""
        argv = [sys.executable, "-m", "osb_sync", "run", "print(1)"]
        started = time.perf_counter()
        done = subprocess.run(argv, cwd=self.workdir, env=clean_env(self.path), capture_output=True)
        wall = time.perf_counter() - started
        assert done.returncode == 0 and done.stdout.strip() == b"1", done
        return wall

    def close(self) -> None:
        if self.worker.poll() is None:
            assert self.worker.stdin is not None
            self.worker.stdin.write("quit\n")
            self.worker.stdin.close()
            self.worker.wait(60)


@contextmanager
def baseline_tree(commit: str) -> Iterator[Path]:
    """`osb_sync` of `commit` (git archive) in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="osb-bench-baseline-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit, "osb_sync"],
            check=True,
            capture_output=True,
        ).stdout
        archive_path = Path(tmp, "tree.tar")
        archive_path.write_bytes(archive)
        with tarfile.open(archive_path) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)


def measure(trees: list[Tree], cycles: int, runs: int, sandboxes: int) -> None:
    """Interleave the trees' cycles and CLI runs (order rotating), then measure memory."""
    for tree in trees:
        tree.ask("cycle")  # warm-up: imports, first interpreter, caches
    for i in range(max(cycles, runs)):
        order = trees[i % len(trees) :] + trees[: i % len(trees)]
        for tree in order:
            if i < cycles:
                tree.cycles.append(tree.ask("cycle"))
            if i < runs:
                tree.runs.append(tree.cli_run())
    for tree in trees:
        tree.memory = tree.ask(f"memory {sandboxes}")


def table(trees: list[Tree]) -> list[dict[str, Any]]:
    """One row per figure: each tree's value, and the ratio to the last tree (the baseline)."""
    figures = [
        ("create+run_code('print(1)')+delete wall, median (ms)", lambda t: t.cycle_ms("wall")),
        ("  of which create (ms)", lambda t: t.cycle_ms("create")),
        ("  of which run_code (ms)", lambda t: t.cycle_ms("run")),
        ("  of which delete (ms)", lambda t: t.cycle_ms("delete")),
        ('`osb-sync run "print(1)"` wall, median (ms)', lambda t: 1000 * median(t.runs)),
        ("RSS per idle sandbox, created (KiB)", lambda t: t.memory["created_rss_kib"]),
        ("RSS per idle sandbox, after print(1) (KiB)", lambda t: t.memory["after_run_rss_kib"]),
        ("PSS per idle sandbox, after print(1) (KiB)", lambda t: t.memory["after_run_pss_kib"]),
        ("processes per idle sandbox, after print(1)", lambda t: t.memory["processes_per_sandbox"]),
    ]
    rows = []
    for label, value in figures:
        row: dict[str, Any] = {"figure": label, **{t.name: round(value(t), 1) for t in trees}}
        if len(trees) == 2 and value(trees[1]):
            row["ratio"] = round(value(trees[0]) / value(trees[1]), 2)
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]], names: list[str]) -> None:
    columns = ["figure", *names, *(["ratio"] if len(names) == 2 else [])]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline-commit", help="also measure this commit, e.g. e886d5f")
    parser.add_argument("--cycles", type=int, default=10, help="create+run+delete repetitions")
    parser.add_argument("--runs", type=int, default=7, help="`osb-sync run` repetitions")
    parser.add_argument("--sandboxes", type=int, default=10, help="idle sandboxes for memory")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    with ExitStack() as stack:
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="osb-bench-iso-"))
        trees = [Tree("this checkout", REPO, workdir)]
        if args.baseline_commit:
            old = stack.enter_context(baseline_tree(args.baseline_commit))
            trees.append(Tree(args.baseline_commit, old, workdir))
        for tree in trees:
            stack.callback(tree.close)
        measure(trees, args.cycles, args.runs, args.sandboxes)
        rows = table(trees)
        messages = {tree.name: tree.status_message for tree in trees}
    print_table(rows, [tree.name for tree in trees])
    for name, message in messages.items():
        print(f"status message of a sandbox, {name}: {message!r}")
    if len(trees) == 2:
        slowest = max(row["ratio"] for row in rows if " wall" in row["figure"])
        met = "met" if slowest <= GOAL_RATIO else "NOT met"
        print(f"goal: walls within {GOAL_RATIO}x of {args.baseline_commit}: {met}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": rows, "status_messages": messages}, indent=2)
        )


if __name__ == "__main__":
    main()
