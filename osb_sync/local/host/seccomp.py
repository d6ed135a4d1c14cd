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


def program(machine: str) -> bytes:
    """The filter for `machine` (`platform.machine()`); KeyError where we have no table."""
    arch, numbers = ARCHES[machine]
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
        (RET_K, 0, 0, RET_ALLOW),
        "flags",
        (LD_W_ABS, 0, 0, ARG0_LOW_OFFSET),
        (JSET_K, "eperm", 0, CLONE_NEWUSER),
        (RET_K, 0, 0, RET_ALLOW),
        "eperm",
        (RET_K, 0, 0, RET_ERRNO | errno.EPERM),
        "enosys",
        (RET_K, 0, 0, RET_ERRNO | errno.ENOSYS),
    ]
    return _assemble(body)


def host_program() -> bytes | None:
    """This machine's filter, or None on an architecture without a table."""
    try:
        return program(platform.machine())
    except KeyError:
        return None
