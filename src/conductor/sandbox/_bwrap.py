"""The bubblewrap engine: the ``bwrap`` command line that confines one run.

Why bubblewrap (``bwrap``, 0.8.0 in Debian 12), of what can be installed here:

* **bubblewrap**: a small C program (Flatpak's sandbox, widely audited) that only builds
  namespaces and mounts from its arguments, works as root and, through unprivileged
  user namespaces, as any user, and starts in milliseconds.  It has no policy language,
  which suits a program that knows exactly what one run needs.
* **firejail** (in Debian): setuid root, with a long history of local privilege
  escalations, and built around desktop-application profiles.
* **nsjail**, **minijail**: good designs, not packaged in Debian; building them (and
  their protobuf / libnl dependencies) is a burden on every user.
* **gVisor** (``runsc``, in Debian): the strongest (a kernel in user space), but an OCI
  runtime that wants a bundle per run, needs root or careful rootless setup, does not
  work in every nested container, and costs ~100 ms or more a start.

What one run gets (each bind justified; nothing else of the host is there):

* namespaces: network (only the sandbox's own loopback, up, which a test's server on
  ``localhost`` may use: no host, no host's 127.0.0.1, no internet, and no abstract
  unix sockets of the host), PID (a fresh ``/proc``; every process dies with
  the first), IPC, UTS, cgroup; a user namespace for an ordinary user (no further one
  may be made inside: the seccomp filter); ``--new-session`` (no controlling terminal)
  and ``--die-with-parent``;
* bubblewrap's own init (PID 1, which kills everything when the caller dies) runs
  outside the seccomp filter and, for an ordinary user, as the run's uid and dumpable:
  its ``/proc/1`` (``mem``, ``fd``) is covered with an empty read-only tmpfs by the
  driver, and ``pidfd_getfd`` / ``ptrace`` / ``process_vm_*`` are refused (the driver
  as PID 1, ``--as-pid-1``, would not be killed when bubblewrap is: the kernel does
  not deliver the parent-death signal to a namespace's init here);
* ``/tmp`` ``noexec``: bubblewrap 0.8 cannot mount a tmpfs ``noexec``, so the driver is
  started holding ``CAP_SYS_ADMIN`` and ``CAP_SETPCAP`` (and, as root, ``CAP_SETUID`` /
  ``CAP_SETGID``; every other capability dropped), re-mounts every writable mount
  ``noexec,nosuid`` first thing, and then gives every capability up for good before
  it reads its job (see :func:`conductor.sandbox.inside.driver.harden`).  Bubblewrap's
  ``--disable-userns`` is not used because it moves the run into a nested user
  namespace, where that re-mount is not allowed;
* as root, no user namespace (it could only map root) but a fresh uid per run, taken by
  the driver with every capability and the bounding set dropped and ``no_new_privs``;
  so ``RLIMIT_NPROC`` counts this run alone and nothing it starts can signal or read a
  process or file of another user.  For an ordinary user, the user namespace makes
  ``RLIMIT_NPROC`` count only the processes inside it (the kernel counts per user
  namespace and uid);
* ``/usr`` read-only (the C library, the dynamic loader, tools a solution may start
  when subprocesses are allowed) and the host's ``/bin``, ``/lib*``, ``/sbin``
  symlinks into it; the interpreter's own directories and every directory on its
  ``sys.path``, read-only (:func:`~conductor.sandbox._paths.python_paths`: prefixes,
  standard library, site-packages, the user's site-packages, ``PYTHONPATH`` and
  ``.pth`` entries, but not this project's own source checkout, nor anything in a
  ``PYTHONPATH`` directory that Python cannot import);
* ``/etc``: only ``ld.so.cache`` (where the loader finds libraries), ``localtime``
  and ``alternatives`` (symlinks of tools in ``/usr/bin``), and a made-up ``passwd`` /
  ``group`` holding the sandbox's one user (libraries look their user up) and
  ``hosts`` naming its loopback (``localhost``, ``sandbox``);
* ``/dev``: ``null``, ``zero``, ``urandom`` and the ``fd``/``stdin``/``stdout``/
  ``stderr`` links on a read-only tmpfs (not ``--dev``, which adds ``tty``, ``ptmx``
  and ``pts``); ``/dev/shm`` is a link into ``/tmp``; the three nodes are ``noexec``
  too (a shared mapping of ``/dev/zero`` is memory that could be mapped twice);
* ``/tmp``: a fresh tmpfs of ``disk_mb`` (``--size``), holding the work directory
  ``/tmp/work``, ``/dev/shm`` and the driver's scratch files; everything else,
  ``/`` included, is read-only;
* the driver's source is a read-only copy; its job (tests, solution) comes on a pipe
  it closes once read; no host file descriptor other than stdin, the two output pipes
  and the report pipe is passed in;
* the seccomp filters of :mod:`conductor.sandbox._seccomp`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field

from ._paths import python_paths
from ._seccomp import seccomp_filter

__all__ = ["BwrapPlan", "WORKDIR", "bwrap_path", "namespace_flags", "plan_bwrap"]

#: Where the run's files are inside the sandbox.
WORKDIR = "/tmp/work"
#: The driver's scratch directory (its capture files, unlinked at once).
SCRATCH = "/tmp/.driver"
DRIVER = "/.sandbox/driver.py"
#: The driver as bytecode, where the sandbox's interpreter is the caller's own.
DRIVER_BYTECODE = "/.sandbox/driver.pyc"
_SHM = "/tmp/.shm"
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_ETC_DIRS = ("/etc/alternatives",)
_DEV = ("null", "zero", "urandom")


def bwrap_path() -> str | None:
    """The ``bwrap`` program, or None where it is not installed."""
    return shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin:/usr/sbin:/sbin")


# What the driver holds when it starts, and gives up before its job (see the doc):
# re-mounting needs CAP_SYS_ADMIN, emptying the bounding set CAP_SETPCAP, and as root
# taking the run's uid CAP_SETUID and CAP_SETGID.
_DRIVER_CAPS = ("CAP_SYS_ADMIN", "CAP_SETPCAP")
_ROOT_CAPS = ("CAP_SETUID", "CAP_SETGID")


def namespace_flags(root: bool) -> list[str]:
    """The namespaces and capabilities of a run (as root: no user namespace, every
    capability but the driver's dropped; otherwise a user namespace, where bubblewrap
    keeps only the capabilities it is asked for)."""
    caps: tuple[str, ...] = _DRIVER_CAPS
    if root:
        flags = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        flags += ["--unshare-cgroup-try", "--cap-drop", "ALL"]
        caps += _ROOT_CAPS
    else:
        flags = ["--unshare-all", "--unshare-user"]
    for cap in caps:
        flags += ["--cap-add", cap]
    return flags


# The sandbox's own places: a host path on or above one is never bound, nor one inside
# any but /tmp (a venv in /tmp is bound over the sandbox's tmpfs).
_OWN = ("/usr", "/tmp", WORKDIR, SCRATCH, _SHM, "/dev", "/proc", "/etc", "/.sandbox")


def _bindable(path: str) -> bool:
    """Whether host path ``path`` may be bound at the same place inside."""
    for own in _OWN:
        if own == path or own.startswith(path.rstrip("/") + "/"):
            return False
        if own != "/tmp" and path.startswith(own + "/"):
            return False
    return True


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@dataclass
class BwrapPlan:
    """A ready ``bwrap`` command: its argv, the fds it must inherit (closed by the
    launcher once it started) and notes on what could not be set up."""

    argv: list[str]
    fds: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    layers: list[str] = field(default_factory=list)


def plan_bwrap(
    *,
    bwrap: str,
    python: str,
    driver_source: bytes,
    config: bytes,
    files: Mapping[str, str],
    disk_mb: int,
    fresh_uid: int | None,
    inner_uid: int,
    driver_is_bytecode: bool = False,
    removed: frozenset[str] = frozenset(),
) -> BwrapPlan:
    """The ``bwrap`` command running ``driver_source`` on ``config`` (which it reads from
    a pipe named by its one argument) with ``files`` in :data:`WORKDIR`.

    ``driver_is_bytecode``: ``driver_source`` is a ``.pyc`` for ``python`` (see
    :func:`conductor.sandbox._driver.driver_bytecode`), run as such.

    ``fresh_uid`` (root only) is the uid the driver takes inside (it starts as root and
    drops to it, see :func:`conductor.sandbox.inside.driver.harden`); otherwise the run keeps
    the caller's uid (``inner_uid``) in a user namespace.  ``removed`` names walls left
    out (tests only, see :func:`conductor.sandbox.walls_removed`): ``bwrap-seccomp``
    (no ``--seccomp``).
    """
    plan = BwrapPlan(argv=[bwrap])
    a = plan.argv
    a += namespace_flags(root=fresh_uid is not None)
    if fresh_uid is None:
        plan.layers += ["userns", "no-capabilities"]
    else:
        plan.layers += ["uid-drop", "no-capabilities"]
    a += ["--new-session", "--die-with-parent", "--hostname", "sandbox"]
    plan.layers += ["netns", "pidns", "ipcns", "utsns", "mountns", "new-session"]

    # /tmp first: directories bound below it (a venv in /tmp) are mounted over it
    a += ["--perms", "1777", "--size", str(int(disk_mb) << 20), "--tmpfs", "/tmp"]
    a += ["--perms", "0777", "--dir", WORKDIR]
    a += ["--perms", "0777", "--dir", SCRATCH, "--perms", "1777", "--dir", _SHM]
    plan.layers += ["allowlist-fs", "tmpfs-workdir"]

    a += ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = "/" + top
        if os.path.islink(host):
            a += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            a += ["--ro-bind", host, host]
    bound = [p for p in python_paths(python).bind if _bindable(p)]
    # bwrap makes missing parents of a mount point 0700 (as root: owned by root), which
    # the run's uid could not pass through: make them first, open to all (read-only /)
    parents: set[str] = set()
    for path in bound:
        parent = os.path.dirname(path)
        while parent not in ("/", "/tmp"):
            parents.add(parent)
            parent = os.path.dirname(parent)
    for parent in sorted(parents):
        a += ["--perms", "0755", "--dir", parent]
    for path in bound:
        a += ["--ro-bind", path, path]

    a += ["--dir", "/etc"]
    for path in _ETC_FILES + _ETC_DIRS:
        a += ["--ro-bind-try", path, path]
    name = "sandbox"
    passwd = f"{name}:x:{inner_uid}:{inner_uid}:{name}:{WORKDIR}:/bin/sh\n".encode()
    group = f"{name}:x:{inner_uid}:\n".encode()
    # the sandbox's own names: a test's server on localhost resolves without a lookup
    # anywhere (its network namespace has nothing but the loopback)
    hosts = f"127.0.0.1 localhost\n::1 localhost ip6-localhost\n127.0.1.1 {name}\n".encode()
    for dest, data in (("/etc/passwd", passwd), ("/etc/group", group), ("/etc/hosts", hosts)):
        fd = _memfd(dest, data)
        plan.fds.append(fd)
        a += ["--perms", "0644", "--ro-bind-data", str(fd), dest]

    a += ["--tmpfs", "/dev"]
    for node in _DEV:
        a += ["--dev-bind", f"/dev/{node}", f"/dev/{node}"]
    for link, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("shm", _SHM),
    ):
        a += ["--symlink", target, f"/dev/{link}"]
    a += ["--remount-ro", "/dev", "--proc", "/proc"]

    driver = DRIVER_BYTECODE if driver_is_bytecode else DRIVER
    fd = _memfd("driver", driver_source)
    plan.fds.append(fd)
    a += ["--dir", "/.sandbox", "--perms", "0444", "--ro-bind-data", str(fd), driver]
    for rel, text in files.items():
        dest = os.path.normpath(os.path.join(WORKDIR, rel))
        if not dest.startswith(WORKDIR + "/"):
            raise ValueError(f"sandbox file path escapes the work dir: {rel!r}")
        # every directory between the work dir and the file, open to the run's uid
        between: list[str] = []
        parent = os.path.dirname(dest)
        while parent != WORKDIR:
            between.insert(0, parent)
            parent = os.path.dirname(parent)
        for path in between:
            a += ["--perms", "0777", "--dir", path]
        fd = _memfd("file", text.encode("utf-8"))
        plan.fds.append(fd)
        a += ["--perms", "0666", "--file", str(fd), dest]

    program = seccomp_filter()
    if program is None:
        plan.notes.append("no seccomp filter for this machine's architecture")
    elif "bwrap-seccomp" not in removed:
        fd = _memfd("seccomp", program)
        plan.fds.append(fd)
        a += ["--seccomp", str(fd)]
        plan.layers.append("seccomp")
    a += ["--remount-ro", "/", "--chdir", WORKDIR, "--"]

    config_fd = _memfd("config", config)
    plan.fds.append(config_fd)
    if "noexec" not in removed:
        plan.layers.append("noexec-tmp")
    a += [python, "-I", driver, f"/proc/self/fd/{config_fd}"]
    return plan
