"""One sandboxed run, whatever the engine: the job and its files go in, the driver of
:mod:`conductor.sandbox.inside` runs it, and its report comes back as a
:class:`SandboxResult`."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._bwrap import SCRATCH, WORKDIR, BwrapPlan, bwrap_path, plan_bwrap
from ._engine import BUBBLEWRAP, NAMESPACES, NONE, default_engine
from ._launch import Launched, launch
from ._namespaces import fresh_uid, hidden_homes, ns_command, ns_mode, user_tasks, visible_dirs
from ._result import SandboxResult

__all__ = ["DEFAULT_OUTPUT_LIMIT", "run_job", "run_sandboxed"]

#: Default cap on captured stdout / stderr, in bytes.
DEFAULT_OUTPUT_LIMIT = 1_000_000
#: Default size of the bubblewrap sandbox's tmpfs (work dir, /tmp, /dev/shm), in MiB.
DEFAULT_DISK_MB = 256

_DRIVER = Path(__file__).resolve().parent / "inside.py"


def driver_bytecode(interpreter: str) -> bytes | None:
    """The driver compiled for ``interpreter`` (a ``.pyc`` file's bytes), or None where
    that interpreter is not this one (another version reads other bytecode).

    Why: Python compiles a script it is given on every start, and the driver's 1,900
    lines took 43 ms to compile: a third of a LiveCodeBench sample's grading time.
    """
    if os.path.realpath(interpreter) != os.path.realpath(sys.executable):
        return None
    return _compiled(_DRIVER.read_bytes())


@functools.lru_cache(maxsize=2)
def _compiled(source: bytes) -> bytes:
    import importlib.util
    import marshal

    code = compile(source, "/.sandbox/driver.py", "exec", dont_inherit=True)
    # PEP 552 header: magic, flags (1 = hash-based, not checked against a source), the
    # source's hash; a .pyc named on the command line is run after its 16-byte header.
    flags = (1).to_bytes(4, "little")
    header = importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source)
    return header + marshal.dumps(code)


_BASE_LAYERS = ["rlimits", "audit-hook", "minimal-env", "separate-judge", "bounded-output"]


def _signal_name(num: int) -> str:
    import signal

    try:
        return signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _child_env(work: str, tmp: str, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": work,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": tmp,
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMEXPR_MAX_THREADS": "1",
    }
    env.update(extra or {})
    return env


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
    engine: str | None = None,
    disk_mb: int = DEFAULT_DISK_MB,
) -> SandboxResult:
    """Run the Python program ``code`` in a fresh sandbox and wait for it.

    ``stdin`` is fed to the program; ``files`` (relative path -> text) are put in its
    working directory first; ``args`` become ``sys.argv[1:]``.  ``cpu_time_s`` /
    ``memory_mb`` / ``max_file_mb`` / ``max_processes`` become resource limits;
    ``wall_time_s`` is enforced from outside by killing every process of the run.
    ``engine`` is ``bubblewrap``, ``namespaces`` or ``none`` (default: see
    :func:`~conductor.sandbox.default_engine`); ``isolate=False`` means ``none``.
    ``disk_mb`` sizes bubblewrap's tmpfs.  ``env`` adds variables to the minimal
    environment (never the parent's).  ``python`` is the interpreter (default: this one).
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
        engine=engine,
        disk_mb=disk_mb,
    )


def _frame_limit(job: Mapping[str, Any], output_limit: int) -> int:
    """The longest report line kept: a frame carries a test's output and its value,
    each JSON-escaped (up to 6 bytes a byte: control bytes become ``\\u0000``)."""
    per_test = job.get("output_limit")
    biggest = max(int(output_limit), int(per_test) if isinstance(per_test, int) else 0)
    return 13 * biggest + (1 << 20)


def _launch_or_fail(argv: Sequence[str], **kw: Any) -> Launched:
    """:func:`launch`, or, where the sandbox cannot even start (bwrap or the interpreter
    missing, out of file descriptors), a run that ended without result saying why: a
    grader turns that into a ``grader_error`` verdict instead of failing the bench."""
    if not argv:
        # not launched: the fds meant for it are closed here (launch closes its own)
        report = kw.get("report")
        for fd in [*kw.get("pass_fds", ()), *([report[0]] if report is not None else [])]:
            with contextlib.suppress(OSError):
                os.close(fd)
        return Launched(None, False, "", "the sandbox failed to start", False, False, 0)
    try:
        return launch(argv, **kw)
    except OSError as exc:
        return Launched(None, False, "", f"the sandbox failed to start: {exc}", False, False, 0)


class _Report:
    """The driver's report lines, parsed as they arrive (see inside.py's doc)."""

    def __init__(self) -> None:
        self.blocked: list[str] = []
        self.notes: list[str] = []
        self.frames: list[dict[str, Any]] = []
        self.status: dict[str, int] | None = None
        self.mounted = False

    def line(self, raw: bytes) -> None:
        kind, _, text = raw.decode("utf-8", "replace").partition(" ")
        if kind == "B":
            if len(self.blocked) < 100:
                self.blocked.append(text)
        elif kind == "N":
            if len(self.notes) < 100:
                self.notes.append(text)
        elif kind == "L":
            self.mounted = True
        elif kind == "S":
            with contextlib.suppress(ValueError):
                value = json.loads(text)
                self.status = value if isinstance(value, dict) else None
        elif kind == "R":
            with contextlib.suppress(ValueError, RecursionError):
                value = json.loads(text)
                if isinstance(value, dict):
                    self.frames.append(value)


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
    engine: str | None = None,
    disk_mb: int = DEFAULT_DISK_MB,
) -> SandboxResult:
    """Run one driver job of :mod:`conductor.sandbox.inside` in a fresh sandbox.

    ``job["kind"]`` is ``program``, ``lcb`` or ``bcb`` (the job's own fields are listed
    there).  The job reaches the driver on a pipe-like memory file it closes once read;
    its result frames come back in :attr:`SandboxResult.frames`, at most
    ``report_limit`` bytes of them (a frame too long for :func:`_frame_limit` is
    dropped as it streams, and a note says so).  Other arguments as for
    :func:`run_sandboxed` (CPU time and memory apply to each process the driver
    starts; ``wall_time_s`` to the whole run).
    """
    started = time.monotonic()
    chosen = NONE if not isolate else (engine or default_engine())
    if chosen not in (BUBBLEWRAP, NAMESPACES, NONE):
        raise ValueError(f"unknown sandbox engine {chosen!r}")
    interpreter = os.path.abspath(python or sys.executable)
    nproc: int | None = int(max_processes)
    uid: int | None = None
    run_uid: int | None = None
    bwrap: str | None = None
    mode = "none"
    root = os.geteuid() == 0
    notes: list[str] = []
    layers: list[str] = []
    cleanup: list[Path] = []
    fds: list[int] = []
    report_r, report_w = os.pipe()
    os.set_inheritable(report_w, False)
    stdin_fd = _memfd("stdin", (stdin or "").encode("utf-8"))
    cfg: dict[str, Any] = {
        "report_fd": report_w,
        "uid": None,
        "userns": False,
        "mount": False,
        "expose": [],
        "hide": [],
        "allow_subprocess": allow_subprocess,
        "args": list(job.get("args", [])),
        "job": dict(job),
    }
    try:
        if chosen == BUBBLEWRAP:
            bwrap = bwrap_path()
            if bwrap is None:
                raise OSError("bwrap is not installed")
            run_uid = fresh_uid() if root else None
            if not root:
                nproc = user_tasks(os.getuid()) + int(max_processes)
            work, tmp, cwd = WORKDIR, "/tmp", "/"
            cfg.update(workdir=work, control=SCRATCH)
        else:
            mode = ns_mode() if chosen == NAMESPACES else "none"
            if chosen == NAMESPACES and mode == "none":
                chosen = NONE
                notes.append("OS isolation (user/network/mount/PID namespaces) unavailable")
            control = Path(tempfile.mkdtemp(prefix="conductor-sbx-ctl-"))
            workdir = Path(os.path.realpath(tempfile.mkdtemp(prefix="conductor-sbx-")))
            cleanup += [control, workdir]
            for rel, text in (files or {}).items():
                target = (workdir / rel).resolve()
                if not str(target).startswith(str(workdir) + os.sep):
                    raise ValueError(f"sandbox file path escapes the work dir: {rel!r}")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
            (workdir / "tmp").mkdir(exist_ok=True)
            if mode == "root":
                uid = fresh_uid()
                for top, dirs, names in os.walk(workdir):
                    for name in [*dirs, *names]:
                        os.chown(os.path.join(top, name), uid, uid)
                os.chown(workdir, uid, uid)
                os.chmod(workdir, 0o700)
            elif mode == "userns" or not root:
                # RLIMIT_NPROC counts every thread of the real user, not just ours
                nproc = user_tasks(os.getuid()) + int(max_processes)
            else:
                nproc = None  # root ignores it anyway
            shutil.copyfile(_DRIVER, control / "inside.py")
            work, tmp, cwd = str(workdir), str(workdir / "tmp"), str(workdir)
            cfg.update(
                workdir=work,
                control=str(control),
                uid=uid,
                userns=mode == "userns",
                mount=mode != "none",
                expose=visible_dirs(interpreter),
                hide=hidden_homes() if mode != "none" else [],
            )
        cfg["limits"] = {
            "cpu": max(1, int(cpu_time_s + 0.999)),
            "as": int(memory_mb) * 1024 * 1024,
            "fsize": int(max_file_mb) * 1024 * 1024,
            "nproc": nproc,
            "nofile": 256,
        }
        config = json.dumps(cfg).encode("utf-8")
        if chosen == BUBBLEWRAP:
            try:
                bytecode = driver_bytecode(interpreter)
                plan = plan_bwrap(
                    bwrap=str(bwrap),  # set above with the engine
                    python=interpreter,
                    driver_source=_DRIVER.read_bytes() if bytecode is None else bytecode,
                    driver_is_bytecode=bytecode is not None,
                    config=config,
                    files=files or {},
                    disk_mb=disk_mb,
                    fresh_uid=run_uid,
                    inner_uid=run_uid if run_uid is not None else os.getuid(),
                )
            except OSError as exc:
                # launched as a command that fails the same way, so that the result
                # says why (a grader makes it a grader_error, not a crash of the bench)
                plan = BwrapPlan(argv=[])
                notes.append(f"the sandbox failed to start: {exc}")
            fds += plan.fds
            argv, notes = plan.argv, notes + plan.notes
            layers = [*plan.layers, *_BASE_LAYERS]
        else:
            config_fd = _memfd("config", config)
            fds.append(config_fd)
            argv = [
                interpreter,
                "-I",
                cfg["control"] + "/inside.py",
                f"/proc/self/fd/{config_fd}",
            ]
            layers = ["tempdir", *_BASE_LAYERS]
            if mode != "none":
                argv = [*ns_command(mode), *argv]
                ns_layers = ["netns", "mountns", "pidns"]
                ns_layers += ["uid-drop"] if mode == "root" else ["userns", "no-capabilities"]
                layers = [*ns_layers, *layers]
            else:
                layers.append("unisolated")
                notes.append("OS isolation unavailable or turned off")
        report = _Report()
        # from here the launcher owns (and closes) these fds, whatever happens
        passed, fds = [*fds, report_w], []
        reader, report_r, report_w = report_r, -1, -1
        done = _launch_or_fail(
            argv,
            env=_child_env(work, tmp, env),
            cwd=cwd,
            stdin_fd=stdin_fd,
            pass_fds=passed,
            report=(reader, report.line, _frame_limit(job, output_limit), int(report_limit)),
            output_limit=output_limit,
            wall_time_s=wall_time_s,
        )
        notes += report.notes
        if done.dropped_report_lines:
            notes.append(f"{done.dropped_report_lines} report lines over the limits dropped")
        if chosen == NAMESPACES:
            if report.mounted:
                layers.append("readonly-fs")
            else:
                layers.remove("mountns")
    finally:
        for fd in (*fds, stdin_fd, report_r, report_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        for path in cleanup:
            shutil.rmtree(path, ignore_errors=True)

    returncode: int | None
    killed: str | None = None
    status = report.status
    if done.timed_out:
        returncode, killed = None, "SIGKILL"
    elif status is not None and "signal" in status:
        returncode = -int(status["signal"])
        killed = _signal_name(int(status["signal"]))
    elif status is not None:
        returncode = int(status.get("exit", 0))
    else:
        # No child status (a driver job, or the launcher was killed / failed).
        returncode = done.returncode
        if returncode is not None and returncode < 0:
            killed = _signal_name(-returncode)
    return SandboxResult(
        returncode=returncode,
        stdout=done.stdout,
        stderr=done.stderr,
        timed_out=done.timed_out,
        killed_by_signal=killed,
        wall_s=time.monotonic() - started,
        blocked=report.blocked,
        isolation=layers,
        notes=notes,
        stdout_truncated=done.stdout_truncated,
        stderr_truncated=done.stderr_truncated,
        frames=report.frames,
        engine=chosen,
    )
