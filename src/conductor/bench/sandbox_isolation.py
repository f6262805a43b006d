"""Whether model-written code can be confined here, under its older name: the engine
choice is :mod:`conductor.sandbox` now; these are the names existing callers use."""

from __future__ import annotations

from conductor.sandbox import (
    BUBBLEWRAP,
    BUBBLEWRAP_MISSING,
    ISOLATION_ENV,
    NONE,
    default_engine,
    ns_mode,
    require_engine,
)

__all__ = [
    "ISOLATION_ENV",
    "UNISOLATED_REFUSAL",
    "isolation_mode",
    "os_isolation_available",
    "require_isolation",
]

#: The refusal where bubblewrap cannot run and the user did not opt in.
UNISOLATED_REFUSAL = BUBBLEWRAP_MISSING


def isolation_mode() -> str:
    """How the hand-made ``namespaces`` engine isolates here: ``root``, ``userns`` or
    ``none``."""
    return ns_mode()


def os_isolation_available() -> bool:
    """Whether runs get any OS isolation here (any engine but ``none``)."""
    return default_engine() != NONE


def require_isolation(confirm_run_unsafe_code: bool) -> bool:
    """True when code is graded under bubblewrap; False when the user opted in to a
    weaker engine; raises :class:`~conductor.errors.UsageError` otherwise
    (see :func:`conductor.sandbox.require_engine`)."""
    return require_engine(confirm_run_unsafe_code) == BUBBLEWRAP
