"""Which entrypoint a local sandbox runs (`local/host/entrypoint.py`): OpenSandbox's rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from osb_sync.local.host import entrypoint
from osb_sync.local.host.images.config import ImageConfig
from osb_sync.local.host.images.rootfs import ImageView
from osb_sync.local.host.images.store import StoredImage


def _image(entry: tuple[str, ...], cmd: tuple[str, ...]) -> ImageView:
    config = ImageConfig(entrypoint=entry, cmd=cmd)
    stored = StoredImage("sha256:0", "x/y:1", Path("/nonexistent"), config, "/usr/bin/python3", 0)
    return ImageView(stored)


def test_the_creates_entrypoint_replaces_the_images_entrypoint_and_cmd() -> None:
    image = _image(("/docker-entrypoint.sh",), ("nginx", "-g", "daemon off;"))
    assert entrypoint.command({"entrypoint": ["sleep", "9"]}, image) == ["sleep", "9"]


def test_without_one_the_image_runs_its_entrypoint_then_cmd() -> None:
    image = _image(("/docker-entrypoint.sh",), ("nginx", "-g", "daemon off;"))
    assert entrypoint.command({}, image) == ["/docker-entrypoint.sh", "nginx", "-g", "daemon off;"]
    assert entrypoint.command({}, _image((), ("bash",))) == ["bash"]
    assert entrypoint.command({}, _image((), ())) is None


def test_a_one_string_entrypoint_with_spaces_is_split_as_a_shell_would() -> None:
    assert entrypoint.command({"entrypoint": ["sh -c 'exit 7'"]}, None) == ["sh", "-c", "exit 7"]
    assert entrypoint.command({"entrypoint": ["/bin/sh"]}, None) == ["/bin/sh"]


@pytest.mark.parametrize("built_in", [list(b) for b in entrypoint.BUILT_IN])
def test_the_built_in_entrypoints_start_nothing_in_any_sandbox(built_in: list[str]) -> None:
    assert entrypoint.command({"entrypoint": built_in}, None) is None
    assert entrypoint.command({"entrypoint": built_in}, _image(("x",), ())) is None
    assert entrypoint.command({}, None) is None
