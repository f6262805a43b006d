"""The sandbox's seccomp programs, run on a small classic-BPF interpreter written here,
for both machines they know (x86-64 and aarch64): each rule refuses what it says and
lets through its neighbours (threads, library mappings, other fds).  The kernel's own
verdicts are tests/test_sandbox_walls.py's."""

from __future__ import annotations

import errno
import struct

import pytest

from conductor.sandbox._seccomp import (
    _NUMBERS,
    VERDICT_FD,
    child_filter,
    seccomp_filter,
    verdict_filter,
)

ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
ALLOW = "allow"


def run(program: bytes, machine: str, name: str, *args: int) -> str | int:
    """The program's answer for system call ``name`` with ``args``: ``allow`` or the
    errno it returns."""
    nr = _NUMBERS[name][0 if machine == "x86_64" else 1]
    assert nr is not None, (name, machine)
    full = [*args, *[0] * (6 - len(args))]
    data = struct.pack("<iIQ6Q", nr, ARCH[machine], 0, *[a & (2**64 - 1) for a in full])
    ins = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        if code == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:
            if k == 0x7FFF0000:
                return ALLOW
            assert k & 0xFFFF0000 == 0x00050000, hex(k)
            return k & 0xFFFF
        else:
            taken = {
                0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)
            }[code]  # fmt: skip
            pc += jt if taken else jf
        pc += 1


MACHINES = ["x86_64", "aarch64"]


@pytest.mark.parametrize("machine", MACHINES)
def test_every_process_of_a_sample(machine: str) -> None:
    p = seccomp_filter(machine)
    assert p is not None
    for name in ("memfd_create", "unshare", "ptrace", "pidfd_getfd", "kcmp", "clone3"):
        assert run(p, machine, name) == errno.ENOSYS, name
    assert run(p, machine, "clone", 0x10000000) == errno.EPERM  # CLONE_NEWUSER
    assert run(p, machine, "clone", 0x3D0F00) == ALLOW  # a thread
    assert run(p, machine, "ioctl", 0, 0x5412) == errno.EPERM  # TIOCSTI
    assert run(p, machine, "ioctl", 0, 0x5401) == ALLOW
    assert run(p, machine, "pidfd_open", 1, 0) == ALLOW  # the driver waits on pidfds
    assert seccomp_filter("riscv64") is None


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("subprocesses", [False, True])
def test_a_process_that_runs_model_code(machine: str, subprocesses: bool) -> None:
    p = child_filter(allow_subprocess=subprocesses, machine=machine)
    assert p is not None
    rx, rw, rwx = 5, 3, 7
    anon, private = 0x22, 0x02
    assert run(p, machine, "mmap", 0, 4096, rx, private, 3, 0) == ALLOW  # a library's code
    assert run(p, machine, "mmap", 0, 4096, rw, anon, -1, 0) == ALLOW
    assert run(p, machine, "mmap", 0, 4096, rx, anon, -1, 0) == errno.EPERM
    assert run(p, machine, "mmap", 0, 4096, rwx, private, 3, 0) == errno.EPERM
    assert run(p, machine, "mprotect", 0, 4096, rx) == errno.EPERM
    assert run(p, machine, "mprotect", 0, 4096, 1) == ALLOW  # RELRO
    assert run(p, machine, "pkey_mprotect", 0, 4096, 4, 0) == errno.EPERM
    assert run(p, machine, "prctl", 4, 1) == errno.EPERM  # PR_SET_DUMPABLE
    assert run(p, machine, "prctl", 15, 0) == ALLOW  # PR_SET_NAME
    assert run(p, machine, "personality", 0x0400000) == errno.EPERM
    assert run(p, machine, "personality", 0xFFFFFFFF) == ALLOW
    for name in ("pidfd_open", "pidfd_getfd", "kcmp", "process_madvise", "mount"):
        assert run(p, machine, name) == errno.EPERM, name
    assert run(p, machine, "clone3") == errno.ENOSYS
    assert run(p, machine, "clone", 0x3D0F00) == ALLOW  # a thread
    process = ALLOW if subprocesses else errno.EPERM
    assert run(p, machine, "clone", 0x11) == process  # SIGCHLD: fork
    assert run(p, machine, "clone", 0x4111) == process  # CLONE_VM|CLONE_VFORK: posix_spawn
    assert run(p, machine, "execve") == process
    assert run(p, machine, "execveat") == process
    if machine == "x86_64":
        assert run(p, machine, "fork") == process
        assert run(p, machine, "vfork") == process


@pytest.mark.parametrize("machine", MACHINES)
def test_the_threads_of_a_bigcodebench_test(machine: str) -> None:
    p = verdict_filter(VERDICT_FD, machine)
    assert p is not None
    v = VERDICT_FD
    for name in ("write", "read", "close", "dup", "fcntl", "ioctl", "sendto", "shutdown"):
        assert run(p, machine, name, v) == errno.EPERM, name
        assert run(p, machine, name, v + 1) == ALLOW, name
    assert run(p, machine, "dup3", 5, v, 0) == errno.EPERM
    assert run(p, machine, "dup3", 5, 6, 0) == ALLOW
    if machine == "x86_64":
        assert run(p, machine, "dup2", 5, v) == errno.EPERM
    assert run(p, machine, "splice", 5, 0, v, 0, 10, 0) == errno.EPERM
    assert run(p, machine, "tee", 5, v, 10, 0) == errno.EPERM
    assert run(p, machine, "copy_file_range", 5, 0, v, 0, 10, 0) == errno.EPERM
    assert run(p, machine, "close_range", 3, 0xFFFFFFFF, 0) == errno.EPERM
    assert run(p, machine, "close_range", v, v, 0) == errno.EPERM
    assert run(p, machine, "close_range", v + 1, 300, 0) == ALLOW
    assert run(p, machine, "close_range", 3, v - 1, 0) == ALLOW
    for name in ("sendmsg", "sendmmsg", "seccomp", "pidfd_getfd"):
        assert run(p, machine, name, 3) == errno.EPERM, name
    assert run(p, machine, "prctl", 22, 2) == errno.EPERM  # PR_SET_SECCOMP
    assert run(p, machine, "prctl", 15, 0) == ALLOW
    assert run(p, machine, "mmap", 0, 4096, 3, 0x22, -1, 0) == ALLOW
