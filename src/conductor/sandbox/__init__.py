"""Run untrusted Python code (model-written solutions) in a throw-away sandbox.

:func:`run_sandboxed` runs one Python program; :func:`run_job` runs one job of the
sandbox's driver (:mod:`conductor.sandbox.inside`), of a kind the caller's
:class:`JobDriver` brings (the code grader's test drivers, in
:mod:`conductor.grading.drivers`: the sandbox knows no benchmark).  What a run may use
is one :class:`SandboxLimits`.  Either returns a :class:`SandboxResult`, whose
``engine`` names what confined the run:

* ``bubblewrap`` (the default; see :mod:`conductor.sandbox._bwrap` for what a run
  sees, and why bubblewrap rather than firejail, nsjail, minijail or gVisor): every
  namespace, an allow-list file system (``/usr`` and the interpreter's ``sys.path``,
  read-only), a size-limited ``noexec`` tmpfs as the only writable place, a ``/dev`` of
  three nodes, no terminal, seccomp filters, a fresh uid as root;
* ``namespaces``: the hand-made ``unshare`` engine of earlier versions
  (:mod:`conductor.sandbox._namespaces`), a fallback only;
* ``none``: a plain subprocess.

In every engine: a minimal environment (the parent's is never passed on, so API keys
stay out), resource limits per process (``RLIMIT_CPU``, ``RLIMIT_AS``,
``RLIMIT_FSIZE``, ``RLIMIT_NPROC``, ``RLIMIT_NOFILE``, no core files), an in-process
audit hook (``blocked`` lists what it refused), a test driver that is a separate
process from the solution, a wall-clock limit after which every process of the run is
killed, and output read through bounded pipes (:mod:`conductor.sandbox._launch`).

**Kernel walls** (issue 37), which hold whatever the code runs, native code and
processes without the audit hook included:

* no native code: the only writable mounts are ``noexec`` (what the code writes can
  neither be executed nor mapped executable), and each process that runs model code
  has a seccomp filter (:mod:`conductor.sandbox._seccomp`) refusing executable memory
  that is anonymous or writable, ``mprotect(PROT_EXEC)``, a ``personality`` that would
  add ``PROT_EXEC``, and making itself dumpable again (so ``/proc/self/mem`` stays
  closed to it); libraries still map their code from their read-only files;
* no hidden processes: with subprocesses not allowed, that filter refuses ``fork``,
  ``vfork``, ``clone`` of a process (threads still start) and ``execve``, whatever
  calls them (``_posixsubprocess.fork_exec`` has no audit event); no process may take
  another's fds (``pidfd_getfd``), compare them (``kcmp``), trace or read it;
* a job's verdict channel (the BigCodeBench driver's, where a judge thread writes a
  test's verdict) is a socket that only that thread may touch: every other thread of
  the test, and everything they start, runs under a filter refusing any system call on
  that fd, ``dup2`` onto it, ``close_range`` over it and ``sendmsg``; a socket cannot
  be opened again through ``/proc/self/fd`` (see :mod:`conductor.grading.drivers.bcb`);
* the audit hook also refuses every use of ``ctypes`` (each of its audit events),
  code objects not made by the compiler (``code.__new__``, ``code.replace``) and
  ``marshal.loads`` of anything but a library's own ``.pyc`` on a read-only mount.

What the kernel does not hold: a solution reading or writing its own process's memory
through an object with no audit event (``ctypes.c_char_p(address).value``, numpy's
``as_strided`` or ``__array_interface__``) can read the judge's nonce and, by writing
memory, make the judge thread itself write a pass: an in-process verdict cannot be
made safe against that, which is what differential grading
(:mod:`conductor.grading.code`) answers.  Tests take each wall down on purpose
(:func:`walls_removed`) to show the attack it stops working without it.

**Memory and processes**: no cgroup is used (a delegated cgroup v2 memory controller is
what would bound a sample's sum, and none was available to test here; where the cgroup
v1 hierarchy is writable by root it belongs to whoever runs the machine).  What bounds
one sample instead:

* each process: ``RLIMIT_AS`` (``memory_mb``) covers what it maps, heap and shared
  mappings included;
* with subprocesses not allowed (LiveCodeBench's default): a test is one process and
  its threads (the seccomp filter above), so ``memory_mb`` bounds what model code
  holds, beside the driver (trusted code) and a next test's child that has not started
  model code;
* with subprocesses allowed (BigCodeBench's default, as the official harness): at most
  ``max_processes`` tasks (``RLIMIT_NPROC``, threads included; as root the run's uid is
  fresh, and for an ordinary user the user namespace makes the kernel count only the
  tasks inside it) of ``memory_mb`` each: ``max_processes`` x ``memory_mb`` in all
  (the code grader's BigCodeBench defaults, 16 x 4,096 MB, bound nothing a machine
  would notice: pass smaller ``max_processes`` / ``memory_mb`` where that matters);
* files in memory: the tmpfs (``disk_mb``) is the only writable file system, and it
  holds ``/tmp``, the work directory and ``/dev/shm``; ``memfd_create``, SysV
  ``shmget`` and new namespaces (which could mount another tmpfs) are refused by
  seccomp;
* not covered: kernel memory (pipe buffers, sockets between the run's own processes).

Which engine a code grader uses, and the refusal to use a weaker one without the
user's opt-in, are :mod:`conductor.sandbox._engine` (switch: ``CONDUCTOR_SANDBOX_ISOLATION``).
"""

from __future__ import annotations

from ._driver import JobDriver
from ._engine import (
    BUBBLEWRAP,
    BUBBLEWRAP_MISSING,
    ENGINES,
    ISOLATION_ENV,
    NAMESPACES,
    NONE,
    bubblewrap_available,
    default_engine,
    requested_engine,
    require_engine,
    weaker_refusal,
)
from ._limits import DEFAULT_DISK_MB, DEFAULT_LIMITS, DEFAULT_OUTPUT_LIMIT, SandboxLimits
from ._namespaces import ns_mode
from ._paths import PythonPaths, missing_module, python_paths
from ._result import SandboxResult
from ._run import run_job, run_sandboxed
from ._walls import WALLS, walls_removed

__all__ = [
    "BUBBLEWRAP",
    "BUBBLEWRAP_MISSING",
    "DEFAULT_DISK_MB",
    "DEFAULT_LIMITS",
    "DEFAULT_OUTPUT_LIMIT",
    "ENGINES",
    "ISOLATION_ENV",
    "JobDriver",
    "NAMESPACES",
    "NONE",
    "PythonPaths",
    "SandboxLimits",
    "SandboxResult",
    "WALLS",
    "bubblewrap_available",
    "default_engine",
    "missing_module",
    "ns_mode",
    "python_paths",
    "requested_engine",
    "require_engine",
    "run_job",
    "run_sandboxed",
    "walls_removed",
    "weaker_refusal",
]
