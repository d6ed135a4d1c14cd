"""How a sandbox's disk is limited where it runs (`disk.mode`) and the bwrap options of a
server that cannot mount a tmpfs of its own: decided without sandboxes."""

from __future__ import annotations

import pytest

from osb_sync.local.host import bwrap, disk, identity


def support(helpers: tuple[str, str] | None, isolated: bool = True) -> bwrap.Support:
    ids = identity.IdRange(100000, 100000, helpers=helpers)
    return bwrap.Support("bwrap" if isolated else None, "", None, False, None, ids)


def test_the_mode_follows_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk, "usable", lambda: True)
    assert disk.mode(support(None), image=False) == "tmpfs"
    assert disk.mode(support(None), image=True) == "tmpfs"  # its layer is on the tmpfs too
    unprivileged = support(("newuidmap", "newgidmap"))
    assert disk.mode(unprivileged, image=False) == "per-directory"
    assert disk.mode(unprivileged, image=True) == "none"  # the image's copy is on disk
    assert disk.mode(support(None, isolated=False), image=False) == "none"
    monkeypatch.setattr(disk, "usable", lambda: False)  # root without CAP_SYS_ADMIN
    assert disk.mode(support(None), image=False) == "none"


def test_a_non_root_servers_tmpfs_each_get_the_size() -> None:
    args = bwrap.writable_tmpfs(["/tmp", "/var"], 1 << 20)
    assert args == [
        "--perms",
        "1777",
        "--size",
        str(1 << 20),
        "--tmpfs",
        "/tmp",
        "--size",
        str(1 << 20),
        "--tmpfs",
        "/var",
    ]
    assert "--size" not in bwrap.writable_tmpfs(["/tmp"])
