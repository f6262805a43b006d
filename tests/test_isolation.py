"""A native crash in one test fails that test alone and the run reaches its summary."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]


@pytest.mark.crash
def test_a_segfault_here_fails_this_test_alone() -> None:
    """Crashes the process it runs in on purpose: ``python -m pytest -m crash`` shows
    it failing, with the signal, while the other tests run and the summary prints."""
    ctypes.string_at(0)


SUITE = """
import ctypes, os, signal
import pytest

@pytest.mark.isolated
def test_before():
    assert True

@pytest.mark.isolated
def test_segfault():
    print("about to crash")
    ctypes.string_at(0)

@pytest.mark.isolated
def test_after_the_crash():
    assert 1 + 1 == 2

@pytest.mark.isolated
def test_killed():
    os.kill(os.getpid(), signal.SIGKILL)

@pytest.mark.isolated
def test_fails_normally():
    assert "expected" == "actual"

@pytest.mark.isolated
def test_skips():
    pytest.skip("not here")

@pytest.mark.slow
def test_slow_is_isolated_too():
    assert os.environ.get("CONDUCTOR_ISOLATED_REPORTS")

def test_in_the_parent():
    assert not os.environ.get("CONDUCTOR_ISOLATED_REPORTS")
"""


def _suite(pytester: pytest.Pytester) -> None:
    shutil.copy(Path(__file__).parent / "kit" / "isolation.py", pytester.path / "isolation.py")
    pytester.makeconftest('pytest_plugins = ["isolation"]\n')
    pytester.makeini("[pytest]\nmarkers =\n    slow: real model\n")
    pytester.makepyfile(test_suite=SUITE)


@pytest.mark.process
def test_crashes_fail_alone_and_the_summary_prints(pytester: pytest.Pytester) -> None:
    _suite(pytester)
    result = pytester.runpytest_subprocess("-rA")
    result.assert_outcomes(passed=4, failed=3, skipped=1)
    assert "PASSED test_suite.py::test_slow_is_isolated_too" in result.stdout.str()
    out = result.stdout.str()
    assert "FAILED test_suite.py::test_segfault" in out
    assert "died of SIGSEGV (signal 11) while this test ran" in out
    assert "about to crash" in out  # the crashed test's own output is shown
    assert "FAILED test_suite.py::test_killed" in out and "SIGKILL" in out
    assert "PASSED test_suite.py::test_after_the_crash" in out
    assert "assert 'expected' == 'actual'" in out  # an ordinary failure reads as usual
    assert result.ret == 1


@pytest.mark.process
def test_exitfirst_still_stops_at_the_first_failure(pytester: pytest.Pytester) -> None:
    _suite(pytester)
    result = pytester.runpytest_subprocess("-x")
    result.assert_outcomes(passed=1, failed=1)


@pytest.mark.process
def test_the_crash_test_runs_only_when_asked(pytester: pytest.Pytester) -> None:
    shutil.copy(Path(__file__).parent / "kit" / "isolation.py", pytester.path / "isolation.py")
    pytester.makeconftest('pytest_plugins = ["isolation"]\n')
    crash = "import ctypes, pytest\n\n@pytest.mark.crash\ndef test_c():\n    ctypes.string_at(0)\n"
    pytester.makepyfile(test_c=crash)
    pytester.runpytest_subprocess().assert_outcomes(skipped=1)
    asked = pytester.runpytest_subprocess("-m", "crash")
    asked.assert_outcomes(failed=1)
    assert "SIGSEGV" in asked.stdout.str()


@pytest.mark.process
def test_fixtures_of_the_parent_are_torn_down_around_isolated_tests(
    pytester: pytest.Pytester,
) -> None:
    shutil.copy(Path(__file__).parent / "kit" / "isolation.py", pytester.path / "isolation.py")
    pytester.makeconftest('pytest_plugins = ["isolation"]\n')
    first = """
import pytest

@pytest.fixture(scope="module")
def shared():
    yield "here"
    print("TORN DOWN first module")

def test_uses_it(shared):
    assert shared == "here"

@pytest.mark.isolated
def test_last_in_the_module():
    assert True
"""
    pytester.makepyfile(test_a=first, test_b="def test_next_module():\n    assert True\n")
    result = pytester.runpytest_subprocess("-s")
    result.assert_outcomes(passed=3)
    assert "TORN DOWN first module" in result.stdout.str()
