"""A flake hunt: one tox env's suite in several copies at once, for several rounds.

    python tests/flake_hunt.py [--env py311] [--copies 4] [--rounds 3] [--work DIR] [-- ARGS]

Each copy is its own clone of this repository's HEAD (commit first: uncommitted changes are
not in it) with its own tox env and ``TMPDIR``; the copies of a round start together and the
next round starts when all have ended. ARGS replace the env's pytest arguments (``-- -q
tests/unit``: a subset). Every copy's output and junit file are kept under the work folder
(printed first). It ends with one line per copy and round, each failed test, and
``N passed, N failed, N skipped`` over all rounds; the exit status is 1 if any copy failed or
left a mount below its ``TMPDIR`` (a sandbox's disk that outlived its server: each is named,
then detached so that the next round starts clean).
Standard library only, like tests/run.py, whose helpers it uses.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import run  # tests/run.py, beside this file


@dataclass
class Outcome:
    round: int
    copy: int
    code: int
    seconds: float
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: tuple[str, ...] = ()
    leftovers: tuple[str, ...] = ()  # mounts still below the copy's TMPDIR when it ended

    def line(self) -> str:
        counts = run.counts(self.passed, self.failed, self.skipped)
        status = "OK" if self.code == 0 else f"FAIL (exit {self.code})"
        if self.leftovers:
            status += f", FAIL ({len(self.leftovers)} mounts left behind)"
        took = run.duration(self.seconds)
        return f"round {self.round} copy {self.copy}: {status}, {counts} in {took}"


def copies_of(n: int) -> str:
    return f"{n} cop{'y' if n == 1 else 'ies'}"


def failed_tests(junit: Path) -> tuple[str, ...]:
    """The ids of the tests that failed or errored in a junit file."""
    names = []
    for case in ET.parse(junit).iter("testcase"):
        if any(child.tag in ("failure", "error") for child in case):
            names.append(f"{case.get('classname')}::{case.get('name')}")
    return tuple(names)


def mounts_below(folder: Path) -> tuple[str, ...]:
    """Mount points at or below `folder` (what a copy's tests left mounted), deepest first."""
    prefix = str(folder.resolve())
    points = []
    with open("/proc/self/mountinfo", "rb") as info:
        for line in info:
            # the kernel's octal escapes, decoded as recovery.mount_points does (this script
            # cannot import the package: it runs before its dependencies are installed)
            raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), line.split()[4])
            point = os.fsdecode(raw)
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return tuple(sorted(set(points), key=len, reverse=True))


def detach(points: tuple[str, ...]) -> None:
    """Lazily unmount `points` (so the next round can empty the folder)."""
    for point in points:
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def finished(
    round_number: int, number: int, clone: Path, code: int, started: float, logs: Path, env: str
) -> Outcome:
    """The outcome of a copy that ended now; its junit file is kept in `logs`."""
    outcome = Outcome(round_number, number, code, time.monotonic() - started)
    junit = clone / ".tox" / env / run.JUNIT
    if junit.is_file():
        kept = logs / f"copy-{number}.junit.xml"
        shutil.copy(junit, kept)
        outcome.passed, outcome.failed, skips = run.read_junit(kept)
        outcome.skipped, outcome.failures = len(skips), failed_tests(kept)
    outcome.leftovers = mounts_below(clone / "tmp")
    detach(outcome.leftovers)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--env", default="py311", help="the tox env (default: py311)")
    parser.add_argument("--copies", type=int, default=4, help="copies at once (default: 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds in a row (default: 3)")
    parser.add_argument("--work", type=Path, help="where the clones go (default: a new one)")
    parser.add_argument("pytest_args", nargs="*", help="after --: the env's pytest arguments")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="osb-flake-hunt-"))
    work.mkdir(parents=True, exist_ok=True)
    run.say(f"work folder: {work}")
    env = dict(os.environ)
    if versions := run.pyenv_version(env.get("PYENV_VERSION")):
        env["PYENV_VERSION"] = versions
    if (folder := run.real_execd_dir()) is not None:
        env.setdefault(run.EXECD_DIR_ENV, str(folder.resolve()))  # the clones have no ../shared
    tox = run.ensure_tox()
    copies = []
    for number in range(1, args.copies + 1):
        clone = work / f"copy-{number}"
        if not clone.exists():
            subprocess.run(["git", "clone", "--quiet", str(run.ROOT), str(clone)], check=True)
        (clone / "tmp").mkdir(exist_ok=True)
        copies.append(clone)
    run.say(f"building {args.env} in {copies_of(len(copies))} of {run.ROOT} (not timed)")
    for clone in copies:
        built = subprocess.run(
            [*tox, "run", "-e", args.env, "--notest"],
            cwd=clone,
            env={**env, "TMPDIR": str(clone / "tmp")},
            capture_output=True,
            text=True,
            check=False,
        )
        if built.returncode != 0:
            print(built.stdout + built.stderr)
            run.say(f"could not build {args.env} in {clone}")
            return 1
    posargs = ["--", *args.pytest_args] if args.pytest_args else []
    outcomes: list[Outcome] = []
    for round_number in range(1, args.rounds + 1):
        logs = work / f"round-{round_number}"
        logs.mkdir(exist_ok=True)
        run.say(f"round {round_number}: {args.env} in {copies_of(len(copies))} at once")
        started, running = time.monotonic(), []
        for number, clone in enumerate(copies, 1):
            shutil.rmtree(clone / "tmp", ignore_errors=True)
            (clone / "tmp").mkdir()
            log = (logs / f"copy-{number}.log").open("w")
            command = [*tox, "run", "-e", args.env, "--skip-pkg-install", *posargs]
            proc = subprocess.Popen(
                command,
                cwd=clone,
                env={**env, "TMPDIR": str(clone / "tmp")},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            running.append((number, clone, proc, log))
        while running:
            time.sleep(1)
            for entry in [e for e in running if e[2].poll() is not None]:
                running.remove(entry)
                number, clone, proc, log = entry
                log.close()
                outcomes.append(
                    finished(round_number, number, clone, proc.returncode, started, logs, args.env)
                )
                print(outcomes[-1].line(), flush=True)
                for point in outcomes[-1].leftovers:
                    print(f"    left mounted: {point}", flush=True)
    rounds = f"{args.rounds} round" + ("s" if args.rounds != 1 else "")
    print(f"\nFlake hunt: {args.env} in {copies_of(args.copies)} at once, {rounds} in a row")
    for outcome in sorted(outcomes, key=lambda o: (o.round, o.copy)):
        print(outcome.line())
        for name in outcome.failures:
            print(f"    failed: {name}")
        for point in outcome.leftovers:
            print(f"    left mounted: {point}")
    bad = [o for o in outcomes if o.code != 0 or o.leftovers]
    print(f"copies that failed: {len(bad)} of {len(outcomes)} (logs in {work})")
    passed = sum(o.passed for o in outcomes)
    failed = sum(o.failed or int(o.code != 0) for o in outcomes)
    print(run.counts(passed, failed, sum(o.skipped for o in outcomes)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
