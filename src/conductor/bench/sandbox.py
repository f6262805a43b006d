"""Run untrusted Python code (model-written solutions) in a throw-away sandbox.

:func:`run_sandboxed` runs one Python program; :func:`run_job` runs one of the test
drivers of :mod:`conductor.bench.sandbox_inside` (the code grader's).  Either returns a
:class:`SandboxResult`.  Every run gets its own temporary working directory (deleted
afterwards), a minimal environment (the parent's environment is never passed on, in
any mode, so API keys stay out), resource limits, a wall-clock limit that kills the
whole process tree, and capped output.  Isolation is layered; what each layer does and
does not stop:

1. **OS layer**, for every user where Linux namespaces can be made
   (:func:`isolation_mode`): as root, ``unshare`` makes them directly and the code runs
   under a fresh uid; as anyone else, an *unprivileged user namespace*
   (``unshare --user --map-root-user``) holds the others and the code runs as the
   user with every capability dropped (bounding set included) and
   ``PR_SET_NO_NEW_PRIVS``.  The layers in effect are listed in
   :attr:`SandboxResult.isolation`, and the ones that could not be set up in
   :attr:`SandboxResult.notes`:

   * a new *network namespace*: only a down loopback device exists, so no connection
     to the host, 127.0.0.1 services or the internet can be made by any code, native
     or not;
   * a new *mount namespace* in which every mount is re-mounted read-only except the
     run's work directory; the user's home directory (and ``/root``) is covered with
     an empty tmpfs, with only the interpreter's own directories bound back (so
     Python works wherever it is installed, a venv under a private home included);
     the control directory (job, report file) is covered once the driver has read
     it; a fresh ``/proc`` shows only the sandbox's processes;
   * a new *PID namespace*: when its first process dies (or the wall limit kills it),
     the kernel kills every process left inside, so nothing can outlive the run, and
     no process outside can be seen or signalled;
   * without capabilities (fresh uid as root; dropped inside the user namespace) the
     code cannot undo the read-only mounts, and ``RLIMIT_NPROC`` caps its processes.

   Where no namespace can be made (not Linux, no ``unshare``, user namespaces
   disabled, or ``CONDUCTOR_SANDBOX_ISOLATION=off``), the run is a plain subprocess in
   its own session, only the layers below apply, ``isolation`` says ``unisolated``,
   and :func:`require_isolation` refuses unless the user opted in
   (``--confirm-run-unsafe-code``).

2. **Resource limits** (always, per child): ``RLIMIT_CPU``, ``RLIMIT_AS`` (memory),
   ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE`` = 0; plus the
   wall-clock limit enforced from outside with ``SIGKILL`` to the whole process group.

3. **In-process guard** (always): a ``sys.addaudithook`` hook, installed before the user
   code runs, turns these into ``PermissionError`` and records them in
   :attr:`SandboxResult.blocked`: opening a file for writing (or a directory at all)
   outside the work directory, and reading ``/proc/*/mem`` or ``/proc/*/environ``;
   removing, renaming, creating directories, chmod, chown, utime, truncate, (sym)links
   and xattrs outside it; creating non-``AF_UNIX`` sockets, connect/bind/sendto and DNS
   look-ups; ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.spawn*``,
   ``os.fork`` and ``subprocess.Popen`` (unless ``allow_subprocess``); signalling other
   processes; ``ctypes``; ``gc`` object walks, ``sys.settrace`` / ``setprofile`` /
   ``_current_frames``; replacing any function's code, defaults or globals.  It does
   **not** stop native code (a C extension, ``sqlite3``, or ``_posixsubprocess``
   called directly): that is what layer 1 is for.

4. **A separate judge** (always): the driver that runs the tests is a different process
   from the solution (each test runs in a fresh child it forks); only the driver holds
   the report channel, and the grader compares the results it brings back in the
   parent (see :mod:`conductor.bench.graders.code` for what that does and does not
   defend against).

Programs run under ``python -I`` (isolated mode: no ``PYTHON*`` variables, no user
site-packages).

Whether OS isolation is available here (probed once) and the ``unshare`` command that
makes the namespaces are :mod:`conductor.bench.sandbox_isolation`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor.bench.sandbox_isolation import (
    _ns_cmd,
    isolation_mode,
)

__all__ = [
    "SandboxResult",
    "run_job",
    "run_sandboxed",
]

logger = logging.getLogger("conductor")

#: Default cap on captured stdout / stderr, in bytes.
DEFAULT_OUTPUT_LIMIT = 1_000_000

# Fresh uids are drawn from this range so that concurrent runs never share an
# RLIMIT_NPROC count with each other or with a real account.
_UID_RANGE = (200_000, 900_000)


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did.

    ``returncode`` is the program's exit status (negative: killed by that signal, as in
    :mod:`subprocess`); ``killed_by_signal`` names the signal; ``timed_out`` is set when
    the wall-clock limit killed the run.  ``stdout`` / ``stderr`` are decoded and capped
    (``*_truncated`` say whether the cap was hit).  ``blocked`` lists the operations the
    in-process guard refused, as ``"event: detail"``.  ``isolation`` names the layers in
    effect; ``notes`` says which could not be set up.
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

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0 within its limits."""
        return self.returncode == 0 and not self.timed_out


_INSIDE = Path(__file__).with_name("sandbox_inside.py")
_WARNED = False
_TASKS: dict[int, tuple[float, int]] = {}


def _user_tasks(uid: int) -> int:
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


def _homes() -> list[str]:
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


def _expose_list(interpreter: str) -> list[str]:
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


def _wait_for(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether ``proc`` ended within ``timeout`` s.  Waits on a pidfd where there is one:
    ``Popen.wait(timeout)`` polls with sleeps of up to 50 ms, which would be most of a
    short run's cost."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    return bool(ready) or proc.poll() is not None


def _read_capped(path: Path, limit: int) -> tuple[str, bool]:
    try:
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
    except OSError:
        return "", False
    truncated = len(data) > limit
    return data[:limit].decode("utf-8", "replace"), truncated


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def run_sandboxed(
    code: str,
    *,
    stdin: str | None = None,
    args: Sequence[str] = (),
    files: Mapping[str, str] | None = None,
    cpu_time_s: float = 10.0,
    wall_time_s: float = 20.0,
    memory_mb: int = 1024,
    max_file_mb: int = 64,
    max_processes: int = 64,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    allow_subprocess: bool = False,
    isolate: bool = True,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
) -> SandboxResult:
    """Run the Python program ``code`` in a fresh sandbox and wait for it.

    ``stdin`` is fed to the program; ``files`` (relative path -> text) are written into
    its temporary working directory first; ``args`` become ``sys.argv[1:]``.
    ``cpu_time_s`` / ``memory_mb`` / ``max_file_mb`` / ``max_processes`` become resource
    limits; ``wall_time_s`` is enforced from outside by killing the process group.
    ``isolate=False`` skips the namespaces (layer 1) even where available.
    ``env`` adds variables to the minimal environment (never the parent's).
    ``python`` is the interpreter (default: the one running this code).
    """
    return run_job(
        {"kind": "program", "args": list(args)},
        files={**(files or {}), "main.py": code},
        stdin=stdin,
        cpu_time_s=cpu_time_s,
        wall_time_s=wall_time_s,
        memory_mb=memory_mb,
        max_file_mb=max_file_mb,
        max_processes=max_processes,
        output_limit=output_limit,
        allow_subprocess=allow_subprocess,
        isolate=isolate,
        python=python,
        env=env,
    )


def run_job(
    job: Mapping[str, Any],
    *,
    files: Mapping[str, str] | None = None,
    stdin: str | None = None,
    cpu_time_s: float = 10.0,
    wall_time_s: float = 20.0,
    memory_mb: int = 1024,
    max_file_mb: int = 64,
    max_processes: int = 64,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    report_limit: int = 64 * DEFAULT_OUTPUT_LIMIT,
    allow_subprocess: bool = False,
    isolate: bool = True,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
) -> SandboxResult:
    """Run one driver job of :mod:`conductor.bench.sandbox_inside` in a fresh sandbox.

    ``job["kind"]`` is ``program``, ``lcb`` or ``bcb`` (the job's own fields are listed
    there).  The job travels in the private control directory, which the sandboxed code
    cannot reach; its result frames come back in :attr:`SandboxResult.frames`.  Limits
    as for :func:`run_sandboxed` (CPU time and memory apply to each child the driver
    starts; ``wall_time_s`` to the whole run).
    """
    global _WARNED
    started = time.monotonic()
    interpreter = python or sys.executable
    mode = isolation_mode() if isolate else "none"
    notes: list[str] = []
    isolation = ["rlimits", "audit-hook", "tempdir", "minimal-env", "separate-judge"]
    if mode == "none":
        isolation.append("unisolated")
        if isolate:
            notes.append("OS isolation (user/network/mount/PID namespaces) unavailable")
            if not _WARNED:
                _WARNED = True
                logger.warning(
                    "sandbox: namespaces unavailable; running model code with resource "
                    "limits and the audit hook only"
                )

    control = Path(tempfile.mkdtemp(prefix="conductor-sbx-ctl-"))
    work = Path(os.path.realpath(tempfile.mkdtemp(prefix="conductor-sbx-")))
    try:
        for rel, text in (files or {}).items():
            target = (work / rel).resolve()
            if not str(target).startswith(str(work) + os.sep):
                raise ValueError(f"sandbox file path escapes the work dir: {rel!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        (work / "tmp").mkdir(exist_ok=True)
        uid: int | None = None
        nproc: int | None = int(max_processes)
        if mode == "root":
            uid = random.randint(*_UID_RANGE)
            for root, dirs, names in os.walk(work):
                for name in [*dirs, *names]:
                    os.chown(os.path.join(root, name), uid, uid)
            os.chown(work, uid, uid)
            os.chmod(work, 0o700)
        elif mode == "userns" or os.geteuid() != 0:
            # RLIMIT_NPROC counts every thread of the real user, not just ours
            nproc = _user_tasks(os.getuid()) + int(max_processes)
        else:
            nproc = None  # root ignores it anyway

        (control / "stdin").write_text(stdin or "", encoding="utf-8")
        report_fd = os.open(control / "report", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        cfg = {
            "workdir": str(work),
            "report_fd": report_fd,
            "uid": uid,
            "userns": mode == "userns",
            "mount": mode != "none",
            "control": str(control),
            "expose": _expose_list(interpreter),
            "hide": _homes() if mode != "none" else [],
            "allow_subprocess": allow_subprocess,
            "args": list(job.get("args", [])),
            "job": dict(job),
            "limits": {
                "cpu": max(1, int(cpu_time_s + 0.999)),
                "as": int(memory_mb) * 1024 * 1024,
                "fsize": int(max_file_mb) * 1024 * 1024,
                "nproc": nproc,
                "nofile": 256,
            },
        }
        shutil.copyfile(_INSIDE, control / "sandbox_inside.py")
        (control / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
        child_env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(work),
            "TMPDIR": str(work / "tmp"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": str(work / "tmp"),
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "NUMEXPR_MAX_THREADS": "1",
        }
        child_env.update(env or {})
        argv = [
            interpreter,
            "-I",
            str(control / "sandbox_inside.py"),
            str(control / "config.json"),
        ]
        if mode != "none":
            argv = [*_ns_cmd(mode), *argv]
            layers = ["netns", "mountns", "pidns"]
            layers += ["uid-drop"] if mode == "root" else ["userns", "no-capabilities"]
            isolation = [*layers, *isolation]

        timed_out = False
        with (
            (control / "stdin").open("rb") as fin,
            (control / "stdout").open("wb") as fout,
            (control / "stderr").open("wb") as ferr,
        ):
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=fin,
                    stdout=fout,
                    stderr=ferr,
                    env=child_env,
                    cwd=str(work),
                    start_new_session=True,
                    pass_fds=(report_fd,),
                    close_fds=True,
                )
            finally:
                os.close(report_fd)
            timed_out = not _wait_for(proc, max(0.1, wall_time_s))
            # Kill the whole group in every case: the run is over, nothing may linger.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        wall = time.monotonic() - started

        stdout, out_trunc = _read_capped(control / "stdout", output_limit)
        stderr, err_trunc = _read_capped(control / "stderr", output_limit)
        report_text, _ = _read_capped(control / "report", report_limit)
        blocked: list[str] = []
        frames: list[dict[str, Any]] = []
        status: dict[str, int] | None = None
        mounted = False
        for line in report_text.splitlines():
            kind, _, text = line.partition(" ")
            if kind == "B":
                if len(blocked) < 100:
                    blocked.append(text)
            elif kind == "N":
                notes.append(text)
            elif kind == "L":
                mounted = True
            elif kind == "S":
                with contextlib.suppress(ValueError):
                    value = json.loads(text)
                    status = value if isinstance(value, dict) else None
            elif kind == "R":
                with contextlib.suppress(ValueError, RecursionError):
                    value = json.loads(text)
                    if isinstance(value, dict):
                        frames.append(value)
        if mode != "none":
            if mounted:
                isolation.append("readonly-fs")
            else:
                isolation.remove("mountns")

        returncode: int | None
        killed: str | None = None
        if timed_out:
            returncode = None
            killed = "SIGKILL"
        elif status is not None and "signal" in status:
            returncode = -int(status["signal"])
            killed = _signal_name(int(status["signal"]))
        elif status is not None:
            returncode = int(status.get("exit", 0))
        else:
            # No child status (a driver job, or the launcher was killed / failed).
            returncode = proc.returncode
            if returncode is not None and returncode < 0:
                killed = _signal_name(-returncode)
        return SandboxResult(
            returncode=returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            killed_by_signal=killed,
            wall_s=wall,
            blocked=blocked,
            isolation=isolation,
            notes=notes,
            stdout_truncated=out_trunc,
            stderr_truncated=err_trunc,
            frames=frames,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(control, ignore_errors=True)
