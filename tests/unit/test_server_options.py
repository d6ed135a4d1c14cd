"""LocalServer's options (``osb_sync/local/host/options.py``): declared once, used everywhere.

The declarations, LocalServer's signature, its docstring and the ``osb-sync serve`` parser are
held to each other here: an option added to one and not the others fails.
"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import pytest

from osb_sync._cli import build_parser
from osb_sync.local import LocalServer
from osb_sync.local.host import options
from osb_sync.local.host.options import OPTIONS

FLAGGED = [o for o in OPTIONS if o.flag is not None]


def serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices["serve"]


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def test_every_option_is_a_keyword_of_local_server_and_back() -> None:
    parameters = list(inspect.signature(LocalServer.__init__).parameters.values())[1:]
    assert [p.name for p in parameters] == [o.name for o in OPTIONS]
    for parameter, option in zip(parameters, OPTIONS, strict=True):
        assert parameter.default == option.default, option.name
        positional = parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert positional == (option.name in ("host", "port")), option.name


def test_every_serve_flag_is_an_option_and_back() -> None:
    own = flags(build_parser()) | {"--help"}  # the global options every command takes
    assert flags(serve_parser()) - own == {o.flag for o in FLAGGED}


def test_an_option_has_a_flag_or_says_why_not() -> None:
    for option in OPTIONS:
        assert (option.flag is None) == bool(option.python_only), option.name
        assert option.doc, option.name
        if option.flag is not None:
            assert option.help, option.name


def test_every_option_is_in_local_servers_docstring() -> None:
    doc = inspect.getdoc(LocalServer) or ""
    assert options.ARGS_PLACEHOLDER not in doc
    args = doc[doc.index("\nArgs:\n") : doc.index("\nRaises:\n")]
    places = [args.find(f"\n    {o.name}: {o.doc[:20]}") for o in OPTIONS]
    assert -1 not in places and places == sorted(places)


def test_serve_defaults_become_local_server_keywords() -> None:
    args = build_parser().parse_args(["serve"])
    assert options.keywords(args, api_key="k") == {
        "host": "127.0.0.1",
        "port": 8080,
        "api_key": "k",
        "allow_no_api_key": False,
        "min_timeout": 60,
        "pending_seconds": 0.0,
        "unenforced_network_policy": "refuse",
        "root_dir": None,
        "allowed_hosts": [],
        "allowed_host_paths": [],
        "volume_root": None,
        "volume_root_is_host_root": False,
        "execd": None,
        "jupyter": None,
        "execd_image": None,
        "spare_containers": 1,
        "container_log_size": 16 << 20,
        "container_logs_total": 256 << 20,
        "isolation": None,
        "require_id_range": False,
        "cgroup_parent": None,
        "require_limits": False,
        "image_store": None,
        "image_store_size": 10 << 30,
        "image_size_limit": None,
        "insecure_registries": [],
        "registry_auth_file": None,
        "local_image_paths": [],
        "host_images": ("opensandbox/code-interpreter:v1.1.0",),
    }


def test_serve_flags_become_local_server_keywords(tmp_path: Path) -> None:
    argv = ["serve", "--host", "::1", "--port", "0", "--min-timeout", "5"]
    argv += ["--pending-seconds", "0.5", "--allow-unenforced-network-policy"]
    argv += ["--allowed-host", "a", "--allowed-host", "b", "--allow-host-path", str(tmp_path)]
    argv += [
        "--volume-root",
        "v",
        "--volume-root-is-host-root",
        "--execd",
        "e",
        "--jupyter",
        "j",
        "--spare-containers",
        "0",
    ]
    argv += ["--state-dir", "s", "--execd-image", "x:1"]
    argv += ["--no-isolation", "--require-id-range", "--image-store", "s"]
    argv += ["--cgroup-parent", "/osb-alice", "--require-limits"]
    argv += ["--image-store-size", "7"]
    argv += ["--image-size-limit", "6"]
    argv += ["--insecure-registry", "r:5000", "--registry-auth-file", "a.json"]
    argv += ["--allow-image-path", "/i", "--host-image", "h:1", "--allow-no-api-key"]
    argv += ["--container-log-size", "65536", "--container-logs-total", "1048576"]
    found = options.keywords(build_parser().parse_args(argv), api_key=None)
    assert found == {
        "host": "::1",
        "port": 0,
        "api_key": None,
        "allow_no_api_key": True,
        "min_timeout": 5,
        "pending_seconds": 0.5,
        "unenforced_network_policy": "accept",
        "root_dir": "s",
        "allowed_hosts": ["a", "b"],
        "allowed_host_paths": [str(tmp_path)],
        "volume_root": "v",
        "volume_root_is_host_root": True,
        "execd": "e",
        "jupyter": "j",
        "execd_image": "x:1",
        "spare_containers": 0,
        "container_log_size": 65536,
        "container_logs_total": 1 << 20,
        "isolation": False,
        "require_id_range": True,
        "cgroup_parent": "/osb-alice",
        "require_limits": True,
        "image_store": "s",
        "image_store_size": 7,
        "image_size_limit": 6,
        "insecure_registries": ["r:5000"],
        "registry_auth_file": "a.json",
        "local_image_paths": ["/i"],
        "host_images": ("h:1",),
    }
    with pytest.raises(KeyError):
        options.keywords(build_parser().parse_args(["serve"]))  # the command reads the key


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"spare_containers": -1}, "spare_containers must be 0 or more"),
        ({"image_size_limit": 0}, "image_size_limit must be 1 or more"),
        ({"container_log_size": 100}, "container_log_size must be 4096 or more"),
        ({"container_logs_total": 100}, "container_logs_total must be 4096 or more"),
        ({"unenforced_network_policy": "maybe"}, "unenforced_network_policy must be one of"),
        ({"cgroup_parent": "/osb/../../x"}, "cgroup_parent must be a path of cgroup directories"),
        ({"cgroup_parent": "/"}, "cgroup_parent must be a path of cgroup directories"),
        ({"execd": "/bin/sh", "execd_image": "x:1"}, "execd and execd_image both name"),
        (
            {"jupyter": "/usr/bin/true"},
            r"jupyter is for an execd binary: pass execd \(or execd_image\) too",
        ),
    ],
)
def test_local_server_checks_its_keywords(given: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LocalServer(**given)  # type: ignore[arg-type]


def test_serve_checks_a_flag_with_the_options_check(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--spare-containers", "-1"])
    assert exited.value.code == 125
    err = capsys.readouterr().err
    assert "argument --spare-containers: must be 0 or more, not -1" in err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--port", "x"])
    assert "argument --port: invalid int value: 'x'" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.0.2.7", "fd00::2", "::ffff:10.0.0.1"])
def test_a_server_other_machines_reach_needs_a_key(host: str) -> None:
    with pytest.raises(ValueError, match="OPEN_SANDBOX_API_KEY or --api-key-file") as refused:
        LocalServer(host=host)
    assert "allow_no_api_key" in str(refused.value)
    LocalServer(host=host, api_key="k")
    LocalServer(host=host, allow_no_api_key=True)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"])
def test_a_loopback_server_needs_no_key(host: str) -> None:
    LocalServer(host=host)


@pytest.mark.parametrize("host", ["localhost", "sandbox.lan"])
def test_a_name_is_judged_once_bound(host: str) -> None:
    assert options.is_name(host) and not options.loopback(host)
    LocalServer(host=host)  # its address is known once bound (tests/local/test_hardening.py)
