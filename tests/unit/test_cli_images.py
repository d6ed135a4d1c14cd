"""The image commands' parsing and progress (no registry: tests/local/test_cli_images.py)."""

from __future__ import annotations

import io

import pytest

from osb_sync._cli import build_parser
from osb_sync._cli_images import PullProgress
from osb_sync._cli_options import VERBS, ImagesOptions, PullOptions


@pytest.mark.parametrize("verb", [["run", "print(1)"], ["create"]])
def test_image_is_the_same_flag_as_template(verb: list[str]) -> None:
    parser = build_parser()
    by_image = parser.parse_args([verb[0], "--image", "python:3.12", *verb[1:]])
    by_template = parser.parse_args([verb[0], "--template", "python:3.12", *verb[1:]])
    assert by_image.template == by_template.template == "python:3.12"


def test_images_prune_and_pull_parse_with_the_stores_flags() -> None:
    parser = build_parser()
    listing = parser.parse_args(["images", "--image-store", "/s"])
    assert VERBS[listing.command].handler == "cmd_images"
    images = ImagesOptions.of(listing)
    assert images.images_action is None and images.store.keywords["image_store"] == "/s"
    assert "registry_auth_file" not in images.store.keywords  # not a flag of images
    prune = ImagesOptions.of(parser.parse_args(["images", "prune", "--image-store", "/s"]))
    assert prune.images_action == "prune" and prune.store.keywords["image_store"] == "/s"
    args = ["pull", "x:1", "--insecure-registry", "r:5000", "--platform", "linux/arm64"]
    got = parser.parse_args(args)
    assert VERBS[got.command].handler == "cmd_pull"
    pull = PullOptions.of(got)
    assert (pull.image, pull.platform) == ("x:1", "linux/arm64")
    assert list(pull.store.keywords["insecure_registries"]) == ["r:5000"]


def test_a_terminal_gets_a_bar_redrawn_in_place() -> None:
    stream = io.StringIO()
    shown = PullProgress("x:1", stream, terminal=True)
    shown("download", 0, 1000)
    shown("download", 500, 1000)
    shown("unpack", 0, None)
    shown.end()
    text = stream.getvalue()
    assert "\n" not in text and text.count("\r") == 4
    assert "[" + "#" * 15 + "-" * 15 + "] 500 B of 1000 B" in text
    assert "x:1: unpacking" in text and text.endswith("\r\033[K")


def test_elsewhere_plain_lines_one_per_phase_and_a_few_seconds() -> None:
    stream = io.StringIO()
    shown = PullProgress("x:1", stream, terminal=False)
    for done in range(0, 1000, 100):
        shown("download", done, None)
    shown("unpack", 0, None)
    lines = stream.getvalue().splitlines()
    assert lines == ["x:1: downloading, 0 B", "x:1: downloaded 900 B", "x:1: unpacking"]
