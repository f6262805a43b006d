"""A pytest plugin: tests that run native code run in a child pytest process.

A segfault, an illegal instruction or the out-of-memory killer in llama.cpp or torch
would take the whole test run down with it: no summary line, every later test unrun.
Tests marked ``isolated`` (and every ``slow`` test: they run the real model) therefore
run in a child ``python -m pytest`` process, one child per module, and their reports
come back through pytest's own report serialisation (the hooks pytest-xdist uses), so
they show, count and fail exactly as if they had run here.  When a child dies, the test
it was running fails alone, with the signal and the child's last output, and the
module's remaining tests go on in a new child.

``crash``-marked tests crash on purpose, to show all this; they run only when asked
(``python -m pytest -m crash``).

Under pytest-xdist each worker does this for the tests it is sent.  A module's isolated
tests share one child only where the worker is sure to run all of them (``--dist
loadfile``); under any other distribution (``-n 2`` alone is ``--dist load``) each runs
in a child of its own, so that no test runs twice.  The child itself runs in one process
(``-n 0``)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: Set in a child: the file its reports go to (one JSON object a line).
CHILD_ENV = "CONDUCTOR_ISOLATED_REPORTS"
#: Set in a child when the parent was asked to run ``crash`` tests.
CRASH_ENV = "CONDUCTOR_RUN_CRASH_TESTS"
_OUTPUT_TAIL = 3000
_START = "[isolated test starts] "


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "isolated: runs in a child pytest process, so that a native crash fails this test alone",
    )
    config.addinivalue_line(
        "markers", "crash: crashes on purpose; runs only when asked (python -m pytest -m crash)"
    )
    reports = os.environ.get(CHILD_ENV)
    if reports:
        config.pluginmanager.register(_ChildReports(config, Path(reports)), "isolation-child")
    else:
        config.pluginmanager.register(_Isolator(config), "isolation-parent")


def _crash_tests_asked(config: pytest.Config) -> bool:
    return "crash" in (config.getoption("markexpr", "") or "") or os.environ.get(CRASH_ENV) == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    asked = _crash_tests_asked(config)
    for item in items:
        if item.get_closest_marker("crash") is not None:
            item.add_marker(pytest.mark.isolated)
            if not asked:
                item.add_marker(
                    pytest.mark.skip(
                        reason="crashes on purpose; run it with: python -m pytest -m crash"
                    )
                )
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.isolated)


class _ChildReports:
    """In a child: every report, serialised, appended to the parent's file at once (so
    what ran before a crash is known)."""

    def __init__(self, config: pytest.Config, path: Path) -> None:
        self.config = config
        self.out = path.open("a", encoding="utf-8")

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        # Where this test's output starts, for the parent to quote if the process dies.
        os.write(2, f"\n{_START}{nodeid}\n".encode())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.out.write(json.dumps(data) + "\n")
        self.out.flush()


def _coverage_env() -> dict[str, str]:
    """Where a child's coverage data goes when this run is measured (``--cov`` through
    ``PYTEST_ADDOPTS``, as CI measures it; the child inherits it): a data file of its own
    beside this run's, which pytest-cov combines into this run's at its end (it takes
    every ``.coverage.*`` there).  A child writing this run's file would erase the one
    before it."""
    coverage = sys.modules.get("coverage")
    current = coverage.Coverage.current() if coverage is not None else None
    if current is None:
        return {}
    data_file = os.path.abspath(str(current.get_option("run:data_file")))
    return {"COVERAGE_FILE": f"{data_file}.isolated-{os.getpid()}-{next(_CHILDREN)}"}


_CHILDREN = itertools.count()


#: The key of pytest-xdist's ``workerinput`` that tells a worker how tests are
#: distributed (a worker's own ``--dist`` reads ``no``).
_DIST = "conductor_isolation_dist"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, in the controller, for each worker it starts."""
    node.workerinput[_DIST] = node.config.getoption("dist")


def _runs_whole_files(config: pytest.Config) -> bool:
    """Whether this process runs all of each module it runs a test of: it is no
    pytest-xdist worker, or one sent whole files (``--dist loadfile``)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return True
    return bool(workerinput.get(_DIST) == "loadfile")


def _describe_death(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"died of {name} (signal {-returncode}) while this test ran"
    return f"exited with code {returncode} without running this test"


class _Isolator:
    """In the parent: runs each module's isolated tests in a child and replays them."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.done: dict[str, list[dict[str, Any]]] = {}
        self.items: list[pytest.Item] = []

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.items = items

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> bool | None:
        if item.get_closest_marker("isolated") is None or item.get_closest_marker("skip"):
            return None
        if item.nodeid not in self.done:
            self._run_module(item)
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for data in self.done.pop(item.nodeid):
            report = self.config.hook.pytest_report_from_serializable(config=self.config, data=data)
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        # What this process set up for the tests before (a module's fixtures) is torn
        # down as pytest would after this test, before it sets up the next one.  pytest
        # has no public call for this; SetupState is what its own runner uses.
        setup_state = getattr(item.session, "_setupstate", None)
        if setup_state is not None:
            setup_state.teardown_exact(nextitem)
        return True

    def _group(self, item: pytest.Item) -> list[pytest.Item]:
        """``item`` and the isolated tests of its module after it, in order (``item``
        alone where this process may not be the one to run the others)."""
        if not _runs_whole_files(self.config):
            return [item]
        start = self.items.index(item)
        return [
            other
            for other in self.items[start:]
            if other.path == item.path
            and other.get_closest_marker("isolated") is not None
            and other.get_closest_marker("skip") is None
            and other.nodeid not in self.done
        ]

    def _run_module(self, item: pytest.Item) -> None:
        todo = self._group(item)
        while todo:
            reports, returncode, output = self._child([i.nodeid for i in todo])
            finished = [
                i for i in todo if any(r["when"] == "teardown" for r in reports.get(i.nodeid, []))
            ]
            for done in finished:
                self.done[done.nodeid] = reports[done.nodeid]
            rest = [i for i in todo if i not in finished]
            if not rest:
                return
            if returncode >= 0:
                # It ended on its own without running them (a collection error, a usage
                # error): running them again would end the same way.
                for lost in rest:
                    self.done[lost.nodeid] = self._lost(lost, [], returncode, output)
                return
            lost = rest[0]  # the test the child was running when it died
            self.done[lost.nodeid] = self._lost(
                lost, reports.get(lost.nodeid, []), returncode, output
            )
            todo = rest[1:]

    def _child(self, nodeids: list[str]) -> tuple[dict[str, list[dict[str, Any]]], int, str]:
        with tempfile.TemporaryDirectory(prefix="pytest-isolated-") as tmp:
            path = Path(tmp) / "reports.jsonl"
            path.touch()
            env = {**os.environ, CHILD_ENV: str(path), **_coverage_env()}
            if _crash_tests_asked(self.config):
                env[CRASH_ENV] = "1"
            # tee-sys: what a test prints is both captured for its report and written to the
            # output, which is all that is left of it when the process dies.
            command = [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                "--capture=tee-sys",
                *(["-n", "0"] if self.config.pluginmanager.hasplugin("xdist") else []),
                *nodeids,
            ]
            with (Path(tmp) / "output.txt").open("w+b") as output:
                proc = subprocess.run(
                    command,
                    cwd=self.config.rootpath,
                    env=env,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                )
                output.seek(0)
                text = output.read().decode("utf-8", errors="replace")
            reports: dict[str, list[dict[str, Any]]] = {}
            for line in path.read_text(encoding="utf-8").splitlines():
                data = json.loads(line)
                # A skip's (file, line, reason) is a tuple to pytest; JSON made it a list.
                if isinstance(data.get("longrepr"), list):
                    data["longrepr"] = tuple(data["longrepr"])
                reports.setdefault(data["nodeid"], []).append(data)
        return reports, proc.returncode, text

    def _lost(
        self, item: pytest.Item, seen: list[dict[str, Any]], returncode: int, output: str
    ) -> list[dict[str, Any]]:
        """Reports for a test whose process went while it ran: what it reported, then a
        failure saying how the process ended."""
        marker = f"{_START}{item.nodeid}\n"
        own = output.rsplit(marker, 1)[-1] if marker in output else output
        tail = (
            own
            if len(own) <= _OUTPUT_TAIL
            else own[: _OUTPUT_TAIL // 2] + "\n...\n" + own[-_OUTPUT_TAIL // 2 :]
        )
        message = (
            f"the test process {_describe_death(returncode)}; the tests after it went on "
            f"in a new process.\n--- its last output ---\n{tail}"
        )
        base = {
            "$report_type": "TestReport",
            "nodeid": item.nodeid,
            "location": list(item.location),
            "keywords": {name: 1 for name in item.keywords},
            "sections": [],
            "duration": 0.0,
            "user_properties": [],
        }
        kept = [r for r in seen if r["when"] == "setup"]
        if not kept:
            kept = [{**base, "outcome": "passed", "longrepr": None, "when": "setup"}]
        return [
            *kept,
            {**base, "outcome": "failed", "longrepr": message, "when": "call"},
            {**base, "outcome": "passed", "longrepr": None, "when": "teardown"},
        ]
