"""The sandbox's seccomp program, run by a small classic-BPF interpreter (the kernel's subset)."""

from __future__ import annotations

import errno
import struct

import pytest

from osb_sync.local.host import seccomp

EPERM = seccomp.RET_ERRNO | errno.EPERM
ENOSYS = seccomp.RET_ERRNO | errno.ENOSYS


def run(program: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """What the filter returns for a call `nr` of `arch` whose first argument is `arg0`."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    code = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    for _ in range(len(code)):
        op, jt, jf, k = code[pc]
        if op == seccomp.LD_W_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif op == seccomp.RET_K:
            return k
        else:
            taken = {
                seccomp.JEQ_K: acc == k,
                seccomp.JGE_K: acc >= k,
                seccomp.JSET_K: bool(acc & k),
            }[op]
            pc += 1 + (jt if taken else jf)
    raise AssertionError("the program ran off its end")


@pytest.mark.parametrize("machine", sorted(seccomp.ARCHES))
def test_the_named_calls_are_refused_and_the_others_allowed(machine: str) -> None:
    arch, numbers = seccomp.ARCHES[machine]
    program = seccomp.program(machine)
    for name in seccomp.REFUSED:
        assert run(program, numbers[name], arch) == EPERM, name
    assert run(program, 0, arch) == seccomp.RET_ALLOW  # read (x86_64), io_setup (aarch64)
    assert run(program, 63, arch) == seccomp.RET_ALLOW
    assert run(program, numbers["clone3"], arch) == ENOSYS


@pytest.mark.parametrize("machine", sorted(seccomp.ARCHES))
@pytest.mark.parametrize("call", ["clone", "unshare"])
def test_new_user_namespaces_are_refused_other_clones_allowed(machine: str, call: str) -> None:
    arch, numbers = seccomp.ARCHES[machine]
    program = seccomp.program(machine)
    thread_flags = 0x3D0F00  # CLONE_VM|FS|FILES|SIGHAND|THREAD|SYSVSEM|SETTLS|PARENT_SETTID...
    assert run(program, numbers[call], arch, thread_flags) == seccomp.RET_ALLOW
    assert run(program, numbers[call], arch, 0x20000) == seccomp.RET_ALLOW  # CLONE_NEWNS
    assert run(program, numbers[call], arch, seccomp.CLONE_NEWUSER) == EPERM
    assert run(program, numbers[call], arch, seccomp.CLONE_NEWUSER | 0x11) == EPERM


def test_other_architectures_and_x32_are_refused() -> None:
    program = seccomp.program("x86_64")
    assert run(program, 0, 0x40000003) == EPERM  # AUDIT_ARCH_I386: int 0x80 from x86_64
    assert run(program, seccomp.X32_SYSCALL_BIT | 425, seccomp.ARCHES["x86_64"][0]) == EPERM


def test_an_unknown_machine_has_no_program() -> None:
    with pytest.raises(KeyError):
        seccomp.program("riscv64")
