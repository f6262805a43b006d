"""The code grader: runs model-written Python against a problem's tests in a sandbox.

Two kinds of sample are understood, told apart by ``sample.metadata``:

**LiveCodeBench** (``metadata["tests"]``, or the raw LCB fields
``metadata["public_test_cases"]`` / ``metadata["private_test_cases"]``): a list of
``{"input": str, "output": str, "testtype": "stdin" | "functional"}``.  The list may be
given as a list, a JSON string, or LCB's encoded private-test string (see
:func:`decode_lcb_private_tests`).  Call-based problems name their function in
``metadata["fn_name"]`` (or ``"func_name"``, or inside the LCB ``metadata`` JSON string
``{"func_name": ...}``).

* ``stdin`` tests run the program with the input on standard input (``sys.stdin``,
  ``input()`` and ``open(0)`` all work) and compare standard output line by line: each
  line is stripped, trailing blank lines dropped, and lines that differ are compared
  token by token, numbers as floats within 1e-6 (absolute or relative).
* ``functional`` tests call ``Solution().fn_name(*args)`` (LeetCode style) or a
  top-level ``fn_name(*args)``; the input holds one JSON value per line (the
  arguments), the output one JSON value; results are compared after a JSON round trip
  (tuples become lists), floats within 1e-6.

A common import prelude (``typing``, ``collections``, ``heapq``, ``bisect``, ``math``,
``itertools``, ``functools``) is available to the solution, as in LiveCodeBench.  All
tests of a sample run in one sandboxed process, one after another, each under its own
timer (``time_limit_s``), stopping at the first failure.

**BigCodeBench** (``metadata["test"]``: unittest source defining ``TestCases`` that
expects the solution in the same module; ``metadata["entry_point"]``, usually
``task_func``): solution and test code are executed as one module and ``TestCases`` is
run with unittest (fail-fast); correct when every test passes.  The whole unittest run
has ``bigcodebench_time_limit_s`` and ``bigcodebench_memory_mb``.

Code extraction (:func:`extract_code`): ``<think>`` blocks are dropped; the **last**
fenced block tagged ``python``/``py``/``python3`` wins; else the last untagged fenced
block; else (no fences at all) the whole response if it looks like Python (a line
starting with ``def``, ``class``, ``import``, ``from ... import`` or ``print(``);
otherwise there is no answer.  A final fence left unclosed (a truncated reply) counts.

Verdicts: ``correct`` (detail ``{"passed": n, "total": n}``); ``incorrect`` with
``detail["outcome"]`` one of ``wrong_answer``, ``runtime_error``, ``compile_error`` and a
reason naming the failing test (expected vs got, truncated); ``time_limit``;
``no_answer``; ``grader_error`` (bad sample, sandbox failure).  A solution that tried an
operation the sandbox forbids (writing outside its directory, network, processes) is
never correct: it is graded ``runtime_error`` with the refused operations in
``detail["blocked"]``.

The grading harness runs in the same interpreter as the solution: the sandbox protects
the machine, but code written to tamper with the harness itself could fake a pass.
"""

from __future__ import annotations

import base64
import inspect
import json
import math
import pickle
import re
import zlib
from typing import Any

from conductor.bench.sandbox import SandboxResult, run_sandboxed
from conductor.bench.types import Sample, Verdict

__all__ = [
    "CodeGrader",
    "decode_lcb_private_tests",
    "extract_code",
    "outputs_match",
    "values_match",
]

_MARK = "@@CONDUCTOR-HARNESS@@ "
_SHOW = 200  # characters of expected / got shown in a reason

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.S | re.I)
_LOOKS_LIKE_CODE = re.compile(
    r"^\s*(def \w+|class \w+|import \w|from [\w.]+ import |print\()", re.M
)
_PY_TAGS = {"python", "py", "python3", "py3"}


def extract_code(response: str | None) -> str | None:
    """The code in a model's reply, or None (rules in the module docstring)."""
    if not response or not response.strip():
        return None
    text = _THINK.sub("", response)
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
    for wanted in (_PY_TAGS, {""}):
        chosen = [body for tag, body in blocks if tag in wanted]
        if chosen and chosen[-1].strip():
            return chosen[-1].strip("\n") + "\n"
    if blocks:
        return None  # only blocks in other languages
    if _LOOKS_LIKE_CODE.search(text):
        return text.strip("\n") + "\n"
    return None


def decode_lcb_private_tests(s: str) -> list[dict[str, Any]]:
    """Decode LiveCodeBench's ``private_test_cases`` field into a list of test dicts.

    The field is either plain JSON or base64 of zlib-compressed pickle of a JSON
    string.  The pickle comes from the benchmark dataset itself, which we treat as
    trusted data (unpickling runs in this process, not in the sandbox).
    """
    text = s.strip()
    try:
        value = json.loads(text)
    except ValueError:
        raw = pickle.loads(zlib.decompress(base64.b64decode(text.encode("ascii"))))  # noqa: S301
        value = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ValueError("LiveCodeBench tests must decode to a list of objects")
    return value


# --- comparison helpers: defined here (and unit-tested) and copied into the harness ----


def _as_float(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def outputs_match(got: str, expected: str) -> bool:
    """Whether a program's stdout matches the expected output, whitespace-tolerantly.

    Lines are stripped, trailing blank lines dropped; unequal lines are compared token by
    token, and two tokens that both parse as numbers match within 1e-6 (abs or rel).
    """

    def lines(text: str) -> list[str]:
        out = [line.strip() for line in text.replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out

    a, b = lines(got), lines(expected)
    if len(a) != len(b):
        return False
    for la, lb in zip(a, b, strict=True):
        if la == lb:
            continue
        ta, tb = la.split(), lb.split()
        if len(ta) != len(tb):
            return False
        for x, y in zip(ta, tb, strict=True):
            if x == y:
                continue
            fx, fy = _as_float(x), _as_float(y)
            if fx is None or fy is None or not math.isclose(fx, fy, rel_tol=1e-6, abs_tol=1e-6):
                return False
    return True


def values_match(got: Any, expected: Any) -> bool:
    """JSON-style equality of a function's result and the expected value (floats 1e-6)."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return got is expected or (type(got) is type(expected) and got == expected)
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        if isinstance(got, int) and isinstance(expected, int):
            return got == expected
        return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(got, (list, tuple)) and isinstance(expected, (list, tuple)):
        if len(got) != len(expected):
            return False
        return all(values_match(x, y) for x, y in zip(got, expected, strict=True))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k]) for k in got)
    return bool(got == expected)


_PRELUDE = (
    "from typing import *\n"
    "from collections import *\n"
    "from heapq import *\n"
    "from bisect import *\n"
    "from itertools import *\n"
    "from functools import *\n"
    "from math import *\n"
    "import sys, os, re, math, heapq, bisect, itertools, functools, collections, string\n"
    "import random, copy, operator, json\n"
)

_HARNESS_COMMON = r"""from __future__ import annotations
import builtins, io, json, math, os, signal, sys, traceback

_OUT = os.dup(1)
_MARK = MARK_PLACEHOLDER
# Whatever the solution prints outside a stdin test must not push the harness's own
# lines past the output cap, so fd 1 goes to a file from here on.
_sink = open("_stdout.txt", "wb")
os.dup2(_sink.fileno(), 1)
_sink.close()


def emit(obj):
    os.write(_OUT, (_MARK + json.dumps(obj) + "\n").encode("utf-8", "replace"))


class _Timeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


signal.signal(signal.SIGALRM, _on_alarm)


def _timer(seconds):
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _last_error(limit=600):
    lines = traceback.format_exc().strip().splitlines()
    return "\n".join(lines[-3:])[-limit:]
"""

_HARNESS_LCB = r"""
cfg = json.load(open("tests.json", encoding="utf-8"))
source = open("solution.py", encoding="utf-8").read()
limit = cfg["time_limit"]
try:
    code = compile(source, "solution.py", "exec")
except (SyntaxError, ValueError) as exc:
    emit({"event": "compile_error", "error": "%s: %s" % (type(exc).__name__, exc)})
    raise SystemExit(0)
prelude = compile(cfg["prelude"], "<prelude>", "exec")


def fresh_globals():
    g = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(prelude, g)
    except Exception:
        pass
    g["__name__"] = "__main__"
    return g


def run_stdin(data):
    with open("_stdin.txt", "wb") as fh:
        fh.write(data.encode("utf-8"))
    # the solution may have closed fd 0 / 1 (open(0) closes it), so the new file can
    # land on that very number: only move and close it when it did not
    for path, flags, target in (("_stdin.txt", os.O_RDONLY, 0),
                                ("_stdout.txt", os.O_WRONLY | os.O_TRUNC, 1)):
        fd = os.open(path, flags)
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    sys.stdin = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "rb", closefd=False)), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "wb", closefd=False)), encoding="utf-8")
    out = sys.stdout
    try:
        exec(code, fresh_globals())
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise RuntimeError("exited with status %r" % (exc.code,))
    finally:
        for stream in (sys.stdout, out):
            try:
                stream.flush()
            except Exception:
                pass
        sys.stdout = sys.__stdout__
    with open("_stdout.txt", "rb") as fh:
        return fh.read().decode("utf-8", "replace")


def find_callable(g, name):
    cls = g.get("Solution")
    if isinstance(cls, type) and hasattr(cls, name):
        return lambda *a: getattr(cls(), name)(*a)
    fn = g.get(name)
    if callable(fn):
        return fn
    raise NameError("no Solution.%s or function %s defined" % (name, name))


def normalise(value):
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return value


def show(value, limit=200):
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


tests = cfg["tests"]
module_globals = None
emit({"event": "ready"})
for i, test in enumerate(tests):
    kind = test.get("testtype", "stdin")
    try:
        _timer(limit)
        try:
            if kind == "functional":
                if module_globals is None:
                    module_globals = fresh_globals()
                    exec(code, module_globals)
                fn = find_callable(module_globals, cfg["fn_name"])
                args = [json.loads(line) for line in test["input"].split("\n") if line.strip()]
                got = normalise(fn(*args))
                expected = json.loads(test["output"])
                ok = values_match(got, expected)
            else:
                got = run_stdin(test["input"])
                expected = test["output"]
                ok = outputs_match(got, expected)
        finally:
            _timer(0)
    except _Timeout:
        emit({"event": "test", "i": i, "outcome": "time_limit"})
        break
    except BaseException:
        sys.stdout = sys.__stdout__
        emit({"event": "test", "i": i, "outcome": "runtime_error", "error": _last_error()})
        break
    if ok:
        emit({"event": "test", "i": i, "outcome": "passed"})
    else:
        emit({"event": "test", "i": i, "outcome": "wrong_answer",
              "expected": show(expected), "got": show(got)})
        break
emit({"event": "done"})
"""

_HARNESS_BCB = r"""
import types, unittest

cfg = json.load(open("tests.json", encoding="utf-8"))
solution = open("solution.py", encoding="utf-8").read()
test_code = open("test_code.py", encoding="utf-8").read()
try:
    compile(solution, "solution.py", "exec")
except (SyntaxError, ValueError) as exc:
    emit({"event": "compile_error", "error": "%s: %s" % (type(exc).__name__, exc)})
    raise SystemExit(0)
emit({"event": "ready"})
module = types.ModuleType("__test_module__")
module.__file__ = os.path.abspath("solution.py")
sys.modules["__test_module__"] = module
try:
    _timer(cfg["time_limit"])
    try:
        exec(compile(solution + "\n\n" + test_code, "solution.py", "exec"), module.__dict__)
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(module.TestCases)
        runner = unittest.TextTestRunner(stream=io.StringIO(), failfast=True, verbosity=0)
        result = runner.run(suite)
    finally:
        _timer(0)
except _Timeout:
    emit({"event": "bcb", "outcome": "time_limit"})
    raise SystemExit(0)
except BaseException:
    emit({"event": "bcb", "outcome": "runtime_error", "error": _last_error()})
    raise SystemExit(0)
failed = None
for kind, items in (("wrong_answer", result.failures), ("runtime_error", result.errors)):
    for test, text in items:
        if failed is None:
            failed = {"outcome": kind, "test": test.id().rsplit(".", 1)[-1],
                      "error": "\n".join(text.strip().splitlines()[-3:])[-600:]}
total = suite.countTestCases()
emit({"event": "bcb", "outcome": "passed" if failed is None and result.wasSuccessful() else
      (failed or {}).get("outcome", "wrong_answer"), "run": result.testsRun, "total": total,
      "bad": len(result.failures) + len(result.errors), "failed": failed})
"""


def _harness(kind: str) -> str:
    helpers = "\n\n".join(inspect.getsource(f) for f in (_as_float, outputs_match, values_match))
    common = _HARNESS_COMMON.replace("MARK_PLACEHOLDER", repr(_MARK))
    body = _HARNESS_LCB if kind == "lcb" else _HARNESS_BCB
    return common + "\n\n" + helpers + "\n\n" + body


def _short(text: Any, limit: int = _SHOW) -> str:
    s = text if isinstance(text, str) else repr(text)
    return s if len(s) <= limit else s[:limit] + "..."


class CodeGrader:
    """Grades code answers for LiveCodeBench and BigCodeBench by running tests.

    Options: ``time_limit_s`` (per LCB test), ``max_total_s`` (cap on one sample's whole
    run; the backstop is ``time_limit_s * tests + 10`` up to this cap), ``memory_mb``,
    ``bigcodebench_time_limit_s`` / ``bigcodebench_memory_mb`` (BigCodeBench runs
    import heavy libraries), ``allow_subprocess`` (let solutions start processes),
    ``python`` (interpreter to run solutions; default: this one).
    """

    name = "code"
    version = "1"

    def __init__(
        self,
        *,
        time_limit_s: float = 6.0,
        max_total_s: float = 300.0,
        memory_mb: int = 1024,
        bigcodebench_time_limit_s: float = 120.0,
        bigcodebench_memory_mb: int = 4096,
        allow_subprocess: bool = False,
        python: str | None = None,
    ) -> None:
        self.time_limit_s = float(time_limit_s)
        self.max_total_s = float(max_total_s)
        self.memory_mb = int(memory_mb)
        self.bigcodebench_time_limit_s = float(bigcodebench_time_limit_s)
        self.bigcodebench_memory_mb = int(bigcodebench_memory_mb)
        self.allow_subprocess = bool(allow_subprocess)
        self.python = python

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
        except (ValueError, TypeError, KeyError, zlib.error, pickle.UnpicklingError) as exc:
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
            return decode_lcb_private_tests(value)
        if isinstance(value, list):
            return [dict(t) for t in value]
        raise TypeError(f"tests must be a list or a string, not {type(value).__name__}")

    def _lcb_tests(self, meta: dict[str, Any]) -> list[dict[str, Any]]:
        if "tests" in meta:
            tests = self._load_tests(meta["tests"])
        else:
            tests = self._load_tests(meta.get("public_test_cases")) + self._load_tests(
                meta.get("private_test_cases")
            )
        fn = self._fn_name(meta)
        out = []
        for t in tests:
            kind = t.get("testtype") or ("functional" if fn else "stdin")
            if kind not in ("stdin", "functional"):
                raise ValueError(f"unknown testtype {kind!r}")
            if kind == "functional" and not fn:
                raise ValueError("functional test without fn_name")
            out.append({"input": str(t["input"]), "output": str(t["output"]), "testtype": kind})
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

    def _grade_lcb(self, code: str, tests: list[dict[str, Any]], fn: str | None) -> Verdict:
        total = len(tests)
        backstop = min(self.time_limit_s * total + 10.0, self.max_total_s)
        payload = {"tests": tests, "fn_name": fn, "time_limit": self.time_limit_s}
        payload["prelude"] = _PRELUDE
        result = run_sandboxed(
            _harness("lcb"),
            files={"solution.py": code, "tests.json": json.dumps(payload)},
            cpu_time_s=backstop,
            wall_time_s=backstop,
            memory_mb=self.memory_mb,
            allow_subprocess=self.allow_subprocess,
            python=self.python,
        )
        events = _events(result)
        base: dict[str, Any] = {"total": total, "isolation": result.isolation}
        if result.blocked:
            base["blocked"] = result.blocked
        compile_err = next((e for e in events if e.get("event") == "compile_error"), None)
        if compile_err is not None:
            return Verdict(
                "incorrect",
                f"compile error: {_short(compile_err.get('error', ''))}",
                extracted=code,
                detail={**base, "passed": 0, "outcome": "compile_error"},
            )
        results = [e for e in events if e.get("event") == "test"]
        passed = sum(1 for e in results if e.get("outcome") == "passed")
        base["passed"] = passed
        failure = next((e for e in results if e.get("outcome") != "passed"), None)
        done = any(e.get("event") == "done" for e in events)
        if result.blocked:
            at = failure["i"] if failure else passed
            return Verdict(
                "incorrect",
                f"test {at}: forbidden operation: {_short(result.blocked[0])}",
                extracted=code,
                detail={**base, "outcome": "runtime_error", "failed_test": at},
            )
        if failure is not None:
            i, outcome = failure["i"], failure["outcome"]
            if outcome == "time_limit":
                return Verdict(
                    "time_limit",
                    f"test {i}: exceeded {self.time_limit_s:g}s",
                    extracted=code,
                    detail={**base, "failed_test": i},
                )
            if outcome == "wrong_answer":
                reason = (
                    f"test {i}: wrong answer: expected {_short(failure.get('expected'))!r}, "
                    f"got {_short(failure.get('got'))!r}"
                )
            else:
                reason = f"test {i}: runtime error: {_short(failure.get('error', ''), 300)}"
            return Verdict(
                "incorrect",
                reason,
                extracted=code,
                detail={**base, "outcome": outcome, "failed_test": i},
            )
        if done and passed == total:
            return Verdict("correct", f"all {total} tests passed", extracted=code, detail=base)
        # The run ended without a verdict for test `passed`: killed or crashed hard.
        return self._abnormal_end(result, code, base, passed, backstop)

    # -- BigCodeBench -------------------------------------------------------------------

    def _grade_bigcodebench(self, code: str, meta: dict[str, Any]) -> Verdict:
        limit = self.bigcodebench_time_limit_s
        backstop = min(limit + 10.0, max(self.max_total_s, limit + 10.0))
        result = run_sandboxed(
            _harness("bcb"),
            files={
                "solution.py": code,
                "test_code.py": str(meta["test"]),
                "tests.json": json.dumps({"time_limit": limit}),
            },
            cpu_time_s=backstop,
            wall_time_s=backstop,
            memory_mb=self.bigcodebench_memory_mb,
            allow_subprocess=self.allow_subprocess,
            python=self.python,
        )
        events = _events(result)
        base: dict[str, Any] = {"isolation": result.isolation}
        if result.blocked:
            base["blocked"] = result.blocked
        compile_err = next((e for e in events if e.get("event") == "compile_error"), None)
        if compile_err is not None:
            return Verdict(
                "incorrect",
                f"compile error: {_short(compile_err.get('error', ''))}",
                extracted=code,
                detail={**base, "passed": 0, "total": 0, "outcome": "compile_error"},
            )
        ev = next((e for e in events if e.get("event") == "bcb"), None)
        if ev is None:
            return self._abnormal_end(result, code, {**base, "total": None}, 0, backstop)
        total = ev.get("total") or 0
        passed = max(0, int(ev.get("run", 0)) - int(ev.get("bad", 0)))
        base.update(passed=passed, total=total)
        outcome = ev.get("outcome")
        if result.blocked:
            return Verdict(
                "incorrect",
                f"forbidden operation: {_short(result.blocked[0])}",
                extracted=code,
                detail={**base, "outcome": "runtime_error"},
            )
        if outcome == "passed" and total > 0:
            return Verdict("correct", f"all {total} tests passed", extracted=code, detail=base)
        if outcome == "time_limit":
            return Verdict("time_limit", f"tests exceeded {limit:g}s", extracted=code, detail=base)
        failed = ev.get("failed") or {}
        name = failed.get("test", "module")
        err = failed.get("error") or ev.get("error") or "no tests ran"
        kind = outcome if outcome in ("wrong_answer", "runtime_error") else "wrong_answer"
        label = "failed" if kind == "wrong_answer" else "error"
        return Verdict(
            "incorrect",
            f"test {name}: {label}: {_short(err, 300)}",
            extracted=code,
            detail={**base, "outcome": kind, "failed_test": name},
        )

    # -- shared -------------------------------------------------------------------------

    def _abnormal_end(
        self,
        result: SandboxResult,
        code: str,
        base: dict[str, Any],
        at: int,
        backstop: float,
    ) -> Verdict:
        if not any(e.get("event") == "ready" for e in _events(result)) and not result.timed_out:
            return Verdict(
                "grader_error",
                "the test harness failed to start: "
                + _short(result.stderr.strip()[-300:] or f"status {result.returncode}", 300),
                extracted=code,
                detail=base,
            )
        if result.timed_out or result.killed_by_signal in ("SIGXCPU",):
            return Verdict(
                "time_limit",
                f"test {at}: the run exceeded its {backstop:g}s limit",
                extracted=code,
                detail={**base, "failed_test": at},
            )
        if result.returncode is None:
            return Verdict("grader_error", "sandbox returned no status", extracted=code)
        why = (
            f"killed by {result.killed_by_signal}"
            if result.killed_by_signal
            else f"exited with status {result.returncode}"
        )
        tail = result.stderr.strip().splitlines()[-1:] if result.stderr.strip() else []
        reason = f"test {at}: runtime error: process {why}" + (
            f" ({_short(tail[0])})" if tail else ""
        )
        return Verdict(
            "incorrect",
            reason,
            extracted=code,
            detail={**base, "outcome": "runtime_error", "failed_test": at},
        )


def _events(result: SandboxResult) -> list[dict[str, Any]]:
    events = []
    for line in result.stdout.splitlines():
        if line.startswith(_MARK):
            try:
                value = json.loads(line[len(_MARK) :])
            except ValueError:
                continue
            if isinstance(value, dict):
                events.append(value)
    return events
