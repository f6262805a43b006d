"""Worker context options (``context:`` in the pool) over real HTTP to the fake server:
the prefill each provider gets, what the recorded answer is, reasoning pass-through, and
the pool reader's errors."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, worker, write_pool

from conductor.conductors.spec import resolve_conductor
from conductor.errors import PoolError
from conductor.execute import Orchestrator, RunSettings
from conductor.llm.prefill import continuation, prefill_message
from conductor.llm.prefill_rules import CONTINUE_FIELDS
from conductor.pool import Pool, load_pool, load_pool_text
from conductor.record import RunRecord
from conductor.targets import Worker, WorkerContext
from conductor.testing import FakeLLMServer

QUESTION = "What is 6 times 7? Answer inside <answer> tags."
PREFILL = "Working through this one step at a time:\n"


def make_pool(
    tmp_path: Path,
    server: FakeLLMServer,
    workers: list[dict[str, Any]],
    context: dict[str, Any] | None = None,
) -> Pool:
    data = pool_dict(server, workers)
    if context is not None:
        data["context"] = context
    return load_pool(write_pool(tmp_path / "pool.yaml", data))


async def run(pool: Pool, *, plan: str, question: str = QUESTION) -> RunRecord:
    orch = Orchestrator(pool, resolve_conductor(pool))
    try:
        return await orch.run(question, RunSettings(), plan=plan)
    finally:
        await orch.aclose()


# --------------------------------------------------------------------------- prefill


@pytest.mark.parametrize("client", ["openai", "http", "litellm"])
async def test_openai_protocol_prefill_asks_to_continue(
    tmp_path: Path, fake_server: FakeLLMServer, client: str
) -> None:
    w = worker(fake_server, "w0", client="openai" if client == "http" else client)
    w["client"] = client
    fake_server.script(w["model"].split("/", 1)[-1], ["6 x 7 = 42. <answer>42</answer>"])
    pool = make_pool(tmp_path, fake_server, [w], context={"prefill": PREFILL})
    record = await run(pool, plan=lists([0], ["Compute it."], [[]]))
    (request,) = [r for r in fake_server.requests if r.model != CONDUCTOR_MODEL]
    assert request.messages[-1] == {"role": "assistant", "content": PREFILL}
    assert request.messages[-2]["role"] == "user"
    assert request.body["continue_final_message"] is True
    assert request.body["add_generation_prompt"] is False
    (step,) = record.rounds[0].steps
    # The call records what the server returned; the answer is prefill + continuation.
    assert step.call.response == "6 x 7 = 42. <answer>42</answer>"
    assert step.call.messages[-1] == {"role": "assistant", "content": PREFILL}
    assert step.answer == PREFILL + "6 x 7 = 42. <answer>42</answer>"
    assert record.final_answer == step.answer


async def test_no_prefill_sends_no_continue_fields(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    pool = make_pool(tmp_path, fake_server, [worker(fake_server, "w0")])
    fake_server.script("w0", ["42"])
    record = await run(pool, plan=lists([0], ["Compute it."], [[]]))
    (request,) = fake_server.requests_for("w0")
    assert [m["role"] for m in request.messages] == ["user"]
    assert "continue_final_message" not in request.body
    assert "add_generation_prompt" not in request.body
    assert record.final_answer == "42"


@pytest.mark.parametrize("client", ["anthropic", "litellm"])
async def test_anthropic_gets_an_assistant_last_message(
    tmp_path: Path, fake_server: FakeLLMServer, client: str
) -> None:
    w: dict[str, Any] = {
        "id": "claude",
        "client": client,
        "model": "anthropic/claude-x" if client == "litellm" else "claude-x",
        "api_base": fake_server.anthropic_base,
        "api_key_env": "FAKE_ANTHROPIC_KEY",
        "max_retries": 0,
        "timeout_s": 10,
    }
    fake_server.script("claude-x", [" 6 x 7 = 42. <answer>42</answer>"])
    pool = make_pool(tmp_path, fake_server, [w], context={"prefill": PREFILL})
    record = await run(pool, plan=lists([0], ["Compute it."], [[]]))
    (request,) = fake_server.requests_for("claude-x")
    assert request.protocol == "anthropic"
    # The Messages API refuses a final assistant message that ends in whitespace.
    assert request.messages[-1] == {"role": "assistant", "content": PREFILL.rstrip()}
    assert "continue_final_message" not in request.body
    (step,) = record.rounds[0].steps
    assert step.answer == PREFILL.rstrip() + " 6 x 7 = 42. <answer>42</answer>"


async def test_unsupported_provider_skips_prefill_with_one_warning(
    tmp_path: Path, fake_server: FakeLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    gem = worker(fake_server, "gem", client="google", api_key_env="FAKE_GEMINI_KEY")
    oai = worker(fake_server, "oai")
    fake_server.script("gem", ["<answer>42</answer>"])
    fake_server.script("oai", ["fine"])
    pool = make_pool(tmp_path, fake_server, [gem, oai], context={"prefill": PREFILL})
    caplog.set_level(logging.WARNING, logger="conductor")
    orch = Orchestrator(pool, resolve_conductor(pool))
    try:
        for _ in range(2):
            record = await orch.run(QUESTION, plan=lists([0, 0, 1], ["a", "b", "c"], [[], [], []]))
            assert record.status == "ok"
    finally:
        await orch.aclose()
    # Training builds an orchestrator per sub-pool: that is no reason to warn again.
    await Orchestrator(pool, resolve_conductor(pool)).aclose()
    warnings = [r for r in caplog.records if "prefill" in r.getMessage()]
    assert len(warnings) == 1  # one per worker, not one per call
    assert "'gem'" in warnings[0].getMessage() and "Gemini" in warnings[0].getMessage()
    for request in fake_server.requests_for("gem"):
        assert [m["role"] for m in request.messages] == ["user"]
    # The answer is the reply alone: nothing was prefilled.
    assert record.rounds[0].steps[0].answer == "<answer>42</answer>"
    # The worker that can continue still gets its prefill.
    assert fake_server.requests_for("oai")[-1].messages[-1]["content"] == PREFILL


def test_which_targets_continue_a_prefill() -> None:
    def w(client: Any, model: str = "m", api_base: str | None = None) -> Worker:
        return Worker(id="x", model=model, client=client, api_base=api_base)

    base = "http://127.0.0.1:1/v1"
    assert continuation(w("anthropic")) == "anthropic"
    assert continuation(w("litellm", "anthropic/claude")) == "anthropic"
    assert continuation(w("openai", api_base=base)) == "vllm"
    assert continuation(w("http", api_base=base)) == "vllm"
    assert continuation(w("litellm", "hosted_vllm/qwen", base)) == "vllm"
    assert continuation(w("openai")) is None  # OpenAI's own API
    assert continuation(w("litellm", "gpt-4o")) is None
    assert continuation(w("google")) is None
    assert continuation(w("local")) is None
    assert prefill_message(w("openai", api_base=base), "Go: ") == {
        "role": "assistant",
        "content": "Go: ",
    }
    assert prefill_message(w("anthropic"), "Go: ") == {"role": "assistant", "content": "Go:"}
    assert prefill_message(w("google"), "Go: ") is None
    assert prefill_message(w("anthropic"), None) is None
    assert CONTINUE_FIELDS == {"continue_final_message": True, "add_generation_prompt": False}


async def test_prefill_reaching_into_a_think_block_is_stripped_from_the_answer(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", ["6 x 7 is 42.</think><answer>42</answer>"])
    pool = make_pool(tmp_path, fake_server, [worker(fake_server, "w0")], {"prefill": "<think>"})
    record = await run(pool, plan=lists([0], ["Compute it."], [[]]))
    # Joined before reasoning is removed, so the prefill's opening tag is honoured.
    assert record.final_answer == "<answer>42</answer>"


# --------------------------------------------------------------------------- reasoning


REASONED = "<think>6 x 7: six sevens make 42</think>The product is 42."


async def _two_steps(
    tmp_path: Path, server: FakeLLMServer, pool_context: dict[str, Any] | None, **second: Any
) -> str:
    """Run a two-step workflow (step 1 sees step 0) and return what step 1's worker saw."""
    server.script("w0", [REASONED])
    server.script("w1", ["checked"])
    workers = [worker(server, "w0"), worker(server, "w1", **second)]
    pool = make_pool(tmp_path, server, workers, pool_context)
    record = await run(pool, plan=lists([0, 1], ["Multiply.", "Check it."], [[], [0]]))
    assert record.status == "ok"
    assert record.rounds[0].steps[0].answer == "The product is 42."  # always stripped
    (request,) = server.requests_for("w1")
    return request.messages[0]["content"]


async def test_reasoning_is_stripped_by_default(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    seen = await _two_steps(tmp_path, fake_server, None)
    assert "The product is 42." in seen
    assert "six sevens" not in seen and "<think>" not in seen


async def test_reasoning_keep_passes_it_on(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    seen = await _two_steps(tmp_path, fake_server, {"reasoning": "keep"})
    assert REASONED in seen


async def test_worker_context_overrides_the_pool(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    seen = await _two_steps(
        tmp_path, fake_server, {"reasoning": "keep"}, context={"reasoning": "strip"}
    )
    assert "six sevens" not in seen


async def test_reasoning_keep_shows_the_prefill_too(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", ["six sevens make 42</think>The product is 42."])
    fake_server.script("w1", ["checked"])
    workers = [
        worker(fake_server, "w0", context={"prefill": "<think>"}),
        worker(fake_server, "w1", context={"reasoning": "keep"}),
    ]
    pool = make_pool(tmp_path, fake_server, workers)
    record = await run(pool, plan=lists([0, 1], ["Multiply.", "Check it."], [[], [0]]))
    assert record.rounds[0].steps[0].answer == "The product is 42."
    seen = fake_server.requests_for("w1")[0].messages[0]["content"]
    assert "<think>six sevens make 42</think>The product is 42." in seen
    # w1 has no prefill of its own: the pool sets none.
    assert [m["role"] for m in fake_server.requests_for("w1")[0].messages] == ["user"]


async def test_reasoning_keep_applies_to_a_continued_run(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", [REASONED])
    fake_server.script("w1", ["revised"])
    pool = make_pool(
        tmp_path,
        fake_server,
        [worker(fake_server, "w0"), worker(fake_server, "w1")],
        {"reasoning": "keep"},
    )
    orch = Orchestrator(pool, resolve_conductor(pool))
    try:
        first = await orch.run(QUESTION, plan=lists([0], ["Multiply."], [[]]))
        await orch.run(QUESTION, plan=lists([1], ["Revise."], [["all"]]), continue_from=first)
    finally:
        await orch.aclose()
    assert REASONED in fake_server.requests_for("w1")[0].messages[0]["content"]


# --------------------------------------------------------------------------- pool file


def test_pool_context_defaults_and_overrides() -> None:
    pool = load_pool_text(
        "context:\n"
        "  prefill: 'Step by step:'\n"
        "  reasoning: keep\n"
        "workers:\n"
        "  - {id: a, model: x}\n"
        "  - {id: b, model: y, context: {prefill: ''}}\n"
        "  - {id: c, model: z, context: {reasoning: strip}}\n"
        "  - {id: d, model: z, context: {prefill: null}}\n"
    )
    assert pool.context == WorkerContext("Step by step:", "keep")
    got = {w.id: w.context for w in pool.workers}
    assert got["a"] == WorkerContext("Step by step:", "keep")
    assert got["b"] == WorkerContext(None, "keep")
    assert got["c"] == WorkerContext("Step by step:", "strip")
    assert got["d"] == WorkerContext(None, "keep")
    plain = load_pool_text("workers:\n  - {id: a, model: x}\n")
    assert plain.workers[0].context == WorkerContext(None, "strip")


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (
            "context:\n  prefil: go\nworkers:\n  - {id: a, model: x}\n",
            2,
            'context: unknown key "prefil" (did you mean "prefill"?)',
        ),
        (
            "context:\n  reasoning: kept\nworkers:\n  - {id: a, model: x}\n",
            2,
            'context.reasoning must be one of strip, keep; got "kept" (did you mean "keep"?)',
        ),
        (
            "workers:\n  - id: a\n    model: x\n    context:\n      reasonin: keep\n",
            5,
            'workers[0].context: unknown key "reasonin" (did you mean "reasoning"?)',
        ),
        (
            "workers:\n  - id: a\n    model: x\n    context: keep\n",
            4,
            'workers[0].context must be a mapping, got "keep"',
        ),
        (
            "context:\n  prefill: '   '\nworkers:\n  - {id: a, model: x}\n",
            2,
            "context.prefill is only whitespace",
        ),
        (
            "context:\n  prefill: [a]\nworkers:\n  - {id: a, model: x}\n",
            2,
            "context.prefill must be a string, got a list",
        ),
        (
            "contxt:\n  prefill: go\nworkers:\n  - {id: a, model: x}\n",
            1,
            'unknown key "contxt" (did you mean "context"?)',
        ),
    ],
)
def test_pool_context_errors(text: str, line: int, words: str) -> None:
    with pytest.raises(PoolError) as info:
        load_pool_text(text, source="pool.yaml")
    message = str(info.value)
    assert message.startswith(f"pool.yaml:{line}:"), message
    assert words in message, message


def test_public_pool_records_the_context() -> None:
    from conductor.pool import pool_to_public_dict

    pool = load_pool_text(
        "context: {reasoning: keep}\nworkers:\n  - {id: a, model: x, context: {prefill: 'Go:'}}\n"
    )
    public = pool_to_public_dict(pool)
    assert public["context"] == {"prefill": None, "reasoning": "keep"}
    assert public["workers"][0]["context"] == {"prefill": "Go:", "reasoning": "keep"}
