"""Sandboxes started ahead of their job (:mod:`conductor.sandbox._warm`), and the test
driver that forks each test's child while the test before it runs.

What must hold: a warm sandbox runs exactly one job (each sample gets a fresh one: its
own PID namespace and tmpfs, nothing a sample before it left), nothing a test started
survives into the next test, and a pool hands each item out once.
"""

from __future__ import annotations

import itertools
import os
import textwrap
import threading
import time
from typing import Any

import pytest

from conductor.grading.code import CodeGrader
from conductor.grading.drivers import LIVECODEBENCH
from conductor.grading.types import Sample, Verdict
from conductor.sandbox import NONE, SandboxLimits, default_engine, run_job
from conductor.sandbox._warm import WarmPool

needs_os = pytest.mark.skipif(
    default_engine() == NONE, reason="no namespaces here (unshare / user namespaces)"
)

# Says which PID namespace and tmpfs it ran in, and whether a sample before it left a
# file or a process behind; then leaves both for the next sample to find.
SNOOP = textwrap.dedent(
    """\
    import os, json
    left = os.path.exists("left-behind")
    open("left-behind", "w").write("x")
    print(json.dumps({"pidns": os.readlink("/proc/self/ns/pid"), "left": left,
                      "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}))
    """
)


def _job(code: str, tests: int = 1) -> dict[str, Any]:
    return {
        "kind": "lcb",
        "solution": code,
        "prelude": "import json\n",
        "fn_name": None,
        "time_limit": 5,
        "output_limit": 100_000,
        "tests": [{"input": "", "testtype": "stdin"}] * tests,
    }


#: How long a wait on the pool's own thread may take before the test calls it a hang.
HANG_S = 30.0


def _wait_until(pool_ready: Any, timeout: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout
    while not pool_ready():
        assert time.monotonic() < deadline, "the pool's thread did not get there: a hang"
        time.sleep(0.02)


@pytest.mark.process
@needs_os
def test_each_job_gets_a_fresh_warm_sandbox() -> None:
    import json

    seen = []
    for n in range(4):
        # a pause, so that the next sandbox is ready (started ahead) when the job comes
        time.sleep(0.5 if n else 0)
        result = run_job(
            _job(SNOOP),
            driver=LIVECODEBENCH,
            preload="import json\n",
            warm=2,
            limits=SandboxLimits(cpu_time_s=5, wall_time_s=30),
        )
        tests = [f for f in result.frames if f.get("event") == "test"]
        assert len(tests) == 1, (result.frames, result.stderr)
        seen.append((result.started_ahead, json.loads(tests[0]["stdout"])))
    assert any(ahead for ahead, _ in seen[1:]), "no job took a sandbox started ahead"
    # nothing one job left (a file in its work dir) is there for the next
    assert [got["left"] for _, got in seen] == [False] * 4
    # every job ran in a PID namespace of its own: no two share one
    namespaces = [got["pidns"] for _, got in seen]
    assert len(set(namespaces)) == len(namespaces), namespaces


@pytest.mark.process
@needs_os
def test_a_process_a_test_leaves_is_gone_before_the_next_test() -> None:
    # Test 0 starts a process that would outlive it; test 1 looks for it.  The child of
    # test 1 was forked while test 0 ran, so the sweep between them must spare it alone.
    code = textwrap.dedent(
        """\
        import os, subprocess, sys
        if os.path.exists("pid"):
            try:
                stat = open("/proc/%s/stat" % open("pid").read()).read()
            except OSError:
                stat = ""
            # (a killed process may wait a moment to be reaped: a zombie is gone too)
            print("alive" if stat and stat.rsplit(")", 1)[1].split()[0] != "Z" else "gone")
        else:
            p = subprocess.Popen(["sleep", "60"])
            open("pid", "w").write(str(p.pid))
            print("gone")
        """
    )
    tests = [{"input": "", "output": "gone\n", "testtype": "stdin"}] * 3
    grader = CodeGrader(time_limit_s=5, allow_subprocess=True)
    sample = Sample(id="linger", input={}, gold=None, metadata={"tests": tests})
    verdict: Verdict = grader.grade(f"```python\n{code}```", sample)
    assert verdict.status == "correct", verdict.reason


@pytest.mark.process
@needs_os
def test_tests_still_run_one_after_another() -> None:
    # each test appends its start and end to a file; overlap would interleave them
    code = textwrap.dedent(
        """\
        import time
        with open("log", "a") as fh:
            fh.write("start\\n")
        time.sleep(0.05)
        with open("log", "a") as fh:
            fh.write("end\\n")
        print(open("log").read().count("start"))
        """
    )
    result = run_job(
        _job(code, tests=4),
        driver=LIVECODEBENCH,
        limits=SandboxLimits(cpu_time_s=5, wall_time_s=30),
    )
    outs = [f["stdout"].strip() for f in result.frames if f.get("event") == "test"]
    assert outs == ["1", "2", "3", "4"]


# ------------------------------------------------------------------ the pool itself


def test_a_pool_hands_each_item_out_once() -> None:
    made = itertools.count()
    ended: list[int] = []
    pool: WarmPool[int] = WarmPool(lambda: next(made), lambda _: True, ended.append, size=2)
    try:
        got = []
        for _ in range(20):
            _wait_until(lambda: pool.started >= pool.taken + 2)
            item = pool.take()
            if item is not None:
                got.append(item)
        assert len(got) >= 10
        assert len(set(got)) == len(got), "an item was handed out twice"
    finally:
        pool.close()
    # what was ready at the close is ended, never handed out
    assert not set(ended) & set(got)


def test_a_dead_item_is_not_handed_out() -> None:
    """An item that dies while it waits in the pool (a sandbox killed by the OOM killer)
    is ended by :meth:`WarmPool.take`, and the live one behind it is handed out."""
    dead: set[int] = set()
    ended: list[int] = []
    two_ready, release = threading.Event(), threading.Event()
    made = itertools.count()

    def start() -> int:
        n = next(made)
        if n == 2:
            # The fill thread asks for a third only once the first two are in the pool;
            # it waits here until the test is done, so the pool holds exactly those two.
            two_ready.set()
            release.wait(HANG_S)
        return n

    pool: WarmPool[int] = WarmPool(start, lambda i: i not in dead, ended.append, size=3)
    try:
        assert two_ready.wait(HANG_S), "the pool never asked for a third item"
        dead.add(0)  # the first ready item dies while it waits
        assert pool.take() == 1
        assert ended == [0]
        assert pool.take() is None  # the third is not made yet: nothing dead comes out
        assert pool.taken == 1
    finally:
        release.set()
        pool.close()


@pytest.mark.process
def test_a_forked_child_does_not_use_its_parents_pool() -> None:
    pool: WarmPool[int] = WarmPool(lambda: 1, lambda _: True, lambda _: None, size=1)
    try:
        _wait_until(lambda: pool.started >= 1)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.write(write, b"none" if pool.take() is None else b"item")
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(read, 4) == b"none"
        os.close(read)
        os.close(write)
    finally:
        pool.close()


# ------------------------------------------------------------------ grader slots


def test_grader_slots_default_above_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from conductor.bench import runconfig

    for cores, lowest in ((1, 4), (2, 8), (16, 64), (512, 64)):
        monkeypatch.setattr(runconfig.os, "cpu_count", lambda c=cores: c)
        slots = runconfig.BenchOptions(out_dir=runconfig.Path(".")).grader_concurrency
        # grading waits on sandboxed processes: more slots than cores, within bounds
        assert lowest <= slots <= 256 and slots > min(cores, 255), (cores, slots)
