"""Files as a user on the local server (issue 45; execd 1.1.1, #2070): every file route under
``/v1/filesystem/{uid}/{gid}``, served with the kernel checking paths as that user."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from osb_sync import ApiError, Client, ConfigurationError, Sandbox
from osb_sync.local import LocalServer
from tests.local.support import Box

OTHER = 1000  # a uid and gid every isolated sandbox maps, not root


@pytest.fixture
def sandbox(local: LocalServer) -> Iterator[Sandbox]:
    with Client(local.api_base) as client, client.create_sandbox() as created:
        yield created


def test_files_as_a_user_are_theirs_and_checked_as_theirs(sandbox: Sandbox) -> None:
    sandbox.commands.run("mkdir -p shared && chmod 777 shared && echo secret > root-only")
    sandbox.commands.run("chmod 600 root-only")
    as_other = sandbox.files_as(OTHER, OTHER)
    as_other.write("shared/mine.txt", "hello\n")
    owner = sandbox.commands.run("stat -c %u:%g shared/mine.txt").stdout
    assert owner == f"{OTHER}:{OTHER}\n"
    assert as_other.read_text("shared/mine.txt") == "hello\n"
    assert as_other.read_text("shared/mine.txt", offset=1) == "hello"
    with pytest.raises(ApiError) as denied:
        as_other.read_text("root-only")
    assert denied.value.status_code >= 400
    with pytest.raises(ApiError):
        as_other.read_text("shared/../root-only")  # a `..` is the kernel's: checked as the user
    assert sandbox.files_as(0, 0).read_text("root-only") == "secret\n"
    assert sandbox.files.read_text("root-only") == "secret\n"  # the daemon's identity is back
    assert repr(as_other) == f"Files(uid={OTHER}, gid={OTHER})"


@pytest.mark.parametrize("uid", [-1, 4294967295, True, "0", 1.0])
def test_the_client_refuses_a_bad_identity(sandbox: Sandbox, uid: object) -> None:
    with pytest.raises(ConfigurationError, match="uid must be an int"):
        sandbox.files_as(uid, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "uid", ["abc", "-1", "4294967295", "1.5", "..", "%2e%2e", "0x10", "\uff11"]
)  # the last: a fullwidth one
def test_the_route_refuses_a_bad_identity(box: Box, uid: str) -> None:
    answer = box.call("GET", f"/v1/filesystem/{uid}/0/files/info", params={"path": "."})
    assert answer.status_code in (400, 404), answer.text  # 404: a path the router never matches
    if answer.status_code == 400:
        assert answer.json()["code"] == "INVALID_REQUEST_BODY" and "invalid uid" in answer.text


def test_an_unmapped_identity_is_unavailable(box: Box) -> None:
    answer = box.call("GET", "/v1/filesystem/4000000000/0/files/info", params={"path": "."})
    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "FILESYSTEM_IDENTITY_UNAVAILABLE"
    again = box.call("GET", "/files/info", params={"path": "."})
    assert again.status_code == 200  # the thread took its own identity back
