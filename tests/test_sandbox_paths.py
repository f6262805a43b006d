"""The sandbox sees what the user installed (issue 37): ``PYTHONPATH``, the user's
site-packages and its ``.pth`` entries are there, read-only, with the same ``sys.path``
as outside; a project directory on ``PYTHONPATH`` brings only what Python imports from
it (not its run directories); this checkout is not there; a module the interpreter
finds outside where the sandbox does not show it is the grader's error, not the
solution's."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from conductor.grading.code import CodeGrader
from conductor.grading.types import Sample
from conductor.sandbox import bubblewrap_available, missing_module, python_paths, run_sandboxed

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(not bubblewrap_available()[0], reason="bubblewrap unusable here"),
]
SYSTEM = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
needs_system = pytest.mark.skipif(
    not os.access(SYSTEM, os.X_OK), reason=f"no {SYSTEM} (its user site is what is tested)"
)
SECRET = "sk-paths-secret-0123456789"


def _package(top: Path, name: str, value: str) -> None:
    (top / name).mkdir(parents=True)
    (top / name / "__init__.py").write_text(f"VALUE = {value!r}\n")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory on PYTHONPATH: a package, a module, and a run directory and
    a data file beside them."""
    top = tmp_path / "project"
    _package(top, "mylib_pp", "from PYTHONPATH")
    (top / "helper_pp.py").write_text("WHERE = 'a module of PYTHONPATH'\n")
    (top / "runs" / "lcb").mkdir(parents=True)
    (top / "runs" / "lcb" / "samples.jsonl").write_text(SECRET + "\n")
    (top / "data.jsonl").write_text(SECRET + "\n")
    for path in [tmp_path, *top.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    top.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(top))
    return top


def test_pythonpath_is_seen_and_its_data_is_not(project: Path) -> None:
    code = f"""
    import sys, mylib_pp, helper_pp
    print(mylib_pp.VALUE, "|", helper_pp.WHERE, "|", {str(project)!r} in sys.path)
    for rel in ("runs/lcb/samples.jsonl", "data.jsonl"):
        try:
            print(open({str(project)!r} + "/" + rel).read())
        except OSError as exc:
            print("unreadable", type(exc).__name__)
    """
    res = run_sandboxed(textwrap.dedent(code))
    assert res.ok, res.stderr[-800:]
    assert "from PYTHONPATH | a module of PYTHONPATH | True" in res.stdout
    assert SECRET not in res.stdout
    assert res.stdout.count("unreadable") == 2


def test_this_checkout_is_not_seen() -> None:
    import conductor

    src = str(Path(conductor.__file__).resolve().parents[1])
    code = f"""
    import os, sys
    print(os.path.exists({src!r}), {src!r} in sys.path)
    try:
        import conductor
        print("imported")
    except ImportError:
        print("not importable")
    """
    res = run_sandboxed(textwrap.dedent(code))
    assert res.stdout.split() == ["False", "False", "not", "importable"], res


@pytest.fixture
def user_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``pip install --user`` into a private user base (PYTHONUSERBASE): a package, and
    a ``.pth`` file naming another directory."""
    base = tmp_path / "userbase"
    v = sys.version_info
    site = base / "lib" / f"python{v.major}.{v.minor}" / "site-packages"
    _package(site, "mylib_user", "from the user site")
    extra = tmp_path / "pth-target"
    _package(extra, "mylib_pth", "from a .pth entry")
    (site / "extra.pth").write_text(f"{extra}\n")
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    monkeypatch.setenv("PYTHONUSERBASE", str(base))
    monkeypatch.delenv("PYTHONNOUSERSITE", raising=False)
    return site


@needs_system
def test_user_site_and_pth_entries_are_seen(user_site: Path) -> None:
    code = "import mylib_user, mylib_pth; print(mylib_user.VALUE, '|', mylib_pth.VALUE)\n"
    res = run_sandboxed(code, python=SYSTEM)
    assert res.ok, res.stderr[-800:]
    assert res.stdout.strip() == "from the user site | from a .pth entry"


_NUMPY_TEST = textwrap.dedent(
    """\
    import unittest
    import numpy as np
    class TestCases(unittest.TestCase):
        def test_mean(self):
            self.assertAlmostEqual(task_func([1, 2, 3]), 2.0)
    """
)


@needs_system
def test_a_numpy_solution_on_pythonpath_is_graded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: numpy reached through PYTHONPATH (here this interpreter's
    site-packages, for the system's interpreter of the same version), graded correct."""
    import numpy

    monkeypatch.setenv("PYTHONPATH", str(Path(numpy.__file__).resolve().parents[1]))
    sample = Sample(
        id="np",
        input={"question": "?"},
        gold=None,
        metadata={"test": _NUMPY_TEST, "entry_point": "task_func"},
    )
    answer = "```python\nimport numpy as np\ndef task_func(xs):\n    return float(np.mean(xs))\n```"
    verdict = CodeGrader(python=SYSTEM, bigcodebench_time_limit_s=60).grade(answer, sample)
    assert verdict.status == "correct", verdict


_HIDING_FINDER = """\
import importlib.abc, importlib.util, os, sys
class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "mylib_hidden" or not os.path.exists({where!r}):
            return None
        return importlib.util.spec_from_file_location(name, {where!r})
sys.meta_path.append(_Finder())
"""


@needs_system
def test_a_module_the_sandbox_does_not_show_is_a_grader_error(
    user_site: Path, tmp_path: Path
) -> None:
    """A module found outside by a finder of the user's own (a ``.pth`` line), in a
    directory the sandbox does not bind: the solution's import fails inside, and the
    grader says why instead of grading the solution incorrect."""
    elsewhere = tmp_path / "elsewhere"
    _package(elsewhere, "mylib_hidden", "hidden")
    where = str(elsewhere / "mylib_hidden" / "__init__.py")
    (user_site / "_hiding_finder.py").write_text(_HIDING_FINDER.format(where=where))
    (user_site / "hiding.pth").write_text("import _hiding_finder\n")
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    res = run_sandboxed("import mylib_hidden\n", python=SYSTEM)
    assert "No module named 'mylib_hidden'" in res.stderr, res.stderr[-500:]
    why = missing_module(res.stderr, SYSTEM)
    assert why is not None and where in why and "mylib_hidden" in why
    # a module that is nowhere, one the sandbox shows, and this checkout: not the
    # sandbox's doing
    assert missing_module("No module named 'no_such_module_xyz'", SYSTEM) is None
    assert missing_module("No module named 'mylib_user'", SYSTEM) is None
    assert missing_module("No module named 'conductor'", sys.executable) is None

    test = "import unittest\nclass TestCases(unittest.TestCase):\n    def test_v(self):\n"
    test += "        self.assertEqual(task_func(), 'hidden')\n"
    sample = Sample(
        id="h",
        input={"question": "?"},
        gold=None,
        metadata={"test": test, "entry_point": "task_func"},
    )
    answer = "```python\ndef task_func():\n    import mylib_hidden\n"
    answer += "    return mylib_hidden.VALUE\n```"
    verdict = CodeGrader(python=SYSTEM, bigcodebench_time_limit_s=60).grade(answer, sample)
    assert verdict.status == "grader_error", verdict
    assert where in verdict.reason


def test_python_paths_sorts_what_it_binds(project: Path) -> None:
    paths = python_paths(sys.executable)
    assert str(project) in paths.sys_path
    assert str(project / "mylib_pp") in paths.bind
    assert str(project / "helper_pp.py") in paths.bind
    assert not any(p.startswith(str(project / "runs")) for p in paths.bind)
    assert str(project / "data.jsonl") not in paths.bind
    assert paths.shows(str(project / "mylib_pp" / "__init__.py"))
    assert not paths.shows(str(project / "runs" / "lcb" / "samples.jsonl"))
