"""The seccomp filters of a sandboxed run: one for every process of the sample, one for
each process that runs model code, and one for the threads of a test whose verdict a
judge thread writes (the BigCodeBench driver's).

Each is a classic-BPF program, built here because the kernel's format is stable and a
filter is a few dozen instructions; depending on libseccomp's Python binding (not on
PyPI) would make bubblewrap alone not enough.  The parent builds all three; the driver
(:mod:`conductor.sandbox.inside.driver`, standard library only) installs the last two with
``prctl(PR_SET_SECCOMP)``.  Filters stack: a process runs under every filter installed
in it and in its ancestors, and the strictest answer wins.

**Every process of the sample** (:func:`seccomp_filter`, bubblewrap's ``--seccomp``):

* ``memfd_create``, ``memfd_secret`` and SysV ``shmget``: memory-backed files and
  segments are not limited by ``RLIMIT_AS`` (a written memfd is not mapped memory), so
  they could hold any amount of memory.  With them gone, the only memory-backed files
  are on the sandbox's size-limited tmpfs (``/tmp``, which holds ``/dev/shm`` too).
  ``ENOSYS`` makes libraries take their fallback (a file in ``/tmp``);
* ``unshare``, ``setns`` and ``clone`` / ``clone3`` asking for new namespaces: a new
  user namespace would give the code the right to mount a fresh, unlimited tmpfs
  (``clone3`` fails with ``ENOSYS`` as a whole because its flags are in memory BPF
  cannot read; glibc then uses ``clone``).  This is the only wall against new user
  namespaces for an ordinary user: bubblewrap's ``--disable-userns`` would put the run
  in a nested user namespace, where the driver could no longer make ``/tmp``
  ``noexec`` (see :mod:`conductor.sandbox._bwrap`);
* ``keyctl``, ``add_key``, ``request_key``: the kernel keyrings are per user, not per
  namespace, so they would reach the user's keys outside;
* ``ptrace``, ``process_vm_readv`` / ``writev``, ``pidfd_getfd``, ``kcmp``: no process
  may read, write or take the file descriptors of another (bubblewrap's own first
  process, which runs outside this filter, included);
* ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``: large kernel attack
  surfaces no benchmark needs (``io_uring`` would also do I/O no filter sees);
* ``ioctl(TIOCSTI)`` and ``ioctl(TIOCLINUX)``: typing into a terminal (there is none:
  the sandbox has a new session and no terminal fd, this is the second wall);
* any system call of another ABI (x32, i386 on x86-64): they have other numbers.

**Each process that runs model code** (:func:`child_filter`, installed by the driver in
the child before the solution runs, in every engine):

* no executable memory but the read-only files of the libraries: ``mmap`` with
  ``PROT_EXEC`` of anonymous memory or together with ``PROT_WRITE``, and ``mprotect`` /
  ``pkey_mprotect`` with ``PROT_EXEC`` at all, are refused.  The dynamic loader maps a
  library's code straight from its file (``mmap(PROT_READ|PROT_EXEC, fd)``), which
  stays allowed; the file must be on a mount that allows it, and bubblewrap's only
  writable mount (``/tmp``) is ``noexec``, so what the code writes can never run.
  ``personality`` (whose ``READ_IMPLIES_EXEC`` would add ``PROT_EXEC`` behind the
  filter's back) may only be read, and ``memfd_create`` (a file that could be mapped
  twice, writable and executable) is refused here too, for the weaker engines;
* ``prctl(PR_SET_DUMPABLE)``: the driver makes every process undumpable, which also
  closes ``/proc/self/mem`` to the process itself (a non-dumpable process's ``/proc``
  files belong to root); it may not be turned back;
* ``pidfd_open``, ``pidfd_getfd``, ``kcmp``, ``process_madvise``, ``process_mrelease``,
  ``ptrace``, ``process_vm_*``: no reaching into another process;
* the ``mount`` family, ``io_setup`` / ``io_submit`` (asynchronous I/O that no filter
  sees), ``io_uring_*``;
* ``clone3`` always fails with ``ENOSYS`` (glibc then uses ``clone``, whose flags the
  filter reads); where subprocesses are not allowed, ``fork``, ``vfork``, ``clone``
  without ``CLONE_THREAD`` (threads still start), ``execve`` and ``execveat`` are
  refused: the process is alone, whatever it calls (``_posixsubprocess``, native code).

**The threads of a judged test** (:func:`verdict_filter`): the test's judge thread
writes the verdict on one fd (:data:`VERDICT_FD`, a socket whose other end only the
driver holds).  The main thread installs this filter on itself once the judge has
started, so every thread the solution starts has it and the judge does not: any system
call on that fd (writing, reading, ``dup``, ``fcntl``, ``ioctl``, socket options,
``close``), ``dup2`` / ``dup3`` onto it, ``close_range`` over it, ``splice`` / ``tee``
/ ``copy_file_range`` / ``sendfile`` into it, ``sendmsg`` (``SCM_RIGHTS`` would hand a
copy on) and new seccomp filters (``SECCOMP_FILTER_FLAG_TSYNC`` would reach the judge's
thread) are refused.

Only x86-64 and aarch64 are known; elsewhere these functions return None and the
sandbox runs without them (its notes say so).
"""

from __future__ import annotations

import errno
import platform
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["VERDICT_FD", "child_filter", "seccomp_filter", "verdict_filter"]

#: The fd number a BigCodeBench test's verdict channel sits on in its child (below the
#: child's ``RLIMIT_NOFILE`` of 256, above what the driver and a test open).
VERDICT_FD = 250

# BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGT = 0x25  # BPF_JMP | BPF_JGT | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
# offsets in struct seccomp_data: nr, arch, instruction pointer, args[6] (low words on
# little-endian machines, which both known ones are)
_NR, _ARCH = 0, 4


def _arg(i: int) -> int:
    return 16 + 8 * i


_NEW_NAMESPACES = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
_CLONE_THREAD = 0x00010000
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_PROT_WRITE, _PROT_EXEC = 0x2, 0x4
_MAP_ANONYMOUS = 0x20
_PR_SET_DUMPABLE, _PR_SET_SECCOMP = 4, 22
_PERSONALITY_QUERY = 0xFFFFFFFF

# name -> (x86-64 number, aarch64 number or None where the call does not exist there)
_NUMBERS: dict[str, tuple[int, int | None]] = {
    "read": (0, 63), "write": (1, 64), "close": (3, 57), "fstat": (5, 80),
    "lseek": (8, 62), "mmap": (9, 222), "mprotect": (10, 226), "ioctl": (16, 29),
    "pread64": (17, 67), "pwrite64": (18, 68), "readv": (19, 65), "writev": (20, 66),
    "shmget": (29, 194), "dup": (32, 23), "dup2": (33, None), "sendfile": (40, 71),
    "connect": (42, 203), "accept": (43, 202), "sendto": (44, 206),
    "recvfrom": (45, 207), "sendmsg": (46, 211), "recvmsg": (47, 212),
    "shutdown": (48, 210), "bind": (49, 200), "listen": (50, 201),
    "getsockname": (51, 204), "getpeername": (52, 205), "setsockopt": (54, 208),
    "getsockopt": (55, 209), "clone": (56, 220), "fork": (57, None),
    "vfork": (58, None), "execve": (59, 221), "fcntl": (72, 25), "flock": (73, 32),
    "fsync": (74, 82), "fdatasync": (75, 83), "ftruncate": (77, 46),
    "fchmod": (91, 52), "fchown": (93, 55), "ptrace": (101, 117),
    "personality": (135, 92), "fstatfs": (138, 44), "pivot_root": (155, 41),
    "prctl": (157, 167), "mount": (165, 40), "umount2": (166, 39),
    "fsetxattr": (190, 7), "fremovexattr": (199, 16), "io_setup": (206, 0),
    "io_submit": (209, 2), "add_key": (248, 217), "request_key": (249, 218),
    "keyctl": (250, 219), "unshare": (272, 97), "splice": (275, 76), "tee": (276, 77),
    "vmsplice": (278, 75), "fallocate": (285, 47), "accept4": (288, 242),
    "dup3": (292, 24), "preadv": (295, 69), "pwritev": (296, 70),
    "perf_event_open": (298, 241), "recvmmsg": (299, 243), "sendmmsg": (307, 269),
    "setns": (308, 268), "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271), "kcmp": (312, 272), "seccomp": (317, 277),
    "memfd_create": (319, 279), "bpf": (321, 280), "execveat": (322, 281),
    "userfaultfd": (323, 282), "copy_file_range": (326, 285), "preadv2": (327, 286),
    "pwritev2": (328, 287), "pkey_mprotect": (329, 288), "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "pidfd_open": (434, 434), "clone3": (435, 435), "close_range": (436, 436),
    "pidfd_getfd": (438, 438), "process_madvise": (440, 440),
    "mount_setattr": (442, 442), "memfd_secret": (447, 447),
    "process_mrelease": (448, 448),
}  # fmt: skip
_ARCHES = {"x86_64": (0xC000003E, 0), "amd64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}
_X32_BIT = 0x40000000

# The system calls whose first argument is a file descriptor that could write to the
# verdict channel, hand on a copy of it or change it (reads are listed too: nothing
# but the judge has any business with that fd).
_FD_FIRST = (
    "read", "write", "close", "fstat", "lseek", "ioctl", "pread64", "pwrite64", "readv",
    "writev", "dup", "dup2", "sendfile", "connect", "accept", "sendto", "recvfrom",
    "recvmsg", "shutdown", "bind", "listen", "getsockname", "getpeername",
    "setsockopt", "getsockopt", "fcntl", "flock", "fsync", "fdatasync", "ftruncate",
    "fchmod", "fchown", "fstatfs", "fsetxattr", "fremovexattr", "splice", "tee",
    "vmsplice", "fallocate", "accept4", "dup3", "preadv", "pwritev", "recvmmsg",
    "copy_file_range", "preadv2", "pwritev2",
)  # fmt: skip
# (system call, argument) pairs that name a second fd the call writes to or replaces
_FD_OTHER = (("dup2", 1), ("dup3", 1), ("splice", 2), ("tee", 1), ("copy_file_range", 2))


# ------------------------------------------------------------------------ assembler


@dataclass(frozen=True)
class _Ins:
    """One instruction; ``jt`` / ``jf`` are label names or relative offsets."""

    code: int
    k: int
    jt: str | int = 0
    jf: str | int = 0


_Item = _Ins | str  # a str is a label: the position of the next instruction


def _assemble(items: Sequence[_Item]) -> bytes:
    """The program's bytes, with every jump to a label made relative (forward only)."""
    where: dict[str, int] = {}
    n = 0
    for item in items:
        if isinstance(item, str):
            where[item] = n
        else:
            n += 1
    out: list[bytes] = []
    pos = 0
    for item in items:
        if isinstance(item, str):
            continue

        def rel(target: str | int, pos: int = pos) -> int:
            off = target if isinstance(target, int) else where[target] - pos - 1
            if not 0 <= off <= 255:
                raise ValueError(f"seccomp jump out of range: {off}")
            return off

        out.append(struct.pack("=HBBI", item.code, rel(item.jt), rel(item.jf), item.k))
        pos += 1
    return b"".join(out)


def _ret(action: int) -> _Ins:
    return _Ins(_RET, action)


_ALLOW_RET = _ret(_ALLOW)
_ENOSYS = _ERRNO | errno.ENOSYS
_EPERM = _ERRNO | errno.EPERM


def _load(i: int) -> _Ins:
    return _Ins(_LD_ABS, _arg(i))


class _Program:
    """A filter: the architecture checks, then one block per system call (each block
    ends by returning, so the accumulator holds the call's number at every block's
    test), then allow."""

    def __init__(self, machine: str | None) -> None:
        arch = _ARCHES.get((machine or platform.machine()).lower())
        self.known = arch is not None
        self.items: list[_Item] = []
        self.column = 0
        self.blocks = 0
        if arch is None:
            return
        audit_arch, self.column = arch
        deny = _ret(_ENOSYS)
        self.items += [_Ins(_LD_ABS, _ARCH), _Ins(_JEQ, audit_arch, 1, 0), deny]
        self.items.append(_Ins(_LD_ABS, _NR))
        if self.column == 0:
            self.items += [_Ins(_JGE, _X32_BIT, 0, 1), deny]

    def number(self, name: str) -> int | None:
        return _NUMBERS[name][self.column]

    def block(self, name: str, body: Sequence[_Item]) -> None:
        """``body`` runs for system call ``name`` (skipped where the machine has none);
        it must end with a return."""
        nr = self.number(name)
        if nr is None:
            return
        self.blocks += 1
        end = f"b{self.blocks}"
        self.items += [_Ins(_JEQ, nr, 0, end), *body, end]

    def refuse(self, names: Iterable[str], action: int) -> None:
        for name in names:
            self.block(name, [_ret(action)])

    def build(self) -> bytes | None:
        if not self.known:
            return None
        return _assemble([*self.items, _ALLOW_RET])


# ------------------------------------------------------------------------- filters


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The filter every process of a bubblewrap sandbox runs under (see the module's
    doc), or None on an unknown machine."""
    p = _Program(machine)
    p.refuse(
        [
            "memfd_create", "memfd_secret", "shmget", "unshare", "setns", "clone3",
            "keyctl", "add_key", "request_key", "ptrace", "process_vm_readv",
            "process_vm_writev", "pidfd_getfd", "kcmp", "bpf", "perf_event_open",
            "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
        ],
        _ENOSYS,
    )  # fmt: skip
    # clone: the namespace flags are in its first argument
    p.block("clone", [_load(0), _Ins(_JSET, _NEW_NAMESPACES, 0, 1), _ret(_EPERM), _ALLOW_RET])
    # ioctl: the request is its second argument (the kernel reads 32 bits of it)
    p.block(
        "ioctl",
        [
            _load(1), _Ins(_JEQ, _TIOCSTI, 2, 0), _Ins(_JEQ, _TIOCLINUX, 1, 0),
            _ALLOW_RET, _ret(_EPERM),
        ],
    )  # fmt: skip
    return p.build()


def child_filter(*, allow_subprocess: bool, machine: str | None = None) -> bytes | None:
    """The filter of a process that runs model code (see the module's doc), or None on
    an unknown machine.  ``allow_subprocess``: whether it may start processes."""
    p = _Program(machine)
    p.refuse(["clone3", "memfd_create", "io_setup", "io_submit"], _ENOSYS)
    p.refuse(["io_uring_setup", "io_uring_enter", "io_uring_register"], _ENOSYS)
    p.refuse(
        [
            "pidfd_open", "pidfd_getfd", "kcmp", "process_madvise", "process_mrelease",
            "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2",
            "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
            "fspick", "mount_setattr",
        ],
        _EPERM,
    )  # fmt: skip
    refuse = _ret(_EPERM)
    # mmap(addr, len, prot, flags, fd, off): executable only when read-only and from a file
    p.block(
        "mmap",
        [
            _load(2), _Ins(_JSET, _PROT_EXEC, 0, "mmap_ok"),
            _Ins(_JSET, _PROT_WRITE, "mmap_no", 0),
            _load(3), _Ins(_JSET, _MAP_ANONYMOUS, "mmap_no", "mmap_ok"),
            "mmap_no", refuse, "mmap_ok", _ALLOW_RET,
        ],
    )  # fmt: skip
    for name in ("mprotect", "pkey_mprotect"):
        p.block(name, [_load(2), _Ins(_JSET, _PROT_EXEC, 0, 1), refuse, _ALLOW_RET])
    p.block("prctl", [_load(0), _Ins(_JEQ, _PR_SET_DUMPABLE, 0, 1), refuse, _ALLOW_RET])
    p.block(
        "personality",
        [
            _load(0), _Ins(_JEQ, _PERSONALITY_QUERY, 1, 0), _Ins(_JEQ, 0, 0, 1),
            _ALLOW_RET, refuse,
        ],
    )  # fmt: skip
    if not allow_subprocess:
        p.refuse(["fork", "vfork", "execve", "execveat"], _EPERM)
        # a thread shares the process (CLONE_THREAD); anything else is a new process
        p.block("clone", [_load(0), _Ins(_JSET, _CLONE_THREAD, 0, 1), _ALLOW_RET, refuse])
    return p.build()


def verdict_filter(fd: int = VERDICT_FD, machine: str | None = None) -> bytes | None:
    """The filter of every thread of a judged test but its judge: nothing may
    touch, copy or replace fd ``fd`` (see the module's doc), or None on an unknown
    machine."""
    p = _Program(machine)
    refuse = _ret(_EPERM)
    other = dict(_FD_OTHER)
    for name in _FD_FIRST:
        no = name + "_no"
        body: list[_Item] = [_load(0), _Ins(_JEQ, fd, no, 0)]
        if name in other:
            body += [_load(other[name]), _Ins(_JEQ, fd, no, 0)]
        p.block(name, [*body, _ALLOW_RET, no, refuse])
    p.refuse(["sendmsg", "sendmmsg", "seccomp", "pidfd_getfd"], _EPERM)
    # close_range(first, last, flags) closes fd when first <= fd <= last
    p.block(
        "close_range",
        [_load(0), _Ins(_JGT, fd, 3, 0), _load(1), _Ins(_JGE, fd, 0, 1), refuse, _ALLOW_RET],
    )
    p.block("prctl", [_load(0), _Ins(_JEQ, _PR_SET_SECCOMP, 0, 1), refuse, _ALLOW_RET])
    return p.build()
