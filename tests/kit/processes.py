"""A pytest plugin: a test that starts a child process must say so with ``process``.

The fast subset, ``python -m pytest -m "not slow and not process and not long"``, is the loop a
contributor runs after each change; it stays fast only while every test that starts a
child process (a ``python -m conductor`` run, a sandbox, a local-model host, a
``conductor serve`` process, a child pytest, a browser) is marked ``process``.  So a
test not marked ``process`` that starts one fails, in every run, with a sentence saying
what it started: a mis-marked test shows at once instead of slowing the loop unseen.

Tests marked ``isolated`` (and so ``slow`` and ``crash`` ones) run in a child pytest
process (:mod:`kit.isolation`) and are marked ``process`` here.  A whole file of process
tests says so once, with ``pytestmark = pytest.mark.process``.

Every way the standard library starts a process goes through the functions replaced
here, for the whole session (except the few children that belong to the session, not
to a test: :data:`SESSION_CHILDREN`): ``subprocess.Popen`` (and ``subprocess.run``,
``asyncio.create_subprocess_exec``, ``os.popen``), ``os.fork`` and ``os.forkpty`` (the
``fork`` start of ``multiprocessing``, ``pty.fork``, ``os.spawn*``), the
``posix_spawn`` calls, ``os.system`` and ``_posixsubprocess.fork_exec`` (the ``spawn``
and ``forkserver`` starts of ``multiprocessing``).  Outside a test (collection, the
child processes of :mod:`kit.isolation`) they work as ever.
"""

from __future__ import annotations

import _posixsubprocess
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Generator
from typing import Any

import pytest

MARKER = "process"
HINT = (
    "mark this test process (@pytest.mark.process, or pytestmark = pytest.mark.process "
    "for a file of them), or keep the work in this process; "
    'the fast subset (-m "not slow and not process and not long") runs no child process'
)


class ProcessNotAllowed(RuntimeError):
    """A test not marked ``process`` started a child process."""


#: The test whose setup, call or teardown runs now; ``None`` between tests.
_running: pytest.Item | None = None
#: What each test not marked ``process`` tried to start.
_attempts: dict[str, list[str]] = {}


#: Children that belong to the session, not to the test that happens to need them
#: first: the math grader's comparison processes (one pool per process, started on
#: first use and replaced after a timeout), the code grader's warm sandboxes (refilled
#: by a thread of their own) and the sandbox engines' one-time probes
#: (cached per process), and matplotlib's font list, built once per machine (then cached
#: under ~/.cache/matplotlib) by asking ``fc-list`` where fontconfig is installed (a
#: machine with Chromium has it).  Blaming whichever unmarked test comes first would make the
#: check depend on the order tests run in (a file run alone failed where the whole
#: suite passed).  Matched by the starting function's file and qualified name.
SESSION_CHILDREN: frozenset[tuple[str, str]] = frozenset(
    {
        ("conductor/grading/math_children.py", "_Child.__init__"),
        ("conductor/sandbox/_engine.py", "_probe_bwrap"),
        ("conductor/sandbox/_namespaces.py", "_probe"),
        # the warm sandboxes' refill thread: it may start the next one after the test
        # that took the last has ended, while an unmarked test runs
        ("conductor/sandbox/_warm.py", "WarmPool._fill"),
        ("matplotlib/font_manager.py", "_get_fontconfig_fonts"),
    }
)


def _session_child() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        name = code.co_filename.replace(os.sep, "/")
        for file, qualname in SESSION_CHILDREN:
            if code.co_qualname == qualname and name.endswith(file):
                return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _allowed() -> bool:
    if _running is None or _running.get_closest_marker(MARKER) is not None:
        return True
    return _session_child()


def _refuse(what: str) -> None:
    assert _running is not None
    _attempts.setdefault(_running.nodeid, []).append(what)
    raise ProcessNotAllowed(f"{_running.nodeid} started a child process ({what}): {HINT}")


def _guarded(what: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def guard(*args: Any, **kwargs: Any) -> Any:
        if not _allowed():
            _refuse(what)
        return original(*args, **kwargs)

    return guard


def _guarded_popen(original: Callable[..., Any]) -> Callable[..., Any]:
    def execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> Any:
        if not _allowed():
            _refuse(f"subprocess.Popen({args!r})")
        return original(self, args, *rest, **kwargs)

    return execute_child


def pytest_configure(config: pytest.Config) -> None:
    # The marker itself is declared in pyproject.toml, with ``slow``.
    # The standard library learns the processor's name from ``uname -p`` the first time
    # anything asks (the OpenAI client does, for its headers) and keeps it: asked here,
    # before any test, that one child process belongs to no test.
    platform.platform()
    setattr(  # noqa: B010 (the private method every Popen goes through)
        subprocess.Popen, "_execute_child", _guarded_popen(subprocess.Popen._execute_child)
    )
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            setattr(os, name, _guarded(f"os.{name}", getattr(os, name)))
    _posixsubprocess.fork_exec = _guarded(  # type: ignore[attr-defined]
        "_posixsubprocess.fork_exec", _posixsubprocess.fork_exec
    )


#: Markers of tests that run in a child pytest process (kit.isolation), so start one.
_IN_A_CHILD = ("isolated", "slow", "crash")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Runs before pytest's own hook deselects by marker (-m), so "not process" sees these.
    for item in items:
        if any(item.get_closest_marker(name) is not None for name in _IN_A_CHILD):
            item.add_marker(MARKER)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    global _running
    _running = item
    try:
        return (yield)
    finally:
        _running = None
        _attempts.pop(item.nodeid, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, pytest.TestReport, Any]:
    # The refusal may have been caught (code that falls back when a process cannot
    # start): the test fails all the same.
    # A test that failed otherwise (its code turned the refusal into an error) says why
    # beside its failure.
    report = yield
    tried = _attempts.pop(item.nodeid, None)
    if tried and report.passed:
        report.outcome = "failed"
        report.longrepr = f"started a child process ({'; '.join(tried)}): {HINT}"
    elif tried and report.failed:
        report.sections.append(("child processes refused", "\n".join([*tried, HINT])))
    return report
