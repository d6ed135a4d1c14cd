"""A sandbox's `resourceLimits`: parse them, decide how each is enforced, and say so honestly.

`memory`, `cpu` and a pids cap (`pids`, default 512) are enforced by cgroup controllers the
server can write (nested under its own group or `--cgroup-parent`, see `cgroup.py`). The disk
(`ephemeral-storage`, default 1Gi, and `inodes`, default 100000) is a size- and inode-limited
tmpfs per sandbox (`disk.py`: where it cannot be, what is enforced instead is said).

Without a writable controller:
- memory: RLIMIT_AS caps the address space of each process execd starts (per process, not
  the sandbox's total; execd itself stays uncapped): reported as NOT enforced.
- pids: RLIMIT_NPROC, set by the server on every process of the sandbox (its pid 1 too) and
  by execd on itself, at the claim (soft and hard: raising a hard limit needs CAP_SYS_RESOURCE
  in the host's namespace, which no sandbox has). Since Linux 5.14 the kernel counts it per
  user namespace and id (ucounts), and every sandbox has a user namespace of its own: the
  count is that sandbox's processes of one id (they also count in the user's own, which
  `identity.sandboxes_nproc` keeps a reserve of). A sandbox whose root
  is the server's own user has one id; one of a range has 65536, and code that switches ids
  gets the limit again for each: set there too, but reported as not enforced. Before 5.14 it
  counted every process of a host uid, all sandboxes' and the user's own: not used there.
- cpu: not enforced.
Whatever cannot be enforced is listed as such in the status message, never as enforced; a
limit the create asked for (not a default) that is not enforced is also in `Plan.dropped`:
one warning line on the server, or the create's refusal under `--require-limits`.
"""

from __future__ import annotations

import platform
import re
import resource
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from . import cgroup, disk
from .errors import LimitError

DEFAULT_PIDS = 512
MIN_MEMORY = 32 << 20
MAX_MEMORY = 2**63 - 1  # an int64, as Kubernetes quantities and cgroup limits are
MIN_PIDS = 16
CPU_PERIOD_US = 100_000
MIN_CPU = Decimal("0.01")
MAX_CPU = 1024
MAX_PIDS = 4_194_304  # the kernel's PID_MAX_LIMIT
MIN_DISK = 4 << 20  # execd's state directory lives there too
MIN_INODES = 512
MAX_INODES = 2**32 - 1
CONTROLLERS = ("memory", "cpu", "pids")
MAX_TEXT = 64  # a quantity's characters (2^63 in bytes is 19 digits)
DISK_KEYS = ("ephemeral-storage", "inodes")
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([a-zA-Z]*)")
# Kubernetes' resource names: an optional DNS-subdomain prefix and "/", then a qualified name
_RESOURCE_NAME = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_SUFFIXES: dict[str, int | Decimal] = {
    "": 1,
    "m": Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "Ei": 1 << 60,
}


def quantity(name: str, text: str) -> Decimal:
    """The value of a Kubernetes quantity (`128Mi`, `1Gi`, `512M`, `500m`, `0.5`, `2`).

    Raises:
        LimitError: naming the limit, when `text` is not a quantity.
    """
    match = _QUANTITY.fullmatch(text.strip()) if len(text) <= MAX_TEXT else None
    if match is None or match.group(2) not in _SUFFIXES:
        raise LimitError(
            f"resourceLimits.{name} {text[:40]!r} is not a quantity: use a number with an "
            "optional suffix (m, k, M, G, Ki, Mi, Gi, ...), e.g. 128Mi, 1Gi, 500m, 0.5, 2"
        )
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation:
        raise LimitError(f"resourceLimits.{name} {text[:40]!r} is out of range") from None


@dataclass(frozen=True)
class Requested:
    """The limits a create asked for: bytes, cores and processes (None: no such limit)."""

    memory: int | None
    cpu: Decimal | None
    pids: int
    texts: dict[str, str]  # as given, for the status message
    others: tuple[str, ...]  # keys the local server has no means to enforce
    disk: tuple[int, int] = (disk.DEFAULT_BYTES, disk.DEFAULT_INODES)  # bytes, inodes
    asked: frozenset[str] = frozenset()  # the keys the create gave (the rest are defaults)


def parse(limits: dict[str, str]) -> Requested:
    """Check and convert a create's `resourceLimits`.

    Raises:
        LimitError: a malformed or unusable value, named.
    """
    texts = {k: str(v).strip() for k, v in limits.items()}
    asked = frozenset(texts)
    memory = cpu = None
    if "memory" in texts:
        value = quantity("memory", texts["memory"])
        if not MIN_MEMORY <= value <= MAX_MEMORY or value != int(value):
            raise LimitError(
                f"resourceLimits.memory {texts['memory'][:40]!r} must be a whole number of "
                f"bytes of at least {MIN_MEMORY >> 20}Mi and below 8Ei (2^63, past what the "
                "kernel and Kubernetes take)"
            )
        memory = int(value)
    if "cpu" in texts:
        cpu = quantity("cpu", texts["cpu"])
        if not MIN_CPU <= cpu <= MAX_CPU:
            raise LimitError(
                f"resourceLimits.cpu {texts['cpu'][:40]!r} must be between 10m (0.01 cores) and "
                f"{MAX_CPU}"
            )
    pids = DEFAULT_PIDS
    if "pids" in texts:
        pids = _whole_number("pids", texts["pids"], MIN_PIDS, MAX_PIDS)
    texts.setdefault("pids", str(pids))
    others = tuple(k for k in texts if k not in (*CONTROLLERS, *DISK_KEYS))
    for key in others:  # named in the status, a refusal and the server's log: checked first
        if not _RESOURCE_NAME.fullmatch(key):
            raise LimitError(
                f"resourceLimits key {key[:40]!r} is not a resource name: a Kubernetes one"
                " (letters, digits, '-', '_', '.', at most 63, after an optional 'domain/'),"
                " e.g. nvidia.com/gpu"
            )
        quantity(key, texts[key])
    return Requested(memory, cpu, pids, texts, others, _disk(texts), asked)


def _whole_number(key: str, text: str, low: int, high: int) -> int:
    """`resourceLimits[key]` (`text`) as a whole number from `low` to `high` (LimitError)."""
    value = quantity(key, text)
    if value != int(value) or not low <= value <= high:
        raise LimitError(
            f"resourceLimits.{key} {text[:40]!r} must be a whole number from {low} to {high}"
        )
    return int(value)


def _disk(texts: dict[str, str]) -> tuple[int, int]:
    """The disk's bytes and inodes of `texts` (the defaults where absent, written in `texts`)."""
    size, inodes = disk.DEFAULT_BYTES, disk.DEFAULT_INODES
    if "ephemeral-storage" in texts:
        text = texts["ephemeral-storage"]
        value = quantity("ephemeral-storage", text)
        if not MIN_DISK <= value <= MAX_MEMORY or value != int(value):
            raise LimitError(
                f"resourceLimits.ephemeral-storage {text[:40]!r} must be a whole number of "
                f"bytes of at least {MIN_DISK >> 20}Mi and below 8Ei, e.g. 1Gi"
            )
        size = int(value)
    if "inodes" in texts:
        inodes = _whole_number("inodes", texts["inodes"], MIN_INODES, MAX_INODES)
    whole_gi = size % (1 << 30) == 0
    texts.setdefault("ephemeral-storage", f"{size >> 30}Gi" if whole_gi else str(size))
    texts.setdefault("inodes", str(inodes))
    return size, inodes


@dataclass
class Plan:
    """How a sandbox's limits are enforced: cgroup files to write, rlimits for processes."""

    cgroup: dict[str, dict[str, str]] = field(default_factory=dict)
    address_space: int | None = None  # bytes, for every process execd starts
    processes: int | None = None  # RLIMIT_NPROC of execd and all it starts
    disk: tuple[int, int] | None = None  # the tmpfs's (or each tmpfs's) bytes and inodes
    enforced: list[str] = field(default_factory=list)
    unenforced: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # asked for and not enforced: the keys

    def message(self) -> str:
        """The fixed-format sentence of the status message."""
        return (
            f" Limits enforced: {', '.join(self.enforced) or 'none'};"
            f" not enforced: {', '.join(self.unenforced) or 'none'}."
        )


def writable_controllers(place: cgroup.Place = cgroup.OWN) -> frozenset[str]:
    """The limit controllers this server may make v1 groups in (empty off Linux or unprivileged;
    a v2 host's are `cgroup2.arrange`'s)."""
    return frozenset(c for c in CONTROLLERS if cgroup.usable(c, place))


def nproc_per_namespace(release: str | None = None) -> bool:
    """Whether this kernel (`release`, default the running one) counts RLIMIT_NPROC per user
    namespace and id (ucounts, Linux 5.14 and later)."""
    found = re.match(r"(\d+)\.(\d+)", release if release is not None else platform.release())
    return found is not None and (int(found[1]), int(found[2])) >= (5, 14)


def plan(
    requested: Requested,
    controllers: frozenset[str],
    disk_mode: str = "none",
    ids: str = "",
) -> Plan:
    """Decide how each requested limit is enforced with the `controllers` at hand, the
    sandbox's `disk.mode` and its `ids` inside: "one" (its root is the server's user),
    "range" (65536 ids), "" (not isolated, or a kernel that counts RLIMIT_NPROC per host uid:
    see `nproc_per_namespace`)."""
    out = Plan()
    texts = requested.texts
    if requested.memory is not None:
        if "memory" in controllers:
            out.cgroup["memory"] = {"memory.limit_in_bytes": str(requested.memory)}
            out.enforced.append(f"memory={texts['memory']} (cgroup)")
        else:
            out.address_space = requested.memory
            out.unenforced.append(
                f"memory={texts['memory']} (no writable memory cgroup: only RLIMIT_AS, per"
                " process, not the sandbox's total)"
            )
    if requested.cpu is not None:
        if "cpu" in controllers:
            quota = int(requested.cpu * CPU_PERIOD_US)
            out.cgroup["cpu"] = {
                "cpu.cfs_period_us": str(CPU_PERIOD_US),
                "cpu.cfs_quota_us": str(quota),
            }
            out.enforced.append(f"cpu={texts['cpu']} (cgroup)")
        else:
            out.unenforced.append(f"cpu={texts['cpu']} (no writable cpu cgroup)")
    if "pids" in controllers:
        out.cgroup["pids"] = {"pids.max": str(requested.pids)}
        out.enforced.append(f"pids={texts['pids']} (cgroup)")
    elif ids == "one":
        out.processes = requested.pids
        out.enforced.append(f"pids={texts['pids']} (RLIMIT_NPROC in the sandbox's user namespace)")
    elif ids:  # set all the same: it holds a sandbox that stays one id
        out.processes = requested.pids
        out.unenforced.append(
            f"pids={texts['pids']} (no writable pids cgroup; RLIMIT_NPROC holds per id inside"
            " only: code that switches among the range's ids gets as many again for each)"
        )
    else:
        out.unenforced.append(
            f"pids={texts['pids']} (no writable pids cgroup; RLIMIT_NPROC here counts a"
            " whole host user's processes, not a sandbox's)"
        )
    _plan_disk(out, requested, disk_mode)
    out.unenforced += [f"{k}={texts[k]} (not supported locally)" for k in requested.others]
    out.dropped = [
        key
        for key in texts
        if key in requested.asked and any(text.startswith(f"{key}=") for text in out.unenforced)
    ]
    return out


def _plan_disk(out: Plan, requested: Requested, disk_mode: str) -> None:
    size, inodes = (f"{k}={requested.texts[k]}" for k in DISK_KEYS)
    if disk_mode == "tmpfs":
        out.disk = requested.disk
        out.enforced += [
            f"{size} (tmpfs for all it writes, in memory: charged to the writer's memory cgroup)",
            f"{inodes} (tmpfs)",
        ]
    elif disk_mode == "per-directory":
        out.disk = requested.disk
        out.enforced += [
            f"{size} (tmpfs, in memory, split between the writable directories: /tmp and the"
            " home 40% each, the rest the other 20%)",
            f"{inodes} (split likewise)",
        ]
    else:
        out.unenforced += [f"{size} (no per-sandbox filesystem here)", f"{inodes} (likewise)"]


def limit_processes(pids: list[int], count: int, ranged_root: bool) -> None:
    """RLIMIT_NPROC `count` (soft and hard; no higher than each one's hard limit) for every
    process `pids` of a sandbox, its init (pid 1) too: one it left at the server's limit could
    be made, through ptrace by its root, to fork past the sandbox's.

    Raises:
        OSError: the kernel refused (a server not root owns the sandbox's user namespace).
    """
    for pid in pids:
        try:
            hard = resource.prlimit(pid, resource.RLIMIT_NPROC)[1]
            value = count if hard == resource.RLIM_INFINITY else min(count, hard)
            resource.prlimit(pid, resource.RLIMIT_NPROC, (value, value))
        except ProcessLookupError:
            continue
        except PermissionError:
            # A root server without CAP_SYS_RESOURCE (a container's root) may not: its
            # sandboxes' namespaces are their range root's (`ranged_root`). execd, that id
            # too, sets its own and its init's at the claim.
            if not ranged_root:
                raise
