"""Which engine confines a run: the choice, the probe of bubblewrap, and the refusal to
grade code with anything weaker unless the user opted in.

The switch is :data:`ISOLATION_ENV` (``CONDUCTOR_SANDBOX_ISOLATION``):

* unset, ``bubblewrap`` or ``auto``: bubblewrap, the default and the only engine code
  benchmarks use without an opt-in;
* ``namespaces``: the hand-made ``unshare`` engine of earlier versions;
* ``off`` (or ``none``, ``0``, ``false``): no OS isolation at all, resource limits and
  the audit hook only.

Anything but bubblewrap, asked for or because bubblewrap is missing, needs the user's
opt-in (``--confirm-run-unsafe-code``; train config ``confirm_run_unsafe_code``): without
it :func:`require_engine` raises a :class:`~conductor.errors.UsageError` saying how to
install bubblewrap.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time

from ..errors import UsageError
from ._bwrap import bwrap_path, namespace_flags
from ._namespaces import ns_mode

__all__ = [
    "BUBBLEWRAP",
    "BUBBLEWRAP_MISSING",
    "ENGINES",
    "ISOLATION_ENV",
    "NAMESPACES",
    "NONE",
    "bubblewrap_available",
    "default_engine",
    "requested_engine",
    "require_engine",
    "weaker_refusal",
]

logger = logging.getLogger("conductor")

#: The environment variable that picks the engine (see the module docstring).
ISOLATION_ENV = "CONDUCTOR_SANDBOX_ISOLATION"
BUBBLEWRAP, NAMESPACES, NONE = "bubblewrap", "namespaces", "none"
#: The engines, strongest first.
ENGINES = (BUBBLEWRAP, NAMESPACES, NONE)

_OPT_IN = "--confirm-run-unsafe-code (train config: confirm_run_unsafe_code: true)"

#: The one sentence a code benchmark refuses with where bubblewrap cannot run.
BUBBLEWRAP_MISSING = (
    "running model-written code needs bubblewrap (`bwrap`), which is not installed or "
    "cannot make namespaces here: install it (Debian/Ubuntu: `apt-get install "
    "bubblewrap`; Fedora: `dnf install bubblewrap`; Arch: `pacman -S bubblewrap`), or "
    f"pass {_OPT_IN} to run it in a weaker sandbox (hand-made namespaces where they "
    "can be made, else only resource limits and an audit hook)"
)

_PROBE: dict[str, tuple[bool, str]] = {}
_LOCK = threading.Lock()
_WARNED: set[str] = set()


def weaker_refusal(engine: str) -> str:
    """The refusal when :data:`ISOLATION_ENV` asks for the weaker ``engine``."""
    what = {
        NAMESPACES: "the hand-made namespaces sandbox",
        NONE: "no OS isolation (resource limits and an audit hook only)",
    }[engine]
    return (
        f"{ISOLATION_ENV} asks for {what}, which is weaker than bubblewrap: running "
        f"model-written code that way needs {_OPT_IN}"
    )


def requested_engine() -> str:
    """The engine :data:`ISOLATION_ENV` asks for (bubblewrap when unset)."""
    value = os.environ.get(ISOLATION_ENV, "").strip().lower()
    if value in ("off", "none", "0", "false"):
        return NONE
    if value == NAMESPACES:
        return NAMESPACES
    return BUBBLEWRAP


def _probe_bwrap() -> tuple[bool, str]:
    bwrap = bwrap_path()
    if bwrap is None:
        return False, "bwrap is not installed"
    root = os.geteuid() == 0
    flags = namespace_flags(root)
    cmd = [bwrap, *flags, "--new-session", "--die-with-parent", "--ro-bind", "/usr", "/usr"]
    cmd += ["--size", str(1 << 20), "--tmpfs", "/tmp", "--proc", "/proc"]
    for top in ("bin", "lib", "lib64"):
        if os.path.islink("/" + top):
            cmd += ["--symlink", os.readlink("/" + top), "/" + top]
        elif os.path.isdir("/" + top):
            cmd += ["--ro-bind", "/" + top, "/" + top]
    why = ""
    # Tried a few times: one failure on a busy machine must not make every code
    # benchmark refuse for the whole life of the process.
    for attempt in range(3):
        try:
            done = subprocess.run(
                [*cmd, "--", "/usr/bin/true"],
                env={"PATH": "/usr/bin:/bin"},
                capture_output=True,
                timeout=30,
                close_fds=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            why = str(exc)
        else:
            if done.returncode == 0:
                return True, ""
            why = done.stderr.decode("utf-8", "replace").strip()[:300]
        time.sleep(0.2 * (attempt + 1))
    return False, why


def bubblewrap_available() -> tuple[bool, str]:
    """Whether bubblewrap can confine a run here (probed once), and why not."""
    with _LOCK:
        if "bwrap" not in _PROBE:
            _PROBE["bwrap"] = _probe_bwrap()
            if not _PROBE["bwrap"][0]:
                logger.debug("sandbox: bubblewrap unusable: %s", _PROBE["bwrap"][1])
        return _PROBE["bwrap"]


def _fallback() -> str:
    return NAMESPACES if ns_mode() != "none" else NONE


def default_engine() -> str:
    """The engine a run gets when its caller names none: what :data:`ISOLATION_ENV`
    asks for, and where that is bubblewrap but it cannot run, the best weaker one (with
    a warning, once).  Graders do not rely on this: they call :func:`require_engine`."""
    engine = requested_engine()
    if engine == BUBBLEWRAP and not bubblewrap_available()[0]:
        engine = _fallback()
        if engine not in _WARNED:
            _WARNED.add(engine)
            logger.warning(
                "sandbox: bubblewrap unavailable (%s); running code with the %s engine",
                bubblewrap_available()[1],
                engine,
            )
    elif engine == NAMESPACES and ns_mode() == "none":
        engine = NONE
    return engine


def require_engine(confirm_run_unsafe_code: bool) -> str:
    """The engine to grade model-written code with.

    Bubblewrap where it runs and is not overridden; another engine only with the
    user's opt-in, else a :class:`~conductor.errors.UsageError`
    (:data:`BUBBLEWRAP_MISSING`, or :func:`weaker_refusal`).
    """
    engine = requested_engine()
    if engine == BUBBLEWRAP:
        if bubblewrap_available()[0]:
            return BUBBLEWRAP
        if not confirm_run_unsafe_code:
            raise UsageError(BUBBLEWRAP_MISSING)
        return default_engine()
    if not confirm_run_unsafe_code:
        raise UsageError(weaker_refusal(engine))
    return default_engine()
