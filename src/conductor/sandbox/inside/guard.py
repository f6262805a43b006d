"""The audit-hook guard every process that runs model code installs (standard library
only; part of the sandbox's driver, :mod:`conductor.sandbox.inside`).

Kernel walls (seccomp, mounts, namespaces) hold whatever code runs; the guard holds
what a path or an object names, which the kernel cannot see: writes outside the work
directory, processes where none are allowed, signals to other processes, sockets and
name lookups where the run has no network of its own, ``ctypes`` and crafted code
objects from model code, ``marshal.loads`` of anything but a library's own ``.pyc``,
compiling under a library file's name, tracing and reading other threads' frames, and
setting the code of functions a judge relies on.
"""

from __future__ import annotations

import _thread
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # the driver's configuration: this file is assembled with it into one namespace
    from conductor.sandbox.inside.driver import CFG


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
    ``fd``.  ``judge`` is the thread id of a job's judge thread (the BigCodeBench
    driver's), the one thread that may read other threads' frames.  ``known``: ids of
    the functions whose code, defaults and globals may not be set (a judge's snapshot:
    the libraries' and the driver's); a function made later (a ``namedtuple`` a library
    defines lazily, the solution's own) is its maker's.

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
        _roots: tuple[str, ...] = library_roots(),
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

    roots = library_roots()
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


def library_roots() -> tuple[str, ...]:
    """Directories the interpreter loads libraries from (read-only in the sandbox; the
    work directory, where the solution may write, is never one of them)."""
    work = CFG["workdir"].rstrip("/") + "/"
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path}
    out = []
    for root in roots:
        if root and os.path.isabs(root) and not (root.rstrip("/") + "/").startswith(work):
            out.append(root.rstrip("/") + "/")
    return tuple(sorted(out))
