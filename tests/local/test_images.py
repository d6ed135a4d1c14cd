"""Sandboxes that run the image asked for, pulled from loopback registries built without Docker.

Needs skopeo, docker-registry and mmdebstrap (skipped without them, unless OSB_REQUIRE_IMAGES=1,
as CI sets). The Debian bullseye image's Python is 3.9, which no test interpreter is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

import osb_sync
from osb_sync.local import LocalServer
from osb_sync.local.host import bwrap, execd_template, recovery
from tests import imagekit
from tests.imagekit import Entry, Image, LoopbackRegistry, layer_bytes, write_layout
from tests.local.support import local_server, registry_of, sandbox_of

MISSING = imagekit.missing_tools() + (["mmdebstrap"] if not shutil.which("mmdebstrap") else [])
if MISSING and not imagekit.REQUIRE_IMAGES:
    pytest.skip(
        f"the image tests need {', '.join(MISSING)} (apt-get install skopeo docker-registry"
        " mmdebstrap); OSB_REQUIRE_IMAGES=1 makes this a failure",
        allow_module_level=True,
    )
PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PULL_FAILED = "DOCKER::SANDBOX_IMAGE_PULL_FAILED"
# Images whose paths lead bwrap out of their root (issue 37, row 2), each with a python3 that is
# found on its PATH but cannot run (no /bin/sh): the create fails once bwrap has made every
# mount and directory, which is all they need ("execvp"), or is refused at once, naming the
# path (CONFIG_INVALID). DECOY is a host directory anyone may write (`decoy`, one per image).
EXECVP, CONFIG_INVALID = "execvp /usr/bin/python3", "IMAGE_CONFIG_INVALID"
ESCAPES = {
    "workdir-dotdot": ([], "/../oldroot/DECOY/workdir", EXECVP),
    "workdir-link": ([Entry("srv", "symlink", target="/oldroot/DECOY")], "/srv/workdir", EXECVP),
    "own-dir-link": ([Entry("opt", "symlink", target="/oldroot/DECOY")], "", EXECVP),
    "mount-point-link": ([Entry("run", "symlink", target="../../oldroot/DECOY")], "", EXECVP),
    # procfs' own link to bwrap's root, where the host's is /oldroot
    "workdir-proc": ([], "/proc/self/root/oldroot/DECOY/workdir", CONFIG_INVALID),
    "workdir-link-proc": (
        [Entry("srv", "symlink", target="/proc/thread-self/root/oldroot/DECOY")],
        "/srv/workdir",
        CONFIG_INVALID,
    ),
    "workdir-file": ([Entry("etc/passwd")], "/etc/passwd/workdir", CONFIG_INVALID),
    # procfs over the image's root, then /dev through its self/root (after the attack, 1)
    "proc-root": (
        [
            Entry("proc", "symlink", target="/"),
            Entry("dev", "symlink", target="/self/root/oldroot/DECOY/dev"),
        ],
        "",
        "the container's root",
    ),
}


@pytest.fixture(scope="module")
def decoy() -> Iterator[Path]:
    """Host directories where "other" may write (as in /tmp), one per image of ESCAPES."""
    path = Path(tempfile.mkdtemp(prefix="osb-decoy-", dir="/tmp"))
    for name in ESCAPES:
        (path / name).mkdir()
        (path / name).chmod(0o777)
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def registries(tmp_path_factory: pytest.TempPathFactory, decoy: Path) -> Iterator[dict[str, Any]]:
    """An anonymous, a basic-auth and a bearer-token registry with the test images pushed."""
    work = tmp_path_factory.mktemp("registries")
    anonymous = LoopbackRegistry(work / "anon").start()
    private = LoopbackRegistry(work / "auth", basic_auth=True).start()
    tokens = imagekit.TokenService(work / "tokens").start()
    bearer = LoopbackRegistry(work / "bearer", token=tokens).start()
    try:
        bullseye = Image(
            [imagekit.rootfs_layer(imagekit.bullseye_tar())],
            env=[PATH, "GREETING=from-the-image"],
            working_dir="/srv/app",
        )
        write_layout(work / "bullseye", "v1", [bullseye])
        deleted = Image(
            [
                *bullseye.layers,
                layer_bytes([Entry("etc/.wh.debian_version"), Entry("srv/app/added", data=b"1")]),
            ],
            env=bullseye.env,
        )
        write_layout(work / "whiteout", "v1", [deleted])
        write_layout(
            work / "armonly", "v1", [Image(bullseye.layers[:0], architecture="s390x")], True
        )
        evil = Image(
            [layer_bytes([Entry("evil", "symlink", target="/"), Entry("evil/x", data=b"")])]
        )
        write_layout(work / "evil", "v1", [evil])
        nopython = Image([layer_bytes([Entry("bin/sh", data=b"", mode=0o755)])])
        write_layout(work / "nopython", "v1", [nopython])
        # its own Entrypoint + Cmd would end the sandbox at once (exit 3)
        ends = Image(
            bullseye.layers,
            env=bullseye.env,
            working_dir="/srv/app",
            entrypoint=["sh", "-c"],
            cmd=["exit 3"],
        )
        write_layout(work / "entry", "v1", [ends])
        # its WorkingDir is under Debian's /var/run -> /run link (an absolute one)
        nobody = Image(bullseye.layers, env=bullseye.env, user="nobody", working_dir="/var/run/app")
        write_layout(work / "nobody", "v1", [nobody])
        workspace = Image(bullseye.layers, env=bullseye.env, working_dir="/workspace/app")
        write_layout(work / "workspace", "v1", [workspace])
        planted = Image([*bullseye.layers, layer_bytes(_planted_modules())], env=bullseye.env)
        write_layout(work / "planted", "v1", [planted])
        noisy = Image([*bullseye.layers, layer_bytes([Entry("bin/sh", data=NOISY, mode=0o755)])])
        write_layout(work / "noisy", "v1", [noisy])
        python3 = Entry("usr/bin/python3", data=b"#!/bin/sh\n", mode=0o755)
        for name, (links, workdir, _) in ESCAPES.items():
            mine = str(decoy / name)
            links = [Entry(e.name, e.kind, target=e.target.replace("/DECOY", mine)) for e in links]
            image = Image(
                [layer_bytes([python3, *links])], working_dir=workdir.replace("/DECOY", mine)
            )
            write_layout(work / name, "v1", [image])
        yield {
            "bullseye": anonymous.push(work / "bullseye", "v1", "bullseye"),
            "private": private.push(work / "bullseye", "v1", "bullseye"),
            "bearer": bearer.push(work / "bullseye", "v1", "bullseye"),
            "tokens": tokens,
            "whiteout": anonymous.push(work / "whiteout", "v1", "whiteout"),
            "armonly": anonymous.push(work / "armonly", "v1", "armonly", multi=True),
            "evil": anonymous.push(work / "evil", "v1", "evil"),
            "nopython": anonymous.push(work / "nopython", "v1", "nopython"),
            "entry": anonymous.push(work / "entry", "v1", "entry"),
            "nobody": anonymous.push(work / "nobody", "v1", "nobody"),
            "workspace": anonymous.push(work / "workspace", "v1", "workspace"),
            "planted": anonymous.push(work / "planted", "v1", "planted"),
            "noisy": anonymous.push(work / "noisy", "v1", "noisy"),
            **{name: anonymous.push(work / name, "v1", name) for name in ESCAPES},
            "anonymous": anonymous,
        }
    finally:
        anonymous.stop()
        private.stop()
        bearer.stop()
        tokens.stop()


# What a module the image plants would do, were it loaded: leave a mark, end its process.
PLANTED = b"import os\nopen('/tmp/planted-' + __name__, 'w').close()\nos._exit(99)\n"


# An image's /bin/sh that, as the placeholder, writes to the server without end (no newline).
NOISY = b"#!/usr/bin/python3\nimport os\nwhile True:\n    os.write(1, b'u' * 65536)\n"


def _planted_modules() -> list[Entry]:
    """Modules where the server's interpreter has its standard library (the template's
    `sys.path`, `-I -S`), named as what a forked execd could import once it runs: what the
    standard library imports as it goes (the relay's host name codec), and more."""
    entries: list[Entry] = []
    for folder in (os.path.dirname(os.__file__), os.path.dirname(json.__file__)):
        parts = folder.strip("/").split("/")
        entries += [Entry("/".join(parts[: n + 1]), "dir", mode=0o755) for n in range(len(parts))]
    stdlib = os.path.dirname(os.__file__).strip("/")
    entries.append(Entry(f"{stdlib}/encodings", "dir", mode=0o755))
    for name in ("encodings/idna", "encodings/cp1252", "stringprep", "_strptime", "uuid"):
        entries.append(Entry(f"{stdlib}/{name}.py", data=PLANTED))
    entries.append(Entry(f"{stdlib}/json/tool.py", data=PLANTED))
    return list({entry.name: entry for entry in entries}.values())


def _execd_of(server: LocalServer, sandbox_id: str) -> tuple[int, str]:
    """The host pid of a sandbox's execd, and the command line of its parent."""
    for pid in sandbox_of(server, sandbox_id).container.members():
        line = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"main.py" in line or execd_template.BOOTSTRAP.encode() in line:
            status = Path(f"/proc/{pid}/status").read_text()
            parent = int(status.split("PPid:\t", 1)[1].split()[0])
            if parent != sandbox_of(server, sandbox_id).container.init_pid:
                return pid, Path(f"/proc/{parent}/cmdline").read_bytes().decode()
    raise AssertionError(f"no execd in {sandbox_id}")


@pytest.fixture(scope="module")
def image_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    store = tmp_path_factory.mktemp("store")
    with local_server(image_store=store, spare_containers=0, ping_interval=0.5) as server:
        yield server


def _client(server: LocalServer) -> osb_sync.Client:
    return osb_sync.Client(api_base=server.api_base, api_key="local", create_timeout=600)


def _leftovers(server: LocalServer) -> tuple[list[str], list[str]]:
    """(sandboxes the server lists, what the store's tmp/ holds)."""
    store = Path(str(server.image_settings.store))
    listed = [s.id for s in _client(server).list_sandboxes()]
    return listed, os.listdir(store / "tmp") if (store / "tmp").exists() else []


def test_the_sandbox_runs_the_images_python_and_packages(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    client = _client(image_server)
    with client.create_sandbox(template=registries["bullseye"]) as sandbox:
        code = sandbox.run_code("import sys, six; print(sys.version_info[:2], six.__file__)")
        assert code.stdout.startswith("(3, 9) /usr/lib/python3/dist-packages/six.py"), code
        ran = sandbox.commands.run("pwd; echo $GREETING; cat /etc/debian_version")
        assert ran.stdout.splitlines()[:2] == ["/srv/app", "from-the-image"]
        assert ran.stdout.splitlines()[2].startswith("11.")
        sandbox.commands.run("echo written > /srv/app/out.txt && mkdir -p /usr/local/x")
        assert sandbox.files.read_text("/srv/app/out.txt") == "written\n"
        # its root owns `/` as in the image (a container's root makes folders there)
        made = sandbox.commands.run("mkdir /data && stat -c %u /")
        assert made.exit_code == 0 and made.stdout.strip() == "0", made
        info = client.get_sandbox(sandbox.id)
        assert info.image.startswith(registries["bullseye"] + "@sha256:")
        assert "writable layer" in info.message


def test_a_second_sandbox_starts_without_pulling(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    client = _client(image_server)
    with client.create_sandbox(template=registries["bullseye"]):
        pass
    store = registry_of(image_server).config.images.store  # type: ignore[union-attr]
    pulls = store.pulls
    with client.create_sandbox(template=registries["bullseye"]) as sandbox:
        assert sandbox.commands.run("ls /srv/app").stdout == ""  # not the first one's layer
    assert store.pulls == pulls


def test_whiteouts_hide_a_deleted_file(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    with _client(image_server).create_sandbox(template=registries["whiteout"]) as sandbox:
        ran = sandbox.commands.run("ls /etc/debian_version; cat /srv/app/added")
        assert "No such file" in ran.stderr and ran.stdout.strip() == "1"


def test_basic_auth_comes_from_the_create(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    client = _client(image_server)
    auth = {"username": imagekit.USER, "password": imagekit.PASSWORD}
    with client.create_sandbox(template=registries["private"], image_auth=auth) as sandbox:
        assert sandbox.commands.run("cat /etc/debian_version").stdout.startswith("11.")


def test_bearer_tokens_come_from_the_registrys_token_service(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    tokens = registries["tokens"]
    issued = tokens.issued
    auth = {"username": imagekit.USER, "password": imagekit.PASSWORD}
    client = _client(image_server)
    with client.create_sandbox(template=registries["bearer"], image_auth=auth) as sandbox:
        assert sandbox.commands.run("cat /etc/debian_version").stdout.startswith("11.")
        # (the store keeps one reference per digest: an earlier test's may be the one shown)
        assert "@sha256:" in client.get_sandbox(sandbox.id).image
    assert tokens.issued > issued  # the pull asked the token service, with the create's auth


@pytest.mark.parametrize(
    ("image", "auth", "reason"),
    [
        ("private", {"username": imagekit.USER, "password": "wrong"}, "IMAGE_UNAUTHORIZED"),
        ("bearer", {"username": imagekit.USER, "password": "wrong"}, "IMAGE_UNAUTHORIZED"),
        ("bearer", None, "IMAGE_UNAUTHORIZED"),
        ("private", None, "IMAGE_UNAUTHORIZED"),
        ("unknown-tag", None, "IMAGE_NOT_FOUND"),
        ("armonly", None, "IMAGE_PLATFORM_UNAVAILABLE"),
        ("evil", None, "IMAGE_REFUSED"),
        ("nopython", None, "IMAGE_NO_EXECD"),
    ],
)
def test_an_image_that_cannot_be_had_fails_the_create_and_leaves_nothing(
    image_server: LocalServer,
    registries: dict[str, Any],
    image: str,
    auth: dict[str, str] | None,
    reason: str,
) -> None:
    uri = registries.get(image) or registries["bullseye"].replace(":v1", ":nope")
    client = _client(image_server)
    before = _leftovers(image_server)
    with pytest.raises(osb_sync.ApiError) as failed:
        client.create_sandbox(template=uri, image_auth=auth)
    assert failed.value.code == PULL_FAILED
    assert str(failed.value).count(reason) >= 1, failed.value
    assert "wrong" not in str(failed.value)
    assert _leftovers(image_server) == (before[0], [])


@pytest.mark.parametrize("image", ESCAPES)
def test_an_images_paths_never_lead_bwrap_out_of_its_root(
    image_server: LocalServer, registries: dict[str, Any], decoy: Path, image: str
) -> None:
    """Issue 37, row 2: bwrap makes its mount points and directories while the host's root is
    still at /oldroot, and followed the image's links (and a WorkingDir's `..`) there."""
    client = _client(image_server)
    before = _leftovers(image_server)
    with pytest.raises(osb_sync.ApiError) as failed:
        client.create_sandbox(template=registries[image])
    assert os.listdir(decoy / image) == []
    _, workdir, outcome = ESCAPES[image]
    assert outcome in str(failed.value), failed.value
    if outcome == EXECVP:  # bwrap made every mount (inside the image's root)
        assert failed.value.code == "DOCKER::SANDBOX_START_FAILED", failed.value
    else:  # refused before bwrap, naming the path
        assert failed.value.code == PULL_FAILED and CONFIG_INVALID in str(failed.value)
        assert not workdir or "/workdir" in str(failed.value)
    assert _leftovers(image_server) == before


def test_an_images_volume_is_mounted_inside_its_root(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    """A mountPath under the image's `/var/run -> /run`: bwrap mounts at /run/data in the
    image's root (issue 37, item 5), where the sandbox sees it by both names."""
    volume = {"name": "data", "pvc": {"claimName": "issue37"}, "mountPath": "/var/run/data"}
    client = _client(image_server)
    with client.create_sandbox(template=registries["bullseye"], volumes=[volume]) as sandbox:
        ran = sandbox.commands.run(
            "echo kept > /var/run/data/f && cat /run/data/f"
            " && grep -c ' /run/data ' /proc/self/mountinfo"
        )
        assert ran.stdout == "kept\n1\n", ran
    assert image_server.root_dir is not None
    assert (image_server.root_dir / "volumes" / "issue37" / "f").read_text() == "kept\n"


def test_an_images_working_dir_in_a_volume_is_made_there(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    """WorkingDir /workspace/app, a pvc at /workspace: made in the pvc (by descriptor, as the
    range's root), where the sandbox runs (after the attack, 12: it was refused)."""
    volume = {"name": "ws", "pvc": {"claimName": "issue37-ws"}, "mountPath": "/workspace"}
    with _client(image_server).create_sandbox(
        template=registries["workspace"], volumes=[volume]
    ) as sandbox:
        assert sandbox.commands.run("pwd; touch kept").stdout == "/workspace/app\n"
    assert image_server.root_dir is not None
    made, ids = image_server.root_dir / "volumes" / "issue37-ws" / "app", bwrap.probe().ids
    assert (made / "kept").exists() and (ids is None or made.stat().st_uid == ids.uid)


def test_an_images_working_dir_in_a_volume_it_could_not_map_is_the_sandbox_roots(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    """The same in a pvc of an ordinary user's on ramfs, which cannot be ID-mapped (issue 43):
    the volume is bound as it is, so the WorkingDir the server makes is the range root's, the
    sandbox's root there, not the directory owner's (which it would be through a mapping)."""
    if os.geteuid() != 0:
        pytest.skip("mounting ramfs needs root")
    assert image_server.root_dir is not None
    claim = image_server.root_dir / "volumes" / "issue43-ramfs"
    claim.mkdir(parents=True)
    subprocess.run(["mount", "-t", "ramfs", "ramfs", str(claim)], check=True)
    try:
        os.chown(claim, 4242, 4343)
        claim.chmod(0o755)
        volume = {"name": "ws", "pvc": {"claimName": "issue43-ramfs"}, "mountPath": "/workspace"}
        client = _client(image_server)
        with client.create_sandbox(template=registries["workspace"], volumes=[volume]) as box:
            ran = box.commands.run("pwd; touch kept && echo kept")
            status = client.get_sandbox(box.id).message or ""
        assert "NOT ID-mapped (mount_setattr" in status, status
        assert ran.stdout == "/workspace/app\nkept\n", ran
        ids = bwrap.probe().ids
        assert ids is not None and (claim / "app").stat().st_uid == ids.uid
    finally:
        subprocess.run(["umount", "-l", str(claim)], check=True)


def test_the_default_image_is_still_the_host_view(image_server: LocalServer) -> None:
    with _client(image_server).create_sandbox() as sandbox:
        assert sandbox.commands.run("echo $PATH").stdout.startswith("/opt/osb-sync/bin")


def test_an_images_writable_layer_is_on_the_sandboxs_limited_disk(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    limits = {"cpu": "1", "memory": "512Mi", "ephemeral-storage": "16Mi"}
    client = _client(image_server)
    with client.create_sandbox(template=registries["bullseye"], resource_limits=limits) as box:
        assert "ephemeral-storage=16Mi (tmpfs" in client.get_sandbox(box.id).message
        # the overlay's upper directory takes the copy-up and new files: 16 MiB in all
        full = box.commands.run("head -c 20M /dev/zero > /srv/app/big; echo exit=$?")
        assert "No space left on device" in full.stderr and "exit=1" in full.stdout, full
        assert box.commands.run("rm /srv/app/big && echo ok > /etc/x && cat /etc/x").stdout == (
            "ok\n"
        )
    assert [p for p in recovery.mount_points() if box.id in p] == []


def _until_state(client: osb_sync.Client, sandbox_id: str, states: set[str]) -> Any:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        info = client.get_sandbox(sandbox_id)
        if info.state in states:
            return info
        time.sleep(0.1)
    raise AssertionError(f"sandbox {sandbox_id} never reached {states}: {info.state}")


def test_the_creates_entrypoint_replaces_the_images_and_runs_as_the_image_says(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    """The image's Entrypoint + Cmd (exit 3) is not run; the create's runs after execd, in the
    image's WorkingDir, with its Env."""
    client = _client(image_server)
    script = "echo $(pwd) $GREETING > /tmp/entry.txt; exec sleep 600"
    with client.create_sandbox(
        template=registries["entry"], entrypoint=["sh", "-c", script]
    ) as sandbox:
        deadline = time.monotonic() + 10
        while not sandbox.files.exists("/tmp/entry.txt") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sandbox.files.read_text("/tmp/entry.txt") == "/srv/app from-the-image\n"
        assert client.get_sandbox(sandbox.id).state == "Running"


def test_an_image_sandbox_whose_entrypoint_exits_7_is_failed(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    """execd serves first, so the create may see it healthy before the entrypoint ends (as on
    the real server, where Failed came 0.3 s after Running): Failed then, or at the create."""
    client = _client(image_server)
    try:
        sandbox = client.create_sandbox(
            template=registries["bullseye"], entrypoint=["sh", "-c", "sleep 0.2; exit 7"]
        )
    except osb_sync.SandboxStateError as exc:
        message = str(exc)
        assert _leftovers(image_server)[0] == []  # the client deleted it
    else:
        with sandbox:
            info = _until_state(client, sandbox.id, {"Failed"})
            message = info.message or ""
    assert "exited with code 7" in message


def test_an_images_user_runs_its_commands_code_and_entrypoint(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    """`User: nobody` (65534 in the image's /etc/passwd): what runs in the sandbox is nobody,
    in its WorkingDir under the image's `/var/run -> /run` (resolved in the image's root)."""
    client = _client(image_server)
    script = "id -u > /tmp/entry-uid; exec sleep 600"
    with client.create_sandbox(
        template=registries["nobody"], entrypoint=["sh", "-c", script]
    ) as sandbox:
        assert sandbox.commands.run("id -u; id -g").stdout == "65534\n65534\n"
        assert sandbox.commands.run("pwd -P").stdout == "/run/app\n"
        ran = sandbox.run_code("import os; print(os.getuid(), os.getgid())")
        assert ran.stdout == "65534 65534\n", ran
        deadline = time.monotonic() + 10
        while not sandbox.files.exists("/tmp/entry-uid") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sandbox.files.read_text("/tmp/entry-uid") == "65534\n"
        # one --uid reaches bwrap (two made it warn "Only the last --uid option will take effect"
        # into the container log, and into the message of a start that failed)
        logs = requests.get(
            f"{image_server.api_base}/sandboxes/{sandbox.id}/diagnostics/logs", timeout=30
        ).text
        assert "--uid" not in logs and "--gid" not in logs, logs


def test_an_images_execd_is_the_templates_and_runs_the_users_code_on_the_images_python(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    """The execd template forks an image sandbox's execd too (the server's interpreter, in the
    image's namespaces); code contexts, terminals and commands run on the image's own."""
    client = _client(image_server)
    with client.create_sandbox(template=registries["bullseye"]) as sandbox:
        execd, parent = _execd_of(image_server, sandbox.id)
        assert execd_template.BOOTSTRAP in parent  # the template forked it
        assert os.readlink(f"/proc/{execd}/exe") == os.path.realpath(sys.executable)
        assert os.readlink(f"/proc/{execd}/cwd") == "/srv/app"  # the image's WorkingDir
        code = sandbox.run_code("import sys; print(sys.executable, sys.version_info[:2])")
        assert code.stdout == "/usr/bin/python3 (3, 9)\n", code
        ran = sandbox.commands.run("readlink /proc/$$/exe; pwd; echo $GREETING")
        # bullseye's bash (its /bin is no link to /usr/bin), in its WorkingDir, with its Env
        assert ran.stdout.splitlines() == ["/bin/bash", "/srv/app", "from-the-image"], ran


def test_modules_an_image_plants_where_the_servers_python_has_its_own_are_never_loaded(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    """A forked execd runs the server's interpreter inside the image: the image's files at
    that interpreter's paths are the image's to write, never execd's to import."""
    client = _client(image_server)
    before = os.stat(os.path.realpath(sys.executable))
    with client.create_sandbox(template=registries["planted"]) as sandbox:
        assert execd_template.BOOTSTRAP in _execd_of(image_server, sandbox.id)[1]
        planted = os.path.dirname(os.__file__) + "/encodings/idna.py"
        assert sandbox.files.read_bytes(planted) == PLANTED  # there, as the image has it
        assert sandbox.commands.run("echo hi").stdout == "hi\n"  # through the relay
        assert sandbox.run_code("print(6 * 7)").stdout == "42\n"
        sandbox.files.write("/srv/x.txt", "x")
        assert sandbox.files.read_text("/srv/x.txt") == "x"
        assert sandbox.metrics().cpu_count > 0
        # its /proc/self/exe is the server's interpreter: a host file the sandbox's root does
        # not own (a server whose sandboxes' root is its own user forks none: `usable`)
        with pytest.raises(osb_sync.ApiError):
            sandbox.files.chmod("/proc/self/exe", 0o777)
        with pytest.raises(osb_sync.ApiError):
            sandbox.files.write("/proc/self/exe", "x")
        marks = sandbox.commands.run("ls /tmp | grep planted-; echo end").stdout
        assert marks == "end\n", marks
        assert sandbox.commands.run("echo still").stdout == "still\n"
    after = os.stat(os.path.realpath(sys.executable))
    assert (after.st_mode, after.st_size, after.st_mtime_ns) == (
        before.st_mode,
        before.st_size,
        before.st_mtime_ns,
    )


def test_an_images_placeholder_that_writes_without_end_fails_its_create_at_once(
    image_server: LocalServer, registries: dict[str, Any]
) -> None:
    """The placeholder is the image's /bin/sh: the server reads a line of it, and no more."""
    client = _client(image_server)
    started = time.monotonic()
    with pytest.raises(osb_sync.ApiError, match="did not start"):
        client.create_sandbox(template=registries["noisy"])
    assert time.monotonic() - started < 20  # not the start's whole 30 s, reading on
    assert _leftovers(image_server) == ([], [])
