"""`conductor trace` on bench run directories made by a real `conductor bench`.

One run of 12 synthetic MATH items over 2 epochs, where the worker is right on every
fourth item, wrong on the next, answers nothing readable on the next and fails (HTTP 400)
on the last, so the listing holds each verdict; and one ``singles`` run of 4 items.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.benchkit import make_math_file, number_in
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, run_cli, worker, write_pool

from conductor.testing import FakeLLMServer, Fault

# Every test here starts a child process.
pytestmark = pytest.mark.process

N_ITEMS = 12
EPOCHS = 2


def _id(i: int) -> str:
    return f"math500/test/synthetic/{i}.json"


def _w0(request: Any) -> Any:
    i = number_in(request)
    if i % 4 == 1:
        return "\\boxed{-1}"
    if i % 4 == 2:
        return "I would rather not say."
    if i % 4 == 3:
        return Fault(400, "the model refused this request")
    return f"Easy. \\boxed{{{i}}}"


#: The verdict each item gets from ``_w0``.
EXPECTED = {0: "correct", 1: "incorrect", 2: "no_answer", 3: "run_failed"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    tmp = tmp_path_factory.mktemp("trace-bench")
    with FakeLLMServer() as server:
        server.script(CONDUCTOR_MODEL, [lists([0], ["Solve the problem."], [[]])])
        server.script("w0", _w0)
        server.script("w1", lambda r: f"\\boxed{{{number_in(r)}}}")
        workers = [worker(server, "w0"), worker(server, "w1")]
        pool = write_pool(tmp / "pool.yaml", pool_dict(server, workers))
        data = make_math_file(tmp / "math.jsonl", N_ITEMS)
        env = {"CONDUCTOR_CACHE_DIR": str(tmp / "cache")}
        common = ("bench", "math500", "--pool", str(pool), "--data", str(data))
        res = run_cli(*common, "--out", str(tmp / "run"), "--epochs", str(EPOCHS), env=env)
        assert res.returncode == 0, res.stderr
        res = run_cli(
            *common, "--out", str(tmp / "singles"), "--strategy", "singles", "--limit", "4",
            env=env,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    yield {"run": tmp / "run", "singles": tmp / "singles"}


def trace(*args: str | Path, columns: int = 200) -> subprocess.CompletedProcess[str]:
    return run_cli("trace", *(str(a) for a in args), columns=columns)


def error_line(res: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused command prints (exit 2)."""
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    return lines[0]


def rows(stdout: str) -> list[list[str]]:
    """The table rows of a listing: the cells of each line that starts with an id."""
    return [line.split() for line in stdout.splitlines() if line.startswith("math500/")]


def recorded(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "samples.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


# --------------------------------------------------------------------------- listing


def test_listing_shows_every_sample_with_its_verdict_and_the_counts(runs: dict[str, Path]) -> None:
    res = trace(runs["run"])
    assert res.returncode == 0, res.stderr
    # The verdicts are the run's own, not what this test expects them to be...
    truth = {
        (d["sample_id"], d["epoch"]): (d["grade"] or {}).get("status", "run_failed")
        for d in recorded(runs["run"])
    }
    # ... and those are what the fake worker was scripted to earn.
    assert truth == {(_id(i), e): EXPECTED[i % 4] for i in range(N_ITEMS) for e in range(EPOCHS)}
    shown = rows(res.stdout)
    assert {(r[0], int(r[1])): r[2] for r in shown} == truth
    assert len(shown) == N_ITEMS * EPOCHS  # one row per (sample, epoch), none twice
    # Natural order: item 2 before item 10, epoch 0 before epoch 1.
    order = [(r[0], int(r[1])) for r in shown]
    assert order == [(_id(i), e) for i in range(N_ITEMS) for e in range(EPOCHS)]
    # Steps: one step each, in the steps column.
    assert {r[3] for r in shown} == {"1"}
    summary = res.stdout.splitlines()[0]
    assert "12 samples × 2 epochs = 24 records" in summary
    counts = Counter(truth.values())
    for verdict, n in counts.items():
        assert f"{n} {verdict}" in summary
    assert f"conductor trace {runs['run']} --sample ID" in res.stdout


def test_listing_filters_by_verdict_and_limits_but_counts_the_whole_run(
    runs: dict[str, Path],
) -> None:
    res = trace(runs["run"], "--verdict", "incorrect")
    assert res.returncode == 0, res.stderr
    shown = rows(res.stdout)
    assert {r[0] for r in shown} == {_id(i) for i in range(N_ITEMS) if i % 4 == 1}
    assert {r[2] for r in shown} == {"incorrect"}
    assert "6 correct" in res.stdout.splitlines()[0]  # the summary is of the whole run

    res = trace(runs["run"], "--limit", "3")
    assert res.returncode == 0, res.stderr
    assert [(r[0], r[1]) for r in rows(res.stdout)] == [(_id(0), "0"), (_id(0), "1"), (_id(1), "0")]
    assert "21 more not shown" in res.stdout and "--limit" in res.stdout

    line = error_line(trace(runs["run"], "--verdict", "incorect"))
    assert "did you mean 'incorrect'" in line and "run_failed" in line
    # The options of the listing are refused where nothing is listed.
    assert "--verdict and --limit" in error_line(
        trace(runs["run"], "--sample", _id(0), "--limit", "2")
    )


@pytest.mark.parametrize("columns", [100, 80, 60, 40, 24])
def test_listing_never_cuts_an_id(runs: dict[str, Path], columns: int) -> None:
    res = trace(runs["run"], columns=columns)
    assert res.returncode == 0, res.stderr
    # Every id appears whole, at the start of a line, and no line wraps an id.
    starts = [ln.split()[0] for ln in res.stdout.splitlines() if ln.startswith("math500/")]
    assert sorted(set(starts)) == sorted(_id(i) for i in range(N_ITEMS))
    assert len(starts) == N_ITEMS * EPOCHS
    assert "…" not in "".join(ln for ln in res.stdout.splitlines() if "synthetic" in ln)
    text = res.stdout
    if columns >= 80:
        # Wide enough for the table: every verdict sits on its id's line.
        assert all(len(r) >= 5 for r in rows(text)), text
    else:
        # Too narrow: each id has a line of its own, the verdict on the next.
        lines = text.splitlines()
        for i, ln in enumerate(lines):
            if ln.startswith("math500/"):
                assert ln.strip() in {_id(k) for k in range(N_ITEMS)}
                assert re.search(r"correct|incorrect|no_answer|run_failed", lines[i + 1])


def test_a_singles_run_lists_each_worker(runs: dict[str, Path]) -> None:
    res = trace(runs["singles"])
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert "single-w0" in text and "single-w1" in text
    w0, w1 = text.split("single-w1")
    assert "4 samples: 1 correct · 1 incorrect · 1 no_answer · 1 run_failed" in w0
    assert "4 samples: 4 correct" in w1
    assert {r[1] for r in rows(w1)} == {"correct"}
    # A sample's trace shows it under each worker.
    res = trace(runs["singles"], "--sample", _id(1))
    assert res.returncode == 0, res.stderr
    w0, w1 = res.stdout.split("single-w1")
    assert "Grade: incorrect" in w0 and "Grade: correct" in w1


# --------------------------------------------------------------------------- one sample


def test_unknown_sample_gets_a_did_you_mean_and_the_count(runs: dict[str, Path]) -> None:
    line = error_line(trace(runs["run"], "--sample", "math500/test/synthetic/13.json"))
    assert line.startswith(f"error: {runs['run']}: no sample 'math500/test/synthetic/13.json'")
    assert "among its 12 samples" in line
    assert f"did you mean '{_id(3)}'" in line
    assert f"conductor trace {runs['run']} lists them" in line
    # Part of an id names the ids that hold it.
    line = error_line(trace(runs["run"], "--sample", "7.json"))
    assert f"did you mean '{_id(7)}'?" in line
    # Nothing close: no guess, still the count and how to list them.
    line = error_line(trace(runs["run"], "--sample", "zzzz"))
    assert "did you mean" not in line and "among its 12 samples" in line


def test_a_sample_trace_ends_with_gold_extracted_and_grade(runs: dict[str, Path]) -> None:
    res = trace(runs["run"], "--sample", _id(5), columns=100)
    assert res.returncode == 0, res.stderr
    text = res.stdout
    # Both epochs, in order, each with its grade after its steps and answer.
    assert text.index(f"sample {_id(5)} · epoch 0") < text.index(f"sample {_id(5)} · epoch 1")
    first = text.split(f"sample {_id(5)} · epoch 1")[0]
    assert first.index("Steps") < first.index("Answer") < first.index("Grade: incorrect")
    assert "gold: 5" in first and "extracted: -1" in first
    reason = next(d["grade"]["reason"] for d in recorded(runs["run"]) if d["sample_id"] == _id(5))
    assert f"verdict: incorrect — {reason}" in first

    res = trace(runs["run"], "--sample", _id(3), "--format", "tree")
    assert res.returncode == 0, res.stderr
    assert f"sample {_id(3)} · epoch 0" in res.stdout
    assert "Grade: run_failed" in res.stdout and "gold: 3" in res.stdout
    assert "not graded: the run failed" in res.stdout

    res = trace(runs["run"], "--sample", _id(2))
    assert "Grade: no_answer" in res.stdout and "extracted: (none)" in res.stdout


def test_json_needs_a_sample_and_keeps_the_grade(runs: dict[str, Path]) -> None:
    assert "--sample ID" in error_line(trace(runs["run"], "--format", "json"))
    res = trace(runs["run"], "--sample", _id(0), "--format", "json")
    assert res.returncode == 0, res.stderr
    first = json.loads(res.stdout.split("\n}\n")[0] + "\n}")
    assert first["gold"] == "0" and first["grade"]["status"] == "correct"


def test_a_torn_last_line_is_skipped_and_a_rewritten_sample_shows_once(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["run"], run)
    lines = recorded(run)
    again = next(d for d in lines if d["sample_id"] == _id(1) and d["epoch"] == 0)
    again["grade"] = {**again["grade"], "status": "correct", "score": 1.0}
    with (run / "samples.jsonl").open("a") as fh:
        fh.write(json.dumps(again) + "\n")
        fh.write('{"schema_version": 1, "rou')  # a run killed mid-write
    res = trace(run)
    assert res.returncode == 0, res.stderr
    shown = {(r[0], r[1]): r[2] for r in rows(res.stdout)}
    assert len(rows(res.stdout)) == N_ITEMS * EPOCHS
    assert shown[(_id(1), "0")] == "correct"  # the later record wins, as in the report
    assert "7 correct · 6 no_answer · 6 run_failed · 5 incorrect" in res.stdout
    assert "torn last line" in res.stderr


def test_a_record_file_is_traced_as_before(runs: dict[str, Path], tmp_path: Path) -> None:
    record = tmp_path / "one.json"
    record.write_text(json.dumps(recorded(runs["run"])[0]))
    res = trace(record)
    assert res.returncode == 0, res.stderr
    assert "Grade:" in res.stdout and "Question" in res.stdout
    assert "--verdict and --limit" in error_line(trace(record, "--limit", "2"))


def test_an_ask_record_has_no_grade_or_sample_lines(tmp_path: Path) -> None:
    from conductor.record import RunRecord, write_record

    path = tmp_path / "run.json"
    write_record(RunRecord(question="q", pool={}, conductor={}, settings={}), path)
    for fmt in ("table", "tree"):
        res = trace(path, "--format", fmt)
        assert res.returncode == 0, res.stderr
        assert "Question" in res.stdout
        assert "Grade" not in res.stdout and "sample " not in res.stdout


def test_a_run_with_no_samples_yet(tmp_path: Path) -> None:
    (tmp_path / "samples.jsonl").write_text("")
    res = trace(tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "no samples recorded yet"
    line = error_line(trace(tmp_path, "--sample", "x"))
    assert "no sample 'x'" in line and "holds no samples yet" in line


def test_the_samples_file_is_read_as_its_run_directory(runs: dict[str, Path]) -> None:
    res = trace(runs["run"] / "samples.jsonl", "--verdict", "no_answer")
    assert res.returncode == 0, res.stderr
    assert {r[0] for r in rows(res.stdout)} == {_id(i) for i in range(N_ITEMS) if i % 4 == 2}
