"""The walls of a sandboxed run that a test may take down one by one, to show that an
attack stopped by a wall works without it (a test that cannot fail is not a test).

:func:`walls_removed` is for tests only: nothing in conductor calls it, it is not an
option of any command or config file, and what runs inside a sandbox cannot reach it
(it is the parent process's state).  A run made with a wall removed says so in its
notes and leaves the wall's name out of :attr:`SandboxResult.isolation`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["WALLS", "removed_walls", "walls_removed"]

#: Each wall a test may remove, and what it is.
WALLS: dict[str, str] = {
    "noexec": "the run's writable mounts are noexec (bubblewrap's /tmp and device nodes, "
    "the namespaces engine's work dir)",
    "bwrap-seccomp": "the seccomp filter every process of a bubblewrap sandbox runs under",
    "child-seccomp": "the seccomp filter of each process that runs model code",
    "verdict-seccomp": "the seccomp filter that keeps a judged test's threads off its "
    "judge's verdict channel",
    "verdict-socket": "a judged test's verdict channel is a socket (a pipe without it: "
    "/proc/self/fd can open a pipe again)",
    "dumpable": "processes that run model code are not dumpable",
    "proc1-hidden": "bubblewrap's init (PID 1) is hidden from /proc",
    "guard": "the audit hook in each process that runs model code",
}

_REMOVED: ContextVar[frozenset[str]] = ContextVar("conductor_sandbox_walls", default=frozenset())


def removed_walls() -> frozenset[str]:
    """The walls :func:`walls_removed` took down for runs started here now."""
    return _REMOVED.get()


@contextmanager
def walls_removed(*names: str) -> Iterator[None]:
    """Runs started in this context (this thread or task) lack the walls ``names``
    (:data:`WALLS`).  **Tests only**: a positive control shows an attack succeeding
    without the wall that stops it."""
    unknown = sorted(set(names) - set(WALLS))
    if unknown:
        raise ValueError(f"unknown sandbox walls: {', '.join(unknown)}")
    token = _REMOVED.set(_REMOVED.get() | frozenset(names))
    try:
        yield
    finally:
        _REMOVED.reset(token)
