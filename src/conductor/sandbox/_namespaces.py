"""The hand-made engine (``namespaces``), kept only as a fallback the user opts in to:
``unshare`` namespaces, a read-only remount of the whole file system and an audit hook.

It is weaker than bubblewrap: the whole file system stays visible (read-only) except
home directories, so earlier runs' samples and data files can be read; path sockets
(AF_UNIX) of the host can be connected to; the work directory is on the host's disk;
memory-backed files are not limited.  As root the namespaces are made directly and the
code runs under a fresh uid; as anyone else an unprivileged user namespace holds them.
The mounts are done by the driver itself (``setup_mounts`` in
:mod:`conductor.sandbox.inside.driver`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import subprocess
import sys
import threading
import time

__all__ = ["hidden_homes", "ns_command", "ns_mode", "user_tasks", "visible_dirs"]

logger = logging.getLogger("conductor")

# Fresh uids are drawn from this range so that concurrent runs never share an
# RLIMIT_NPROC count with each other or with a real account.
UID_RANGE = (200_000, 900_000)

_PROBE: dict[str, str] = {}
_PROBE_LOCK = threading.Lock()
_TASKS: dict[int, tuple[float, int]] = {}


def fresh_uid() -> int:
    """A uid no account has, for one run."""
    return random.randint(*UID_RANGE)


def ns_command(mode: str) -> list[str]:
    """The ``unshare`` prefix for ``mode`` (``root`` or ``userns``)."""
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
                [*ns_command(mode), "/bin/true"],
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


def ns_mode() -> str:
    """How ``unshare`` isolates here, probed once: ``root`` (namespaces made as root,
    code under a fresh uid), ``userns`` (an unprivileged user namespace) or ``none``."""
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


def user_tasks(uid: int) -> int:
    """Threads the user runs now (RLIMIT_NPROC counts them all), cached briefly."""
    now = time.monotonic()
    hit = _TASKS.get(uid)
    if hit is not None and now - hit[0] < 2.0:
        return hit[1]
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Threads:"):
                        count += int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue
    _TASKS[uid] = (now, count)
    return count


def hidden_homes() -> list[str]:
    """Home directories to hide from sandboxed code (keys, config and history live there)."""
    out = set()
    with contextlib.suppress(KeyError, ImportError):
        import pwd

        out.add(pwd.getpwuid(os.getuid()).pw_dir)
    if os.environ.get("HOME"):
        out.add(os.environ["HOME"])
    if os.geteuid() == 0:
        out.add("/root")
    homes = {os.path.realpath(h) for h in out if h}
    return sorted(h for h in homes if h != "/" and os.path.isdir(h))


def visible_dirs(interpreter: str) -> list[str]:
    """Directories the sandboxed interpreter must be able to read (stdlib, packages)."""
    if os.path.realpath(interpreter) == os.path.realpath(sys.executable):
        paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, *sys.path}
    else:
        paths = {
            os.path.dirname(os.path.dirname(os.path.realpath(interpreter))),
            os.path.dirname(os.path.dirname(os.path.abspath(interpreter))),
        }
    out = {os.path.realpath(p) for p in paths if p and os.path.isdir(p)}
    return sorted(out)
