"""A sandbox's `resourceLimits`: parse them, decide how each is enforced, and say so honestly.

`memory`, `cpu` and a pids cap (`pids`, default 512) are enforced by cgroup v1 controllers the
server can write (nested under its own group, see `cgroup.py`). The disk (`ephemeral-storage`,
default 1Gi, and `inodes`, default 100000) is a size- and inode-limited tmpfs per sandbox
(`disk.py`: where it cannot be, what is enforced instead is said). Where the memory controller is
not writable, RLIMIT_AS caps the address space of each process execd starts instead (per
process, not the sandbox's total; execd itself stays uncapped). RLIMIT_NPROC is never used:
it counts every process of a user id (host root for a root server, else the server's own
user), so it is no per-sandbox cap. Whatever cannot be enforced is listed as such in the
status message, never as enforced.
"""

from __future__ import annotations

import re
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
DISK_KEYS = ("ephemeral-storage", "inodes")
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([a-zA-Z]*)")
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
    match = _QUANTITY.fullmatch(text.strip())
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


def parse(limits: dict[str, str]) -> Requested:
    """Check and convert a create's `resourceLimits`.

    Raises:
        LimitError: a malformed or unusable value, named.
    """
    texts = {k: str(v) for k, v in limits.items()}
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
    return Requested(memory, cpu, pids, texts, others, _disk(texts))


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
    """How a sandbox's limits are enforced: cgroup files to write, an RLIMIT_AS for processes."""

    cgroup: dict[str, dict[str, str]] = field(default_factory=dict)
    address_space: int | None = None  # bytes, for every process execd starts
    disk: tuple[int, int] | None = None  # the tmpfs's (or each tmpfs's) bytes and inodes
    enforced: list[str] = field(default_factory=list)
    unenforced: list[str] = field(default_factory=list)

    def message(self) -> str:
        """The fixed-format sentence of the status message."""
        return (
            f" Limits enforced: {', '.join(self.enforced) or 'none'};"
            f" not enforced: {', '.join(self.unenforced) or 'none'}."
        )


def writable_controllers() -> frozenset[str]:
    """The limit controllers this server may make groups in (empty off Linux or unprivileged)."""
    return frozenset(c for c in CONTROLLERS if cgroup.usable(c))


def plan(requested: Requested, controllers: frozenset[str], disk_mode: str = "none") -> Plan:
    """Decide how each requested limit is enforced with the `controllers` at hand and the
    sandbox's `disk.mode`."""
    out = Plan()
    texts = requested.texts
    if requested.memory is not None:
        if "memory" in controllers:
            out.cgroup["memory"] = {"memory.limit_in_bytes": str(requested.memory)}
            out.enforced.append(f"memory={texts['memory']} (cgroup)")
        else:
            out.address_space = requested.memory
            out.enforced.append(f"memory={texts['memory']} (RLIMIT_AS, per process)")
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
    else:
        out.unenforced.append(
            f"pids={texts['pids']} (no writable pids cgroup; RLIMIT_NPROC counts a whole"
            " user's processes, not a sandbox's)"
        )
    _plan_disk(out, requested, disk_mode)
    out.unenforced += [f"{k}={texts[k]} (not supported locally)" for k in requested.others]
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
        out.enforced.append(f"{size} (bwrap tmpfs, per writable directory, in memory)")
        out.unenforced.append(f"{inodes} (a server not running as root mounts no tmpfs)")
    else:
        out.unenforced.append(f"{size}, {inodes} (no per-sandbox filesystem here)")
