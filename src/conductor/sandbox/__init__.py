"""Run untrusted Python code (model-written solutions) in a throw-away sandbox.

:func:`run_sandboxed` runs one Python program; :func:`run_job` runs one of the test
drivers of :mod:`conductor.sandbox.inside` (the code grader's).  Either returns a
:class:`SandboxResult`, whose ``engine`` names what confined the run:

* ``bubblewrap`` (the default; see :mod:`conductor.sandbox._bwrap` for what a run
  sees, and why bubblewrap rather than firejail, nsjail, minijail or gVisor): every
  namespace, an allow-list file system (only ``/usr`` and the interpreter's own
  directories, read-only), a size-limited tmpfs as the only writable place, a
  ``/dev`` of three nodes, no terminal, a seccomp filter, a fresh uid as root;
* ``namespaces``: the hand-made ``unshare`` engine of earlier versions
  (:mod:`conductor.sandbox._namespaces`), a fallback only;
* ``none``: a plain subprocess.

In every engine: a minimal environment (the parent's is never passed on, so API keys
stay out), resource limits per process (``RLIMIT_CPU``, ``RLIMIT_AS``,
``RLIMIT_FSIZE``, ``RLIMIT_NPROC``, ``RLIMIT_NOFILE``, no core files), an in-process
audit hook (``blocked`` lists what it refused), a test driver that is a separate
process from the solution, a wall-clock limit after which every process of the run is
killed, and output read through bounded pipes (:mod:`conductor.sandbox._launch`).

**Memory**: no cgroup is used (none is delegated to us on most machines, and where
the cgroup v1 hierarchy is writable by root it belongs to whoever runs the machine).
What limits memory instead, and what it does not cover:

* each process: ``RLIMIT_AS`` (``memory_mb``) covers what it maps, heap and shared
  mappings included; a run may have up to ``max_processes`` such processes;
* files in memory: the tmpfs (``disk_mb``) is the only writable file system, and it
  holds ``/tmp``, the work directory and ``/dev/shm``; ``memfd_create``, SysV
  ``shmget`` and new namespaces (which could mount another tmpfs) are refused by
  seccomp;
* not covered: kernel memory (pipe buffers, sockets between the run's own processes)
  and the sum over processes, which a cgroup would bound.

Which engine a code grader uses, and the refusal to use a weaker one without the
user's opt-in, are :mod:`conductor.sandbox._engine` (switch: ``CONDUCTOR_SANDBOX_ISOLATION``).
"""

from __future__ import annotations

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
from ._namespaces import ns_mode
from ._paths import PythonPaths, missing_module, python_paths
from ._result import SandboxResult
from ._run import DEFAULT_DISK_MB, DEFAULT_OUTPUT_LIMIT, run_job, run_sandboxed
from ._walls import WALLS, walls_removed

__all__ = [
    "BUBBLEWRAP",
    "BUBBLEWRAP_MISSING",
    "DEFAULT_DISK_MB",
    "DEFAULT_OUTPUT_LIMIT",
    "ENGINES",
    "ISOLATION_ENV",
    "NAMESPACES",
    "NONE",
    "PythonPaths",
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
