"""The suite's own plugins under pytest-xdist (the fast subset runs on two workers:
``python -m pytest -n 2 -m "not slow and not process and not long"``, README): the
isolation of native code (:mod:`kit.isolation`) and the ``process`` marker's check
(:mod:`kit.processes`) hold in each worker as they do in one process, and no test runs
twice."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytest.importorskip("xdist")
pytestmark = pytest.mark.process  # each runs a child pytest, and that its workers

KIT = Path(__file__).parent / "kit"

# Two modules of isolated tests, one of which crashes its child; each test writes its
# name and the process it ran in to ran.txt.
MODULE = """
import ctypes, os
import pytest

def _ran(name):
    with open({log!r}, "a") as fh:
        fh.write(f"{{name}} {{os.getpid()}} {{os.getppid()}}\\n")

@pytest.mark.isolated
def test_first():
    _ran("{mod}.first")

@pytest.mark.isolated
def test_crashes():
    _ran("{mod}.crashes")
    ctypes.string_at(0)

@pytest.mark.isolated
def test_after_the_crash():
    _ran("{mod}.after")

def test_here():
    _ran("{mod}.here")
"""


def _isolation_suite(pytester: pytest.Pytester) -> Path:
    shutil.copy(KIT / "isolation.py", pytester.path / "isolation.py")
    pytester.makeconftest('pytest_plugins = ["isolation"]\n')
    # Workers in addopts, so that the children read them too (they must not start workers).
    pytester.makeini("[pytest]\naddopts = -n 2 --dist loadfile\n")
    log = pytester.path / "ran.txt"
    for mod in ("a", "b"):
        pytester.makepyfile(**{f"test_{mod}": MODULE.format(log=str(log), mod=mod)})
    return log


def _ran(log: Path) -> list[tuple[str, int, int]]:
    rows = [line.split() for line in log.read_text().splitlines()]
    return [(name, int(pid), int(parent)) for name, pid, parent in rows]


@pytest.mark.parametrize("dist", ["loadfile", "load", "no"])
def test_isolated_tests_run_once_each_and_a_crash_fails_one(
    pytester: pytest.Pytester, dist: str
) -> None:
    log = _isolation_suite(pytester)
    workers = {"loadfile": [], "load": ["--dist", "load"], "no": ["-n", "0"]}[dist]
    result = pytester.runpytest_subprocess("-rA", *workers)
    result.assert_outcomes(passed=6, failed=2)
    out = result.stdout.str()
    # Counted in the reports above the summary: how much of the message the summary's
    # FAILED lines repeat depends on the terminal's width (CI's is wider than 80).
    reports = out.split("short test summary info")[0]
    assert reports.count("died of SIGSEGV (signal 11) while this test ran") == 2, out
    assert "FAILED test_a.py::test_crashes" in out and "FAILED test_b.py::test_crashes" in out
    ran = _ran(log)
    names = sorted(name for name, _, _ in ran)
    assert names == sorted(f"{m}.{t}" for m in "ab" for t in ("first", "crashes", "after", "here"))
    by_name = {name: (pid, parent) for name, pid, parent in ran}
    runners = {by_name[f"{mod}.here"][0] for mod in "ab"}
    for mod in "ab":
        first, crashed, after = (by_name[f"{mod}.{t}"] for t in ("first", "crashes", "after"))
        # every isolated test ran in a child, never in a process that runs plain tests
        assert not {first[0], crashed[0], after[0]} & runners
        # the test after a crash runs in a new child
        assert after[0] != crashed[0]
        if dist in ("loadfile", "no"):
            # whole modules: the child's parent runs the module's other tests, and the
            # isolated tests before a crash share one child
            assert {first[1], crashed[1], after[1]} == {by_name[f"{mod}.here"][0]}
            assert first[0] == crashed[0]


PROCESS_SUITE = """
import subprocess
import pytest

def test_unmarked_starts_a_child():
    subprocess.run(["true"], check=True)

@pytest.mark.process
def test_marked_starts_a_child():
    subprocess.run(["true"], check=True)

def test_unmarked_swallows_the_refusal():
    try:
        subprocess.run(["true"], check=True)
    except Exception:
        pass

def test_unmarked_starts_nothing():
    assert True
"""


@pytest.mark.parametrize("workers", [["-n", "2"], []], ids=["xdist", "one-process"])
def test_an_unmarked_test_that_starts_a_child_fails_in_every_worker(
    pytester: pytest.Pytester, workers: list[str]
) -> None:
    shutil.copy(KIT / "processes.py", pytester.path / "processes.py")
    pytester.makeconftest('pytest_plugins = ["processes"]\n')
    pytester.makeini("[pytest]\nmarkers =\n    process: starts a child process\n")
    pytester.makepyfile(test_p=PROCESS_SUITE, test_q=PROCESS_SUITE)
    result = pytester.runpytest_subprocess("-rA", *workers)
    result.assert_outcomes(passed=4, failed=4)
    out = result.stdout.str()
    for mod in ("test_p", "test_q"):
        assert f"FAILED {mod}.py::test_unmarked_starts_a_child" in out
        assert f"FAILED {mod}.py::test_unmarked_swallows_the_refusal" in out
    assert "started a child process" in out and "mark this test process" in out


def test_the_positive_control_without_the_plugin_lets_every_test_start_one(
    pytester: pytest.Pytester,
) -> None:
    """The same suite without :mod:`kit.processes`: all pass, so the failures above are
    the plugin's."""
    pytester.makeini("[pytest]\nmarkers =\n    process: starts a child process\n")
    pytester.makepyfile(test_p=PROCESS_SUITE, test_q=PROCESS_SUITE)
    pytester.runpytest_subprocess("-n", "2").assert_outcomes(passed=8)
