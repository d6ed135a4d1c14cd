"""The seccomp filter of a sandbox's container: a classic-BPF program bwrap loads (`--seccomp`).

Refused with EPERM, as Docker's default profile refuses them: `io_uring_setup`, `_enter` and
`_register`, `userfaultfd`, `perf_event_open`, `bpf`, `keyctl`, `add_key`, `request_key`,
`kexec_load`, `kexec_file_load`, `init_module`, `finit_module`, `delete_module`,
`open_by_handle_at`, and `clone`/`unshare` whose flags ask for a new user namespace
(CLONE_NEWUSER: bwrap 0.8's `--disable-userns` would do it, but it cannot be combined with
`--userns-block-fd`). `clone3`, whose flags live in memory a filter cannot read, answers ENOSYS,
as in Docker's profile: the C library then falls back to `clone`. Every other system call is
allowed: a deny-list of the calls above, not Docker's allow-list of ~350. On x86_64 the x32 ABI
(numbers with bit 30 set) is refused, and so is any other architecture's system call (a
32-bit program gets EPERM for everything): their numbers differ from those checked.

With `setid` (a sandbox with a writable volume, whose files the host sees), a mode with the
set-user-ID or set-group-ID bit is refused with EPERM where a call gives a file one: `chmod`,
`fchmod`, `fchmodat`, `fchmodat2`, `mknod`, `mknodat`, `creat`, and `open`/`openat` with
O_CREAT or O_TMPFILE; `openat2`, whose mode lives in memory, answers ENOSYS (callers fall back
to `openat`). A set-id file would be set-id on the host too, to the volume directory's owner
(host root, where the server maps it: `volumes.ownership`): `nosuid` on the volume's mount
stops the bit working through the mount, not on the host's own path. The kernel clears both
bits when a file is written to or changes owner, so a file the sandbox may not give them
cannot keep them either; a file capability is the other privilege a file carries, and such a
sandbox lacks CAP_SETFCAP (`bwrap.VOLUME_CAPABILITIES`), without which the kernel sets none.

Why generated here, not libseccomp through ctypes (house rule 9 prefers a library): the
program is 30-odd instructions over syscall numbers that the kernel keeps stable, for the two
architectures we run on; generating it is a short pure function, tested by interpreting it
(`tests/unit/test_seccomp.py`), with no run-time library to find, load or lack (Debian's
`python3-seccomp` serves one interpreter only), and nothing to install in CI. A third
architecture gets no filter, and the status message says so.
"""

from __future__ import annotations

import errno
import platform
import struct
from collections.abc import Sequence

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
NR_OFFSET, ARCH_OFFSET, ARG0_LOW_OFFSET = 0, 4, 16  # arg0's low half (little-endian)
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000

REFUSED = (
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "perf_event_open",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
)
# (AUDIT_ARCH_*, system call numbers) of the architectures we filter, from the kernel's tables
ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "userfaultfd": 323,
            "perf_event_open": 298,
            "bpf": 321,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "open_by_handle_at": 304,
            "clone": 56,
            "unshare": 272,
            "clone3": 435,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "userfaultfd": 282,
            "perf_event_open": 241,
            "bpf": 280,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "open_by_handle_at": 265,
            "clone": 220,
            "unshare": 97,
            "clone3": 435,
        },
    ),
}

SETID_BITS = 0o6000  # S_ISUID | S_ISGID
CREATES = 0o100 | 0o20000000  # O_CREAT | __O_TMPFILE (the same on both architectures)
ARG_LOW_OFFSETS = tuple(ARG0_LOW_OFFSET + 8 * index for index in range(6))
# name: (index of its mode argument, index of its flags argument or None: always a mode)
SETID_CALLS: dict[str, tuple[int, int | None]] = {
    "chmod": (1, None),
    "fchmod": (1, None),
    "fchmodat": (2, None),
    "fchmodat2": (2, None),
    "mknod": (1, None),
    "mknodat": (2, None),
    "creat": (1, None),
    "open": (2, 1),
    "openat": (3, 2),
}
# Their numbers (aarch64 has only the *at calls and fchmod); openat2's answers ENOSYS.
SETID_NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {
        "chmod": 90,
        "fchmod": 91,
        "fchmodat": 268,
        "fchmodat2": 452,
        "mknod": 133,
        "mknodat": 259,
        "creat": 85,
        "open": 2,
        "openat": 257,
        "openat2": 437,
    },
    "aarch64": {
        "fchmod": 52,
        "fchmodat": 53,
        "fchmodat2": 452,
        "mknodat": 33,
        "openat": 56,
        "openat2": 437,
    },
}

Instruction = tuple[int, int | str, int | str, int]  # code, jump if true, if false, k


def _assemble(program: Sequence[Instruction | str]) -> bytes:
    """Resolve labels (strings in the program, targets in jumps) and pack `sock_filter`s."""
    labels: dict[str, int] = {}
    code: list[Instruction] = []
    for item in program:
        if isinstance(item, str):
            labels[item] = len(code)
        else:
            code.append(item)
    packed = b""
    for index, (op, true, false, k) in enumerate(code):
        jumps = [labels[j] - index - 1 if isinstance(j, str) else j for j in (true, false)]
        assert all(0 <= j <= 255 for j in jumps), "forward jumps of one byte only"
        packed += struct.pack("=HBBI", op, jumps[0], jumps[1], k)
    return packed


def _setid_checks(machine: str) -> tuple[list[Instruction | str], list[Instruction | str]]:
    """The jumps to the set-id checks (before the program allows a call) and the checks."""
    numbers = SETID_NUMBERS[machine]
    jumps: list[Instruction | str] = [(JEQ_K, "enosys", 0, numbers["openat2"])]
    checks: list[Instruction | str] = []
    modes = sorted({mode for mode, _ in SETID_CALLS.values()})
    for name, (mode, flags) in SETID_CALLS.items():
        if name in numbers:
            target = f"mode{mode}" if flags is None else f"flags{flags}"
            jumps.append((JEQ_K, target, 0, numbers[name]))
    for flags in sorted({f for _, f in SETID_CALLS.values() if f is not None}):
        mode = next(m for m, f in SETID_CALLS.values() if f == flags)
        checks += [
            f"flags{flags}",
            (LD_W_ABS, 0, 0, ARG_LOW_OFFSETS[flags]),
            (JSET_K, f"mode{mode}", 0, CREATES),
            (RET_K, 0, 0, RET_ALLOW),
        ]
    for mode in modes:
        checks += [
            f"mode{mode}",
            (LD_W_ABS, 0, 0, ARG_LOW_OFFSETS[mode]),
            (JSET_K, "eperm", 0, SETID_BITS),
            (RET_K, 0, 0, RET_ALLOW),
        ]
    return jumps, checks


def program(machine: str, setid: bool = False) -> bytes:
    """The filter for `machine` (`platform.machine()`); KeyError where we have no table.

    With `setid`, set-id modes are refused too (see the module docstring).
    """
    arch, numbers = ARCHES[machine]
    jumps, checks = _setid_checks(machine) if setid else ([], [])
    body: list[Instruction | str] = [
        (LD_W_ABS, 0, 0, ARCH_OFFSET),
        (JEQ_K, 0, "eperm", arch),
        (LD_W_ABS, 0, 0, NR_OFFSET),
    ]
    if machine == "x86_64":
        body.append((JGE_K, "eperm", 0, X32_SYSCALL_BIT))
    body += [(JEQ_K, "eperm", 0, numbers[name]) for name in REFUSED]
    body += [
        (JEQ_K, "enosys", 0, numbers["clone3"]),
        (JEQ_K, "flags", 0, numbers["clone"]),
        (JEQ_K, "flags", 0, numbers["unshare"]),
        *jumps,
        (RET_K, 0, 0, RET_ALLOW),
        "flags",
        (LD_W_ABS, 0, 0, ARG0_LOW_OFFSET),
        (JSET_K, "eperm", 0, CLONE_NEWUSER),
        (RET_K, 0, 0, RET_ALLOW),
        *checks,
        "eperm",
        (RET_K, 0, 0, RET_ERRNO | errno.EPERM),
        "enosys",
        (RET_K, 0, 0, RET_ERRNO | errno.ENOSYS),
    ]
    return _assemble(body)


def host_program(setid: bool = False) -> bytes | None:
    """This machine's filter (`program`), or None on an architecture without a table."""
    try:
        return program(platform.machine(), setid)
    except KeyError:
        return None
