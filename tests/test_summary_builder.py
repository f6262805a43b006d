"""The summary a bench writes as it writes its records (:class:`SummaryBuilder`): the
same figures as reading the run back (:func:`summarize_run`), through fresh runs,
replays from the sample cache, resumes and ``--retry-errors``, without reading
``samples.jsonl`` back after the last record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import pool_dict, worker, write_pool

from conductor.runs import summary as summary_module
from conductor.runs.summary import SummaryBuilder, read_summary, summarize_run, summary_to_dict
from conductor.testing import FakeLLMServer, FakeRequest
from conductor.testing.fake_script import Fault


def bench(args: list[str]) -> int:
    from conductor.cli import main

    try:
        main(["bench", *args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def same_as_read_back(run_dir: Path) -> dict[str, Any]:
    """``summary.json`` as the bench wrote it, checked against reading the run back."""
    written = summary_to_dict(read_summary(run_dir))
    assert written == summary_to_dict(summarize_run(run_dir))
    return written


@pytest.fixture
def pool_file(tmp_path: Path, fake_server: FakeLLMServer) -> Path:
    return write_pool(
        tmp_path / "pool.yaml",
        pool_dict(fake_server, [worker(fake_server, "w0"), worker(fake_server, "w1")]),
    )


def answers(request: FakeRequest) -> str | Fault:
    """Capitals refused (run_failed records), yes/no questions right, the rest wrong."""
    text = request.last_user_message
    if "capital" in text:
        return Fault(400, "refused")
    if "Sun" in text or "prime" in text:
        return "ANSWER: yes"
    return "ANSWER: no"


def test_a_fresh_run_scores_itself_without_reading_its_records_back(
    tmp_path: Path,
    fake_server: FakeLLMServer,
    pool_file: Path,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_server.set_default(answers)
    reads: list[Path] = []
    real = summary_module.summarize_run

    def counted(run_dir: Path) -> Any:
        reads.append(Path(run_dir))
        return real(run_dir)

    monkeypatch.setattr(summary_module, "summarize_run", counted)
    out = tmp_path / "run"
    code = bench(["smoke", "--pool", str(pool_file), "--strategy", "single:w0",
                  "--out", str(out), "--epochs", "2"])  # fmt: skip
    assert code == 0
    assert reads == []  # neither the session nor the report read samples.jsonl back
    written = same_as_read_back(out)
    assert written["n_records"] == 40 and written["epochs"] == 2
    counts = written["status_counts"]
    assert counts["run_failed"] > 0 and counts["correct"] + counts["incorrect"] > 0


def test_a_replayed_run_and_a_resumed_one_score_as_read_back(
    tmp_path: Path, fake_server: FakeLLMServer, pool_file: Path, cache_dir: Path
) -> None:
    fake_server.set_default(answers)
    first, second = tmp_path / "first", tmp_path / "second"
    base = ["smoke", "--pool", str(pool_file), "--strategy", "single:w1"]
    assert bench([*base, "--out", str(first)]) == 0
    same_as_read_back(first)
    # The same run again elsewhere: every sample is replayed from the sample cache.
    assert bench([*base, "--out", str(second)]) == 0
    replayed = [json.loads(x) for x in (second / "samples.jsonl").read_text().splitlines()]
    assert len(replayed) == 20 and all("replayed_from" in r for r in replayed)
    same_as_read_back(second)
    # A run cut short after 7 records, resumed: the builder starts from those 7.
    samples = first / "samples.jsonl"
    samples.write_text("".join(samples.read_text().splitlines(keepends=True)[:7]))
    assert bench(["--resume", str(first)]) == 0
    assert same_as_read_back(first)["n_records"] == 20


def test_retry_errors_scores_the_fresh_records_not_the_removed_ones(
    tmp_path: Path, fake_server: FakeLLMServer, pool_file: Path, cache_dir: Path
) -> None:
    fake_server.set_default(answers)
    out = tmp_path / "run"
    assert bench(["smoke", "--pool", str(pool_file), "--strategy", "single:w0",
                  "--out", str(out)]) == 0  # fmt: skip
    failed = same_as_read_back(out)["status_counts"]["run_failed"]
    assert failed > 0
    fake_server.set_default(lambda r: "ANSWER: 4")
    assert bench(["--resume", str(out), "--retry-errors"]) == 0
    after = same_as_read_back(out)
    assert after["n_records"] == 20 and after["status_counts"]["run_failed"] == 0


def test_a_builder_folds_a_file_with_a_rewritten_pair_and_a_broken_line(
    tmp_path: Path, fake_server: FakeLLMServer, pool_file: Path, cache_dir: Path
) -> None:
    fake_server.set_default(lambda r: "ANSWER: 4")
    out = tmp_path / "run"
    assert bench(["smoke", "--pool", str(pool_file), "--strategy", "single:w0",
                  "--out", str(out), "--limit", "4"]) == 0  # fmt: skip
    samples = out / "samples.jsonl"
    lines = samples.read_text().splitlines()
    # A pair recorded twice (the last line counts) and a line that is not JSON.
    samples.write_text("\n".join([*lines, "{not json", lines[0]]) + "\n")
    builder = SummaryBuilder(out)
    assert not builder.covers_file
    builder.read_existing()
    assert builder.covers_file
    built = summary_to_dict(builder.summary())
    assert built == summary_to_dict(summarize_run(out))
    assert built["n_records"] == 4 and built["skipped_lines"] == 1
