"""The BigCodeBench job driver: runs each named test method of a task in a fresh child,
where a judge thread decides its verdict (standard library only).

Three files, run inside the sandbox assembled with the sandbox's driver into one program
(:mod:`conductor.sandbox.inside`; the grader hands them over as
:data:`conductor.grading.drivers.BIGCODEBENCH`): :mod:`.bcb_values` (what may reach a
test's checks), :mod:`.bcb_judge` (the snapshot and the judge thread) and this one (the
test's child, its main thread and the job).  The names they take from each other and
from the sandbox's driver are imported for the type checker only; at run time they
import nothing from ``conductor``, which is not there.  "The driver's globals" below are
that one program's namespace, these files' names and the sandbox driver's together.

How a BigCodeBench test is judged (the assertions must run next to the solution, in
its process, so every part of that process is within its reach except what is said
here):

* The verdict is written by a *judge thread* (:func:`judge_thread`) started in each
  test's child before the solution runs.  Only it knows the test's nonce: the parent
  makes the nonce after the fork and sends it down a pipe the thread empties before any
  model code runs.  No frame, global or object the solution can reach refers to it: a
  thread's frames are only visible through ``sys._current_frames`` (refused except to
  the judge) and ``gc`` (refused), signal handlers run on the main thread, and the judge
  calls no code that the solution could have replaced (its helpers are clones bound to a
  private copy of the driver's globals and of ``builtins``, made before it runs).
* The test runs on the main thread with unittest's ``debug`` protocol (setUp, the
  method, tearDown, cleanups; an exception propagates), so there is no result object to
  edit: a pass is the control flow reaching :func:`_ask_pass` in :func:`_bcb_child`.
  The judge honours that request only after reading the main thread's stack itself:
  ``_ask_pass``'s frame directly above *the* child frame registered before the
  solution ran, at that call's line.  Code of the solution's, a rebuilt copy of the
  driver's function, a signal handler or a finaliser makes a different stack.
* Before the solution runs, the driver snapshots every loaded module: each binding to
  a function, class or module, each class's methods, each function's code, defaults,
  globals and closure, and all of the driver's globals.  The judge compares at every
  call of the entry point, at every assertion and before the pass; any change that the
  test did not make itself (a ``mock.patch`` entered from the test's code is the
  test's) makes the verdict ``tampered``.
* Values that reach the checks are walked (the entry point's return value and its
  arguments after the call, and every assertion's arguments): objects of classes the
  solution made that change comparison or truth, library objects with methods the
  solution put on the instance, mocks the solution made (``unittest.mock.ANY``
  included) and rigged objects inside lists, dicts, numpy and pandas containers are
  refused.
"""

from __future__ import annotations

import _thread
import contextlib
import json
import os
import sys
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # the sandbox's driver and this driver's other files, which this file is assembled
    # with into one namespace
    from conductor.grading.drivers.bcb_judge import (
        ALIVE,
        add_codes,
        all_classes,
        judge_thread,
        snapshot,
    )
    from conductor.grading.drivers.bcb_values import (
        MOCKS_OF_THE_TEST,
        Rules,
        reachable,
        untrusted,
    )
    from conductor.sandbox.inside.driver import (
        CFG,
        FILTERS,
        compile_solution,
        fork_child,
        frame,
        memfd,
        proceed,
        read_fd,
        report,
        status_json,
        swept,
        wait_child,
    )
    from conductor.sandbox.inside.guard import install_guard, library_roots

# Imported before the snapshot whatever the test imports: what judges (unittest and its
# mocks) and the standard library a solution would patch to change a check's answer.
_BCB_PRELOAD = (
    "unittest", "unittest.mock", "os", "posixpath", "genericpath", "json", "re", "math",
    "types", "traceback", "contextlib", "weakref", "threading", "dis", "operator",
    "functools", "collections", "copy", "copyreg", "shutil", "glob", "fnmatch",
)  # fmt: skip
# (request fd, answer fd) of the main thread's channel to the judge: numbers reserved
# before the snapshot, so that this binding never changes.
_CHAN: tuple[int, int] = (-1, -1)
_BCB_RULES: tuple[Any, ...] = ()
_GENERATOR_TYPE = types.GeneratorType


class UntrustedResultError(TypeError):
    """A value reaching a check holds behaviour the solution defines (:func:`untrusted`)."""


class TamperedError(AssertionError):
    """The judge found something changed that the tests rely on."""


def _ask(kind: bytes) -> None:
    """Send a request to the judge thread and wait for its answer (main thread)."""
    req, ans = _CHAN
    os.write(req, kind)
    if os.read(ans, 1) == b"1":
        raise TamperedError("the grader's snapshot changed (see the verdict)")


def _ask_begin() -> None:
    _ask(b"B")


def _ask_ns() -> None:
    _ask(b"N")


def _ask_patch() -> None:
    _ask(b"X")


def _ask_pass() -> None:
    _ask(b"P")


def _ask_check() -> None:
    _ask(b"C")


def _ask_assert() -> None:
    _ask(b"A")


def _checked(fn: Callable[..., Any], rules: Rules) -> Callable[..., Any]:
    """The entry point as the tests call it: each call is followed by a judge check and
    a walk of its result and of its arguments (which it may have filled)."""

    def task(*args: Any, **kwargs: Any) -> Any:
        allowed = reachable((args, kwargs))
        value = fn(*args, **kwargs)
        _ask_check()
        why = untrusted(value, rules, True, allowed) or untrusted(
            (args, kwargs), rules, True, allowed
        )
        if why:
            raise UntrustedResultError("the solution returned " + why)
        if type(value) is _GENERATOR_TYPE:
            return _checked_items(value, rules)
        return value

    task.__name__ = getattr(fn, "__name__", "task_func")
    task.__doc__ = getattr(fn, "__doc__", None)
    return task


def _checked_items(gen: Any, rules: Rules) -> Any:
    """A generator the entry point returned, each item walked as a result is."""
    for item in gen:
        _ask_check()
        why = untrusted(item, rules, True, frozenset())
        if why:
            raise UntrustedResultError("the solution yielded " + why)
        yield item


def _asserting(method: Callable[..., Any]) -> Callable[..., Any]:
    """A TestCase assertion that first has the judge check the snapshot and walks what
    it compares (once per assertion: nested calls from unittest itself are not
    re-checked)."""

    def assertion(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code.co_filename
        rules = _BCB_RULES
        if rules and not caller.endswith(("unittest/case.py", "unittest\\case.py")):
            _ask_assert()
            why = untrusted((args[1:], kwargs), rules, False, frozenset())
            if why:
                raise UntrustedResultError("a checked value is " + why)
        return method(*args, **kwargs)

    assertion.__name__ = method.__name__
    assertion.__qualname__ = getattr(method, "__qualname__", method.__name__)
    return assertion


def _mock_init(
    original: Callable[..., Any], mock_codes: frozenset[int], test_codes: frozenset[int]
) -> Callable[..., Any]:
    """``unittest.mock.NonCallableMock.__init__`` that remembers the mocks the test made
    (a ``patch`` decorator's, or ``Mock()`` in a helper of the test's that a patch's
    ``side_effect`` calls), which the solution may hand back, as the official harness
    lets it: the nearest caller outside ``unittest.mock`` and ``contextlib`` is the
    test's code or unittest's.  A mock the solution makes is not remembered; a child
    mock is judged by its parent (:func:`_test_made`)."""
    made = MOCKS_OF_THE_TEST

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        frame: Any = sys._getframe(1)
        while frame is not None and id(frame.f_code) in mock_codes:
            frame = frame.f_back
        if frame is not None and id(frame.f_code) in test_codes:
            made[id(self)] = self

    return __init__


def _patch_enter(original: Callable[..., Any]) -> Callable[..., Any]:
    """``unittest.mock._patch.__enter__`` that tells the judge a patch is in place (the
    judge decides from the stack whether the test or the solution entered it)."""

    def enter(self: Any) -> Any:
        result = original(self)
        with contextlib.suppress(OSError):
            _ask_patch()
        return result

    return enter


def _summary(trace: str) -> str:
    """A traceback as its exception (all its lines) and where in the test or solution
    it was raised."""
    lines = trace.rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    start = frames[-1] + 1 if frames else 0
    # after the last frame come its source line and carets (indented), then the error
    while start < len(lines) and lines[start][:1] in (" ", "\t"):
        start += 1
    message = " ".join(line.strip() for line in lines[start:] if line.strip())
    ours = [
        lines[i].strip()
        for i in frames
        if lines[i].strip().startswith(('File "test_code.py"', 'File "solution.py"'))
    ]
    return (message + (f" ({ours[-1]})" if ours else ""))[-600:]


def _preimport(names: list[str]) -> None:
    import importlib

    for name in names:
        # a missing optional library fails the test later, not here
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - any library may fail its import
            report("N", f"could not import {name}: {type(exc).__name__}: {exc}"[:300])


def _source_imports(source: str) -> list[str]:
    """Absolute module names the source imports (read, never run)."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _test_stores(code: Any) -> tuple[str, ...]:
    """Names the test module's own code binds (imports, classes, functions, constants)."""
    import dis

    return tuple(
        sorted(
            {
                str(ins.argval)
                for ins in dis.get_instructions(code)
                if ins.opname in ("STORE_NAME", "STORE_GLOBAL")
            }
        )
    )


def _bcb_child(
    name: str,
    job: dict[str, Any],
    sol_code: Any,
    test_code: Any,
    test_stores: tuple[str, ...],
    test_reads: frozenset[str],
    fds: tuple[int, int, int, int],
    info: tuple[Any, ...],
    rules: Rules,
) -> int:
    """One test, in its own child: start the judge, run the solution, then the test.

    The verdict channel (``chan_fd``, see :func:`_verdict_channel`) is moved to the fd
    number the parent's verdict filter names; once the judge thread runs, the main
    thread installs that filter on itself, so that it and every thread or process it
    starts can neither write to, read, copy, close nor replace that fd (the judge
    thread, started before, can).  The guard's lines and the main thread's account of
    a failure go to ``notes_fd``, which the solution can write too (and can only fail
    a test with).

    The filter does not cover the judge thread itself: a finaliser of the solution's
    that ran there would be outside it.  What holds that is the judge's own discipline
    (see :func:`_judge`): between requests it waits in ``read()``, where no Python code
    runs; while it works the collector is off and no other thread is switched in, and
    it drops no last reference to anything the solution made."""
    import builtins
    import types
    import unittest

    nonce_fd, chan_fd, notes_fd, out_fd = fds
    verdict_fd = int(CFG.get("verdict_fd") or chan_fd)
    if verdict_fd != chan_fd:
        os.dup2(chan_fd, verdict_fd, inheritable=False)
        os.close(chan_fd)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    req_r, req_w = os.pipe()
    ans_r, ans_w = os.pipe()
    os.dup2(req_w, _CHAN[0])
    os.dup2(ans_r, _CHAN[1])
    os.close(req_w)
    os.close(ans_r)
    ready_r, ready_w = os.pipe()
    me = _thread.get_ident()
    judge = _thread.start_new_thread(
        judge_thread, (nonce_fd, verdict_fd, req_r, ans_w, me, ready_w, info)
    )
    if os.read(ready_r, 1) != b"1":
        return 1
    os.close(ready_r)
    if FILTERS is not None:
        FILTERS.install("verdict")
    work = CFG["workdir"]
    sys.path.insert(0, work)
    # the snapshot's functions: their code, defaults and globals are the judge's to keep
    known = frozenset(id(fn) for _label, fn, _state in info[1])
    install_guard(work, CFG["allow_subprocess"], notes_fd, judge, known)
    _ask_begin()
    module = types.ModuleType("__test__")
    ns = module.__dict__
    # as the official harness: the module starts with sys, os and environ bound
    ns.update({"__builtins__": builtins, "__file__": os.path.join(work, "solution.py"),
               "sys": sys, "os": os, "environ": os.environ})  # fmt: skip
    # the driver's own module must not be reachable as __main__
    sys.modules["__main__"] = sys.modules["__test__"] = module
    cls: Any = None
    case: Any = None
    try:
        exec(sol_code, ns)
        # what the test's names resolve to as builtins is the interpreter's, whatever the
        # solution bound (the judge holds it there from the test's start on)
        ns["__builtins__"] = builtins
        fn = ns.get(str(job["entry_point"]))
        if callable(fn):
            ns[str(job["entry_point"])] = _checked(fn, rules)
        exec(test_code, ns)
        cls = ns.get("TestCases")
        if not (isinstance(cls, type) and issubclass(cls, unittest.TestCase)):
            raise TypeError("TestCases is not a unittest.TestCase")
        case = cls(name)
        _ask_ns()
        _run_debug(ns, cls, case)
    except BaseException:
        import traceback as tb

        text = _summary(tb.format_exc())
        kind = "failure" if isinstance(sys.exc_info()[1], AssertionError) else "error"
        if isinstance(sys.exc_info()[1], TamperedError):
            kind = "error"
        with contextlib.suppress(BaseException):
            os.write(
                notes_fd, ("E " + json.dumps({"outcome": kind, "error": text}) + "\n").encode()
            )
        return 0
    _ask_pass()
    return 0


def _run_debug(ns: dict[str, Any], cls: Any, case: Any) -> None:
    """Module and class fixtures around the test (setUp, the method, tearDown,
    cleanups): any exception propagates, so a test passes only by finishing.

    Unlike ``case.debug()``, tearDown and the cleanups run when the method fails, as
    in the official harness's ``suite.run``: a test that fails must not leave its files
    (a database, a directory) to the next test of the sandbox, which a mutant copy's
    run, going on after failures, would otherwise see."""
    setup, teardown = ns.get("setUpModule"), ns.get("tearDownModule")
    if callable(setup):
        setup()
    cls.setUpClass()
    try:
        case._callSetUp()
        try:
            case._callTestMethod(getattr(case, case._testMethodName))
        finally:
            try:
                case._callTearDown()
            finally:
                while case._cleanups:
                    function, args, kwargs = case._cleanups.pop()
                    case._callCleanup(function, *args, **kwargs)
    finally:
        cls.tearDownClass()
        cls.doClassCleanups()
    if callable(teardown):
        teardown()


def job_bcb() -> None:
    """Run each named test method of a BigCodeBench task in a fresh child."""
    import types
    import unittest
    import unittest.mock

    global _CHAN, _BCB_RULES
    job = CFG["job"]
    sol_code = compile_solution(job["solution"])
    if sol_code is None:
        return
    test_code = compile(job["test"], "test_code.py", "exec")
    entry = str(job["entry_point"])
    test_stores = tuple(sorted({*_test_stores(test_code), entry, "__builtins__"}))
    # the solution's imports too: a library imported before the snapshot is known code,
    # and one imported inside the guard may be refused what its import does (sockets)
    _preimport([*_BCB_PRELOAD, *job["imports"], *_source_imports(job["solution"])])
    # as the official harness: UTC, and exit()/quit() are not there
    os.environ["TZ"] = "UTC"
    time.tzset()
    # two fd numbers the children put the judge channel on, bound before the snapshot
    _CHAN = (os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_RDONLY))
    for attr in dir(unittest.TestCase):
        method = getattr(unittest.TestCase, attr)
        if attr.startswith(("assert", "fail")) and isinstance(method, types.FunctionType):
            setattr(unittest.TestCase, attr, _asserting(method))
    patch_cls: Any = getattr(unittest.mock, "_patch")  # noqa: B009 - private, untyped
    patch_cls.__enter__ = _patch_enter(patch_cls.__enter__)

    known = frozenset(all_classes())
    _dicts, funcs, code_ids, codes_alive = snapshot(globals())
    ALIVE.append(codes_alive)
    test_code_ids: dict[int, Any] = {}
    add_codes(test_code_ids, test_code)
    ALIVE.append(list(test_code_ids.values()))
    by_module: dict[str, set[int]] = {}
    for _label, fn, _state in funcs:
        holder: dict[int, Any] = {}
        add_codes(holder, fn.__code__)
        by_module.setdefault(str(fn.__globals__.get("__name__")), set()).update(holder)
    mock_ids = by_module.get("unittest.mock", set()) | by_module.get("contextlib", set())
    unittest_ids = set().union(*(v for k, v in by_module.items() if k.startswith("unittest.")))
    # the fixtures' runner is the one driver function between the child and unittest
    stack_allowed = frozenset(
        mock_ids | unittest_ids | set(test_code_ids) | {id(_run_debug.__code__)}
    )
    stack_first = frozenset(
        (unittest_ids - by_module.get("unittest.mock", set())) | set(test_code_ids)
    )
    mock_classes = frozenset(
        id(v)
        for v in vars(unittest.mock).values()
        if isinstance(v, type) and v.__module__ == "unittest.mock"
    )
    rules = (
        known,
        frozenset(code_ids | set(test_code_ids)),
        mock_classes,
        type(unittest.mock.ANY),
        "ANY" in job["test"],
        library_roots(),
    )
    # the assertions read the rules from this global; the final snapshot holds it
    _BCB_RULES = rules
    # before the final snapshot, which then holds it as unittest.mock's own
    mock_base: Any = unittest.mock.NonCallableMock
    # (the driver's own wrapper of a patch's __enter__ is passed through like mock's code)
    passed_through = frozenset({*mock_ids, id(patch_cls.__enter__.__code__)})
    mock_base.__init__ = _mock_init(mock_base.__init__, passed_through, stack_first)
    dicts, funcs, _codes, codes_alive = snapshot(globals())
    ALIVE.append(codes_alive)
    hot = _hot_rows(dicts, job["imports"])
    ask_codes = {
        b"B": _ask_begin.__code__, b"N": _ask_ns.__code__, b"X": _ask_patch.__code__,
        b"P": _ask_pass.__code__, b"C": _ask_check.__code__, b"A": _ask_assert.__code__,
        b"*": _ask.__code__,
    }  # fmt: skip
    enter_code = patch_cls.__enter__.__code__
    import builtins

    names: set[str] = set()
    for code in test_code_ids.values():
        names.update(code.co_names)
    callables = {k for k, v in vars(builtins).items() if callable(v) and not k.startswith("__")}
    test_reads = frozenset((names & callables) - set(test_stores))
    deadline = time.monotonic() + float(job["time_limit"])
    frame({"event": "ready"})

    for name in job["tests"]:
        nonce_r, nonce_w = os.pipe()
        verdict_fd, chan_w = _verdict_channel()
        notes_fd, out_fd = memfd("notes"), memfd("out")
        info = (
            dicts, funcs, name, _bcb_child.__code__, ask_codes,
            (enter_code, patch_cls, stack_allowed, stack_first), frozenset(test_code_ids),
            rules, hot,
        )  # fmt: skip

        def body(
            name: str = name,
            fds: tuple[int, int, int, int] = (nonce_r, chan_w, notes_fd, out_fd),
            info: tuple[Any, ...] = info, writer: int = nonce_w, mine: int = verdict_fd,
        ) -> int:  # fmt: skip
            os.close(writer)
            os.close(mine)
            return _bcb_child(
                name, job, sol_code, test_code, test_stores, test_reads, fds, info, rules
            )

        pid = fork_child(body)
        os.close(nonce_r)
        os.close(chan_w)
        # made after the fork: the child's copy of this process never held it
        import secrets

        nonce = secrets.token_bytes(16)
        os.write(nonce_w, nonce)
        os.close(nonce_w)
        status, timed_out = wait_child(pid, deadline - time.monotonic())
        res = _read_verdict(verdict_fd, notes_fd)
        out, _ = read_fd(out_fd, 1 << 14)
        for fd in (verdict_fd, notes_fd, out_fd):
            os.close(fd)
        outcome, error, blocked = _bcb_outcome(res, nonce.hex())
        if timed_out:
            outcome = "time_limit"
        elif status is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            if outcome == "pass":
                outcome = "error"
            error = error or f"the test process ended with {json.dumps(status_json(status))}"
        frame(
            {
                "event": "test",
                "test": name,
                "outcome": outcome,
                "error": error,
                "blocked": blocked[:20],
                "output_tail": out.decode("utf-8", "replace")[-3000:],
            }
        )
        # the parent says whether another test runs (it knows why; the sandbox does not)
        if not swept() or not proceed():
            break


def _verdict_channel() -> tuple[int, int]:
    """(the driver's end, the test child's end) of a test's verdict channel: a socket
    pair, so that the child's end cannot be opened again through ``/proc/self/fd``
    (``ENXIO``) and nothing written into it can be read back or rewritten from there.
    (A pipe where a test removed that wall.)"""
    import socket

    if "verdict-socket" in CFG["removed"]:
        r, w = os.pipe()
        return r, w
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    mine.shutdown(socket.SHUT_WR)
    return mine.detach(), theirs.detach()


def _read_verdict(chan: int, notes: int) -> str:
    """A test's verdict lines: what the judge wrote on the channel (read without
    waiting: a process the test left behind may still hold the other end) after the
    lines of the notes file that are not verdicts (those only come on the channel)."""
    text, _ = read_fd(notes, 1 << 20)
    lines = [line for line in text.split(b"\n") if not line.startswith(b"V ")]
    os.set_blocking(chan, False)
    got, size = [], 0
    with contextlib.suppress(OSError):
        while size <= 1 << 20:
            chunk = os.read(chan, 1 << 16)
            if not chunk:
                break
            got.append(chunk)
            size += len(chunk)
    return (b"\n".join(lines) + b"\n" + b"".join(got)).decode("utf-8", "replace")


# What an assertion stands on, checked at every one (the rest at the entry point's
# calls and at the pass): unittest and its mocks, the builtins, the path functions
# tests ask the file system with, and which module a name imports.
_HOT = ("unittest", "builtins", "os", "posixpath", "genericpath", "sys.modules", "sys")


def _hot_rows(dicts: tuple[Any, ...], imports: list[str]) -> tuple[Any, ...]:
    """The rows of the snapshot :data:`_HOT` names, and the modules the test imports
    (their own bindings: ``numpy.testing``'s functions, not all of numpy)."""
    exact = set(imports)
    return tuple(
        row
        for row in dicts
        if row[0] in exact or any(row[0] == h or row[0].startswith(h + ".") for h in _HOT)
    )


def _bcb_outcome(text: str, nonce: str) -> tuple[str, str, list[str]]:
    """(outcome, error, refused operations) from one test's verdict file.

    Only the judge's ``V`` lines carry the nonce; ``E`` lines (the main thread's account
    of a failure) and anything else are the process's word and can only fail a test.
    """
    passes, tampered, blocked = 0, "", []
    outcome, error = "no_report", ""
    for line in text.splitlines():
        if line.startswith("B "):
            blocked.append(line[2:][:300])
        elif line.startswith("V "):
            parts = line.split(" ")
            if len(parts) != 4 or parts[1] != nonce:
                continue
            try:
                detail = bytes.fromhex(parts[3]).decode("utf-8", "replace")
            except ValueError:
                continue
            if parts[2] == "pass":
                passes += 1
            elif parts[2] == "tampered" and not tampered:
                tampered = detail or "tampered"
        elif line.startswith("E ") and outcome == "no_report":
            with contextlib.suppress(ValueError):
                obj = json.loads(line[2:])
                if isinstance(obj, dict) and obj.get("outcome") in ("failure", "error"):
                    outcome, error = str(obj["outcome"]), str(obj.get("error", ""))[-600:]
    if tampered:
        return "tampered", tampered[:600], blocked
    if passes == 1 and outcome == "no_report":
        return "pass", "", blocked
    if passes > 1:
        return "error", "more than one verdict was reported", blocked
    return outcome, error, blocked
