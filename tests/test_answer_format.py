"""The answer format below serve: what counts as keeping to it, where the executor gives
it (the answering step only), how a tool-call answer is recorded and cached, and that
the cache key tells requests with tools apart while keys without tools stay as they were."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, worker, write_pool

from conductor.conductors.spec import resolve_conductor
from conductor.execute import Orchestrator, RunSettings
from conductor.llm.answer_format import AnswerFormat, schema_problem
from conductor.llm.cache import ResponseCache, cache_key
from conductor.llm.types import ForcedTool, ModelRequest, RawCompletion, ToolCall, ToolSpec, Usage
from conductor.pool import Pool, load_pool
from conductor.record import read_record, write_record
from conductor.testing import FakeLLMServer, FakeToolCall, Reply

pytest.importorskip("jsonschema")

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER = ToolSpec("get_weather", "The weather now.", CITY, strict=True)
SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "Capital", "schema": {**CITY, "additionalProperties": False}},
}


def make_pool(tmp_path: Path, server: FakeLLMServer, n: int = 2) -> Pool:
    workers = [worker(server, f"w{i}") for i in range(n)]
    return load_pool(write_pool(tmp_path / "pool.yaml", pool_dict(server, workers)))


async def run(pool: Pool, fmt: AnswerFormat, **settings: Any) -> Any:
    async with Orchestrator(pool, resolve_conductor(pool)) as orch:
        return await orch.run("Weather in Paris?", RunSettings(**settings), answer_format=fmt)


@pytest.mark.parametrize(
    ("fmt", "text", "calls", "words"),
    [
        (AnswerFormat(response_format={"type": "json_object"}), '{"a": 1}', (), None),
        (AnswerFormat(response_format={"type": "json_object"}), "[1]", (), "not an object"),
        (AnswerFormat(response_format={"type": "json_object"}), "yes", (), "not JSON"),
        (AnswerFormat(response_format=SCHEMA), '{"city": "Paris"}', (), None),
        (AnswerFormat(response_format=SCHEMA), '{"city": 3}', (), "city: 3 is not of type"),
        (AnswerFormat(response_format=SCHEMA), '{"city": "P", "x": 1}', (), "Additional"),
        (AnswerFormat(tools=(WEATHER,)), "text is fine", (), None),
        (AnswerFormat((WEATHER,), "required"), "text", (), "called no tool"),
        (AnswerFormat((WEATHER,), ForcedTool("get_weather")), "t", (), "names get_weather"),
        (AnswerFormat((WEATHER,)), "", (ToolCall("1", "get_weather", '{"city": "P"}'),), None),
        (AnswerFormat((WEATHER,)), "", (ToolCall("1", "get_weather", "{}"),), "required"),
        (AnswerFormat((WEATHER,)), "", (ToolCall("1", "nope", "{}"),), "not one of the tools"),
        (AnswerFormat((WEATHER,)), "", (ToolCall("1", "get_weather", "{x"),), "are not JSON"),
        (AnswerFormat((WEATHER,), "none"), "", (ToolCall("1", "get_weather", "{}"),), "none"),
        (
            AnswerFormat((WEATHER,), parallel_tool_calls=False),
            "",
            (ToolCall("1", "get_weather", '{"city": "A"}'),) * 2,
            "made 2 calls",
        ),
        (
            AnswerFormat((ToolSpec("f", None, CITY),)),  # not strict: any JSON object will do
            "",
            (ToolCall("1", "f", '{"town": 1}'),),
            None,
        ),
    ],
)
def test_violation(
    fmt: AnswerFormat, text: str, calls: tuple[ToolCall, ...], words: str | None
) -> None:
    found = fmt.violation(text, calls)
    if words is None:
        assert found is None
    else:
        assert found is not None and words in found, found


def test_schema_problem() -> None:
    assert schema_problem(CITY) is None
    assert "is not valid" in (schema_problem({"type": 3}) or "")
    both = {"patternProperties": {"^x": {}}, "unevaluatedProperties": False}
    assert "not supported" in (schema_problem(both) or "")


def _json_schema(schema: dict[str, Any]) -> AnswerFormat:
    return AnswerFormat(
        response_format={"type": "json_schema", "json_schema": {"name": "S", "schema": schema}}
    )


def test_a_catastrophic_pattern_cannot_stall_the_check() -> None:
    """The client writes the schema and steers the reply: ``^(a+)+$`` against a long run
    of a's and a '!' takes Python's re longer than the age of the universe; the check
    gives the pattern a time-out and refuses the reply instead."""
    import threading

    evil = {"type": "object", "properties": {"v": {"type": "string", "pattern": "^(a+)+$"}}}
    reply = json.dumps({"v": "a" * 5000 + "!"})
    keyed = {"type": "object", "patternProperties": {"^(a+)+$": {"type": "integer"}}}
    found: list[str | None] = []
    checks = threading.Thread(
        target=lambda: found.extend(
            [
                _json_schema(evil).violation(reply, ()),
                _json_schema(keyed).violation(json.dumps({"a" * 5000 + "!": "x"}), ()),
            ]
        ),
        daemon=True,
    )
    checks.start()
    checks.join(timeout=60)
    assert not checks.is_alive(), "a schema's pattern stalled the reply check"
    assert found[0] is not None and "does not match" in found[0]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"id_1": 1, "name": "x"}', None),
        ('{"id_1": "one", "name": "x"}', "is not of type 'integer'"),
        ('{"other": 1, "name": "x"}', "Additional properties are not allowed ('other')"),
        ('{"name": "Xy"}', "does not match"),
    ],
)
def test_patterns_keep_their_meaning(text: str, words: str | None) -> None:
    """The time-limited patterns keep JSON Schema's rules: a key a patternProperties
    pattern matches is checked by it and is not an additional property."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"}},
        "patternProperties": {"^id_[0-9]+$": {"type": "integer"}},
        "additionalProperties": False,
    }
    found = _json_schema(schema).violation(text, ())
    if words is None:
        assert found is None
    else:
        assert found is not None and words in found, found


def test_note_names_the_tools_and_the_schema() -> None:
    note = AnswerFormat((WEATHER,), "required", SCHEMA).note() or ""
    assert "- get_weather: The weather now." in note
    assert "must call one" in note and "JSON schema Capital" in note
    assert AnswerFormat().note() is None


def test_cache_key_holds_tools_and_keeps_old_keys(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    target = make_pool(tmp_path, fake_server).workers[0]
    plain = ModelRequest(messages=({"role": "user", "content": "hi"},))
    tooled = AnswerFormat((WEATHER,)).apply(plain)
    forced = AnswerFormat((WEATHER,), ForcedTool("get_weather")).apply(plain)
    keys = {cache_key(target, r) for r in (plain, tooled, forced)}
    assert len(keys) == 3
    # A request without tools has the key it had before tools existed.
    assert cache_key(target, plain) == cache_key(target, ModelRequest(messages=plain.messages))


def test_a_tool_call_reply_is_cached_whole(tmp_path: Path) -> None:
    raw = RawCompletion(
        "", Usage(1, 2), {"x": 1}, tool_calls=(ToolCall("c1", "get_weather", "{}"),)
    )
    with ResponseCache(tmp_path / "cache") as cache:
        cache.set("k", raw)
        hit = cache.get("k")
    assert hit is not None and hit.tool_calls == raw.tool_calls


async def test_only_the_final_step_gets_the_tools(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, lists([0, 1], ["Look.", "Answer."], [[], [0]]))
    fake_server.script("w0", "notes")
    fake_server.script("w1", Reply("", tool_calls=[FakeToolCall("get_weather", {"city": "P"})]))
    record = await run(make_pool(tmp_path, fake_server), AnswerFormat((WEATHER,)), rounds=3)
    assert record.status == "ok"
    assert record.final_answer is None
    assert record.final_tool_calls == [
        {"id": "call_0", "name": "get_weather", "arguments": '{"city": "P"}'}
    ]
    # A tool-call answer ends the run: no revision round is planned.
    assert len(record.rounds) == 1 and record.rounds[0].stop_reason == "the answer calls tools"
    assert record.answer_format["tools"][0]["function"]["name"] == "get_weather"
    assert fake_server.requests_for("w0")[0].tools == []
    assert fake_server.requests_for(CONDUCTOR_MODEL)[0].tools == []
    assert fake_server.requests_for("w1")[0].tools == ["get_weather"]
    # The record keeps the calls, and reads back.
    write_record(record, tmp_path / "r.json")
    again = read_record(tmp_path / "r.json")
    assert again.final_tool_calls == record.final_tool_calls
    assert again.rounds[0].steps[1].call.tool_calls == record.final_tool_calls


async def test_an_earlier_steps_text_never_stands_in_for_the_answer(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script(CONDUCTOR_MODEL, lists([0, 1], ["Look.", "Answer."], [[], [0]]))
    fake_server.script("w0", '{"city": "Paris"}')
    fake_server.script("w1", "not json at all")
    record = await run(make_pool(tmp_path, fake_server), AnswerFormat(response_format=SCHEMA))
    assert record.status == "failed" and record.final_answer is None
    step = record.rounds[0].steps[1]
    assert step.status == "failed"
    assert "broke the requested answer format after 2 tries: the reply is not JSON" in (
        step.call.error or ""
    )
    (rejected,) = step.rejected
    assert rejected.response == "not json at all" and rejected.error_kind == "AnswerFormatError"
    # Both tries are counted, and the record reads back with them.
    assert record.totals.calls == 4
    write_record(record, tmp_path / "r.json")
    assert len(read_record(tmp_path / "r.json").rounds[0].steps[1].rejected) == 1
