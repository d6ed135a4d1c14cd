"""The isolation probe binds only the container's root view: nothing another server mounts."""

from __future__ import annotations

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
