"""The sandbox's seccomp program, run by a small classic-BPF interpreter (the kernel's subset);
with `setid` (issue 43), the set-id modes it refuses."""

from __future__ import annotations

import errno
import struct

import pytest

from osb_sync.local.host import seccomp

EPERM = seccomp.RET_ERRNO | errno.EPERM
ENOSYS = seccomp.RET_ERRNO | errno.ENOSYS


def run(program: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """What the filter returns for a call `nr` of `arch` whose first argument is `arg0`."""
    return run_data(program, struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0))


def run_data(program: bytes, data: bytes) -> int:
    """What the filter returns for the `struct seccomp_data` `data`."""
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


def call(program: bytes, machine: str, name: str, *args: int) -> int:
    """What the filter returns for `name` of `machine` with `args` (the rest 0)."""
    arch, _ = seccomp.ARCHES[machine]
    numbers = seccomp.SETID_NUMBERS[machine]
    padded = [*args, *[0] * (6 - len(args))]
    data = struct.pack("=iIQ6Q", numbers[name], arch, 0, *padded)
    return run_data(program, data)


O_CREAT, O_TMPFILE, O_WRONLY = 0o100, 0o20200000, 1


@pytest.mark.parametrize("machine", sorted(seccomp.ARCHES))
def test_with_setid_no_call_gives_a_file_a_set_id_mode(machine: str) -> None:
    program = seccomp.program(machine, setid=True)
    for name in seccomp.SETID_NUMBERS[machine]:
        if name == "openat2":
            continue
        mode_at, flags_at = seccomp.SETID_CALLS[name]
        for mode, answer in ((0o4755, EPERM), (0o2755, EPERM), (0o100755, seccomp.RET_ALLOW)):
            args = [3, 3, 3, 3]
            args[mode_at] = mode
            if flags_at is not None:
                args[flags_at] = O_WRONLY | O_CREAT
            assert call(program, machine, name, *args) == answer, (name, oct(mode))
            if flags_at is not None:  # O_TMPFILE makes a file too; without either, no mode
                args[flags_at] = O_TMPFILE | O_WRONLY
                assert call(program, machine, name, *args) == answer, (name, "O_TMPFILE")
                args[flags_at] = O_WRONLY
                assert call(program, machine, name, *args) == seccomp.RET_ALLOW, name
    assert call(program, machine, "openat2") == ENOSYS  # its mode is in memory
    # what the filter refused before, it still refuses
    arch, numbers = seccomp.ARCHES[machine]
    for name in seccomp.REFUSED:
        assert run(program, numbers[name], arch) == EPERM, name
    assert run(program, numbers["unshare"], arch, seccomp.CLONE_NEWUSER) == EPERM


@pytest.mark.parametrize("machine", sorted(seccomp.ARCHES))
def test_without_setid_set_id_modes_are_allowed(machine: str) -> None:
    program = seccomp.program(machine)
    assert call(program, machine, "fchmodat", 3, 0, 0o4755) == seccomp.RET_ALLOW
    assert call(program, machine, "openat2") == seccomp.RET_ALLOW
