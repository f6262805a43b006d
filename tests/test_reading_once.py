"""Reading a run's records once: the summary's single pass, the view's shared pass and
the list of samples read without the rounds' calls give what reading every record
whole gives, and refuse the same lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.records import JUDGE, SINGLE_G, record, round_of, write_run

from conductor.errors import RecordError
from conductor.record import RunRecord, record_to_dict
from conductor.render.samples import SampleListing
from conductor.runs.rundir import (
    SAMPLES,
    find_sample,
    iter_heads,
    iter_records,
    record_line,
    steps_run,
)
from conductor.runs.summary import summarize_run, summary_to_dict, write_summary
from conductor.view.data import load_runs


def records() -> list[RunRecord]:
    return [
        record("s1", 0, "correct", [round_of(0, SINGLE_G)], wall=1.0),
        record("s2", 0, "incorrect", [round_of(0, JUDGE)], wall=2.0, cost=0.03),
        record("s3", 0, "no_answer", [round_of(0, JUDGE, tries=2, parse_errors=1)], wall=3.0),
        record("s4", 0, "correct", [round_of(0, [(1, [])])], wall=4.0, unknown_calls=1),
    ]


def lines_of(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / SAMPLES).read_text().splitlines()]


def append(run: Path, *items: dict[str, Any] | str) -> None:
    with (run / SAMPLES).open("a", encoding="utf-8") as fh:
        for item in items:
            fh.write(item if isinstance(item, str) else record_line(item))


def scores(run: Path) -> dict[str, Any]:
    """The summary's numbers, less where and when it was made."""
    data = summary_to_dict(summarize_run(run))
    data.pop("run_dir")
    return data


# --------------------------------------------------------------------------- summary


def test_a_pair_recorded_twice_counts_its_last_record_as_a_file_of_last_records(
    tmp_path: Path,
) -> None:
    twice = write_run(tmp_path / "twice", "conductor", records())
    first = lines_of(twice)[1]  # s2, incorrect: rewritten correct, and cheaper
    again = {**first, "grade": {**first["grade"], "status": "correct", "score": 1.0}}
    again["totals"] = {**first["totals"], "cost_usd": 0.01}
    append(twice, again)
    once = write_run(tmp_path / "once", "conductor", [])
    append(once, *[d for i, d in enumerate(lines_of(twice)) if i != 1])
    for run in (twice, once):
        append(run, '{"schema_version": 1, "rou')  # and a torn last line
    assert scores(twice) == scores(once)
    assert scores(twice)["status_counts"]["correct"] == 3
    assert scores(twice)["skipped_lines"] == 1


def test_a_bad_record_is_refused_only_where_no_later_line_replaces_it(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", "conductor", records())
    bad = {**lines_of(run)[0], "totals": {"cost_usd": "a lot"}}
    (run / SAMPLES).write_text("".join(record_line(d) for d in [bad, *lines_of(run)[1:]]))
    # Later lines of other samples do not save it: the error names its line.
    with pytest.raises(RecordError, match=r"samples\.jsonl:1: totals\.cost_usd"):
        summarize_run(run)
    append(run, lines_of(run)[1] | {"totals": {"cost_usd": "a lot"}})  # s2 again, bad
    with pytest.raises(RecordError, match=r"samples\.jsonl:1: totals\.cost_usd"):
        summarize_run(run)
    fixed = write_run(tmp_path / "fixed", "conductor", records())
    append(fixed, lines_of(fixed)[0])  # s1 again, the bad line replaced
    (fixed / SAMPLES).write_text(
        "".join(record_line(d) for d in [bad, *lines_of(fixed)[1:]])
    )  # the first line bad, its last line good
    assert summarize_run(fixed).n_records == 4


# --------------------------------------------------------------------------- view


def test_the_view_shows_the_same_page_with_or_without_summary_json(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", "conductor", records())
    again = {**lines_of(run)[2], "totals": {**lines_of(run)[2]["totals"], "wall_s": 9.0}}
    append(run, again, "not json\n")

    def shown() -> tuple[Any, ...]:
        (view,) = load_runs([run])
        details = [view.details.detail(i) for i in range(view.details.count)]
        return view.overview, view.samples, details, view.label

    without = shown()
    summary = write_summary(run)
    assert summary.n_records == 4 and summary.skipped_lines == 1
    assert shown() == without
    assert without[0].samples == 4 and len(without[1]) == 4


# --------------------------------------------------------------------------- the list


def test_the_list_reads_what_whole_records_give(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", "conductor", records())
    append(run, "not json\n")
    whole = list(iter_records(run / SAMPLES))
    heads = list(iter_heads(run / SAMPLES))
    assert [steps for _head, steps in heads] == [steps_run(r) for r in whole] == [1, 3, 3, 1]
    for (head, _steps), rec in zip(heads, whole, strict=True):
        assert head.rounds == []
        assert (head.sample_id, head.epoch, head.verdict, head.totals) == (
            rec.sample_id,
            rec.epoch,
            rec.verdict,
            rec.totals,
        )
    listed, read = SampleListing(heads), SampleListing(whole)
    assert listed.rows == read.rows and listed.counts == read.counts


def test_the_list_refuses_what_it_shows_and_leaves_a_call_fault_to_the_sample(
    tmp_path: Path,
) -> None:
    run = write_run(tmp_path / "r", "conductor", records())
    data = lines_of(run)
    # A field the list shows, of the wrong type: refused as a whole record is.
    (run / SAMPLES).write_text(record_line({**data[0], "epoch": "zero"}))
    for read in (iter_heads, iter_records):
        with pytest.raises(RecordError, match=r"samples\.jsonl:1: record\.epoch must be"):
            list(read(run / SAMPLES))
    # Rounds not of the shape the count reads: the whole record's own error.
    (run / SAMPLES).write_text(record_line({**data[0], "rounds": [{"steps": "two"}]}))
    with pytest.raises(RecordError, match=r"samples\.jsonl:1: rounds\[0\]\.steps must be"):
        list(iter_heads(run / SAMPLES))
    # A fault inside a call is not the list's to find: it lists the sample, and
    # tracing that sample names the fault.
    broken = json.loads(json.dumps(data[1]))
    broken["rounds"][0]["steps"][0]["call"]["input_tokens"] = "many"
    (run / SAMPLES).write_text(record_line(data[0]) + record_line(broken))
    assert [h.sample_id for h, _ in iter_heads(run / SAMPLES)] == ["s1", "s2"]
    with pytest.raises(RecordError, match=r"samples\.jsonl:2: .*input_tokens"):
        find_sample(run, "s2")
    assert find_sample(run, "s1")[0][1].sample_id == "s1"


def test_a_record_of_the_wrong_schema_is_refused_by_the_list(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", "conductor", [])
    append(run, record_to_dict(records()[0]) | {"schema_version": 7})
    with pytest.raises(RecordError, match=r"samples\.jsonl:1: .*schema version 7"):
        list(iter_heads(run / SAMPLES))
