"""Registry credentials from the usual files (issue 48 row 11): only plain ``auths`` entries,
into a private file; helpers named as unsupported; malformed files refused without a value."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest

from osb_sync._cli_options import UsageError
from osb_sync._cli_registry_auth import plain_auths, usual_files, with_usual_credentials

SECRET = "hunter2-secret"
TOKEN = base64.b64encode(f"me:{SECRET}".encode()).decode()


def test_the_usual_files_in_order(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": "/run/user/7", "REGISTRY_AUTH_FILE": "/a"}
    assert usual_files(env) == [
        Path("/a"),
        Path("/run/user/7/containers/auth.json"),
        tmp_path / ".config/containers/auth.json",
        tmp_path / ".docker/config.json",
    ]
    assert usual_files({"HOME": "/h", "DOCKER_CONFIG": "/d"})[-1] == Path("/d/config.json")


def test_plain_entries_are_kept_and_helpers_named(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "auths": {"r.example": {"auth": TOKEN}, "h.example": {}},
                "credsStore": "desktop",
                "credHelpers": {"gcr.io": "gcloud"},
                "proxies": {"default": {"httpProxy": "http://p"}},
            }
        )
    )
    kept, notes = plain_auths(path)
    assert kept == {"r.example": {"auth": TOKEN}}
    assert len(notes) == 2 and all("not supported" in n for n in notes)
    assert "credsStore" in notes[0] and "credHelpers" in notes[1]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"auths": {"r": {"auth": "' + SECRET, "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"auths": ["' + SECRET + '"]}', "'auths' is not an object"),
        ('{"auths": {"r": "' + SECRET + '"}}', "the entry of 'r' is not an object"),
        ('{"auths": {"r": {"auth": "' + SECRET + '"}}}', "not base64 of USER:PASSWORD"),
        ('{"auths": {"r": {"auth": "' + base64.b64encode(b"nocolon").decode() + '"}}}', "base64"),
        (b"\xff\xfe" + SECRET.encode(), "not JSON"),
    ],
)
def test_a_malformed_file_is_refused_naming_it_never_a_value(
    tmp_path: Path, text: str | bytes, why: str
) -> None:
    path = tmp_path / "auth.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UsageError) as info:
        plain_auths(path)
    message = str(info.value)
    assert str(path) in message and why in message
    assert SECRET not in message and SECRET not in repr(info.value)
    # no chained exception (json's quotes the document) shows in a traceback (--debug)
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_the_private_copy_holds_only_plain_entries_and_goes_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "DOCKER_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    docker = tmp_path / ".docker"
    docker.mkdir()
    (docker / "config.json").write_text(
        json.dumps({"auths": {"r.example": {"auth": TOKEN}}, "credsStore": "desktop"})
    )
    with with_usual_credentials({"image_store": "/s"}) as keywords:
        private = Path(keywords["registry_auth_file"])
        assert keywords["image_store"] == "/s"
        assert json.loads(private.read_text()) == {"auths": {"r.example": {"auth": TOKEN}}}
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
        assert stat.S_IMODE(private.parent.stat().st_mode) == 0o700
    assert not private.exists() and not private.parent.exists()
    said = capsys.readouterr()
    assert "credsStore" in said.err and SECRET not in said.err + said.out
    # an explicit --registry-auth-file, or no image asked for: the usual files are not read
    (docker / "config.json").write_text("{broken " + SECRET)
    with with_usual_credentials({"registry_auth_file": "/mine"}) as keywords:
        assert keywords["registry_auth_file"] == "/mine"
    with with_usual_credentials({}, wanted=False) as keywords:
        assert "registry_auth_file" not in keywords
    with pytest.raises(UsageError, match="not JSON"):
        with with_usual_credentials({}):
            pass
