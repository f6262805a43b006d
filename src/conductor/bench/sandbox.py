"""Run untrusted Python code (model-written solutions) in a throw-away sandbox.

:func:`run_sandboxed` runs one Python program in a fresh subprocess and returns a
:class:`SandboxResult`.  Every run gets its own temporary working directory (deleted
afterwards), a minimal environment (the parent's environment is never passed on, so API
keys stay out), resource limits, a wall-clock limit that kills the whole process tree,
and capped output.  Isolation is layered; what each layer does and does not stop:

1. **OS layer** (used when the ``unshare`` tool works, i.e. we are root on Linux; the
   layers in effect are listed in :attr:`SandboxResult.isolation`, and the ones that
   could not be set up in :attr:`SandboxResult.notes`):

   * a new *network namespace*: only a down loopback device exists, so no connection
     to the host, 127.0.0.1 services or the internet can be made by any code, native
     or not;
   * a new *mount namespace* in which every mount is re-mounted read-only except the
     run's temporary directory (bind-mounted read-write); a fresh ``/proc`` for
     the new PID namespace is mounted too;
   * a new *PID namespace*: when its first process dies (or the wall limit kills it),
     the kernel kills every process left inside, so nothing can outlive the run;
   * the code runs under a fresh unprivileged uid/gid (no capabilities), so it cannot
     undo the read-only mounts, read root-only files (``/proc/PID/environ`` of other
     processes included) or signal other users' processes, and ``RLIMIT_NPROC``
     (which root ignores) really caps the number of processes and threads.

   Without these (not root, no ``unshare``), the run falls back to a plain subprocess in
   its own session and only the layers below apply; a warning is logged once.

2. **Resource limits** (always): ``RLIMIT_CPU``, ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE``,
   ``RLIMIT_NPROC``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE`` = 0; plus the wall-clock
   limit enforced from outside with ``SIGKILL`` to the whole process group.

3. **In-process guard** (always): a ``sys.addaudithook`` hook, installed before the user
   code runs, turns these into ``PermissionError`` and records them in
   :attr:`SandboxResult.blocked`: opening a file for writing (or a directory at all)
   outside the temporary directory; removing, renaming, creating directories, chmod,
   chown, utime, truncate, (sym)links and xattrs outside it; creating non-``AF_UNIX``
   sockets, connect/bind/sendto and DNS look-ups; ``os.system``, ``os.exec*``,
   ``os.posix_spawn``, ``os.spawn*``, ``os.fork`` and ``subprocess.Popen`` (unless
   ``allow_subprocess``); signalling other processes; ``ctypes`` symbol look-ups,
   raw-memory objects and foreign calls; and the usual ways of reaching or patching the
   hook itself (``gc`` object walks, replacing a function's code or defaults).
   Audit hooks cannot be removed from Python code, so for *pure Python* code this is a
   real barrier.  It does **not** stop native code (a C extension or anything that
   escapes through a hole in CPython's audit coverage, e.g. ``_posixsubprocess``
   called directly), and it is not a defence against code that attacks the grading
   harness running in the same interpreter; that is what layer 1 is for.

Only Python programs are run: the program is written to ``main.py`` in the temporary
directory and executed as ``__main__`` by a small launcher under ``python -I``
(isolated mode: no ``PYTHON*`` variables, no user site-packages).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "SandboxResult",
    "os_isolation_available",
    "run_sandboxed",
]

logger = logging.getLogger("conductor")

#: Default cap on captured stdout / stderr, in bytes.
DEFAULT_OUTPUT_LIMIT = 1_000_000

# Fresh uids are drawn from this range so that concurrent runs never share an
# RLIMIT_NPROC count with each other or with a real account.
_UID_RANGE = (200_000, 900_000)


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did.

    ``returncode`` is the program's exit status (negative: killed by that signal, as in
    :mod:`subprocess`); ``killed_by_signal`` names the signal; ``timed_out`` is set when
    the wall-clock limit killed the run.  ``stdout`` / ``stderr`` are decoded and capped
    (``*_truncated`` say whether the cap was hit).  ``blocked`` lists the operations the
    in-process guard refused, as ``"event: detail"``.  ``isolation`` names the layers in
    effect; ``notes`` says which could not be set up.
    """

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    killed_by_signal: str | None
    wall_s: float
    blocked: list[str] = field(default_factory=list)
    isolation: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0 within its limits."""
        return self.returncode == 0 and not self.timed_out


# ---------------------------------------------------------------------------------------
# The launcher runs inside the sandbox.  It is plain source text so that it can be run
# by any interpreter with `python -I launcher.py config.json`.  As the first process of
# the new namespaces it sets up the mounts, then forks: the child drops privileges, sets
# limits, installs the guard and runs the program; the parent reaps and reports status.
_LAUNCHER = r'''
import json, os, sys

CFG = json.load(open(sys.argv[1]))
REPORT_FD = CFG["report_fd"]
WORK = CFG["workdir"]


def report(kind, text):
    try:
        os.write(REPORT_FD, (kind + " " + text.replace("\n", " ") + "\n").encode())
    except OSError:
        pass


def _unescape(s):
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) + 1 and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _blocking_ancestor(path):
    # the first directory on the way to `path` that others cannot traverse
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


def expose_paths(mount, bind_flags, move_flag):
    """Make the interpreter's own directories readable after the uid drop.

    A directory others cannot enter (e.g. /root holding a pyenv) is covered with an
    empty tmpfs, and only the needed subtrees are bound back into it, so the rest of it
    stays hidden from the sandboxed code."""
    plan = {}
    for path in CFG["expose"]:
        anc = _blocking_ancestor(path)
        if anc is not None and os.path.isdir(path):
            plan.setdefault(anc, []).append(path)
    for anc, paths in plan.items():
        # drop paths nested in another path of the same plan
        paths = sorted(set(paths))
        keep = [p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths)]
        staged = []
        for i, path in enumerate(keep):
            stage = os.path.join(CFG["control"], "stage%d_%d" % (len(staged), i))
            os.mkdir(stage)
            mount(path.encode(), stage.encode(), None, bind_flags)
            staged.append((stage, path))
        mount(b"tmpfs", anc.encode(), b"tmpfs", 0)
        os.chmod(anc, 0o755)
        for stage, path in staged:
            os.makedirs(path, mode=0o755, exist_ok=True)
            mount(stage.encode(), path.encode(), None, move_flag)
        report("N", "hid %s, exposing %s" % (anc, ", ".join(keep)))


def setup_mounts():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
    MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
    MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21

    def mount(src, tgt, fstype, flags):
        if libc.mount(src, tgt, fstype, flags, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), tgt)

    mount(b"none", b"/", None, MS_REC | MS_PRIVATE)
    work = WORK.encode()
    mount(work, work, None, MS_BIND | MS_REC)
    expose_paths(mount, MS_BIND | MS_REC, 8192)
    failed = []
    with open("/proc/self/mountinfo") as fh:
        rows = [line.split() for line in fh]
    for row in rows:
        point = _unescape(row[4])
        if point == WORK or point.startswith(WORK + "/"):
            continue
        opts = row[5].split(",")
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for name, bit in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC),
                          ("noatime", MS_NOATIME), ("nodiratime", MS_NODIRATIME),
                          ("relatime", MS_RELATIME)):
            if name in opts:
                flags |= bit
        try:
            mount(None, point.encode(), None, flags)
        except OSError as exc:
            if point == "/":
                raise
            failed.append(point + " (" + exc.strerror + ")")
    report("L", "mount-ro")
    if failed:
        report("N", "could not make read-only: " + ", ".join(failed))


def set_limits():
    import resource
    lim = CFG["limits"]
    pairs = [
        (resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1)),
        (resource.RLIMIT_AS, (lim["as"], lim["as"])),
        (resource.RLIMIT_FSIZE, (lim["fsize"], lim["fsize"])),
        (resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"])),
        (resource.RLIMIT_NOFILE, (lim["nofile"], lim["nofile"])),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    for res, value in pairs:
        try:
            resource.setrlimit(res, value)
        except (ValueError, OSError) as exc:
            report("N", "rlimit %s not set: %s" % (res, exc))


def run_child():
    os.chdir(WORK)
    uid = CFG.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    set_limits()
    os.umask(0o077)
    main_path = os.path.join(WORK, "main.py")
    with open(main_path, "rb") as fh:
        source = fh.read()
    guard = CFG["guard_source"]
    code = compile(source, main_path, "exec")
    sys.argv = [main_path] + CFG["args"]
    sys.path.insert(0, WORK)
    import types
    module = types.ModuleType("__main__")
    module.__file__ = main_path
    module.__builtins__ = __builtins__
    namespace = {}
    exec(guard, namespace)
    namespace["install"](WORK, CFG["allow_subprocess"], REPORT_FD)
    del namespace
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


if CFG["mount_ro"]:
    try:
        setup_mounts()
    except Exception as exc:
        report("N", "read-only mounts unavailable: %r" % (exc,))

pid = os.fork()
if pid == 0:
    status = 0
    try:
        run_child()
    except SystemExit as exc:
        code = exc.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code & 0xFF
        else:
            print(code, file=sys.stderr)
            status = 1
    except BaseException:
        import traceback
        traceback.print_exc()
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(status)

while True:
    try:
        done, wstatus = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    except InterruptedError:
        continue
    if done == pid:
        if os.WIFSIGNALED(wstatus):
            report("S", json.dumps({"signal": os.WTERMSIG(wstatus)}))
        else:
            report("S", json.dumps({"exit": os.WEXITSTATUS(wstatus)}))
        break
os._exit(0)
'''

# The guard is compiled and run by the launcher in a throw-away namespace; `install`
# registers the audit hook.  Everything the hook needs is bound as a default argument
# (builtins captured now, so patching `os` later changes nothing) and the hook only
# uses str/bytes methods otherwise, so user code has no state of the hook to modify.
_GUARD = r"""
def install(WORK, ALLOW_SUBPROCESS, REPORT_FD):
    import os, sys

    PROC_EVENTS = frozenset({
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
        "subprocess.Popen", "pty.spawn",
    })
    PATH_EVENTS = {
        # event -> indices of (path, dir_fd) pairs in its arguments
        "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
        "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.utime": ((0, 4),),
        "os.truncate": ((0, None),), "os.mkfifo": ((0, 2),), "os.mknod": ((0, 3),),
        "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)),
        "os.symlink": ((1, 2),), "os.setxattr": ((0, None),),
        "os.removexattr": ((0, None),), "shutil.rmtree": ((0, 1),),
        "os.chflags": ((0, None),), "os.lchflags": ((0, None),),
    }
    DNS_EVENTS = frozenset({
        "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
        "socket.gethostbyname_ex", "socket.getnameinfo",
    })
    CTYPES_EVENTS = frozenset({
        "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.call_function",
        "ctypes.string_at", "ctypes.wstring_at", "ctypes.set_errno",
    })
    GC_EVENTS = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents"})
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    FUNC_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__", "__globals__"})

    def hook(event, args, _W=WORK, _WS=WORK + "/", _cwd=os.getcwd, _write=os.write,
             _readlink=os.readlink, _stat=os.stat, _isdir_mode=0o040000, _fd=REPORT_FD,
             _pid=os.getpid(), _proc=PROC_EVENTS, _paths=PATH_EVENTS, _dns=DNS_EVENTS,
             _ct=CTYPES_EVENTS, _gc=GC_EVENTS, _wflags=WRITE_FLAGS, _allow=ALLOW_SUBPROCESS,
             _fattrs=FUNC_ATTRS, _str=str, _bytes=bytes, _int=int, _isinst=isinstance,
             _PE=PermissionError, _OE=OSError, _me=[]):

        def refuse(detail):
            try:
                _write(_fd, ("B " + event + ": " + detail.replace("\n", " ")[:300]
                             + "\n").encode("utf-8", "replace"))
            except _OE:
                pass
            raise _PE("sandbox: " + event + " not allowed (" + detail[:200] + ")")

        def resolve(path, dir_fd=None):
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
                    except _OE:
                        return None
                else:
                    base = _cwd()
                path = base + "/" + path
            parts = []
            for part in path.split("/"):
                if part == "" or part == ".":
                    continue
                if part == "..":
                    if parts:
                        parts.pop()
                    continue
                parts.append(part)
            return "/" + "/".join(parts)

        def inside(path, dir_fd=None):
            p = resolve(path, dir_fd)
            return p is not None and (p == _W or p.startswith(_WS))

        if event == "open":
            path = args[0]
            if _isinst(path, _int):
                return
            mode = args[1] if len(args) > 1 else None
            flags = args[2] if len(args) > 2 else 0
            writing = False
            if _isinst(mode, _str):
                writing = ("w" in mode) or ("a" in mode) or ("x" in mode) or ("+" in mode)
            if _isinst(flags, _int) and flags & _wflags:
                writing = True
            if inside(path):
                return
            if writing:
                refuse("write to " + _str(path))
            # A directory handle outside could be used as dir_fd for a relative
            # write that would look like it is inside; refuse directory opens.
            target = resolve(path)
            try:
                is_dir = target is not None and (_stat(target).st_mode & 0o170000) == _isdir_mode
            except _OE:
                is_dir = False
            if is_dir:
                refuse("open directory " + _str(path))
            return
        spec = _paths.get(event)
        if spec is not None:
            for idx, fd_idx in spec:
                if idx >= len(args):
                    continue
                path = args[idx]
                if _isinst(path, _int):
                    if event in ("os.chmod", "os.chown", "os.truncate", "os.utime"):
                        continue  # an fd-based call on a file already opened
                    refuse(_str(path))
                dir_fd = args[fd_idx] if fd_idx is not None and fd_idx < len(args) else None
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
                    link = resolve(args[1], args[2] if len(args) > 2 else None) or "/"
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
            if len(args) > 1 and args[1] != 1 and args[1] != -1:  # 1 = AF_UNIX
                refuse("socket family " + _str(args[1]))
            return
        if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            if len(args) > 1 and not _isinst(args[1], (_str, _bytes)):
                refuse(_str(args[1]))
            return
        if event in _dns:
            refuse(_str(args[0]) if args else "")
        if event in _ct or event in _gc:
            refuse(_str(args[0])[:100] if args else "")
        if event == "object.__setattr__":
            if len(args) > 1 and (args[1] == "__code__" or (args[0] is _me[0]
                                                             and args[1] in _fattrs)):
                refuse("set " + _str(args[1]))
            return
        if event == "sys.addaudithook" or event == "cpython.remove_audit_hooks":
            return

    hook.__defaults__[-1].append(hook)
    sys.addaudithook(hook)
"""

_UNSHARE_CHECK: bool | None = None
_UNSHARE_LOCK = threading.Lock()
_WARNED = False


def _unshare_cmd() -> list[str]:
    return [
        "unshare",
        "--net",
        "--mount",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--propagation",
        "private",
        "--",
    ]


def os_isolation_available() -> bool:
    """Whether namespaces (network, mount, PID) can be used here; checked once."""
    global _UNSHARE_CHECK
    with _UNSHARE_LOCK:
        if _UNSHARE_CHECK is None:
            ok = False
            if sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("unshare"):
                try:
                    done = subprocess.run(
                        [*_unshare_cmd(), "/bin/true"],
                        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                        capture_output=True,
                        timeout=10,
                    )
                    ok = done.returncode == 0
                except (OSError, subprocess.SubprocessError):
                    ok = False
            _UNSHARE_CHECK = ok
        return _UNSHARE_CHECK


def _expose_list(interpreter: str) -> list[str]:
    """Directories the sandboxed interpreter must be able to read (stdlib, packages)."""
    if os.path.realpath(interpreter) == os.path.realpath(sys.executable):
        paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, *sys.path}
    else:
        paths = {os.path.dirname(os.path.dirname(os.path.realpath(interpreter)))}
    out = {os.path.realpath(p) for p in paths if p and os.path.isdir(p)}
    return sorted(out)


def _read_capped(path: Path, limit: int) -> tuple[str, bool]:
    try:
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
    except OSError:
        return "", False
    truncated = len(data) > limit
    return data[:limit].decode("utf-8", "replace"), truncated


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def run_sandboxed(
    code: str,
    *,
    stdin: str | None = None,
    args: Sequence[str] = (),
    files: Mapping[str, str] | None = None,
    cpu_time_s: float = 10.0,
    wall_time_s: float = 20.0,
    memory_mb: int = 1024,
    max_file_mb: int = 64,
    max_processes: int = 64,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    allow_subprocess: bool = False,
    isolate: bool = True,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
) -> SandboxResult:
    """Run the Python program ``code`` in a fresh sandbox and wait for it.

    ``stdin`` is fed to the program; ``files`` (relative path -> text) are written into
    its temporary working directory first; ``args`` become ``sys.argv[1:]``.
    ``cpu_time_s`` / ``memory_mb`` / ``max_file_mb`` / ``max_processes`` become resource
    limits; ``wall_time_s`` is enforced from outside by killing the process group.
    ``isolate=False`` skips the namespaces (layer 1) even where available.
    ``env`` adds variables to the minimal environment (never the parent's).
    ``python`` is the interpreter (default: the one running this code).
    """
    started = time.monotonic()
    interpreter = python or sys.executable
    use_ns = isolate and os_isolation_available()
    notes: list[str] = []
    isolation = ["rlimits", "audit-hook", "tempdir", "minimal-env"]
    global _WARNED
    if isolate and not use_ns:
        notes.append("OS isolation (network/mount/PID namespaces, uid drop) unavailable")
        if not _WARNED:
            _WARNED = True
            logger.warning(
                "sandbox: namespaces unavailable (needs root and unshare); running "
                "model code with resource limits and the audit hook only"
            )

    control = Path(tempfile.mkdtemp(prefix="conductor-sbx-ctl-"))
    work = Path(os.path.realpath(tempfile.mkdtemp(prefix="conductor-sbx-")))
    uid: int | None = None
    try:
        for rel, text in (files or {}).items():
            target = (work / rel).resolve()
            if not str(target).startswith(str(work) + os.sep):
                raise ValueError(f"sandbox file path escapes the work dir: {rel!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        (work / "main.py").write_text(code, encoding="utf-8")
        (work / "tmp").mkdir(exist_ok=True)
        if use_ns:
            uid = random.randint(*_UID_RANGE)
            for root, dirs, names in os.walk(work):
                for name in [*dirs, *names]:
                    os.chown(os.path.join(root, name), uid, uid)
            os.chown(work, uid, uid)
            os.chmod(work, 0o700)

        (control / "stdin").write_text(stdin or "", encoding="utf-8")
        report_fd = os.open(control / "report", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        cfg = {
            "workdir": str(work),
            "report_fd": report_fd,
            "args": list(args),
            "uid": uid,
            "mount_ro": use_ns,
            "control": str(control),
            "expose": _expose_list(interpreter),
            "allow_subprocess": allow_subprocess,
            "guard_source": _GUARD,
            "limits": {
                "cpu": max(1, int(cpu_time_s + 0.999)),
                "as": int(memory_mb) * 1024 * 1024,
                "fsize": int(max_file_mb) * 1024 * 1024,
                "nproc": int(max_processes),
                "nofile": 256,
            },
        }
        (control / "launcher.py").write_text(_LAUNCHER, encoding="utf-8")
        (control / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
        # The launcher reads these before it drops privileges: the control dir stays
        # private to us.
        child_env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(work),
            "TMPDIR": str(work / "tmp"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": str(work / "tmp"),
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "NUMEXPR_MAX_THREADS": "1",
        }
        child_env.update(env or {})
        argv = [interpreter, "-I", str(control / "launcher.py"), str(control / "config.json")]
        if use_ns:
            argv = [*_unshare_cmd(), *argv]
            isolation = ["netns", "mountns", "pidns", "uid-drop", *isolation]

        timed_out = False
        with (
            (control / "stdin").open("rb") as fin,
            (control / "stdout").open("wb") as fout,
            (control / "stderr").open("wb") as ferr,
        ):
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=fin,
                    stdout=fout,
                    stderr=ferr,
                    env=child_env,
                    cwd=str(work),
                    start_new_session=True,
                    pass_fds=(report_fd,),
                    close_fds=True,
                )
            finally:
                os.close(report_fd)
            try:
                proc.wait(timeout=max(0.1, wall_time_s))
            except subprocess.TimeoutExpired:
                timed_out = True
            # Kill the whole group in every case: the run is over, nothing may linger.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        wall = time.monotonic() - started

        stdout, out_trunc = _read_capped(control / "stdout", output_limit)
        stderr, err_trunc = _read_capped(control / "stderr", output_limit)
        report_text, _ = _read_capped(control / "report", 4 * output_limit)
        blocked: list[str] = []
        status: dict[str, int] | None = None
        for line in report_text.splitlines():
            kind, _, text = line.partition(" ")
            if kind == "B":
                if len(blocked) < 100:
                    blocked.append(text)
            elif kind == "N":
                notes.append(text)
            elif kind == "S":
                with contextlib.suppress(ValueError):
                    status = json.loads(text)
        if use_ns and not any(n.startswith("read-only mounts unavailable") for n in notes):
            isolation.append("readonly-fs")
        elif use_ns:
            isolation.remove("mountns")

        returncode: int | None
        killed: str | None = None
        if timed_out:
            returncode = None
            killed = "SIGKILL"
        elif status is not None and "signal" in status:
            returncode = -int(status["signal"])
            killed = _signal_name(int(status["signal"]))
        elif status is not None:
            returncode = int(status.get("exit", 0))
        else:
            # The launcher itself did not report: it was killed or failed to start.
            returncode = proc.returncode
            if returncode is not None and returncode < 0:
                killed = _signal_name(-returncode)
        return SandboxResult(
            returncode=returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            killed_by_signal=killed,
            wall_s=wall,
            blocked=blocked,
            isolation=isolation,
            notes=notes,
            stdout_truncated=out_trunc,
            stderr_truncated=err_trunc,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(control, ignore_errors=True)
