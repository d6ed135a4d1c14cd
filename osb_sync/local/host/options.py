"""LocalServer's options, each declared once: keyword, default, check, docs and `serve` flag.

One `Option` per keyword of `LocalServer` (in its signature's order, `OPTIONS`). From it come
the keyword's default (the signature reads `HOST.default`, ...), its check (`check`, run by
`LocalServer.__init__`, which raises ValueError naming the keyword), its line in LocalServer's
`Args` (`args_section`), and the `osb-sync serve` flag (`add_flags` builds them, `keywords`
turns parsed flags back into LocalServer keywords, where the same check answers in the flag's
terms). An option without a flag says why (`python_only`); `tests/unit/test_server_options.py`
holds the declarations, the signature and the serve parser to each other.

Standard library only, and no import of the server: the command line reads these while it
builds its parser, for every command.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from ..http.httpd import Limits

T = TypeVar("T")

MAX_SANDBOX_TIMEOUT = 86400  # the real server's example `max_sandbox_timeout_seconds`
POLICY_CHOICES = ("refuse", "accept")
ARGS_PLACEHOLDER = "(one line per option, written from the declarations in `options.py`)"


@dataclass(frozen=True)
class Option(Generic[T]):
    """One LocalServer keyword and its `serve` flag.

    Attributes:
        name: the LocalServer keyword.
        default: its default.
        doc: its `Args` line, in Python's terms.
        flag: the `serve` flag, or None with `python_only` saying why there is none.
        help: the flag's help, in the command line's terms.
        python_only: why `serve` has no flag for it.
        check: the value's problem ("must be ...", after the keyword or flag) or None.
        parse: the flag's argparse `type` (its text to the value); the check runs on it too.
        action: the flag's argparse action ("store", "append", "store_true").
        metavar: the flag's metavar.
        flag_default: the flag's default where it differs from `default` (`serve --port`).
        from_flag: the parsed flag to the keyword's value (None: the command supplies it).
    """

    name: str
    default: T
    doc: str
    flag: str | None = None
    help: str = ""
    python_only: str = ""
    check: Callable[[T], str | None] | None = None
    parse: Callable[[str], T] | None = None
    action: str = "store"
    metavar: str | None = None
    flag_default: Any = None
    from_flag: Callable[[Any], T] | None = lambda value: value

    @property
    def dest(self) -> str:
        """The attribute argparse stores the flag in (its own rule for a long option)."""
        assert self.flag is not None
        return self.flag[2:].replace("-", "_")

    def problem(self, value: T) -> str | None:
        """What is wrong with `value` ("must be ..."), or None."""
        return self.check(value) if self.check is not None else None


def _cgroup_path(value: str) -> str | None:
    parts = [part for part in value.split("/") if part]
    if not parts or any(part in (".", "..") for part in parts) or "\0" in value:
        return "must be a path of cgroup directories without '.' or '..', e.g. /osb-alice"
    return None


def _at_least_zero(value: int) -> str | None:
    return "must be 0 or more" if value < 0 else None


def _a_policy(value: str) -> str | None:
    return None if value in POLICY_CHOICES else f"must be one of {POLICY_CHOICES}"


HOST = Option(
    "host",
    "127.0.0.1",
    "address to bind; keep the loopback default (anyone who reaches the port can run code in"
    " sandboxes): any other needs `api_key` (or `allow_no_api_key`). An IPv6 address binds"
    " IPv6; `::` takes IPv4 too (dual-stack).",
    flag="--host",
    help="address to bind (keep loopback; any other needs an API key; :: is IPv6 and IPv4)",
)
PORT = Option(
    "port",
    0,
    "port to bind, 0 for a free one.",
    flag="--port",
    help="port to bind (0: any free port)",
    parse=int,
    flag_default=8080,  # a command line server wants a port its clients can be told
)
API_KEY: Option[str | None] = Option(
    "api_key",
    None,
    "when set, lifecycle calls need it in `OPEN-SANDBOX-API-KEY`.",
    flag="--api-key-file",
    help="read the API key from this file (first line)",
    metavar="PATH",
    from_flag=None,  # serve reads the file, else --api-key, else the environment
)
ALLOW_NO_API_KEY = Option(
    "allow_no_api_key",
    False,
    "serve on a `host` other machines reach without `api_key`: anyone who reaches the port"
    " can create sandboxes and run code in them (without it, such a server refuses to start).",
    flag="--allow-no-api-key",
    help="serve on a non-loopback --host without an API key: anyone who reaches the port runs "
    "code in sandboxes (default: refuse to start)",
    action="store_true",
    flag_default=False,
)
MIN_TIMEOUT = Option(
    "min_timeout",
    60,
    "smallest accepted sandbox `timeout` in seconds (the real server: 60).",
    flag="--min-timeout",
    help="smallest sandbox lifetime",
    parse=int,
    metavar="SECONDS",
)
MAX_TIMEOUT = Option(
    "max_timeout",
    MAX_SANDBOX_TIMEOUT,
    "largest accepted sandbox `timeout`, and renewal ahead, in seconds.",
    python_only="serve keeps the real server's example maximum, a day",
)
PENDING_SECONDS = Option(
    "pending_seconds",
    0.0,
    "how long a new sandbox reports `Pending` before `Running`.",
    flag="--pending-seconds",
    help="time a new sandbox stays Pending",
    parse=float,
    metavar="SECONDS",
)
PING_INTERVAL = Option(
    "ping_interval",
    3.0,
    "seconds between execd heartbeat events.",
    python_only="tests shorten it; serve keeps execd's 3 s",
)
UNENFORCED_NETWORK_POLICY = Option(
    "unenforced_network_policy",
    "refuse",
    '"refuse" (400, like a server without egress support) or "accept" (create anyway; the'
    " status message says the policy is not enforced).",
    flag="--allow-unenforced-network-policy",
    help="accept deny-all network policies even where they cannot be enforced",
    check=_a_policy,
    action="store_true",
    flag_default=False,
    from_flag=lambda accept: "accept" if accept else "refuse",
)
ROOT_DIR: Option[str | Path | None] = Option(
    "root_dir",
    None,
    "the state directory, where sandbox directories go (default a fresh temporary"
    " directory, removed on stop); a start reaps what a killed server left in it, and its"
    " sandboxes are not carried over (their ids answer 404).",
    flag="--state-dir",
    help="state directory of the sandboxes (default: a fresh temporary directory, removed"
    " when the server stops); a start removes what a killed server left there, and that"
    " server's sandbox ids answer 404",
    metavar="DIR",
)
COMMAND_GRACE = Option(
    "command_grace",
    1.0,
    "seconds /command keeps its stream open after the terminal event.",
    python_only="tests shorten it; serve keeps 1 s",
)
ISOLATION: Option[bool | None] = Option(
    "isolation",
    None,
    "None (fail closed) to isolate sandboxes, and where this host cannot (no bubblewrap, no"
    " user namespaces) to start anyway but answer every create 503 with what to install or"
    " allow; True to refuse to start there; False to run sandboxes NOT isolated (every"
    " create's status message says so).",
    flag="--no-isolation",
    help="never isolate sandboxes: code runs as the server's user (default: isolate, and "
    "where that is impossible answer creates 503)",
    action="store_true",
    flag_default=False,
    from_flag=lambda off: False if off else None,
)
REQUIRE_ID_RANGE = Option(
    "require_id_range",
    False,
    "on a server that is not root, refuse (as isolation impossible) to map a sandbox's root to"
    " the server's own user where the user has no range of subordinate ids (or no newuidmap):"
    " by default such a server maps it so, and each create's status says so.",
    flag="--require-id-range",
    help="a server that is not root and has no subordinate id range refuses creates (503, "
    "with the usermod line) instead of making root inside your user outside",
    action="store_true",
    flag_default=False,
)
CGROUP_PARENT: Option[str | None] = Option(
    "cgroup_parent",
    None,
    "the cgroup (v1: in each of the memory, pids, cpu and freezer hierarchies; v2: in the"
    " one tree) under which sandboxes' groups go, as Docker's --cgroup-parent: from the"
    " hierarchy's root where it starts with '/', else from the server's own group. A server"
    " that is not root enforces limits there once an operator made it and gave it to the"
    " server's user (`chown -R USER`); default: the server's own group.",
    flag="--cgroup-parent",
    help="make sandboxes' cgroups under PATH (in each controller's hierarchy on cgroup v1;"
    " '/x' from the root, 'x' from the server's own group), e.g. one an operator gave this"
    " user with chown -R",
    check=lambda value: None if value is None else _cgroup_path(value),
    parse=str,
    metavar="PATH",
)
REQUIRE_LIMITS = Option(
    "require_limits",
    False,
    "refuse (500 naming the fix) a create asking for a resource limit this server cannot"
    " enforce (no writable cgroup: a server that is not root without `cgroup_parent`), instead"
    " of creating it with the limit named as not enforced in its status.",
    flag="--require-limits",
    help="refuse creates asking for a limit (memory, cpu, pids, inodes) this server cannot"
    " enforce, instead of creating them with the limit reported as not enforced",
    action="store_true",
    flag_default=False,
)
ALLOWED_HOSTS: Option[Iterable[str]] = Option(
    "allowed_hosts",
    (),
    "more names requests may give in `Host` (besides loopback and `host`).",
    flag="--allowed-host",
    help="also answer requests whose Host header is NAME (repeatable)",
    action="append",
    metavar="NAME",
    flag_default=[],
)
LIMITS: Option[Limits | None] = Option(
    "limits",
    None,
    "connection timeouts and cap (see `httpd.Limits`).",
    python_only="a `Limits` value (several timeouts and a cap), not one flag",
)
ALLOWED_HOST_PATHS: Option[Iterable[str | Path]] = Option(
    "allowed_host_paths",
    (),
    "host directories whose trees `host` volumes may mount (none by default: every `host`"
    " volume answers 400).",
    flag="--allow-host-path",
    help="let `host` volumes mount directories under DIR (repeatable; default: none)",
    action="append",
    metavar="DIR",
    flag_default=[],
)
VOLUME_ROOT: Option[str | Path | None] = Option(
    "volume_root",
    None,
    "where `pvc` volumes live, one directory per claimName (default: `volumes/` in the root"
    " directory).",
    flag="--volume-root",
    help="directory of `pvc` volumes, one folder per claimName (default: volumes/ in the "
    "server's temporary state directory, removed when it stops)",
    metavar="DIR",
)
VOLUME_ROOT_IS_HOST_ROOT = Option(
    "volume_root_is_host_root",
    False,
    "on a server running as root, let a sandbox's root write a volume whose directory host"
    " root owns (uid or gid 0) as host root, as Docker's container root does: what it writes"
    " there belongs to host root (set-id modes and file capabilities stay refused). Without"
    " it, such a volume is not writable by the sandbox's root, and its create's status says"
    " so; a directory of any other owner is always written as that owner.",
    flag="--volume-root-is-host-root",
    help="let sandboxes' root write volumes host root owns as host root, as Docker does "
    "(default: such volumes are not writable by sandboxes' root; chown them instead)",
    action="store_true",
    flag_default=False,
)
EXECD: Option[str | os.PathLike[str] | None] = Option(
    "execd",
    None,
    "an execd binary (OpenSandbox's) to run in every sandbox instead of ours; needs isolated"
    " sandboxes (see `execd_binary.py`).",
    flag="--execd",
    help="run this execd binary (OpenSandbox's) in every sandbox instead of the built-in one",
    metavar="PATH",
)
JUPYTER: Option[str | os.PathLike[str] | None] = Option(
    "jupyter",
    None,
    "with `execd`, the `jupyter` executable of a venv (notebook, ipykernel and a kernelspec"
    " named `python`) whose Jupyter server each sandbox's execd runs code in.",
    flag="--jupyter",
    help="with --execd: the jupyter executable of a venv (notebook, ipykernel, kernelspec "
    "'python') whose Jupyter server runs each sandbox's code",
    metavar="PATH",
)
EXECD_IMAGE: Option[str | None] = Option(
    "execd_image",
    None,
    "an image reference whose execd binary (OpenSandbox's: `/execd`, `/usr/local/bin/execd` or"
    " its Entrypoint) every sandbox runs, pulled at start like any image, as the real server's"
    " `execd_image` setting (see `images/execd_image.py`); instead of `execd`.",
    flag="--execd-image",
    help="take the execd binary every sandbox runs from this image, pulled at start (as the "
    "real server's execd_image); instead of --execd",
    metavar="REF",
)
SPARE_CONTAINERS = Option(
    "spare_containers",
    1,
    "containers kept started ahead for creates to claim (see `spares.py`; 0 turns them off);"
    " each costs the memory of an idle sandbox.",
    flag="--spare-containers",
    help="containers kept started ahead for fast creates (0: none)",
    check=_at_least_zero,
    parse=int,
    metavar="N",
)
CONTAINER_LOG_SIZE = Option(
    "container_log_size",
    16 << 20,
    "bytes of each sandbox's container log the server keeps, in its own memory (the oldest"
    " are dropped first, the drop noted; see `logs.py`).",
    flag="--container-log-size",
    help="bytes of each sandbox's container log kept in the server's memory, the oldest "
    "dropped first (default 16 MiB)",
    check=lambda value: None if value >= 4096 else "must be 4096 or more",
    parse=int,
    metavar="BYTES",
)
CONTAINER_LOGS_TOTAL = Option(
    "container_logs_total",
    256 << 20,
    "bytes all sandboxes' container logs keep together, in the server's memory: once more"
    " sandboxes would pass it, each log keeps an even share (64 KiB at least; see `logs.py`).",
    flag="--container-logs-total",
    help="bytes all container logs keep together in the server's memory, shared evenly "
    "(default 256 MiB)",
    check=lambda value: None if value >= 4096 else "must be 4096 or more",
    parse=int,
    metavar="BYTES",
)

IMAGE_STORE: Option[str | Path | None] = Option(
    "image_store",
    None,
    "where pulled images are unpacked, shared by servers (default"
    " `$XDG_CACHE_HOME/osb-sync/images`).",
    flag="--image-store",
    help="directory of the image store (default: $XDG_CACHE_HOME/osb-sync/images)",
    metavar="DIR",
)
IMAGE_STORE_SIZE = Option(
    "image_store_size",
    10 << 30,
    "bytes of unpacked images the store keeps before it evicts the least recently used.",
    flag="--image-store-size",
    help="bytes of images kept before the least recently used go (default 10 GiB)",
    check=_at_least_zero,
    parse=int,
    metavar="BYTES",
)
IMAGE_SIZE_LIMIT: Option[int | None] = Option(
    "image_size_limit",
    None,
    "bytes one image may unpack to (its layers uncompressed); a larger one fails the create with"
    " 413 `IMAGE_TOO_LARGE` and leaves nothing (default: `image_store_size`, since the store"
    " could never keep a larger one; 10 GiB when that is 0).",
    flag="--image-size-limit",
    help="bytes one image may unpack to (default: --image-store-size)",
    check=lambda value: None if value is None or value > 0 else "must be 1 or more",
    parse=int,
    metavar="BYTES",
)
INSECURE_REGISTRIES: Option[Iterable[str]] = Option(
    "insecure_registries",
    (),
    "registries (host[:port]) pulled from without TLS verification, plain HTTP allowed, as"
    " Docker's `insecure-registries` (loopback registries always are).",
    flag="--insecure-registry",
    help="pull from HOST[:PORT] without TLS verification (repeatable; loopback always is)",
    action="append",
    metavar="HOST",
    flag_default=[],
)
REGISTRY_AUTH_FILE: Option[str | Path | None] = Option(
    "registry_auth_file",
    None,
    "the server's own registry credentials (an `auth.json` as skopeo and podman write it), used"
    " when a create gives no `image.auth`; never `~/.docker/config.json` unless named here.",
    flag="--registry-auth-file",
    help="registry credentials of the server (containers auth.json; default: none)",
    metavar="PATH",
)
LOCAL_IMAGE_PATHS: Option[Iterable[str | Path]] = Option(
    "local_image_paths",
    (),
    "directories under which `oci:DIR:TAG` and `docker-archive:FILE` images may be read (none"
    " by default).",
    flag="--allow-image-path",
    help="let oci: and docker-archive: images be read under DIR (repeatable; default: none)",
    action="append",
    metavar="DIR",
    flag_default=[],
)
DEFAULT_HOST_IMAGES = ("opensandbox/code-interpreter:v1.1.0",)  # the client's DEFAULT_TEMPLATE
HOST_IMAGES: Option[Iterable[str]] = Option(
    "host_images",
    DEFAULT_HOST_IMAGES,
    "image URIs that get the host's view (its /usr and the server's Python, no download);"
    " by default the client's default template.",
    flag="--host-image",
    help="give creates of this image URI the host's view, no download (repeatable; default: "
    "the client's default template)",
    action="append",
    metavar="URI",
    flag_default=[],
    from_flag=lambda given: tuple(given) or DEFAULT_HOST_IMAGES,
)

OPTIONS: tuple[Option[Any], ...] = (
    HOST,
    PORT,
    API_KEY,
    ALLOW_NO_API_KEY,
    MIN_TIMEOUT,
    MAX_TIMEOUT,
    PENDING_SECONDS,
    PING_INTERVAL,
    UNENFORCED_NETWORK_POLICY,
    ROOT_DIR,
    COMMAND_GRACE,
    ISOLATION,
    REQUIRE_ID_RANGE,
    CGROUP_PARENT,
    REQUIRE_LIMITS,
    ALLOWED_HOSTS,
    LIMITS,
    ALLOWED_HOST_PATHS,
    VOLUME_ROOT,
    VOLUME_ROOT_IS_HOST_ROOT,
    EXECD,
    JUPYTER,
    EXECD_IMAGE,
    SPARE_CONTAINERS,
    CONTAINER_LOG_SIZE,
    CONTAINER_LOGS_TOTAL,
    IMAGE_STORE,
    IMAGE_STORE_SIZE,
    IMAGE_SIZE_LIMIT,
    INSECURE_REGISTRIES,
    REGISTRY_AUTH_FILE,
    LOCAL_IMAGE_PATHS,
    HOST_IMAGES,
)


def loopback(host: str) -> bool:
    """Whether `host` is a loopback address (IPv4-mapped too): a server bound there is this
    machine's alone. Not a name, `localhost` included: a name is judged by the address it
    bound (`LocalServer.start`)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


def is_name(host: str) -> bool:
    """Whether `host` names a host rather than being an address ("" is every address)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host != ""
    return False


def needs_a_key(host: str, bound: str) -> str:
    """The refusal of a server other machines reach (bound to `bound`) without a key."""
    where = f"host {host!r}" + (f" (bound to {bound!r})" if bound != host else "")
    return (
        f"{where} is not loopback: anyone who reaches the port could run code in sandboxes, so"
        " the server needs an API key: OPEN_SANDBOX_API_KEY or --api-key-file (osb-sync"
        " serve), api_key= (LocalServer); to serve without one anyway, and let them, pass"
        " allow_no_api_key=True"
    )


def check(given: dict[str, Any]) -> None:
    """Check LocalServer's keywords `given` (every option by name).

    Raises:
        ValueError: a value's problem, naming its keyword; a `host` address other machines
            reach without `api_key` or `allow_no_api_key`; `jupyter` without `execd` or
            `execd_image`; both of those.
    """
    for option in OPTIONS:
        problem = option.problem(given[option.name])
        if problem is not None:
            raise ValueError(f"{option.name} {problem}")
    host = given["host"]
    keyless = given["api_key"] is None and not given["allow_no_api_key"]
    if keyless and not loopback(host) and not is_name(host):  # a name: once bound
        raise ValueError(needs_a_key(host, host))
    if given["execd"] is not None and given["execd_image"] is not None:
        raise ValueError("execd and execd_image both name an execd binary: pass one of them")
    if given["jupyter"] is not None and given["execd"] is None and not given["execd_image"]:
        raise ValueError("jupyter is for an execd binary: pass execd (or execd_image) too")


def args_section(indent: str = "        ") -> str:
    """The `Args` lines of LocalServer's docstring, one per option, wrapped at 96 columns."""
    lines: list[str] = []
    for option in OPTIONS:
        text = f"{option.name}: {option.doc}"
        lines += textwrap.wrap(text, 96, initial_indent=indent, subsequent_indent=indent + "    ")
    return "\n".join(lines).lstrip()


def _flag_type(option: Option[Any]) -> Callable[[str], Any]:
    """The argparse `type` of `option`'s flag: its parse, then its check in the flag's terms."""
    assert option.parse is not None
    parse = option.parse

    def parsed(text: str) -> Any:
        value = parse(text)
        problem = option.problem(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{problem}, not {value}")
        return value

    parsed.__name__ = parse.__name__  # argparse names it in "invalid int value"
    return parsed


def add_flags(parser: argparse.ArgumentParser, only: Iterable[Option[Any]] | None = None) -> None:
    """Add the `serve` flag of every option that has one to `parser` (of `only`'s, if given:
    the image commands take the store's)."""
    for option in OPTIONS if only is None else only:
        if option.flag is None:
            continue
        settings: dict[str, Any] = {"action": option.action, "help": option.help}
        default = option.flag_default if option.flag_default is not None else option.default
        if option.action != "store_true":
            settings["metavar"] = option.metavar
            if option.parse is not None:
                settings["type"] = _flag_type(option)
        parser.add_argument(option.flag, default=default, **settings)


def keywords(args: argparse.Namespace, **supplied: Any) -> dict[str, Any]:
    """LocalServer's keywords from parsed `serve` flags; `supplied` gives those the command reads.

    Raises:
        KeyError: an option whose value the command supplies (`from_flag` None) is missing.
    """
    found: dict[str, Any] = {}
    for option in OPTIONS:
        if option.flag is None:
            continue
        if option.from_flag is None:
            found[option.name] = supplied[option.name]
        else:
            found[option.name] = option.from_flag(getattr(args, option.dest))
    return found
