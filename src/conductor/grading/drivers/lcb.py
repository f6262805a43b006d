"""The LiveCodeBench job driver: runs a sample's tests inside the sandbox and forwards
raw outputs, never verdicts (standard library only).

This file runs inside the sandbox, assembled with the sandbox's driver into one program
(:mod:`conductor.sandbox.inside`; the grader hands it over as
:data:`conductor.grading.drivers.LIVECODEBENCH`): the names it imports for the type
checker are that driver's, and at run time it imports nothing from ``conductor``,
which is not there.

For each stdin test it forks a fresh child that runs the solution with the test's
input on fd 0 and its stdout captured; for a sample whose tests are all functional, it
forks one child that runs the solution once and calls the function for every test in
turn with its JSON arguments (as the official checker does; see "one child for a
sample's calls" below), each return value serialised with :func:`json.dumps`.  The
expected outputs never enter the sandbox: the grader (:mod:`conductor.grading.code`)
compares.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # the sandbox's driver, which this file is assembled with into one namespace
    from conductor.sandbox.inside.driver import (
        CFG,
        compile_solution,
        fork_child,
        frame,
        memfd,
        read_fd,
        status_json,
        swept,
        wait_child,
    )
    from conductor.sandbox.inside.guard import install_guard


def _child_stdio(stdin_fd: int, out_fd: int, err_fd: int) -> None:
    """A test child's standard streams: its input on fd 0, its output and errors on
    fds 1 and 2 (files the driver reads once the test has ended)."""
    import io

    os.dup2(stdin_fd, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "rb", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "wb", closefd=False), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "wb", closefd=False), encoding="utf-8")


def _await_go(go_r: int) -> None:
    """Wait for the driver's go (one byte) before any model code runs; a pipe closed
    unwritten means the test is not to run."""
    go = os.read(go_r, 1)
    os.close(go_r)
    if go != b"G":
        os._exit(1)


def _call_args(text: str) -> list[Any]:
    """A functional test's arguments: one JSON value per line of its input."""
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def _lcb_entry(g: dict[str, Any], fn_name: str) -> Callable[..., Any]:
    """What a functional test calls: ``Solution().fn_name`` (LeetCode style) or a
    top-level ``fn_name``."""
    cls = g.get("Solution")
    if isinstance(cls, type) and hasattr(cls, fn_name):
        return getattr(cls(), fn_name)  # type: ignore[no-any-return]
    if callable(g.get(fn_name)):
        return g[fn_name]  # type: ignore[no-any-return]
    raise NameError(f"no Solution.{fn_name} or function {fn_name} defined")


def _json_result(value: Any) -> str:
    """A functional test's return value as the JSON text that crosses to the parent."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the result is not JSON data: {exc}") from None


def _cpu_s(pid: int) -> float | None:
    """CPU seconds process ``pid`` used so far (all its threads), or None where
    ``/proc`` does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rfind(b")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


# One child for a sample's calls.  The official checker compiles a call-based program
# once and calls its method for every test in that one process (one ``Solution()``, the
# state one test leaves seen by the next), each call under a time limit; so does
# :func:`_lcb_calls`, which spares a fork, a guard and an ``exec`` per test.  What keeps
# the verdict out of the solution's reach there, though it shares a process with every
# test of its sample:
#
# * the expected outputs never enter the sandbox; the parent judges the values;
# * a value crosses as one record on a pipe, ``V <test> <JSON>``, in the tests' order.
#   The solution can write that pipe too, but a record it writes is only an answer it
#   could as well have returned; anything else there (a record out of turn or after the
#   last, a line that is neither a record nor the guard's, more than a value's cap)
#   fails the test it came in;
# * each test's time limit is the driver's, counted from the record before, and ends
#   the child with SIGKILL (no handler, mask or ``alarm(0)`` of the solution's delays
#   it); the CPU time the child used during a test is held to the same limit;
# * the child ending (``sys.exit(0)``, ``os._exit(0)``, a crash, closing the pipe)
#   before a test's record fails that test; an operation the guard refused fails the
#   test it came in, and one after the last record fails the last;
# * samples stay apart as before: one sandbox each, ended after its sample.
#
# As in the official checker (and allowed there), a test can change what the next one
# sees, and a thread started in one test can go on working while later tests run.

_CHANNEL_SLACK = 1 << 16  # bytes of a record beyond the value (its head, guard lines)


def _lcb_calls(
    code: Any, g: dict[str, Any], tests: list[dict[str, Any]], fn_name: str, limit: float,
    out_cap: int,
) -> None:  # fmt: skip
    """Run every test of a call-based sample in one child (see "one child for a sample's
    calls" above) and report one ``test`` frame per test that ran."""
    import select

    work = CFG["workdir"]
    n = len(tests)
    stdin_fd, out_fd, err_fd = memfd("stdin"), memfd("stdout"), memfd("stderr")
    chan_r, chan_w = os.pipe()
    go_r, go_w = os.pipe()

    def body() -> int:
        os.close(chan_r)
        os.close(go_w)
        _child_stdio(stdin_fd, out_fd, err_fd)
        sys.path.insert(0, work)
        install_guard(work, CFG["allow_subprocess"], chan_w)
        _await_go(go_r)
        exec(code, g)
        fn = _lcb_entry(g, fn_name)
        for i, test in enumerate(tests):
            data = "V " + str(i) + " " + _json_result(fn(*_call_args(test["input"]))) + "\n"
            view = memoryview(data.encode("utf-8", "replace"))
            while view:
                view = view[os.write(chan_w, view) :]
        return 0

    # RLIMIT_CPU is the backstop for the whole child; each test's share is checked below
    pid = fork_child(body, int(CFG["limits"]["cpu"]) * (n + 1))
    os.close(go_r)
    os.close(chan_w)
    with contextlib.suppress(OSError):
        os.write(go_w, b"G")
    os.close(go_w)
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = -1
    cap = out_cap + _CHANNEL_SLACK
    frames: list[dict[str, Any]] = []
    blocked: list[str] = []  # refused while the test now running ran
    buf = bytearray()
    status: int | None = None
    timed_out = eof = False
    problem = ""
    went, cpu0 = time.monotonic(), _cpu_s(pid)
    while not (problem or timed_out or (frames and frames[-1]["blocked"])):
        while (nl := buf.find(b"\n")) >= 0:
            line = bytes(buf[:nl]).decode("utf-8", "replace")
            del buf[: nl + 1]
            if line.startswith("B "):
                (frames[-1]["blocked"] if len(frames) == n else blocked).append(line[2:][:300])
                continue
            parts = line.split(" ", 2)
            if len(frames) == n or len(parts) != 3 or parts[:2] != ["V", str(len(frames))]:
                problem = "sandbox: the result channel was written out of turn"
                break
            now, cpu = time.monotonic(), _cpu_s(pid)
            if cpu is not None and cpu0 is not None and cpu - cpu0 > limit:
                timed_out = True
                break
            frames.append(_call_frame(len(frames), parts[2], blocked))
            blocked = []
            went, cpu0 = now, cpu
            if frames[-1]["blocked"]:
                break
        if problem or timed_out or (frames and frames[-1]["blocked"]):
            break
        if len(buf) > cap:
            problem = f"sandbox: a result over its {out_cap}-byte cap"
            break
        if status is not None and (eof or not select.select([chan_r], [], [], 0)[0]):
            if buf:  # a line left unended
                problem = "sandbox: the result channel was written out of turn"
            break  # ended, and all it wrote is read
        left = went + limit - time.monotonic()
        if left <= 0 and status is None:
            timed_out = True
            break
        # (a pipe at its end is always readable: then only the child's end is waited for)
        waits = ([] if eof else [chan_r]) + ([pidfd] if pidfd >= 0 and status is None else [])
        ready = select.select(waits, [], [], max(0.0, left if pidfd >= 0 else min(left, 0.005)))
        if chan_r in ready[0]:
            chunk = os.read(chan_r, 1 << 20)
            eof = not chunk
            buf += chunk
        if status is None:
            done, got = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                status = got
    if status is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    for fd in (pidfd, chan_r, stdin_fd, out_fd):
        if fd >= 0:
            os.close(fd)
    err, _ = read_fd(err_fd, 1 << 16)
    os.close(err_fd)
    if len(frames) < n and not (frames and frames[-1]["blocked"]):
        # the test that was running when the child ended, was ended or broke the rules
        frames.append(_call_frame(len(frames), None, blocked))
        frames[-1]["status"] = status_json(status)
    frames[-1]["timed_out"] = timed_out
    if problem:
        frames[-1]["error"] = problem
    frames[-1]["stderr_tail"] = err.decode("utf-8", "replace")[-2000:]
    for f in frames:
        frame(f)


def _call_frame(i: int, value: str | None, blocked: list[str]) -> dict[str, Any]:
    """Test ``i``'s frame from the one child of a call-based sample: its value (None
    where none came) and the operations the guard refused while it ran."""
    return {
        "event": "test", "i": i, "timed_out": False, "status": {"exit": 0}, "stdout": "",
        "stdout_truncated": False, "value": value, "value_truncated": False,
        "stderr_tail": "", "blocked": blocked[:20],
    }  # fmt: skip


def job_lcb() -> None:
    """Run a sample's LiveCodeBench tests: each stdin test in a fresh child, a sample
    whose tests are all functional in one child (:func:`_lcb_calls`); forward raw
    outputs (no verdicts)."""
    import builtins
    import gc

    work = CFG["workdir"]
    job = CFG["job"]
    prelude_src = job["prelude"]
    code = compile_solution(job["solution"])
    if code is None:
        return
    # The prelude's names are bound once here (its modules imported, its limits set),
    # and each child starts from a copy: the same bindings as running it there, without
    # the import machinery's work (and its copy-on-write faults) once per test.
    base: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    with contextlib.suppress(Exception):
        exec(compile(prelude_src, "<prelude>", "exec"), base)
    base["__name__"] = "__main__"
    limit = float(job["time_limit"])
    out_cap = int(job["output_limit"])
    fn_name = job.get("fn_name")
    # What is loaded now is not garbage the children make: a collection in a child
    # would otherwise walk (and so copy) every object inherited from here.
    gc.freeze()
    frame({"event": "ready"})
    tests = job["tests"]
    if fn_name and tests and all(t["testtype"] == "functional" for t in tests):
        _lcb_calls(code, dict(base), tests, str(fn_name), limit, out_cap)
        return

    def start(i: int, test: dict[str, Any], done: tuple[int, ...]) -> tuple[int, int, list[int]]:
        """Fork test ``i``'s child, which sets itself up and waits for the go (one byte
        on its pipe) before any model code runs: (pid, the go pipe, the test's fds)."""
        kind = test["testtype"]
        stdin_fd = memfd("stdin", test["input"].encode("utf-8") if kind == "stdin" else b"")
        out_fd, err_fd, res_fd = memfd("stdout"), memfd("stderr"), memfd("result")
        go_r, go_w = os.pipe()
        # made here, not in the child: copying the prelude's bindings there would write
        # to (and so copy) every page they are on
        g = dict(base)

        def body(
            kind: str = kind, test: dict[str, Any] = test, res_fd: int = res_fd,
            stdin_fd: int = stdin_fd, out_fd: int = out_fd, err_fd: int = err_fd,
            g: dict[str, Any] = g,
        ) -> int:  # fmt: skip
            # the previous test's files (still open here while it ran) are not this one's
            for fd in (*done, go_w):
                os.close(fd)
            _child_stdio(stdin_fd, out_fd, err_fd)
            sys.path.insert(0, work)
            install_guard(work, CFG["allow_subprocess"], res_fd)
            _await_go(go_r)
            if kind == "stdin":
                exec(code, g)
                return 0
            args = _call_args(test["input"])
            exec(code, g)
            text = _json_result(_lcb_entry(g, str(fn_name))(*args))
            sys.stdout.flush()
            os.write(res_fd, ("V " + text + "\n").encode("utf-8", "replace"))
            return 0

        pid = fork_child(body)
        os.close(go_r)
        return pid, go_w, [stdin_fd, out_fd, err_fd, res_fd]

    # Each test's child is forked (and sets itself up) while the test before it runs;
    # it starts only once that test has ended and everything it left was killed.
    ahead = start(0, tests[0], ()) if tests else None
    for i in range(len(tests)):
        assert ahead is not None
        pid, go_w, fds = ahead
        ahead = None
        with contextlib.suppress(OSError):
            os.write(go_w, b"G")
        os.close(go_w)
        went = time.monotonic()
        if i + 1 < len(tests):
            ahead = start(i + 1, tests[i + 1], tuple(fds))
        stdin_fd, out_fd, err_fd, res_fd = fds
        status, timed_out = wait_child(pid, limit - (time.monotonic() - went))
        out, out_trunc = read_fd(out_fd, out_cap)
        err, _ = read_fd(err_fd, 1 << 16)
        res, res_trunc = read_fd(res_fd, out_cap + (1 << 16))
        for fd in fds:
            os.close(fd)
        value_text = None
        blocked = []
        for line in res.decode("utf-8", "replace").splitlines():
            if line.startswith("V ") and value_text is None:
                value_text = line[2:]
            elif line.startswith("B "):
                blocked.append(line[2:][:300])
        frame(
            {
                "event": "test",
                "i": i,
                "timed_out": timed_out,
                "status": status_json(status),
                "stdout": out.decode("utf-8", "replace"),
                "stdout_truncated": out_trunc,
                "value": value_text,
                "value_truncated": res_trunc,
                "stderr_tail": err.decode("utf-8", "replace")[-2000:],
                "blocked": blocked[:20],
            }
        )
        # A time-out, crash or refused operation fails the sample whatever the expected
        # output is, so the tests after it need not run.
        failed = timed_out or blocked or status is None or status != 0
        if failed or not swept(ahead[0] if ahead is not None else 0):
            break
    if ahead is not None:
        # not started: the go pipe closes unwritten, and the child ends without running
        os.close(ahead[1])
        with contextlib.suppress(ChildProcessError):
            os.waitpid(ahead[0], 0)
        for fd in ahead[2]:
            os.close(fd)
