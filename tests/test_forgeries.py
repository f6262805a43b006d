"""Forged BigCodeBench passes that need no secret (tests/kit/forgeries.py) are caught by
differential grading, as root and as an ordinary user, in-process and end to end
through ``conductor bench`` and ``conductor report``.

Each forgery that the judge alone lets through has its positive control: graded with
the mutant copies switched off (``bigcodebench_mutants: 0``) it is ``correct``, so a
grader that caught nothing could not pass these tests.  Each forgery's task has an
honest program too, which must stay ``correct`` with the copies on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kit.clock import scaled
from kit.forgeries import FORGERIES, grade
from kit.sandbox_escapes import NOBODY, run_as_nobody

from conductor.sandbox import NONE, default_engine
from conductor.testing import FakeLLMServer

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(
        default_engine() == NONE, reason="no namespaces here (unshare / user namespaces)"
    ),
]


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_forgery_is_never_correct(name: str) -> None:
    forgery = FORGERIES[name]
    for seed in (0, 1):
        status, outcome = grade(forgery.forged, forgery.test, mutants=1, seed=seed)
        assert status != "correct", (name, seed)
        expected = "tampered" if forgery.caught_by == "differential" else "runtime_error"
        assert outcome == expected, (name, seed, outcome)


@pytest.mark.parametrize("name", [n for n, f in FORGERIES.items() if f.caught_by == "differential"])
def test_positive_control_the_judge_alone_passes_it(name: str) -> None:
    forgery = FORGERIES[name]
    assert grade(forgery.forged, forgery.test, mutants=0) == ("correct", "")


@pytest.mark.parametrize("name", [n for n, f in FORGERIES.items() if f.caught_by == "guard"])
def test_positive_control_without_the_guard_only_the_copies_catch_it(name: str) -> None:
    forgery = FORGERIES[name]
    assert grade(forgery.forged, forgery.test, mutants=0, walls=("guard",)) == ("correct", "")
    assert grade(forgery.forged, forgery.test, mutants=1, walls=("guard",)) == (
        "incorrect",
        "tampered",
    )


@pytest.mark.parametrize("name", list(FORGERIES))
def test_the_honest_program_of_each_task_stays_correct(name: str) -> None:
    forgery = FORGERIES[name]
    for seed in (0, 1, 2):
        assert grade(forgery.honest, forgery.test, mutants=2, seed=seed) == ("correct", ""), seed


def test_every_forgery_is_caught_for_an_ordinary_user() -> None:
    got = run_as_nobody(REPO / "tests" / "kit" / "forgeries.py", ["1"])
    if isinstance(got, str):
        pytest.skip(got)
    for name, (status, _outcome, honest, _) in got.items():
        assert status != "correct", f"{name} (uid {NOBODY})"
        assert honest == "correct", f"{name}: its honest program (uid {NOBODY})"


# ------------------------------------------------------------------- end to end


def _rows(path: Path) -> dict[str, str]:
    """A BigCodeBench file in the data set's schema: each forgery's task twice, once
    answered by the forgery and once by its honest program; key -> answer."""
    answers: dict[str, str] = {}
    with path.open("w", encoding="utf-8") as fh:
        for n, forgery in enumerate(FORGERIES.values()):
            for kind, code in (("forged", forgery.forged), ("honest", forgery.honest)):
                key = f"{kind}{n}"
                answers[key] = code
                row = {
                    "task_id": f"BigCodeBench/{key}",
                    "complete_prompt": f"TASK:{key}\ndef task_func():\n",
                    "instruct_prompt": f"TASK:{key}",
                    "canonical_solution": "    pass\n",
                    "code_prompt": "def task_func():\n",
                    "test": forgery.test,
                    "entry_point": "task_func",
                    "doc_struct": "{}",
                    "libs": "[]",
                }
                fh.write(json.dumps(row) + "\n")
    return answers


def test_bench_and_report_count_only_the_honest(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    from kit.poolkit import pool_dict, worker, write_pool

    answers = _rows(tmp_path / "tasks.jsonl")

    def answer(request: Any) -> str:
        key = request.messages[-1]["content"].split("TASK:", 1)[1].split()[0]
        return f"```python\n{answers[key]}```"

    fake_server.script("w0", answer)
    pool = write_pool(tmp_path / "pool.yaml", pool_dict(fake_server, [worker(fake_server, "w0")]))
    env = {
        **os.environ,
        "CONDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
        "COLUMNS": "200",
    }
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "conductor", "bench", "bigcodebench-hard",
         "--pool", str(pool), "--data", str(tmp_path / "tasks.jsonl"),
         "--strategy", "single:w0", "--out", str(out)],
        capture_output=True, text=True, timeout=900, env=env, cwd=str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    by_key = {r["sample_id"].split("/")[-1].rsplit("-", 1)[0]: r["grade"] for r in records}
    assert len(by_key) == 2 * len(FORGERIES), sorted(by_key)
    for key, grade_ in by_key.items():
        if key.startswith("honest"):
            assert grade_["status"] == "correct", (key, grade_)
        else:
            assert grade_["status"] == "incorrect", (key, grade_)
    report = subprocess.run(
        [sys.executable, "-m", "conductor", "report", str(out)],
        capture_output=True, text=True, timeout=scaled(300), env=env,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr[-2000:]
    assert "50.00" in report.stdout or "50.0" in report.stdout, report.stdout[-2000:]
