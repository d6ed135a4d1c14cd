"""The real execd in sandboxes of images: injected as OpenSandbox's Docker runtime does it.

A code-interpreter-shaped image (Debian bookworm with ipykernel, notebook and a kernelspec
named `python`, `imagekit.interpreter_image`) runs its code through the real execd
(`shared/opensandbox-execd`) and that image's own Jupyter; an image without Jupyter gets the
real execd for commands and files, and so does an image without python3 (busybox; its main
process on the server's interpreter); `execd_image` takes the binary from an image pushed to
a loopback registry. Needs what tests/local/test_images.py needs, plus the real execd binary
(skipped without it, failed under OSB_REQUIRE_REAL_EXECD=1 as CI sets). Under tox it runs in
the realexecd env only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import osb_sync
from osb_sync.local import LocalServer
from osb_sync.local.host.execd_binary import IMAGE_EXECD_PATH
from osb_sync.local.host.images.execd_image import ExecdImageError
from tests import imagekit
from tests.conformance.execds import real_execd_dir, skip_or_fail
from tests.imagekit import Entry, Image, LoopbackRegistry, layer_bytes, write_layout
from tests.local.support import local_server, registry_of

MISSING = imagekit.missing_tools() + [
    tool for tool in ("mmdebstrap", "busybox") if not shutil.which(tool)
]
if MISSING and not imagekit.REQUIRE_IMAGES:
    pytest.skip(
        f"the image tests need {', '.join(MISSING)} (apt-get install skopeo docker-registry"
        " mmdebstrap openssl busybox-static); OSB_REQUIRE_IMAGES=1 makes this a failure",
        allow_module_level=True,
    )
# Under tox, in the realexecd env only (tox.ini): each run pulls a 300 MB image.
if os.environ.get("TOX_ENV_NAME", "realexecd") != "realexecd":
    pytest.skip(
        "runs in tox -e realexecd: the real execd in images, once, not per interpreter",
        allow_module_level=True,
    )
PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The execd process a command runs under, and the sha256 of its binary, seen from inside.
WHOSE_COMMAND = "readlink /proc/$PPID/exe; sha256sum /proc/$PPID/exe | cut -d' ' -f1"


@pytest.fixture(scope="module")
def execd() -> Path:
    """The real execd binary."""
    folder = real_execd_dir()
    if folder is None or not (folder / "execd").is_file():
        skip_or_fail("shared/opensandbox-execd/execd not found (set OSB_REAL_EXECD_DIR)")
    assert folder is not None
    return folder / "execd"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, execd: Path) -> Iterator[dict[str, Any]]:
    """A loopback registry with the interpreter, bullseye and execd images pushed."""
    work = tmp_path_factory.mktemp("registry")
    anonymous = LoopbackRegistry(work / "anon").start()
    try:
        write_layout(work / "interpreter", "v1", [imagekit.interpreter_image([PATH])])
        bullseye = Image([imagekit.rootfs_layer(imagekit.bullseye_tar())], env=[PATH])
        write_layout(work / "bullseye", "v1", [bullseye])
        write_layout(work / "busybox", "v1", [imagekit.busybox_image([PATH])])
        binary = Entry("execd", data=execd.read_bytes(), mode=0o755)
        # found by its Entrypoint: neither /execd nor /usr/local/bin/execd
        elsewhere = Entry("opt/x/execd", data=binary.data, mode=0o755)
        write_layout(work / "execd", "v1", [Image([layer_bytes([binary])])])
        write_layout(
            work / "entry", "v1", [Image([layer_bytes([elsewhere])], entrypoint=["/opt/x/execd"])]
        )
        script = Entry("execd", data=b"#!/bin/sh\necho not execd\n", mode=0o755)
        write_layout(work / "script", "v1", [Image([layer_bytes([script])])])
        yield {
            name: anonymous.push(work / name, "v1", name)
            for name in ("interpreter", "bullseye", "busybox", "execd", "entry", "script")
        }
    finally:
        anonymous.stop()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def real_server(store: Path, execd: Path) -> Iterator[LocalServer]:
    with local_server(image_store=store, execd=execd, spare_containers=0) as server:
        yield server


def _client(server: LocalServer) -> osb_sync.Client:
    return osb_sync.Client(api_base=server.api_base, api_key="local", create_timeout=600)


def _run(
    sandbox: osb_sync.Sandbox, code: str, done: Callable[[osb_sync.ExecutionResult], bool]
) -> osb_sync.ExecutionResult:
    """run_code, again (up to 3 times) while the real execd lost the trailing output (its
    README says it may)."""
    out = sandbox.run_code(code)
    for _ in range(3):
        if done(out):
            break
        out = sandbox.run_code(code)
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_run_code_in_a_code_interpreter_image_goes_through_its_jupyter(
    real_server: LocalServer, registry: dict[str, Any], execd: Path
) -> None:
    client = _client(real_server)
    with client.create_sandbox(template=registry["interpreter"]) as sandbox:
        assert "the image's Jupyter /usr/bin/jupyter" in client.get_sandbox(sandbox.id).message
        ran = sandbox.commands.run(WHOSE_COMMAND)
        assert ran.stdout.split() == [IMAGE_EXECD_PATH, _sha256(execd)], ran
        # mmdebstrap's layer as it is, /dev/console and the other device nodes in it (issue
        # 37): skipped, and listed in the store; the sandbox has bwrap's /dev
        assert sandbox.commands.run("cat /etc/debian_version").stdout.startswith("12.")
        assert sandbox.commands.run("cat /dev/null && echo ok").stdout == "ok\n"
        stored = registry_of(real_server).config.images.store.images()  # type: ignore[union-attr]
        image = next(i for i in stored if any("interpreter" in r for r in i["references"]))
        assert "dev/console" in image["skipped"], image
        code = (
            "import os, sys, ipykernel\n"
            "parent = open(f'/proc/{os.getppid()}/cmdline').read().replace(chr(0), ' ')\n"
            "print(sys.executable, ipykernel.__file__, 'jupyter' in parent)\n"
        )
        out = _run(sandbox, code, lambda r: bool(r.stdout))
        # the image's python and Debian's ipykernel, under the image's Jupyter server
        python, kernel, under_jupyter = out.stdout.split()
        assert python == "/usr/bin/python3", out
        assert kernel.startswith("/usr/lib/python3/dist-packages/ipykernel/"), out
        assert under_jupyter == "True", out
        answer = _run(sandbox, "6 * 7", lambda r: bool(r.results))
        assert answer.results[0].get("text") == "42", answer  # the kernel's own result


def test_an_image_without_jupyter_runs_the_real_execd_without_code(
    real_server: LocalServer, registry: dict[str, Any], execd: Path
) -> None:
    client = _client(real_server)
    with client.create_sandbox(template=registry["bullseye"]) as sandbox:
        assert "no Jupyter" in client.get_sandbox(sandbox.id).message
        ran = sandbox.commands.run(WHOSE_COMMAND + "; cat /etc/debian_version")
        assert ran.stdout.split()[:2] == [IMAGE_EXECD_PATH, _sha256(execd)], ran
        assert ran.stdout.split()[2].startswith("11."), ran
        sandbox.files.write("/tmp/x.txt", "through the real execd")
        assert sandbox.files.read_text("/tmp/x.txt") == "through the real execd"
        with pytest.raises(osb_sync.ApiError) as failed:
            sandbox.run_code("print(1)")
        assert "not configured" in str(failed.value), failed.value


def test_an_image_without_python_runs_commands_and_files_through_the_real_execd(
    real_server: LocalServer, registry: dict[str, Any], execd: Path
) -> None:
    client = _client(real_server)
    with client.create_sandbox(template=registry["busybox"]) as sandbox:
        message = client.get_sandbox(sandbox.id).message
        assert "no python3: the server's interpreter runs its main process" in message
        ran = sandbox.commands.run(WHOSE_COMMAND + "; ls /usr /lib 2>&1; command -v python3")
        lines = ran.stdout.split("\n")
        assert lines[:2] == [IMAGE_EXECD_PATH, _sha256(execd)], ran
        # the image's root: no /usr or /lib of the host's, no python3, busybox's sh
        assert "No such file or directory" in ran.stdout and ran.exit_code != 0, ran
        assert sandbox.commands.run("readlink /bin/sh").stdout.strip() == "busybox"
        sandbox.files.write("/tmp/x.txt", "in busybox")
        assert sandbox.commands.run("cat /tmp/x.txt").stdout.rstrip("\n") == "in busybox"
        assert sandbox.files.read_text("/tmp/x.txt") == "in busybox"
        # nothing of the server's interpreter in the environment the image's processes get
        env = sandbox.commands.run("env").stdout
        assert "PYTHON" not in env and "LD_" not in env and "osb-sync/host" not in env, env
        with pytest.raises(osb_sync.ApiError) as failed:
            sandbox.run_code("print(1)")
        assert "not configured" in str(failed.value), failed.value


@pytest.mark.parametrize(("image", "rule"), [("execd", "/execd"), ("entry", "Entrypoint")])
def test_execd_image_gives_every_sandbox_its_binary(
    store: Path, registry: dict[str, Any], execd: Path, image: str, rule: str
) -> None:
    with local_server(image_store=store, execd_image=registry[image], spare_containers=0) as server:
        client = _client(server)
        with client.create_sandbox() as sandbox:  # the host's view: the binary at its path
            message = client.get_sandbox(sandbox.id).message
            assert f"from image {registry[image]}@sha256:" in message and rule in message
            ran = sandbox.commands.run(WHOSE_COMMAND)
            assert ran.stdout.split()[1] == _sha256(execd), ran
        cached = list((store / "execd").glob("sha256-*/execd"))
        assert cached and _sha256(cached[0]) == _sha256(execd)


def test_an_execd_image_without_an_elf_binary_fails_the_start(
    store: Path, registry: dict[str, Any]
) -> None:
    server = local_server(image_store=store, execd_image=registry["script"], spare_containers=0)
    with pytest.raises(ExecdImageError, match="not an ELF executable"):
        server.start()
    missing = local_server(
        image_store=store, execd_image=registry["script"] + "-gone", spare_containers=0
    )
    with pytest.raises(ExecdImageError, match="IMAGE_NOT_FOUND"):
        missing.start()
