"""Registry credentials for ``osb-sync run`` and ``osb-sync pull`` from the files docker and
podman users already have, when ``--registry-auth-file`` is not given.

The first of these that exists is read: ``$REGISTRY_AUTH_FILE``,
``$XDG_RUNTIME_DIR/containers/auth.json``, ``~/.config/containers/auth.json``,
``$DOCKER_CONFIG/config.json`` (else ``~/.docker/config.json``). Only its plain ``auths``
entries with an ``auth`` value (base64 of ``USER:PASSWORD``) are kept and written to a private
file (mode 0600 in a 0700 temporary directory, removed when the command ends), which the local
server's skopeo reads with ``--authfile`` (in a private HOME: nothing else of the user's is
read). skopeo sends each entry only to the registry it names, and Go's HTTP client, skopeo's,
does not forward ``Authorization`` on a redirect to another host. Credential helpers
(``credsStore``, ``credHelpers``) are never run: they are named on standard error as
unsupported, with what to do instead. A malformed file is refused naming the file and what is
wrong with it, never a value of it; no credential is logged, printed or put in a message.
``osb-sync serve`` reads none of these: a server others use must not lend them its operator's
own credentials (it takes ``--registry-auth-file`` only).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ._cli_options import UsageError

HELPERS = ("credsStore", "credHelpers")


def usual_files(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where docker and podman keep registry credentials, in the order they are looked for."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or Path.home())
    found = []
    if env.get("REGISTRY_AUTH_FILE"):
        found.append(Path(env["REGISTRY_AUTH_FILE"]))
    if env.get("XDG_RUNTIME_DIR"):
        found.append(Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
    found.append(home / ".config" / "containers" / "auth.json")
    docker = Path(env["DOCKER_CONFIG"]) if env.get("DOCKER_CONFIG") else home / ".docker"
    found.append(docker / "config.json")
    return found


def plain_auths(path: Path) -> tuple[dict[str, dict[str, str]], list[str]]:
    """The usable ``auths`` entries of a credentials file, and what of it is not supported.

    Returns:
        ``{registry: {"auth": BASE64}}`` for each entry with a well-formed ``auth``, and one
        note per credential helper the file names (those registries are not authenticated).

    Raises:
        UsageError: the file cannot be read, is not JSON, or its ``auths`` or an ``auth`` is
            malformed (the message names the file and the registry, never a value).
    """
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot read registry credentials {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):  # its text would be the secret
        raise UsageError(f"registry credentials {path} are not JSON") from None
    if not isinstance(data, dict):
        raise UsageError(f"registry credentials {path} are not a JSON object")
    auths = data.get("auths", {})
    if not isinstance(auths, dict):
        raise UsageError(f"registry credentials {path}: 'auths' is not an object")
    kept = {}
    for registry, entry in auths.items():
        if not isinstance(entry, dict):
            raise UsageError(
                f"registry credentials {path}: the entry of {registry!r} is not an object"
            )
        token = entry.get("auth")
        if token is None:  # docker writes {} for a registry whose secret a helper keeps
            continue
        if not isinstance(token, str) or not _user_password(token):
            raise UsageError(
                f"registry credentials {path}: the 'auth' of {registry!r} is not base64 of "
                "USER:PASSWORD"
            )
        kept[registry] = {"auth": token}
    notes = [
        f"{path}: {key} (credential helpers) are not supported: their registries are asked "
        "without credentials; give one a plain entry, or pass --registry-auth-file"
        for key in HELPERS
        if data.get(key)
    ]
    return kept, notes


def _user_password(token: str) -> bool:
    try:
        decoded = base64.b64decode(token, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    user, sep, _ = decoded.partition(":")
    return bool(sep and user)


@contextlib.contextmanager
def with_usual_credentials(
    keywords: Mapping[str, Any], wanted: bool = True
) -> Iterator[dict[str, Any]]:
    """``keywords`` (LocalServer's image keywords) with ``registry_auth_file`` set, for the
    length of the block, to a private copy of the usual file's plain entries, when it is not
    set, ``wanted`` (an image is asked for: the default one needs no registry) and one of
    :func:`usual_files` exists.

    Raises:
        UsageError: the file found is malformed (:func:`plain_auths`).
    """
    given = dict(keywords)
    found = next((p for p in usual_files() if p.is_file()), None)
    if given.get("registry_auth_file") or found is None or not wanted:
        yield given
        return
    kept, notes = plain_auths(found)
    for note in notes:
        print(f"osb-sync: warning: {note}", file=sys.stderr)
    if not kept:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="osb-sync-auth-") as folder:  # mode 0700
        private = Path(folder) / "auth.json"
        descriptor = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump({"auths": kept}, handle)
        yield {**given, "registry_auth_file": str(private)}
