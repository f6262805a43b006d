"""The seccomp filter every bubblewrap sandbox runs under (``bwrap --seccomp FD``).

A classic-BPF program, built here because it is a dozen instructions and the kernel's
format is stable; depending on libseccomp's Python binding (not on PyPI) for it would
make bubblewrap alone not enough.  It makes these system calls fail, for every process
of the sample, native code included:

* ``memfd_create``, ``memfd_secret`` and SysV ``shmget``: memory-backed files and
  segments are not limited by ``RLIMIT_AS`` (a written memfd is not mapped memory), so
  they could hold any amount of memory.  With them gone, the only memory-backed files
  are on the sandbox's size-limited tmpfs (``/tmp``, which holds ``/dev/shm`` too).
  ``ENOSYS`` makes libraries take their fallback (a file in ``/tmp``);
* ``unshare``, ``setns`` and ``clone`` / ``clone3`` asking for new namespaces: a new
  user namespace would give the code the right to mount a fresh, unlimited tmpfs
  (``clone3`` fails with ``ENOSYS`` as a whole because its flags are in memory BPF
  cannot read; glibc then uses ``clone``);
* ``keyctl``, ``add_key``, ``request_key``: the kernel keyrings are per user, not per
  namespace, so they would reach the user's keys outside;
* ``ptrace``, ``process_vm_readv`` / ``writev``: the test driver next to the solution
  must not be read or written (it is also not dumpable);
* ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``: large kernel attack
  surfaces no benchmark needs;
* ``ioctl(TIOCSTI)`` and ``ioctl(TIOCLINUX)``: typing into a terminal (there is none:
  the sandbox has a new session and no terminal fd, this is the second wall);
* any system call of another ABI (x32, i386 on x86-64): they have other numbers.

Only x86-64 and aarch64 are known; elsewhere :func:`seccomp_filter` returns None and
the sandbox runs without it (its notes say so).
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["seccomp_filter"]

# BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
# offsets in struct seccomp_data: nr, arch, instruction pointer, args[6] (low words on
# little-endian machines)
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24

_NEW_NAMESPACES = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C

# name -> (x86-64 number, aarch64 number)
_NUMBERS: dict[str, tuple[int, int]] = {
    "memfd_create": (319, 279),
    "memfd_secret": (447, 447),
    "shmget": (29, 194),
    "unshare": (272, 97),
    "setns": (308, 268),
    "clone3": (435, 435),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "clone": (56, 220),
    "ioctl": (16, 29),
}
_ARCHES = {"x86_64": (0xC000003E, 0), "amd64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}
_X32_BIT = 0x40000000


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The filter program for ``machine`` (default: this one), or None if unknown."""
    arch = _ARCHES.get((machine or platform.machine()).lower())
    if arch is None:
        return None
    audit_arch, column = arch
    nr = {name: nums[column] for name, nums in _NUMBERS.items()}
    denied = [n for n in _NUMBERS if n not in ("clone", "ioctl")]
    deny = _op(_RET, _ERRNO | errno.ENOSYS)
    refuse = _op(_RET, _ERRNO | errno.EPERM)
    allow = _op(_RET, _ALLOW)
    prog: list[bytes] = [_op(_LD_ABS, _ARCH), _op(_JEQ, audit_arch, 1, 0), deny]
    prog.append(_op(_LD_ABS, _NR))
    if column == 0:
        prog += [_op(_JGE, _X32_BIT, 0, 1), deny]
    for name in denied:
        prog += [_op(_JEQ, nr[name], 0, 1), deny]
    # clone: the namespace flags are in its first argument
    prog += [
        _op(_JEQ, nr["clone"], 0, 4),
        _op(_LD_ABS, _ARG0),
        _op(_JSET, _NEW_NAMESPACES, 0, 1),
        refuse,
        allow,
    ]
    # ioctl: the request is its second argument (the kernel reads 32 bits of it)
    prog += [
        _op(_JEQ, nr["ioctl"], 0, 5),
        _op(_LD_ABS, _ARG1),
        _op(_JEQ, _TIOCSTI, 2, 0),
        _op(_JEQ, _TIOCLINUX, 1, 0),
        allow,
        refuse,
        allow,
    ]
    return b"".join(prog)
