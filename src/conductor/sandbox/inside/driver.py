"""The sandbox's driver: the first process inside every sandbox (standard library only).

:mod:`conductor.sandbox` runs the driver as ``python -I driver.py /proc/self/fd/N`` (its
configuration on an inherited memory file, closed once read) as the first process of
the sandbox (or as a plain subprocess where there is none).  The driver is one program
assembled from files (:mod:`conductor.sandbox.inside`): this one, the guard
(:mod:`~conductor.sandbox.inside.guard`), the ``program`` job
(:mod:`~conductor.sandbox.inside.program`) and the files of the caller's job driver, if
any (a grader's, which knows its benchmark: this file knows none).  They share one
namespace, so a job driver calls what is here by name (:func:`fork_child`,
:func:`wait_child`, :func:`install_guard`, ...), and a job of kind ``K`` is the
function ``job_K`` one of the files defines.

What it does, in order:

0. **Hardening** (bubblewrap), before anything else: every writable mount re-mounted
   ``noexec``, bubblewrap's init hidden from ``/proc``, every capability given up (as
   root, the run's fresh uid taken), ``no_new_privs``, not dumpable (:func:`harden`).
1. **Mounts** (the namespaces engine): every mount is re-mounted read-only except the
   run's work directory; the user's home directory (and, as root, any directory others
   cannot enter that holds the interpreter) is covered with an empty tmpfs, with only
   the interpreter's directories bound back; the control directory (config, report
   file) is covered too once it has been read.
2. **The preload** (trusted code of the parent's: what every job of a kind imports), run
   before the job is known, so that a sandbox started ahead waits with it loaded.
3. **The job**, read once from a pipe, run by the function its kind names (``job_K``).
   The driver is trusted code that never runs model code: a job forks a child for
   model code (:func:`fork_child`), waits for it (:func:`wait_child`), and after each
   test may kill everything the test left (:func:`swept`) and wait for the parent's
   word on whether to run the next (:func:`proceed`).

Each child, before model code runs: drops privileges (the namespaces engine: a fresh
uid as root; every capability, including the bounding set, inside a user namespace),
sets ``PR_SET_NO_NEW_PRIVS``, not dumpable and resource limits, closes the report fd,
installs the parent's seccomp filter for model code (:class:`_Filters`,
:mod:`conductor.sandbox._seccomp`) (:func:`enter_child`), and the job installs the
audit-hook guard (:func:`install_guard`).

Results reach the parent as lines in the report fd: ``B`` (an operation the guard
refused), ``N`` (a note), ``S`` (the ``program`` child's exit status), ``R`` (one JSON
result frame from a job; the last, ``{"event": "cpu", "s": ...}``, says how much CPU
time the driver and its children used).  Only the driver holds that fd.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

CFG: dict[str, Any] = {}
REPORT_FD = -1
# the job pipe, kept open for the parent's word after each test (:func:`proceed`)
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


# ----------------------------------------------------------------------- child control


def memfd(name: str, data: bytes = b"") -> int:
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


def read_fd(fd: int, limit: int) -> tuple[bytes, bool]:
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


def wait_child(pid: int, timeout: float) -> tuple[int | None, bool]:
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


def swept(keep: int = 0) -> bool:
    """After a test: nothing it started is left to see the next one (:func:`sweep`,
    where the run has a PID namespace of its own; elsewhere ``kill(-1)`` would reach
    the caller's other processes).  False (stop testing) where something survived."""
    if not CFG.get("own_pidns"):
        return True
    if sweep(keep):
        return True
    report("N", "a process of the last test survived being killed: no further tests run")
    return False


def status_json(status: int | None) -> dict[str, int]:
    if status is None:
        return {}
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"exit": os.WEXITSTATUS(status)}


def fork_child(body: Callable[[], int], cpu_s: int | None = None) -> int:
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


def compile_solution(source: str) -> Any:
    """Model code compiled (its tracebacks name the solution's file), or None after
    reporting a ``compile_error`` frame."""
    try:
        return compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError) as exc:
        frame({"event": "compile_error", "error": f"{type(exc).__name__}: {exc}"})
        return None


# ----------------------------------------------------------------------------- main


def _read_job(fd: int) -> dict[str, Any] | None:
    """The one job this driver runs: a line of JSON on pipe ``fd`` (the parent writes
    it at once).  None where the parent went away without sending one.  The pipe stays
    open: after each test of a job that waits for it, the parent's word comes on it
    (:func:`proceed`)."""
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


def proceed() -> bool:
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
    """Entry point inside the sandbox: ``driver.py CONFIG``."""
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

    # a job of kind K is the function job_K of the driver's files
    run = globals().get(f"job_{CFG['job'].get('kind')}")
    if not callable(run):
        report("N", f"driver failed: no job of kind {CFG['job'].get('kind')!r} here")
        return 1
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
