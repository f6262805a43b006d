"""Whether sandboxed code can be isolated from the OS here: the namespace probe (run
once per process, retried on a busy machine), the ``unshare`` command that makes the
namespaces, and the refusal where there are none unless the user opted in.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time

from conductor.errors import UsageError

logger = logging.getLogger("conductor")

#: Set this environment variable to ``off`` to make the isolation probe report that no
#: OS isolation is available (to test, or to see what a machine without it does).
ISOLATION_ENV = "CONDUCTOR_SANDBOX_ISOLATION"

#: The one sentence a code benchmark refuses with where no OS isolation is possible.
UNISOLATED_REFUSAL = (
    "running model-written code needs OS isolation (Linux user, network, mount and PID "
    "namespaces via `unshare`), which is unavailable here; enable unprivileged user "
    "namespaces, or pass --confirm-run-unsafe-code (train config: "
    "confirm_run_unsafe_code: true) to run it with only resource limits and an audit hook"
)

_PROBE: dict[str, str] = {}
_PROBE_LOCK = threading.Lock()


def _ns_cmd(mode: str) -> list[str]:
    cmd = ["unshare"]
    if mode == "userns":
        cmd += ["--user", "--map-root-user"]
    cmd += ["--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc"]
    return [*cmd, "--propagation", "private", "--"]


def _probe(mode: str) -> bool:
    # Tried a few times: one failure on a busy machine must not turn the sandbox off
    # (or make every code benchmark refuse) for the whole life of the process.
    why = ""
    for attempt in range(3):
        try:
            done = subprocess.run(
                [*_ns_cmd(mode), "/bin/true"],
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            why = str(exc)
        else:
            if done.returncode == 0:
                return True
            why = done.stderr.decode("utf-8", "replace").strip()[:300]
        time.sleep(0.2 * (attempt + 1))
    logger.debug("sandbox: %s namespaces unavailable: %s", mode, why)
    return False


def isolation_mode() -> str:
    """How sandboxed code is isolated from the OS here, probed once.

    ``"root"``: namespaces created as root, code run under a fresh uid; ``"userns"``: an
    unprivileged user namespace (code runs as the user, without capabilities);
    ``"none"``: no namespaces (not Linux, no ``unshare``, user namespaces disabled, or
    ``CONDUCTOR_SANDBOX_ISOLATION=off``).
    """
    if os.environ.get(ISOLATION_ENV, "").strip().lower() in ("off", "none", "0", "false"):
        return "none"
    with _PROBE_LOCK:
        if "mode" not in _PROBE:
            mode = "none"
            if sys.platform.startswith("linux") and shutil.which("unshare"):
                if os.geteuid() == 0 and _probe("root"):
                    mode = "root"
                elif _probe("userns"):
                    mode = "userns"
            _PROBE["mode"] = mode
        return _PROBE["mode"]


def os_isolation_available() -> bool:
    """Whether namespaces (network, mount, PID; user when not root) can be used here."""
    return isolation_mode() != "none"


def require_isolation(confirm_run_unsafe_code: bool) -> bool:
    """True when OS isolation is available; False when it is not but the user opted in.

    Raises :class:`~conductor.errors.UsageError` (:data:`UNISOLATED_REFUSAL`) when it is
    not available and ``confirm_run_unsafe_code`` is false.
    """
    if os_isolation_available():
        return True
    if not confirm_run_unsafe_code:
        raise UsageError(UNISOLATED_REFUSAL)
    return False
