"""The code grader: runs model-written Python against a problem's tests in a sandbox.

Two kinds of sample are understood, told apart by ``sample.metadata``:

**LiveCodeBench** (``metadata["tests"]``, or the raw LCB fields
``metadata["public_test_cases"]`` / ``metadata["private_test_cases"]``): a list of
``{"input": str, "output": str, "testtype": "stdin" | "functional"}``.  The list may be
given as a list, a JSON string, or LCB's encoded private-test string (see
:func:`conductor.grading.lcb_tests.decode_lcb_tests`, which refuses to build objects
from a pickle).  Call-based problems name their function in
``metadata["fn_name"]`` (or ``"func_name"``, or inside the LCB ``metadata`` JSON string
``{"func_name": ...}``).

Outputs are compared as LiveCodeBench's own checker compares them (its
``lcb_runner/evaluation/testing_util.py``), verdict for verdict:

* ``stdin`` tests run the program with the input on standard input (``sys.stdin``,
  ``input()`` and ``open(0)`` all work) and compare standard output line by line: the
  whole output is stripped, split at newlines and each line stripped; the line counts
  must agree, and two lines match when equal as text or when both are numbers that are
  equal as decimals (``1.50`` is ``1.5``, but ``15200000001`` is not ``15200000000`` nor
  ``1.52e+10``).
* ``functional`` tests call ``Solution().fn_name(*args)`` (LeetCode style) or a
  top-level ``fn_name(*args)``; the input holds one JSON value per line (the
  arguments), the output one JSON value; results are compared with ``==`` after a JSON
  round trip (tuples become lists, ``2.0`` equals ``2``, floats must be equal).

The option ``float_tolerance`` (off by default, recorded with the run's grader options)
lets a number whose expected form is not an integer match within that absolute or
relative error, for problems that accept such answers; the official checker does not.

The import prelude of LiveCodeBench's checker is available to the solution (the star
imports of ``string``, ``re``, ``datetime``, ``collections``, ``heapq``, ``bisect``,
``copy``, ``math``, ``random``, ``statistics``, ``itertools``, ``functools``,
``operator``, ``io``, ``sys``, ``json``, ``typing``, those modules themselves, a
recursion limit of 50000 and integers of up to 50000 digits as text).  The tests of a
sample run in one sandbox (each sample its own): its driver forks a fresh process per
stdin test, and one process for all of a call-based sample's tests, which runs the
program once and calls the function of one ``Solution()`` per test, as LiveCodeBench
does (so what one test leaves, the next sees, as there); each test has ``time_limit_s``
(6 s as in LiveCodeBench), enforced from outside that process, and a time-out or crash
ends the sample's run; the whole run has LiveCodeBench's global limit,
``(time_limit_s + 1) * tests + 5`` seconds (capped at ``max_total_s``).

Known differences from the official run, in how the program runs and how a result
crosses from the sandbox, not in how output is judged (the corpus of
tests/cases/lcb_agreement.json lists them, with the official verdicts): the program runs
as a script (LiveCodeBench wraps it in a function, so its top-level names are locals
there); ``for line in sys.stdin``, ``sys.stdout.buffer`` and ``open(0)`` work on the
test's input (there the first two fail and ``open(0)`` reads the checker's own standard
input); a program that exits with a non-zero status is a runtime error (LiveCodeBench
ignores ``SystemExit`` in stdin programs); a function's result crosses as JSON, so
tuples inside it equal lists here (only the outermost is converted there).

**BigCodeBench** (``metadata["test"]``: unittest source defining ``TestCases`` that
expects the solution in the same module; ``metadata["entry_point"]``, usually
``task_func``): the test methods are read from the source with :mod:`ast` here
(:func:`bcb_test_names`); each runs in a fresh process that executes the solution and
then the tests as one module; correct when the judge saw every one of those methods
pass (fail-fast).  The whole run has ``bigcodebench_time_limit_s`` (240 s, as the
official harness) and ``bigcodebench_memory_mb``.

Code extraction (:func:`extract_code`): ``<think>`` blocks are dropped; the **last**
fenced block tagged ``python``/``py``/``python3`` wins; else the last untagged fenced
block; else (no fences at all) the whole response if it looks like Python (a line
starting with ``def``, ``class``, ``import``, ``from ... import`` or ``print(``);
otherwise there is no answer.  A final fence left unclosed (a truncated reply) counts.

Verdicts: ``correct`` (detail ``{"passed": n, "total": n}``); ``incorrect`` with
``detail["outcome"]`` one of ``wrong_answer``, ``runtime_error``, ``compile_error``,
``tampered`` (BigCodeBench: the solution changed what the tests judge with; see below)
and a reason naming the failing test (expected vs got, truncated; a private test's
expected output, after ``num_public_tests``, is never quoted); ``time_limit``;
``no_answer``; ``grader_error`` (bad sample, sandbox failure).  A solution that tried an
operation the sandbox forbids (writing outside its directory, network, processes) is
never correct: it is graded ``runtime_error`` with the refused operations in
``detail["blocked"]``.

Quoted program output (expected / got, error tails) is clipped, control characters are
escaped and values of the parent's environment (keys) are redacted (:func:`quote_output`).
Code runs in the bubblewrap sandbox (:mod:`conductor.sandbox`); where bubblewrap cannot
run, or ``CONDUCTOR_SANDBOX_ISOLATION`` asks for a weaker engine, the grader refuses to
be built unless ``confirm_run_unsafe_code`` is given.  Every verdict names the engine
that ran the sample in ``detail["sandbox"]``, and carries ``"unisolated": true`` when
that was no OS isolation at all.

**What a solution cannot do to its grade** (each is a test in
tests/test_sandbox_attacks.py):

* LiveCodeBench: the expected outputs never enter the sandbox (only the inputs do), and
  the verdict is computed here, in the parent, from plain data: a stdin test's captured
  stdout, or a functional test's return value serialised with :func:`json.dumps` in
  the sandbox and parsed here, so no object with a rigged ``__eq__`` survives the
  crossing.  The solution runs in a child of the driver without the driver's report
  channel, so calling or patching reporting or comparison functions, printing fake
  markers, exiting early, killing the driver or reading test files only changes what
  *its own* output is.  Where a call-based sample's tests share one process, a value
  written to the result pipe by the solution itself is only an answer it could have
  returned; a record out of turn, anything else on that pipe, the process ending before
  a test's record, or a test over its time limit (counted and enforced by the driver,
  wall clock and CPU) fails the test (:mod:`conductor.grading.drivers.lcb`, "one child
  for a sample's calls").
* BigCodeBench: the assertions must run next to the solution, so whatever decides a
  test's verdict is within the solution's reach.  The design does not rest on that
  process keeping its secrets: a program that passes is run again against **mutant
  copies of its test** (``bigcodebench_mutants``, 1 by default; see
  :mod:`conductor.grading.mutants`): in each copy one check of every test method that
  has one is changed so that a program computing the answer must fail it (an expected
  value moved, a check turned into its opposite, an expected exception moved outside
  its family).  Each copy runs in a sandbox started as the original's was, the job the
  same but for the test's text, and the driver runs the next test only on the parent's
  word, so nothing in the sandbox says which copy it holds.  A program that passes a
  changed check did not compute its answer (it forged the verdict, read the expected
  value out of the test, rigged a mock or a comparison), and the verdict is
  ``incorrect`` with ``detail["outcome"] == "tampered"`` and ``detail["mutant"]`` naming
  the copy, test, line and kind of change.  A correct verdict records
  ``detail["differential"]``: how many copies ran and how many test methods a change
  checked.  Copies run only for programs that passed, so a failing program costs what it
  did; a passing one costs one run per copy more.  Inside the process, as before
  (:mod:`conductor.grading.drivers.bcb`):

  - **the verdict is the judge's**: each test's child starts a judge thread before the
    solution runs; only it holds the test's nonce (made by the driver after the fork and
    read by the judge before any model code), so no frame, global or object the
    solution can walk to holds it.  The test runs with unittest's ``debug`` protocol
    (no result object to edit); a pass is the child's own frame reaching its pass call,
    which the judge reads off the main thread's stack itself (a call from the
    solution's code, a rebuilt copy of the driver's function, a finaliser or a signal
    handler makes a different stack and is recorded as a forged request);
  - **tampering is detected, not undone**: before the solution runs, every loaded
    module's bindings to functions, classes and modules, every class's attributes,
    every function's code, defaults, globals and closure, and the driver's own globals
    are snapshotted; the test module's names and ``TestCases`` once the test is defined;
    the judge compares at every call of the entry point, every assertion and before the
    pass.  A change the test did not make itself (``mock.patch`` entered from the
    test's code or its decorators counts as the test's; one entered from the solution,
    a thread or a finaliser does not), a method set on the running test case, a
    builtin the test reads shadowed by the solution's own function, or a new key that
    shadows an inherited attribute makes the verdict ``incorrect`` with
    ``detail["outcome"] == "tampered"`` and ``detail["tampered"]`` saying what changed;
  - **values are walked**: the entry point's return value (and the arguments it was
    given, which it may fill), what it yields, and every assertion's arguments may not
    hold objects of classes the solution made that define comparison, truth or other
    behaviour (through lists, tuples, sets, dicts, deques, numpy object arrays, pandas
    values, index and columns, and instance attributes), library objects with a method
    the solution set on the instance, or mocks the solution made
    (``unittest.mock.ANY`` included unless the test itself uses it); such a test is a
    ``runtime_error``;
  - the parent decides which test methods must pass (from the source); exiting early,
    printing runner output, skipping, forging verdict lines, adding an audit hook or
    killing the judge fails.

  Official rules: the module starts with ``sys``, ``os`` and ``environ`` bound, ``TZ``
  is UTC, a task's tests have 240 s (``bigcodebench_time_limit_s``) and may start
  processes (``bigcodebench_allow_subprocess``, on by default), as in the official
  harness.  Stricter than it: a skipped test or an expected failure is not a pass.

**What remains possible** (BigCodeBench only; LiveCodeBench has no such in-process
state, and differential grading adds nothing there: the expected outputs never enter
the sandbox): a forgery caught by neither the judge nor the copies must tell the
original from its copies, which it can only do by knowing the original test (the data
set is public) or by computing some tests' answers honestly and comparing them with the
values in the copy it holds; a test method none of whose checks is sure to run (a check
only inside a branch or a ``try``) is not checked by a copy (``detail["differential"]``
says how many were); and a check a forgery can only pass by changing what the test
reads from the environment (``os.path.exists`` patched to say yes, where the honest
answer is yes as well) looks the same in every copy: that is the judge's to catch.
The process's memory is readable without any audit event (numpy's
``__array_interface__``, a library that hands out raw pointers), so the judge's secret
can be read; the kernel refuses a test's threads every write to the verdict channel
(:mod:`conductor.sandbox`), so what remains is to corrupt the judge thread's memory
into writing a pass, and a program that did would pass the copies too.

The text side, pure functions with no sandbox (finding the code, comparing outputs,
BigCodeBench's test names, quoting output), is :mod:`conductor.grading.code_text`.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import signal
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from conductor.grading.code_text import (
    bcb_test_names,
    extract_code,
    outputs_match,
    quote_output,
    values_match,
)
from conductor.grading.mutants import make_mutants
from conductor.grading.types import Sample, Verdict

# The sandbox and the test decoder are loaded when a code grader is made or used: a
# bench of another grader imports this module for with_unsafe_opt_in alone.
if TYPE_CHECKING:
    from conductor.sandbox import JobDriver, SandboxLimits, SandboxResult

__all__ = [
    "CodeGrader",
    "with_unsafe_opt_in",
]

_OUTPUT_LIMIT = 4_000_000  # bytes of one test's stdout brought back for comparison
_REPORT_LIMIT = 256_000_000
# The names LiveCodeBench's checker gives every solution: star imports in its order (so
# that ``builtins`` restores ``pow`` and ``open`` after ``math`` and ``io``), the modules
# themselves, and its recursion and integer-digit limits.
_PRELUDE_STARS = (
    "string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
    "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins",
    "typing",
)  # fmt: skip
_PRELUDE = (
    "".join(f"from {m} import *\n" for m in _PRELUDE_STARS)
    + "".join(f"import {m}\n" for m in _PRELUDE_STARS if m not in ("builtins", "typing"))
    + "sys.setrecursionlimit(50000)\n"
    # (an interpreter older than 3.11 given as ``python`` has no digit limit to raise)
    + "if hasattr(sys, 'set_int_max_str_digits'):\n    sys.set_int_max_str_digits(50000)\n"
)

# LiveCodeBench samples are graded in sandboxes started ahead (each one sample's only,
# discarded after it), with the prelude already imported: starting one is most of a
# short sample's grading time.  A few per grader setting hide that at low load; under
# full load every start costs the same CPU wherever it runs.
_WARM_SANDBOXES = 4


def _forbidden(test: object, blocked: list[str], fail: dict[str, Any], code: str) -> Verdict:
    """A test that tried an operation the sandbox refuses is a runtime error, whatever it
    printed: such code is never graded correct."""
    fail["blocked"] = [quote_output(b, 300) for b in blocked]
    return Verdict(
        "incorrect",
        f"test {test}: forbidden operation: {quote_output(blocked[0])}",
        extracted=code,
        detail={**fail, "outcome": "runtime_error"},
    )


def _passed(frame: Mapping[str, Any]) -> bool:
    """The word after a BigCodeBench test of the original run: go on while tests pass."""
    return frame.get("outcome") == "pass"


def with_unsafe_opt_in(grader: str, options: dict[str, Any], confirm: bool) -> dict[str, Any]:
    """``options`` for grader ``grader``, with the user's opt-in to unisolated code runs.

    The CLI's ``--confirm-run-unsafe-code`` and the train config's
    ``confirm_run_unsafe_code`` go through here; only the code grader takes the option.
    """
    if confirm and grader == CodeGrader.name:
        return {**options, "confirm_run_unsafe_code": True}
    return dict(options)


class CodeGrader:
    """Grades code answers for LiveCodeBench and BigCodeBench by running tests.

    Options: ``time_limit_s`` (per LCB test), ``max_total_s`` (cap on one sample's whole
    run; the backstop is LiveCodeBench's ``(time_limit_s + 1) * tests + 5`` up to this
    cap), ``float_tolerance`` (LCB numbers that are not integers match within this
    absolute or relative error; default None: exact, as the official checker), ``memory_mb``,
    ``bigcodebench_time_limit_s`` / ``bigcodebench_memory_mb`` (BigCodeBench runs
    import heavy libraries; 240 s for a task's tests, the official limit),
    ``allow_subprocess`` (let solutions start processes), ``bigcodebench_allow_subprocess``
    (the same for BigCodeBench only; on by default, as in the official harness),
    ``bigcodebench_mutants`` (mutant copies of the test a passing BigCodeBench program
    must fail, 0 to 8; 1 by default, 0 switches differential grading off),
    ``bigcodebench_max_processes`` (processes a BigCodeBench sample may run at once, 16
    by default: with ``bigcodebench_memory_mb`` this bounds the sample's memory, 16 x
    4,096 MiB; without subprocesses a sample is one process and its threads),
    ``mutation_seed`` (where the copies' changes come from; default: a secret of this
    grader's, so no program can work them out in advance), ``python`` (interpreter to
    run solutions; default: this one),
    ``confirm_run_unsafe_code`` (run even where no OS isolation is possible; without it
    the grader refuses to be built there, with a :class:`~conductor.errors.UsageError`).
    """

    name = "code"
    # 4: BigCodeBench is judged by a judge thread with a snapshot ("tampered"), under
    # the official time limit and with subprocesses allowed; 5: a call-based sample's
    # tests share one process and one Solution() (what one test leaves, the next sees);
    # 6: a passing BigCodeBench program is run against mutant copies of its test
    version = "6"

    def __init__(
        self,
        *,
        time_limit_s: float = 6.0,
        max_total_s: float = 300.0,
        float_tolerance: float | None = None,
        memory_mb: int = 1024,
        bigcodebench_time_limit_s: float = 240.0,
        bigcodebench_memory_mb: int = 4096,
        allow_subprocess: bool = False,
        bigcodebench_allow_subprocess: bool = True,
        bigcodebench_mutants: int = 1,
        bigcodebench_max_processes: int = 16,
        mutation_seed: int | None = None,
        python: str | None = None,
        confirm_run_unsafe_code: bool = False,
    ) -> None:
        self.time_limit_s = float(time_limit_s)
        self.max_total_s = float(max_total_s)
        if float_tolerance is not None and not (0 <= float(float_tolerance) < 1):
            raise ValueError(f"float_tolerance must be in [0, 1), not {float_tolerance!r}")
        self.float_tolerance = None if float_tolerance is None else float(float_tolerance)
        self.memory_mb = int(memory_mb)
        self.bigcodebench_time_limit_s = float(bigcodebench_time_limit_s)
        self.bigcodebench_memory_mb = int(bigcodebench_memory_mb)
        self.allow_subprocess = bool(allow_subprocess)
        self.bigcodebench_allow_subprocess = bool(bigcodebench_allow_subprocess)
        if type(bigcodebench_mutants) is not int or not 0 <= bigcodebench_mutants <= 8:
            raise ValueError(
                f"bigcodebench_mutants must be a whole number from 0 to 8, "
                f"not {bigcodebench_mutants!r}"
            )
        self.bigcodebench_mutants = bigcodebench_mutants
        if (
            type(bigcodebench_max_processes) is not int
            or not 1 <= bigcodebench_max_processes <= 256
        ):
            raise ValueError(
                f"bigcodebench_max_processes must be a whole number from 1 to 256, "
                f"not {bigcodebench_max_processes!r}"
            )
        self.bigcodebench_max_processes = bigcodebench_max_processes
        if mutation_seed is not None and type(mutation_seed) is not int:
            raise ValueError(f"mutation_seed must be a whole number, not {mutation_seed!r}")
        self.mutation_seed = mutation_seed
        self._secret = secrets.token_hex(16)
        self.python = python
        #: The sandbox engine every sample is graded in (bubblewrap unless the user
        #: opted in to a weaker one); each verdict records it as ``detail["sandbox"]``.
        from conductor.sandbox import BUBBLEWRAP, require_engine

        self.engine = require_engine(bool(confirm_run_unsafe_code))
        self.isolated = self.engine == BUBBLEWRAP

    # -- public -------------------------------------------------------------------------

    def grade(self, response: str | None, sample: Sample) -> Verdict:
        """Run the extracted code against the sample's tests and judge it."""
        code = extract_code(response)
        if code is None:
            return Verdict("no_answer", "no Python code found in the response")
        meta = sample.metadata or {}
        try:
            if isinstance(meta.get("test"), str) and meta["test"].strip():
                return self._grade_bigcodebench(code, meta)
            tests = self._lcb_tests(meta)
        except (ValueError, TypeError, KeyError) as exc:
            return Verdict("grader_error", f"unreadable tests: {exc}", extracted=code)
        if not tests:
            return Verdict("grader_error", "sample has no tests", extracted=code)
        return self._grade_lcb(code, tests, self._fn_name(meta))

    # -- LiveCodeBench ------------------------------------------------------------------

    @staticmethod
    def _load_tests(value: Any) -> list[dict[str, Any]]:
        if value is None or value == "":
            return []
        if isinstance(value, str):
            from conductor.grading.lcb_tests import decode_lcb_tests

            return decode_lcb_tests(value)
        if isinstance(value, list):
            return [dict(t) for t in value]
        raise TypeError(f"tests must be a list or a string, not {type(value).__name__}")

    def _lcb_tests(self, meta: dict[str, Any]) -> list[dict[str, Any]]:
        if "tests" in meta:
            tests = self._load_tests(meta["tests"])
            public = meta.get("num_public_tests")
            shown = public if type(public) is int else len(tests)
        else:
            tests = self._load_tests(meta.get("public_test_cases"))
            shown = len(tests)
            tests += self._load_tests(meta.get("private_test_cases"))
        fn = self._fn_name(meta)
        out = []
        for n, t in enumerate(tests):
            kind = t.get("testtype") or ("functional" if fn else "stdin")
            if kind not in ("stdin", "functional"):
                raise ValueError(f"unknown testtype {kind!r}")
            if kind == "functional" and not fn:
                raise ValueError("functional test without fn_name")
            out.append(
                {
                    "input": str(t["input"]),
                    "output": str(t["output"]),
                    "testtype": kind,
                    # A private test's expected output is never quoted: verdicts are kept
                    # in records, which the next program graded might read.
                    "hidden": n >= shown,
                }
            )
        return out

    @staticmethod
    def _fn_name(meta: dict[str, Any]) -> str | None:
        for key in ("fn_name", "func_name"):
            if isinstance(meta.get(key), str) and meta[key]:
                return str(meta[key])
        inner = meta.get("metadata")
        if isinstance(inner, str):
            try:
                inner = json.loads(inner)
            except ValueError:
                inner = None
        if isinstance(inner, dict) and isinstance(inner.get("func_name"), str):
            return str(inner["func_name"])
        return None

    def _run(
        self,
        job: dict[str, Any],
        driver: JobDriver,
        limits: SandboxLimits,
        *,
        preload: str = "",
        warm: int = 0,
        proceed: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> SandboxResult:
        from conductor.sandbox import run_job

        return run_job(
            job,
            driver=driver,
            limits=limits,
            python=self.python,
            engine=self.engine,
            preload=preload,
            warm=warm,
            proceed=proceed,
        )

    def _base(self, result: SandboxResult) -> dict[str, Any]:
        base: dict[str, Any] = {"sandbox": result.engine, "isolation": result.isolation}
        if "unisolated" in result.isolation:
            base["unisolated"] = True
        return base

    def _grade_lcb(self, code: str, tests: list[dict[str, Any]], fn: str | None) -> Verdict:
        total = len(tests)
        backstop = min((self.time_limit_s + 1.0) * total + 5.0, self.max_total_s)
        job = {
            "kind": "lcb",
            "solution": code,
            "prelude": _PRELUDE,
            "fn_name": fn,
            "time_limit": self.time_limit_s,
            "output_limit": _OUTPUT_LIMIT,
            # the expected outputs stay here: the sandbox only ever sees the inputs
            "tests": [{"input": t["input"], "testtype": t["testtype"]} for t in tests],
        }
        from conductor.grading.drivers import LIVECODEBENCH
        from conductor.sandbox import SandboxLimits

        limits = SandboxLimits(
            cpu_time_s=self.time_limit_s,
            wall_time_s=backstop,
            memory_mb=self.memory_mb,
            allow_subprocess=self.allow_subprocess,
            report_limit=_REPORT_LIMIT,
            # a test's frame carries its stdout and its value, each JSON-escaped (up to
            # 6 bytes a byte: control bytes become \u0000)
            frame_limit=13 * _OUTPUT_LIMIT + (1 << 20),
        )
        result = self._run(job, LIVECODEBENCH, limits, preload=_PRELUDE, warm=_WARM_SANDBOXES)
        frames = result.frames
        base = {**self._base(result), "total": total}
        failed = _compile_error(frames, code, {**base, "passed": 0})
        if failed is not None:
            return failed
        by_index = {
            f["i"]: f
            for f in frames
            if f.get("event") == "test" and type(f.get("i")) is int and 0 <= f["i"] < total
        }
        for i, test in enumerate(tests):
            base["passed"] = i
            frame = by_index.get(i)
            if frame is None:
                return self._abnormal_end(result, code, base, i, backstop)
            failed = self._judge_lcb_test(i, test, frame, code, base)
            if failed is not None:
                return failed
        base["passed"] = total
        return Verdict("correct", f"all {total} tests passed", extracted=code, detail=base)

    def _judge_lcb_test(
        self, i: int, test: dict[str, Any], frame: dict[str, Any], code: str, base: dict[str, Any]
    ) -> Verdict | None:
        """The verdict when test ``i`` failed, judged here from its raw frame; else None."""
        raw_status = frame.get("status")
        status: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
        blocked = [str(b)[:300] for b in frame.get("blocked") or [] if isinstance(b, str)]
        fail = {**base, "failed_test": i}
        if blocked:
            return _forbidden(i, blocked, fail, code)
        if frame.get("timed_out") is True or status.get("signal") == signal.SIGXCPU:
            return Verdict(
                "time_limit",
                f"test {i}: exceeded {self.time_limit_s:g}s",
                extracted=code,
                detail=fail,
            )
        broken = frame.get("error")
        if isinstance(broken, str) and broken:
            # the driver saw the solution break the result channel's rules (see
            # conductor.grading.drivers.lcb, "one child for a sample's calls")
            return Verdict(
                "incorrect",
                f"test {i}: runtime error: {quote_output(broken, 300)}",
                extracted=code,
                detail={**fail, "outcome": "runtime_error"},
            )
        raw_tail = frame.get("stderr_tail")
        tail = raw_tail if isinstance(raw_tail, str) else ""
        if status.get("exit") != 0:
            why = (
                f"killed by signal {status['signal']}"
                if "signal" in status
                else f"exited with status {status.get('exit')}"
            )
            last = tail.strip().splitlines()[-1:] if tail.strip() else []
            hidden = self._hidden_module(tail, f"test {i}", code, fail)
            if hidden is not None:
                return hidden
            return Verdict(
                "incorrect",
                f"test {i}: runtime error: {quote_output(last[0], 300) if last else why}",
                extracted=code,
                detail={**fail, "outcome": "runtime_error"},
            )
        if test["testtype"] == "functional":
            text = frame.get("value")
            if not isinstance(text, str) or frame.get("value_truncated") is True:
                return Verdict(
                    "incorrect",
                    f"test {i}: runtime error: no JSON result came back",
                    extracted=code,
                    detail={**fail, "outcome": "runtime_error"},
                )
            try:
                got: Any = json.loads(text)
            except (ValueError, RecursionError):
                return Verdict(
                    "incorrect",
                    f"test {i}: runtime error: the result is not JSON",
                    extracted=code,
                    detail={**fail, "outcome": "runtime_error"},
                )
            expected: Any = json.loads(test["output"])
            ok = values_match(got, expected, self.float_tolerance)
        else:
            got = frame.get("stdout")
            if not isinstance(got, str):
                got = ""
            expected = test["output"]
            ok = frame.get("stdout_truncated") is not True and outputs_match(
                got, expected, self.float_tolerance
            )
        if ok:
            return None
        wanted = "a hidden output" if test.get("hidden") else repr(quote_output(expected))
        return Verdict(
            "incorrect",
            f"test {i}: wrong answer: expected {wanted}, got {quote_output(got)!r}",
            extracted=code,
            detail={**fail, "outcome": "wrong_answer"},
        )

    # -- BigCodeBench -------------------------------------------------------------------

    def _grade_bigcodebench(self, code: str, meta: dict[str, Any]) -> Verdict:
        test_source = str(meta["test"])
        try:
            names, imports = bcb_test_names(test_source)
        except (SyntaxError, ValueError) as exc:
            return Verdict("grader_error", f"unreadable tests: {exc}", extracted=code)
        job = {
            "kind": "bcb",
            "solution": code,
            "test": test_source,
            "tests": names,
            "imports": imports,
            "entry_point": str(meta.get("entry_point") or "task_func"),
            "time_limit": self.bigcodebench_time_limit_s,
        }
        verdict = self._bcb_verdict(self._run_bcb(job), code, names)
        if verdict.status != "correct" or self.bigcodebench_mutants == 0:
            return verdict
        return self._differential(job, code, names, verdict)

    def _run_bcb(
        self, job: dict[str, Any], proceed: Callable[[Mapping[str, Any]], bool] = _passed
    ) -> SandboxResult:
        """One run of a BigCodeBench job; the driver runs the next test while
        ``proceed`` (given the last test's frame) says so: by default, while tests pass."""
        from conductor.grading.drivers import BIGCODEBENCH
        from conductor.sandbox import SandboxLimits

        limits = SandboxLimits(
            cpu_time_s=self.bigcodebench_time_limit_s,
            wall_time_s=self._bcb_backstop(),
            memory_mb=self.bigcodebench_memory_mb,
            # the sample's memory is at most this many processes of the limit each
            max_processes=self.bigcodebench_max_processes,
            # the official harness lets solutions start processes (the OS layer holds them)
            allow_subprocess=self.allow_subprocess or self.bigcodebench_allow_subprocess,
            report_limit=_REPORT_LIMIT,
        )
        return self._run(job, BIGCODEBENCH, limits, proceed=proceed)

    def _bcb_backstop(self) -> float:
        limit = self.bigcodebench_time_limit_s
        return min(limit + 10.0, max(self.max_total_s, limit + 10.0))

    def _bcb_verdict(self, result: SandboxResult, code: str, names: list[str]) -> Verdict:
        """The verdict on one run of the original test: every method must pass."""
        limit = self.bigcodebench_time_limit_s
        frames = result.frames
        base = {**self._base(result), "total": len(names), "passed": 0}
        failed = _compile_error(frames, code, base)
        if failed is not None:
            return failed
        by_name = _test_frames(frames)
        for passed, name in enumerate(names):
            base["passed"] = passed
            frame = by_name.get(name)
            if frame is None:
                return self._abnormal_end(result, code, base, passed, self._bcb_backstop())
            outcome = frame.get("outcome")
            if outcome == "pass":
                continue
            fail = {**base, "failed_test": name}
            blocked = [str(b) for b in frame.get("blocked") or [] if isinstance(b, str)]
            err = quote_output(
                frame.get("error") if isinstance(frame.get("error"), str) else "", 300
            )
            if blocked:
                return _forbidden(name, blocked, fail, code)
            if outcome == "time_limit":
                return Verdict(
                    "time_limit", f"tests exceeded {limit:g}s", extracted=code, detail=fail
                )
            if outcome == "tampered":
                # the judge saw the solution change what the tests rely on: no verdict
                # on the answer can be given, and the record says why
                return Verdict(
                    "incorrect",
                    f"test {name}: tampered: {err}",
                    extracted=code,
                    detail={**fail, "outcome": "tampered", "tampered": err},
                )
            kind = "wrong_answer" if outcome == "failure" else "runtime_error"
            label = "failed" if kind == "wrong_answer" else "error"
            hidden = self._hidden_module(frame.get("error"), f"test {name}", code, fail)
            if hidden is not None and kind == "runtime_error":
                return hidden
            if outcome == "no_report":
                err = err or "no verdict came back from the test"
            return Verdict(
                "incorrect",
                f"test {name}: {label}: {err}",
                extracted=code,
                detail={**fail, "outcome": kind},
            )
        base["passed"] = len(names)
        return Verdict("correct", f"all {len(names)} tests passed", extracted=code, detail=base)

    def _mutation_rng(self, job: dict[str, Any]) -> random.Random:
        """Where a sample's mutants come from: the ``mutation_seed`` option where given
        (reproducible), else this grader's secret, so that no program can work out in
        advance which copy of its test it holds; either way the same sample gets the
        same mutants from one grader."""
        seed = self.mutation_seed if self.mutation_seed is not None else self._secret
        digest = hashlib.sha256(
            f"{seed}\0{job['solution']}\0{job['test']}".encode("utf-8", "surrogatepass")
        ).digest()
        return random.Random(digest)

    def _differential(
        self, job: dict[str, Any], code: str, names: list[str], verdict: Verdict
    ) -> Verdict:
        """The solution against mutant copies of its test (:mod:`conductor.grading.mutants`):
        a method that passes where its check was changed was not passed by computing the
        answer, and the verdict is ``tampered``, whatever the original run said.

        Each copy runs in a sandbox started as the original's was, with the same job but
        for the test's text; the parent tells the driver after each test whether to go
        on (every method of a copy runs until one passes a changed check), so nothing
        the sandbox holds says which copy it is.
        """
        mutants = make_mutants(
            job["test"],
            names,
            job["entry_point"],
            self.bigcodebench_mutants,
            self._mutation_rng(job),
        )
        checked: set[str] = set()
        for n, mutant in enumerate(mutants):
            changed = {m.method for m in mutant.mutations}

            def go_on(frame: Mapping[str, Any], changed: set[str] = changed) -> bool:
                return not (frame.get("test") in changed and frame.get("outcome") == "pass")

            result = self._run_bcb({**job, "test": mutant.source}, proceed=go_on)
            frames = _test_frames(result.frames)
            for name in names:
                frame = frames.get(name)
                mutation = mutant.mutation_of(name)
                if frame is None or mutation is None:
                    continue
                checked.add(name)
                if frame.get("outcome") in ("pass", "tampered"):
                    why = (
                        f"it passed a copy of test {name} whose check was changed "
                        f"({mutation.describe()})"
                        if frame.get("outcome") == "pass"
                        else f"the judge saw tampering in a copy of test {name}"
                    )
                    detail = {
                        **(verdict.detail or {}),
                        "passed": 0,
                        "failed_test": name,
                        "outcome": "tampered",
                        "tampered": why,
                        "mutant": {
                            "copy": n,
                            "test": name,
                            "line": mutation.line,
                            "kind": mutation.kind,
                            "check": mutation.check,
                        },
                    }
                    return Verdict(
                        "incorrect", f"test {name}: tampered: {why}", extracted=code, detail=detail
                    )
        detail = dict(verdict.detail or {})
        detail["differential"] = {"copies": len(mutants), "checked": len(checked)}
        return Verdict(verdict.status, verdict.reason, extracted=code, detail=detail)

    # -- shared -------------------------------------------------------------------------

    def _hidden_module(
        self, text: object, where: str, code: str, detail: dict[str, Any]
    ) -> Verdict | None:
        """A grader error where a test failed importing a module that the interpreter
        has outside, somewhere the sandbox did not show (the sandbox's fault, not the
        solution's: see :func:`conductor.sandbox.missing_module`); else None."""
        if not isinstance(text, str) or "No module named" not in text:
            return None
        import sys

        from conductor.sandbox import missing_module

        why = missing_module(text, self.python or sys.executable)
        if why is None:
            return None
        return Verdict("grader_error", f"{where}: {why}", extracted=code, detail=detail)

    def _abnormal_end(
        self,
        result: SandboxResult,
        code: str,
        base: dict[str, Any],
        at: int,
        backstop: float,
    ) -> Verdict:
        if not any(f.get("event") == "ready" for f in result.frames) and not result.timed_out:
            why = next((n for n in result.notes if n.startswith("driver failed")), "")
            return Verdict(
                "grader_error",
                "the test driver failed to start: "
                + quote_output(
                    why or result.stderr.strip()[-300:] or f"status {result.returncode}", 300
                ),
                extracted=code,
                detail=base,
            )
        if result.timed_out:
            return Verdict(
                "time_limit",
                f"test {at}: the run exceeded its {backstop:g}s limit",
                extracted=code,
                detail={**base, "failed_test": at},
            )
        return Verdict(
            "grader_error",
            f"test {at}: the test driver ended without a result "
            f"(status {result.returncode}): {quote_output(result.stderr.strip()[-300:], 300)}",
            extracted=code,
            detail={**base, "failed_test": at},
        )


def _test_frames(frames: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A BigCodeBench run's test frames by test name."""
    return {
        f["test"]: f for f in frames if f.get("event") == "test" and isinstance(f.get("test"), str)
    }


def _compile_error(
    frames: list[dict[str, Any]], code: str, detail: dict[str, Any]
) -> Verdict | None:
    """The verdict on a program that did not compile (the driver's ``compile_error``
    frame), or None when it compiled; both code jobs (LiveCodeBench, BigCodeBench) read it."""
    found = next((f for f in frames if f.get("event") == "compile_error"), None)
    if found is None:
        return None
    return Verdict(
        "incorrect",
        f"compile error: {quote_output(found.get('error'))}",
        extracted=code,
        detail={**detail, "outcome": "compile_error"},
    )
