"""The isolation probe binds only the container's root view: nothing another server mounts."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from osb_sync.local.host import bwrap


@pytest.fixture(autouse=True)
def fresh_probe() -> Iterator[None]:
    """The probe is cached for the process: each test probes anew, and leaves no answer."""
    bwrap.probe.cache_clear()
    yield
    bwrap.probe.cache_clear()


def fake_bwrap(tmp_path: Path, failures: int, message: str) -> str:
    """A `bwrap` that records its arguments, fails `failures` times with `message`, then
    succeeds."""
    script = tmp_path / "bwrap"
    count = tmp_path / "count"
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > "{tmp_path / "argv"}"\n'
        f'n=$(cat "{count}" 2>/dev/null || echo 0); echo $((n + 1)) > "{count}"\n'
        f'if [ "$n" -lt {failures} ]; then echo "{message}" >&2; exit 1; fi\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    return str(script)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the probe is Linux's")
def test_the_probe_binds_no_tree_where_other_servers_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Binding all of / (as the probe once did) also bound other servers' staged binds under
    # /run, and one unmounted mid-bind made the probe, and so every create, fail.
    monkeypatch.setattr(bwrap, "find_bwrap", lambda: fake_bwrap(tmp_path, 0, ""))
    support = bwrap.probe()
    assert "cannot create namespaces" not in support.problem
    argv = (tmp_path / "argv").read_text().splitlines()
    sources = [argv[i + 1] for i, arg in enumerate(argv) if arg.endswith("bind")]
    assert sources and "/usr" in sources
    assert not {"/", "/run", "/tmp"} & set(sources), sources


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the probe is Linux's")
def test_a_host_that_refuses_namespaces_is_probed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = "bwrap: No permissions to creating new namespace"
    monkeypatch.setattr(bwrap, "find_bwrap", lambda: fake_bwrap(tmp_path, 9, refused))
    support = bwrap.probe()
    assert support.bwrap is None and "cannot create namespaces" in support.problem
    assert (tmp_path / "count").read_text().strip() == "1"


# -- issue 42, item 6: the one cause found here, and its fix --------------------------------------


def fake_sysctls(tmp_path: Path, **values: int) -> Path:
    """A /proc/sys of these switches (`kernel__x` is kernel/x)."""
    for name, value in values.items():
        path = tmp_path / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return tmp_path


def test_debians_switch_is_named_for_a_user_and_not_for_root(tmp_path: Path) -> None:
    sysctls = fake_sysctls(tmp_path, kernel__unprivileged_userns_clone=0)
    problem, fix = bwrap.namespace_cause("bwrap: No permissions", False, sysctls)
    assert "kernel.unprivileged_userns_clone is 0" in problem
    assert fix.startswith("sysctl -w kernel.unprivileged_userns_clone=1")
    problem, fix = bwrap.namespace_cause("bwrap: No permissions", True, sysctls)
    assert "unprivileged_userns_clone" not in problem + fix  # it does not bind root
    assert "bwrap: No permissions" in problem


def test_no_user_namespaces_at_all_names_max_user_namespaces(tmp_path: Path) -> None:
    sysctls = fake_sysctls(tmp_path, user__max_user_namespaces=0)
    for root in (False, True):
        problem, fix = bwrap.namespace_cause("x", root, sysctls)
        assert "user.max_user_namespaces is 0" in problem
        assert fix.startswith("sysctl -w user.max_user_namespaces=")


def test_ubuntus_apparmor_restriction_is_named_with_its_sysctl(tmp_path: Path) -> None:
    sysctls = fake_sysctls(
        tmp_path,
        kernel__unprivileged_userns_clone=1,
        user__max_user_namespaces=15000,
        kernel__apparmor_restrict_unprivileged_userns=1,
    )
    problem, fix = bwrap.namespace_cause(
        "bwrap: setting up uid map: Permission denied", False, sysctls
    )
    assert "AppArmor" in problem and "apparmor_restrict_unprivileged_userns is 1" in problem
    assert "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in fix
    assert "userns" in fix  # or a profile that allows bwrap
    assert "bubblewrap" not in problem + fix


def test_without_a_known_switch_the_message_is_bwraps_own(tmp_path: Path) -> None:
    sysctls = fake_sysctls(tmp_path, user__max_user_namespaces=15000)
    problem, fix = bwrap.namespace_cause("bwrap: Creating new namespace failed", False, sysctls)
    assert "bwrap: Creating new namespace failed" in problem
    assert "sysctl" not in fix and "seccomp=unconfined" in fix


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the probe is Linux's")
def test_the_probe_gives_the_cause_it_found_and_that_fix_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = "bwrap: setting up uid map: Permission denied"
    monkeypatch.setattr(bwrap, "find_bwrap", lambda: fake_bwrap(tmp_path, 9, refused))
    sysctls = fake_sysctls(tmp_path / "sys", kernel__apparmor_restrict_unprivileged_userns=1)
    monkeypatch.setattr(bwrap, "PROC_SYS", sysctls)
    monkeypatch.setattr(bwrap.os, "geteuid", lambda: 1000)
    support = bwrap.probe()
    assert support.bwrap is None and "AppArmor" in support.problem
    message = bwrap.refusal(support.problem, support.fix)
    assert "apparmor_restrict_unprivileged_userns=0" in message
    assert "apt-get install bubblewrap" not in message  # installed: not the cause


def test_not_linux_says_local_sandboxes_need_linux_and_where_else_to_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bwrap.sys, "platform", "darwin")
    support = bwrap.probe()
    assert support.bwrap is None and "need Linux" in support.problem and "darwin" in support.problem
    assert "Linux VM" in support.fix and "OpenSandbox server" in support.fix
    assert "sysctl" not in support.fix and "bubblewrap" not in support.fix


def test_a_missing_bwrap_is_told_to_install_it_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bwrap, "find_bwrap", lambda: None)
    support = bwrap.probe()
    assert "not installed" in support.problem and "apt-get install bubblewrap" in support.fix
    assert "sysctl" not in support.fix


def test_an_interpreter_made_in_the_home_itself_binds_its_parts_not_the_home(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home" / "dev"
    for part in ("bin", "lib", ".ssh"):
        (home / part).mkdir(parents=True)
    (home / "pyvenv.cfg").write_text("home = /usr/bin\n")
    package = str(home / "lib/python3.11/site-packages/osb_sync")
    trees = bwrap.without_home(["/usr", str(home), package], str(home))
    assert trees == [
        "/usr",
        str(home / "bin"),
        str(home / "lib"),
        str(home / "pyvenv.cfg"),
        package,
    ]
    assert bwrap.without_home(["/usr", str(tmp_path)], str(home))[0] == "/usr"
    assert str(home / ".ssh") not in bwrap.without_home([str(tmp_path / "home")], str(home))
    assert bwrap.without_home(["/opt/py", "/home/dev2"], "/home/dev") == ["/opt/py", "/home/dev2"]


def test_a_venv_in_the_home_reached_through_a_symlink_binds_no_more_of_it(tmp_path: Path) -> None:
    # Fedora Atomic: /home -> var/home, the passwd entry says /var/home/dev; a venv made as
    # /home/dev (or the reverse) is the same directory under another name.
    real = tmp_path / "var/home/dev"
    for part in ("bin", "lib", ".ssh"):
        (real / part).mkdir(parents=True)
    (tmp_path / "home").symlink_to("var/home")
    linked = str(tmp_path / "home/dev")
    for tree, home in ((linked, str(real)), (str(real), linked)):
        found = bwrap.without_home([tree], home)
        assert found == [os.path.join(tree, "bin"), os.path.join(tree, "lib")], found


def test_a_venv_made_in_home_as_the_environment_names_it_binds_its_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `python3 -m venv ~` makes it in $HOME, which need not be the passwd entry's home.
    home = tmp_path / "data/dev"
    for part in ("bin", ".ssh"):
        (home / part).mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    assert bwrap.without_home([str(home), "/usr"]) == [str(home / "bin"), "/usr"]
