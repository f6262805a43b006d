"""`conductor ask --strategy`: the baselines of bench and serve for one question, parsed
by the same parser, recorded and shown as a Conductor's run is."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from kit.poolkit import CONDUCTOR_MODEL, pool_dict, run_cli, worker, write_pool

from conductor.testing import FakeLLMServer


def two_worker_pool(tmp_path: Path, server: FakeLLMServer, w1_key: str | None = None) -> Path:
    """Workers w0 and w1 on ``server``; with ``w1_key``, w1 is a hosted model (no
    api_base) whose key is in that variable."""
    w1 = worker(server, "w1")
    if w1_key is not None:
        del w1["api_base"]
        w1["api_key_env"] = w1_key
    workers = [worker(server, "w0"), w1]
    return write_pool(tmp_path / "pool.yaml", pool_dict(server, workers))


def ask(
    *args: str, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_cli("ask", *args, env={"CONDUCTOR_CACHE_DIR": str(tmp_path / "c"), **(env or {})})


@pytest.mark.process
def test_a_vote_is_recorded_and_shown_like_a_conductor_run(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", ["I think 8.\nANSWER: 8", "ANSWER: 7", "So: ANSWER: 8"])
    pool = two_worker_pool(tmp_path, fake_server)
    out = tmp_path / "run.json"
    res = ask("What is 3 + 5?", "--pool", str(pool), "--strategy", "vote:3:w0",
              "--out", str(out), "--no-cache", tmp_path=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    stdout = res.stdout
    # The topology, the calls and the answer, as for the Conductor, with no plan call.
    assert "parallel" in stdout and "Totals: 3 calls" in stdout and "Answer" in stdout
    assert fake_server.requests_for(CONDUCTOR_MODEL) == []
    record = json.loads(out.read_text())
    assert record["conductor"] == {"backend": "strategy", "strategy": "vote:3:w0"}
    steps = record["rounds"][0]["steps"]
    assert [s["worker_id"] for s in steps] == ["w0", "w0", "w0"]
    # The majority of the short final answers, the earliest step's reply giving it (the
    # three calls run at once, so which step got which scripted reply is not fixed).
    assert record["votes"] == {"8": 2, "7": 1}
    eights = [s["answer"] for s in steps if s["answer"].endswith("ANSWER: 8")]
    assert len(eights) == 2 and record["final_answer"] == eights[0]
    assert record["status"] == "ok"


@pytest.mark.process
def test_moa_aggregates_every_workers_answer(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script("w0", ["Paris", "Final: Paris"])
    fake_server.script("w1", ["Lyon"])
    pool = two_worker_pool(tmp_path, fake_server)
    res = ask("Capital of France?", "--pool", str(pool), "--strategy", "moa", "--json",
              "--no-cache", tmp_path=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    record = json.loads(res.stdout)
    steps = record["rounds"][0]["steps"]
    assert [(s["worker_id"], s["visible_steps"]) for s in steps] == [
        ("w0", []),
        ("w1", []),
        ("w0", [0, 1]),
    ]
    aggregator = fake_server.requests_for("w0")[-1].messages[-1]["content"]
    assert "Paris" in aggregator and "Lyon" in aggregator
    assert record["final_answer"] == "Final: Paris"


@pytest.mark.process
@pytest.mark.parametrize("spelling", ["single:nobody", "vote:x:w0", "vote:3", "majority"])
def test_a_bad_strategy_is_refused_as_bench_refuses_it(
    tmp_path: Path, fake_server: FakeLLMServer, spelling: str
) -> None:
    pool = two_worker_pool(tmp_path, fake_server)
    asked = ask("q", "--pool", str(pool), "--strategy", spelling, tmp_path=tmp_path)
    benched = run_cli("bench", "smoke", "--pool", str(pool), "--strategy", spelling,
                      "--out", str(tmp_path / "run"))  # fmt: skip
    assert asked.returncode == benched.returncode == 2, asked.stderr
    said = " ".join(asked.stderr.split())
    assert f"--strategy {spelling}" in said or f"--strategy {spelling!r}" in said
    assert said == " ".join(benched.stderr.split())
    assert fake_server.requests == []


@pytest.mark.process
def test_options_of_the_conductor_and_singles_are_refused(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    pool = two_worker_pool(tmp_path, fake_server)
    for extra, said in (
        (["--conductor", "local"], "--conductor applies to --strategy conductor only"),
        (["--rounds", "2"], "--rounds applies to --strategy conductor only"),
        (["--max-steps", "2"], "--max-steps applies to --strategy conductor only"),
        (["--template", "compact"], "--template applies to --strategy conductor only"),
    ):
        res = ask("q", "--pool", str(pool), "--strategy", "single:w0", *extra, tmp_path=tmp_path)
        assert res.returncode == 2 and said in res.stderr, res.stderr
    res = ask("q", "--pool", str(pool), "--strategy", "singles", tmp_path=tmp_path)
    assert res.returncode == 2
    assert "--strategy single:WORKER" in " ".join(res.stderr.split())
    assert fake_server.requests == []


@pytest.mark.process
def test_only_the_keys_of_the_workers_it_calls_are_needed(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", ["ANSWER: 4"])
    pool = two_worker_pool(tmp_path, fake_server, w1_key="H18_UNSET_KEY")
    # w1 (a key not set) is not called by single:w0 ...
    res = ask("2 + 2?", "--pool", str(pool), "--strategy", "single:w0", "--no-cache",
              tmp_path=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    # ... and refused up front, in ask's words, by one that does call it.
    res = ask("2 + 2?", "--pool", str(pool), "--strategy", "moa", tmp_path=tmp_path)
    assert res.returncode == 2
    said = " ".join(res.stderr.split())
    assert "1 API key is not set, so nothing was sent: set H18_UNSET_KEY (for worker 'w1')" in said
    assert len(fake_server.requests) == 1


async def test_a_baseline_hands_over_its_record_as_soon_as_it_exists(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # What an interrupted `ask --strategy` keeps (--out): the record, filled in so far.
    from conductor.llm.caller import CallerSet
    from conductor.pool import load_pool
    from conductor.record import RunRecord
    from conductor.strategies import parse_strategy, short_answer_key

    fake_server.script("w0", ["ANSWER: 4"])
    pool = load_pool(two_worker_pool(tmp_path, fake_server))
    seen: list[tuple[RunRecord, int]] = []
    strategy = parse_strategy("single:w0", pool, CallerSet(None), vote_key=short_answer_key)
    try:
        record = await strategy.run(
            "2 + 2?", sample_index=0, on_record=lambda r: seen.append((r, len(r.rounds[0].steps)))
        )
    finally:
        await strategy.aclose()
    assert len(seen) == 1 and seen[0][0] is record
    assert seen[0][1] == 0  # handed over before the first step ran
    assert record.final_answer == "ANSWER: 4"
