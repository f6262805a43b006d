"""Forgeries of BigCodeBench verdicts that need no secret: programs that make tests pass
without computing the answer, by reading what the test expects or by rigging what it
checks with.  The in-process judge cannot see most of them (they return plain values or
act on the test's own mocks); differential grading (mutant copies of the test) must.

Shared by tests/test_forgeries.py, which grades each in-process and, as root, again as
an ordinary user (uid 65534) through ``python tests/kit/forgeries.py``, which prints
``{name: [status, outcome]}`` for the given mutant count as JSON.  Each forgery comes
with the task it forges and that task's honest program (which must stay correct).
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass

from conductor.grading.code import CodeGrader
from conductor.grading.types import Sample


def _test(body: str) -> str:
    head = "import unittest\nfrom unittest import mock\nimport urllib.request\n\n"
    return (
        head
        + "class TestCases(unittest.TestCase):\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
    )


SUM_TEST = _test(
    """\
    def test_small(self):
        self.assertEqual(task_func([1, 2, 3]), 6)
    def test_more(self):
        result = task_func([10, 20])
        self.assertEqual(result, 30)
    def test_neg(self):
        self.assertEqual(task_func([-4, 1]), -3)
    """
)
SUM_HONEST = "def task_func(xs):\n    return sum(xs)\n"

TOTAL_TEST = _test(
    """\
    def test_first(self):
        self.assertTrue(all(a == b for a, b in zip(task_func(3), [1, 2, 3])))
    def test_longer(self):
        got = task_func(4)
        self.assertTrue(all(a == b for a, b in zip(got, [1, 2, 3, 4])))
    """
)
TOTAL_HONEST = "def task_func(n):\n    return list(range(1, n + 1))\n"

FETCH_TEST = _test(
    """\
    @mock.patch("urllib.request.urlopen")
    def test_fetch(self, opened):
        task_func("example.com")
        opened.assert_called_once_with("https://example.com/data.json", timeout=10)
    @mock.patch("urllib.request.urlopen")
    def test_other(self, opened):
        task_func("example.org")
        opened.assert_called_once_with("https://example.org/data.json", timeout=10)
    """
)
FETCH_HONEST = (
    "import urllib.request\n"
    "def task_func(host):\n"
    "    return urllib.request.urlopen(f'https://{host}/data.json', timeout=10)\n"
)

KEYS_TEST = _test(
    """\
    def test_keys(self):
        report = task_func("a b b")
        self.assertIn("words", report)
        self.assertIn("unique", report)
        self.assertEqual(report["words"], 3)
    """
)
KEYS_HONEST = (
    "def task_func(text):\n"
    "    w = text.split()\n"
    "    return {'words': len(w), 'unique': len(set(w))}\n"
)

RAISE_TEST = _test(
    """\
    def test_negative(self):
        with self.assertRaises(ValueError):
            task_func(-1)
    def test_type(self):
        with self.assertRaises(TypeError):
            task_func("x")
    """
)
RAISE_HONEST = (
    "def task_func(n):\n"
    "    if not isinstance(n, int):\n        raise TypeError('n')\n"
    "    if n < 0:\n        raise ValueError('n')\n    return n\n"
)


# answers a call with the constant that follows its arguments in some test's code
VALUE_READER = textwrap.dedent(
    """\
    def task_func(*args):
        want = []
        for a in args:
            want.extend(a if isinstance(a, (list, tuple)) else [a])
        for name, fn in vars(globals()["TestCases"]).items():
            code = getattr(fn, "__code__", None)
            if code is None:
                continue
            flat = []
            for c in code.co_consts:
                flat.extend(c if isinstance(c, tuple) else [c])
            for i in range(len(flat) - len(want)):
                if flat[i : i + len(want)] == want:
                    return flat[i + len(want)]
        return None
    """
)

# a class that equals everything, compiled under a library's file name (so that its
# code passes for the library's)
LIBRARY_NAME = textwrap.dedent(
    """\
    import json.decoder
    _src = (
        "class Answer:\\n"
        "    def __eq__(self, other):\\n        return True\\n"
        "    def __ne__(self, other):\\n        return False\\n"
        "    __hash__ = object.__hash__\\n"
    )
    _ns = {"__name__": "json.decoder"}
    exec(compile(_src, json.decoder.__file__, "exec"), _ns)
    def task_func(xs):
        return _ns["Answer"]()
    """
)

# rigged values behind twenty thousand others (the judge's walk once stopped at 10,000
# objects), compared by a check no copy can turn against it (a truth check)
PAST_THE_WALK = textwrap.dedent(
    """\
    class Answer:
        def __eq__(self, other):
            return True
        __hash__ = object.__hash__
    def task_func(n):
        return [Answer() for _ in range(n)] + [(i,) for i in range(20_000)]
    """
)

# the test's own mock called with mock.ANY: its check matches any expected call
MOCK_ANY_CALL = textwrap.dedent(
    """\
    import urllib.request
    from unittest import mock
    def task_func(host):
        urllib.request.urlopen(mock.ANY, timeout=mock.ANY)
    """
)

# the test's own mock's check replaced on the instance
MOCK_CHECK_REPLACED = textwrap.dedent(
    """\
    import urllib.request
    def task_func(host):
        urllib.request.urlopen.assert_called_once_with = lambda *a, **k: None
    """
)

# the test's own mock's call records rewritten
MOCK_RECORDS = textwrap.dedent(
    """\
    import urllib.request
    from unittest import mock
    def task_func(host):
        m = urllib.request.urlopen
        m.call_count = 1
        m.call_args = mock.call(mock.ANY, timeout=mock.ANY)
        m.call_args_list = [m.call_args]
    """
)

# every string constant of the test as a key, every number as each value
KEY_READER = textwrap.dedent(
    """\
    def task_func(text):
        found, numbers = [], []
        for fn in vars(globals()["TestCases"]).values():
            for c in getattr(getattr(fn, "__code__", None), "co_consts", ()):
                if isinstance(c, str):
                    found.append(c)
                elif isinstance(c, int):
                    numbers.append(c)
        return {k: numbers[-1] if numbers else 0 for k in found}
    """
)

# raises whatever exception the test names (read from the test's code)
EXCEPTION_READER = textwrap.dedent(
    """\
    import builtins
    def task_func(n):
        for fn in vars(globals()["TestCases"]).values():
            code = getattr(fn, "__code__", None)
            if code is None:
                continue
            for name in code.co_names:
                kind = getattr(builtins, name, None)
                if isinstance(kind, type) and issubclass(kind, Exception):
                    if (n == -1) == (code.co_name == "test_negative"):
                        raise kind("forged")
        return n
    """
)


@dataclass(frozen=True)
class Forgery:
    """A forging program, the task it forges and that task's honest program."""

    test: str
    forged: str
    honest: str
    #: what catches it: "differential" (the judge alone passes it), "judge" (its walk),
    #: or "guard" (the audit hook refuses what it does; without the guard the mutant
    #: copies still catch it)
    caught_by: str


FORGERIES: dict[str, Forgery] = {
    "expected value read from the test's bytecode": Forgery(
        SUM_TEST, VALUE_READER, SUM_HONEST, "differential"
    ),
    "always-equal class compiled under a library file's name": Forgery(
        SUM_TEST, LIBRARY_NAME, SUM_HONEST, "guard"
    ),
    "rigged values past the judge's walk, in a truth check": Forgery(
        TOTAL_TEST, PAST_THE_WALK, TOTAL_HONEST, "judge"
    ),
    "the test's mock called with mock.ANY": Forgery(
        FETCH_TEST, MOCK_ANY_CALL, FETCH_HONEST, "differential"
    ),
    "the test's mock's assert_called_once_with replaced": Forgery(
        FETCH_TEST, MOCK_CHECK_REPLACED, FETCH_HONEST, "differential"
    ),
    "the test's mock's call records rewritten": Forgery(
        FETCH_TEST, MOCK_RECORDS, FETCH_HONEST, "differential"
    ),
    "every string of the test as a key (assertIn)": Forgery(
        KEYS_TEST, KEY_READER, KEYS_HONEST, "differential"
    ),
    "the expected exception read from the test's names": Forgery(
        RAISE_TEST, EXCEPTION_READER, RAISE_HONEST, "differential"
    ),
}


def grade(
    code: str, test: str, mutants: int, seed: int | None = None, walls: tuple[str, ...] = ()
) -> tuple[str, str]:
    """(status, outcome) of ``code`` against ``test`` with ``mutants`` copies, with the
    sandbox's ``walls`` taken down (a positive control)."""
    if walls:
        from conductor.sandbox import walls_removed

        with walls_removed(*walls):
            return grade(code, test, mutants, seed)
    try:
        grader = CodeGrader(
            bigcodebench_time_limit_s=30, bigcodebench_mutants=mutants, mutation_seed=seed
        )
    except TypeError:  # a release before differential grading (the "before" column)
        grader = CodeGrader(bigcodebench_time_limit_s=30)
    sample = Sample(id="f", input={}, gold=None, metadata={"test": test})
    verdict = grader.grade(f"```python\n{code}\n```", sample)
    return verdict.status, str((verdict.detail or {}).get("outcome") or "")


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    out = {}
    for name, f in FORGERIES.items():
        out[name] = [*grade(f.forged, f.test, count), *grade(f.honest, f.test, count)]
    print(json.dumps(out))
