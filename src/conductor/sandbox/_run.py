"""One sandboxed run, whatever the engine: the job and its files go in, the sandbox's
driver (:mod:`conductor.sandbox.inside`, with the caller's job driver) runs it, and its
report comes back as a :class:`SandboxResult`."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._bwrap import SCRATCH, WORKDIR, BwrapPlan, bwrap_path, plan_bwrap
from ._driver import JobDriver, driver_bytecode, driver_source
from ._engine import BUBBLEWRAP, NAMESPACES, NONE, default_engine
from ._launch import Launched, Started, start
from ._limits import DEFAULT_LIMITS, SandboxLimits
from ._namespaces import fresh_uid, hidden_homes, ns_command, ns_mode, user_tasks, visible_dirs
from ._paths import python_paths
from ._result import SandboxResult
from ._seccomp import VERDICT_FD, child_filter, verdict_filter
from ._walls import removed_walls
from ._warm import warm_pool

__all__ = ["run_job", "run_sandboxed"]

_BASE_LAYERS = ["rlimits", "audit-hook", "minimal-env", "separate-judge", "bounded-output"]
#: Processes of a bubblewrap run that are not model code's but count towards its
#: RLIMIT_NPROC: the driver, a test's child forked ahead of its turn, and a spare.
_TRUSTED_TASKS = 3


def _child_filters(settings: _Settings) -> dict[str, str]:
    """The seccomp programs the driver installs (:mod:`conductor.sandbox._seccomp`), as
    hex: ``child`` in every process that runs model code, ``verdict`` on the threads
    of a judged test (but its judge); none on an unknown machine or where a test
    removed them."""
    programs = {
        "child": child_filter(allow_subprocess=settings.allow_subprocess),
        "verdict": verdict_filter(VERDICT_FD),
    }
    out = {}
    for name, program in programs.items():
        if program is not None and f"{name}-seccomp" not in settings.removed:
            out[name] = program.hex()
    return out


def _filter_layers(cfg: Mapping[str, Any]) -> list[str]:
    return [f"seccomp-{name}" for name in sorted(cfg["seccomp"])]


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
    limits: SandboxLimits = DEFAULT_LIMITS,
    isolate: bool = True,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    engine: str | None = None,
) -> SandboxResult:
    """Run the Python program ``code`` in a fresh sandbox and wait for it.

    ``stdin`` is fed to the program; ``files`` (relative path -> text) are put in its
    working directory first; ``args`` become ``sys.argv[1:]``.  ``limits`` bound what it
    may use (:class:`SandboxLimits`; the wall-clock limit is enforced from outside by
    killing every process of the run).  ``engine`` is ``bubblewrap``, ``namespaces`` or
    ``none`` (default: see :func:`~conductor.sandbox.default_engine`); ``isolate=False``
    means ``none``.  ``env`` adds variables to the minimal environment (never the
    parent's).  ``python`` is the interpreter (default: this one).
    """
    return run_job(
        {"kind": "program", "args": list(args)},
        files={**(files or {}), "main.py": code},
        stdin=stdin,
        limits=limits,
        isolate=isolate,
        python=python,
        env=env,
        engine=engine,
    )


def _start_or_fail(argv: Sequence[str], **kw: Any) -> tuple[Started | None, str]:
    """:func:`start`, or, where the sandbox cannot even start (bwrap or the interpreter
    missing, out of file descriptors), None and why: the run then ends without result
    saying so, and a grader turns that into a ``grader_error`` verdict instead of
    failing the bench."""
    if not argv:
        # not started: the fds meant for it are closed here (start closes its own)
        for fd in kw.get("pass_fds", ()):
            with contextlib.suppress(OSError):
                os.close(fd)
        return None, "the sandbox failed to start"
    try:
        return start(argv, **kw), ""
    except OSError as exc:
        return None, f"the sandbox failed to start: {exc}"


class _Report:
    """The driver's report lines, parsed as they arrive (see
    :mod:`conductor.sandbox.inside.driver`).

    ``proceed`` answers each ``test`` frame of a driver that waits for word after each
    test: whether it runs the next one; the answers wait in :meth:`replies`.
    """

    def __init__(self, proceed: Callable[[Mapping[str, Any]], bool] | None = None) -> None:
        self.blocked: list[str] = []
        self.notes: list[str] = []
        self.frames: list[dict[str, Any]] = []
        self.status: dict[str, int] | None = None
        self.mounted = False
        self.proceed = proceed
        self._answers = bytearray()

    def replies(self) -> bytes:
        """The answers not sent yet (one byte a test: ``g`` go on, ``s`` stop)."""
        out = bytes(self._answers)
        self._answers.clear()
        return out

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
                    if self.proceed is not None and value.get("event") == "test":
                        self._answers += b"g" if self.proceed(value) else b"s"


@dataclass(frozen=True)
class _Settings:
    """What a sandbox is started with before its job is known: the key of the warm
    sandboxes that can run a job (:func:`run_job`'s ``warm``)."""

    engine: str
    interpreter: str
    cpu_time_s: float
    memory_mb: int
    max_file_mb: int
    max_processes: int
    allow_subprocess: bool
    env: tuple[tuple[str, str], ...]
    disk_mb: int
    preload: str
    driver: JobDriver | None = None
    removed: frozenset[str] = frozenset()


@dataclass
class _Sandbox:
    """One started sandbox waiting for its one job on ``job_w``."""

    started: Started | None
    failed: str
    engine: str
    ns_mode: str
    report_r: int
    job_w: int
    layers: list[str]
    notes: list[str]
    cleanup: list[Path] = field(default_factory=list)
    ahead: bool = False

    def alive(self) -> bool:
        return self.started is not None and self.started.alive()

    def close(self) -> None:
        """End the run (if it still runs) and remove what it left on the host."""
        if self.started is not None:
            self.started.discard()
        for fd in (self.report_r, self.job_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.report_r = self.job_w = -1
        for path in self.cleanup:
            shutil.rmtree(path, ignore_errors=True)


def _start_sandbox(
    settings: _Settings, files: Mapping[str, str] | None, stdin: str | None
) -> _Sandbox:
    """Start a sandbox of ``settings`` holding ``files`` and ``stdin``: its driver waits
    for the job (:meth:`_Sandbox.close` ends it whatever happens next)."""
    chosen = settings.engine
    interpreter = settings.interpreter
    nproc: int | None = int(settings.max_processes)
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
    job_r, job_w = os.pipe()
    stdin_fd = _memfd("stdin", (stdin or "").encode("utf-8"))
    source = driver_source(settings.driver)
    cfg: dict[str, Any] = {
        "report_fd": report_w,
        "job_fd": job_r,
        "uid": None,
        "userns": False,
        "mount": False,
        "expose": [],
        "hide": [],
        "allow_subprocess": settings.allow_subprocess,
        "preload": settings.preload,
        "own_pidns": chosen == BUBBLEWRAP,
        # a private /tmp and a network of its own (nothing but its loopback): the kernel
        # holds writes and connections there, the guard need not (inside.install_guard)
        "own_tmp": chosen == BUBBLEWRAP,
        "own_net": chosen == BUBBLEWRAP,
        "removed": sorted(settings.removed),
        "verdict_fd": VERDICT_FD,
        "seccomp": _child_filters(settings),
    }
    if settings.removed:
        notes.append("walls removed for a test: " + ", ".join(sorted(settings.removed)))
    sandbox = _Sandbox(None, "", chosen, mode, report_r, job_w, layers, notes, cleanup)
    try:
        if chosen == BUBBLEWRAP:
            bwrap = bwrap_path()
            if bwrap is None:
                raise OSError("bwrap is not installed")
            run_uid = fresh_uid() if root else None
            # as root the run's uid is fresh; otherwise the user namespace has the
            # kernel count only the tasks inside it (RLIMIT_NPROC counts per namespace)
            nproc = int(settings.max_processes) + _TRUSTED_TASKS
            work, tmp, cwd = WORKDIR, "/tmp", "/"
            cfg.update(workdir=work, control=SCRATCH, harden={"uid": run_uid})
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
                nproc = user_tasks(os.getuid()) + int(settings.max_processes)
            else:
                nproc = None  # root ignores it anyway
            (control / "inside.py").write_bytes(source)
            work, tmp, cwd = str(workdir), str(workdir / "tmp"), str(workdir)
            cfg.update(
                workdir=work,
                control=str(control),
                uid=uid,
                userns=mode == "userns",
                mount=mode != "none",
                expose=visible_dirs(interpreter),
                hide=hidden_homes() if mode != "none" else [],
                # unshare --pid --fork: the driver is the first process of its own
                own_pidns=mode != "none",
            )
        with contextlib.suppress(OSError):
            # the interpreter's sys.path outside, put back inside (see _paths)
            paths = python_paths(interpreter)
            cfg.update(sys_path=list(paths.sys_path), site_dirs=list(paths.site_dirs))
        cfg["limits"] = {
            "cpu": max(1, int(settings.cpu_time_s + 0.999)),
            "as": int(settings.memory_mb) * 1024 * 1024,
            "fsize": int(settings.max_file_mb) * 1024 * 1024,
            "nproc": nproc,
            "nofile": 256,
        }
        config = json.dumps(cfg).encode("utf-8")
        if chosen == BUBBLEWRAP:
            try:
                bytecode = driver_bytecode(interpreter, source)
                plan = plan_bwrap(
                    bwrap=str(bwrap),  # set above with the engine
                    python=interpreter,
                    driver_source=source if bytecode is None else bytecode,
                    driver_is_bytecode=bytecode is not None,
                    config=config,
                    files=files or {},
                    disk_mb=settings.disk_mb,
                    fresh_uid=run_uid,
                    inner_uid=run_uid if run_uid is not None else os.getuid(),
                    removed=settings.removed,
                )
            except OSError as exc:
                # started as a command that fails the same way, so that the result
                # says why (a grader makes it a grader_error, not a crash of the bench)
                plan = BwrapPlan(argv=[])
                notes.append(f"the sandbox failed to start: {exc}")
            fds += plan.fds
            argv = plan.argv
            notes += plan.notes
            layers += [*plan.layers, *_BASE_LAYERS, *_filter_layers(cfg)]
        else:
            config_fd = _memfd("config", config)
            fds.append(config_fd)
            argv = [
                interpreter,
                "-I",
                cfg["control"] + "/inside.py",
                f"/proc/self/fd/{config_fd}",
            ]
            layers += ["tempdir", *_BASE_LAYERS, *_filter_layers(cfg)]
            if mode != "none":
                argv = [*ns_command(mode), *argv]
                ns_layers = ["netns", "mountns", "pidns"]
                ns_layers += ["uid-drop"] if mode == "root" else ["userns", "no-capabilities"]
                layers[:0] = ns_layers
            else:
                layers.append("unisolated")
                notes.append("OS isolation unavailable or turned off")
        if "guard" in settings.removed:
            layers.remove("audit-hook")
        # from here the starter owns (and closes) these fds, whatever happens
        passed, fds = [*fds, report_w, job_r], []
        report_w = job_r = -1
        sandbox.started, sandbox.failed = _start_or_fail(
            argv,
            env=_child_env(work, tmp, dict(settings.env)),
            cwd=cwd,
            stdin_fd=stdin_fd,
            pass_fds=passed,
        )
    except BaseException:
        sandbox.close()
        raise
    finally:
        for fd in (*fds, stdin_fd, report_w, job_r):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        sandbox.engine, sandbox.ns_mode = chosen, mode
    return sandbox


def _run_in(
    sandbox: _Sandbox,
    job: Mapping[str, Any],
    *,
    limits: SandboxLimits,
    started: float,
    proceed: Callable[[Mapping[str, Any]], bool] | None,
) -> SandboxResult:
    """Send ``job`` to ``sandbox``, wait for the run's end and read its report."""
    report = _Report(proceed)
    notes = list(sandbox.notes)
    layers = list(sandbox.layers)
    # one line, the driver's job (JSON escapes every newline); after it, the answers
    payload = json.dumps({"job": dict(job), "args": list(job.get("args", []))}).encode()
    payload += b"\n"
    if sandbox.started is None:
        done = Launched(None, False, "", sandbox.failed, False, False, 0)
    else:
        reader, sandbox.report_r = sandbox.report_r, -1
        writer, sandbox.job_w = sandbox.job_w, -1
        done = sandbox.started.collect(
            report=(reader, report.line, limits.longest_frame(), int(limits.report_limit)),
            output_limit=int(limits.output_limit),
            wall_time_s=float(limits.wall_time_s),
            feed=(writer, payload),
            replies=report.replies if proceed is not None else None,
        )
    notes += report.notes
    if done.dropped_report_lines:
        notes.append(f"{done.dropped_report_lines} report lines over the limits dropped")
    if sandbox.engine == NAMESPACES:
        if report.mounted:
            layers.append("readonly-fs")
        else:
            layers.remove("mountns")

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
        engine=sandbox.engine,
        started_ahead=sandbox.ahead,
    )


def _discard(sandbox: _Sandbox) -> None:
    sandbox.close()


def _alive(sandbox: _Sandbox) -> bool:
    return sandbox.alive()


def run_job(
    job: Mapping[str, Any],
    *,
    driver: JobDriver | None = None,
    files: Mapping[str, str] | None = None,
    stdin: str | None = None,
    limits: SandboxLimits = DEFAULT_LIMITS,
    isolate: bool = True,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    engine: str | None = None,
    preload: str = "",
    warm: int = 0,
    proceed: Callable[[Mapping[str, Any]], bool] | None = None,
) -> SandboxResult:
    """Run one job in a fresh sandbox.

    ``job["kind"]`` names the function of the sandbox's driver that runs it:
    ``program`` (:func:`run_sandboxed`'s) or one that ``driver``, the caller's
    :class:`JobDriver`, registers (the job's other fields are that function's).  The job
    reaches the driver on a pipe it reads once, to its end; its result frames come back
    in :attr:`SandboxResult.frames`, at most ``limits.report_limit`` bytes of them (a
    frame longer than :meth:`SandboxLimits.longest_frame` is dropped as it streams, and
    a note says so).  Other arguments as for :func:`run_sandboxed` (CPU time and memory
    apply to each process the driver starts; ``limits.wall_time_s`` to the whole run,
    from when the job is sent).

    ``preload`` is Python source the driver runs before its job arrives (the imports
    every job of a kind shares; the caller's trusted code, never the job's).  ``warm``
    (jobs without ``files`` or ``stdin`` only): keep that many sandboxes of these
    settings (the driver and the limits a sandbox starts with included) started ahead,
    each waiting for exactly one job and discarded after it
    (:mod:`conductor.sandbox._warm`); the job takes one that is ready
    (:attr:`SandboxResult.started_ahead`) or starts its own.  A sandbox is never shared
    by two jobs, warm or not.

    ``proceed``, for a job whose driver waits for word after each test
    (:func:`~conductor.sandbox.inside.driver.proceed`): given each frame whose
    ``event`` is ``test`` as it arrives, whether the driver runs the next test.  The
    word comes from here, after the test, so nothing in the sandbox (the driver's
    memory, which every test's process starts as a copy of) holds the rule it is given.
    Without ``proceed`` no word is sent, and such a driver stops after its first test.
    """
    started = time.monotonic()
    chosen = NONE if not isolate else (engine or default_engine())
    if chosen not in (BUBBLEWRAP, NAMESPACES, NONE):
        raise ValueError(f"unknown sandbox engine {chosen!r}")
    settings = _Settings(
        engine=chosen,
        interpreter=os.path.abspath(python or sys.executable),
        cpu_time_s=float(limits.cpu_time_s),
        memory_mb=int(limits.memory_mb),
        max_file_mb=int(limits.max_file_mb),
        max_processes=int(limits.max_processes),
        allow_subprocess=bool(limits.allow_subprocess),
        env=tuple(sorted((env or {}).items())),
        disk_mb=int(limits.disk_mb),
        preload=preload,
        driver=driver,
        removed=removed_walls(),
    )
    sandbox: _Sandbox | None = None
    if warm > 0 and not files and not stdin:
        pool = warm_pool(
            settings,
            functools.partial(_start_sandbox, settings, None, None),
            _alive,
            _discard,
            warm,
        )
        sandbox = pool.take()
        if sandbox is not None:
            sandbox.ahead = True
    if sandbox is None:
        sandbox = _start_sandbox(settings, files, stdin)
    try:
        return _run_in(sandbox, job, limits=limits, started=started, proceed=proceed)
    finally:
        sandbox.close()
