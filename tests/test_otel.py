"""OpenTelemetry traces of runs, checked span by span with the SDK's in-memory exporter:
the tree (names, kinds, parents), the ``gen_ai.*`` attributes, each "may see" edge as a
link, retries as events at the times they happened, message contents only when asked,
keys never, and the same spans live and replayed from the records."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.benchkit import boxed_number, make_math_file
from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, worker

from conductor.conductors.spec import resolve_conductor
from conductor.execute import RunSettings
from conductor.llm.caller import CallerSet
from conductor.pool import load_pool_text
from conductor.record import RunRecord, record_from_dict, record_to_dict
from conductor.strategies import ConductorStrategy
from conductor.testing import FakeLLMServer, Fault, Reply

otel_sdk = pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from conductor.otel import RecordTracer, otel_settings, record_spans  # noqa: E402

SECRET = "sk-test-0123456789abcdef-never-in-a-span"


def _pool(server: FakeLLMServer, **conductor: Any) -> dict[str, Any]:
    return pool_dict(
        server,
        [
            worker(server, "w0", price={"input_per_mtok": 1.0, "output_per_mtok": 2.0}),
            worker(
                server,
                "w1",
                client="anthropic",
                description="the careful one",
                price={"input_per_mtok": 3.0, "output_per_mtok": 4.0},
            ),
        ],
        price={"input_per_mtok": 0.5, "output_per_mtok": 0.5},
        **conductor,
    )


def _run(
    server: FakeLLMServer, question: str = "What is 7 + 0?", rounds: int = 1, **pool: Any
) -> RunRecord:
    import yaml

    loaded = load_pool_text(yaml.safe_dump(_pool(server, **pool)))
    strategy = ConductorStrategy(
        loaded, resolve_conductor(loaded), RunSettings(rounds=rounds), CallerSet(None)
    )

    async def go() -> RunRecord:
        try:
            return await strategy.run(question, sample_index=0)
        finally:
            await strategy.aclose()

    return asyncio.run(go())


def _export(record: RunRecord, *, content: bool = False, **kw: Any) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    tracer = RecordTracer(memory, content=content, where="memory")
    tracer.emit(record, **kw)
    report = tracer.close()
    assert report.problem() is None, report
    return list(memory.get_finished_spans())


def _by_id(spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans}


def _ns(iso: str | None) -> int:
    from datetime import datetime

    assert iso is not None
    return int(datetime.fromisoformat(iso).timestamp() * 1_000_000) * 1000


@pytest.fixture
def three_steps(fake_server: FakeLLMServer) -> Iterator[FakeLLMServer]:
    """A Conductor writing three steps (w0, then w1 seeing step 0, then w0 seeing both);
    the workers answer with the right boxed number."""
    fake_server.script(
        CONDUCTOR_MODEL,
        [lists([0, 1, 0], ["solve", "check", "combine"], [[], [0], [0, 1]])] * 20,
    )
    fake_server.script("w0", boxed_number)
    fake_server.script("w1", boxed_number)
    yield fake_server


def test_a_workflow_is_one_trace_with_a_span_per_round_plan_step_and_call(
    three_steps: FakeLLMServer,
) -> None:
    record = _run(three_steps)
    spans = _export(record)
    # Parents are exported with their children: one trace, one root.
    assert len({s.context.trace_id for s in spans}) == 1
    names = [s.name for s in spans]
    assert names == [
        "invoke_workflow conductor",
        "invoke_workflow conductor round 1",
        f"plan {CONDUCTOR_MODEL}",
        f"chat {CONDUCTOR_MODEL}",
        "invoke_agent w0",
        "chat w0",
        "invoke_agent w1",
        "chat w1",
        "invoke_agent w0",
        "chat w0",
    ]
    by_id = _by_id(spans)
    parent = {
        s.name + str(i): (by_id[s.parent.span_id].name if s.parent else None)
        for i, s in enumerate(spans)
    }
    assert parent["invoke_workflow conductor0"] is None
    assert parent["invoke_workflow conductor round 11"] == "invoke_workflow conductor"
    assert parent[f"plan {CONDUCTOR_MODEL}2"] == "invoke_workflow conductor round 1"
    assert parent[f"chat {CONDUCTOR_MODEL}3"] == f"plan {CONDUCTOR_MODEL}"
    for i in (4, 6, 8):
        assert parent[names[i] + str(i)] == "invoke_workflow conductor round 1"
        assert parent[names[i + 1] + str(i + 1)] == names[i]
    kinds = {s.name: s.kind for s in spans}
    assert kinds["chat w0"] == SpanKind.CLIENT
    assert kinds["invoke_agent w1"] == SpanKind.INTERNAL

    root = spans[0].attributes or {}
    assert root["gen_ai.operation.name"] == "invoke_workflow"
    assert root["gen_ai.workflow.name"] == "conductor"
    assert root["conductor.run_id"] == record.run_id
    assert root["conductor.status"] == "ok"
    assert root["conductor.calls"] == 4
    assert root["gen_ai.usage.input_tokens"] == record.totals.input_tokens
    assert root["gen_ai.usage.output_tokens"] == record.totals.output_tokens
    assert root["conductor.cost_usd"] == pytest.approx(record.totals.cost_usd)
    assert spans[0].start_time == _ns(record.started_at)
    assert spans[0].end_time == _ns(record.finished_at)

    plan = spans[2].attributes or {}
    assert plan["gen_ai.operation.name"] == "plan"
    assert plan["gen_ai.agent.name"] == "conductor"
    assert plan["gen_ai.provider.name"] == "openai"
    assert list(plan["conductor.workflow.model_id"]) == [0, 1, 0]  # type: ignore[arg-type]

    agent = spans[6].attributes or {}
    assert agent["gen_ai.operation.name"] == "invoke_agent"
    assert agent["gen_ai.agent.name"] == "w1"
    assert agent["gen_ai.agent.description"] == "the careful one"
    assert agent["gen_ai.provider.name"] == "anthropic"
    assert agent["conductor.step"] == 1
    assert list(agent["conductor.step.visible_steps"]) == [0]  # type: ignore[arg-type]

    chat = spans[7].attributes or {}
    step = record.rounds[0].steps[1]
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.request.model"] == "w1"
    assert chat["gen_ai.usage.input_tokens"] == step.call.input_tokens
    assert chat["gen_ai.usage.output_tokens"] == step.call.output_tokens
    assert chat["conductor.cost_usd"] == pytest.approx(step.call.cost_usd)
    assert chat["server.address"] == "127.0.0.1"
    assert chat["server.port"] == three_steps.port
    assert list(chat["gen_ai.response.finish_reasons"]) == [step.call.finish_reason]  # type: ignore[arg-type]
    assert chat["gen_ai.request.temperature"] == pytest.approx(0.2)
    assert spans[7].start_time == _ns(step.call.started_at)
    assert spans[7].end_time == _ns(step.call.finished_at)
    # Every child lies within its parent.
    for s in spans:
        if s.parent is not None:
            p = by_id[s.parent.span_id]
            assert p.start_time is not None and s.start_time is not None
            assert p.start_time <= s.start_time and s.end_time <= p.end_time, (s.name, p.name)  # type: ignore[operator]


def test_each_may_see_edge_is_a_link_to_the_step_seen(three_steps: FakeLLMServer) -> None:
    spans = _export(_run(three_steps))
    agents = [s for s in spans if s.name.startswith("invoke_agent")]
    index_of = {s.context.span_id: (s.attributes or {})["conductor.step"] for s in agents}
    seen = {
        (s.attributes or {})["conductor.step"]: sorted(
            index_of[link.context.span_id] for link in s.links
        )
        for s in agents
    }
    assert seen == {0: [], 1: [0], 2: [0, 1]}
    for s in agents:
        for link in s.links:
            assert (link.attributes or {})["conductor.link"] == "may_see"
            assert link.context.trace_id == s.context.trace_id


def test_a_second_round_links_a_step_seeing_all_to_the_first_rounds_steps(
    fake_server: FakeLLMServer,
) -> None:
    fake_server.script(
        CONDUCTOR_MODEL,
        [
            lists([0, 1], ["solve", "check"], [[], [0]]),
            lists([1], ["revise"], [["all"]]),
        ],
    )
    fake_server.script("w0", boxed_number)
    fake_server.script("w1", boxed_number)
    record = _run(fake_server, rounds=2)
    assert len(record.rounds) == 2
    spans = _export(record)
    rounds = [s for s in spans if s.name.startswith("invoke_workflow conductor round")]
    assert [s.name for s in rounds] == [
        "invoke_workflow conductor round 1",
        "invoke_workflow conductor round 2",
    ]
    agents = [s for s in spans if s.name.startswith("invoke_agent")]
    first_round = {s.context.span_id for s in agents[:2]}
    revise = agents[2]
    history = [
        link for link in revise.links if (link.attributes or {})["conductor.link"] == "history"
    ]
    assert {link.context.span_id for link in history} == first_round


def test_a_retry_is_an_event_at_the_time_it_failed(fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0], ["solve"], [[]])])
    fake_server.script(
        "w0", [Fault(429, "slow down", headers={"Retry-After": "0"}), Reply("\\boxed{7}")]
    )
    record = _run(fake_server)
    call = record.rounds[0].steps[0].call
    assert call.attempts == 2
    assert len(call.retries) == 1
    assert call.retries[0]["error_kind"] == "RateLimitError"
    assert call.retries[0]["status"] == 429
    # The record keeps it, and reads it back.
    again = record_from_dict(json.loads(json.dumps(record_to_dict(record))))
    assert again.rounds[0].steps[0].call.retries == call.retries
    spans = _export(record)
    chat = next(s for s in spans if s.name == "chat w0")
    (event,) = chat.events
    assert event.name == "conductor.retry"
    assert event.attributes is not None
    assert event.attributes["error.type"] == "RateLimitError"
    assert event.attributes["http.response.status_code"] == 429
    assert event.attributes["conductor.attempt"] == 1
    assert event.timestamp == _ns(call.retries[0]["at"])
    assert chat.start_time is not None and chat.start_time <= event.timestamp <= chat.end_time  # type: ignore[operator]
    assert (chat.attributes or {})["conductor.attempts"] == 2


def test_a_failed_step_and_run_have_error_status(fake_server: FakeLLMServer) -> None:
    fake_server.script(CONDUCTOR_MODEL, [lists([0], ["solve"], [[]])])
    fake_server.script("w0", [Fault(400, "no such thing")] * 5)
    record = _run(fake_server)
    assert record.status == "failed"
    spans = _export(record)
    chat = next(s for s in spans if s.name == "chat w0")
    agent = next(s for s in spans if s.name == "invoke_agent w0")
    for span in (chat, agent, spans[0]):
        assert span.status.status_code == StatusCode.ERROR, span.name
    assert (chat.attributes or {})["error.type"] == "BadRequestError"
    assert "no such thing" in (chat.status.description or "")


def _all_values(spans: list[ReadableSpan]) -> str:
    parts: list[str] = []
    for s in spans:
        parts.append(s.name)
        parts.extend(str(v) for v in (s.attributes or {}).values())
        for e in s.events:
            parts.extend(str(v) for v in (e.attributes or {}).values())
        if s.status.description:
            parts.append(s.status.description)
    return "\n".join(parts)


def test_message_contents_only_when_asked_and_keys_never(
    three_steps: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDUCTOR_TEST_KEY", SECRET)
    question = "What is 7 + 0? (a private question)"
    record = _run(three_steps, question=question, api_key_env="CONDUCTOR_TEST_KEY")
    assert record.status == "ok", record.error
    plain = _export(record)
    text = _all_values(plain)
    assert "private question" not in text
    assert "check" not in text  # a subtask
    assert not any(
        k.startswith("gen_ai.input") or k.startswith("gen_ai.output")
        for s in plain
        for k in (s.attributes or {})
    )
    full = _export(record, content=True)
    text = _all_values(full)
    assert SECRET not in text
    assert "private question" in text
    root = full[0].attributes or {}
    asked = json.loads(str(root["gen_ai.input.messages"]))
    assert asked == [{"role": "user", "parts": [{"type": "text", "content": question}]}]
    answered = json.loads(str(root["gen_ai.output.messages"]))
    assert answered[0]["role"] == "assistant"
    assert answered[0]["parts"][0] == {"type": "text", "content": record.final_answer}
    assert answered[0]["finish_reason"]
    chat = next(s for s in full if s.name == "chat w1").attributes or {}
    sent = json.loads(str(chat["gen_ai.input.messages"]))
    assert [m["role"] for m in sent] == [m["role"] for m in record.rounds[0].steps[1].call.messages]
    assert all(p["type"] == "text" for m in sent for p in m["parts"])
    agent = next(s for s in full if s.name == "invoke_agent w1").attributes or {}
    assert json.loads(str(agent["gen_ai.input.messages"]))[0]["parts"][0]["content"] == "check"


def test_the_content_opt_in_follows_the_conventions_variable() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    off = otel_settings(None, env=env)
    assert off is not None and not off.content
    assert off.endpoint == "http://collector:4318/v1/traces"
    for value in ("true", "SPAN_ONLY", "span_and_event"):
        on = otel_settings(
            None, env={**env, "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": value}
        )
        assert on is not None and on.content, value
    for value in ("false", "NO_CONTENT", "event_only"):
        kept = otel_settings(
            None, env={**env, "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": value}
        )
        assert kept is not None and not kept.content, value


def test_where_spans_go_follows_the_otel_variables() -> None:
    from conductor.errors import UsageError

    assert otel_settings(None, env={}) is None
    traces = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://t.example/custom/path"}
    got = otel_settings(None, env={**traces, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:4318"})
    assert got is not None and got.endpoint == "https://t.example/custom/path"
    flag = otel_settings("http://127.0.0.1:4318/", env=traces)
    assert flag is not None and flag.endpoint == "http://127.0.0.1:4318/v1/traces"
    kept = otel_settings("http://h:1/v1/traces", env={})
    assert kept is not None and kept.endpoint == "http://h:1/v1/traces"
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert otel_settings(None, env={**base, "OTEL_SDK_DISABLED": "true"}) is None
    assert otel_settings(None, env={**base, "OTEL_TRACES_EXPORTER": "none"}) is None
    assert otel_settings(None, env=base, disabled=True) is None
    console = otel_settings(None, env={"OTEL_TRACES_EXPORTER": "console"})
    assert console is not None and console.protocol == "console"
    default = otel_settings(None, env={"OTEL_TRACES_EXPORTER": "otlp"})
    assert default is not None and default.endpoint == "http://localhost:4318/v1/traces"
    for bad in (
        {"OTEL_TRACES_EXPORTER": "zipkin"},
        {**base, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
    ):
        with pytest.raises(UsageError):
            otel_settings(None, env=bad)
    for url in ("localhost:4318", "ftp://x", "http://", "http://h:port"):
        with pytest.raises(UsageError, match="--otel"):
            otel_settings(url, env={})


def test_a_caller_s_trace_context_is_the_root_s_parent(three_steps: FakeLLMServer) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = "00f067aa0ba902b7"
    spans = _export(_run(three_steps), traceparent=f"00-{trace_id}-{parent}-01")
    assert {format(s.context.trace_id, "032x") for s in spans} == {trace_id}
    assert spans[0].parent is not None and format(spans[0].parent.span_id, "016x") == parent
    # A malformed one is ignored: the run gets a trace of its own.
    spans = _export(_run(three_steps), traceparent="00-zzzz-yy-01")
    assert spans[0].parent is None


def test_hostile_records_export_what_they_can(three_steps: FakeLLMServer) -> None:
    record = _run(three_steps)
    data = record_to_dict(record)
    data["started_at"] = "not a time"
    data["rounds"][0]["steps"][1]["call"]["started_at"] = "2026-13-45"
    data["rounds"][0]["steps"][1]["call"]["retries"] = [{"at": 5, "attempt": "x"}, {}]
    data["pool"]["workers"][0]["api_base"] = "http://[::1"
    data["strategy"] = "conductor\nx" * 3
    hostile = record_from_dict(data)
    spans = _export(hostile)
    assert len(spans) == 10
    for s in spans:
        assert s.end_time is not None and s.start_time is not None and s.start_time <= s.end_time


def test_live_spans_are_the_replayed_spans(tmp_path: Path, three_steps: FakeLLMServer) -> None:
    """A bench run's live spans and ``export otel``'s replay of its directory agree
    span by span: names, tree, attributes, events, links and times (ids differ)."""
    import yaml

    from conductor.bench.runconfig import BenchOptions
    from conductor.bench.runner import run_benchmark
    from conductor.bench.spec import load_benchmark
    from conductor.grading import get_grader
    from conductor.runs.rundir import iter_records

    loaded = load_pool_text(yaml.safe_dump(_pool(three_steps)))
    strategy = ConductorStrategy(loaded, resolve_conductor(loaded), RunSettings(), CallerSet(None))
    data = make_math_file(tmp_path / "m.jsonl", 4)
    out = tmp_path / "run"
    live = InMemorySpanExporter()
    tracer = RecordTracer(live, where="memory")
    options = BenchOptions(out_dir=out, data_file=data, concurrency=4)

    async def go() -> None:
        try:
            await run_benchmark(
                load_benchmark("math500"), strategy, get_grader("math"), {}, options, tracer=tracer
            )
        finally:
            await strategy.aclose()

    asyncio.run(go())
    assert tracer.close().sent == 40
    replayed = InMemorySpanExporter()
    again = RecordTracer(replayed, where="memory")
    for record in iter_records(out / "samples.jsonl"):
        again.emit(record, source=str(out / "samples.jsonl"))
    again.close()

    def shape(spans: list[ReadableSpan]) -> list[Any]:
        by_trace: dict[int, list[ReadableSpan]] = {}
        for s in spans:
            by_trace.setdefault(s.context.trace_id, []).append(s)
        out = []
        for trace in by_trace.values():
            pos = {s.context.span_id: i for i, s in enumerate(trace)}
            out.append(
                [
                    (
                        s.name,
                        pos[s.parent.span_id] if s.parent else None,
                        dict(s.attributes or {}),
                        [(e.name, e.timestamp, dict(e.attributes or {})) for e in s.events],
                        [
                            (pos[link.context.span_id], dict(link.attributes or {}))
                            for link in s.links
                        ],
                        s.start_time,
                        s.end_time,
                        s.status.status_code,
                    )
                    for s in trace
                ]
            )
        return sorted(out, key=lambda t: str(t[0][2]["conductor.run_id"]))

    live_shape = shape(list(live.get_finished_spans()))
    assert len(live_shape) == 4
    assert live_shape == shape(list(replayed.get_finished_spans()))
    graded = {t[0][2]["conductor.grade.status"] for t in live_shape}
    assert graded == {"correct"}


def test_spans_planned_without_the_sdk_match_what_is_sent(three_steps: FakeLLMServer) -> None:
    record = _run(three_steps)
    plans = record_spans(record)
    spans = _export(record)
    assert [p.name for p in plans] == [s.name for s in spans]

    def plain(attrs: Any) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in attrs.items()}

    assert [plain(p.attributes) for p in plans] == [plain(s.attributes or {}) for s in spans]
