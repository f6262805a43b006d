"""A run record's own facts (benchmark, strategy, the sample's question, choices and
metadata, the answer form, votes, route, allowed workers, budget) are typed fields of
the record, written in schema version 2; records of version 1, which kept them in one
untyped ``metadata`` object, are read into the same fields.

``fixtures/records/version1.jsonl`` holds lines written by the version before the
fields (a routed and a voting bench record, three served records), as they were."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conductor.bench import samplecache
from conductor.errors import RecordError
from conductor.record import (
    SCHEMA_VERSION,
    BudgetRecord,
    RouteRecord,
    raw_field,
    record_from_dict,
    record_to_dict,
)
from conductor.runs.rundir import iter_records
from conductor.serve._protocol import conductor_field
from conductor.view.data import own_question, strategy_of

VERSION1 = Path(__file__).resolve().parent / "fixtures" / "records" / "version1.jsonl"


def _old() -> list[dict[str, Any]]:
    return [json.loads(line) for line in VERSION1.read_text().splitlines()]


def test_version_1_metadata_is_read_into_the_typed_fields() -> None:
    routed, voted, single, served_route, served_vote = (record_from_dict(d) for d in _old())
    assert routed.benchmark == "math500" and routed.strategy.startswith("router:")
    assert routed.sample_question == "What is 0 + 0?"
    assert routed.sample_metadata == {"subject": None, "level": None}
    assert routed.route == RouteRecord(
        "single:w0", {"single:w0": 0.995183, "single:w1": 0.004817}, False
    )
    assert voted.votes == {"0": 3} and voted.strategy == "vote:3:w0"
    assert single.allowed_workers == ["w1"] and single.benchmark is None
    assert single.budget == BudgetRecord(3, None, 1, 6e-05, None)
    assert served_route.route is not None and served_route.route.arm == "single:w1"
    assert served_vote.votes == {"6": 3}
    # What every reader sees of them, as it saw the metadata.
    assert own_question(voted) == "What is 0 + 0?" and own_question(single) is None
    assert [strategy_of(r) for r in (voted, single, served_route)] == [
        "vote:3:w0", "single:w1", "router",
    ]  # fmt: skip
    assert conductor_field([served_vote])["budget"] == {
        "max_calls": 64, "max_usd": 1.0, "calls": 3, "usd": 2.1e-05, "stopped": None,
    }  # fmt: skip


def test_a_version_1_record_is_written_in_version_2_with_the_same_facts() -> None:
    for old in _old():
        written = record_to_dict(record_from_dict(old))
        assert written["schema_version"] == SCHEMA_VERSION == 2
        assert "metadata" not in written
        moved = {
            "benchmark": "benchmark", "strategy": "strategy", "question": "sample_question",
            "choices": "sample_choices", "sample": "sample_metadata", "votes": "votes",
            "route": "route", "allowed_workers": "allowed_workers", "budget": "budget",
            "answer_format": "answer_format",
        }  # fmt: skip
        assert {k: written[moved[k]] for k in old["metadata"]} == old["metadata"]
        # Everything else is as it was, and reading it again changes nothing.
        rest = {k: v for k, v in old.items() if k not in ("metadata", "schema_version")}
        assert {k: written[k] for k in rest} == rest
        assert record_to_dict(record_from_dict(written)) == written


def test_every_old_key_has_its_field() -> None:
    old = {
        "schema_version": 1, "rounds": [], "question": "Q: which?\nA) x B) y",
        "pool": {}, "conductor": {}, "settings": {},
        "metadata": {
            "benchmark": "gpqa", "strategy": "single:a", "question": "which?",
            "choices": ["x", "y"], "sample": {"subject": "s"},
            "answer_format": {"tools": [{"type": "function"}]}, "votes": {"x": 2},
            "route": {"arm": "single:a", "chances": {"single:a": 1.0}, "fell_back": True},
            "allowed_workers": ["a"],
            "budget": {"max_calls": 2, "max_usd": 0.5, "calls": 2, "usd": 0.1,
                       "stopped": "call budget reached (2 calls)"},
        },
    }  # fmt: skip
    got = record_from_dict(old)
    assert (got.benchmark, got.strategy, got.sample_question) == ("gpqa", "single:a", "which?")
    assert got.sample_choices == ["x", "y"] and got.sample_metadata == {"subject": "s"}
    assert got.answer_format == {"tools": [{"type": "function"}]} and got.votes == {"x": 2}
    assert got.route == RouteRecord("single:a", {"single:a": 1.0}, True)
    assert got.allowed_workers == ["a"]
    assert got.budget == BudgetRecord(2, 0.5, 2, 0.1, "call budget reached (2 calls)")
    for field in ("sample_question", "sample_choices", "votes", "budget"):
        assert raw_field(old, field) is not None
        assert raw_field(record_to_dict(got), field) == raw_field(old, field)


@pytest.mark.parametrize(
    ("key", "field", "value"),
    [("question", "sample_question", 5), ("route", "route", "single:a"),
     ("route", "route", {"chances": {}}), ("budget", "budget", {"calls": "two"}),
     ("votes", "votes", ["x"]), ("allowed_workers", "allowed_workers", [1])],
)  # fmt: skip
def test_a_wrong_value_in_old_metadata_is_passed_over_in_a_new_field_refused(
    key: str, field: str, value: Any
) -> None:
    """Version 1 kept anything in ``metadata`` and its readers passed over a value of the
    wrong kind: such a record still reads (without that fact).  The same value in a
    version 2 field is damage, named by its place."""
    old = {
        "schema_version": 1, "rounds": [], "question": "q", "pool": {}, "conductor": {},
        "settings": {}, "metadata": {key: value, "strategy": "moa"},
    }  # fmt: skip
    got = record_from_dict(old)
    assert getattr(got, field) is None and got.strategy == "moa"
    new = {**record_to_dict(got), field: value}
    with pytest.raises(RecordError, match=rf"record\.{field}"):
        record_from_dict(new)


def test_a_new_field_wins_over_old_metadata_and_other_versions_are_refused() -> None:
    base = {"rounds": [], "question": "q", "pool": {}, "conductor": {}, "settings": {}}
    both = {**base, "schema_version": 1, "strategy": "new", "metadata": {"strategy": "old"}}
    assert record_from_dict(both).strategy == "new"
    # Version 2 has no metadata: a key of that name is not read.
    ignored = {**base, "schema_version": 2, "metadata": {"strategy": "old"}}
    assert record_from_dict(ignored).strategy is None
    for version in (0, 3, True, "2"):
        with pytest.raises(RecordError, match="versions 1 to 2"):
            record_from_dict({**base, "schema_version": version})


def test_a_cached_version_1_sample_is_replayed_in_version_2(tmp_path: Path) -> None:
    old = _old()[1]
    kept = {"line": json.dumps(old) + "\n", "run_id": old["run_id"]}
    replayed = samplecache.replayed_record(kept)
    assert replayed is not None
    line, record = replayed
    data = json.loads(line)
    assert data["schema_version"] == 2 and "metadata" not in data
    assert data["votes"] == {"0": 3} and data["replayed_from"]["run_id"] == old["run_id"]
    assert record.votes == {"0": 3}


def test_a_file_of_both_versions_reads_alike(tmp_path: Path) -> None:
    old = _old()
    path = tmp_path / "samples.jsonl"
    new = [record_to_dict(record_from_dict(d)) for d in old]
    path.write_text("".join(json.dumps(d) + "\n" for d in [*old, *new]))
    read = [record_to_dict(r) for r in iter_records(path)]
    assert read[: len(old)] == read[len(old) :] == new
