"""The BigCodeBench judge does not call honest programs tampered.

Run over the real data set's ground truths (benchmarks/graders/bcb_differential.py),
the in-process judge once refused about half the programs the official harness passes:
a library filling a cache on a class (matplotlib's ``Path._unit_rectangle``), a library
wrapping a method lazily (scikit-learn's ``set_output``), a test's ``patch.object`` of
an inherited method, a mock the test's own helper made coming back through a patched
call, a lazy object (django's settings) answering ``__class__`` by raising.  Each is a
case here, with the libraries this environment has; each forgery next to it (behaviour
replaced, a wrapper of the solution's, a library function put in another's place) is
still refused.
"""

from __future__ import annotations

import importlib.util
import textwrap
from typing import Any

import pytest

from conductor.grading.code import CodeGrader
from conductor.grading.types import Sample
from conductor.sandbox import NONE, default_engine

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(
        default_engine() == NONE, reason="no namespaces here (unshare / user namespaces)"
    ),
]


def _grade(solution: str, test: str) -> Any:
    grader = CodeGrader(bigcodebench_time_limit_s=60, bigcodebench_mutants=0)
    sample = Sample(id="t", input={}, gold=None, metadata={"test": textwrap.dedent(test)})
    return grader.grade(f"```python\n{textwrap.dedent(solution)}\n```", sample)


def _needs(*names: str) -> None:
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")


def test_a_library_filling_a_class_cache_is_not_tampering() -> None:
    _needs("matplotlib")
    verdict = _grade(
        """\
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        def task_func(n):
            fig, ax = plt.subplots()
            ax.bar(range(n), range(n))  # bars are unit rectangles, cached on Path
            return ax
        """,
        """\
        import unittest
        class TestCases(unittest.TestCase):
            def test_bars(self):
                ax = task_func(3)
                self.assertEqual(len(ax.patches), 3)
        """,
    )
    assert verdict.status == "correct", verdict.reason


def test_a_library_wrapping_a_method_lazily_is_not_tampering() -> None:
    _needs("sklearn", "numpy")
    verdict = _grade(
        """\
        import numpy as np
        from sklearn.preprocessing import StandardScaler
        def task_func(rows):
            return StandardScaler().fit_transform(np.array(rows, dtype=float))
        """,
        """\
        import unittest
        from unittest.mock import patch
        import numpy as np
        class TestCases(unittest.TestCase):
            def test_scaled(self):
                out = task_func([[1.0], [3.0]])
                self.assertEqual(out.tolist(), [[-1.0], [1.0]])
            @patch("sklearn.preprocessing.StandardScaler.fit_transform")
            def test_mocked(self, fit):
                fit.return_value = np.zeros((2, 1))
                self.assertEqual(task_func([[1.0], [3.0]]).tolist(), [[0.0], [0.0]])
        """,
    )
    assert verdict.status == "correct", verdict.reason


def test_a_test_patch_of_an_inherited_method_is_the_tests() -> None:
    verdict = _grade(
        """\
        from email.message import EmailMessage
        def task_func():
            msg = EmailMessage()
            msg.set_content("hello")
            return msg.get_content()
        """,
        """\
        import unittest
        from unittest.mock import patch
        from email.message import EmailMessage
        class TestCases(unittest.TestCase):
            @patch.object(EmailMessage, "get_content", return_value="mocked")
            def test_patched(self, get):
                self.assertEqual(task_func(), "mocked")
                get.assert_called_once()
        """,
    )
    assert verdict.status == "correct", verdict.reason


def test_a_mock_the_tests_helper_made_may_come_back() -> None:
    verdict = _grade(
        """\
        import json
        import urllib.request
        def task_func(url):
            return urllib.request.urlopen(url)
        """,
        """\
        import unittest
        from unittest.mock import patch, Mock
        def fake_open(*args, **kwargs):
            response = Mock()
            response.status = 200
            return response
        class TestCases(unittest.TestCase):
            @patch("urllib.request.urlopen", side_effect=fake_open)
            def test_response(self, opened):
                self.assertEqual(task_func("http://x").status, 200)
        """,
    )
    assert verdict.status == "correct", verdict.reason


# ---------------------------------------------------------- what is still refused

_EXISTS_TEST = """\
    import os
    import unittest
    class TestCases(unittest.TestCase):
        def test_file(self):
            path = task_func("out.txt")
            self.assertTrue(os.path.exists(path))
    """


@pytest.mark.parametrize(
    "forgery",
    [
        # a function of the solution's in the library's place
        "import os.path\nos.path.exists = lambda p: True\n",
        # a library's own function in another's place (any absolute path 'exists')
        "import posixpath\nposixpath.exists = posixpath.isabs\n",
        # a builtin in its place
        "import posixpath\nposixpath.exists = bool\n",
        # the old function wrapped by the solution
        "import functools, posixpath\n_old = posixpath.exists\n"
        "posixpath.exists = functools.wraps(_old)(lambda p: True)\n",
        # data in place of behaviour
        "import posixpath\nposixpath.exists = True\n",
    ],
)
def test_behaviour_put_in_a_librarys_place_is_tampering(forgery: str) -> None:
    solution = forgery + "def task_func(name):\n    return '/nowhere/' + name\n"
    verdict = _grade(solution, _EXISTS_TEST)
    assert verdict.status == "incorrect", verdict.reason
    assert verdict.detail["outcome"] in ("tampered", "runtime_error"), verdict.detail


def test_the_same_test_passes_an_honest_program() -> None:
    # the control of the test above: the check does pass where the file was made
    solution = (
        "import os\ndef task_func(name):\n"
        "    open(name, 'w').close()\n    return os.path.abspath(name)\n"
    )
    verdict = _grade(solution, _EXISTS_TEST)
    assert verdict.status == "correct", verdict.reason


def test_a_submodule_named_like_a_builtin_may_be_imported() -> None:
    # codecs imports encodings.ascii on first use: the package gets an attribute
    # ``ascii``, the name of a builtin, which the import system put there
    verdict = _grade(
        """\
        import codecs
        def task_func(text):
            return codecs.lookup("ascii").encode(text)[0]
        """,
        """\
        import unittest
        class TestCases(unittest.TestCase):
            def test_encoded(self):
                self.assertEqual(task_func("abc"), b"abc")
        """,
    )
    assert verdict.status == "correct", verdict.reason


def test_a_result_holding_methods_bound_from_builtins_is_walked() -> None:
    # an instance whose __dict__ holds a method bound from a builtin, over a method of
    # its class (matplotlib's axes keep some): there is no code to look at
    verdict = _grade(
        """\
        import types
        class Box:
            def __init__(self):
                self.items = [1, 2]
                self.size = types.MethodType(len, self.items)
            def size(self):
                return 0
        def task_func():
            return Box()
        """,
        """\
        import unittest
        class TestCases(unittest.TestCase):
            def test_box(self):
                self.assertEqual(task_func().size(), 2)
        """,
    )
    assert verdict.status == "correct", verdict.reason


def test_a_library_defining_a_namedtuple_with_defaults_lazily_is_not_refused() -> None:
    # namedtuple sets __new__.__defaults__ on the function it just made (pandas'
    # plotting does so when it is first used): a new function is its maker's
    verdict = _grade(
        """\
        import collections
        def task_func(n):
            Point = collections.namedtuple("Point", ["x", "y"], defaults=[0])
            return Point(n).y
        """,
        """\
        import unittest
        class TestCases(unittest.TestCase):
            def test_default(self):
                self.assertEqual(task_func(3), 0)
        """,
    )
    assert verdict.status == "correct", verdict.reason


def test_a_librarys_function_defaults_stay_the_librarys() -> None:
    # the control of the test above: the defaults of a function loaded before the
    # solution (here json.dumps') may not be rewritten by it
    verdict = _grade(
        """\
        import json
        def task_func(n):
            json.dumps.__kwdefaults__ = {"sort_keys": True}
            return n
        """,
        """\
        import unittest
        class TestCases(unittest.TestCase):
            def test_same(self):
                self.assertEqual(task_func(3), 3)
        """,
    )
    assert verdict.status == "incorrect", verdict.reason
    assert verdict.detail["outcome"] == "runtime_error", verdict.detail


def test_a_library_imported_lazily_may_set_a_code_flag() -> None:
    # asyncio's import runs types.coroutine, which sets a flag through code.replace:
    # a library's own code, not a crafted code object
    from conductor.sandbox import run_sandboxed

    res = run_sandboxed("import asyncio\nprint(asyncio.run(asyncio.sleep(0, 'ok')))")
    assert res.ok and res.stdout.strip() == "ok", res.stderr[-800:]
    crafted = run_sandboxed("c = (lambda: 1).__code__\nprint(c.replace(co_consts=(None, 2)))")
    assert not crafted.ok and crafted.blocked, crafted


def test_a_library_switching_its_own_private_slot_is_not_tampering() -> None:
    # pyparsing turns its packrat cache on by pointing ParserElement._parse at its own
    # _parseCache (matplotlib does it when it first parses a label)
    _needs("pyparsing")
    verdict = _grade(
        """\
        import pyparsing
        def task_func(text):
            pyparsing.ParserElement.enable_packrat()
            return pyparsing.Word(pyparsing.alphas).parse_string(text)[0]
        """,
        """\
        import unittest
        import pyparsing
        class TestCases(unittest.TestCase):
            def test_word(self):
                self.assertEqual(task_func("hello world"), "hello")
        """,
    )
    assert verdict.status == "correct", verdict.reason


def test_a_public_method_swapped_for_another_of_its_class_is_tampering() -> None:
    # the control: a name a test calls, pointed at another method of the same class
    verdict = _grade(
        """\
        import collections
        collections.Counter.most_common = collections.Counter.elements
        def task_func(text):
            return collections.Counter(text).most_common(1)
        """,
        """\
        import unittest
        import collections
        class TestCases(unittest.TestCase):
            def test_common(self):
                self.assertTrue(task_func("aab"))
        """,
    )
    assert verdict.status == "incorrect" and verdict.detail["outcome"] == "tampered", verdict


def test_a_name_bound_to_the_builtin_it_shadows_is_not_tampering() -> None:
    # six.moves binds range to range the first time it is asked (a lazy module)
    _needs("six")
    verdict = _grade(
        """\
        from six.moves import range as six_range
        def task_func(n):
            return list(six_range(n))
        """,
        """\
        import unittest
        import six
        class TestCases(unittest.TestCase):
            def test_range(self):
                self.assertEqual(task_func(3), [0, 1, 2])
        """,
    )
    assert verdict.status == "correct", verdict.reason
