"""What one sandboxed run did: :class:`SandboxResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SandboxResult"]


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did.

    ``returncode`` is the program's exit status (negative: killed by that signal, as in
    :mod:`subprocess`); ``killed_by_signal`` names the signal; ``timed_out`` is set when
    the wall-clock limit killed the run.  ``stdout`` / ``stderr`` are decoded and capped
    (``*_truncated`` say whether the cap was hit).  ``blocked`` lists the operations the
    in-process guard refused, as ``"event: detail"``.  ``engine`` names the engine that
    ran it (``bubblewrap``, ``namespaces`` or ``none``); ``isolation`` names the layers
    in effect; ``notes`` says which could not be set up.
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
    frames: list[dict[str, Any]] = field(default_factory=list)
    engine: str = "none"
    #: Whether the run took a sandbox started ahead of its job (``run_job``'s ``warm``).
    started_ahead: bool = False

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0 within its limits."""
        return self.returncode == 0 and not self.timed_out
