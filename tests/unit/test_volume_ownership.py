"""Whom a sandbox's root is in a volume (issue 43, `volumes.ownership`): the directory's owner
through an ID-mapped mount on a root server, never host root without the server's opt-in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from osb_sync.local.host import identity, volumes

ROOT_SERVER = identity.IdRange(165536, 165536)
USER_SERVER = identity.IdRange(300000, 300000, helpers=("/usr/bin/newuidmap", "/usr/bin/newgidmap"))


@pytest.mark.parametrize("read_only", [False, True])
def test_an_ordinary_owner_is_mapped_and_said(read_only: bool) -> None:
    mapped, note = volumes.ownership((1000, 1001), read_only, "data", False, ROOT_SERVER)
    assert mapped == (1000, 1001)
    assert "'data' is ID-mapped" in note and "uid 1000, gid 1001" in note


@pytest.mark.parametrize("owner", [(0, 0), (0, 1001), (1000, 0)])
def test_host_root_is_never_mapped_without_the_opt_in(owner: tuple[int, int]) -> None:
    mapped, note = volumes.ownership(owner, False, "data", False, ROOT_SERVER)
    assert mapped is None
    assert "NOT writable by the sandbox's root" in note
    assert "chown" in note and "--volume-root-is-host-root" in note
    # read-only, nothing is refused: no note
    assert volumes.ownership(owner, True, "data", False, ROOT_SERVER) == (None, "")


def test_host_root_is_mapped_under_the_opt_in_and_said_loudly() -> None:
    mapped, note = volumes.ownership((0, 0), False, "data", True, ROOT_SERVER)
    assert mapped == (0, 0)
    assert "host ROOT (--volume-root-is-host-root)" in note


@pytest.mark.parametrize("owner", [(165536, 165536), (165536, 0), (165536, 1000)])
def test_a_directory_the_sandboxes_root_owns_already_needs_no_map(owner: tuple[int, int]) -> None:
    for host_root in (False, True):
        assert volumes.ownership(owner, False, "data", host_root, ROOT_SERVER) == (None, "")


def test_a_server_that_is_not_root_maps_nothing_and_says_so() -> None:
    mapped, note = volumes.ownership((1000, 1000), False, "data", True, USER_SERVER)
    assert mapped is None
    assert "not ID-mapped (only a server running as root" in note
    assert "host uid 300000" in note
    assert volumes.ownership((1000, 1000), True, "data", True, USER_SERVER) == (None, "")


def test_without_isolation_there_is_nothing_to_map() -> None:
    assert volumes.ownership((0, 0), False, "data", True, None) == (None, "")


def test_a_set_id_file_anywhere_below_is_found_and_a_link_to_one_is_not(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "plain").write_text("x")
    outside = tmp_path.parent / f"{tmp_path.name}-setid"
    outside.write_text("x")
    outside.chmod(0o2755)
    (tmp_path / "a" / "link").symlink_to(outside)  # the volume has the link, not the file
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        assert volumes.privileged_file(fd) is None
        (tmp_path / "a" / "b" / "tool").write_text("x")
        (tmp_path / "a" / "b" / "tool").chmod(0o4755)
        assert volumes.privileged_file(fd) == "a/b/tool"
    finally:
        os.close(fd)
        outside.unlink()


def test_a_tree_too_deep_to_look_at_is_said_so_not_a_crash(tmp_path: Path) -> None:
    # A sandbox sharing a pvc can nest directories deeper than a recursive walk goes (or
    # than the server's descriptors reach): the volume is then not one the server checked.
    for depth in range(1, 1501):  # (os.makedirs recurses too)
        tmp_path.joinpath(*["d"] * depth).mkdir()
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        found = volumes.privileged_file(fd)
    finally:
        os.close(fd)
        for depth in range(1500, 0, -1):
            tmp_path.joinpath(*["d"] * depth).rmdir()
    assert found is not None and found.startswith("d/d/d/"), found


def test_only_a_file_of_an_id_the_mount_maps_counts(tmp_path: Path) -> None:
    (tmp_path / "tool").write_text("x")
    (tmp_path / "tool").chmod(0o4755)
    info = (tmp_path / "tool").stat()
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        assert volumes.privileged_file(fd, lambda uid, gid: False) is None
        seen: list[tuple[int, int]] = []
        assert volumes.privileged_file(fd, lambda *ids: not seen.append(ids)) == "tool"
        assert seen == [(info.st_uid, info.st_gid)]
    finally:
        os.close(fd)
