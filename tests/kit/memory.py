"""A command's peak memory, measured: run it as the child of a small Python process that
reports the child's ``ru_maxrss`` (``RUSAGE_CHILDREN`` of a process with that one child
is the child's own peak), with an address-space limit so that a read that is not
bounded fails there instead of taking the machine's memory, and a timeout so that a
read that waits forever ends.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from kit.clock import scaled

__all__ = ["Peak", "peak"]

_WRAPPER = r"""
import json, resource, subprocess, sys
argv, limit, timeout = json.loads(sys.argv[1])
def cap():
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    done = subprocess.run(
        argv, capture_output=True, timeout=timeout, preexec_fn=cap, stdin=subprocess.DEVNULL
    )
    rc, err = done.returncode, done.stderr.decode("utf-8", "replace")
except subprocess.TimeoutExpired:
    rc, err = None, ""
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"rc": rc, "stderr": err, "peak_mb": peak}))
"""


@dataclass(frozen=True)
class Peak:
    """What came of one command: its exit status (None: it ran past the timeout and was
    killed), its standard error and its peak resident memory in MiB."""

    rc: int | None
    stderr: str
    peak_mb: float


def peak(argv: list[str], *, timeout: float = 120.0, limit_mb: int = 3072) -> Peak:
    """Run ``argv`` under an address-space limit of ``limit_mb`` (0: none) and return
    its :class:`Peak`.  ``timeout``: seconds on an idle core (:func:`kit.clock.scaled`)."""
    timeout = scaled(timeout)
    arg = json.dumps([argv, limit_mb << 20, timeout])
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, arg],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        check=True,
    )
    data = json.loads(done.stdout)
    return Peak(data["rc"], data["stderr"], data["peak_mb"])
