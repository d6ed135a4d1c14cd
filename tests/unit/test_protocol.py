"""The messages between the local server and execd (`osb_sync/local/protocol.py`): each record
survives its encoder and decoder, a message of another shape is refused naming the field, the
token never shows in a `repr`, and the module runs on Python 3.9 (an image's python3)."""

from __future__ import annotations

import ast
import glob
import json
import os
import subprocess
from typing import Any

import pytest

from osb_sync.local import protocol
from osb_sync.local.protocol import Claim, Fork, ForkAnswer, Start, TemplateSetup

TOKEN = "tok-3f9a1c-never-shown"
SECRET = "value-of-a-secret-variable"

RECORDS = [
    Start("/home/sandbox", "/run/osb-execd", 44772, 44771, 0.2, 0.0),
    Start(
        "/srv/app",
        "/run/osb-execd",
        44772,
        44771,
        3.0,
        1.5,
        8 << 30,
        "/run/osb-oom-control",
        (1000, 1000),
        "/opt/opensandbox/execd",
        "/usr/local/bin/jupyter",
        "/usr/bin/python3",
    ),
    Claim(TOKEN, {"API_KEY": SECRET}),
    Claim(TOKEN, {}, ("sleep", "9"), 512 << 20),
    TemplateSetup(0xA80425FB, bytes(range(16)), "/home/sandbox", "/opt/osb-sync/lib/osb_sync"),
    TemplateSetup(0, None, "/", "/x"),
    Fork(4242),
    Fork(4242, ("/sys/fs/cgroup/osb/x/cgroup.procs",), "/srv/app"),
    ForkAnswer(pid=77),
    ForkAnswer(error="OSError: the container's init is in the host's pid namespace"),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_survives_its_encoder_and_decoder(record: Any) -> None:
    data = record.encode()
    assert type(record).decode(data) == record
    if isinstance(record, (Start, Claim)):  # lines on execd's standard input
        assert data.endswith(b"\n") and data.count(b"\n") == 1


@pytest.mark.parametrize("record", [r for r in RECORDS if isinstance(r, Claim)])
def test_a_claims_repr_shows_neither_the_token_nor_the_environments_values(record: Claim) -> None:
    for shown in (repr(record), str(record), f"{record!r}"):
        assert TOKEN not in shown and SECRET not in shown, shown
    assert "Claim(" in repr(record)  # a repr all the same, of what is not secret


@pytest.mark.parametrize(
    ("record", "change", "field"),
    [
        (Start, {"home": 3}, "home"),
        (Start, {"execd_port": "44772"}, "execd_port"),
        (Start, {"execd_port": True}, "execd_port"),
        (Start, {"ping_interval": None}, "ping_interval"),
        (Start, {"user": [0]}, "user"),
        (Start, {"user": ["0", 0]}, "user"),
        (Start, {"oom_control": 1}, "oom_control"),
        (Start, {"ping_interval": float("nan")}, "ping_interval"),
        (Start, {"command_grace": float("inf")}, "command_grace"),
        (Claim, {"token": None}, "token"),
        (Claim, {"env": {"A": 1}}, "env"),
        (Claim, {"env": []}, "env"),
        (Claim, {"entrypoint": "sleep 9"}, "entrypoint"),
        (Claim, {"address_space_limit": 1.5}, "address_space_limit"),
        (TemplateSetup, {"seccomp": "not hex"}, "seccomp"),
        (TemplateSetup, {"capabilities": None}, "capabilities"),
        (Fork, {"init": "1"}, "init"),
        (ForkAnswer, {"pid": "1"}, "pid"),
    ],
)
def test_a_message_of_another_shape_is_refused_naming_the_field(
    record: Any, change: dict[str, Any], field: str
) -> None:
    good = next(r for r in RECORDS if isinstance(r, record))
    message = {**json.loads(good.encode()), **change}
    with pytest.raises(ValueError, match=rf"\b{field} must") as refused:
        record.decode(json.dumps(message).encode())
    assert TOKEN not in str(refused.value)  # never the value, whatever it was


@pytest.mark.parametrize(
    "data", [b"", b"null", b"[1]", b"{", b'"x"', b"[" * 100_000 + b"]" * 100_000]
)
def test_what_is_no_json_object_is_refused(data: bytes) -> None:
    # the last nests past the parser's depth: a RecursionError, which a caller that catches
    # the decoder's ValueError would miss
    for record in (Start, Claim, TemplateSetup, Fork, ForkAnswer):
        with pytest.raises(ValueError, match="JSON"):
            record.decode(data)


def test_the_module_uses_no_syntax_after_python_3_9() -> None:
    with open(protocol.__file__) as source:
        tree = ast.parse(source.read(), feature_version=(3, 9))  # `match`: a SyntaxError here
    later = [k.arg for k in ast.walk(tree) if isinstance(k, ast.keyword)]
    assert not {"kw_only", "slots", "match_args"} & set(later)  # dataclass's, from 3.10
    with pytest.raises(SyntaxError):  # the check above can fail
        ast.parse("match x:\n    case 1:\n        pass\n", feature_version=(3, 9))


def _python39() -> str | None:
    """A Python 3.9 on this machine (pyenv's), or None."""
    root = os.path.expanduser(os.environ.get("PYENV_ROOT", "~/.pyenv"))
    found = sorted(glob.glob(os.path.join(root, "versions", "3.9*", "bin", "python3")))
    return found[-1] if found else None


def test_the_records_run_on_python_3_9() -> None:
    python = _python39()
    if python is None:
        pytest.skip("no Python 3.9 here (the image tests run execd on bullseye's 3.9)")
    script = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('protocol', sys.argv[1])\n"
        "p = importlib.util.module_from_spec(spec); sys.modules['protocol'] = p\n"
        "spec.loader.exec_module(p)\n"
        "for line in sys.stdin.buffer:\n"
        "    kind, _, data = line.rstrip(b'\\n').partition(b' ')\n"
        "    record = getattr(p, kind.decode()).decode(data)\n"
        "    sys.stdout.buffer.write(record.encode().rstrip(b'\\n') + b'\\n')\n"
        "print(sys.version_info[:2])\n"
    )
    lines = b"".join(
        type(r).__name__.encode() + b" " + r.encode().rstrip(b"\n") + b"\n" for r in RECORDS
    )
    done = subprocess.run(
        [python, "-I", "-S", "-c", script, protocol.__file__],
        input=lines,
        capture_output=True,
        check=True,
        timeout=60,
    )
    *echoed, version = done.stdout.decode().splitlines()
    assert version == "(3, 9)"
    assert [type(r).decode(e.encode()) for r, e in zip(RECORDS, echoed, strict=True)] == RECORDS
