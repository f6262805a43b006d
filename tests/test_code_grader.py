"""The code grader against tests/cases/grade_code.json, plus its pure helpers."""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path
from typing import Any

import pytest

from conductor.grading.code import CodeGrader
from conductor.grading.code_text import extract_code, outputs_match, values_match
from conductor.grading.lcb_tests import decode_lcb_tests
from conductor.grading.types import Sample

CASES = json.loads((Path(__file__).parent / "cases" / "grade_code.json").read_text())
ESCAPE = Path("/tmp/conductor_grader_escape.txt")


def encode_lcb(tests: list[dict[str, Any]]) -> str:
    """LiveCodeBench's private-test encoding: json -> pickle -> zlib -> base64."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def build_sample(name: str, meta: dict[str, Any]) -> Sample:
    meta = dict(meta)
    for key, value in list(meta.items()):
        if isinstance(value, dict) and "encode" in value:
            meta[key] = encode_lcb(value["encode"])
    return Sample(id=name, input={"question": "?"}, gold=None, metadata=meta)


@pytest.mark.process
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(case: dict[str, Any]) -> None:
    ESCAPE.unlink(missing_ok=True)
    grader = CodeGrader(**case.get("options", {}))
    verdict = grader.grade(case["response"], build_sample(case["name"], case["sample"]))
    assert verdict.status == case["expect"], verdict
    if "outcome" in case:
        assert verdict.detail.get("outcome") == case["outcome"], verdict
    if case.get("blocked"):
        assert verdict.detail.get("blocked"), verdict
    if "reason_contains" in case:
        assert case["reason_contains"] in verdict.reason, verdict
    if verdict.status == "correct":
        assert verdict.detail["passed"] == verdict.detail["total"] > 0
    if "total" in case:
        assert verdict.detail["total"] == case["total"]
    assert not ESCAPE.exists(), "model code wrote outside its sandbox"


def test_case_file_is_big_enough() -> None:
    assert len(CASES) >= 20
    assert len({c["name"] for c in CASES}) == len(CASES)


def test_decode_lcb_tests_both_formats() -> None:
    tests = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    assert decode_lcb_tests(encode_lcb(tests)) == tests
    assert decode_lcb_tests(json.dumps(tests)) == tests
    with pytest.raises(ValueError):
        decode_lcb_tests(json.dumps({"not": "a list"}))


class _RunsCode:
    """A pickle that would call ``print`` when loaded by a bare ``pickle.loads``."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("a tampered data file ran code",))


def test_the_grader_refuses_test_data_whose_pickle_would_run_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The grader decodes private tests with the dataset's safe reader: a pickle naming
    a callable is refused (a grader error), and nothing runs."""
    evil = base64.b64encode(zlib.compress(pickle.dumps([_RunsCode()]))).decode()
    sample = Sample(id="lcb/1", input={}, gold=None, metadata={"private_test_cases": evil})
    verdict = CodeGrader(confirm_run_unsafe_code=True).grade("```python\nprint(1)\n```", sample)
    assert verdict.status == "grader_error"
    assert "refusing to load builtins.print" in verdict.reason
    assert "ran code" not in capsys.readouterr().out


def test_extract_code_rules() -> None:
    assert extract_code(None) is None
    assert extract_code("```py\nx = 1\n```") == "x = 1\n"
    assert extract_code("```\nA\n```\n```python\nB\n```\n```\nC\n```") == "B\n"
    assert extract_code("```\nA\n```\n```\nC\n```") == "C\n"
    assert extract_code("<think>```python\nA\n```</think>```python\nB\n```") == "B\n"
    # a truncated reply: the last fence never closes
    assert extract_code("```python\nprint(1)\n") == "print(1)\n"
    assert extract_code("just words") is None


def test_outputs_match_as_livecodebench_does() -> None:
    # stripped lines, leading and trailing blank lines dropped
    assert outputs_match("\n 1 2  \n3\n\n", "1 2\n3")
    assert outputs_match("1\r\n2\r\n", "1\n2")
    # numbers are equal as decimals, exactly
    assert outputs_match("1.50 1e3", "1.5 1000")
    assert outputs_match("1  2", "1 2")  # numeric lines compare token by token
    assert not outputs_match("0.1000000001", "0.1")
    assert not outputs_match("1000001", "1000000")
    assert not outputs_match("15200000001", "15200000000")
    assert not outputs_match("1.52e+10", "15200000001")
    assert outputs_match("nan", "nan")  # equal as text
    assert not outputs_match("nan", "NaN")  # a decimal NaN equals nothing
    assert not outputs_match("snan", "sNaN")  # a signalling one refuses to compare
    # a line with words must be equal as text
    assert not outputs_match("Yes  5", "Yes 5")
    assert not outputs_match("Yes 5.0", "Yes 5")
    # blank lines inside count
    assert not outputs_match("1\n\n2", "1\n2")
    assert not outputs_match("1 2", "1 2 3")
    assert not outputs_match("yes", "no")
    assert not outputs_match("1\n2", "1")
    assert not outputs_match("", "0")


def test_float_tolerance_forgives_only_non_integers() -> None:
    assert outputs_match("0.1000000001", "0.1", 1e-6)
    assert outputs_match("333333.33", "333333.3333", 1e-6)  # relative
    assert not outputs_match("0.334", "0.3333333", 1e-6)
    assert not outputs_match("1000001", "1000000", 1e-6)
    assert not outputs_match("1.52e+10", "15200000001", 1e-6)
    assert outputs_match("1.52e+10", "15200000000")  # equal as decimals
    assert not outputs_match("Yes 0.1000000001", "Yes 0.1", 1e-6)
    assert not outputs_match("inf", "1.5", 1e-6)
    assert values_match([0.1000000001], [0.1], 1e-6)
    assert not values_match([1000001], [1000000], 1e-6)
    assert not values_match(10**400, 1.5, 1e-6)


def test_values_match_as_livecodebench_does() -> None:
    assert values_match([1, [2.0]], [1, [2]])
    assert values_match(True, 1)  # Python's == on the result, as the official checker
    assert values_match({"a": [1, 2]}, {"a": [1, 2]})
    assert not values_match([1, [2.0000000001]], [1, [2.0]])
    assert not values_match(0.30000000000000004, 0.3)
    assert not values_match({"a": 1}, {"a": 2})
    assert not values_match("1", 1)
    assert not values_match([1, 2], [2, 1])


@pytest.mark.process
def test_timeouts_are_per_test_not_per_sample() -> None:
    # three tests each taking ~0.4 s pass under a 1 s per-test limit
    sample = build_sample(
        "slowish",
        {"tests": [{"input": "", "output": "ok", "testtype": "stdin"}] * 3},
    )
    code = "```python\nimport time\ntime.sleep(0.4)\nprint('ok')\n```"
    verdict = CodeGrader(time_limit_s=1).grade(code, sample)
    assert verdict.status == "correct", verdict


def _call_sample(outputs: list[str]) -> Sample:
    tests = [
        {"input": f"{n}", "output": out, "testtype": "functional"} for n, out in enumerate(outputs)
    ]
    return build_sample("calls", {"tests": tests, "fn_name": "f"})


@pytest.mark.process
def test_call_based_tests_share_one_process_as_the_official_checker() -> None:
    # LiveCodeBench compiles a call-based program once and calls one Solution()'s method
    # for every test: what one call leaves (module, class and instance state) the next sees
    code = """```python
seen = []
class Solution:
    def __init__(self):
        self.calls = 0
    def f(self, n):
        seen.append(n)
        self.calls += 1
        return [len(seen), self.calls]
```"""
    verdict = CodeGrader().grade(code, _call_sample(["[1, 1]", "[2, 2]", "[3, 3]"]))
    assert verdict.status == "correct", verdict


@pytest.mark.process
def test_call_based_time_limit_is_per_test_in_the_shared_process() -> None:
    slow = """```python
import time
class Solution:
    def f(self, n):
        time.sleep(0.4 if n < 3 else 5)
        return n
```"""
    verdict = CodeGrader(time_limit_s=1).grade(slow, _call_sample(["0", "1", "2"]))
    assert verdict.status == "correct", verdict  # 1.2 s in all, 0.4 s a test
    verdict = CodeGrader(time_limit_s=1).grade(slow, _call_sample(["0", "1", "2", "3", "4"]))
    assert verdict.status == "time_limit", verdict
    assert verdict.detail["failed_test"] == 3 and verdict.detail["passed"] == 3


@pytest.mark.process
def test_a_result_line_after_the_last_record_fails_the_sample() -> None:
    # right answers, then (as the child ends and flushes stdout) an unended line on
    # every fd: the result channel carries nothing but the records, in turn
    code = """```python
import os, sys
class Late:
    def write(self, s):
        return len(s)
    def flush(self):
        for fd in range(3, 64):
            try:
                os.write(fd, b"V 3 [")
            except OSError:
                pass
class Solution:
    def f(self, n):
        if n == 1:
            sys.stdout = Late()
        return n
```"""
    verdict = CodeGrader().grade(code, _call_sample(["0", "1"]))
    assert verdict.status == "incorrect", verdict
    assert verdict.detail["outcome"] == "runtime_error" and verdict.detail["failed_test"] == 1
    assert "out of turn" in verdict.reason


def test_grader_protocol_attributes() -> None:
    grader = CodeGrader()
    assert grader.name == "code" and grader.version == "6"
