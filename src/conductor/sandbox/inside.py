"""The part of the sandbox that runs *inside* it (standard library only).

:mod:`conductor.sandbox` puts a read-only copy of this file in the sandbox and runs it as
``python -I inside.py /proc/self/fd/N`` (the job on an inherited memory file,
closed once read) as the first process of the sandbox (or as a plain subprocess where
there is none).  It is a real module so that linters and
type checkers see it; nothing in the parent imports it.

Why it is one long module: it is copied into the sandbox as this one file and run with
``python -I``, where ``conductor`` is not importable, so it must be self-contained and
use the standard library only; splitting it would mean copying several files in and
putting them on the sandboxed interpreter's path, a wider door for the code it guards
against.

What it does, in order:

1. **Mounts** (with namespaces): every mount is re-mounted read-only except the run's
   work directory; the user's home directory (and, as root, any directory others cannot
   enter that holds the interpreter) is covered with an empty tmpfs, with only the
   interpreter's directories bound back; the control directory (config, report file) is
   covered too once it has been read.
2. **The job**, as the *driver* (this process, trusted code that never runs model code):

   * ``program``: run ``main.py`` as ``__main__`` in one child (used by
     :func:`~conductor.sandbox.run_sandboxed`);
   * ``lcb``: for each stdin test, fork a fresh child that runs the solution with the
     test's input on fd 0 and its stdout captured; for a sample whose tests are all
     functional, fork one child that runs the solution once and calls the function for
     every test in turn with its JSON arguments (as the official checker does; see "one
     child for a sample's calls"), each return value serialised with :func:`json.dumps`;
     forward the raw outputs to the parent.  The driver is never given the expected
     outputs; the parent compares;
   * ``bcb``: for each test method named by the parent, fork a fresh child that starts a
     judge thread, runs the solution and then the test (unittest's ``debug`` protocol);
     the judge, holding a nonce the parent sent after the fork, checks a snapshot of
     the loaded modules and writes the verdict on a private fd (see "job: bcb").

0. **Hardening** (bubblewrap), before anything else: every writable mount re-mounted
   ``noexec``, bubblewrap's init hidden from ``/proc``, every capability given up (as
   root, the run's fresh uid taken), ``no_new_privs``, not dumpable (:func:`harden`).

3. **Each child** before model code runs: drops privileges (the namespaces engine: a
   fresh uid as root; every capability, including the bounding set, inside a user
   namespace), sets ``PR_SET_NO_NEW_PRIVS``, not dumpable and resource limits, closes
   the report fd, installs the parent's seccomp filter for model code
   (:class:`_Filters`, :mod:`conductor.sandbox._seccomp`) and the audit-hook guard
   (:func:`install_guard`); a BigCodeBench test's main thread adds the verdict filter
   once its judge thread runs (:func:`_bcb_child`).

Results reach the parent as lines in the report fd: ``B`` (an operation the guard
refused), ``N`` (a note), ``S`` (the ``program`` child's exit status), ``R`` (one JSON
result frame from a driver; the last, ``{"event": "cpu", "s": ...}``, says how much CPU
time the driver and its children used).  Only the driver holds that fd.
"""

from __future__ import annotations

import _thread
import contextlib
import json
import os
import resource
import signal
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterator
from itertools import compress
from itertools import repeat as _repeat
from operator import is_ as _is
from operator import not_
from typing import Any

CFG: dict[str, Any] = {}
REPORT_FD = -1
# the job pipe, kept open for the parent's word after each test (:func:`_proceed`)
CONTROL_FD = -1
_WORDS = b""


def report(kind: str, text: str) -> None:
    """One line on the report channel (driver only)."""
    with contextlib.suppress(OSError):
        os.write(REPORT_FD, (kind + " " + text.replace("\n", " ") + "\n").encode())


def frame(obj: dict[str, Any]) -> None:
    """One JSON result frame for the parent."""
    report("R", json.dumps(obj))


# ----------------------------------------------------------------------------- mounts


def _unescape(s: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and s[i + 1 : i + 4].isdigit():
            out.append(chr(int(s[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _blocking_ancestor(path: str) -> str | None:
    """The first directory on the way to ``path`` that others cannot traverse."""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts)):
        cur = "/" + "/".join(parts[: i + 1])
        try:
            st = os.stat(cur)
        except OSError:
            return None
        if (st.st_mode & 0o170000) == 0o040000 and not st.st_mode & 0o001:
            return cur
    return None


class _Mounter:
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
    MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
    MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21

    def __init__(self) -> None:
        import ctypes

        self._ctypes = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]

    def mount(self, src: str | None, tgt: str, fstype: str | None, flags: int) -> None:
        def enc(v: str | None) -> bytes | None:
            return None if v is None else v.encode()

        if self.libc.mount(enc(src), enc(tgt), enc(fstype), flags, None) != 0:
            err = self._ctypes.get_errno()
            raise OSError(err, os.strerror(err), tgt)


def _hide(m: _Mounter, hidden: list[str], expose: list[str], stage_root: str) -> None:
    """Cover each dir in ``hidden`` with an empty tmpfs, binding back what must be seen."""
    for n, top in enumerate(hidden):
        if _under(stage_root, top) or not os.path.isdir(top):
            report("N", f"cannot hide {top} (it holds the control dir)")
            continue
        inner = sorted({p for p in expose if _under(p, top) and p != top and os.path.exists(p)})
        keep = [p for p in inner if not any(p != q and _under(p, q) for q in inner)]
        staged = []
        for i, path in enumerate(keep):
            stage = os.path.join(stage_root, f"stage{n}_{i}")
            if os.path.isdir(path):
                os.mkdir(stage)
            else:
                open(stage, "w").close()
            m.mount(path, stage, None, m.MS_BIND | m.MS_REC)
            staged.append((stage, path))
        m.mount("tmpfs", top, "tmpfs", m.MS_NOSUID | m.MS_NODEV)
        os.chmod(top, 0o755)
        for stage, path in staged:
            if os.path.isdir(stage):
                os.makedirs(path, mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                open(path, "w").close()
            m.mount(stage, path, None, m.MS_MOVE)
        report("N", "hid {}{}".format(top, (", exposing " + ", ".join(keep)) if keep else ""))


def setup_mounts() -> None:
    """Read-only system, private work dir, hidden home and control dir (see module doc)."""
    m = _Mounter()
    work = CFG["workdir"]
    m.mount("none", "/", None, m.MS_REC | m.MS_PRIVATE)
    m.mount(work, work, None, m.MS_BIND | m.MS_REC)
    if "noexec" not in CFG["removed"]:
        # what the run writes is never executed or mapped executable
        flags = m.MS_REMOUNT | m.MS_BIND | m.MS_NOEXEC | m.MS_NOSUID | m.MS_NODEV
        m.mount(None, work, None, flags)
    hidden = list(CFG["hide"])
    if CFG["uid"] is not None:  # root: the fresh uid must still reach the interpreter
        for path in CFG["expose"]:
            anc = _blocking_ancestor(path)
            if anc is not None and anc not in hidden:
                hidden.append(anc)
    _hide(m, hidden, [*CFG["expose"], work], CFG["control"])
    failed = []
    with open("/proc/self/mountinfo") as fh:
        rows = [line.split() for line in fh]
    for row in rows:
        point = _unescape(row[4])
        if _under(point, work):
            continue
        opts = row[5].split(",")
        flags = m.MS_REMOUNT | m.MS_BIND | m.MS_RDONLY
        for name, bit in (
            ("nosuid", m.MS_NOSUID),
            ("nodev", m.MS_NODEV),
            ("noexec", m.MS_NOEXEC),
            ("noatime", m.MS_NOATIME),
            ("nodiratime", m.MS_NODIRATIME),
            ("relatime", m.MS_RELATIME),
        ):
            if name in opts:
                flags |= bit
        try:
            m.mount(None, point, None, flags)
        except OSError as exc:
            if point == "/":
                raise
            failed.append(point + " (" + (exc.strerror or "?") + ")")
    report("L", "mount-ro")
    if failed:
        report("N", "could not make read-only: " + ", ".join(failed[:20]))
    # The config and the report file live in the control dir: once read and opened,
    # nothing inside may reach them by path.
    m.mount("tmpfs", CFG["control"], "tmpfs", m.MS_RDONLY | m.MS_NOSUID | m.MS_NODEV)


# ------------------------------------------------------------------------ privileges

_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG = 1, 2
_PR_SET_DUMPABLE = 4
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _prctl(*args: int) -> int:
    """``prctl(2)``; -1 where there is none (not Linux)."""
    import ctypes

    libc = _libc()
    if not hasattr(libc, "prctl"):
        return -1
    return int(libc.prctl(*[ctypes.c_ulong(a) for a in args]))


def _check(ok: bool, what: str) -> None:
    import ctypes

    if not ok:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _drop_bounding_set() -> None:
    """Empty the capability bounding set (where ``CAP_SETPCAP`` is held)."""
    import ctypes

    libc = _libc()
    for cap in range(64):
        if libc.prctl(ctypes.c_int(_PR_CAPBSET_DROP), ctypes.c_ulong(cap), 0, 0, 0) != 0:
            break  # past the last capability this kernel knows, or not allowed


def _drop_all_caps() -> None:
    """Empty the bounding, permitted, effective and inheritable capability sets."""
    import ctypes

    libc = _libc()
    _drop_bounding_set()

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    header = Header(0x20080522, 0)
    data = (Data * 2)()
    _check(libc.capset(ctypes.byref(header), data) == 0, "capset")


def _mount_flags(opts: str) -> int:
    """The per-mount flags of a mountinfo options field that a bind re-mount must
    repeat (a user namespace may not clear the ones its parent locked)."""
    m = _Mounter
    flags = 0
    for name, bit in (
        ("ro", m.MS_RDONLY), ("nosuid", m.MS_NOSUID), ("nodev", m.MS_NODEV),
        ("noexec", m.MS_NOEXEC), ("noatime", m.MS_NOATIME),
        ("nodiratime", m.MS_NODIRATIME), ("relatime", m.MS_RELATIME),
    ):  # fmt: skip
        if name in opts.split(","):
            flags |= bit
    return flags


def _noexec_mounts(m: _Mounter) -> None:
    """Re-mount every writable mount ``noexec,nosuid`` (bubblewrap's ``/tmp`` and the
    three device nodes): nothing the run writes can be executed or mapped executable.
    Fails closed: a writable mount left executable raises."""
    with open("/proc/self/mountinfo") as fh:
        rows = [line.split() for line in fh]
    for row in rows:
        point, opts = _unescape(row[4]), row[5]
        flags = _mount_flags(opts)
        if flags & m.MS_RDONLY or (flags & m.MS_NOEXEC and flags & m.MS_NOSUID):
            continue
        flags |= m.MS_REMOUNT | m.MS_BIND | m.MS_NOEXEC | m.MS_NOSUID
        m.mount(None, point, None, flags)
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            row = line.split()
            flags = _mount_flags(row[5])
            if not flags & m.MS_RDONLY and not flags & m.MS_NOEXEC:
                raise OSError(f"{_unescape(row[4])} is still writable and executable")


def _drop_privileges(uid: int | None) -> None:
    """Give up every capability for good; as root (``uid``), take the run's fresh uid
    first, keeping the parent-death signal (a uid change clears it).  Checked after."""
    import ctypes

    libc = _libc()
    _drop_bounding_set()  # while CAP_SETPCAP is still held (a uid change drops it)
    if uid is not None:
        death = ctypes.c_int(0)
        libc.prctl(_PR_GET_PDEATHSIG, ctypes.byref(death), 0, 0, 0)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if death.value:
            libc.prctl(_PR_SET_PDEATHSIG, death.value, 0, 0, 0)
    _drop_all_caps()
    _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "no_new_privs")
    with open("/proc/self/status") as fh:
        status = dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        if int(status.get(key, "0"), 16):
            raise OSError(f"the driver still holds capabilities ({key} {status[key]})")
    if status.get("NoNewPrivs") != "1":
        raise OSError("no_new_privs is not set")
    if uid is not None and set(map(int, status["Uid"].split())) != {uid}:
        raise OSError(f"the driver did not take uid {uid}: {status['Uid']}")


def harden() -> None:
    """Bubblewrap's driver, first thing: every writable mount ``noexec`` (bubblewrap
    cannot mount it so), ``/proc/1`` covered, then every capability given up (as root:
    the run's fresh uid taken too), ``no_new_privs``, not dumpable.  Everything after
    this, the preload and the job included, runs without privileges.  Raises where any
    step fails."""
    plan = CFG.get("harden")
    if not plan:
        return
    m = _Mounter()
    if "noexec" not in CFG["removed"]:
        _noexec_mounts(m)
    if "proc1-hidden" not in CFG["removed"]:
        # bubblewrap's init runs outside the seccomp filter and, for an ordinary user,
        # as the run's uid: its /proc/1 (mem, fd, ...) is not for the run to open
        m.mount("tmpfs", "/proc/1", "tmpfs", m.MS_RDONLY | m.MS_NOSUID | m.MS_NODEV
                | m.MS_NOEXEC)  # fmt: skip
    _drop_privileges(plan.get("uid"))


class _Filters:
    """The seccomp programs the parent built (:mod:`conductor.sandbox._seccomp`), ready
    to install with ``prctl(PR_SET_SECCOMP)`` in a child before model code runs."""

    def __init__(self, programs: dict[str, str]) -> None:
        import ctypes

        class Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        self._libc = _libc()
        self._ctypes = ctypes
        self._progs: dict[str, Any] = {}
        for name, text in programs.items():
            code = bytes.fromhex(text)
            buf = ctypes.create_string_buffer(code, len(code))
            self._progs[name] = (buf, Fprog(len(code) // 8, ctypes.addressof(buf)))

    def install(self, name: str) -> None:
        """Install program ``name`` on the calling thread (and every thread and process
        it starts later); nothing where the parent sent none (an unknown machine, or a
        wall a test removed).  Raises where the kernel refuses it."""
        prog = self._progs.get(name)
        if prog is None:
            return
        ref = self._ctypes.byref(prog[1])
        ok = self._libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ref, 0, 0) == 0
        _check(ok, "seccomp " + name)


FILTERS: _Filters | None = None


def enter_child(work: str, cpu_s: int | None = None) -> None:
    """Everything a child does before model code runs, except the guard; ``cpu_s``
    replaces the configured CPU limit (a child that runs several tests)."""
    os.chdir(work)
    uid = CFG["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    elif CFG["userns"]:
        _drop_all_caps()
    _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    # not dumpable: /proc/self/mem and the process's other /proc files belong to root
    _prctl(_PR_SET_DUMPABLE, int("dumpable" in CFG["removed"]), 0, 0, 0)
    lim = CFG["limits"]
    cpu = lim["cpu"] if cpu_s is None else cpu_s
    pairs = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (lim["as"], lim["as"])),
        (resource.RLIMIT_FSIZE, (lim["fsize"], lim["fsize"])),
        (resource.RLIMIT_NOFILE, (lim["nofile"], lim["nofile"])),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if lim.get("nproc") is not None:
        pairs.append((resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"])))
    for res, value in pairs:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(res, value)
    os.umask(0o077)
    os.close(REPORT_FD)
    if FILTERS is not None:
        FILTERS.install("child")


# ----------------------------------------------------------------------------- guard


def importlib_file() -> str:
    """Where the import system's Python code lives (its frames are passed over when the
    guard asks who raised an event)."""
    import importlib

    return str(importlib.__file__)


def install_guard(
    work: str,
    allow_subprocess: bool,
    fd: int,
    judge: int = -1,
    known: frozenset[int] = frozenset(),
) -> None:
    """Register the audit hook that refuses what model code may not do.

    Everything the hook needs is bound as a default argument (so patching ``os`` or
    ``builtins`` later changes nothing) and it uses only str/bytes methods otherwise.
    Refused operations raise :class:`PermissionError` and are written as ``B`` lines to
    ``fd``.  ``judge`` is the thread id of the BigCodeBench judge thread, the one thread
    that may read other threads' frames (see :func:`_judge_thread`).  ``known``: ids of
    the functions whose code, defaults and globals may not be set (a BigCodeBench
    test's snapshot: the libraries' and the driver's); a function made later (a
    ``namedtuple`` a library defines lazily, the solution's own) is its maker's.

    Where the run has a file system and a network of its own (bubblewrap:
    ``CFG["own_tmp"]``, ``CFG["own_net"]``) the kernel holds what the guard would
    otherwise hold by path and by address: writes anywhere on the sandbox's private
    ``/tmp`` are let through (a test writing ``/tmp/test_data.json``, as tests do under
    the official harness), and sockets and name lookups too (a test's own server on
    ``localhost`` works; nothing beyond the sandbox's loopback exists to reach).

    ``ctypes`` is refused to model code, not to libraries: an event whose caller (the
    code that called into ``ctypes``, or imported it) is a library's, compiled from a
    file under the interpreter's library directories, which are read-only, is let
    through (threadpoolctl finds numpy's BLAS with ``ctypes.CDLL`` when the solution
    fits a model); one the solution's or the test's own code raises is refused, and so
    is compiling code under a library file's name from such code (a class of the
    solution's would pass for the library's).  A library that hands raw memory to its
    caller still does (numpy's ``__array_interface__`` did before): what is read that
    way cannot be written to the verdict (the seccomp filter of a test's threads), and
    what forges a pass is caught by the mutant copies.
    """
    proc_events = frozenset(
        {
            "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
            "os.forkpty", "subprocess.Popen", "pty.spawn",
        }
    )  # fmt: skip
    path_events: dict[str, tuple[tuple[int, int | None], ...]] = {
        # event -> indices of (path, dir_fd) pairs in its arguments
        "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
        "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.utime": ((0, 4),),
        "os.truncate": ((0, None),), "os.mkfifo": ((0, 2),), "os.mknod": ((0, 3),),
        "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)),
        "os.symlink": ((1, 2),), "os.setxattr": ((0, None),),
        "os.removexattr": ((0, None),), "shutil.rmtree": ((0, 1),),
        "os.chflags": ((0, None),), "os.lchflags": ((0, None),),
    }  # fmt: skip
    dns_events = frozenset(
        {
            "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
            "socket.gethostbyname_ex", "socket.getnameinfo",
        }
    )  # fmt: skip
    refused_events = frozenset(
        {
            # every use of ctypes is refused too (any event named ctypes.*, below)
            "gc.get_objects", "gc.get_referrers", "gc.get_referents",
            # code objects the compiler did not make (a crafted one reads and writes
            # memory; code.__new__ below, where a library's own code.replace is let
            # through); marshal.loads is let through only for a library's own .pyc
            "marshal.load",
            "sys.settrace", "sys.setprofile", "sys._current_frames",
            # a hook of the solution's would run inside the judge thread, and monitoring
            # callbacks (3.12+) are a tracer by another name
            "sys.addaudithook", "sys.monitoring.register_callback",
            "sys.monitoring.set_events", "sys.monitoring.use_tool_id",
        }
    )  # fmt: skip
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    func_attrs = frozenset({"__code__", "__defaults__", "__kwdefaults__", "__globals__"})
    native = frozenset({"ctypes", "_ctypes"})
    me: list[Any] = []

    def trusted_pyc(
        data: Any,
        caller: Any,
        _roots: tuple[str, ...] = _library_roots(),
        _ws: str = work.rstrip("/") + "/",
        _ro: bool = bool(CFG.get("harden") or CFG.get("mount")),
        _open: Callable[..., int] = os.open,
        _read: Callable[[int, int], bytes] = os.read,
        _close: Callable[[int], None] = os.close,
        _fstatvfs: Callable[[int], Any] = os.fstatvfs,
        _readlink: Callable[[str], str] = os.readlink,
        _rdonly: int = os.ST_RDONLY | 0,
        _flags: int = os.O_RDONLY | os.O_CLOEXEC,
        _bytes: type[bytes] = bytes,
        _str: type[str] = str,
    ) -> bool:
        """Whether ``marshal.loads(data)``, called from frame ``caller``, loads a
        library's own bytecode: the caller names the ``.pyc`` it read (importlib's
        ``_compile_bytecode``: ``bytecode_path``), the file opened there lies under a
        library directory (never the work dir) on a read-only mount (where the engine
        has one), and ``data`` is exactly its code.  Only C functions are called."""
        try:
            path = caller.f_locals.get("bytecode_path") if caller is not None else None
            if type(path) is not _str:
                return False
            fd = _open(path, _flags)
            try:
                real = _readlink("/proc/self/fd/" + _str(fd))
                if not real.endswith(".pyc") or not real.startswith(_roots):
                    return False
                if real.startswith(_ws) or (_ro and not _fstatvfs(fd).f_flag & _rdonly):
                    return False
                chunks = []
                while True:
                    chunk = _read(fd, 1 << 20)
                    if not chunk:
                        break
                    chunks.append(chunk)
            finally:
                _close(fd)
            return _bytes(data) == b"".join(chunks)[16:]
        except Exception:  # noqa: BLE001 - anything odd is untrusted
            return False

    roots = _library_roots()
    writable = "/tmp" if CFG.get("own_tmp") else work

    import ctypes

    def library_caller(
        frame: Any,
        _roots: tuple[str, ...] = roots,
        _ws: str = work.rstrip("/") + "/",
        _str: type[str] = str,
        _passed: tuple[str, ...] = (
            "<frozen importlib",
            os.path.dirname(importlib_file()) + "/",
            os.path.dirname(str(ctypes.__file__)) + "/",
        ),
        _driver: str = install_guard.__code__.co_filename,
    ) -> bool:
        """Whether the code that raised an event is a library's: compiled from a file
        under the library directories (read-only), never the work dir's.  The import
        system and ctypes' own Python code are passed over: what counts is the module
        that imports, the code that called into ctypes."""
        depth = 0
        while frame is not None and depth < 64:
            name = frame.f_code.co_filename
            if type(name) is not _str:
                return False
            if name == _driver:
                # this driver's own code (formatting a traceback reads and parses lines
                # of the files it names)
                return True
            if not name.startswith(_passed):
                return name.startswith(_roots) and not name.startswith(_ws)
            frame = frame.f_back
            depth += 1
        return False

    def from_import_system(
        frame: Any,
        _passed: tuple[str, ...] = ("<frozen importlib", os.path.dirname(importlib_file()) + "/"),
        _str: type[str] = str,
    ) -> bool:
        name = frame.f_code.co_filename if frame is not None else None
        return type(name) is _str and name.startswith(_passed)

    def source_of(
        source: Any,
        path: str,
        _open: Callable[..., int] = os.open,
        _read: Callable[[int, int], bytes] = os.read,
        _close: Callable[[int], None] = os.close,
        _flags: int = os.O_RDONLY | os.O_CLOEXEC,
        _bytes: type[bytes] = bytes,
        _str: type[str] = str,
    ) -> bool:
        """Whether ``source`` (bytes or text) is exactly the file at ``path``."""
        try:
            if type(source) is _str:
                source = source.encode("utf-8", "surrogateescape")
            if type(source) is not _bytes:
                return False
            fd = _open(path, _flags)
            try:
                chunks = []
                while True:
                    chunk = _read(fd, 1 << 20)
                    if not chunk:
                        break
                    chunks.append(chunk)
            finally:
                _close(fd)
            return source == b"".join(chunks)
        except Exception:  # noqa: BLE001 - anything odd is untrusted
            return False

    def hook(
        event: str,
        args: tuple[Any, ...],
        _w: str = writable,
        _ws: str = writable.rstrip("/") + "/",
        _cwd: Callable[[], str] = os.getcwd,
        _write: Callable[[int, bytes], int] = os.write,
        _readlink: Callable[[str], str] = os.readlink,
        _stat: Callable[[str], os.stat_result] = os.stat,
        _fd: int = fd,
        _pid: int = os.getpid(),
        _proc: frozenset[str] = proc_events,
        _paths: dict[str, tuple[tuple[int, int | None], ...]] = path_events,
        _dns: frozenset[str] = dns_events,
        _refused: frozenset[str] = refused_events,
        _wflags: int = write_flags,
        _allow: bool = allow_subprocess,
        _fattrs: frozenset[str] = func_attrs,
        _str: type[str] = str,
        _bytes: type[bytes] = bytes,
        _int: type[int] = int,
        _isinst: Callable[[Any, Any], bool] = isinstance,
        _pe: type[PermissionError] = PermissionError,
        _oe: type[OSError] = OSError,
        _me: list[Any] = me,
        _len: Callable[[Any], int] = len,
        _judge: int = judge,
        _ident: Callable[[], int] = _thread.get_ident,
        _native: frozenset[str] = native,
        _mie: type[ModuleNotFoundError] = ModuleNotFoundError,
        _trusted_pyc: Callable[[Any, Any], bool] = trusted_pyc,
        _frame: Callable[[int], Any] = sys._getframe,
        _known: frozenset[int] = known,
        _id: Callable[[Any], int] = id,
        _net: bool = bool(CFG.get("own_net")),
        _library_caller: Callable[[Any], bool] = library_caller,
        _from_import_system: Callable[[Any], bool] = from_import_system,
        _source_of: Callable[[Any, str], bool] = source_of,
        _roots: tuple[str, ...] = roots,
    ) -> None:
        def refuse(detail: str, error: type[Exception] = _pe) -> None:
            try:  # noqa: SIM105 - nothing may be looked up at call time (no contextlib)
                _write(
                    _fd,
                    ("B " + event + ": " + detail.replace("\n", " ")[:300] + "\n").encode(
                        "utf-8", "replace"
                    ),
                )
            except _oe:
                pass
            raise error("sandbox: " + event + " not allowed (" + detail[:200] + ")")

        def resolve(path: Any, dir_fd: Any = None) -> str | None:
            if _isinst(path, _bytes):
                path = path.decode("utf-8", "surrogateescape")
            if not _isinst(path, _str):
                try:
                    path = path.__fspath__()
                except Exception:
                    return None
                if _isinst(path, _bytes):
                    path = path.decode("utf-8", "surrogateescape")
                if not _isinst(path, _str):
                    return None
            if not path.startswith("/"):
                if dir_fd is not None and _isinst(dir_fd, _int) and dir_fd >= 0:
                    try:
                        base = _readlink("/proc/self/fd/" + _str(dir_fd))
                    except _oe:
                        return None
                else:
                    base = _cwd()
                path = base + "/" + path
            parts: list[str] = []
            for part in path.split("/"):
                if part == "" or part == ".":
                    continue
                if part == "..":
                    if parts:
                        parts.pop()
                    continue
                parts.append(part)
            return "/" + "/".join(parts)

        def inside(path: Any, dir_fd: Any = None) -> bool:
            p = resolve(path, dir_fd)
            return p is not None and (p == _w or p.startswith(_ws))

        if event == "open":
            path = args[0]
            if _isinst(path, _int):
                return
            mode: Any = args[1] if _len(args) > 1 else None
            flags: Any = args[2] if _len(args) > 2 else 0
            writing = False
            if _isinst(mode, _str):
                writing = ("w" in mode) or ("a" in mode) or ("x" in mode) or ("+" in mode)
            if _isinst(flags, _int) and flags & _wflags:
                writing = True
            if inside(path):
                return
            if writing:
                refuse("write to " + _str(path))
            target = resolve(path)
            if (
                target is not None
                and target.startswith("/proc/")
                and (target.endswith("/mem") or target.endswith("/environ"))
            ):
                refuse("read " + target)
            # A directory handle outside could serve as dir_fd for a relative write
            # that looks inside; refuse directory opens.
            try:
                is_dir = target is not None and (_stat(target).st_mode & 0o170000) == 0o040000
            except _oe:
                is_dir = False
            if is_dir:
                refuse("open directory " + _str(path))
            return
        spec = _paths.get(event)
        if spec is not None:
            for idx, fd_idx in spec:
                if idx >= _len(args):
                    continue
                path = args[idx]
                if _isinst(path, _int):
                    if event in ("os.chmod", "os.chown", "os.truncate", "os.utime"):
                        continue  # an fd-based call on a file already opened
                    refuse(_str(path))
                dir_fd = args[fd_idx] if fd_idx is not None and fd_idx < _len(args) else None
                if not inside(path, dir_fd):
                    refuse(_str(path))
            if event == "os.symlink":
                # the link's target must stay inside too (relative to the link's dir)
                target = args[0]
                if _isinst(target, _bytes):
                    target = target.decode("utf-8", "surrogateescape")
                if not _isinst(target, _str):
                    refuse("symlink target")
                if not target.startswith("/"):
                    link = resolve(args[1], args[2] if _len(args) > 2 else None) or "/"
                    target = link.rsplit("/", 1)[0] + "/" + target
                if not inside(target):
                    refuse("symlink to " + target)
            return
        if event in _proc:
            if not _allow:
                refuse(_str(args[0])[:200] if args else "")
            return
        if event == "os.kill" or event == "os.killpg":
            if args and args[0] != _pid and args[0] != 0:
                refuse("signal to pid " + _str(args[0]))
            return
        if event == "socket.__new__":
            if not _net and _len(args) > 1 and args[1] != 1 and args[1] != -1:  # 1 = AF_UNIX
                refuse("socket family " + _str(args[1]))
            return
        if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            if not _net and _len(args) > 1 and not _isinst(args[1], (_str, _bytes)):
                refuse(_str(args[1]))
            return
        if _net and event in _dns:
            return
        if event == "sys._current_frames" and _judge >= 0 and _ident() == _judge:
            return
        if event == "import":
            name = args[0] if args else ""
            if (
                _isinst(name, _str)
                and (name in _native or name.startswith("ctypes."))
                and not _library_caller(_frame(1))
            ):
                # an ImportError: libraries that treat ctypes as optional go on without
                refuse(name, _mie)
            return
        if event == "marshal.loads":
            # importlib's _compile_bytecode, loading a .pyc of a read-only library
            # directory, is the one caller let through: the bytes must be that file's
            if not (args and _trusted_pyc(args[0], _frame(1))):
                refuse("bytes that are not a library's .pyc")
            return
        if event.startswith("ctypes."):
            if not _library_caller(_frame(1)):
                refuse(_str(args[0])[:100] if args else "")
            return
        if event == "code.__new__":
            # types.coroutine (asyncio, imported lazily) sets a flag with code.replace
            if not _library_caller(_frame(1)):
                refuse(_str(args[0])[:100] if args else "")
            return
        if event == "compile":
            given: Any = args[1] if _len(args) > 1 else None
            if _isinst(given, _bytes):
                given = given.decode("utf-8", "surrogateescape")
            if _isinst(given, _str) and given.startswith(_roots):
                caller = _frame(1)
                # the import system compiles a module's source under its file's name:
                # trusted when the source is that file's; other code must be a library's
                if _from_import_system(caller):
                    if not _source_of(args[0] if args else None, given):
                        refuse("compile under a library's file name " + given)
                elif not _library_caller(caller):
                    refuse("compile under a library's file name " + given)
            return
        if event in _dns or event in _refused:
            refuse(_str(args[0])[:100] if args else "")
        if event == "object.__setattr__":
            if _len(args) > 1 and args[1] in _fattrs and _id(args[0]) in _known:
                refuse("set " + _str(args[1]))
            return

    if "guard" in CFG["removed"]:
        return
    me.append(hook)
    sys.addaudithook(hook)


# ----------------------------------------------------------------------- child control


def _memfd(name: str, data: bytes = b"") -> int:
    """An anonymous file (no path anything could open), holding ``data``."""
    try:
        fd = os.memfd_create(name, 0)
    except (AttributeError, OSError):
        # not Linux, or refused by the bubblewrap sandbox's seccomp filter (memory files
        # would escape its memory limits): a file without a name in the driver's scratch
        # dir, on the sandbox's size-limited tmpfs (else one unlinked at once)
        try:
            fd = os.open(CFG["control"], os.O_TMPFILE | os.O_RDWR, 0o600)
        except (AttributeError, OSError):
            import tempfile

            fd, path = tempfile.mkstemp(prefix=name, dir=CFG["control"])
            os.unlink(path)
    if data:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_fd(fd: int, limit: int) -> tuple[bytes, bool]:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks, size = [], 0
    while size <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    data = b"".join(chunks)
    return data[:limit], len(data) > limit


# Wait statuses of the driver's children that a sweep reaped before they were waited for.
_REAPED: dict[int, int] = {}


def _wait(pid: int, timeout: float) -> tuple[int | None, bool]:
    """Wait for child ``pid``; kill it at ``timeout``.  (wait status, timed out)."""
    if pid in _REAPED:  # already reaped by a sweep
        return _REAPED.pop(pid), False
    deadline = time.monotonic() + max(0.01, timeout)
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = -1
    import select

    timed_out = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        if pidfd >= 0:
            select.select([pidfd], [], [], left)
        else:
            time.sleep(min(left, 0.005))
    if pidfd >= 0:
        os.close(pidfd)
    return status, timed_out


def _swept(keep: int = 0) -> bool:
    """After a test: nothing it started is left to see the next one (:func:`sweep`,
    where the run has a PID namespace of its own; elsewhere ``kill(-1)`` would reach
    the caller's other processes).  False (stop testing) where something survived."""
    if not CFG.get("own_pidns"):
        return True
    if sweep(keep):
        return True
    report("N", "a process of the last test survived being killed: no further tests run")
    return False


def _status_json(status: int | None) -> dict[str, int]:
    if status is None:
        return {}
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"exit": os.WEXITSTATUS(status)}


def _fork_child(body: Callable[[], int], cpu_s: int | None = None) -> int:
    """Fork a child that enters the sandbox rules, runs ``body`` and exits with its code."""
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        # the parent's word for the driver is not the test's to read (or to steal)
        if CONTROL_FD >= 0:
            os.close(CONTROL_FD)
        enter_child(CFG["workdir"], cpu_s)
        status = body()
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(status & 0xFF)


# ------------------------------------------------------------------------- job: program


def job_program() -> None:
    """Run ``main.py`` as ``__main__``; its stdio are the launcher's."""
    work = CFG["workdir"]
    main_path = os.path.join(work, "main.py")
    with open(main_path, "rb") as fh:
        code = compile(fh.read(), main_path, "exec")

    def body() -> int:
        import types

        # the guard reports on stderr's neighbour: a private dup of the report channel
        install_guard(work, CFG["allow_subprocess"], guard_fd)
        sys.argv = [main_path, *CFG["args"]]
        sys.path.insert(0, work)
        module = types.ModuleType("__main__")
        module.__file__ = main_path
        sys.modules["__main__"] = module
        exec(code, module.__dict__)
        return 0

    guard_fd = _memfd("guard")
    pid = _fork_child(body)
    status, _ = _wait(pid, 1e9)
    blocked, _ = _read_fd(guard_fd, 1 << 20)
    for line in blocked.decode("utf-8", "replace").splitlines()[:100]:
        report("B", line[2:] if line.startswith("B ") else line)
    report("S", json.dumps(_status_json(status)))


# ----------------------------------------------------------------------------- job: lcb


def _compile_solution(job: dict[str, Any]) -> Any:
    """The solution's code object, or None after reporting a ``compile_error`` frame."""
    try:
        return compile(job["solution"], "solution.py", "exec")
    except (SyntaxError, ValueError) as exc:
        frame({"event": "compile_error", "error": f"{type(exc).__name__}: {exc}"})
        return None


def _child_stdio(stdin_fd: int, out_fd: int, err_fd: int) -> None:
    """A test child's standard streams: its input on fd 0, its output and errors on
    fds 1 and 2 (files the driver reads once the test has ended)."""
    import io

    os.dup2(stdin_fd, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "rb", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "wb", closefd=False), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "wb", closefd=False), encoding="utf-8")


def _await_go(go_r: int) -> None:
    """Wait for the driver's go (one byte) before any model code runs; a pipe closed
    unwritten means the test is not to run."""
    go = os.read(go_r, 1)
    os.close(go_r)
    if go != b"G":
        os._exit(1)


def _call_args(text: str) -> list[Any]:
    """A functional test's arguments: one JSON value per line of its input."""
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def _lcb_entry(g: dict[str, Any], fn_name: str) -> Callable[..., Any]:
    """What a functional test calls: ``Solution().fn_name`` (LeetCode style) or a
    top-level ``fn_name``."""
    cls = g.get("Solution")
    if isinstance(cls, type) and hasattr(cls, fn_name):
        return getattr(cls(), fn_name)  # type: ignore[no-any-return]
    if callable(g.get(fn_name)):
        return g[fn_name]  # type: ignore[no-any-return]
    raise NameError(f"no Solution.{fn_name} or function {fn_name} defined")


def _json_result(value: Any) -> str:
    """A functional test's return value as the JSON text that crosses to the parent."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the result is not JSON data: {exc}") from None


def _cpu_s(pid: int) -> float | None:
    """CPU seconds process ``pid`` used so far (all its threads), or None where
    ``/proc`` does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rfind(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


# One child for a sample's calls.  The official checker compiles a call-based program
# once and calls its method for every test in that one process (one ``Solution()``, the
# state one test leaves seen by the next), each call under a time limit; so does
# :func:`_lcb_calls`, which spares a fork, a guard and an ``exec`` per test.  What keeps
# the verdict out of the solution's reach there, though it shares a process with every
# test of its sample:
#
# * the expected outputs never enter the sandbox; the parent judges the values;
# * a value crosses as one record on a pipe, ``V <test> <JSON>``, in the tests' order.
#   The solution can write that pipe too, but a record it writes is only an answer it
#   could as well have returned; anything else there (a record out of turn or after the
#   last, a line that is neither a record nor the guard's, more than a value's cap)
#   fails the test it came in;
# * each test's time limit is the driver's, counted from the record before, and ends
#   the child with SIGKILL (no handler, mask or ``alarm(0)`` of the solution's delays
#   it); the CPU time the child used during a test is held to the same limit;
# * the child ending (``sys.exit(0)``, ``os._exit(0)``, a crash, closing the pipe)
#   before a test's record fails that test; an operation the guard refused fails the
#   test it came in, and one after the last record fails the last;
# * samples stay apart as before: one sandbox each, ended after its sample.
#
# As in the official checker (and allowed there), a test can change what the next one
# sees, and a thread started in one test can go on working while later tests run.

_CHANNEL_SLACK = 1 << 16  # bytes of a record beyond the value (its head, guard lines)


def _lcb_calls(
    code: Any, g: dict[str, Any], tests: list[dict[str, Any]], fn_name: str, limit: float,
    out_cap: int,
) -> None:  # fmt: skip
    """Run every test of a call-based sample in one child (see "one child for a sample's
    calls" above) and report one ``test`` frame per test that ran."""
    import select

    work = CFG["workdir"]
    n = len(tests)
    stdin_fd, out_fd, err_fd = _memfd("stdin"), _memfd("stdout"), _memfd("stderr")
    chan_r, chan_w = os.pipe()
    go_r, go_w = os.pipe()

    def body() -> int:
        os.close(chan_r)
        os.close(go_w)
        _child_stdio(stdin_fd, out_fd, err_fd)
        sys.path.insert(0, work)
        install_guard(work, CFG["allow_subprocess"], chan_w)
        _await_go(go_r)
        exec(code, g)
        fn = _lcb_entry(g, fn_name)
        for i, test in enumerate(tests):
            data = "V " + str(i) + " " + _json_result(fn(*_call_args(test["input"]))) + "\n"
            view = memoryview(data.encode("utf-8", "replace"))
            while view:
                view = view[os.write(chan_w, view) :]
        return 0

    # RLIMIT_CPU is the backstop for the whole child; each test's share is checked below
    pid = _fork_child(body, int(CFG["limits"]["cpu"]) * (n + 1))
    os.close(go_r)
    os.close(chan_w)
    with contextlib.suppress(OSError):
        os.write(go_w, b"G")
    os.close(go_w)
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = -1
    cap = out_cap + _CHANNEL_SLACK
    frames: list[dict[str, Any]] = []
    blocked: list[str] = []  # refused while the test now running ran
    buf = bytearray()
    status: int | None = None
    timed_out = eof = False
    problem = ""
    went, cpu0 = time.monotonic(), _cpu_s(pid)
    while not (problem or timed_out or (frames and frames[-1]["blocked"])):
        while (nl := buf.find(b"\n")) >= 0:
            line = bytes(buf[:nl]).decode("utf-8", "replace")
            del buf[: nl + 1]
            if line.startswith("B "):
                (frames[-1]["blocked"] if len(frames) == n else blocked).append(line[2:][:300])
                continue
            parts = line.split(" ", 2)
            if len(frames) == n or len(parts) != 3 or parts[:2] != ["V", str(len(frames))]:
                problem = "sandbox: the result channel was written out of turn"
                break
            now, cpu = time.monotonic(), _cpu_s(pid)
            if cpu is not None and cpu0 is not None and cpu - cpu0 > limit:
                timed_out = True
                break
            frames.append(_call_frame(len(frames), parts[2], blocked))
            blocked = []
            went, cpu0 = now, cpu
            if frames[-1]["blocked"]:
                break
        if problem or timed_out or (frames and frames[-1]["blocked"]):
            break
        if len(buf) > cap:
            problem = f"sandbox: a result over its {out_cap}-byte cap"
            break
        if status is not None and (eof or not select.select([chan_r], [], [], 0)[0]):
            if buf:  # a line left unended
                problem = "sandbox: the result channel was written out of turn"
            break  # ended, and all it wrote is read
        left = went + limit - time.monotonic()
        if left <= 0 and status is None:
            timed_out = True
            break
        # (a pipe at its end is always readable: then only the child's end is waited for)
        waits = ([] if eof else [chan_r]) + ([pidfd] if pidfd >= 0 and status is None else [])
        ready = select.select(waits, [], [], max(0.0, left if pidfd >= 0 else min(left, 0.005)))
        if chan_r in ready[0]:
            chunk = os.read(chan_r, 1 << 20)
            eof = not chunk
            buf += chunk
        if status is None:
            done, got = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                status = got
    if status is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    for fd in (pidfd, chan_r, stdin_fd, out_fd):
        if fd >= 0:
            os.close(fd)
    err, _ = _read_fd(err_fd, 1 << 16)
    os.close(err_fd)
    if len(frames) < n and not (frames and frames[-1]["blocked"]):
        # the test that was running when the child ended, was ended or broke the rules
        frames.append(_call_frame(len(frames), None, blocked))
        frames[-1]["status"] = _status_json(status)
    frames[-1]["timed_out"] = timed_out
    if problem:
        frames[-1]["error"] = problem
    frames[-1]["stderr_tail"] = err.decode("utf-8", "replace")[-2000:]
    for f in frames:
        frame(f)


def _call_frame(i: int, value: str | None, blocked: list[str]) -> dict[str, Any]:
    """Test ``i``'s frame from the one child of a call-based sample: its value (None
    where none came) and the operations the guard refused while it ran."""
    return {
        "event": "test", "i": i, "timed_out": False, "status": {"exit": 0}, "stdout": "",
        "stdout_truncated": False, "value": value, "value_truncated": False,
        "stderr_tail": "", "blocked": blocked[:20],
    }  # fmt: skip


def job_lcb() -> None:
    """Run a sample's LiveCodeBench tests: each stdin test in a fresh child, a sample
    whose tests are all functional in one child (:func:`_lcb_calls`); forward raw
    outputs (no verdicts)."""
    import builtins
    import gc

    work = CFG["workdir"]
    job = CFG["job"]
    prelude_src = job["prelude"]
    code = _compile_solution(job)
    if code is None:
        return
    # The prelude's names are bound once here (its modules imported, its limits set),
    # and each child starts from a copy: the same bindings as running it there, without
    # the import machinery's work (and its copy-on-write faults) once per test.
    base: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    with contextlib.suppress(Exception):
        exec(compile(prelude_src, "<prelude>", "exec"), base)
    base["__name__"] = "__main__"
    limit = float(job["time_limit"])
    out_cap = int(job["output_limit"])
    fn_name = job.get("fn_name")
    # What is loaded now is not garbage the children make: a collection in a child
    # would otherwise walk (and so copy) every object inherited from here.
    gc.freeze()
    frame({"event": "ready"})
    tests = job["tests"]
    if fn_name and tests and all(t["testtype"] == "functional" for t in tests):
        _lcb_calls(code, dict(base), tests, str(fn_name), limit, out_cap)
        return

    def start(i: int, test: dict[str, Any], done: tuple[int, ...]) -> tuple[int, int, list[int]]:
        """Fork test ``i``'s child, which sets itself up and waits for the go (one byte
        on its pipe) before any model code runs: (pid, the go pipe, the test's fds)."""
        kind = test["testtype"]
        stdin_fd = _memfd("stdin", test["input"].encode("utf-8") if kind == "stdin" else b"")
        out_fd, err_fd, res_fd = _memfd("stdout"), _memfd("stderr"), _memfd("result")
        go_r, go_w = os.pipe()
        # made here, not in the child: copying the prelude's bindings there would write
        # to (and so copy) every page they are on
        g = dict(base)

        def body(
            kind: str = kind, test: dict[str, Any] = test, res_fd: int = res_fd,
            stdin_fd: int = stdin_fd, out_fd: int = out_fd, err_fd: int = err_fd,
            g: dict[str, Any] = g,
        ) -> int:  # fmt: skip
            # the previous test's files (still open here while it ran) are not this one's
            for fd in (*done, go_w):
                os.close(fd)
            _child_stdio(stdin_fd, out_fd, err_fd)
            sys.path.insert(0, work)
            install_guard(work, CFG["allow_subprocess"], res_fd)
            _await_go(go_r)
            if kind == "stdin":
                exec(code, g)
                return 0
            args = _call_args(test["input"])
            exec(code, g)
            text = _json_result(_lcb_entry(g, str(fn_name))(*args))
            sys.stdout.flush()
            os.write(res_fd, ("V " + text + "\n").encode("utf-8", "replace"))
            return 0

        pid = _fork_child(body)
        os.close(go_r)
        return pid, go_w, [stdin_fd, out_fd, err_fd, res_fd]

    # Each test's child is forked (and sets itself up) while the test before it runs;
    # it starts only once that test has ended and everything it left was killed.
    ahead = start(0, tests[0], ()) if tests else None
    for i in range(len(tests)):
        assert ahead is not None
        pid, go_w, fds = ahead
        ahead = None
        with contextlib.suppress(OSError):
            os.write(go_w, b"G")
        os.close(go_w)
        went = time.monotonic()
        if i + 1 < len(tests):
            ahead = start(i + 1, tests[i + 1], tuple(fds))
        stdin_fd, out_fd, err_fd, res_fd = fds
        status, timed_out = _wait(pid, limit - (time.monotonic() - went))
        out, out_trunc = _read_fd(out_fd, out_cap)
        err, _ = _read_fd(err_fd, 1 << 16)
        res, res_trunc = _read_fd(res_fd, out_cap + (1 << 16))
        for fd in fds:
            os.close(fd)
        value_text = None
        blocked = []
        for line in res.decode("utf-8", "replace").splitlines():
            if line.startswith("V ") and value_text is None:
                value_text = line[2:]
            elif line.startswith("B "):
                blocked.append(line[2:][:300])
        frame(
            {
                "event": "test",
                "i": i,
                "timed_out": timed_out,
                "status": _status_json(status),
                "stdout": out.decode("utf-8", "replace"),
                "stdout_truncated": out_trunc,
                "value": value_text,
                "value_truncated": res_trunc,
                "stderr_tail": err.decode("utf-8", "replace")[-2000:],
                "blocked": blocked[:20],
            }
        )
        # A time-out, crash or refused operation fails the sample whatever the expected
        # output is, so the tests after it need not run.
        failed = timed_out or blocked or status is None or status != 0
        if failed or not _swept(ahead[0] if ahead is not None else 0):
            break
    if ahead is not None:
        # not started: the go pipe closes unwritten, and the child ends without running
        os.close(ahead[1])
        with contextlib.suppress(ChildProcessError):
            os.waitpid(ahead[0], 0)
        for fd in ahead[2]:
            os.close(fd)


# ----------------------------------------------------------------------------- job: bcb
#
# How a BigCodeBench test is judged (the assertions must run next to the solution, in
# its process, so every part of that process is within its reach except what is said
# here):
#
# * The verdict is written by a *judge thread* (:func:`_judge_thread`) started in each
#   test's child before the solution runs.  Only it knows the test's nonce: the parent
#   makes the nonce after the fork and sends it down a pipe the thread empties before any
#   model code runs.  No frame, global or object the solution can reach refers to it: a
#   thread's frames are only visible through ``sys._current_frames`` (refused except to
#   the judge) and ``gc`` (refused), signal handlers run on the main thread, and the judge
#   calls no code that the solution could have replaced (its helpers are clones bound to a
#   private copy of this module's globals and of ``builtins``, made before it runs).
# * The test runs on the main thread with unittest's ``debug`` protocol (setUp, the
#   method, tearDown, cleanups; an exception propagates), so there is no result object to
#   edit: a pass is the control flow reaching :func:`_ask_pass` in :func:`_bcb_child`.
#   The judge honours that request only after reading the main thread's stack itself:
#   ``_ask_pass``'s frame directly above *the* child frame registered before the
#   solution ran, at that call's line.  Code of the solution's, a rebuilt copy of the
#   driver's function, a signal handler or a finaliser makes a different stack.
# * Before the solution runs, the driver snapshots every loaded module: each binding to
#   a function, class or module, each class's methods, each function's code, defaults,
#   globals and closure, and all of this module's globals.  The judge compares at every
#   call of the entry point, at every assertion and before the pass; any change that the
#   test did not make itself (a ``mock.patch`` entered from the test's code is the
#   test's) makes the verdict ``tampered``.
# * Values that reach the checks are walked (the entry point's return value and its
#   arguments after the call, and every assertion's arguments): objects of classes the
#   solution made that change comparison or truth, library objects with methods the
#   solution put on the instance, mocks the solution made (``unittest.mock.ANY``
#   included) and rigged objects inside lists, dicts, numpy and pandas containers are
#   refused.

# Dunders a class created by the solution may define on an object it returns; anything
# else (comparisons, truth, length, attribute hooks, ...) could make a test's check pass
# without the right answer.
_PLAIN_DUNDERS = frozenset(
    {
        "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__init__",
        "__slots__", "__annotations__", "__firstlineno__", "__static_attributes__",
        "__repr__", "__str__", "__orig_bases__", "__parameters__", "__classcell__",
    }
)  # fmt: skip
# Objects a walk inspects (plain values are skipped in C loops and not counted): more
# than this and the value is refused rather than passed unchecked, since a rigged object
# behind that many others would otherwise reach the test.
_WALK_LIMIT = 2_000_000
_PLAIN = frozenset({int, float, str, bytes, bool, complex, type(None)})
# Imported before the snapshot whatever the test imports: what judges (unittest and its
# mocks) and the standard library a solution would patch to change a check's answer.
_BCB_PRELOAD = (
    "unittest", "unittest.mock", "os", "posixpath", "genericpath", "json", "re", "math",
    "types", "traceback", "contextlib", "weakref", "threading", "dis", "operator",
    "functools", "collections", "copy", "copyreg", "shutil", "glob", "fnmatch",
)  # fmt: skip
# Bindings libraries change while working as designed (hooks and warning display).
_VOLATILE = frozenset(
    {
        ("sys", "excepthook"), ("sys", "displayhook"), ("sys", "unraisablehook"),
        ("sys", "breakpointhook"), ("warnings", "showwarning"),
        ("warnings", "formatwarning"), ("warnings", "_showwarnmsg"),
        # warnings.catch_warnings(record=True), a test's or a library's, swaps it
        ("warnings", "_showwarnmsg_impl"),
        ("threading", "excepthook"), ("builtins", "_"),
    }
)  # fmt: skip
# Keys copy/pickle and typing add to classes as caches; any other new key that shadows
# an inherited attribute changes behaviour.
_CLASS_CACHES = frozenset({"__slotnames__", "__abstractmethods__", "_abc_impl"})
_ALIVE: list[Any] = []
_MISSING = object()
# (request fd, answer fd) of the main thread's channel to the judge: numbers reserved
# before the snapshot, so that this binding never changes.
_CHAN: tuple[int, int] = (-1, -1)
# mocks the test's own code made, by id (:func:`_mock_init`); the object is kept so that
# an id is never reused for another
_MOCKS_OF_THE_TEST: dict[int, Any] = {}
_BCB_RULES: tuple[Any, ...] = ()
_FUNCTION_TYPE = types.FunctionType
_METHOD_TYPE = types.MethodType
_MODULE_TYPE = types.ModuleType
# what a C type's own slots, methods and attributes are in its class dict
_C_SLOTS = (
    type(object.__eq__),  # wrapper_descriptor
    type(str.join),  # method_descriptor
    type(types.FunctionType.__dict__["__code__"]),  # getset_descriptor
    type(types.FunctionType.__dict__["__globals__"]),  # member_descriptor
)
_GENERATOR_TYPE = types.GeneratorType


class UntrustedResultError(TypeError):
    """A value reaching a check holds behaviour the solution defines (:func:`_untrusted`)."""


class TamperedError(AssertionError):
    """The judge found something changed that the tests rely on."""


def _all_classes() -> set[int]:
    """ids of every class that exists now (they stay alive: the driver holds them)."""
    seen: dict[int, type] = {}
    todo: list[type] = [object]
    subclasses = type.__subclasses__
    while todo:
        cls = todo.pop()
        if id(cls) in seen:
            continue
        seen[id(cls)] = cls
        try:
            todo.extend(subclasses(cls))
        except TypeError:
            todo.extend(cls.__subclasses__())
    _ALIVE.append(seen)
    return set(seen)


def _add_codes(codes: dict[int, Any], code: Any) -> None:
    """``code`` and every code object nested in it (functions, lambdas, comprehensions)."""
    todo = [code]
    while todo:
        c = todo.pop()
        if id(c) in codes:
            continue
        codes[id(c)] = c
        todo.extend(k for k in c.co_consts if type(k) is type(c))


def _fn_state(fn: Any, all_cells: bool) -> tuple[Any, ...]:
    """What a function's behaviour hangs on (compared by identity)."""
    cells = []
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if all_cells or callable(value) or isinstance(value, type(sys)):
            cells.append((cell, value))
    return (fn.__code__, fn.__defaults__, fn.__kwdefaults__, fn.__globals__, tuple(cells))


def _functions_in(value: Any) -> list[Any]:
    """The plain functions a module or class binding stands for."""
    import types

    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if type(f) is types.FunctionType]
    return [value] if type(value) is types.FunctionType else []


def _snapshot(driver_globals: dict[str, Any]) -> tuple[Any, ...]:
    """Everything the judge compares, as tuples (the solution can read them, not edit).

    Returns (dicts, functions, trusted code ids, class ids of the snapshot); ``dicts``
    rows are (label, mapping, expected items, all keys then, shadowable names or None).
    """
    import builtins
    import types

    module_type = types.ModuleType
    heap = 1 << 9  # Py_TPFLAGS_HEAPTYPE: other types cannot be changed from Python
    dicts: list[tuple[Any, ...]] = []
    funcs: list[tuple[Any, ...]] = []
    codes: dict[int, Any] = {}
    seen_cls: set[int] = set()
    seen_fn: set[int] = set()
    builtin_names = frozenset(vars(builtins))

    def add_fn(fn: Any, label: str) -> None:
        if id(fn) in seen_fn:
            return
        seen_fn.add(id(fn))
        mine = fn.__globals__ is driver_globals
        funcs.append((label, fn, _fn_state(fn, mine)))
        _add_codes(codes, fn.__code__)
        # what a decorator wraps (contextmanager's generator, functools.wraps) is the
        # library's code too
        for cell in fn.__closure__ or ():
            with contextlib.suppress(ValueError):
                if type(cell.cell_contents) is types.FunctionType:
                    add_fn(cell.cell_contents, label)
        wrapped = fn.__dict__.get("__wrapped__")
        if type(wrapped) is types.FunctionType:
            add_fn(wrapped, label)

    classes: list[tuple[str, type]] = []
    for name, mod in list(sys.modules.items()):
        if not issubclass(type(mod), module_type):
            continue
        d = vars(mod)
        mine = d is driver_globals
        items = tuple(
            (k, v)
            for k, v in list(d.items())
            if type(k) is str
            # the type, not isinstance: a lazy object (django's settings) answers
            # __class__ by setting itself up, which may raise
            and (mine or callable(v) or issubclass(type(v), module_type))
            and (name, k) not in _VOLATILE
        )
        dicts.append(_row(name, d, items, d, builtin_names, mod))
        for k, v in items:
            if isinstance(v, type) and id(v) not in seen_cls and v.__flags__ & heap:
                seen_cls.add(id(v))
                classes.append((f"{name}.{k}", v))
            for fn in _functions_in(v):
                add_fn(fn, f"{name}.{k}")
    # which module a name imports: replacing sys.modules["os"] would hand the test
    # another os (the child's own __main__ and __test__ are not modules of the snapshot)
    mods = tuple(
        (k, v)
        for k, v in list(sys.modules.items())
        if type(k) is str and k not in ("__main__", "__test__")
    )
    dicts.append(_row("sys.modules", sys.modules, mods, (), (), None))
    for label, cls in classes:
        proxy = vars(cls)
        items = tuple((k, v) for k, v in list(proxy.items()) if type(k) is str)
        inherited = frozenset(k for base in cls.__mro__[1:] for k in vars(base))
        dicts.append(_row(label, proxy, items, proxy, inherited, cls))
        for k, v in items:
            for fn in _functions_in(v):
                add_fn(fn, f"{label}.{k}")
    return tuple(dicts), tuple(funcs), frozenset(codes), tuple(codes.values())


def _row(
    label: str, d: Any, items: tuple[Any, ...], keys: Any, shadowable: Any, owner: Any
) -> tuple[Any, ...]:
    """One mapping of the snapshot: its expected names and values as two tuples, so
    that the judge compares them with C loops (a check of every loaded module takes
    milliseconds, not a quarter of a second)."""
    names = tuple(k for k, _ in items)
    values = tuple(v for _, v in items)
    return (label, d, names, values, frozenset(keys), frozenset(shadowable), owner)


def _behaviour(x: Any) -> bool:
    """Whether ``x`` acts when the test uses it (a callable, a class or a module) rather
    than being read (data).  Judge-safe: only the object's type is looked at."""
    t = type(x)
    return callable(x) or issubclass(t, type) or issubclass(t, _MODULE_TYPE)


def _plain_data(x: Any, rules: _Rules) -> bool:
    """Data whose class the solution did not make: library caches, counters, settings.
    (An object of a class of the solution's may rig comparisons: not plain.)"""
    if _behaviour(x):
        return False
    t = type(x)
    if t in (int, float, str, bytes, bool, complex, type(None), tuple, list, dict, set):
        return True
    known, codes = rules[0], rules[1]
    return id(t) in known or _made_by(t, codes) or _library_class(t, rules[5])


def _wraps(new: Any, old: Any, codes: frozenset[int]) -> bool:
    """``new`` is a wrapper a library made around ``old``: a function of trusted code
    whose closure (or ``__wrapped__``) holds ``old``, every function in it trusted
    (sklearn's ``set_output`` wraps ``fit_transform`` so, lazily)."""
    if type(new) is not _FUNCTION_TYPE or id(new.__code__) not in codes:
        return False
    held = []
    for cell in new.__closure__ or ():
        try:
            held.append(cell.cell_contents)
        except ValueError:
            continue
    own = new.__dict__
    if type(own) is dict and "__wrapped__" in own:
        held.append(own["__wrapped__"])
    target = old.__func__ if type(old) is _METHOD_TYPE else old
    if not any(h is old or h is target for h in held):
        return False
    return all(id(h.__code__) in codes for h in held if type(h) is _FUNCTION_TYPE)


def _same_builtin(key: str, new: Any) -> bool:
    """A name bound to the very builtin it shadows (six's lazy ``six.moves`` binds
    ``range`` to ``range`` when first asked): nothing changes."""
    import builtins

    return vars(builtins).get(key, _MISSING) is new


def _submodule(label: str, key: str, new: Any) -> bool:
    """``new`` is the submodule ``label.key`` the import system loaded (a package gets
    its submodules as attributes, ``encodings.ascii`` among them, whose name is also a
    builtin's) from a file under the interpreter's library directories."""
    if type(new) is not _MODULE_TYPE or sys.modules.get(label + "." + key) is not new:
        return False
    path = vars(new).get("__file__")
    return type(path) is str and path.startswith(_BCB_RULES[5]) if _BCB_RULES else False


def _own_alternative(label: str, key: str, new: Any, values: tuple[Any, ...]) -> bool:
    """A library class switching a private slot to another of its own methods, as
    libraries keep modes (pyparsing turns its packrat cache on when matplotlib first
    parses a label: ``ParserElement._parse`` becomes its ``_parseCache``): ``new`` was
    already one of the class's own values in the snapshot.  Never for unittest, its
    mocks or the builtins, and never a public name or a dunder (what a test calls)."""
    if not key.startswith("_") or key.endswith("__"):
        return False
    if any(label == h or label.startswith(h + ".") for h in ("unittest", "builtins")):
        return False
    return any(v is new for v in values)


def _harmless(old: Any, new: Any, rules: _Rules) -> bool:
    """A change of a binding that no test could be fooled by: data replaced by plain
    data (a library filling its cache: matplotlib's ``Path._unit_rectangle``, a counter),
    data removed, or a library's wrapper around what was there.  Behaviour replaced,
    added over an inherited definition or removed is the solution's doing."""
    if new is _MISSING:
        return old is _MISSING or not _behaviour(old)
    if old is not _MISSING and _behaviour(old):
        return _wraps(new, old, rules[1])
    return _plain_data(new, rules)


def _drift(
    dicts: tuple[Any, ...],
    funcs: tuple[Any, ...],
    exempt: dict[Any, list[Any]],
    full: bool,
    rules: _Rules,
) -> str:
    """The first change to the snapshot that could fool a test, or ``""``.  Runs in the
    judge thread: it only compares identities and exact types, so no object of the
    solution's is called (the keys are checked to be exact str before any lookup, and no
    other thread runs while the judge works).  Functions' code, defaults and globals are
    compared only when ``full`` (the guard refuses assigning them anyway); closure cells
    always.  What a ``mock.patch`` the test entered put in place is the test's; what a
    library changes as it works (:func:`_harmless`) is not counted."""
    for label, d, names, values, keys, shadowable, owner in dicts:
        if set(map(type, d)) - {str}:
            return f"{label} has a key that is not a str"
        if not all(map(_is, map(d.get, names, _repeat(_MISSING)), values)):
            for k, v in zip(names, values, strict=True):
                got = d.get(k, _MISSING)
                if got is v:
                    continue
                allowed = exempt.get((id(d), k))
                if allowed and allowed[-1] is got:
                    continue
                if _harmless(v, got, rules) or _own_alternative(label, k, got, values):
                    continue
                return f"{label}.{k} was {'removed' if got is _MISSING else 'replaced'}"
        if shadowable and not keys.issuperset(d):
            for k in [k for k in d if k not in keys]:
                if k not in shadowable or k in _CLASS_CACHES:
                    continue
                got = d.get(k, _MISSING)
                allowed = exempt.get((id(d), k))
                if allowed and allowed[-1] is got:
                    continue
                if (
                    _harmless(_inherited(owner, k), got, rules)
                    or _submodule(label, k, got)
                    or _same_builtin(k, got)
                ):
                    continue
                return f"{label}.{k} was added (it shadows another definition)"
    for label, fn, state in funcs:
        if full:
            now = _fn_state(fn, True)
            if any(a is not b for a, b in zip(now[:4], state[:4], strict=True)):
                return f"the code, defaults or globals of {label} were replaced"
        for cell, value in state[4]:
            try:
                same = cell.cell_contents is value
            except ValueError:
                same = False
            if not same:
                return f"a closure cell of {label} was replaced"
    return ""


def _inherited(owner: Any, key: str) -> Any:
    """What ``key`` meant on class ``owner`` before it was set on the class itself: the
    first base's own definition (``_MISSING`` for a module row, or none)."""
    if not issubclass(type(owner), type):
        return _MISSING
    for base in _mro(owner)[1:]:
        found = _get(_class_dict(base), key)
        if found is not _MISSING:
            return found
    return _MISSING


def _call_lines(code: Any, name: str) -> frozenset[int]:
    """Lines of ``code`` that load the global ``name`` (the call sites of the judge's
    requests), read from its bytecode."""
    import dis

    lines: set[int] = set()
    line = None
    for ins in dis.get_instructions(code):
        positions = getattr(ins, "positions", None)
        if positions is not None and positions.lineno is not None:
            line = positions.lineno
        elif isinstance(getattr(ins, "starts_line", None), int):
            line = ins.starts_line
        if ins.opname == "LOAD_GLOBAL" and ins.argval == name and line is not None:
            lines.add(line)
    return frozenset(lines)


def _ask(kind: bytes) -> None:
    """Send a request to the judge thread and wait for its answer (main thread)."""
    req, ans = _CHAN
    os.write(req, kind)
    if os.read(ans, 1) == b"1":
        raise TamperedError("the grader's snapshot changed (see the verdict)")


def _ask_begin() -> None:
    _ask(b"B")


def _ask_ns() -> None:
    _ask(b"N")


def _ask_patch() -> None:
    _ask(b"X")


def _ask_pass() -> None:
    _ask(b"P")


def _ask_check() -> None:
    _ask(b"C")


def _ask_assert() -> None:
    _ask(b"A")


def _private(fns: tuple[str, ...]) -> dict[str, Any]:
    """Clones of this module's functions bound to a private copy of its globals and of
    ``builtins``: what the judge thread calls cannot be rebound by anyone."""
    import builtins
    import types

    mine = globals()
    priv = dict(mine)
    priv["__builtins__"] = dict(vars(builtins))
    for key, value in mine.items():
        if type(value) is types.FunctionType and value.__globals__ is mine:
            clone = types.FunctionType(
                value.__code__, priv, value.__name__, value.__defaults__, value.__closure__
            )
            clone.__kwdefaults__ = value.__kwdefaults__
            priv[key] = clone
    return {k: priv[k] for k in fns}


def _judge_thread(*args: Any) -> None:
    """The judge thread's entry: it runs :func:`_judge` as a private clone (see
    :func:`_private`), made here, in the thread, before the solution exists."""
    # a bare try: contextlib.suppress would run contextlib's code (and its builtins) on
    # this thread after the solution
    try:  # noqa: SIM105
        _private(("_judge",))["_judge"](*args)
    except BaseException:  # noqa: BLE001, S110 - never raise on this thread (see _judge)
        pass


def _get(d: Any, key: str) -> Any:
    """``d[key]`` (or ``_MISSING``) without hashing or comparing keys of other types."""
    for k, v in list(d.items()):
        if type(k) is str and k == key:
            return v
    return _MISSING


def _case_drift(row: tuple[Any, ...], test_codes: frozenset[int]) -> str:
    """What the solution changed on the running test case, or ``""`` (judge thread)."""
    case, cls, name, shadowed = row
    if type(case) is not cls:
        return "the test case's class was replaced"
    for k, v in list(object.__getattribute__(case, "__dict__").items()):
        if type(k) is not str:
            return "the test case has a key that is not a str"
        if k in shadowed:
            return f"the test case's {k} was replaced on the instance"
        if k == "_testMethodName" and (type(v) is not str or v != name):
            return "the test case's method name was changed"
        if k == "_type_equality_funcs":
            if type(v) is not dict:
                return "the test case's equality functions were replaced"
            for f in list(v.values()):
                if type(f) is str:
                    continue
                if type(f) is _METHOD_TYPE:
                    f = f.__func__
                if type(f) is not _FUNCTION_TYPE or id(f.__code__) not in test_codes:
                    return "an equality function the test did not add was registered"
    return ""


def _get_keys(d: Any) -> list[str]:
    return [k for k in list(d) if type(k) is str]


def _shadowing(ns: Any, reads: frozenset[str], rules: tuple[Any, ...]) -> str:
    """A builtin the test reads that the solution's module defines with its own code
    (``def isinstance(*a): return True`` would answer the test's checks), or ``""``."""
    known, codes = rules[0], rules[1]
    for k, v in list(ns.items()):
        if type(k) is not str or k not in reads:
            continue
        if type(v) is _FUNCTION_TYPE and id(v.__code__) not in codes:
            return f"the solution defines {k}, which the test reads as a builtin"
        if isinstance(v, type) and id(v) not in known:
            return f"the solution defines {k}, which the test reads as a builtin"
        if type(v) is not _FUNCTION_TYPE and not isinstance(v, type) and not callable(v):
            return f"the solution binds {k}, which the test reads as a builtin"
    return ""


def _patch_owner(dicts: tuple[Any, ...], target: Any) -> Any:
    """The snapshot mapping of module or class ``target`` (a mock.patch's target)."""
    for row in dicts:
        if row[6] is target:
            return row[1]
    return None


def _trusted_stack(frame: Any, child: Any, allowed: frozenset[int], first: frozenset[int]) -> bool:
    """Whether every frame from ``frame`` down to the child frame is code of unittest,
    its mocks, contextlib or the test, and the first one outside mock and contextlib is
    the test's or unittest's (not a finaliser's or the solution's)."""
    seen_first = False
    f = frame
    while f is not None and f is not child:
        code_id = id(f.f_code)
        if code_id not in allowed:
            return False
        if not seen_first and code_id in first:
            seen_first = True
        f = f.f_back
    return f is child and seen_first


def _judge(
    nonce_fd: int,
    verdict_fd: int,
    req_fd: int,
    ans_fd: int,
    main: int,
    ready_fd: int,
    info: tuple[Any, ...],
) -> None:
    """Answer the main thread's requests and write the verdict (see the notes at the top
    of this section).  Runs as a private clone: every global it reads is its own."""
    dicts, funcs, test_name, child_code, ask_codes, patch_info, test_codes, rules, hot = info
    enter_code, patch_cls, stack_allowed, stack_first = patch_info
    read, write, close, frames = os.read, os.write, os.close, sys._current_frames
    ask_code = ask_codes[b"*"]
    pass_lines = _call_lines(child_code, "_ask_pass")
    ns_lines = _call_lines(child_code, "_ask_ns")
    begin_lines = _call_lines(child_code, "_ask_begin")
    nonce = read(nonce_fd, 64).hex()
    close(nonce_fd)
    write(ready_fd, b"1")
    close(ready_fd)
    exempt: dict[Any, list[Any]] = {}
    extra: tuple[Any, ...] = ((), ())
    case_row: tuple[Any, ...] = ()
    child: Any = None
    tampered = ""
    passed = False

    def verdict(outcome: str, text: str) -> None:
        detail = text.encode("utf-8", "replace").hex()
        write(verdict_fd, ("V " + nonce + " " + outcome + " " + detail + "\n").encode())

    # No code of the solution's may ever run on this thread (it could read these frames):
    # it never raises out (an unraisable-exception hook would get the traceback), drops
    # no last reference to anything, and while it works the collector (whose finalisers
    # run on the allocating thread) is off and no other thread is switched in; between
    # requests it waits in read(), where no Python code runs.
    import gc

    gc_off, gc_on, gc_enabled = gc.disable, gc.enable, gc.isenabled
    get_switch, set_switch = sys.getswitchinterval, sys.setswitchinterval
    while True:
        try:
            kind = read(req_fd, 1)
        except BaseException:  # noqa: BLE001 - the fd was taken away: stop quietly
            return
        collecting = gc_enabled()
        gc_off()
        switch = get_switch()
        set_switch(1e6)
        gc_off()  # a thread switched in before the line above may have turned it on
        if not kind:
            set_switch(switch)
            return
        why = ""
        try:
            # the main thread waits in _ask, called by the _ask_* function of this kind,
            # called by the frame that asks
            top = frames().get(main)
            asker = top.f_back if top is not None and top.f_code is ask_code else None
            ok = asker is not None and asker.f_code is ask_codes.get(kind)
            frame = asker.f_back if ok and asker is not None else None
            if kind == b"B":
                if child is not None or frame is None or frame.f_code is not child_code:
                    why = "a forged begin request"
                elif frame.f_lineno in begin_lines:
                    child = frame
            elif kind == b"N":
                if child is None or frame is not child or frame.f_lineno not in ns_lines:
                    why = "a forged test-namespace request"
                else:
                    loc = frame.f_locals
                    ns, cls, case = loc["ns"], loc["cls"], loc["case"]
                    keep = tuple((k, _get(ns, k)) for k in loc["test_stores"])
                    proxy = type.__dict__["__dict__"].__get__(cls)
                    items = tuple((k, v) for k, v in list(proxy.items()) if type(k) is str)
                    wrapped = tuple(
                        (f"the test module's {k}", v, _fn_state(v, True))
                        for k, v in keep
                        if type(v) is type(_get)
                    )
                    mro = type.__dict__["__mro__"].__get__(cls)
                    inherited = frozenset(
                        k
                        for base in mro[1:]
                        for k in list(type.__dict__["__dict__"].__get__(base))
                        if type(k) is str
                    )
                    reads = loc["test_reads"]
                    rows = (
                        _row("the test module", ns, keep, _get_keys(ns), reads, None),
                        _row("TestCases", proxy, items, proxy, inherited, cls),
                    )
                    why = _shadowing(ns, reads, rules)
                    extra = (rows, wrapped)
                    shadowed = frozenset(
                        k
                        for base in mro
                        for k, v in list(type.__dict__["__dict__"].__get__(base).items())
                        if type(k) is str and callable(v)
                    ) | {"failureException"}
                    case_row = (case, cls, test_name, shadowed)
            elif kind == b"X":
                # A mock.patch was entered: the test's own when only unittest, its mocks
                # and the test's code are on the real child's stack.
                if frame is not None and frame.f_code is enter_code and child is not None:
                    patcher = frame.f_locals.get("self")
                    if type(patcher) is patch_cls and _trusted_stack(
                        frame.f_back, child, stack_allowed, stack_first
                    ):
                        own = object.__getattribute__(patcher, "__dict__")
                        target, attr = _get(own, "target"), _get(own, "attribute")
                        mapping = _patch_owner(dicts, target)
                        if type(attr) is str and mapping is not None:
                            exempt.setdefault((id(mapping), attr), []).append(_get(mapping, attr))
            elif kind == b"P":
                if child is None or frame is not child or frame.f_lineno not in pass_lines:
                    why = "a forged pass request"
                elif passed:
                    why = "a second pass request"
                else:
                    passed = True
            if not why and not tampered:
                # at an assertion, what the machinery of checks stands on (a full
                # check of every loaded module costs 25-50 ms with pandas loaded, and
                # a test makes dozens): the full check after each call of the entry
                # point and before the pass
                why = (
                    _drift(hot if kind == b"A" else dicts, funcs if kind != b"A" else (),
                           exempt, kind == b"P", rules)
                    or _drift(extra[0], extra[1], {}, kind == b"P", rules)
                    or (_case_drift(case_row, test_codes) if case_row else "")
                )  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - the judge must answer whatever failed
            why = why or "the judge could not check: " + type(exc).__name__
        say = ""
        if why and not tampered:
            tampered = say = why
        answer = b"1" if tampered else b"0"
        # the switch interval back before anything that blocks (a write lets other
        # threads run, which must not keep the interpreter for good); what follows
        # makes only strings, which the collector does not track
        set_switch(switch)
        if collecting:
            gc_on()
        try:
            if say:
                verdict("tampered", say)
            if kind == b"P" and passed and not tampered:
                verdict("pass", "")
            write(ans_fd, answer)
        except BaseException:  # noqa: BLE001 - the fd was taken away: stop quietly
            return


# --------------------------------------------------------------- bcb: the main thread


def _mro(t: type) -> tuple[type, ...]:
    # read through type's own descriptor: a metaclass of the solution's is never asked
    return tuple(type.__dict__["__mro__"].__get__(t))


def _class_dict(t: type) -> Any:
    return type.__dict__["__dict__"].__get__(t)


# What :func:`_untrusted` accepts, as a tuple (the solution can read it, not edit it):
# (class ids of the snapshot, trusted code ids, unittest.mock class ids, type of
# unittest.mock.ANY, whether the test itself uses ANY).
_Rules = tuple[Any, ...]


def _class_problem(t: type, rules: _Rules, strict: bool) -> str:
    """Why an object of class ``t`` may not be judged, or ``""``."""
    known, codes, _mocks, any_type, any_ok, lib_roots = rules
    mro = _mro(t)
    if t is any_type:
        return "" if any_ok and not strict else "unittest.mock.ANY"
    if id(t) in known or _made_by(t, codes) or _library_class(t, lib_roots):
        return ""
    if id(type(t)) not in known:
        return "an object whose metaclass was made by the solution"
    if _c_level(mro, known):
        return ""
    for c in mro:
        if id(c) in known:
            if c is not object:
                return f"a {c.__name__} subclass made by the solution"
            continue
        for k, v in list(_class_dict(c).items()):
            trusted = type(v) is _FUNCTION_TYPE and id(v.__code__) in codes
            if type(k) is str and k.startswith("__") and k not in _PLAIN_DUNDERS and not trusted:
                return f"an object of a class made by the solution that defines {k}"
    return ""


def _c_level(mro: tuple[type, ...], known: frozenset[int]) -> bool:
    """Whether every class of ``mro`` made after the snapshot holds only C slots of its
    own, each under its own name (a Cython type a library made lazily: scipy's fused
    functions), and plain entries: no code of the solution's is behind any of it.  (A
    class statement always adds a Python function for each method it defines, and a
    slot moved to another name, ``__eq__ = int.__ne__``, is refused.)"""
    made = [c for c in mro if id(c) not in known]
    slots = 0
    for c in made:
        for k, v in list(_class_dict(c).items()):
            if type(k) is not str or k in _PLAIN_DUNDERS or v is None:
                continue
            if type(v) not in _C_SLOTS or not any(b is v.__objclass__ for b in mro):
                return False
            if getattr(v, "__name__", None) != k:
                return False
            slots += 1
    return slots > 0


def _made_by(t: type, codes: frozenset[int]) -> bool:
    """Whether every function of ``t`` (made after the snapshot) is trusted code (the
    test's own helper classes)."""
    fns = [v for v in _class_dict(t).values() if type(v) is _FUNCTION_TYPE]
    return bool(fns) and all(id(f.__code__) in codes for f in fns)


def _library_class(t: type, roots: tuple[str, ...]) -> bool:
    """A class a library defined after the snapshot (a module it imports lazily): its
    module is a file under the interpreter's library directories and every function
    of it, and of its bases made after the snapshot, was compiled from a file there."""
    for c in _mro(t):
        if c is object:
            continue
        # exact types only: the judge thread calls this, where no object of the
        # solution's may run (a rigged __module__ or a module with __getattr__)
        name = _class_dict(c).get("__module__")
        module = sys.modules.get(name) if type(name) is str else None
        own = vars(module) if type(module) is _MODULE_TYPE else {}
        path = own.get("__file__")
        if type(path) is not str or not path.startswith(roots):
            return False
        for v in list(_class_dict(c).values()):
            # a library's decorators live in other files of it (matplotlib's
            # _api.deprecation): any library file, none the solution could name
            # (the guard refuses compiling under a library file's name)
            origin = v.__code__.co_filename if type(v) is _FUNCTION_TYPE else path
            if type(origin) is not str or not origin.startswith(roots):
                return False
        if c is t:
            return True
    return False


def _is_mock(t: type, rules: _Rules) -> bool:
    return any(id(c) in rules[2] for c in _mro(t))


def _untrusted(value: Any, rules: _Rules, strict: bool, allowed: frozenset[int]) -> str:
    """Why ``value`` may not reach a test's checks, or ``""``.

    Walked: list, tuple, set, dict and deque contents (subclasses too, through the base
    type's own methods), numpy object arrays, pandas objects' values, index and
    columns, and instance ``__dict__`` values, all of it: plain values (numbers,
    strings) are passed over in C loops, and more than ``_WALK_LIMIT`` other objects
    is a refusal, not a pass.  Refused: see :func:`_class_problem`, and library objects
    with a function of the solution's set on the instance.  ``strict`` (the entry
    point's results) also refuses mocks; objects whose ids are in ``allowed`` (what the
    test passed in) pass.
    """
    todo = [value]
    seen: set[int] = set()
    while todo:
        x = todo.pop()
        t = type(x)
        if t in _PLAIN or id(x) in seen:
            continue
        seen.add(id(x))
        if len(seen) > _WALK_LIMIT:
            return f"a value of more than {_WALK_LIMIT:,} objects to check"
        if _is_mock(t, rules) and t is not rules[3]:
            # a mock the test made may come back (passed in, or made by the test's own
            # code that a patch calls); one the solution made answers whatever it is
            # asked (and is never walked: its children are mocks)
            if strict and id(x) not in allowed and not _test_made(x):
                return "a mock object"
            continue
        why = "" if id(x) in allowed else _class_problem(t, rules, strict)
        if why:
            return why
        mro = _mro(t)
        if dict in mro:
            _push(todo, dict.keys(x))
            _push(todo, dict.values(x))
        elif list in mro or tuple in mro or set in mro or frozenset in mro:
            base = next(b for b in (list, tuple, set, frozenset) if b in mro)
            _push(todo, base.__iter__(x))
        elif t.__module__ == "collections" and t.__name__ == "deque":
            _push(todo, x)
        elif t.__module__ == "numpy" and t.__name__ == "ndarray":
            if x.dtype.kind == "O":
                _push(todo, x.ravel().tolist())
        elif str(t.__module__).startswith("pandas."):
            for part in ("index", "columns"):
                with contextlib.suppress(Exception):
                    todo.append(object.__getattribute__(x, part))
            with contextlib.suppress(Exception):
                arr = x.to_numpy()
                if arr.dtype.kind == "O":
                    _push(todo, arr.ravel().tolist())
        if t is _FUNCTION_TYPE or isinstance(x, type):
            continue
        try:
            own = object.__getattribute__(x, "__dict__")
        except (AttributeError, TypeError):
            continue
        if type(own) is not dict:
            continue
        for k, v in list(own.items()):
            if type(v) in (_FUNCTION_TYPE, _METHOD_TYPE):
                fn = v.__func__ if type(v) is _METHOD_TYPE else v
                shadows = type(k) is str and any(k in _class_dict(c) for c in mro)
                # a method bound from a builtin (matplotlib keeps some) has no code:
                # the solution can make no builtin, so it is not the solution's
                if type(fn) is not _FUNCTION_TYPE:
                    continue
                # a library module's own functions (a module's __dir__, a lazy
                # loader's __getattr__) are compiled from its file, which the solution
                # cannot name when it compiles (the guard)
                origin = fn.__code__.co_filename
                if type(origin) is str and origin.startswith(rules[5]):
                    continue
                if shadows and id(fn.__code__) not in rules[1]:
                    return f"a {t.__name__} whose {k} the solution replaced on the instance"
            else:
                todo.append(v)
    return ""


def _push(todo: list[Any], items: Any) -> None:
    """The items of a container that need a look (not plain values), in C loops: a list
    of ten million numbers costs what its type checks cost, not a Python loop."""
    got = list(items)
    todo.extend(compress(got, map(not_, map(_PLAIN.__contains__, map(type, got)))))


def _reachable(values: Any) -> frozenset[int]:
    """ids of what the test passed to the entry point (a mock it made may come back)."""
    seen: set[int] = set()
    todo = [values]
    while todo and len(seen) < _WALK_LIMIT:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if type(x) in (list, tuple, set, frozenset):
            todo.extend(x)
        elif type(x) is dict:
            todo.extend(x.keys())
            todo.extend(x.values())
    return frozenset(seen)


def _checked(fn: Callable[..., Any], rules: _Rules) -> Callable[..., Any]:
    """The entry point as the tests call it: each call is followed by a judge check and
    a walk of its result and of its arguments (which it may have filled)."""

    def task(*args: Any, **kwargs: Any) -> Any:
        allowed = _reachable((args, kwargs))
        value = fn(*args, **kwargs)
        _ask_check()
        why = _untrusted(value, rules, True, allowed) or _untrusted(
            (args, kwargs), rules, True, allowed
        )
        if why:
            raise UntrustedResultError("the solution returned " + why)
        if type(value) is _GENERATOR_TYPE:
            return _checked_items(value, rules)
        return value

    task.__name__ = getattr(fn, "__name__", "task_func")
    task.__doc__ = getattr(fn, "__doc__", None)
    return task


def _checked_items(gen: Any, rules: _Rules) -> Any:
    """A generator the entry point returned, each item walked as a result is."""
    for item in gen:
        _ask_check()
        why = _untrusted(item, rules, True, frozenset())
        if why:
            raise UntrustedResultError("the solution yielded " + why)
        yield item


def _asserting(method: Callable[..., Any]) -> Callable[..., Any]:
    """A TestCase assertion that first has the judge check the snapshot and walks what
    it compares (once per assertion: nested calls from unittest itself are not
    re-checked)."""

    def assertion(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code.co_filename
        rules = _BCB_RULES
        if rules and not caller.endswith(("unittest/case.py", "unittest\\case.py")):
            _ask_assert()
            why = _untrusted((args[1:], kwargs), rules, False, frozenset())
            if why:
                raise UntrustedResultError("a checked value is " + why)
        return method(*args, **kwargs)

    assertion.__name__ = method.__name__
    assertion.__qualname__ = getattr(method, "__qualname__", method.__name__)
    return assertion


def _mock_init(
    original: Callable[..., Any], mock_codes: frozenset[int], test_codes: frozenset[int]
) -> Callable[..., Any]:
    """``unittest.mock.NonCallableMock.__init__`` that remembers the mocks the test made
    (a ``patch`` decorator's, or ``Mock()`` in a helper of the test's that a patch's
    ``side_effect`` calls), which the solution may hand back, as the official harness
    lets it: the nearest caller outside ``unittest.mock`` and ``contextlib`` is the
    test's code or unittest's.  A mock the solution makes is not remembered; a child
    mock is judged by its parent (:func:`_test_made`)."""
    made = _MOCKS_OF_THE_TEST

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        frame: Any = sys._getframe(1)
        while frame is not None and id(frame.f_code) in mock_codes:
            frame = frame.f_back
        if frame is not None and id(frame.f_code) in test_codes:
            made[id(self)] = self

    return __init__


def _test_made(mock: Any) -> bool:
    """Whether a mock (or the mock it is a child of) was made by the test's code."""
    seen = 0
    while mock is not None and seen < 64:
        if _MOCKS_OF_THE_TEST.get(id(mock)) is mock:
            return True
        try:
            own = object.__getattribute__(mock, "__dict__")
        except (AttributeError, TypeError):
            return False
        parent = own.get("_mock_new_parent") if type(own) is dict else None
        mock = parent if parent is not None else own.get("_mock_parent")
        seen += 1
    return False


def _patch_enter(original: Callable[..., Any]) -> Callable[..., Any]:
    """``unittest.mock._patch.__enter__`` that tells the judge a patch is in place (the
    judge decides from the stack whether the test or the solution entered it)."""

    def enter(self: Any) -> Any:
        result = original(self)
        with contextlib.suppress(OSError):
            _ask_patch()
        return result

    return enter


def _summary(trace: str) -> str:
    """A traceback as its exception (all its lines) and where in the test or solution
    it was raised."""
    lines = trace.rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    start = frames[-1] + 1 if frames else 0
    # after the last frame come its source line and carets (indented), then the error
    while start < len(lines) and lines[start][:1] in (" ", "\t"):
        start += 1
    message = " ".join(line.strip() for line in lines[start:] if line.strip())
    ours = [
        lines[i].strip()
        for i in frames
        if lines[i].strip().startswith(('File "test_code.py"', 'File "solution.py"'))
    ]
    return (message + (f" ({ours[-1]})" if ours else ""))[-600:]


def _preimport(names: list[str]) -> None:
    import importlib

    for name in names:
        # a missing optional library fails the test later, not here
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - any library may fail its import
            report("N", f"could not import {name}: {type(exc).__name__}: {exc}"[:300])


def _library_roots() -> tuple[str, ...]:
    """Directories the interpreter loads libraries from (read-only in the sandbox; the
    work directory, where the solution may write, is never one of them)."""
    work = CFG["workdir"].rstrip("/") + "/"
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path}
    out = []
    for root in roots:
        if root and os.path.isabs(root) and not (root.rstrip("/") + "/").startswith(work):
            out.append(root.rstrip("/") + "/")
    return tuple(sorted(out))


def _source_imports(source: str) -> list[str]:
    """Absolute module names the source imports (read, never run)."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _test_stores(code: Any) -> tuple[str, ...]:
    """Names the test module's own code binds (imports, classes, functions, constants)."""
    import dis

    return tuple(
        sorted(
            {
                str(ins.argval)
                for ins in dis.get_instructions(code)
                if ins.opname in ("STORE_NAME", "STORE_GLOBAL")
            }
        )
    )


def _bcb_child(
    name: str,
    job: dict[str, Any],
    sol_code: Any,
    test_code: Any,
    test_stores: tuple[str, ...],
    test_reads: frozenset[str],
    fds: tuple[int, int, int, int],
    info: tuple[Any, ...],
    rules: _Rules,
) -> int:
    """One test, in its own child: start the judge, run the solution, then the test.

    The verdict channel (``chan_fd``, see :func:`_verdict_channel`) is moved to the fd
    number the parent's verdict filter names; once the judge thread runs, the main
    thread installs that filter on itself, so that it and every thread or process it
    starts can neither write to, read, copy, close nor replace that fd (the judge
    thread, started before, can).  The guard's lines and the main thread's account of
    a failure go to ``notes_fd``, which the solution can write too (and can only fail
    a test with).

    The filter does not cover the judge thread itself: a finaliser of the solution's
    that ran there would be outside it.  What holds that is the judge's own discipline
    (see :func:`_judge`): between requests it waits in ``read()``, where no Python code
    runs; while it works the collector is off and no other thread is switched in, and
    it drops no last reference to anything the solution made."""
    import builtins
    import types
    import unittest

    nonce_fd, chan_fd, notes_fd, out_fd = fds
    verdict_fd = int(CFG.get("verdict_fd") or chan_fd)
    if verdict_fd != chan_fd:
        os.dup2(chan_fd, verdict_fd, inheritable=False)
        os.close(chan_fd)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    req_r, req_w = os.pipe()
    ans_r, ans_w = os.pipe()
    os.dup2(req_w, _CHAN[0])
    os.dup2(ans_r, _CHAN[1])
    os.close(req_w)
    os.close(ans_r)
    ready_r, ready_w = os.pipe()
    me = _thread.get_ident()
    judge = _thread.start_new_thread(
        _judge_thread, (nonce_fd, verdict_fd, req_r, ans_w, me, ready_w, info)
    )
    if os.read(ready_r, 1) != b"1":
        return 1
    os.close(ready_r)
    if FILTERS is not None:
        FILTERS.install("verdict")
    work = CFG["workdir"]
    sys.path.insert(0, work)
    # the snapshot's functions: their code, defaults and globals are the judge's to keep
    known = frozenset(id(fn) for _label, fn, _state in info[1])
    install_guard(work, CFG["allow_subprocess"], notes_fd, judge, known)
    _ask_begin()
    module = types.ModuleType("__test__")
    ns = module.__dict__
    # as the official harness: the module starts with sys, os and environ bound
    ns.update({"__builtins__": builtins, "__file__": os.path.join(work, "solution.py"),
               "sys": sys, "os": os, "environ": os.environ})  # fmt: skip
    # the driver's own module must not be reachable as __main__
    sys.modules["__main__"] = sys.modules["__test__"] = module
    cls: Any = None
    case: Any = None
    try:
        exec(sol_code, ns)
        # what the test's names resolve to as builtins is the interpreter's, whatever the
        # solution bound (the judge holds it there from the test's start on)
        ns["__builtins__"] = builtins
        fn = ns.get(str(job["entry_point"]))
        if callable(fn):
            ns[str(job["entry_point"])] = _checked(fn, rules)
        exec(test_code, ns)
        cls = ns.get("TestCases")
        if not (isinstance(cls, type) and issubclass(cls, unittest.TestCase)):
            raise TypeError("TestCases is not a unittest.TestCase")
        case = cls(name)
        _ask_ns()
        _run_debug(ns, cls, case)
    except BaseException:
        import traceback as tb

        text = _summary(tb.format_exc())
        kind = "failure" if isinstance(sys.exc_info()[1], AssertionError) else "error"
        if isinstance(sys.exc_info()[1], TamperedError):
            kind = "error"
        with contextlib.suppress(BaseException):
            os.write(
                notes_fd, ("E " + json.dumps({"outcome": kind, "error": text}) + "\n").encode()
            )
        return 0
    _ask_pass()
    return 0


def _run_debug(ns: dict[str, Any], cls: Any, case: Any) -> None:
    """Module and class fixtures around the test (setUp, the method, tearDown,
    cleanups): any exception propagates, so a test passes only by finishing.

    Unlike ``case.debug()``, tearDown and the cleanups run when the method fails, as
    in the official harness's ``suite.run``: a test that fails must not leave its files
    (a database, a directory) to the next test of the sandbox, which a mutant copy's
    run, going on after failures, would otherwise see."""
    setup, teardown = ns.get("setUpModule"), ns.get("tearDownModule")
    if callable(setup):
        setup()
    cls.setUpClass()
    try:
        case._callSetUp()
        try:
            case._callTestMethod(getattr(case, case._testMethodName))
        finally:
            try:
                case._callTearDown()
            finally:
                while case._cleanups:
                    function, args, kwargs = case._cleanups.pop()
                    case._callCleanup(function, *args, **kwargs)
    finally:
        cls.tearDownClass()
        cls.doClassCleanups()
    if callable(teardown):
        teardown()


def job_bcb() -> None:
    """Run each named test method of a BigCodeBench task in a fresh child."""
    import types
    import unittest
    import unittest.mock

    global _CHAN, _BCB_RULES
    job = CFG["job"]
    sol_code = _compile_solution(job)
    if sol_code is None:
        return
    test_code = compile(job["test"], "test_code.py", "exec")
    entry = str(job["entry_point"])
    test_stores = tuple(sorted({*_test_stores(test_code), entry, "__builtins__"}))
    # the solution's imports too: a library imported before the snapshot is known code,
    # and one imported inside the guard may be refused what its import does (sockets)
    _preimport([*_BCB_PRELOAD, *job["imports"], *_source_imports(job["solution"])])
    # as the official harness: UTC, and exit()/quit() are not there
    os.environ["TZ"] = "UTC"
    time.tzset()
    # two fd numbers the children put the judge channel on, bound before the snapshot
    _CHAN = (os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_RDONLY))
    for attr in dir(unittest.TestCase):
        method = getattr(unittest.TestCase, attr)
        if attr.startswith(("assert", "fail")) and isinstance(method, types.FunctionType):
            setattr(unittest.TestCase, attr, _asserting(method))
    patch_cls: Any = getattr(unittest.mock, "_patch")  # noqa: B009 - private, untyped
    patch_cls.__enter__ = _patch_enter(patch_cls.__enter__)

    known = frozenset(_all_classes())
    _dicts, funcs, code_ids, codes_alive = _snapshot(globals())
    _ALIVE.append(codes_alive)
    test_code_ids: dict[int, Any] = {}
    _add_codes(test_code_ids, test_code)
    _ALIVE.append(list(test_code_ids.values()))
    by_module: dict[str, set[int]] = {}
    for _label, fn, _state in funcs:
        holder: dict[int, Any] = {}
        _add_codes(holder, fn.__code__)
        by_module.setdefault(str(fn.__globals__.get("__name__")), set()).update(holder)
    mock_ids = by_module.get("unittest.mock", set()) | by_module.get("contextlib", set())
    unittest_ids = set().union(*(v for k, v in by_module.items() if k.startswith("unittest.")))
    # the fixtures' runner is the one driver function between the child and unittest
    stack_allowed = frozenset(
        mock_ids | unittest_ids | set(test_code_ids) | {id(_run_debug.__code__)}
    )
    stack_first = frozenset(
        (unittest_ids - by_module.get("unittest.mock", set())) | set(test_code_ids)
    )
    mock_classes = frozenset(
        id(v)
        for v in vars(unittest.mock).values()
        if isinstance(v, type) and v.__module__ == "unittest.mock"
    )
    rules = (
        known,
        frozenset(code_ids | set(test_code_ids)),
        mock_classes,
        type(unittest.mock.ANY),
        "ANY" in job["test"],
        _library_roots(),
    )
    # the assertions read the rules from this global; the final snapshot holds it
    _BCB_RULES = rules
    # before the final snapshot, which then holds it as unittest.mock's own
    mock_base: Any = unittest.mock.NonCallableMock
    # (the driver's own wrapper of a patch's __enter__ is passed through like mock's code)
    passed_through = frozenset({*mock_ids, id(patch_cls.__enter__.__code__)})
    mock_base.__init__ = _mock_init(mock_base.__init__, passed_through, stack_first)
    dicts, funcs, _codes, codes_alive = _snapshot(globals())
    _ALIVE.append(codes_alive)
    hot = _hot_rows(dicts, job["imports"])
    ask_codes = {
        b"B": _ask_begin.__code__, b"N": _ask_ns.__code__, b"X": _ask_patch.__code__,
        b"P": _ask_pass.__code__, b"C": _ask_check.__code__, b"A": _ask_assert.__code__,
        b"*": _ask.__code__,
    }  # fmt: skip
    enter_code = patch_cls.__enter__.__code__
    import builtins

    names: set[str] = set()
    for code in test_code_ids.values():
        names.update(code.co_names)
    callables = {k for k, v in vars(builtins).items() if callable(v) and not k.startswith("__")}
    test_reads = frozenset((names & callables) - set(test_stores))
    deadline = time.monotonic() + float(job["time_limit"])
    frame({"event": "ready"})

    for name in job["tests"]:
        nonce_r, nonce_w = os.pipe()
        verdict_fd, chan_w = _verdict_channel()
        notes_fd, out_fd = _memfd("notes"), _memfd("out")
        info = (
            dicts, funcs, name, _bcb_child.__code__, ask_codes,
            (enter_code, patch_cls, stack_allowed, stack_first), frozenset(test_code_ids),
            rules, hot,
        )  # fmt: skip

        def body(
            name: str = name,
            fds: tuple[int, int, int, int] = (nonce_r, chan_w, notes_fd, out_fd),
            info: tuple[Any, ...] = info, writer: int = nonce_w, mine: int = verdict_fd,
        ) -> int:  # fmt: skip
            os.close(writer)
            os.close(mine)
            return _bcb_child(
                name, job, sol_code, test_code, test_stores, test_reads, fds, info, rules
            )

        pid = _fork_child(body)
        os.close(nonce_r)
        os.close(chan_w)
        # made after the fork: the child's copy of this process never held it
        import secrets

        nonce = secrets.token_bytes(16)
        os.write(nonce_w, nonce)
        os.close(nonce_w)
        status, timed_out = _wait(pid, deadline - time.monotonic())
        res = _read_verdict(verdict_fd, notes_fd)
        out, _ = _read_fd(out_fd, 1 << 14)
        for fd in (verdict_fd, notes_fd, out_fd):
            os.close(fd)
        outcome, error, blocked = _bcb_outcome(res, nonce.hex())
        if timed_out:
            outcome = "time_limit"
        elif status is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            if outcome == "pass":
                outcome = "error"
            error = error or f"the test process ended with {json.dumps(_status_json(status))}"
        frame(
            {
                "event": "test",
                "test": name,
                "outcome": outcome,
                "error": error,
                "blocked": blocked[:20],
                "output_tail": out.decode("utf-8", "replace")[-3000:],
            }
        )
        # the parent says whether another test runs (it knows why; the sandbox does not)
        if not _swept() or not _proceed():
            break


def _verdict_channel() -> tuple[int, int]:
    """(the driver's end, the test child's end) of a test's verdict channel: a socket
    pair, so that the child's end cannot be opened again through ``/proc/self/fd``
    (``ENXIO``) and nothing written into it can be read back or rewritten from there.
    (A pipe where a test removed that wall.)"""
    import socket

    if "verdict-socket" in CFG["removed"]:
        r, w = os.pipe()
        return r, w
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    mine.shutdown(socket.SHUT_WR)
    return mine.detach(), theirs.detach()


def _read_verdict(chan: int, notes: int) -> str:
    """A test's verdict lines: what the judge wrote on the channel (read without
    waiting: a process the test left behind may still hold the other end) after the
    lines of the notes file that are not verdicts (those only come on the channel)."""
    text, _ = _read_fd(notes, 1 << 20)
    lines = [line for line in text.split(b"\n") if not line.startswith(b"V ")]
    os.set_blocking(chan, False)
    got, size = [], 0
    with contextlib.suppress(OSError):
        while size <= 1 << 20:
            chunk = os.read(chan, 1 << 16)
            if not chunk:
                break
            got.append(chunk)
            size += len(chunk)
    return (b"\n".join(lines) + b"\n" + b"".join(got)).decode("utf-8", "replace")


# What an assertion stands on, checked at every one (the rest at the entry point's
# calls and at the pass): unittest and its mocks, the builtins, the path functions
# tests ask the file system with, and which module a name imports.
_HOT = ("unittest", "builtins", "os", "posixpath", "genericpath", "sys.modules", "sys")


def _hot_rows(dicts: tuple[Any, ...], imports: list[str]) -> tuple[Any, ...]:
    """The rows of the snapshot :data:`_HOT` names, and the modules the test imports
    (their own bindings: ``numpy.testing``'s functions, not all of numpy)."""
    exact = set(imports)
    return tuple(
        row
        for row in dicts
        if row[0] in exact or any(row[0] == h or row[0].startswith(h + ".") for h in _HOT)
    )


def _bcb_outcome(text: str, nonce: str) -> tuple[str, str, list[str]]:
    """(outcome, error, refused operations) from one test's verdict file.

    Only the judge's ``V`` lines carry the nonce; ``E`` lines (the main thread's account
    of a failure) and anything else are the process's word and can only fail a test.
    """
    passes, tampered, blocked = 0, "", []
    outcome, error = "no_report", ""
    for line in text.splitlines():
        if line.startswith("B "):
            blocked.append(line[2:][:300])
        elif line.startswith("V "):
            parts = line.split(" ")
            if len(parts) != 4 or parts[1] != nonce:
                continue
            try:
                detail = bytes.fromhex(parts[3]).decode("utf-8", "replace")
            except ValueError:
                continue
            if parts[2] == "pass":
                passes += 1
            elif parts[2] == "tampered" and not tampered:
                tampered = detail or "tampered"
        elif line.startswith("E ") and outcome == "no_report":
            with contextlib.suppress(ValueError):
                obj = json.loads(line[2:])
                if isinstance(obj, dict) and obj.get("outcome") in ("failure", "error"):
                    outcome, error = str(obj["outcome"]), str(obj.get("error", ""))[-600:]
    if tampered:
        return "tampered", tampered[:600], blocked
    if passes == 1 and outcome == "no_report":
        return "pass", "", blocked
    if passes > 1:
        return "error", "more than one verdict was reported", blocked
    return outcome, error, blocked


# ----------------------------------------------------------------------------- main


def _iter_jobs() -> Iterator[Callable[[], None]]:
    kind = CFG["job"]["kind"]
    yield {"program": job_program, "lcb": job_lcb, "bcb": job_bcb}[kind]


def _read_job(fd: int) -> dict[str, Any] | None:
    """The one job this driver runs: a line of JSON on pipe ``fd`` (the parent writes
    it at once).  None where the parent went away without sending one.  The pipe stays
    open: after a ``bcb`` test the parent's word comes on it (:func:`_proceed`)."""
    global CONTROL_FD, _WORDS
    chunks, data = [], b""
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        end = chunk.find(b"\n")
        if end >= 0:
            chunks.append(chunk[:end])
            data = chunk[end + 1 :]
            break
        chunks.append(chunk)
    CONTROL_FD, _WORDS = fd, data
    if not chunks:
        return None
    value = json.loads(b"".join(chunks))
    return value if isinstance(value, dict) else None


def _proceed() -> bool:
    """The parent's word after a test: run the next one (``g``) or stop (anything else,
    or the pipe's end).  The rule behind it stays with the parent: this process, whose
    memory every test's process starts as a copy of, only ever holds the answers."""
    global _WORDS
    while not _WORDS:
        try:
            _WORDS = os.read(CONTROL_FD, 64)
        except OSError:
            return False
        if not _WORDS:
            return False
    word, _WORDS = _WORDS[:1], _WORDS[1:]
    return word == b"g"


def sweep(keep: int = 0) -> bool:
    """Kill every process of the sandbox but this one, its init and ``keep`` (the next
    test's child, which has not run model code yet), so that nothing one test left
    behind sees the next.  In the run's own PID namespace: ``kill(-1)`` where nothing is
    kept, else each process ``/proc`` lists.  False where something survived repeated
    sweeps."""
    me = os.getpid()
    for _ in range(200):
        if not keep:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                return True
            except OSError:
                return False
        else:
            hit = False
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) in (1, me, keep) or _zombie(name):
                    continue
                with contextlib.suppress(OSError):
                    os.kill(int(name), signal.SIGKILL)
                    hit = True
            if not hit:
                return True
        _reap()
        time.sleep(0.001)
    return False


def _reap() -> None:
    """Reap what ended among this process's children (orphans, where it is the init)."""
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid <= 0:
                return
            _REAPED[pid] = status


def _zombie(pid: str) -> bool:
    """Whether ``/proc/PID`` is a process that ended and waits to be reaped (or is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"Z", b"X")


def _extend_path() -> None:
    """The grading interpreter's ``sys.path`` as it is outside (the parent sends it, see
    :func:`conductor.sandbox._paths.python_paths`): ``PYTHONPATH``, the user's
    site-packages (its ``.pth`` files processed), ``.pth`` entries; ``-I`` left them out."""
    wanted = CFG.get("sys_path")
    if not wanted:
        return
    import site

    for path in CFG.get("site_dirs") or []:
        with contextlib.suppress(Exception):
            site.addsitedir(path)
    added = [p for p in sys.path if p not in wanted]
    sys.path[:] = [*wanted, *added]


def main(argv: list[str]) -> int:
    """Entry point inside the sandbox: ``inside.py CONFIG``."""
    global REPORT_FD
    with open(argv[1], encoding="utf-8") as fh:
        CFG.update(json.load(fh))
    if argv[1].startswith("/proc/self/fd/"):
        # the config came on an inherited memory file: no process started later may read it
        with contextlib.suppress(OSError, ValueError):
            os.close(int(argv[1].rsplit("/", 1)[1]))
    REPORT_FD = int(CFG["report_fd"])
    CFG.setdefault("removed", [])
    try:
        harden()
    except Exception as exc:
        # a wall that could not be built: nothing runs (the run ends without a result,
        # which a grader records as its own error)
        report("N", f"driver failed: the sandbox could not be hardened: {exc!r}"[:600])
        return 1
    if CFG["mount"]:
        try:
            setup_mounts()
        except Exception as exc:
            report("N", f"read-only mounts unavailable: {exc!r}")
    with contextlib.suppress(OSError):
        _prctl(_PR_SET_DUMPABLE, int("dumpable" in CFG["removed"]), 0, 0, 0)
    _extend_path()
    if CFG.get("preload"):
        # what every job of this kind imports, done before the job is here: a warm
        # sandbox waits with it loaded (trusted code of the parent's, not the job's)
        import builtins

        with contextlib.suppress(Exception):
            exec(CFG["preload"], {"__name__": "__preload__", "__builtins__": builtins})
    # The job comes on a pipe, read once to its end: a warm sandbox runs exactly one job
    # (then it ends), and no process started later may read the job.
    job = _read_job(int(CFG["job_fd"]))
    if job is None:
        return 0
    CFG["job"], CFG["args"] = job["job"], job.get("args", [])
    # ctypes is what every child uses before its guard (no_new_privs, capabilities,
    # seccomp): imported and set up once here rather than once per test
    global FILTERS
    FILTERS = _Filters(CFG.get("seccomp") or {})

    for run in _iter_jobs():
        try:
            run()
        except Exception:
            report("N", "driver failed: " + traceback.format_exc()[-1500:])
            return 1
    # What the run cost (this driver and the children it waited for): the parent cannot
    # count it, since the sandbox's init is not its child to wait for.
    used = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    frame({"event": "cpu", "s": sum(u.ru_utime + u.ru_stime for u in used)})
    return 0


if __name__ == "__main__":
    # everything was reported with os.write: the interpreter's orderly shutdown (every
    # module torn down) would only delay the end of the run
    os._exit(main(sys.argv))
