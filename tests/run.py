"""The test command: every tox env, then what did not run and why, and a pytest-shaped total.

    python tests/run.py [-e ENV[,ENV...]]

Standard library only, so it runs before anything is installed. In order, it:

- installs tox into this interpreter when it lacks it (into a venv under
  ``$XDG_CACHE_HOME/osb-sync/tox`` where the interpreter refuses packages); tox installs the
  package and its test extras into each env;
- where pyenv is on ``PATH``, adds to ``PYENV_VERSION`` the Python 3.11, 3.10, 3.12 and 3.13
  it has and the variable lacks (CI's: ``3.11.7:3.10.13:3.12.1:3.13.0``);
- under ``CI=true``: installs the Debian packages the isolation, real-execd, shared-pool and
  image suites need (``DEBIAN_PACKAGES``) with apt-get, sets ``OSB_REQUIRE_ISOLATION=1``,
  ``OSB_REQUIRE_REAL_EXECD=1``, ``OSB_REQUIRE_REDIS=1`` and ``OSB_REQUIRE_IMAGES=1`` (a suite
  that cannot run fails instead of skipping), and a missing interpreter fails; elsewhere a
  missing interpreter is a skip line;
- finds the real execd (``$OSB_REAL_EXECD_DIR``, else ``shared/opensandbox-execd`` beside the
  repository or beside one of its parents) and builds run-execd's Jupyter venv once, before
  the two envs that share it start at the same time;
- runs ``tox run-parallel``, which prints one line per env that passed and the whole output of
  one that failed;
- prints one line per env (pytest's counts from the junit file each env writes to
  ``{envtmpdir}/junit.xml``, and its time), one line per suite that skipped tests and why, the
  ``apt-get install`` line that would enable the isolation suites where their commands are
  missing, and last ``N passed, N failed, N skipped``.

A skip by design (``BY_DESIGN``: a fault-matrix cell that does not apply, a doc block marked
``.. skip-block``, a suite that runs in its own env...) is counted but is no sign that a suite
did not fully run. Under ``CI=true`` any other skip fails the command.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOX_WORK_DIR = ROOT / ".tox"
RESULTS = TOX_WORK_DIR / "run-results.json"
JUNIT = "tmp/junit.xml"  # in each env's folder: tox.ini writes {envtmpdir}/junit.xml
# pyenv versions, in PYENV_VERSION's order (the first is `python`): CI's exact ones, else the
# newest patch release pyenv has of each
PYENV_WANTED = ("3.11.7", "3.10.13", "3.12.1", "3.13.0")
# command -> the Debian package that brings it: bwrap isolates local sandboxes, slirp4netns
# gives them a network, nft and ip keep it from the host's own addresses, run-execd waits for
# the real execd with curl, the shared-pool tests start redis-server, the image tests run
# loopback registries (docker-registry), push with skopeo (which the local server pulls
# with), build bullseye and bookworm (Jupyter) images with mmdebstrap, an image without
# python3 from the static busybox, and sign their token registry's tokens with openssl
DEBIAN_PACKAGES = {
    "bwrap": "bubblewrap",
    "slirp4netns": "slirp4netns",
    "nft": "nftables",
    "ip": "iproute2",
    "curl": "curl",
    "redis-server": "redis-server",
    "skopeo": "skopeo",
    "docker-registry": "docker-registry",
    "mmdebstrap": "mmdebstrap",
    "openssl": "openssl",
    "busybox": "busybox-static",
    "newuidmap": "uidmap",  # a server run by an ordinary user maps its range (test_non_root)
}
EXECD_DIR_ENV = "OSB_REAL_EXECD_DIR"
JUPYTER_VENV_ENV = "OSB_EXECD_JUPYTER_VENV"
REASONS_SHOWN = 4  # per suite; the rest are counted, and listed in its junit file
REASON_CHARS = 160
# The envs whose own purpose is a module that other envs lack.
OWN_ENV = {
    "flask": "flask",
    "gunicorn": "flask",
    "django": "django",
    "deepagents_code": "deepagents",
    "opensandbox": "sdk",
}


@dataclass(frozen=True)
class ByDesign:
    """Skips that are deliberate: the test does not apply in that env, or runs elsewhere."""

    label: str
    pattern: re.Pattern[str]

    def matches(self, env: str, reason: str) -> bool:
        found = self.pattern.search(reason)
        if found is None:
            return False
        module = found.groupdict().get("module")
        return module is None or OWN_ENV.get(module) != env  # in its own env: it is missing


BY_DESIGN = (
    ByDesign("fault-matrix cells that do not apply", re.compile(r"^n/a: ")),
    ByDesign("doc blocks marked .. skip-block", re.compile(r"^\S+:\d+ marked: ")),
    ByDesign(
        "suites of the flask, django, deepagents and sdk envs",
        re.compile(
            r"^could not import '(?P<module>flask|gunicorn|django|deepagents_code|opensandbox)'"
        ),
    ),
    ByDesign(
        "the opt-in real-server suite (tox -e realserver, on a machine with Docker)",
        re.compile(r"^OSB_REAL_SERVER is not set"),
    ),
    ByDesign("tests of our own execd's behaviour", re.compile(r"^our execd only: ")),
    ByDesign(
        "the real execd in images, run by tox -e realexecd only",
        re.compile(r"^runs in tox -e realexecd: "),
    ),
    ByDesign("TOML checks on Python 3.10, which lacks tomllib", re.compile(r"needs Python 3\.11$")),
)


@dataclass
class EnvReport:
    """What one tox env did."""

    name: str
    status: str  # OK, FAIL or SKIP (its interpreter is missing)
    seconds: float = 0.0
    has_tests: bool = False  # it ran pytest and left its junit file
    passed: int = 0
    failed: int = 0  # failures and errors
    skips: list[str] = field(default_factory=list)  # the reason of each skip
    note: str = ""

    def by_design(self) -> Counter[str]:
        return Counter(label for r in self.skips if (label := design_label(self.name, r)))

    def not_run(self) -> Counter[str]:
        return Counter(r for r in self.skips if design_label(self.name, r) is None)

    def counted_failures(self) -> int:
        """Its failed tests; 1 for an env that failed outside pytest (mypy, a setup step)."""
        return self.failed or int(self.status == "FAIL")


def design_label(env: str, reason: str) -> str | None:
    """The BY_DESIGN label that explains a skip in `env`, or None."""
    return next((d.label for d in BY_DESIGN if d.matches(env, reason)), None)


def read_junit(path: Path) -> tuple[int, int, list[str]]:
    """Passed and failed (failures and errors) tests, and each skip's reason, of a junit file."""
    passed = failed = 0
    skips = []
    for case in ET.parse(path).iter("testcase"):
        kinds = {child.tag: child for child in case}
        if "failure" in kinds or "error" in kinds:
            failed += 1
        elif "skipped" in kinds:
            skips.append(skip_reason(kinds["skipped"]))
        else:
            passed += 1
    return passed, failed, skips


def skip_reason(skipped: ET.Element) -> str:
    """The reason of a junit ``<skipped>``; a module skipped at collection (``importorskip``)
    has it in its text, as ``('path', line, 'Skipped: reason')``."""
    message = (skipped.get("message") or "").strip()
    if message == "collection skipped":
        try:
            _, _, text = ast.literal_eval((skipped.text or "").strip())
            return str(text).removeprefix("Skipped: ").strip()
        except (ValueError, SyntaxError, TypeError):
            return (skipped.text or message).strip()
    return message or "(no reason given)"


def env_reports(order: list[str], results: dict[str, Any], work_dir: Path) -> list[EnvReport]:
    """One report per env of `order` that tox's --result-json file `results` describes."""
    reports = []
    testenvs = results.get("testenvs", {})
    for name in order:
        result = testenvs.get(name, {}).get("result")
        if result is None:
            reports.append(EnvReport(name, "FAIL", note="tox gave no result"))
            continue
        status = "SKIP" if result.get("skipped") else "OK" if result.get("success") else "FAIL"
        report = EnvReport(name, status, float(result.get("duration") or 0.0))
        junit = work_dir / name / JUNIT
        if status != "SKIP" and junit.is_file():
            report.has_tests = True
            report.passed, report.failed, report.skips = read_junit(junit)
        reports.append(report)
    return reports


def duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def counts(passed: int, failed: int, skipped: int) -> str:
    return f"{passed} passed, {failed} failed, {skipped} skipped"


def env_line(report: EnvReport, descriptions: Mapping[str, str]) -> tuple[str, str, str, str]:
    """The columns of an env's line: name, status, what it did, its time."""
    if report.status == "SKIP":
        return report.name, report.status, report.note or "not run: no interpreter", ""
    if report.has_tests:
        what = counts(report.passed, report.failed, len(report.skips))
        if designed := sum(report.by_design().values()):
            what += f" ({designed} by design)"
        if report.status == "FAIL" and not report.failed:
            what += "; a command outside pytest failed (its output is above)"
    elif report.status == "OK":
        what = descriptions.get(report.name) or "no pytest in this env"
    else:
        what = report.note or "failed (its output is above)"
    return report.name, report.status, what, duration(report.seconds)


def not_run_line(report: EnvReport) -> str | None:
    """`conformance: 25 skipped: <why>`, or None for a suite that fully ran."""
    if report.status == "SKIP":
        return f"{report.name}: {report.note or 'not run: its interpreter is missing'}"
    missing = report.not_run()
    if not missing:
        return None
    groups = [f"{n} skipped: {cut(why)}" for why, n in missing.most_common(REASONS_SHOWN)]
    rest = sum(missing.values()) - sum(n for _, n in missing.most_common(REASONS_SHOWN))
    if rest:
        groups.append(f"{rest} more skipped ({TOX_WORK_DIR.name}/{report.name}/{JUNIT})")
    return f"{report.name}: " + " | ".join(groups)


def cut(reason: str) -> str:
    """A skip reason on one line, at most REASON_CHARS long."""
    reason = " ".join(reason.split())
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 3] + "..."


def summary(
    reports: list[EnvReport],
    missing_packages: list[str],
    ci: bool,
    descriptions: Mapping[str, str] | None = None,
) -> list[str]:
    """The closing lines: one per env, one per suite that did not fully run, the total."""
    rows = [env_line(r, descriptions or {}) for r in reports]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(4)]
    lines = ["", "Summary (one line per tox env):"]
    for name, status, what, took in rows:
        columns = [name.ljust(widths[0]), status.ljust(widths[1]), took.rjust(widths[3]), what]
        lines.append("  ".join(columns).rstrip())
    designed: Counter[str] = Counter()
    for report in reports:
        designed.update(report.by_design())
    if designed:
        lines.append(
            "Skipped by design: " + ", ".join(f"{label} ({n})" for label, n in designed.items())
        )
    not_run = [line for r in reports if (line := not_run_line(r))]
    if not_run:
        lines.append(
            "Did not fully run:" + (" (CI=true: each of these fails the run)" if ci else "")
        )
        lines += [f"  {line}" for line in not_run]
    if missing_packages and not_run and not ci:
        sudo = "" if os.geteuid() == 0 else "sudo "
        lines.append(
            "  to run the isolation suites here (Debian, Ubuntu): "
            f"{sudo}apt-get install {' '.join(missing_packages)}"
        )
    tested = [r for r in reports if r.has_tests]
    lines.append(
        counts(
            sum(r.passed for r in tested),
            sum(r.counted_failures() for r in reports),
            sum(len(r.skips) for r in tested),
        )
    )
    return lines


# -- set-up ---------------------------------------------------------------------------------------


def say(message: str) -> None:
    print(f"{Path(sys.argv[0]).name}: {message}", flush=True)


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes")


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def ensure_tox() -> list[str]:
    """The command that runs tox, installed first when this interpreter lacks it."""
    if importlib.util.find_spec("tox") is not None:
        return [sys.executable, "-m", "tox"]
    say("installing tox (pip install tox)")
    pip = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "tox"]
    if subprocess.run([sys.executable, *pip], check=False).returncode == 0:
        return [sys.executable, "-m", "tox"]
    venv = cache_dir() / "osb-sync" / "tox"  # e.g. a system Python that is externally managed
    say(f"this interpreter refused it; installing tox into {venv}")
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), *pip], check=True)
    return [str(python), "-m", "tox"]


def pyenv_version(current: str | None) -> str | None:
    """A PYENV_VERSION that puts each wanted minor version on PATH, or None when `current`
    (the variable as it is) does already, or there is no pyenv.

    `current`'s versions stay first: pyenv's shim sets the variable to the one version it ran
    (``3.11.7``) even where nobody set it, so it cannot tell that nobody did.
    """
    if shutil.which("pyenv") is None:
        return None
    listed = subprocess.run(
        ["pyenv", "versions", "--bare"], capture_output=True, text=True, check=False
    ).stdout.split()
    kept = [v for v in (current or "").split(":") if v]
    added = []
    for wanted in PYENV_WANTED:
        minor = wanted.rsplit(".", 1)[0]
        if any(re.fullmatch(rf"{re.escape(minor)}(\.\d+)?", v) for v in kept):
            continue
        same = [v for v in listed if re.fullmatch(rf"{re.escape(minor)}\.\d+", v)]
        if wanted in same:
            added.append(wanted)
        elif same:
            added.append(max(same, key=lambda v: int(v.rsplit(".", 1)[1])))
    return ":".join(kept + added) if added else None


def missing_debian_packages() -> list[str]:
    return [package for command, package in DEBIAN_PACKAGES.items() if not shutil.which(command)]


def install_debian_packages(packages: list[str]) -> None:
    """apt-get install `packages` (CI: root on Debian); raises SystemExit when it cannot."""
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if shutil.which("apt-get") is None:
        raise SystemExit(f"tests/run.py: CI=true needs {', '.join(packages)}, and no apt-get")
    say(f"installing {' '.join(packages)} (apt-get)")
    quiet = {"stdout": subprocess.DEVNULL}
    subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, **quiet)
    install = [*sudo, "apt-get", "install", "-y", "-qq", *packages]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(install, check=True, env=env, **quiet)


def real_execd_dir() -> Path | None:
    """run-execd's folder (the rule of tests/conformance/execds.py, which cannot be imported
    before the test extras are installed)."""
    if os.environ.get(EXECD_DIR_ENV):
        return Path(os.environ[EXECD_DIR_ENV])
    for parent in ROOT.parents:
        candidate = parent / "shared" / "opensandbox-execd"
        if (candidate / "run-execd").is_file():
            return candidate
    return None


def build_jupyter_venv(folder: Path, env: dict[str, str]) -> str | None:
    """Start and stop the real execd once, so that run-execd builds its Jupyter venv now and
    not in two envs at once; None, or why it failed."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None  # the suites say why they skip
    if shutil.which("curl") is None or not os.access(folder / "run-execd", os.X_OK):
        return None
    say(f"preparing the real execd ({folder / 'run-execd'}; its Jupyter venv, once)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = str(folder / "run-execd")
    with tempfile.TemporaryDirectory(prefix="osb-execd-") as scratch:
        state = str(Path(scratch) / "execd")
        try:
            started = subprocess.run(
                [script, "start", state, str(port)],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return "run-execd start took over 600 s"
        finally:
            subprocess.run(
                [script, "stop", state], env=env, capture_output=True, timeout=60, check=False
            )
    if started.returncode != 0:
        return f"run-execd start failed: {started.stderr.strip()[-2000:]}"
    return None


def tox_config() -> tuple[list[str], dict[str, str]]:
    """tox.ini's envlist, and the description of each env (one line)."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(ROOT / "tox.ini")
    envlist = [e for e in re.split(r"[,\s]+", config.get("tox", "envlist")) if e]
    descriptions = {
        section.split(":", 1)[1]: " ".join(config.get(section, "description").split())
        for section in config.sections()
        if section.startswith("testenv:") and config.has_option(section, "description")
    }
    return envlist, descriptions


def missing_interpreters(tox: list[str], envs: list[str], env: dict[str, str]) -> dict[str, str]:
    """The base_python that tox could not find, per env it skipped."""
    if not envs:
        return {}
    shown = subprocess.run(
        [*tox, "config", "-e", ",".join(envs), "-k", "base_python"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    ).stdout
    found = re.findall(r"^\[testenv:(\S+)\]\s*^base_python = (.+)$", shown, re.MULTILINE)
    return {name: interpreter_name(python.strip()) for name, python in found}


def interpreter_name(base_python: str) -> str:
    """``python3.13`` for tox's ``py313``; other names as they are."""
    short = re.fullmatch(r"py3(\d+)", base_python)
    return f"python3.{short.group(1)}" if short else base_python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("-e", "--envs", help="tox envs, comma-separated (default: all)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    ci = truthy(os.environ.get("CI"))
    env = dict(os.environ)
    if versions := pyenv_version(env.get("PYENV_VERSION")):
        env["PYENV_VERSION"] = versions
        say(f"PYENV_VERSION={versions}")
    tox = ensure_tox()
    missing = missing_debian_packages()
    if ci:
        if missing:
            install_debian_packages(missing)
            missing = missing_debian_packages()
        for required in ("ISOLATION", "REAL_EXECD", "REDIS", "IMAGES"):
            env.setdefault(f"OSB_REQUIRE_{required}", "1")
    folder = real_execd_dir()
    env.setdefault(JUPYTER_VENV_ENV, str(cache_dir() / "osb-execd-jupyter"))
    if folder is not None:
        env[EXECD_DIR_ENV] = str(folder.resolve())
        problem = build_jupyter_venv(folder, env)
        if problem and ci:
            say(problem)
            return 1
        if problem:
            say(f"{problem} (the real-execd suites will say so)")
    envlist, descriptions = tox_config()
    order = args.envs.split(",") if args.envs else envlist
    RESULTS.unlink(missing_ok=True)
    for name in order:
        (TOX_WORK_DIR / name / JUNIT).unlink(missing_ok=True)
    command = [*tox, "run-parallel", "--parallel-no-spinner", "--result-json", str(RESULTS)]
    command += ["--skip-missing-interpreters", "false" if ci else "true", "-e", ",".join(order)]
    say("tox " + " ".join(command[len(tox) :]))
    # unbuffered: a log (CI's) gets each env's line when it ends, not in blocks
    code = subprocess.run(
        command, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=ROOT, check=False
    ).returncode
    if not RESULTS.is_file():
        say(f"tox wrote no results (exit status {code})")
        return code or 1
    reports = env_reports(order, json.loads(RESULTS.read_text()), TOX_WORK_DIR)
    skipped = [r.name for r in reports if r.status == "SKIP"]
    for name, python in missing_interpreters(tox, skipped, env).items():
        report = next(r for r in reports if r.name == name)
        report.note = f"not run: no {python} interpreter found (CI=true fails on it)"
    lines = summary(reports, missing, ci, descriptions)
    lines.insert(-1, f"Wall time: {duration(time.monotonic() - started)}")
    print("\n".join(lines), flush=True)
    if ci and any(not_run_line(r) for r in reports):
        return code or 1
    return code


if __name__ == "__main__":
    sys.exit(main())
