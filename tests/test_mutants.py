"""Differential grading: the mutant copies of a BigCodeBench test and what they catch.

The unit tests read the mutants (:mod:`conductor.grading.mutants`, pure text); the
``process`` tests grade through the sandbox: honest programs are never ``tampered``,
forgeries that pass the original judge are, and the same forgeries pass where the
mutants are switched off (the positive control).
"""

from __future__ import annotations

import ast
import random
import textwrap
from typing import Any

import pytest

from conductor.grading.code import CodeGrader
from conductor.grading.code_text import bcb_test_names
from conductor.grading.mutants import find_sites, make_mutants
from conductor.grading.types import Sample
from conductor.sandbox import NONE, default_engine

needs_sandbox = pytest.mark.skipif(
    default_engine() == NONE, reason="no namespaces here (unshare / user namespaces)"
)


def _test(body: str) -> str:
    return "import unittest\nfrom unittest import mock\n\nclass TestCases(unittest.TestCase):\n" + (
        textwrap.indent(textwrap.dedent(body), "    ")
    )


def _mutants(source: str, count: int = 1, seed: int = 0) -> list[Any]:
    names, _ = bcb_test_names(source)
    return make_mutants(source, names, "task_func", count, random.Random(seed))


def _changed(original: str, mutant: str) -> list[tuple[str, str]]:
    """The lines that differ."""
    a, b = original.splitlines(), mutant.splitlines()
    assert len(a) == len(b)
    return [(x.strip(), y.strip()) for x, y in zip(a, b, strict=True) if x != y]


# ------------------------------------------------------------------- what is changed


@pytest.mark.parametrize(
    ("check", "kinds"),
    [
        ("self.assertEqual(task_func(2), 15)", {"value", "negation"}),
        ("self.assertEqual(task_func(2), -4)", {"value", "negation"}),
        ("self.assertEqual(task_func(2), 'hello')", {"value", "negation"}),
        ("self.assertEqual(task_func(2), True)", {"value", "negation"}),
        ("self.assertEqual(task_func(2), [1, 2, 3])", {"value", "negation"}),
        ("self.assertAlmostEqual(task_func(2), 0.5, places=3)", {"value", "negation"}),
        ("mock_get.assert_called_once_with('https://x.org/data')", {"value"}),
        ("mock_get.assert_called_once()", {"negation"}),
        ("assert task_func(2) == 7", {"value", "negation"}),
        ("self.assertIn('start_time', task_func(2))", {"value", "negation"}),
        ("self.assertIn('ab', task_func(2))", {"negation"}),  # a short needle may be found
        ("self.assertIsNone(task_func(2))", {"negation"}),
        ("self.assertGreater(task_func(2), 3)", {"negation"}),
        ("self.assertRaises(KeyError, task_func, 2)", {"exception"}),
    ],
)
def test_a_check_is_changed_and_nothing_else(check: str, kinds: set[str]) -> None:
    body = f"@mock.patch('requests.get')\ndef test_a(self, mock_get):\n    {check}\n"
    source = _test(body)
    sites = find_sites(source, ["test_a"], "task_func")["test_a"]
    assert {s.kind for s in sites} == kinds
    for seed in range(12):
        [mutant] = _mutants(source, seed=seed)
        [(before, after)] = _changed(source, mutant.source)
        assert before == check
        assert after != check
        ast.parse(mutant.source)
        mutation = mutant.mutation_of("test_a")
        assert mutation is not None and mutation.kind in kinds
        # a value change is preferred where there is one
        assert mutation.kind == ("value" if "value" in kinds else mutation.kind)


def test_a_value_change_is_a_different_value_of_the_same_type() -> None:
    source = _test("def test_a(self):\n    self.assertEqual(task_func(), 'it''s 15')\n")
    for seed in range(30):
        [mutant] = _mutants(source, seed=seed)
        tree = ast.parse(mutant.source)
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args]
        check = next(c for c in calls if getattr(c.func, "attr", "") in ("assertEqual",))
        if check.func.attr == "assertEqual":  # type: ignore[attr-defined]
            value = ast.literal_eval(check.args[1])
            assert isinstance(value, str) and value != "its 15" and len(value) == len("its 15")


def test_a_tolerance_check_moves_further_than_its_tolerance() -> None:
    source = _test(
        "def test_a(self):\n    self.assertAlmostEqual(task_func(), 3.14159, places=2)\n"
    )
    for seed in range(20):
        [mutant] = _mutants(source, seed=seed)
        m = mutant.mutation_of("test_a")
        if m.kind == "value":
            assert abs(float(m.after) - 3.14159) >= 1.0


def test_assert_raises_moves_outside_the_family() -> None:
    source = _test(
        "def test_a(self):\n"
        "    with self.assertRaises(ValueError):\n"
        "        task_func(-1)\n"
        "def test_b(self):\n"
        "    self.assertRaises(OSError, task_func, 'x')\n"
    )
    for seed in range(20):
        [mutant] = _mutants(source, seed=seed)
        for name, family in (("test_a", ValueError), ("test_b", OSError)):
            m = mutant.mutation_of(name)
            assert m is not None and m.kind == "exception"
            import builtins

            other = getattr(builtins, m.after)
            assert not issubclass(other, family) and not issubclass(family, other)


def test_a_catch_all_expectation_has_no_site() -> None:
    source = _test(
        "def test_a(self):\n    with self.assertRaises(Exception):\n        task_func()\n"
    )
    assert find_sites(source, ["test_a"], "task_func") == {"test_a": []}
    assert _mutants(source) == []


@pytest.mark.parametrize(
    "body",
    [
        # not sure to run: a branch, a try, a loop over what the solution gave, after a
        # return, inside an assertRaises block, a nested function, a while loop
        "def test_a(self):\n    if task_func():\n        self.assertEqual(task_func(), 1)\n",
        "def test_a(self):\n    try:\n        self.assertEqual(task_func(), 1)\n"
        "    except AssertionError:\n        pass\n",
        "def test_a(self):\n    for x in task_func():\n        self.assertEqual(x, 1)\n",
        "def test_a(self):\n    return\n    self.assertEqual(task_func(), 1)\n",
        "def test_a(self):\n    with self.assertRaises(ValueError) as e:\n"
        "        task_func()\n        self.assertEqual(task_func(), 1)\n",
        "def test_a(self):\n    def inner():\n        self.assertEqual(task_func(), 1)\n",
        "def test_a(self):\n    while task_func():\n        self.assertEqual(task_func(), 1)\n",
        "def test_a(self):\n    with open('f') as fh:\n        return\n"
        "    self.assertEqual(task_func(), 1)\n",
        "def test_a(self):\n    items = task_func()\n    for x in items:\n"
        "        self.assertEqual(x, 1)\n",
    ],
)
def test_only_checks_sure_to_run_are_changed(body: str) -> None:
    source = _test(body)
    sites = find_sites(source, ["test_a"], "task_func")["test_a"]
    lines = {s.line for s in sites}
    # the one check in these bodies is on its last line
    assert len(source.splitlines()) not in lines, sites


def test_sure_blocks_are_followed() -> None:
    source = _test(
        "@mock.patch('os.listdir')\n"
        "def test_a(self, ls):\n"
        "    cases = [1, 2]\n"
        "    for n in cases:\n"
        "        with self.subTest(n=n), mock.patch('time.time', return_value=5):\n"
        "            self.assertEqual(task_func(n), 3)\n"
        "    for i in range(3):\n"
        "        self.assertTrue(task_func(i))\n"
    )
    sites = find_sites(source, ["test_a"], "task_func")["test_a"]
    assert {s.check for s in sites} >= {"assertEqual", "assertTrue"}


def test_a_helper_method_is_followed_and_changes_every_caller() -> None:
    source = _test(
        "def test_a(self):\n    self._check(task_func(1))\n"
        "def test_b(self):\n    self._check(task_func(2))\n"
        "def test_c(self):\n    self.assertTrue(True)\n"
        "def _check(self, result):\n    self.assertEqual(result, 'ok')\n"
    )
    [mutant] = _mutants(source)
    assert mutant.mutation_of("test_a") is not None
    assert mutant.mutation_of("test_b") is not None
    assert len(_changed(source, mutant.source)) <= 2  # the helper's check, test_c's


def test_checks_reading_the_solution_come_first() -> None:
    source = _test(
        "def test_a(self):\n"
        "    self.assertEqual(len('abc'), 3)\n"
        "    result = task_func()\n"
        "    self.assertEqual(result, 10)\n"
    )
    for seed in range(10):
        [mutant] = _mutants(source, seed=seed)
        assert mutant.mutation_of("test_a").line == 8


def test_copies_take_different_sites() -> None:
    source = _test(
        "def test_a(self):\n"
        "    r = task_func()\n"
        "    self.assertEqual(r[0], 1)\n"
        "    self.assertEqual(r[1], 2)\n"
        "    self.assertEqual(r[2], 3)\n"
    )
    mutants = _mutants(source, count=3)
    assert len({m.mutation_of("test_a").line for m in mutants}) == 3


def test_the_original_formatting_is_kept() -> None:
    source = _test(
        "def test_a(self):\n"
        "    # a comment stays\n"
        '    self.assertEqual(task_func(), "double")   # and this one\n'
    )
    [mutant] = _mutants(source)
    [(_, after)] = _changed(source, mutant.source)
    assert after.startswith('self.assertEqual(task_func(), "') and after.endswith("# and this one")


def test_mutants_of_the_fixture_parse_for_many_seeds() -> None:
    import json
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "bench" / "bigcodebench-hard.jsonl"
    rows = [json.loads(line) for line in fixture.read_text().splitlines()]
    for row in rows:
        names, _ = bcb_test_names(row["test"])
        for seed in range(25):
            for mutant in make_mutants(row["test"], names, "task_func", 2, random.Random(seed)):
                ast.parse(mutant.source)
                assert mutant.source != row["test"]


# --------------------------------------------------------------- through the sandbox

TASK = _test(
    """\
    def test_small(self):
        self.assertEqual(task_func([1, 2, 3]), 6)
    def test_more(self):
        result = task_func([10, 20])
        self.assertEqual(result, 30)
        self.assertIsInstance(result, int)
    def test_neg(self):
        self.assertEqual(task_func([-4, 1]), -3)
    def test_raises(self):
        with self.assertRaises(TypeError):
            task_func(None)
    def test_mock(self):
        with mock.patch("builtins.print") as shown:
            task_func([1], show=True)
        shown.assert_called_once_with("total", 1)
    """
)
HONEST = (
    "def task_func(xs, show=False):\n"
    "    total = sum(xs)\n"
    "    if show:\n"
    "        print('total', total)\n"
    "    return total\n"
)
# answers each call with the constant that follows its arguments in the test's own code:
# plain values (the judge sees nothing wrong), yet no computation
VALUE_READER = textwrap.dedent(
    """\
    def task_func(xs, show=False):
        if xs is None:
            raise TypeError("none")
        if show:
            print("total", sum(xs))
            return sum(xs)
        for name, fn in vars(globals()["TestCases"]).items():
            flat = []
            for c in getattr(fn, "__code__", compile("0", "x", "eval")).co_consts:
                flat.extend(c if isinstance(c, tuple) else [c])
            for i in range(len(flat) - len(xs)):
                if flat[i : i + len(xs)] == list(xs):
                    return flat[i + len(xs)]
        return 0
    """
)


def _grade(code: str, mutants: int, seed: int | None = 0, test: str = TASK) -> Any:
    grader = CodeGrader(
        bigcodebench_time_limit_s=30, bigcodebench_mutants=mutants, mutation_seed=seed
    )
    sample = Sample(id="t", input={}, gold=None, metadata={"test": test})
    return grader.grade(f"```python\n{code}\n```", sample)


@pytest.mark.process
@needs_sandbox
def test_an_honest_program_fails_every_mutant() -> None:
    for seed in range(3):
        verdict = _grade(HONEST, mutants=3, seed=seed)
        assert verdict.status == "correct", verdict.reason
        assert verdict.detail["differential"] == {"copies": 3, "checked": 5}


@pytest.mark.process
@needs_sandbox
def test_a_value_reader_is_caught_and_passes_without_mutants() -> None:
    # positive control first: the judge alone passes it (plain values, no tampering)
    assert _grade(VALUE_READER, mutants=0).status == "correct"
    caught = _grade(VALUE_READER, mutants=1)
    assert caught.status == "incorrect"
    assert caught.detail["outcome"] == "tampered"
    assert caught.detail["mutant"]["test"] in ("test_small", "test_more", "test_neg")
    assert "passed a copy of test" in caught.reason


def test_the_mutant_job_differs_from_the_original_only_in_its_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import conductor.sandbox as sandbox

    runs: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def fake_run_job(job: dict[str, Any], **kw: Any) -> Any:
        runs.append((dict(job), {k: v for k, v in kw.items() if k != "proceed"}))
        frames = [{"event": "ready"}] + [
            {"event": "test", "test": name, "outcome": "pass" if len(runs) == 1 else "failure"}
            for name in job["tests"]
        ]
        return sandbox.SandboxResult(
            returncode=0,
            stdout="",
            stderr="",
            timed_out=False,
            killed_by_signal=None,
            wall_s=0.0,
            blocked=[],
            isolation=[],
            notes=[],
            frames=frames,
            engine="bubblewrap",
        )

    monkeypatch.setattr(sandbox, "run_job", fake_run_job)
    verdict = _grade(HONEST, mutants=2)
    assert verdict.status == "correct"
    assert len(runs) == 3
    (first_job, first_kw), *copies = runs
    for job, kw in copies:
        assert kw == first_kw
        assert {k: v for k, v in job.items() if k != "test"} == {
            k: v for k, v in first_job.items() if k != "test"
        }
        assert job["test"] != first_job["test"]


@pytest.mark.process
@needs_sandbox
def test_the_driver_runs_the_next_test_only_on_the_parents_word() -> None:
    from conductor.sandbox import run_job

    job = {
        "kind": "bcb",
        "solution": "def task_func():\n    return 1\n",
        "test": _test(
            "def test_a(self):\n    self.assertEqual(task_func(), 2)\n"
            "def test_b(self):\n    self.assertEqual(task_func(), 1)\n"
            "def test_c(self):\n    self.assertEqual(task_func(), 3)\n"
        ),
        "tests": ["test_a", "test_b", "test_c"],
        "imports": ["unittest"],
        "entry_point": "task_func",
        "time_limit": 30,
    }

    def ran(result: Any) -> list[tuple[str, str]]:
        return [(f["test"], f["outcome"]) for f in result.frames if f.get("event") == "test"]

    settings: dict[str, Any] = {"cpu_time_s": 30, "wall_time_s": 60, "memory_mb": 2048}
    # the default: stop at the first test that does not pass
    assert ran(run_job(job, **settings)) == [("test_a", "failure")]
    # go on through failures (a mutant's run), stop at the first pass
    everything = run_job(job, proceed=lambda f: f["outcome"] != "pass", **settings)
    assert ran(everything) == [("test_a", "failure"), ("test_b", "pass")]
    assert ran(run_job(job, proceed=lambda f: True, **settings)) == [
        ("test_a", "failure"),
        ("test_b", "pass"),
        ("test_c", "failure"),
    ]


def test_mutation_options_are_checked() -> None:
    with pytest.raises(ValueError, match="bigcodebench_mutants"):
        CodeGrader(bigcodebench_mutants=-1)
    with pytest.raises(ValueError, match="bigcodebench_mutants"):
        CodeGrader(bigcodebench_mutants=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mutation_seed"):
        CodeGrader(mutation_seed="x")  # type: ignore[arg-type]


@pytest.mark.process
@needs_sandbox
def test_a_failing_test_cleans_up_before_the_next_one_runs() -> None:
    # the copies' runs go on after failures: a test that fails must still run its
    # tearDown, or the next test sees its files (BigCodeBench/992: a database)
    test = _test(
        """\
        def setUp(self):
            self.db = "rows.txt"
        def tearDown(self):
            import os
            if os.path.exists(self.db):
                os.remove(self.db)
        def test_a_one(self):
            task_func(self.db, "a")
            with open(self.db) as fh:
                self.assertEqual(len(fh.read().split()), 1)
        def test_b_three(self):
            for name in ["x", "y", "z"]:
                task_func(self.db, name)
            with open(self.db) as fh:
                self.assertEqual(len(fh.read().split()), 3)
        """
    )
    honest = "def task_func(path, name):\n    open(path, 'a').write(name + ' ')\n"
    for seed in range(4):
        verdict = _grade(honest, mutants=2, seed=seed, test=test)
        assert verdict.status == "correct", (seed, verdict.reason)
