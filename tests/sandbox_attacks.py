"""Attacks on code grading and on the sandbox, each with a check that it was stopped.

Shared by tests/test_sandbox_attacks.py, which runs them in-process (as whoever runs the
tests) and, where that is root, again as an ordinary user (uid 65534) through
``python tests/sandbox_attacks.py``, which prints ``{name: [defended, detail]}`` as JSON.

Grading attacks submit code that solves nothing and must not be graded ``correct``.
OS attacks run with ``allow_subprocess=True``: the child processes stand for code that
slipped past the in-process audit hook (native code, ``_posixsubprocess``), so only the
OS layer stands in the way.
"""

from __future__ import annotations

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

from conductor.bench.graders.code import CodeGrader
from conductor.bench.sandbox import run_sandboxed
from conductor.bench.types import Sample

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


def _sample(kind: str) -> Sample:
    if kind == "stdin":
        meta = {
            "public_test_cases": json.dumps(STDIN_TESTS[:1]),
            "private_test_cases": json.dumps(STDIN_TESTS[1:]),
        }
    elif kind == "call":
        meta = {"tests": CALL_TESTS, "fn_name": "twoSum"}
    else:
        meta = {"test": BCB_TEST, "entry_point": "task_func"}
    return Sample(id=kind, input={"question": "?"}, gold=None, metadata=meta)


def _graded(kind: str, code: str, unisolated: bool = False) -> Outcome:
    """Defended when cheating code is not graded correct."""
    options: dict[str, Any] = {"time_limit_s": 5, "bigcodebench_time_limit_s": 30}
    if unisolated:
        options["confirm_run_unsafe_code"] = True
    grader = CodeGrader(**options)
    verdict = grader.grade(f"```python\n{textwrap.dedent(code)}\n```", _sample(kind))
    return verdict.status != "correct", f"{verdict.status}: {verdict.reason[:120]}"


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
        for name in ("_untrusted", "_checked", "restore", "frame", "report"):
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


def grading_attack(name: str, unisolated: bool = False) -> Callable[[], Outcome]:
    """The attack ``name``; ``unisolated`` lets it run where no OS isolation exists."""
    kind, code = GRADING[name]
    return lambda: _graded(kind, code, unisolated)


# ------------------------------------------------------------------------- OS attacks

SECRET = "sk-conductor-test-" + uuid.uuid4().hex


def _os_parent_env() -> Outcome:
    # The key is in this process's environment and in the starting environment of
    # another process of the same user (as a bench's worker would hold it).
    os.environ["CONDUCTOR_FAKE_API_KEY"] = SECRET
    holder = subprocess.Popen(["sleep", "60"], env={**os.environ})
    try:
        code = (
            "import os, subprocess\n"
            "print(dict(os.environ))\n"
            "print(subprocess.run(['sh', '-c', 'cat /proc/[0-9]*/environ'],"
            " capture_output=True).stdout)\n"
        )
        res = run_sandboxed(code, allow_subprocess=True)
        leaked = SECRET in res.stdout + res.stderr
        return not leaked, "key visible" if leaked else "key not visible (env and /proc)"
    finally:
        del os.environ["CONDUCTOR_FAKE_API_KEY"]
        holder.kill()
        holder.wait()


def _outside() -> Path:
    return Path(tempfile.gettempdir()) / f"conductor-escape-{uuid.uuid4().hex}"


def _os_sqlite_write() -> Outcome:
    target = _outside()
    code = f"import sqlite3\nsqlite3.connect({str(target)!r}).execute('create table t(x)')\n"
    res = run_sandboxed(code)
    made = target.exists()
    target.unlink(missing_ok=True)
    return not made, "file created" if made else f"not created (rc {res.returncode})"


def _os_symlink_write() -> Outcome:
    target = _outside()
    code = (
        "import subprocess\n"
        f"subprocess.run(['ln', '-s', {str(target)!r}, 'link'])\n"
        "open('link', 'w').write('x')\n"
    )
    res = run_sandboxed(code, allow_subprocess=True)
    made = target.exists()
    target.unlink(missing_ok=True)
    return not made, "file created" if made else f"not created (rc {res.returncode})"


def _os_shell_write() -> Outcome:
    target = _outside()
    code = f"import subprocess\nsubprocess.run(['sh', '-c', 'echo x > {target}'])\n"
    run_sandboxed(code, allow_subprocess=True)
    made = target.exists()
    target.unlink(missing_ok=True)
    return not made, "file created" if made else "not created"


def _os_network() -> Outcome:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    inner = (
        f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=1);"
        f" s.sendall(b'{SECRET}')"
    )
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {inner!r}])\n"
    run_sandboxed(code, allow_subprocess=True, wall_time_s=10)
    try:
        conn, _ = srv.accept()
        conn.close()
        return False, "connected to 127.0.0.1"
    except TimeoutError:
        return True, "no connection reached 127.0.0.1"
    finally:
        srv.close()


def _os_kill_everything() -> Outcome:
    canary = subprocess.Popen(["sleep", "60"])
    try:
        targets = f"{os.getpid()} {canary.pid}"
        code = f"import subprocess\nsubprocess.run(['sh', '-c', 'kill -9 -1; kill -9 {targets}'])\n"
        run_sandboxed(code, allow_subprocess=True)
        alive = canary.poll() is None
        return alive, "bench and a process of the same user survive" if alive else "canary killed"
    finally:
        canary.kill()
        canary.wait()


def _os_see_processes() -> Outcome:
    code = "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    res = run_sandboxed(code)
    try:
        pids = json.loads(res.stdout)
    except ValueError:
        return False, f"unexpected output {res.stdout[:100]!r}"
    seen = os.getpid() in pids or len(pids) > 5
    return not seen, f"visible pids: {pids[:8]}"


def _os_home_secret() -> Outcome:
    home = Path(tempfile.mkdtemp(prefix="conductor-home-"))
    (home / "credentials").write_text(SECRET)
    old = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        code = (
            "import subprocess\n"
            f"print(subprocess.run(['cat', {str(home / 'credentials')!r}],"
            " capture_output=True).stdout)\n"
        )
        res = run_sandboxed(code, allow_subprocess=True)
        leaked = SECRET in res.stdout
        return not leaked, "read" if leaked else "home directory hidden"
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
    code = (
        "import subprocess, sys\n"
        f"r = subprocess.run([sys.executable, '-c', {_NESTED!r}, {str(target)!r}],"
        " capture_output=True, text=True)\n"
        "print(r.stdout, r.stderr)\n"
    )
    res = run_sandboxed(code, allow_subprocess=True)
    made = target.exists()
    target.unlink(missing_ok=True)
    return not made, "file created" if made else "mounts stay read-only: " + " ".join(
        res.stdout.split()
    )[:150]


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

ATTACKS: dict[str, Callable[[], Outcome]] = {
    **{name: grading_attack(name) for name in GRADING},
    **OS_ATTACKS,
}


def run_all() -> dict[str, Outcome]:
    return {name: attack() for name, attack in ATTACKS.items()}


if __name__ == "__main__":
    names = sys.argv[1:] or list(ATTACKS)
    print(json.dumps({name: ATTACKS[name]() for name in names}))
