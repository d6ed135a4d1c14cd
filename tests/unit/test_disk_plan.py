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


def test_a_non_root_servers_tmpfs_each_get_their_size() -> None:
    args = bwrap.writable_tmpfs(["/tmp", "/var"], {"/tmp": 1 << 20, "/var": 8192})
    assert args == [
        "--perms",
        "1777",
        "--size",
        str(1 << 20),
        "--tmpfs",
        "/tmp",
        "--size",
        "8192",
        "--tmpfs",
        "/var",
    ]
    assert "--size" not in bwrap.writable_tmpfs(["/tmp"])


@pytest.mark.parametrize(
    ("size", "inodes"), [(4 << 20, 512), (16 << 20, 1000), (1 << 30, 100_000), (10**12, 2**32 - 1)]
)
def test_a_non_root_sandbox_s_limits_are_split_between_its_writable_directories(
    size: int, inodes: int
) -> None:
    shares = disk.split(size, inodes)
    assert set(shares) == set(bwrap.WRITABLE)
    assert sum(b for b, _ in shares.values()) <= size  # all of them: the limit, not 8x
    assert sum(i for _, i in shares.values()) <= inodes
    assert all(b % disk.PAGE == 0 and b > 0 and i >= 8 for b, i in shares.values())
    assert shares["/tmp"][0] >= size * 0.39 and shares[bwrap.SANDBOX_HOME][0] >= size * 0.39
