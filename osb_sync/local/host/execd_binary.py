"""Bring your own execd: a sandbox's container runs an execd binary (and a Jupyter server).

`LocalServer(execd=..., jupyter=...)` (`osb-sync serve --execd PATH --jupyter PATH`) replaces
our Python execd in every container with that binary, started as OpenSandbox starts it:
`--port 44772`, the access token in `EXECD_ACCESS_TOKEN`. With `jupyter` (the `jupyter`
executable of a venv holding `notebook` and `ipykernel`, with a kernelspec named `python`) a
Jupyter server starts first, the way the official code-interpreter image's entrypoint does,
and execd finds it through `JUPYTER_HOST` and `JUPYTER_TOKEN`. The binary, the venv and the
interpreter the venv was made from (`home` in its `pyvenv.cfg`) are bound read-only into the
container at their own paths. The binary needs an isolated container: execd listens on every
interface of its fixed port, which only a private network namespace keeps to itself.

In a sandbox that runs an image (`images/`) the binary is bound at `IMAGE_EXECD_PATH`, where
OpenSandbox's Docker runtime puts it, and the server's `jupyter` venv is not bound (its
interpreter's directory would cover the image's own): the Jupyter server is the image's own
where it has one (`for_image`), else none. `execd_image` (`images/execd_image.py`) gives a
binary taken from an image instead of a path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

IMAGE_EXECD_PATH = "/opt/opensandbox/execd"


@dataclass(frozen=True)
class ExecdBinary:
    """An execd binary to run in every sandbox, and optionally the `jupyter` behind it."""

    execd: str
    jupyter: str | None = None
    source: str = ""  # where it came from, when not a path given (`execd_image`'s reference)
    in_image: bool = False  # for a sandbox of an image: `jupyter` is the image's own path

    @classmethod
    def checked(
        cls, execd: str | os.PathLike[str], jupyter: str | os.PathLike[str] | None = None
    ) -> ExecdBinary:
        """The absolute paths, once checked.

        Args:
            execd: the execd binary.
            jupyter: the `jupyter` executable of a venv with `notebook` and `ipykernel`.

        Raises:
            ValueError: a path is not an executable file, or `jupyter` is not in a venv.
        """
        binary = _executable(execd, "execd")
        if jupyter is None:
            return cls(binary)
        return cls(binary, checked_jupyter(jupyter))

    def for_image(self, jupyter: str | None) -> ExecdBinary:
        """This binary in a sandbox of an image whose `jupyter` (container path) is given."""
        return replace(self, jupyter=jupyter, in_image=True)

    @property
    def command(self) -> str:
        """The binary's path inside the container."""
        return IMAGE_EXECD_PATH if self.in_image else self.execd

    def read_only_paths(self) -> list[str]:
        """What the container must see: the binary, the venv and the venv's interpreter."""
        paths = [self.execd]
        if self.jupyter is not None and not self.in_image:
            venv = Path(self.jupyter).parent.parent
            paths += [str(venv), str(_venv_home(venv).parent)]
        return paths

    def status_note(self) -> str:
        """What a create's status message says about the sandbox's execd."""
        origin = f" from {self.source}" if self.source else ""
        if not self.jupyter:
            jupyter = ", no Jupyter (run_code answers execd's error)"
        elif self.in_image:
            jupyter = f", the image's Jupyter {self.jupyter}"
        else:
            jupyter = f", Jupyter {self.jupyter}"
        return f" execd: {self.command}{origin}{jupyter}."

    def bwrap_args(self) -> list[str]:
        """`--ro-bind` arguments for `read_only_paths`, each at its own path (in an image: the
        binary at `IMAGE_EXECD_PATH`)."""
        if self.in_image:
            return ["--ro-bind", self.execd, IMAGE_EXECD_PATH]
        args: list[str] = []
        for path in self.read_only_paths():
            args += ["--ro-bind", path, path]
        return args


def checked_jupyter(jupyter: str | os.PathLike[str]) -> str:
    """The absolute path of `jupyter`, once checked to be the executable of a venv.

    Raises:
        ValueError: it is not an executable file, or not in a venv.
    """
    notebook = _executable(jupyter, "jupyter")
    _venv_home(Path(notebook).parent.parent)
    return notebook


def _executable(path: str | os.PathLike[str], what: str) -> str:
    full = Path(path).expanduser().absolute()
    if not full.is_file() or not os.access(full, os.X_OK):
        raise ValueError(f"{what} {str(full)!r} is not an executable file")
    return str(full)


def _venv_home(venv: Path) -> Path:
    """The `bin` directory of the interpreter a venv was made from (its pyvenv.cfg `home`)."""
    try:
        lines = (venv / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        raise ValueError(
            f"jupyter must be the bin/jupyter of a venv; {venv / 'pyvenv.cfg'} cannot be read"
        ) from None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(value.strip()).resolve()
    raise ValueError(f"{venv / 'pyvenv.cfg'} names no home interpreter")
