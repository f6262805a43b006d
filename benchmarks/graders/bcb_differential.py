"""Differential grading of BigCodeBench, measured: how often honest programs are called
``tampered``, what the mutant copies check, what forgeries they catch, and what they cost
in CPU against the grader without them and against the official harness.

The honest programs are each task's ground truth as the official harness builds it
(``complete_prompt + "\\n" + canonical_solution``), read from a BigCodeBench file in the
data set's own row schema (``task_id``, ``complete_prompt``, ``canonical_solution``,
``test``, ``entry_point``, ``libs``; JSON lines, optionally gzipped).  A task whose
libraries the grading interpreter cannot import is skipped and counted.  One forgery is
graded on every task as well: a *value reader* that answers each call with the constant
that follows the call's arguments in the test's own bytecode (it passes the in-process
judge wherever the test is that simple, and only a mutant copy can tell).

    python benchmarks/graders/bcb_differential.py --data BigCodeBench.jsonl.gz \\
        [--limit N] [--mutants 1] [--timing 100] [--official] [--jobs 2]

``--timing N``: the first N honest programs that pass are graded three more times, one
at a time, for CPU (this process's and its children's, sandbox and harness included):
without mutants, with them, and (``--official``, needs ``pip install --no-deps
bigcodebench``) by the official ``untrusted_check``.  ``--smoke`` (CI): the repository's
synthetic BigCodeBench fixture, one mutant, timing on two programs.  Judged: no honest
program is called ``tampered`` and every forgery the original run passed is caught.
Exit status 1 when a judged line fails, 2 when the script cannot run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import importlib.util
import json
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from conductor.grading.code import CodeGrader
from conductor.grading.code_text import bcb_test_names
from conductor.grading.types import Sample, Verdict
from conductor.sandbox import SandboxResult, run_job

REPO = Path(__file__).resolve().parent.parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "bench" / "bigcodebench-hard.jsonl"

# Answers each call with the constant that follows the call's arguments in some test
# method's constants: what a program that reads the expected value out of the test does.
VALUE_READER = """\
def task_func(*args, **kwargs):
    want = list(args) + list(kwargs.values())
    for name, fn in sorted(vars(globals()["TestCases"]).items()):
        code = getattr(fn, "__code__", None)
        if not name.startswith("test") or code is None:
            continue
        flat = []
        for c in code.co_consts:
            flat.extend(c if isinstance(c, tuple) else [c])
        for i in range(len(flat) - len(want)):
            if flat[i : i + len(want)] == want:
                return flat[i + len(want)]
    return None
"""


def read_rows(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def libs_of(row: dict[str, Any]) -> list[str]:
    libs = row.get("libs") or []
    if isinstance(libs, str):  # the data set writes the list as its Python text
        import ast

        libs = ast.literal_eval(libs)
    return [str(lib) for lib in libs]


def missing_libs(row: dict[str, Any]) -> list[str]:
    return [lib for lib in libs_of(row) if importlib.util.find_spec(lib) is None]


def ground_truth(row: dict[str, Any]) -> str:
    return f"{row['complete_prompt']}\n{row['canonical_solution']}"


def sample_of(row: dict[str, Any]) -> Sample:
    meta = {"test": row["test"], "entry_point": row.get("entry_point") or "task_func"}
    return Sample(id=str(row["task_id"]), input={}, gold=None, metadata=meta)


def grade(grader: CodeGrader, code: str, row: dict[str, Any]) -> Verdict:
    return grader.grade(f"```python\n{code}\n```", sample_of(row))


# CPU seconds each sandbox's driver reported (it and the processes it waited for): the
# processes inside a sandbox are not this process's to wait for, so rusage misses them
SANDBOX_CPU: list[float] = []


def _counting_run_job(*args: Any, **kwargs: Any) -> SandboxResult:
    result = run_job(*args, **kwargs)
    for f in result.frames:
        if f.get("event") == "cpu" and type(f.get("s")) is float:
            SANDBOX_CPU.append(f["s"])
    return result


def cpu_now() -> float:
    """CPU of this process, of every child it has waited for (the official harness's
    processes) and of every sandbox's driver."""
    used = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in used) + sum(SANDBOX_CPU)


def official_status(row: dict[str, Any], limit: float) -> str:
    from bigcodebench import eval as bcb_eval

    bcb_eval.TIMEOUT_LIMIT = limit
    stat, _ = bcb_eval.untrusted_check(
        ground_truth(row),
        row["test"],
        row.get("entry_point") or "task_func",
        30 * 1024,
        30 * 1024,
        10,
        min_time_limit=1,
        gt_time_limit=1,
    )
    return str(stat)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", type=Path, help="BigCodeBench rows (.jsonl or .jsonl.gz)")
    parser.add_argument("--limit", type=int, default=0, help="first N runnable tasks (0: all)")
    parser.add_argument("--mutants", type=int, default=1, help="mutant copies per passing program")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per task")
    parser.add_argument("--timing", type=int, default=0, help="programs timed one at a time")
    parser.add_argument("--official", action="store_true", help="time the official harness too")
    parser.add_argument("--jobs", type=int, default=2, help="tasks graded at once")
    parser.add_argument("--seed", type=int, default=0, help="mutation seed")
    parser.add_argument("--smoke", action="store_true", help="CI: the repository's fixture")
    args = parser.parse_args(argv)
    data = args.data or (FIXTURE if args.smoke else None)
    if data is None or not data.is_file():
        print("bcb_differential: give --data, a BigCodeBench file in the data set's schema")
        return 2
    if args.smoke:
        args.timing = args.timing or 2
    rows = read_rows(data)
    runnable = [r for r in rows if not missing_libs(r)]
    if args.limit:
        runnable = runnable[: args.limit]
    skipped = Counter(lib for r in rows if missing_libs(r) for lib in missing_libs(r))
    print(
        f"{data.name}: {len(rows)} tasks, {len(runnable)} graded "
        f"({len(rows) - len([r for r in rows if not missing_libs(r)])} skipped for "
        f"libraries missing here: {', '.join(f'{k} {v}' for k, v in skipped.most_common(6))})"
    )
    options: dict[str, Any] = {
        "bigcodebench_time_limit_s": args.time_limit,
        "bigcodebench_mutants": args.mutants,
        "mutation_seed": args.seed,
    }
    grader = CodeGrader(**options)
    load = os.getloadavg()[0]
    started = time.monotonic()

    def both(row: dict[str, Any]) -> tuple[Verdict, Verdict]:
        return grade(grader, ground_truth(row), row), grade(grader, VALUE_READER, row)

    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        graded = list(zip(runnable, pool.map(both, runnable), strict=True))
    wall = time.monotonic() - started

    statuses: Counter[str] = Counter()
    false_tampered: list[tuple[str, str]] = []
    methods = checked = copies = 0
    forged = caught = 0
    passing: list[dict[str, Any]] = []
    for row, (honest, reader) in graded:
        outcome = (honest.detail or {}).get("outcome")
        statuses[honest.status + (f" ({outcome})" if outcome else "")] += 1
        if outcome == "tampered" and "mutant" in (honest.detail or {}):
            false_tampered.append((str(row["task_id"]), honest.reason))
        if honest.status == "correct":
            passing.append(row)
            diff = (honest.detail or {}).get("differential") or {}
            methods += len(bcb_test_names(row["test"])[0])
            checked += int(diff.get("checked", 0))
            copies += int(diff.get("copies", 0))
        reader_detail = reader.detail or {}
        if reader.status == "correct":
            forged += 1
        elif "mutant" in reader_detail:
            forged += 1
            caught += 1
    honest_passing = len(passing) + len(false_tampered)
    print(f"honest programs graded: {len(graded)} ({wall:.0f} s wall, load {load:.1f} at start)")
    for status, n in statuses.most_common():
        print(f"  {status:40} {n}")
    rate = len(false_tampered) / honest_passing if honest_passing else 0.0
    print(
        f"false tampered: {len(false_tampered)} of {honest_passing} honest programs that pass "
        f"the original test ({100 * rate:.2f}%)"
    )
    for task, reason in false_tampered[:20]:
        print(f"  {task}: {reason[:160]}")
    print(
        f"methods checked by a mutant: {checked} of {methods} "
        f"({100 * checked / methods if methods else 0:.1f}%) in {copies} copies"
    )
    print(
        f"value reader: passed the original judge on {forged} tasks, "
        f"caught as tampered on {caught} of them"
    )
    ok = not false_tampered and caught == forged

    if args.timing and passing:
        from unittest import mock

        # the grader imports run_job from the package when it runs one
        mock.patch("conductor.sandbox.run_job", _counting_run_job).start()
        timed = passing[: args.timing]
        plain = CodeGrader(**{**options, "bigcodebench_mutants": 0})
        cpu: dict[str, float] = {"without mutants": 0.0, "with mutants": 0.0, "official": 0.0}
        for row in timed:
            for label, use in (("without mutants", plain), ("with mutants", grader)):
                before = cpu_now()
                grade(use, ground_truth(row), row)
                cpu[label] += cpu_now() - before
            if args.official:
                before = cpu_now()
                official_status(row, args.time_limit)
                cpu["official"] += cpu_now() - before
        n = len(timed)
        print(f"CPU per honest passing program, {n} programs one at a time (load {load:.1f}):")
        for label, total in cpu.items():
            if label == "official" and not args.official:
                continue
            print(f"  {label:16} {1000 * total / n:8.0f} ms")
        ratio = cpu["with mutants"] / cpu["without mutants"] if cpu["without mutants"] else 0.0
        verdict = "PASS" if ratio <= 1 + args.mutants + 0.25 else "FAIL"
        print(f"  with / without: {ratio:.2f}x (judged: at most {1 + args.mutants:.2f}x) {verdict}")
        if args.official and cpu["official"]:
            print(f"  with mutants / official: {cpu['with mutants'] / cpu['official']:.2f}x")
        ok = ok and verdict == "PASS"
    judged = "PASS" if ok else "FAIL"
    print(f"judged: no honest program tampered, every passing forgery caught: {judged}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
