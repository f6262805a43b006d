"""Re-asking the Conductor after a reply that did not parse quotes only that reply's end."""

from __future__ import annotations

import json
from pathlib import Path

from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, worker, write_pool

from conductor.conductors.prompt import (
    REASK_REASON_CHARS,
    REASK_REPLY_CHARS,
    build_reask_messages,
)
from conductor.conductors.spec import resolve_conductor
from conductor.execute import Orchestrator, RunSettings
from conductor.pool import load_pool
from conductor.testing import FakeLLMServer


def test_reask_messages_keep_the_end_of_a_long_reply() -> None:
    first = [{"role": "user", "content": "plan please"}]
    reply = "filler " * 10_000 + "model_id = [7]"
    messages = build_reask_messages(first, reply, "model_id[0] = 7 is out of range")
    assert messages[0] == first[0]
    quoted = messages[1]["content"]
    assert messages[1]["role"] == "assistant"
    assert quoted.endswith("model_id = [7]")
    assert len(quoted) < REASK_REPLY_CHARS + 100
    assert f"{len(reply) - REASK_REPLY_CHARS:,} earlier characters left out" in quoted
    assert "model_id[0] = 7 is out of range" in messages[2]["content"]
    # A short reply is quoted whole; a huge reason is cut.
    short = build_reask_messages(first, "no lists", "x" * 10_000)
    assert short[1]["content"] == "no lists"
    assert len(short[2]["content"]) < REASK_REASON_CHARS + 200


async def test_a_huge_unparsable_reply_is_not_resent_whole(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    huge = "I will think about it. " * 20_000  # about 460,000 characters, no lists
    fake_server.script(CONDUCTOR_MODEL, [huge, huge, huge, lists([0], ["Solve it"], [[]])])
    fake_server.set_default("ANSWER: 4")
    pool = load_pool(
        write_pool(tmp_path / "pool.yaml", pool_dict(fake_server, [worker(fake_server, "w0")]))
    )
    orch = Orchestrator(pool, resolve_conductor(pool), cache=None)
    try:
        record = await orch.run("What is 2+2?", RunSettings())
    finally:
        await orch.aclose()
    assert record.status == "ok"
    asks = fake_server.requests_for(CONDUCTOR_MODEL)
    assert len(asks) == 4
    sizes = [len(json.dumps(r.body)) for r in asks]
    # Each re-ask adds one clipped reply and one request, not the whole reply again.
    for before, after in zip(sizes, sizes[1:], strict=False):
        assert after - before < REASK_REPLY_CHARS + 1_500, sizes
    assert sizes[-1] < sizes[0] + 3 * (REASK_REPLY_CHARS + 1_500)
    # The record keeps each reply whole; only what is sent back is clipped.
    assert [len(c.response or "") for c in record.rounds[0].conductor_calls[:3]] == [len(huge)] * 3
