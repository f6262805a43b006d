"""Agreement of the project's LiveCodeBench grading with LiveCodeBench's own checker.

Run:  python benchmarks/graders/lcb_agreement.py [--official CHECKOUT] [--write]
                                                 [--time-limit S] [--repeat N]

The corpus is tests/cases/lcb_agreement.json: programs (stdin and call-based) with
their tests, each with the verdict the official checker gives (pass or fail, and its
per-test results).  Every case is graded with the project's code grader and compared
with that verdict; the script prints n, agree and disagree, and for each disagreement
both verdicts and, for the known differences, why.

With ``--official`` (a checkout of github.com/LiveCodeBench/LiveCodeBench, the folder
holding ``lcb_runner``) the official verdicts are recomputed by its own
``check_correctness`` (lcb_runner/evaluation/compute_code_generation_metrics.py, the
function its evaluation calls once per generation, with its default 6 s timeout) instead
of read from the file, and ``--write`` stores them there.  It also times grading per
sample both ways (``--repeat`` times each, cases that run into a time limit left out,
since those measure the limit) and prints the ratio, project over official, then, from one
program graded on 1 and on 21 tests, each one's fixed cost per sample and cost per test.

Without a checkout the script needs nothing but the project: CI runs it on the stored
verdicts (with ``--time-limit 2``: the corpus's slow cases pass and its endless ones
fail under any limit from 1 s to 6 s, so the verdicts do not depend on it).

Exit status: 0 when every case agrees or is a listed known difference and every known
difference still differs as described, 1 otherwise.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor.grading.code import CodeGrader
from conductor.grading.types import Sample, Verdict

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "cases" / "lcb_agreement.json"
OFFICIAL_TIMEOUT = 6  # seconds per test: LiveCodeBench's --timeout default


@dataclass(frozen=True)
class Outcome:
    """One case graded both ways."""

    name: str
    official: bool
    project: bool
    project_reason: str
    known_difference: str | None

    @property
    def agrees(self) -> bool:
        return self.official == self.project


def load_cases(path: Path = CORPUS) -> list[dict[str, Any]]:
    """The corpus: a JSON list of cases (see the module docstring)."""
    cases: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return cases


def project_verdict(case: dict[str, Any], grader: CodeGrader) -> Verdict:
    """The project's verdict on ``case``: its code as a model's fenced reply, its tests
    as a LiveCodeBench sample's."""
    kind = "functional" if case["fn_name"] else "stdin"
    tests = [{"input": t["input"], "output": t["output"], "testtype": kind} for t in case["tests"]]
    metadata: dict[str, Any] = {"tests": tests}
    if case["fn_name"]:
        metadata["fn_name"] = case["fn_name"]
    sample = Sample(id=case["name"], input={"question": "?"}, gold=None, metadata=metadata)
    return grader.grade(f"```python\n{case['code']}```\n", sample)


def official_checker(checkout: Path) -> Callable[[dict[str, Any], int], tuple[bool, list[Any]]]:
    """LiveCodeBench's own per-generation check, imported from ``checkout``: a function
    of (case, timeout) giving (passed, per-test results) as its evaluation computes
    them (a generation passes when every result is above 0, i.e. ``True``)."""
    sys.path.insert(0, str(checkout))
    from lcb_runner.evaluation.compute_code_generation_metrics import (
        check_correctness,
    )

    def check(case: dict[str, Any], timeout: int) -> tuple[bool, list[Any]]:
        sample = {
            "input_output": json.dumps(
                {
                    "inputs": [t["input"] for t in case["tests"]],
                    "outputs": [t["output"] for t in case["tests"]],
                    "fn_name": case["fn_name"],
                }
            )
        }
        results, _ = check_correctness(sample, case["code"], timeout, debug=False)
        plain = [r if isinstance(r, bool) else int(r) for r in results]
        return all(r > 0 for r in plain), plain

    return check


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = call()
    return value, time.perf_counter() - start


def _median_time(call: Callable[[], Any], first: float, repeat: int) -> float:
    """The median of ``first`` and ``repeat - 1`` more timings of ``call``."""
    return statistics.median([first, *(_timed(call)[1] for _ in range(repeat - 1))])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official", type=Path, help="a checkout of LiveCodeBench")
    parser.add_argument("--write", action="store_true", help="store the official verdicts")
    parser.add_argument("--time-limit", type=float, default=float(OFFICIAL_TIMEOUT))
    parser.add_argument("--repeat", type=int, default=3, help="timing runs per case")
    args = parser.parse_args(argv)
    if args.write and args.official is None:
        parser.error("--write needs --official")

    cases = load_cases()
    grader = CodeGrader(time_limit_s=args.time_limit)
    check = official_checker(args.official) if args.official is not None else None
    outcomes: list[Outcome] = []
    ours_s: list[float] = []
    theirs_s: list[float] = []
    for case in cases:
        ours = functools.partial(project_verdict, case, grader)
        verdict, took = _timed(ours)
        if check is not None:
            theirs = functools.partial(check, case, OFFICIAL_TIMEOUT)
            (passed, results), took_official = _timed(theirs)
            case["official"] = {"passed": passed, "results": results}
            if verdict.status != "time_limit" and -3 not in results and -1 not in results:
                ours_s.append(_median_time(ours, took, args.repeat))
                theirs_s.append(_median_time(theirs, took_official, args.repeat))
        outcomes.append(
            Outcome(
                name=case["name"],
                official=bool(case["official"]["passed"]),
                project=verdict.status == "correct",
                project_reason=verdict.reason,
                known_difference=case.get("known_difference"),
            )
        )

    if args.write:
        CORPUS.write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    agree = sum(o.agrees for o in outcomes)
    source = f"recomputed from {args.official}" if args.official else "stored"
    print(f"official verdicts: {source}; project time limit {args.time_limit:g} s")
    print(f"n={len(outcomes)} agree={agree} disagree={len(outcomes) - agree}")
    bad = 0
    for o in outcomes:
        if o.agrees and o.known_difference is None:
            continue
        official = "pass" if o.official else "fail"
        project = "pass" if o.project else "fail"
        if o.agrees:
            bad += 1
            print(f"  {o.name}: listed as a known difference but both {official}")
        elif o.known_difference is not None:
            print(
                f"  {o.name}: official {official}, project {project} (known: {o.known_difference})"
            )
        else:
            bad += 1
            print(f"  {o.name}: official {official}, project {project}: {o.project_reason}")
    if ours_s:
        mean_ours, mean_theirs = statistics.mean(ours_s), statistics.mean(theirs_s)
        print(
            f"grading time per sample over {len(ours_s)} cases (median of {args.repeat}, "
            f"then mean): project {mean_ours * 1000:.0f} ms, official {mean_theirs * 1000:.0f} ms, "
            f"ratio {mean_ours / mean_theirs:.2f}x"
        )
    if check is not None:
        _fixed_and_per_test(grader, check, args.repeat)
    return 1 if bad else 0


def _fixed_and_per_test(
    grader: CodeGrader,
    check: Callable[[dict[str, Any], int], tuple[bool, list[Any]]],
    repeat: int,
) -> None:
    """Print where the time goes: one correct program graded on 1 and on 21 tests gives
    each grader's cost per sample (the 1-test time less one test) and per test."""
    times: dict[str, list[float]] = {"project": [], "official": []}
    for n in (1, 21):
        case = {
            "name": f"timing_{n}",
            "fn_name": None,
            "code": "a, b = map(int, input().split())\nprint(a + b)\n",
            "tests": [{"input": "1 2\n", "output": "3\n"}] * n,
        }
        ours = functools.partial(project_verdict, case, grader)
        theirs = functools.partial(check, case, OFFICIAL_TIMEOUT)
        times["project"].append(_median_time(ours, _timed(ours)[1], repeat))
        times["official"].append(_median_time(theirs, _timed(theirs)[1], repeat))
    for who, (one, many) in times.items():
        per_test = (many - one) / 20
        print(
            f"{who}: {(one - per_test) * 1000:.0f} ms per sample, "
            f"then {per_test * 1000:.1f} ms per test"
        )


if __name__ == "__main__":
    sys.exit(main())
