"""The bench run directory's one reader of samples.jsonl: resume, the report and trace
agree on what a file with a rewritten sample, a garbled line and a torn tail holds."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from kit.records import record, round_of, write_run

from conductor.bench.claim import completed_keys
from conductor.runs.rundir import SAMPLES, SampleLines, iter_records, latest_lines, run_dirs
from conductor.runs.summary import summarize_run


@pytest.fixture
def messy_run(tmp_path: Path) -> Path:
    """s0 (incorrect, then rewritten as correct), s1, a garbled line and a torn tail."""
    plan = [round_of(0, [(0, [])])]
    recs = [
        record("s0", 0, "incorrect", plan, wall=1.0),
        record("s1", 0, "incorrect", plan, wall=1.0),
        record("s0", 0, "correct", plan, wall=1.0),
    ]
    run = write_run(tmp_path / "run", "conductor", recs)
    lines = (run / SAMPLES).read_text().splitlines(keepends=True)
    lines.insert(2, "{garbled\n")
    (run / SAMPLES).write_text("".join(lines) + '{"sample_id": "s2", "rou')
    return run


def test_lines_skip_what_is_not_a_record_and_say_where(
    messy_run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lines = SampleLines(messy_run / SAMPLES)
    with caplog.at_level(logging.WARNING, logger="conductor"):
        got = [(n, d["sample_id"]) for n, d in lines]
    assert got == [(1, "s0"), (2, "s1"), (4, "s0")]
    assert lines.skipped == 2
    assert "samples.jsonl:3: skipped a line that is not a JSON record" in caplog.text
    assert "samples.jsonl:5: skipped a torn last line" in caplog.text
    assert latest_lines(lines) == {2, 4}
    assert SampleLines(messy_run / "absent.jsonl").skipped == 0
    assert list(SampleLines(messy_run / "absent.jsonl")) == []


def test_report_trace_and_resume_read_the_same_samples(messy_run: Path) -> None:
    summary = summarize_run(messy_run)
    assert (summary.n_records, summary.skipped_lines) == (2, 2)
    assert summary.status_counts["correct"] == 1  # s0's last record wins
    latest = [
        (r.sample_id, r.grade["status"] if r.grade else None)
        for r in iter_records(messy_run / SAMPLES, latest=True)
    ]
    assert latest == [("s1", "incorrect"), ("s0", "correct")]
    assert len(list(iter_records(messy_run / SAMPLES))) == 3
    # Resume: the same pairs, and the torn tail is cut so appends stay line-aligned.
    assert completed_keys(messy_run) == {("s0", 0), ("s1", 0)}
    assert (messy_run / SAMPLES).read_text().endswith("\n")
    assert json.loads((messy_run / SAMPLES).read_text().splitlines()[-1])["sample_id"] == "s0"


def test_run_dirs_of_a_singles_run(tmp_path: Path) -> None:
    for worker in ("b", "a"):
        (tmp_path / f"single-{worker}").mkdir()
        (tmp_path / f"single-{worker}" / SAMPLES).write_text("")
    assert run_dirs(tmp_path, holding=SAMPLES) == [tmp_path / "single-a", tmp_path / "single-b"]
    assert run_dirs(tmp_path / "single-a", holding=SAMPLES) == [tmp_path / "single-a"]
    assert run_dirs(tmp_path) == []  # no config.json anywhere
