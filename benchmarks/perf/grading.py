"""Speed of code grading (LiveCodeBench samples) against the official execution path.

Run:  python benchmarks/perf/grading.py [--smoke] [--repeat N] [--samples N]
                                        [--slots 2,8,64] [--json PATH]

1. Per-sample grade time of the project's code grader (bubblewrap sandbox) for 1 and
   10 tests, stdin and call-based, against a floor written here in the official
   checker's way (LiveCodeBench's lcb_runner/evaluation: per sample a
   ``multiprocessing.Manager`` and a forked ``Process`` that runs every test in
   itself, with the prelude's modules already imported by the forking parent: a stdin
   program compiled as the body of one function, called per test with ``sys.stdin``,
   ``open`` and the stdin methods patched by ``unittest.mock`` and stdout captured in
   memory; a call-based one's method called per test; ``signal.alarm`` and the fault
   handler around each test).  Both are timed in the same batch, interleaved, and the
   medians compared (target: <= 1.5x); the CPU time each used (user and system, this
   process and the children it waited for: the sandbox it took, including that
   sandbox's start) is reported beside it, as the wall clock of a shared machine
   varies.  Two figures for the project: ``spaced`` (samples arrive apart, as while a
   model generates: the next sandbox is already started) and ``back-to-back`` (one
   sample after another with no pause, which also pays for starting the next sandbox;
   reported, not a target).
2. N LiveCodeBench-style samples (stdin and call-based, 1 to 10 tests, right and wrong
   answers, a runtime error) graded through ``CodeGrader.grade`` on a pool of 64
   threads (target: < 30 s for 500), and the same at other slot counts (``--slots``)
   to show which grader concurrency is best on this machine.

Every verdict of part 2 is checked against the answer each sample was made with.  The
floor is a model of the official path for timing only; it is not a sandbox.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import faulthandler
import io
import json
import multiprocessing
import os
import resource
import signal
import statistics
import sys
import textwrap
import time
import types
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO
from unittest import mock  # the official checker's parent has it loaded too

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conductor.grading.code import CodeGrader  # noqa: E402
from conductor.grading.code_text import outputs_match, values_match  # noqa: E402
from conductor.grading.types import Sample  # noqa: E402
from conductor.sandbox import SandboxResult, run_job  # noqa: E402

RATIO_TARGET = 1.5
WALL_TARGET_S = 30.0
# What the official checker gives every program (imported by its parent before it forks).
PRELUDE_MODULES = (
    "string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
    "statistics", "itertools", "functools", "operator", "io", "sys", "json", "typing",
)  # fmt: skip
PRELUDE = "".join(f"from {m} import *\n" for m in PRELUDE_MODULES) + "".join(
    f"import {m}\n" for m in PRELUDE_MODULES
)

STDIN_PROGRAM = """\
n = int(input())
xs = list(map(int, input().split()))
xs.sort()
print(sum(xs[-2:]) if n > 1 else xs[0])
"""
CALL_PROGRAM = """\
class Solution:
    def maxPair(self, nums: List[int]) -> int:
        nums = sorted(nums)
        return nums[-1] + nums[-2] if len(nums) > 1 else nums[0]
"""
WRONG_STDIN = "n = int(input())\nprint(n)\n"
CRASH_STDIN = "print(1 // 0)\n"


def _numbers(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 1000 for i in range(n)]


def _answer(xs: list[int]) -> int:
    s = sorted(xs)
    return s[-1] + s[-2] if len(s) > 1 else s[0]


def stdin_tests(count: int, seed: int = 0) -> list[dict[str, str]]:
    """``count`` stdin tests of :data:`STDIN_PROGRAM`."""
    out = []
    for t in range(count):
        xs = _numbers(seed + t, 5 + t)
        text = f"{len(xs)}\n{' '.join(map(str, xs))}\n"
        out.append({"input": text, "output": f"{_answer(xs)}\n", "testtype": "stdin"})
    return out


def call_tests(count: int, seed: int = 0) -> list[dict[str, str]]:
    """``count`` call-based tests of :data:`CALL_PROGRAM` (``maxPair``)."""
    out = []
    for t in range(count):
        xs = _numbers(seed + t, 5 + t)
        out.append({"input": json.dumps(xs), "output": str(_answer(xs)), "testtype": "functional"})
    return out


def sample(tests: list[dict[str, str]], fn_name: str | None, sid: str = "s") -> Sample:
    meta: dict[str, Any] = {"tests": tests}
    if fn_name:
        meta["fn_name"] = fn_name
    return Sample(id=sid, input={"question": "?"}, gold=None, metadata=meta)


def fenced(code: str) -> str:
    return f"```python\n{code}```"


# ------------------------------------------------------------- the official-style floor


class _Stdin(io.StringIO):
    """A test's input as ``sys.stdin`` (with a ``buffer``, as programs read bytes too)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._bytes = io.BytesIO(text.encode())

    @property
    def buffer(self) -> BinaryIO:
        return self._bytes


def _as_function(code: str) -> str:
    """The program as the body of ``wrapped_function`` (the official checker runs a
    stdin program that way: its imports stay at the top)."""
    tree = ast.parse(code)
    imports = [ast.unparse(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    rest = [ast.unparse(n) for n in tree.body if not isinstance(n, ast.Import | ast.ImportFrom)]
    body = textwrap.indent("\n".join(rest) or "pass", "    ")
    return PRELUDE + "\n".join(imports) + "\ndef wrapped_function():\n" + body + "\n"


def _guard() -> None:
    """What the official checker's child does first: no core files, no fault handler,
    destructive functions of ``os`` gone."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    faulthandler.disable()
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir"):
        setattr(os, name, None)


def _floor_child(
    code: str, tests: list[dict[str, str]], fn_name: str | None, limit: int, out: Any
) -> None:
    """The forked process: every test in this one process (as the official path)."""
    _guard()
    signal.signal(signal.SIGALRM, _alarm)
    module = types.ModuleType("tmp_sol")
    results: list[str | None] = []
    try:
        if fn_name:
            exec(compile(PRELUDE + code, "<solution>", "exec"), module.__dict__)
            method = getattr(module.Solution(), fn_name)
        else:
            exec(compile(_as_function(code), "<solution>", "exec"), module.__dict__)
            method = module.wrapped_function
    except BaseException:
        out.append(results)
        return
    real_stdout = sys.stdout
    for test in tests:
        text = test["input"]
        signal.alarm(limit)
        faulthandler.enable()
        try:
            if fn_name:
                args = [json.loads(line) for line in text.split("\n") if line]
                results.append(json.dumps(method(*args)))
            else:
                lines = iter(text.split("\n"))
                sys.stdout = captured = io.StringIO()
                with (
                    mock.patch("builtins.open", mock.mock_open(read_data=text)),
                    mock.patch("sys.stdin", _Stdin(text)),
                    mock.patch("sys.stdin.readline", lambda *a, it=lines: next(it)),
                    mock.patch("sys.stdin.readlines", lambda *a, t=text: t.split("\n")),
                    mock.patch("sys.stdin.read", lambda *a, t=text: t),
                ):
                    method()
                results.append(captured.getvalue())
        except BaseException:  # a failing program ends its sample, as there
            results.append(None)
            break
        finally:
            sys.stdout = real_stdout
            faulthandler.disable()
            signal.alarm(0)
    out.append(results)


def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError("time limit")


def floor_grade(code: str, tests: list[dict[str, str]], fn_name: str | None) -> bool:
    """One sample graded the official way (a manager and a forked process); True when
    every test passed."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager:
        out = manager.list()
        proc = ctx.Process(target=_floor_child, args=(code, tests, fn_name, 6, out))
        proc.start()
        proc.join(timeout=7 * len(tests) + 5)
        if proc.is_alive():
            proc.kill()
            proc.join()
        got = list(out[0]) if out else []
    if len(got) != len(tests):
        return False
    for value, test in zip(got, tests, strict=True):
        if value is None:
            return False
        if fn_name:
            if not values_match(json.loads(value), json.loads(test["output"]), None):
                return False
        elif not outputs_match(value, test["output"], None):
            return False
    return True


# ------------------------------------------------------------------------- part 1


def _median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def _cpu_s() -> float:
    """CPU seconds of this process and of every child it has waited for, user and
    system: all of the floor (its manager and test process), and of the project's run
    what happens outside the sandbox (its driver's share is :data:`SANDBOX_CPU`)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + sum(SANDBOX_CPU)


# CPU seconds each sandbox's driver reported using (it and its children; the processes
# inside a sandbox are not this process's to wait for, so rusage does not count them)
SANDBOX_CPU: list[float] = []


def _counting_run_job(*args: Any, **kwargs: Any) -> SandboxResult:
    result = run_job(*args, **kwargs)
    for f in result.frames:
        if f.get("event") == "cpu" and type(f.get("s")) is float:
            SANDBOX_CPU.append(f["s"])
    return result


def per_sample(repeat: int, pause_s: float) -> list[dict[str, Any]]:
    """Part 1: project vs floor, interleaved, per case."""
    grader = CodeGrader()
    # the grader's sandbox runs, counted (the grader imports run_job from the package
    # when it runs one)
    mock.patch("conductor.sandbox.run_job", _counting_run_job).start()
    cases: list[tuple[str, str, list[dict[str, str]], str | None]] = [
        ("stdin, 1 test", STDIN_PROGRAM, stdin_tests(1), None),
        ("stdin, 10 tests", STDIN_PROGRAM, stdin_tests(10), None),
        ("call, 1 test", CALL_PROGRAM, call_tests(1), "maxPair"),
        ("call, 10 tests", CALL_PROGRAM, call_tests(10), "maxPair"),
    ]
    rows = []
    for label, code, tests, fn in cases:
        s = sample(tests, fn)
        if not grader.grade(fenced(code), s).correct or not floor_grade(code, tests, fn):
            raise SystemExit(f"{label}: the reference program is not graded correct")
        spaced: list[float] = []
        packed: list[float] = []
        floor: list[float] = []
        spaced_cpu: list[float] = []
        floor_cpu: list[float] = []
        for _ in range(repeat):
            time.sleep(pause_s)
            t, c = time.perf_counter(), _cpu_s()
            floor_grade(code, tests, fn)
            floor.append(time.perf_counter() - t)
            floor_cpu.append(_cpu_s() - c)
            time.sleep(pause_s)
            t, c = time.perf_counter(), _cpu_s()
            grader.grade(fenced(code), s)
            spaced.append(time.perf_counter() - t)
            # (includes starting the sandbox it took, reaped with it)
            spaced_cpu.append(_cpu_s() - c)
        time.sleep(pause_s)
        for _ in range(repeat):
            t = time.perf_counter()
            grader.grade(fenced(code), s)
            packed.append(time.perf_counter() - t)
        row: dict[str, Any] = {
            "case": label,
            "floor_ms": _median_ms(floor),
            "spaced_ms": _median_ms(spaced),
            "back_to_back_ms": _median_ms(packed),
            "floor_cpu_ms": _median_ms(floor_cpu),
            "cpu_ms": _median_ms(spaced_cpu),
        }
        row["ratio"] = row["spaced_ms"] / row["floor_ms"]
        row["cpu_ratio"] = row["cpu_ms"] / max(row["floor_cpu_ms"], 1e-3)
        row["back_to_back_ratio"] = row["back_to_back_ms"] / row["floor_ms"]
        rows.append(row)
    return rows


# ------------------------------------------------------------------------- part 2


def corpus(n: int) -> list[tuple[str, Sample, bool]]:
    """``n`` samples: (response, sample, whether it should be graded correct)."""
    out = []
    for i in range(n):
        count = 1 + i % 10
        kind = i % 5
        if kind in (0, 1):
            out.append((fenced(STDIN_PROGRAM), sample(stdin_tests(count, i), None, f"s{i}"), True))
        elif kind == 2:
            tests = call_tests(count, i)
            out.append((fenced(CALL_PROGRAM), sample(tests, "maxPair", f"c{i}"), True))
        elif kind == 3:
            out.append((fenced(WRONG_STDIN), sample(stdin_tests(count, i), None, f"w{i}"), False))
        else:
            out.append((fenced(CRASH_STDIN), sample(stdin_tests(count, i), None, f"e{i}"), False))
    return out


def throughput(n: int, slots: int) -> dict[str, Any]:
    """Part 2: ``n`` samples through the real grader on ``slots`` threads."""
    grader = CodeGrader()
    items = corpus(n)

    def one(item: tuple[str, Sample, bool]) -> bool:
        return grader.grade(item[0], item[1]).correct == item[2]

    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=slots) as pool:
        right = sum(pool.map(one, items))
    wall = time.perf_counter() - t
    return {"samples": n, "slots": slots, "wall_s": wall, "per_s": n / wall, "right": right}


def _line(ok: bool, text: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {text}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a few repeats, 40 samples")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--slots", default="64", help="comma-separated grader slot counts")
    ap.add_argument("--pause", type=float, default=0.15, help="seconds between spaced samples")
    ap.add_argument("--json", dest="json_path", help="write the figures here")
    args = ap.parse_args(argv)
    repeat, n = (3, 40) if args.smoke else (args.repeat, args.samples)
    slot_counts = [int(s) for s in str(args.slots).split(",") if s.strip()]
    if 64 not in slot_counts:
        slot_counts.append(64)
    print(f"cores: {os.cpu_count()}, load: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    # the official checker's parent has these loaded when it forks (its own imports)
    exec(PRELUDE, {"__name__": "__prelude__"})
    ok = True
    rows = per_sample(repeat, args.pause)
    for row in rows:
        good = row["ratio"] <= RATIO_TARGET
        ok = ok and (good or args.smoke)
        _line(
            good,
            f"{row['case']:<16} project {row['spaced_ms']:6.1f} ms  floor "
            f"{row['floor_ms']:6.1f} ms  ratio {row['ratio']:.2f}x (target <= "
            f"{RATIO_TARGET}x); back-to-back {row['back_to_back_ms']:6.1f} ms "
            f"({row['back_to_back_ratio']:.2f}x); CPU {row['cpu_ms']:.1f} ms vs "
            f"{row['floor_cpu_ms']:.1f} ms ({row['cpu_ratio']:.2f}x)",
        )
    runs = []
    for slots in slot_counts:
        run = throughput(n, slots)
        runs.append(run)
        right = run["right"] == n
        ok = ok and right
        target = WALL_TARGET_S * n / 500
        good = run["wall_s"] < target or slots != 64
        ok = ok and (good or args.smoke)
        _line(
            good and right,
            f"{n} samples at c={slots:<3} {run['wall_s']:6.2f} s ({run['per_s']:5.1f}/s), "
            f"{run['right']}/{n} verdicts as expected"
            + (f" (target < {target:g} s)" if slots == 64 else ""),
        )
    if args.json_path:
        figures = {"per_sample": rows, "throughput": runs, "cores": os.cpu_count()}
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump(figures, fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
