"""The executor against the fake server: concurrency, contexts, cache, faults, recursion."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, worker, write_pool

from conductor.conductors.spec import resolve_conductor
from conductor.context import SharedStep, build_worker_messages
from conductor.execute import Orchestrator, RunSettings
from conductor.llm.cache import ResponseCache
from conductor.pool import Pool, load_pool
from conductor.record import RunRecord, read_record, write_record
from conductor.testing import FakeLLMServer, Fault, Reply

QUESTION = "What is the capital of France? Answer inside <answer> tags."


def make_pool(tmp_path: Path, server: FakeLLMServer, n: int = 3, **conductor: Any) -> Pool:
    workers = [worker(server, f"w{i}") for i in range(n)]
    return load_pool(write_pool(tmp_path / "pool.yaml", pool_dict(server, workers, **conductor)))


async def run(
    pool: Pool,
    question: str = QUESTION,
    cache: ResponseCache | None = None,
    **settings: Any,
) -> RunRecord:
    orch = Orchestrator(pool, resolve_conductor(pool), cache=cache)
    try:
        return await orch.run(question, RunSettings(**settings))
    finally:
        await orch.aclose()


async def test_single_step_answer(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([1], ["Name the capital of France."], [[]])])
    fake_server.script("w1", ["<think>hmm</think><answer>Paris</answer>"])
    record = await run(make_pool(tmp_path, fake_server))
    assert record.status == "ok"
    assert record.final_answer == "<answer>Paris</answer>"
    (step,) = record.rounds[0].steps
    assert step.worker_id == "w1" and step.worker_index == 1
    # The raw response is kept; only the answer has the think block removed.
    assert step.call.response == "<think>hmm</think><answer>Paris</answer>"
    assert record.totals.calls == 2
    assert record.rounds[0].workflow == {
        "model_id": [1],
        "subtasks": ["Name the capital of France."],
        "access_list": [[]],
    }


async def test_independent_steps_run_at_once(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(
        CONDUCTOR_MODEL,
        [lists([0, 1, 2], ["Attempt A", "Attempt B", "Attempt C"], [[], [], []])],
    )
    for w in ("w0", "w1", "w2"):
        fake_server.script(w, [Reply(f"answer from {w}", latency_s=1.0)])
    pool = make_pool(tmp_path, fake_server)
    t0 = time.perf_counter()
    record = await run(pool)
    elapsed = time.perf_counter() - t0
    assert record.status == "ok"
    # Overlap, not speed: three one-second steps that see nothing all reached the
    # server before the first of them could have been answered.
    starts = sorted(r.received_at for r in fake_server.requests if r.model != CONDUCTOR_MODEL)
    assert len(starts) == 3 and starts[-1] - starts[0] < 1.0
    assert elapsed >= 1.0  # each step really waited for its answer
    assert record.final_answer == "answer from w2"


async def test_dependent_step_waits_and_sees_exact_context(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(
        CONDUCTOR_MODEL,
        [
            lists(
                [0, 1, 2, 0],
                ["Plan it", "Solve alone", "Check the plan", "Judge everything"],
                [[], [], [0], ["all"]],
            )
        ],
    )
    fake_server.script("w0", ["<think>secret reasoning</think>the plan", "final judgement"])
    fake_server.script("w1", ["solo answer"])
    fake_server.script("w2", ["plan looks fine"])
    record = await run(make_pool(tmp_path, fake_server))
    assert record.status == "ok"

    by_subtask = {
        r.messages[-1]["content"].rsplit("\n", 1)[-1]: r
        for r in fake_server.requests
        if r.model != CONDUCTOR_MODEL
    }
    plan = SharedStep("0.0", 0, "Plan it", "the plan")
    solo = SharedStep("0.1", 1, "Solve alone", "solo answer")
    check = SharedStep("0.2", 2, "Check the plan", "plan looks fine")
    expected = {
        "Plan it": build_worker_messages(QUESTION, [], "Plan it"),
        "Solve alone": build_worker_messages(QUESTION, [], "Solve alone"),
        "Check the plan": build_worker_messages(QUESTION, [plan], "Check the plan"),
        "Judge everything": build_worker_messages(
            QUESTION, [plan, solo, check], "Judge everything"
        ),
    }
    for subtask, messages in expected.items():
        assert by_subtask[subtask].messages == messages, subtask
    # The wording a worker gets, spelled out once so a change to it is deliberate.
    judge = by_subtask["Judge everything"].messages[0]["content"]
    assert judge.startswith("You are one agent in a team of AI agents")
    assert f"# The task\n{QUESTION}" in judge
    assert (
        '<agent_0 step="0.0">\nSubtask given to this agent:\nPlan it\n\n'
        "Response of this agent:\nthe plan\n</agent_0>"
    ) in judge
    assert "secret reasoning" not in judge  # think blocks never reach other workers
    assert judge.endswith("# Your assigned subtask\nJudge everything")
    assert judge.index("agent_0") < judge.index("agent_1") < judge.index("agent_2")
    # The step that sees step 0 started only after step 0 finished.
    steps = record.rounds[0].steps
    assert steps[2].visible_steps == [0]
    assert steps[3].visible_steps == [0, 1, 2]
    assert record.final_answer == "final judgement"


async def test_parallel_equals_sequential(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    """Concurrent execution gives exactly the messages sequential execution would."""

    def responder(request: Any) -> str:
        return f"{request.model} saw {len(request.messages[0]['content'])} chars"

    wf = lists([0, 1, 2, 1], ["a", "b", "c", "d"], [[], [0], [], ["all"]])
    fake_server.script(CONDUCTOR_MODEL, [wf])
    for w in ("w0", "w1", "w2"):
        fake_server.script(w, responder)
    record = await run(make_pool(tmp_path, fake_server))
    steps = record.rounds[0].steps
    # All four steps ran (a loop over no steps would check nothing), each seeing what
    # its access list gives it.
    assert [(s.index, s.worker_id, s.status) for s in steps] == [
        (0, "w0", "ok"), (1, "w1", "ok"), (2, "w2", "ok"), (3, "w1", "ok"),
    ]  # fmt: skip
    assert [s.visible_steps for s in steps] == [[], [0], [], [0, 1, 2]]
    # Rebuild each step's context by walking the steps one after another.
    answers: list[SharedStep] = []
    for step in steps:
        visible = [answers[j] for j in step.visible_steps]
        assert step.call.messages == build_worker_messages(QUESTION, visible, step.subtask)
        # The answer is the worker's reply to exactly these messages.
        assert step.answer == f"{step.worker_id} saw {len(step.call.messages[0]['content'])} chars"
        answers.append(SharedStep(f"0.{step.index}", step.worker_index, step.subtask, step.answer))
    # What the workers were sent is what the record says they were sent.
    sent = [(r.model, r.messages) for r in fake_server.requests if r.model != CONDUCTOR_MODEL]
    assert sorted(map(repr, sent)) == sorted(repr((s.worker_id, s.call.messages)) for s in steps)
    assert record.final_answer == steps[-1].answer


async def test_rerun_is_served_from_cache(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0, 1], ["x", "y"], [[], ["all"]])])
    cache = ResponseCache(tmp_path / "cache")
    pool = make_pool(tmp_path, fake_server)
    first = await run(pool, cache=cache)
    assert first.totals.cached_calls == 0
    n = len(fake_server.requests)
    assert n == 3
    second = await run(pool, cache=cache)
    assert len(fake_server.requests) == n  # zero HTTP requests
    assert second.totals.cached_calls == second.totals.calls == 3
    assert second.final_answer == first.final_answer
    # A different sample index is a different sample, so it is not a cache hit.
    await run(pool, cache=cache, sample_index=1)
    assert len(fake_server.requests) == n + 3


async def test_identical_parallel_attempts_are_separate_samples(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(
        CONDUCTOR_MODEL, [lists([0, 0, 1], ["Same task", "Same task", "Pick"], [[], [], ["all"]])]
    )
    fake_server.script("w0", ["first sample", "second sample"])
    cache = ResponseCache(tmp_path / "cache")
    record = await run(make_pool(tmp_path, fake_server), cache=cache)
    answers = sorted(s.answer or "" for s in record.rounds[0].steps[:2])
    assert answers == ["first sample", "second sample"]


@pytest.mark.long
async def test_worker_faults_are_retried(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0, 1, 2], ["a", "b", "c"], [[], [], []])])
    fake_server.script("w0", [Fault(429, "slow down", headers={"Retry-After": "1"}), "ok0"])
    fake_server.script("w1", [Fault(500, "boom"), "ok1"])
    fake_server.script("w2", [Reply("too late", latency_s=3.0), "ok2"])
    workers = [worker(fake_server, f"w{i}") for i in range(3)]
    workers[2]["timeout_s"] = 1
    pool = load_pool(write_pool(tmp_path / "p.yaml", pool_dict(fake_server, workers)))
    t0 = time.perf_counter()
    record = await run(pool)
    assert record.status == "ok", record.error
    steps = record.rounds[0].steps
    assert [s.answer for s in steps] == ["ok0", "ok1", "ok2"]
    assert [s.call.attempts for s in steps] == [2, 2, 2]
    assert time.perf_counter() - t0 >= 1.0  # Retry-After was honoured


async def test_auth_failure_fails_at_once_and_run_continues(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0, 1], ["a", "b"], [[], []])])
    fake_server.script("w0", [Fault(401, "Incorrect API key provided")])
    fake_server.script("w1", ["fine"])
    record = await run(make_pool(tmp_path, fake_server))
    failed, ok = record.rounds[0].steps
    assert failed.status == "failed" and failed.call.attempts == 1
    assert len(fake_server.requests_for("w0")) == 1
    assert "w0" in (failed.call.error or "") and "401" in (failed.call.error or "")
    assert "Incorrect API key provided" in (failed.call.error or "")
    assert ok.status == "ok"
    assert record.status == "partial"
    assert record.final_answer == "fine"


async def test_last_step_failing_falls_back_to_last_good_answer(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0, 1], ["a", "b"], [[], ["all"]])])
    fake_server.script("w0", ["draft"])
    fake_server.script("w1", [Fault(400, "context too long")])
    record = await run(make_pool(tmp_path, fake_server))
    assert record.status == "partial"
    assert record.final_answer == "draft"
    assert "step 1 (w1)" in (record.error or "")


async def test_unparseable_conductor_is_reasked_with_the_reason(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(
        CONDUCTOR_MODEL,
        [
            "I would use model 9.\nmodel_id = [9]\nsubtasks = ['x']\naccess_list = [[]]",
            lists([0], ["x"], [[]]),
        ],
    )
    record = await run(make_pool(tmp_path, fake_server))
    assert record.status == "ok"
    rnd = record.rounds[0]
    assert len(rnd.conductor_calls) == 2 and len(rnd.parse_errors) == 1
    retry_msgs = fake_server.requests_for(CONDUCTOR_MODEL)[1].messages
    assert retry_msgs[-2]["role"] == "assistant"
    assert rnd.parse_errors[0] in retry_msgs[-1]["content"]


async def test_conductor_gives_up_after_six_tries(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, ["no lists here"])
    record = await run(make_pool(tmp_path, fake_server))
    assert record.status == "failed"
    assert len(fake_server.requests_for(CONDUCTOR_MODEL)) == 6
    assert "could not be parsed after 6 tries" in (record.error or "")
    assert record.final_answer is None


async def test_recursion_stops_on_empty_lists(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(
        CONDUCTOR_MODEL,
        [
            lists([0], ["answer it"], [[]]),
            "Looks right.\nmodel_id = []\nsubtasks = []\naccess_list = []",
        ],
    )
    fake_server.script("w0", ["42"])
    record = await run(make_pool(tmp_path, fake_server), rounds=3)
    assert len(record.rounds) == 2
    assert record.rounds[1].workflow == {"model_id": [], "subtasks": [], "access_list": []}
    assert record.rounds[1].stop_reason == "the Conductor kept the previous answer"
    assert record.final_answer == "42"
    revise = fake_server.requests_for(CONDUCTOR_MODEL)[1].messages[0]["content"]
    assert "model_id = [0]" in revise and "42" in revise  # sees its plan and the answer


async def test_recursion_stops_on_round_budget(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(
        CONDUCTOR_MODEL,
        [lists([0], ["first try"], [[]]), lists([1], ["improve it"], [["all"]])],
    )
    fake_server.script("w0", ["draft"])
    fake_server.script("w1", ["better"])
    record = await run(make_pool(tmp_path, fake_server), rounds=2)
    assert len(record.rounds) == 2
    assert record.final_answer == "better"
    assert "round budget reached (2)" in (record.rounds[-1].stop_reason or "")
    # A later round's "all" step sees the earlier round's history.
    improve = fake_server.requests_for("w1")[0].messages[0]["content"]
    assert '<agent_0 step="0.0">' in improve and "draft" in improve


async def test_call_budget_skips_steps(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0, 1, 2], ["a", "b", "c"], [[], ["all"], ["all"]])])
    record = await run(make_pool(tmp_path, fake_server), max_calls=3)
    statuses = [s.status for s in record.rounds[0].steps]
    assert statuses == ["ok", "ok", "skipped"]
    assert "call budget reached" in (record.rounds[0].steps[2].call.error or "")
    assert len(fake_server.requests) == 3


async def test_usd_budget_stops_new_calls(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    price = {"input_per_mtok": 1_000_000.0, "output_per_mtok": 0.0}  # $1 per input token
    workers = [worker(fake_server, f"w{i}", price=price) for i in range(2)]
    pool = load_pool(write_pool(tmp_path / "p.yaml", pool_dict(fake_server, workers)))
    fake_server.script(CONDUCTOR_MODEL, [lists([0, 1], ["a", "b"], [[], ["all"]])])
    record = await run(pool, budget_usd=5.0)
    first, second = record.rounds[0].steps
    assert first.status == "ok" and (first.call.cost_usd or 0) > 5
    assert second.status == "skipped" and "USD budget" in (second.call.error or "")


async def test_record_round_trips_through_json(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0, 1], ["x", "y"], [[], [0]])])
    record = await run(make_pool(tmp_path, fake_server))
    write_record(record, tmp_path / "run.json")
    again = read_record(tmp_path / "run.json")
    assert again == record


def test_no_workers_is_a_usage_error() -> None:
    from conductor.conductors.spec import Conductor
    from conductor.errors import UsageError
    from conductor.targets import Worker

    with pytest.raises(UsageError):
        Orchestrator(Pool(name="empty", workers=()), Conductor("prompted", Worker("c", "m")))


async def test_given_plan_is_executed_without_asking(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w2", ["from w2"])
    pool = make_pool(tmp_path, fake_server)
    orch = Orchestrator(pool, resolve_conductor(pool))
    try:
        record = await orch.run(QUESTION, plan=lists([2], ["Answer it."], [[]]))
        bad = await orch.run(QUESTION, plan="no lists at all")
    finally:
        await orch.aclose()
    assert not fake_server.requests_for(CONDUCTOR_MODEL)
    assert record.final_answer == "from w2"
    assert record.rounds[0].conductor_calls[0].response.endswith("access_list = [[]]\n")
    assert bad.status == "failed" and "could not be parsed" in (bad.error or "")
    assert len(bad.rounds[0].conductor_calls) == 1  # no re-asking a given plan


async def test_continue_from_runs_a_revision_round(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", ["draft answer"])
    fake_server.script("w1", ["revised answer"])
    pool = make_pool(tmp_path, fake_server)
    orch = Orchestrator(pool, resolve_conductor(pool))
    try:
        first = await orch.run(QUESTION, plan=lists([0], ["Try it."], [[]]))
        second = await orch.run(
            QUESTION, plan=lists([1], ["Improve it."], [["all"]]), continue_from=first
        )
    finally:
        await orch.aclose()
    assert [r.index for r in second.rounds] == [0, 1]
    assert second.final_answer == "revised answer"
    revise_prompt = second.rounds[1].conductor_calls[0].messages[0]["content"]
    assert "model_id = [0]" in revise_prompt and "draft answer" in revise_prompt
    seen = fake_server.requests_for("w1")[0].messages[0]["content"]
    assert '<agent_0 step="0.0">' in seen and "draft answer" in seen


def _shape(record: RunRecord) -> list[tuple[int, list[tuple[str, str | None]]]]:
    return [(r.index, [(s.worker_id, s.answer) for s in r.steps]) for r in record.rounds]


async def test_revision_round_repeating_a_step_re_samples(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # Round 2 repeats round 1's step exactly (same worker, subtask and context), so the
    # request is identical; it must still be a new sample, with or without the cache.
    same = lists([1], ["Solve it."], [[]])

    def script() -> None:
        fake_server.script(CONDUCTOR_MODEL, [same, same])
        fake_server.script("w1", ["first try", "second try"])

    pool = make_pool(tmp_path, fake_server)
    script()
    uncached = await run(pool, rounds=2)
    assert len(fake_server.requests_for("w1")) == 2
    assert _shape(uncached) == [(0, [("w1", "first try")]), (1, [("w1", "second try")])]

    script()
    cache = ResponseCache(tmp_path / "cache")
    cold = await run(pool, cache=cache, rounds=2)
    # The round-2 request went to the server, not to round 1's cache entry.
    assert len(fake_server.requests_for("w1")) == 4
    assert _shape(cold) == _shape(uncached)
    assert not any(s.call.cached for r in cold.rounds for s in r.steps)

    # A warm rerun replays both samples, each from its own entry.
    n = len(fake_server.requests)
    warm = await run(pool, cache=cache, rounds=2)
    assert len(fake_server.requests) == n
    assert _shape(warm) == _shape(uncached)
    assert warm.totals.cached_calls == warm.totals.calls == 4


async def test_continued_run_repeating_a_step_re_samples(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w1", ["first try", "second try"])
    pool = make_pool(tmp_path, fake_server)
    cache = ResponseCache(tmp_path / "cache")
    same = lists([1], ["Solve it."], [[]])
    orch = Orchestrator(pool, resolve_conductor(pool), cache=cache)
    try:
        first = await orch.run(QUESTION, plan=same)
        second = await orch.run(QUESTION, plan=same, continue_from=first)
    finally:
        await orch.aclose()
    assert len(fake_server.requests_for("w1")) == 2
    assert _shape(second) == [(0, [("w1", "first try")]), (1, [("w1", "second try")])]
    assert not second.rounds[1].steps[0].call.cached


async def test_a_grammar_the_conductor_client_cannot_send_is_said_once(
    tmp_path: Path,
    fake_server: FakeLLMServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``constrained: true`` with a client that drops grammars (its capabilities say
    ``grammar: none``), or told to send none, warns once per run; one that sends it does
    not warn."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    # A reply the grammar admits (the fake server reads no grammar field: a reply
    # outside it would be a GrammarIgnoredError, tests/test_structured_outputs.py).
    fake_server.script(CONDUCTOR_MODEL, lambda r: lists([0], ["Answer."], [[]]).rstrip("\n"))
    fake_server.script("w0", lambda r: "<answer>Paris</answer>")
    warned = "sends no grammar"
    for client, base, expected, setting in [
        ("anthropic", fake_server.anthropic_base, 1, {}),
        ("openai", fake_server.openai_base, 0, {}),
        ("openai", fake_server.openai_base, 1, {"structured_outputs": "none"}),
    ]:
        caplog.clear()
        pool = make_pool(
            tmp_path, fake_server, n=1, client=client, api_base=base, constrained=True, **setting
        )
        orch = Orchestrator(pool, resolve_conductor(pool))
        try:
            for _ in range(2):
                record = await orch.run(QUESTION, RunSettings())
                assert record.status == "ok", record.error
        finally:
            await orch.aclose()
        assert sum(warned in r.getMessage() for r in caplog.records) == expected, client
