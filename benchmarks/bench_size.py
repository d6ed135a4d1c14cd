"""Footprint, part 2: installed size of each client with its dependencies, in fresh venvs.

Each install goes into its own new virtualenv (``python -m venv --without-pip``, then
``pip --python <venv> install``); the size is that of its site-packages (``du -sb``
equivalent, ``__pycache__`` included as pip writes it), and the distributions are counted.
This one uses the network to reach the package registry (pip), nothing else.

    python benchmarks/bench_size.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import report

REPO = str(Path(__file__).resolve().parents[1])
INSTALLS = {
    "osb_sync": [REPO],
    "requests": ["requests"],
    "opensandbox": ["opensandbox==1.1.1", "opensandbox-code-interpreter==1.1.1"],
    "litellm": ["litellm==1.110.2"],
}


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def measure(name: str, packages: list[str], base: Path) -> dict[str, object]:
    venv = base / name
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = next((venv / "lib").glob("python*/site-packages"))
    empty = tree_bytes(site)
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", *packages]
    subprocess.run(cmd, check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    dists = sorted(p.name.split("-")[0] for p in site.glob("*.dist-info"))
    size = tree_bytes(site) - empty
    return {"bytes": size, "MB": round(size / 1e6, 1), "distributions": len(dists), "names": dists}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="osb-footprint-") as tmp:
        sizes = {name: measure(name, pkgs, Path(tmp)) for name, pkgs in INSTALLS.items()}
    mine = sizes["osb_sync"]["bytes"]
    for values in sizes.values():
        values["vs_osb_sync"] = round(int(values["bytes"]) / int(mine), 2)  # type: ignore[call-overload]
    report("installed_size", {"sizes": sizes}, args.json)


if __name__ == "__main__":
    main()
