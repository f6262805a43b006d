"""A run record as OpenTelemetry GenAI spans, planned in plain data (no OpenTelemetry
import here: the exporter turns the plan into SDK spans, tests read it directly).

One record (one question) is one trace::

    invoke_workflow {strategy}                 the question (root)
      invoke_workflow {strategy} round K       one per Conductor round
        plan {conductor model}                 the Conductor writing the workflow
          chat {conductor model}               each try (a parse error is an event)
        invoke_agent {worker id}               one per step, linked to the steps it sees
          chat {worker model}                  each try (rejected ones first)

Names and attributes follow the GenAI semantic conventions (``gen_ai.*``, Development
status); what they have no name for is under ``conductor.*`` (cost, cache, batch,
queue time, the record's ids).  ``plan`` is not among the conventions' operation names;
they allow a custom one where none applies.  Message contents (``gen_ai.input.messages``,
``gen_ai.output.messages``, subtasks) are written only with ``content=True``, the
conventions' opt-in; a record holds no keys, and endpoints show only host and port.
Live runs and ``conductor export otel`` both go through :func:`record_spans`, so a
replayed run's spans are the ones it emitted, at the times the record gives.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..record import CallRecord, RoundRecord, RunRecord, StepRecord

__all__ = ["AttributeValue", "PlannedEvent", "PlannedLink", "PlannedSpan", "record_spans"]

#: What an OpenTelemetry attribute may hold.
AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]

#: ``gen_ai.provider.name`` for each client, and for litellm's model prefixes (the
#: conventions' well-known values; anything else is named as the pool names it).
_PROVIDERS = {
    "openai": "openai",
    "anthropic": "anthropic",
    "google": "gcp.gemini",
    "gemini": "gcp.gemini",
    "vertex_ai": "gcp.vertex_ai",
    "bedrock": "aws.bedrock",
    "azure": "azure.ai.openai",
    "groq": "groq",
    "mistral": "mistral_ai",
    "deepseek": "deepseek",
    "xai": "x_ai",
    "perplexity": "perplexity",
    "cohere": "cohere",
}


@dataclass
class PlannedEvent:
    name: str
    time_ns: int
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


@dataclass
class PlannedLink:
    """A link to the span at ``target`` (an index into the plan)."""

    target: int
    attributes: dict[str, AttributeValue] = field(default_factory=dict)


@dataclass
class PlannedSpan:
    """One span: ``parent`` is the index of its parent in the plan (``None``: the root),
    and always smaller than its own; ``error`` sets the status to ERROR."""

    name: str
    kind: Literal["internal", "client"]
    start_ns: int
    end_ns: int
    parent: int | None
    attributes: dict[str, AttributeValue]
    events: list[PlannedEvent] = field(default_factory=list)
    links: list[PlannedLink] = field(default_factory=list)
    error: str | None = None


def record_spans(
    record: RunRecord, *, content: bool = False, source: str | None = None
) -> list[PlannedSpan]:
    """The spans of ``record``, parents before children.  ``source`` (where the record
    is kept: a file, or a file and line) is written on the root as ``conductor.record``."""
    return _Planner(record, content).plan(source)


def _ns(iso: str | None) -> int | None:
    """An ISO 8601 time as nanoseconds since the epoch (``None`` when absent or bad: a
    hostile or hand-edited record must not stop an export)."""
    if not iso:
        return None
    try:
        moment = datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        return None
    return int(moment.timestamp() * 1_000_000) * 1000


def _sum_usage(calls: Sequence[CallRecord]) -> dict[str, AttributeValue]:
    out: dict[str, AttributeValue] = {
        "gen_ai.usage.input_tokens": sum(c.input_tokens for c in calls),
        "gen_ai.usage.output_tokens": sum(c.output_tokens for c in calls),
    }
    costs = [c.cost_usd for c in calls]
    if calls and all(c is not None for c in costs):
        out["conductor.cost_usd"] = round(sum(c for c in costs if c is not None), 10)
    return out


def _text_parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as the conventions' parts (text only; other parts of a
    multimodal message are named by type)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    parts: list[dict[str, Any]] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append({"type": "text", "content": part["text"]})
            elif isinstance(part, Mapping):
                parts.append({"type": str(part.get("type") or "unknown")})
    return parts


def _tool_call_parts(calls: Any) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for tc in calls or []:
        if not isinstance(tc, Mapping):
            continue
        inner = tc.get("function")
        fn: Mapping[str, Any] = inner if isinstance(inner, Mapping) else tc
        parts.append(
            {
                "type": "tool_call",
                "id": tc.get("id"),
                "name": fn.get("name"),
                "arguments": fn.get("arguments"),
            }
        )
    return parts


def input_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """``gen_ai.input.messages``: the chat history sent, as the conventions' JSON."""
    out = []
    for m in messages:
        role = str(m.get("role") or "user")
        if role == "tool":
            parts: list[dict[str, Any]] = [
                {
                    "type": "tool_call_response",
                    "id": m.get("tool_call_id"),
                    "response": m.get("content"),
                }
            ]
        else:
            parts = _text_parts(m.get("content")) + _tool_call_parts(m.get("tool_calls"))
        out.append({"role": role, "parts": parts})
    return json.dumps(out, ensure_ascii=False)


def output_messages(
    text: str | None, tool_calls: Any = None, finish_reason: str | None = None
) -> str:
    """``gen_ai.output.messages``: one reply, as the conventions' JSON."""
    parts = _text_parts(text) + _tool_call_parts(tool_calls)
    message = {"role": "assistant", "parts": parts, "finish_reason": finish_reason or "stop"}
    return json.dumps([message], ensure_ascii=False)


def _endpoint(api_base: Any) -> dict[str, AttributeValue]:
    """``server.address`` and ``server.port`` of an endpoint: host and port only, never
    the user-info or query a URL may carry."""
    if not isinstance(api_base, str) or not api_base:
        return {}
    try:
        parts = urllib.parse.urlsplit(api_base)
        host, port = parts.hostname, parts.port
    except ValueError:
        return {}
    out: dict[str, AttributeValue] = {}
    if host:
        out["server.address"] = host
    if port is None and parts.scheme in ("http", "https"):
        port = 443 if parts.scheme == "https" else 80
    if port is not None and host:
        out["server.port"] = port
    return out


def _provider(target: Mapping[str, Any]) -> str:
    client = str(target.get("client") or "")
    model = str(target.get("model") or "")
    if client == "litellm" and "/" in model:
        prefix = model.split("/", 1)[0]
        return _PROVIDERS.get(prefix, prefix)
    if not client:
        return "conductor.local" if target.get("model_path") else "unknown"
    return _PROVIDERS.get(client, client)


def _request_params(target: Mapping[str, Any]) -> dict[str, AttributeValue]:
    params = target.get("params")
    out: dict[str, AttributeValue] = {}
    if not isinstance(params, Mapping):
        return out
    for key, name, kind in (
        ("temperature", "gen_ai.request.temperature", float),
        ("top_p", "gen_ai.request.top_p", float),
        ("max_tokens", "gen_ai.request.max_tokens", int),
        ("seed", "gen_ai.request.seed", int),
    ):
        value = params.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = kind(value)
    return out


def _response_fields(raw: Any) -> dict[str, AttributeValue]:
    out: dict[str, AttributeValue] = {}
    if not isinstance(raw, Mapping):
        return out
    rid = raw.get("id", raw.get("responseId"))
    if isinstance(rid, str) and rid:
        out["gen_ai.response.id"] = rid
    model = raw.get("model", raw.get("modelVersion"))
    if isinstance(model, str) and model:
        out["gen_ai.response.model"] = model
    return out


class _Planner:
    def __init__(self, record: RunRecord, content: bool) -> None:
        self.record = record
        self.content = content
        self.spans: list[PlannedSpan] = []
        pool = record.pool if isinstance(record.pool, Mapping) else {}
        listed = pool.get("workers")
        workers: list[Any] = listed if isinstance(listed, list) else []
        self.workers: dict[str, Mapping[str, Any]] = {
            str(w.get("id")): w for w in workers if isinstance(w, Mapping)
        }
        conductor = record.conductor if isinstance(record.conductor, Mapping) else {}
        target = conductor.get("target")
        self.conductor: Mapping[str, Any] = target if isinstance(target, Mapping) else {}
        self.workflow_name = record.strategy or "conductor"

    def add(self, span: PlannedSpan) -> int:
        self.spans.append(span)
        return len(self.spans) - 1

    # -- the question ---------------------------------------------------------------

    def plan(self, source: str | None) -> list[PlannedSpan]:
        r = self.record
        start = _ns(r.started_at) or 0
        root = self.add(
            PlannedSpan(
                f"invoke_workflow {self.workflow_name}",
                "internal",
                start,
                _ns(r.finished_at) or start,
                None,
                self.root_attributes(source),
                error=r.error if r.status == "failed" else None,
            )
        )
        history: list[int] = []  # the step spans of the rounds so far
        end = start
        for rnd in r.rounds:
            end = max(end, self.round(rnd, root, history, end))
        span = self.spans[root]
        if r.finished_at is None or span.end_ns < end:
            span.end_ns = end  # an interrupted run: it ended with its last call
        return self.spans

    def root_attributes(self, source: str | None) -> dict[str, AttributeValue]:
        r = self.record
        t = r.totals
        attrs: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.workflow.name": self.workflow_name,
            "conductor.run_id": r.run_id,
            "conductor.status": r.status,
            "conductor.rounds": len(r.rounds),
            "conductor.calls": t.calls,
            "conductor.cached_calls": t.cached_calls,
            "conductor.failed_calls": t.failed_calls,
            "conductor.batch_calls": t.batch_calls,
            "gen_ai.usage.input_tokens": t.input_tokens,
            "gen_ai.usage.output_tokens": t.output_tokens,
            "conductor.wall_s": t.wall_s,
            "conductor.queue_s": t.queue_s,
        }
        if t.cost_usd is not None and t.unknown_cost_calls == 0:
            attrs["conductor.cost_usd"] = t.cost_usd
        if t.live_cost_usd is not None:
            attrs["conductor.live_cost_usd"] = t.live_cost_usd
        if r.sample_id is not None:
            attrs["conductor.sample_id"] = r.sample_id
        if r.epoch is not None:
            attrs["conductor.epoch"] = r.epoch
        if source:
            attrs["conductor.record"] = source
        for key, value in (("benchmark", r.benchmark), ("strategy", r.strategy)):
            if value is not None:
                attrs[f"conductor.{key}"] = value
        if isinstance(r.grade, Mapping):
            status = r.grade.get("status")
            if isinstance(status, str):
                attrs["conductor.grade.status"] = status
            score = r.grade.get("score")
            if isinstance(score, (int, float)) and not isinstance(score, bool):
                attrs["conductor.grade.score"] = float(score)
        if isinstance(r.replayed_from, Mapping) and isinstance(r.replayed_from.get("run_id"), str):
            attrs["conductor.replayed_from"] = r.replayed_from["run_id"]
        if r.status == "failed":
            attrs["error.type"] = "RunFailed"
        if self.content:
            attrs["gen_ai.input.messages"] = input_messages(
                [{"role": "user", "content": r.question}]
            )
            if r.answered:
                attrs["gen_ai.output.messages"] = output_messages(
                    r.final_answer, r.final_tool_calls
                )
        return attrs

    # -- a round ----------------------------------------------------------------------

    def round(self, rnd: RoundRecord, root: int, history: list[int], after: int) -> int:
        """Plan round ``rnd`` under ``root``; returns when it ended."""
        name = f"{self.workflow_name} round {rnd.index + 1}"
        attrs: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.workflow.name": name,
            "conductor.round": rnd.index,
            "conductor.steps": len(rnd.steps),
        }
        if rnd.stop_reason:
            attrs["conductor.stop_reason"] = rnd.stop_reason
        calls = list(rnd.conductor_calls)
        for s in rnd.steps:
            calls.extend(s.rejected)
            if s.status != "skipped":
                calls.append(s.call)
        attrs.update(_sum_usage(calls))
        me = self.add(PlannedSpan(f"invoke_workflow {name}", "internal", after, after, root, attrs))
        # A baseline's round has no Conductor: its steps were planned by the strategy.
        start, end = self.plan_span(rnd, me, after) if rnd.conductor_calls else (after, after)
        steps: dict[int, int] = {}
        for step in rnd.steps:
            s_start, s_end = self.step(step, rnd, me, steps, history, end)
            start, end = min(start, s_start), max(end, s_end)
        history.extend(steps.values())
        span = self.spans[me]
        span.start_ns, span.end_ns = start, end
        if rnd.workflow is None and rnd.conductor_calls:
            span.error = "the Conductor wrote no workflow that could be run"
            attrs["error.type"] = "ConductorParseError"
        return end

    def plan_span(self, rnd: RoundRecord, parent: int, after: int) -> tuple[int, int]:
        target = self.conductor
        model = str(target.get("model") or "conductor")
        attrs: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "plan",
            "gen_ai.agent.name": "conductor",
            "gen_ai.provider.name": _provider(target),
            "gen_ai.request.model": model,
            "conductor.round": rnd.index,
            "conductor.plan.tries": len(rnd.conductor_calls),
        }
        attrs.update(_sum_usage(rnd.conductor_calls))
        wf = rnd.workflow if isinstance(rnd.workflow, Mapping) else None
        if wf is not None:
            ids = wf.get("model_id")
            if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
                attrs["conductor.workflow.model_id"] = ids
            if self.content:
                attrs["gen_ai.output.messages"] = output_messages(
                    json.dumps(wf, ensure_ascii=False)
                )
        me = self.add(PlannedSpan(f"plan {model}", "internal", after, after, parent, attrs))
        start, end = self.calls(rnd.conductor_calls, me, target, after)
        span = self.spans[me]
        span.start_ns, span.end_ns = start, end
        for i, error in enumerate(rnd.parse_errors):
            call = rnd.conductor_calls[i] if i < len(rnd.conductor_calls) else None
            at = (_ns(call.finished_at) if call is not None else None) or end
            span.events.append(
                PlannedEvent(
                    "conductor.plan.parse_error", at, {"conductor.try": i, "conductor.error": error}
                )
            )
        if wf is None:
            span.error = rnd.parse_errors[-1] if rnd.parse_errors else "no workflow"
            attrs["error.type"] = "ConductorParseError"
        return start, end

    # -- a step -----------------------------------------------------------------------

    def step(
        self,
        step: StepRecord,
        rnd: RoundRecord,
        parent: int,
        steps: dict[int, int],
        history: list[int],
        after: int,
    ) -> tuple[int, int]:
        worker = self.workers.get(step.worker_id, {})
        attrs: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": step.worker_id,
            "gen_ai.agent.id": step.worker_id,
            "gen_ai.provider.name": _provider(worker),
            "gen_ai.request.model": step.model,
            "conductor.round": rnd.index,
            "conductor.step": step.index,
            "conductor.worker_index": step.worker_index,
            "conductor.step.status": step.status,
            "conductor.step.visible_steps": [int(i) for i in step.visible_steps],
        }
        description = worker.get("description")
        if isinstance(description, str) and description:
            attrs["gen_ai.agent.description"] = description
        tries = [*step.rejected, *([] if step.status == "skipped" else [step.call])]
        attrs.update(_sum_usage(tries))
        if self.content:
            attrs["gen_ai.input.messages"] = input_messages(
                [{"role": "user", "content": step.subtask}]
            )
            if step.answer is not None:
                attrs["gen_ai.output.messages"] = output_messages(step.answer)
        links = [
            PlannedLink(steps[i], {"conductor.link": "may_see", "conductor.step": i})
            for i in step.visible_steps
            if i in steps
        ]
        if any(a == "all" for a in step.access):
            links += [PlannedLink(h, {"conductor.link": "history"}) for h in history]
        me = self.add(
            PlannedSpan(
                f"invoke_agent {step.worker_id}",
                "internal",
                after,
                after,
                parent,
                attrs,
                links=links,
            )
        )
        steps[step.index] = me
        span = self.spans[me]
        if step.status == "skipped":
            # Never sent: a point at the time the round had reached.
            span.error = None
            attrs["conductor.skip_reason"] = step.call.error or "skipped"
            return after, after
        start, end = self.calls(tries, me, worker, after)
        span.start_ns, span.end_ns = start, end
        if step.status == "failed":
            span.error = step.call.error or "the step failed"
            attrs["error.type"] = step.call.error_kind or "StepFailed"
        return start, end

    # -- calls ------------------------------------------------------------------------

    def calls(
        self, calls: Sequence[CallRecord], parent: int, target: Mapping[str, Any], after: int
    ) -> tuple[int, int]:
        """One ``chat`` span per call under ``parent``; returns when the first began and
        the last ended (``after`` when there are none)."""
        start: int | None = None
        end = after
        for i, call in enumerate(calls):
            s, e = self.chat(call, parent, target, i, end)
            start = s if start is None else min(start, s)
            end = max(end, e)
        return (after if start is None else start), end

    def chat(
        self, call: CallRecord, parent: int, target: Mapping[str, Any], attempt: int, after: int
    ) -> tuple[int, int]:
        start = _ns(call.started_at) or after
        end = max(start, _ns(call.finished_at) or start)
        model = str(target.get("model") or "unknown")
        attrs: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": _provider(target),
            "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": call.input_tokens,
            "gen_ai.usage.output_tokens": call.output_tokens,
            "conductor.try": attempt,
            "conductor.attempts": call.attempts,
            "conductor.cached": call.cached,
            "conductor.batch": call.batch,
            "conductor.latency_s": call.latency_s,
            "conductor.queue_s": call.queue_s,
        }
        attrs.update(_request_params(target))
        attrs.update(_endpoint(target.get("api_base")))
        attrs.update(_response_fields(call.raw))
        if call.finish_reason:
            attrs["gen_ai.response.finish_reasons"] = [call.finish_reason]
        if call.cost_usd is not None:
            attrs["conductor.cost_usd"] = call.cost_usd
            attrs["conductor.cost_reported"] = call.cost_reported
        if call.live_cost_usd is not None:
            attrs["conductor.live_cost_usd"] = call.live_cost_usd
        if call.truncated:
            attrs["conductor.truncated"] = True
        if call.error_kind:
            attrs["error.type"] = call.error_kind
        if self.content:
            attrs["gen_ai.input.messages"] = input_messages(call.messages)
            if call.response is not None or call.tool_calls:
                attrs["gen_ai.output.messages"] = output_messages(
                    call.reply, call.tool_calls, call.finish_reason
                )
        events = []
        for retry in call.retries:
            if not isinstance(retry, Mapping):
                continue
            ev: dict[str, AttributeValue] = {}
            for key, name in (
                ("attempt", "conductor.attempt"),
                ("error_kind", "error.type"),
                ("status", "http.response.status_code"),
                ("error", "conductor.error"),
                ("wait_s", "conductor.wait_s"),
            ):
                value = retry.get(key)
                if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                    ev[name] = value
            events.append(PlannedEvent("conductor.retry", _ns(retry.get("at")) or start, ev))
        self.add(
            PlannedSpan(
                f"chat {model}",
                "client",
                start,
                end,
                parent,
                attrs,
                events=events,
                error=call.error if call.error else None,
            )
        )
        return start, end
