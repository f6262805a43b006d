"""One step body for the Conductor's workflows and the baselines: budgets, events, records."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, worker, write_pool

from conductor.conductors.spec import resolve_conductor
from conductor.context import SharedStep, build_worker_messages
from conductor.events import Event
from conductor.execute import Orchestrator, RunSettings
from conductor.llm.caller import CallerSet
from conductor.llm.types import Message
from conductor.pool import Pool, load_pool
from conductor.record import CallRecord, RoundRecord, RunRecord, StepRecord, record_to_dict
from conductor.steps import INTERRUPTED, Budget, StepPlan, StepRunner, run_to_record
from conductor.strategies import REFLECT_INSTRUCTION, answer_key_for, parse_strategy
from conductor.testing import FakeLLMServer, Fault

QUESTION = "What is 1 + 2?"


def make_pool(tmp_path: Path, server: FakeLLMServer, n: int = 2, **extra: Any) -> Pool:
    workers = [worker(server, f"w{i}", **extra) for i in range(n)]
    return load_pool(write_pool(tmp_path / "pool.yaml", pool_dict(server, workers)))


def step_dict(step: StepRecord, *drop: str) -> dict[str, Any]:
    """``step`` as a run record writes it, without the fields that differ from run to
    run (times) and the fields of its call named in ``drop``."""
    record = RunRecord(question=QUESTION, pool={}, conductor={}, settings={})
    record.rounds.append(RoundRecord(index=0, steps=[step]))
    out: dict[str, Any] = json.loads(json.dumps(record_to_dict(record)))["rounds"][0]["steps"][0]
    for key in ("started_at", "finished_at", "latency_s", "queue_s", *drop):
        out["call"].pop(key)
    return out


async def test_vote_under_a_call_budget_makes_exactly_that_many_calls(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", "Three. \\boxed{3}")
    pool = make_pool(tmp_path, fake_server)
    strat = parse_strategy(
        "vote:5:w0",
        pool,
        CallerSet(None),
        vote_key=answer_key_for("math"),
        settings=RunSettings(max_calls=2),
    )
    try:
        record = await strat.run(QUESTION, sample_index=0)
    finally:
        await strat.aclose()
    assert len(fake_server.requests_for("w0")) == 2
    steps = record.rounds[0].steps
    assert [s.status for s in steps] == ["ok", "ok", "skipped", "skipped", "skipped"]
    for skipped in steps[2:]:
        # Recorded as the Conductor's runs record a step the budget refused.
        assert skipped.call.error == "call budget reached (2 calls)"
        assert skipped.call.error_kind == "BudgetExceeded"
        assert skipped.call.cost_usd == 0.0 and skipped.call.response is None
    assert record.totals.calls == 2
    assert record.votes == {"3": 2}
    assert record.final_answer == "Three. \\boxed{3}"
    assert record.status == "partial"
    assert "step 2 (w0): call budget reached" in (record.error or "")


async def test_reflect_under_a_usd_budget_stops_after_the_first_answer(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    price = {"input_per_mtok": 1_000_000.0, "output_per_mtok": 0.0}  # $1 per input token
    pool = make_pool(tmp_path, fake_server, price=price)
    fake_server.script("w0", "draft")
    strat = parse_strategy(
        "reflect:2:w0", pool, CallerSet(None), settings=RunSettings(budget_usd=1.0)
    )
    try:
        record = await strat.run(QUESTION, sample_index=0)
    finally:
        await strat.aclose()
    assert len(fake_server.requests_for("w0")) == 1
    first, *rest = record.rounds[0].steps
    assert first.status == "ok" and (first.call.cost_usd or 0) > 1
    assert [s.status for s in rest] == ["skipped", "skipped"]
    assert all("USD budget reached" in (s.call.error or "") for s in rest)
    assert record.final_answer == "draft"


async def test_a_baseline_without_budgets_describes_itself_as_before(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # A run directory's config (and its resume check and sample cache key) holds this.
    pool = make_pool(tmp_path, fake_server)
    plain = parse_strategy("single:w1", pool, CallerSet(None))
    assert set(plain.describe()) == {"strategy", "workflow", "votes"}
    capped = parse_strategy(
        "single:w1", pool, CallerSet(None), settings=RunSettings(max_calls=3, max_steps=2)
    )
    assert capped.describe()["settings"] == {"budget_usd": None, "max_calls": 3}


async def test_a_baseline_emits_step_round_and_run_events_in_order(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", "zero")
    fake_server.script("w1", "one")
    pool = make_pool(tmp_path, fake_server)
    seen: list[Event] = []
    strat = parse_strategy("moa", pool, CallerSet(None))
    try:
        record = await strat.run(QUESTION, sample_index=0, events=seen.append)
    finally:
        await strat.aclose()
    assert record.status == "ok"
    kinds = [(e.kind, e.step) for e in seen]
    # Two proposers at once, then the aggregator, which sees them both.
    assert sorted(kinds[:4]) == [
        ("step_finished", 0),
        ("step_finished", 1),
        ("step_started", 0),
        ("step_started", 1),
    ]
    assert kinds[:2] == [("step_started", 0), ("step_started", 1)]
    assert kinds[4:] == [
        ("step_started", 2),
        ("step_finished", 2),
        ("round_finished", None),
        ("run_finished", None),
    ]
    assert [e.worker_id for e in seen[4:6]] == ["w0", "w0"]
    assert all(e.round == 0 for e in seen)
    assert not any(e.failed for e in seen)


async def test_a_failed_baseline_step_is_a_failed_event_and_run(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w1", Fault(401, "bad key"))
    pool = make_pool(tmp_path, fake_server)
    seen: list[Event] = []
    strat = parse_strategy("single:w1", pool, CallerSet(None))
    try:
        record = await strat.run(QUESTION, sample_index=0, events=seen.append)
    finally:
        await strat.aclose()
    assert [e.kind for e in seen] == [
        "step_started",
        "step_finished",
        "round_finished",
        "run_finished",
    ]
    finished = seen[1]
    assert finished.failed and finished.worker_id == "w1" and "w1" in (finished.detail or "")
    assert seen[-1].failed and record.status == "failed"
    assert record.rounds[0].steps[0].call.error == finished.detail


async def test_both_paths_record_the_same_call_the_same_way(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    """A Conductor plan that is the reflect baseline's, under budgets that refuse its
    last step in both: the steps that send the same request record the same thing."""
    as_given = "(the task as given)"
    fake_server.script(
        CONDUCTOR_MODEL,
        [lists([0, 0, 0], [as_given, REFLECT_INSTRUCTION, REFLECT_INSTRUCTION], [[], [0], [1]])],
    )
    fake_server.script("w0", "<think>check</think>3")
    pool = make_pool(tmp_path, fake_server)
    orch = Orchestrator(pool, resolve_conductor(pool))
    try:
        # The Conductor's call counts against its budget: one call more.
        conducted = await orch.run(QUESTION, RunSettings(max_calls=3))
    finally:
        await orch.aclose()
    strat = parse_strategy("reflect:2:w0", pool, CallerSet(None), settings=RunSettings(max_calls=2))
    try:
        baseline = await strat.run(QUESTION, sample_index=0)
    finally:
        await strat.aclose()
    ours, theirs = conducted.rounds[0].steps, baseline.rounds[0].steps
    assert [s.status for s in ours] == [s.status for s in theirs] == ["ok", "ok", "skipped"]
    # Step 0: the baseline sends the plain question, the Conductor's worker its subtask.
    assert step_dict(ours[0], "messages", "raw", "input_tokens") == step_dict(
        theirs[0], "messages", "raw", "input_tokens"
    )
    # Steps 1 and 2 send (or would send) the same request in both, as does step 1's reply.
    assert ours[1].call.messages == theirs[1].call.messages
    assert step_dict(ours[1], "raw") == step_dict(theirs[1], "raw")
    # The refusal names each run's own call budget.
    assert step_dict(ours[2], "error") == step_dict(theirs[2], "error")
    assert ours[2].call.error == "call budget reached (3 calls)"
    assert theirs[2].call.error == "call budget reached (2 calls)"
    assert ours[1].answer == theirs[1].answer == "3"
    assert len(fake_server.requests_for("w0")) == 4


async def test_a_cancelled_round_keeps_its_steps_and_marks_the_call_in_flight(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", "draft")
    fake_server.script("w1", Fault.hang(30))
    pool = make_pool(tmp_path, fake_server)
    record = RunRecord(question=QUESTION, pool={}, conductor={}, settings={})
    rnd = RoundRecord(index=0)
    record.rounds.append(rnd)
    callers = CallerSet(None)
    runner = StepRunner(pool.workers, callers, budget=Budget(), sample_index=0)
    plans = [StepPlan(0, "draft it", (), ()), StepPlan(1, "check it", (0,), (0,))]

    def compose(i: int, visible: list[SharedStep]) -> list[Message]:
        return build_worker_messages(QUESTION, visible, plans[i].subtask)

    async def steps() -> None:
        await runner.run_round(rnd, plans, compose)

    task = asyncio.create_task(run_to_record(record, steps()))
    for _ in range(3000):  # the second step's request is in flight (30 s at most)
        if fake_server.requests_for("w1"):
            break
        await asyncio.sleep(0.01)
    assert fake_server.requests_for("w1")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await callers.aclose()
    first, second = rnd.steps
    assert first.status == "ok" and first.answer == "draft"
    assert second.status == "failed" and second.call.error == INTERRUPTED
    assert second.call.error_kind == "Interrupted"
    assert record.final_answer is None and record.status == "failed"
    assert record.error == f"the run was {INTERRUPTED}"
    # Only the finished step is history for a later round.
    assert [s.label for s in runner.history] == ["0.0"]


def test_a_call_that_failed_before_any_attempt_counts_one() -> None:
    from conductor.errors import ModelCallError
    from conductor.steps import fail_call
    from conductor.targets import Worker

    call = CallRecord(messages=[], started_at="2026-01-01T00:00:00+00:00")
    fail_call(call, ModelCallError("refused before sending"), 0.0, Worker(id="w", model="m"))
    assert call.attempts == 1 and call.error_kind == "ModelCallError"
    counted = CallRecord(messages=[], started_at="2026-01-01T00:00:00+00:00")
    fail_call(counted, ModelCallError("gave up", attempts=3), 0.0, Worker(id="w", model="m"))
    assert counted.attempts == 3
