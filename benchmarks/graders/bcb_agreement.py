"""How often the code grader's BigCodeBench verdicts agree with the official harness.

Runs a small corpus (correct, wrong, slow, crashing, subprocess, library-heavy and
mock-heavy programs, plus forging attempts) through :class:`CodeGrader` and through the
official ``bigcodebench.eval.untrusted_check`` and prints both verdicts and the
agreement on the honest programs.  The forging attempts are expected to *disagree*: the
official harness passes them.

Needs the official evaluator: ``pip install --no-deps bigcodebench`` (its evaluation
code needs only numpy; the package's other dependencies serve generation).  Run from
the repository root::

    python benchmarks/graders/bcb_agreement.py [--time-limit 5] [--smoke]

``--smoke`` (CI, where the official package is not installed): without the package it
says so and exits 0; with it, only the first two programs are run.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from typing import Any

from conductor.grading.code import CodeGrader
from conductor.grading.types import Sample

UNITTEST = "import unittest\n"

# name -> (solution, test, honest): honest programs are what agreement is measured on
CORPUS: dict[str, tuple[str, str, bool]] = {
    "correct": (
        "def task_func(xs):\n    return sum(xs)\n",
        UNITTEST + "class TestCases(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertEqual(task_func([1, 2]), 3)\n"
        "    def test_b(self):\n        self.assertEqual(task_func([]), 0)\n",
        True,
    ),
    "wrong": (
        "def task_func(xs):\n    return 0\n",
        UNITTEST + "class TestCases(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertEqual(task_func([1, 2]), 3)\n",
        True,
    ),
    "crashing": (
        "def task_func(xs):\n    raise ValueError('boom')\n",
        UNITTEST + "class TestCases(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertEqual(task_func([1]), 1)\n",
        True,
    ),
    "slow": (
        "import time\ndef task_func(xs):\n    time.sleep(3600)\n",
        UNITTEST + "class TestCases(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertEqual(task_func([1]), 1)\n",
        True,
    ),
    "subprocess": (
        "import subprocess\ndef task_func(word):\n"
        "    done = subprocess.run(['echo', word], capture_output=True, text=True)\n"
        "    return done.stdout.strip()\n",
        UNITTEST + "class TestCases(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertEqual(task_func('hi'), 'hi')\n",
        True,
    ),
    "uses os without importing it (the module has it)": (
        "def task_func(name):\n    return os.path.basename(name)\n",
        UNITTEST + "class TestCases(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertEqual(task_func('/a/b.txt'), 'b.txt')\n",
        True,
    ),
    "pandas and mocks": (
        textwrap.dedent(
            """\
            import pandas as pd
            import requests
            def task_func(url):
                data = requests.get(url).json()
                return pd.DataFrame(data)
            """
        ),
        textwrap.dedent(
            """\
            import unittest
            from unittest.mock import patch
            import pandas as pd
            class TestCases(unittest.TestCase):
                @patch("requests.get")
                def test_a(self, get):
                    get.return_value.json.return_value = {"x": [1, 2]}
                    df = task_func("http://example.invalid")
                    pd.testing.assert_frame_equal(df, pd.DataFrame({"x": [1, 2]}))
                    get.assert_called_once_with("http://example.invalid")
            """
        ),
        True,
    ),
    "forged: return unittest.mock.ANY": (
        "from unittest import mock\ndef task_func(xs):\n    return mock.ANY\n",
        UNITTEST + "class TestCases(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertEqual(task_func([1, 2]), 3)\n",
        False,
    ),
    "forged: patch posixpath.exists": (
        "import posixpath\nposixpath.exists = lambda p: True\n"
        "def task_func(name):\n    return '/nonexistent/' + name\n",
        "import os\n" + UNITTEST + "class TestCases(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertTrue(os.path.exists(task_func('x')))\n",
        False,
    ),
    "forged: rigged objects in a DataFrame": (
        "import pandas as pd\nclass A:\n    def __eq__(self, o):\n        return True\n"
        "    __hash__ = object.__hash__\n"
        "def task_func(n):\n    return pd.DataFrame({'x': [A() for _ in range(n)]})\n",
        UNITTEST + "class TestCases(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertEqual(task_func(2)['x'].tolist(), [1, 2])\n",
        False,
    ),
}


def official(code: str, test: str, limit: float) -> str:
    """``pass`` / ``fail`` / ``timeout`` from the official harness."""
    import bigcodebench.eval as bcb_eval

    # untrusted_check reads its per-task limit from this module global (240 s)
    bcb_eval.TIMEOUT_LIMIT = limit
    stat, _details = bcb_eval.untrusted_check(
        code, test, "task_func", 30 * 1024, 30 * 1024, 10, min_time_limit=1, gt_time_limit=1
    )
    return str(stat)


def ours(grader: CodeGrader, code: str, test: str) -> str:
    sample = Sample(
        id="t", input={"question": "?"}, gold=None,
        metadata={"test": test, "entry_point": "task_func"},
    )  # fmt: skip
    verdict = grader.grade(f"```python\n{code}\n```", sample)
    outcome = verdict.detail.get("outcome") if verdict.detail else None
    return verdict.status + (f" ({outcome})" if outcome else "")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=5.0, help="per task, both sides")
    parser.add_argument(
        "--smoke", action="store_true", help="two programs; no official package: skip, exit 0"
    )
    args = parser.parse_args(argv)
    try:
        import bigcodebench.eval  # noqa: F401
    except ImportError:
        if args.smoke:
            print(
                "bcb_agreement: skipped, the official evaluator is not installed "
                "(pip install --no-deps bigcodebench)"
            )
            return 0
        print("the official evaluator is missing: pip install --no-deps bigcodebench")
        return 2
    options: dict[str, Any] = {"bigcodebench_time_limit_s": args.time_limit}
    grader = CodeGrader(**options)
    agree = honest = 0
    print(f"{'program':52} {'official':9} {'conductor':28} agree")
    cases = list(CORPUS.items())[: 2 if args.smoke else None]
    for name, (code, test, is_honest) in cases:
        t0 = time.monotonic()
        theirs = official(code, test, args.time_limit)
        mine = ours(grader, code, test)
        same = (theirs == "pass") == mine.startswith("correct")
        if is_honest:
            honest += 1
            agree += same
        wall = time.monotonic() - t0
        print(f"{name[:52]:52} {theirs:9} {mine[:28]:28} {'yes' if same else 'NO'} ({wall:.1f}s)")
    print(f"agreement on honest programs: {agree}/{honest}")
    return 0 if agree == honest else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
