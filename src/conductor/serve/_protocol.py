"""The OpenAI chat-completions wire format as ``conductor serve`` speaks it.

One place knows the shapes: a request body read into a typed :class:`ChatRequest`
(every refusal an :class:`ApiError` naming the parameter), the error body OpenAI's
clients parse, and the builders of a ``chat.completion``, its stream chunks and the
``conductor`` field that tells what each run did.  Nothing here touches a run while it
goes; it only reads finished (or cancelled) run records.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..events import Event
from ..llm.answer_format import PLAIN, AnswerFormat
from ..llm.check_workers import RequestChecks
from ..llm.schema_limits import LIMITS, size_problem
from ..llm.types import ForcedTool, ToolCall, ToolChoice, ToolSpec
from ..record import BudgetRecord, RunRecord
from ..redact import mask_text, masked_json

__all__ = [
    "ApiError",
    "answer_format_of",
    "ChatMessage",
    "ChatRenderer",
    "ChatRequest",
    "ChunkStream",
    "MAX_N",
    "broken_body",
    "budget_of",
    "check_schemas",
    "chat_message",
    "RequestBudget",
    "chunk",
    "completion_body",
    "conductor_field",
    "content_text",
    "cost_of",
    "error_body",
    "event_payload",
    "failure_body",
    "failure_message",
    "json_object",
    "model_of",
    "parse_budget",
    "finish_reason",
    "parse_chat_request",
    "pieces",
    "progress_of",
    "refuse_unsupported",
    "samples_of",
    "sse",
    "stream_of",
    "tool_call_deltas",
    "usage_of",
]

#: The most independent samples one request may ask for (``n``).
MAX_N = 16

#: Parameters an orchestration cannot honour: each is refused when it asks for something.
_UNSUPPORTED = (
    "functions",
    "function_call",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "audio",
    "modalities",
    "prediction",
)

#: Roles a message may have; ``developer`` is OpenAI's newer name for ``system``.
_ROLES = ("system", "developer", "user", "assistant")
#: A chat conversation's roles: ``tool`` messages carry the results of tool calls.
_CHAT_ROLES = (*_ROLES, "tool")

#: What a function's name may be (OpenAI's rule).
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

#: Content sent per chunk when an answer is streamed.
PIECE_CHARS = 256


class ApiError(Exception):
    """A request refused with an HTTP status and OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, code=self.code, param=self.param)


def error_body(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``, as OpenAI sends it."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass(frozen=True)
class ChatMessage:
    """One message of the conversation: ``role`` is system, user, assistant or tool.

    An assistant message may hold the ``tool_calls`` it made; a tool message is the
    result of the call ``tool_call_id``."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True)
class RequestBudget:
    """The budget a request asks for in its ``conductor`` object, for all its runs
    together (``None``: the server's ceiling, which also caps what is asked)."""

    max_calls: int | None = None
    max_usd: float | None = None


@dataclass(frozen=True)
class ChatRequest:
    """What a ``POST /v1/chat/completions`` body asks for, checked."""

    model: str
    messages: tuple[ChatMessage, ...]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    progress: bool = False
    #: ``conductor.allowed_workers``: the only workers this request may use (``None``:
    #: all its API key allows), deduplicated, in the order given.
    allowed_workers: tuple[str, ...] | None = None
    budget: RequestBudget = RequestBudget()
    #: The tools, tool choice and JSON response format the answer must keep to.
    answer_format: AnswerFormat = PLAIN
    #: Where the JSON format was asked, for a refusal to name (the Responses API's
    #: ``text.format``).
    format_param: str = "response_format"


def _bad(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def parse_chat_request(raw: bytes) -> ChatRequest:
    """The request in ``raw`` (a JSON body), or an :class:`ApiError` (400) naming what is
    wrong.  Sampling parameters (``temperature``, ``max_tokens``, ...) are accepted and
    left out: each worker's own parameters come from the pool."""
    body = json_object(raw)
    refuse_unsupported(body, _UNSUPPORTED)
    model = model_of(body)
    n = samples_of(body)
    stream, include_usage = stream_of(body)
    return ChatRequest(
        model=model,
        messages=_messages(body.get("messages")),
        n=n,
        stream=stream,
        include_usage=include_usage,
        progress=progress_of(body, stream),
        allowed_workers=allowed_workers_of(body),
        budget=budget_of(body),
        answer_format=answer_format_of(body),
    )


# -- the parts of a request every endpoint reads the same way ---------------------------


def json_object(raw: bytes) -> dict[str, Any]:
    """The JSON object in a request body, or a 400."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        # ValueError holds bad UTF-8 and an integer past Python's digit limit too.
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise _bad(f"the request body is not valid JSON ({reason})", None) from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None)
    return body


def refuse_unsupported(body: dict[str, Any], names: tuple[str, ...]) -> None:
    """A 400 naming the first of ``names`` whose value asks for something."""
    for name in names:
        if _asks(body.get(name)):
            raise _bad(
                f"{name} is not supported by an orchestration: use tools"
                if name in ("functions", "function_call")
                else f"{name} is not supported by an orchestration",
                name,
                "unsupported_parameter",
            )


def model_of(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _bad("model is required: a model id from GET /v1/models", "model")
    return model.strip()


def samples_of(body: dict[str, Any]) -> int:
    """``n``: how many independent runs answer the request."""
    n = body.get("n", 1)
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise _bad(f"n must be an integer from 1 to {MAX_N}", "n")
    return int(n)


def stream_of(body: dict[str, Any]) -> tuple[bool, bool]:
    """``stream``, and whether a stream ends with a usage chunk
    (``stream_options.include_usage``)."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("stream must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _bad("stream_options must be an object", "stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise _bad("stream_options.include_usage must be true or false", "stream_options")
    return stream, include_usage and stream


def conductor_options(body: dict[str, Any]) -> dict[str, Any]:
    """The body's ``conductor`` object: this server's own request options."""
    ours = body.get("conductor") or {}
    if not isinstance(ours, dict):
        raise _bad('conductor must be an object such as {"progress": true}', "conductor")
    unknown = sorted(str(k) for k in ours if k not in _CONDUCTOR_KEYS)
    if unknown:
        # Refused rather than ignored: a misspelt budget would otherwise not bound.
        raise _bad(
            f"conductor.{unknown[0][:40]} is not known: use {', '.join(_CONDUCTOR_KEYS)}",
            "conductor",
        )
    return ours


def progress_of(body: dict[str, Any], stream: bool) -> bool:
    """``conductor.progress``: whether a stream carries the runs' progress events."""
    progress = conductor_options(body).get("progress", False)
    if not isinstance(progress, bool):
        raise _bad("conductor.progress must be true or false", "conductor")
    return progress and stream


def budget_of(body: dict[str, Any]) -> RequestBudget:
    """``conductor.max_calls`` and ``conductor.max_usd``: the request's budget."""
    return parse_budget(conductor_options(body))


def allowed_workers_of(body: dict[str, Any]) -> tuple[str, ...] | None:
    """``conductor.allowed_workers``: the only workers the request may use."""
    return _allowed_workers(conductor_options(body).get("allowed_workers"))


def _allowed_workers(raw: Any) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if (
        not isinstance(raw, list)
        or not raw
        or not all(isinstance(w, str) and w.strip() for w in raw)
    ):
        raise _bad(
            'conductor.allowed_workers must be a non-empty list of worker ids, e.g. ["w0", "w2"]',
            "conductor.allowed_workers",
        )
    return tuple(dict.fromkeys(w.strip() for w in raw))


#: What a request's ``conductor`` object may hold.
_CONDUCTOR_KEYS = ("progress", "max_calls", "max_usd", "allowed_workers")


def parse_budget(ours: dict[str, Any]) -> RequestBudget:
    """The budget in a request's ``conductor`` object (``max_calls``, a whole number of
    calls from 1; ``max_usd``, a finite amount above 0), or :class:`ApiError` 400."""
    calls = ours.get("max_calls")
    if calls is not None and (isinstance(calls, bool) or not isinstance(calls, int) or calls < 1):
        raise _bad("conductor.max_calls must be a whole number of calls, 1 or more", "conductor")
    usd = ours.get("max_usd")
    if usd is not None and not _positive_amount(usd):
        raise _bad("conductor.max_usd must be a number of US dollars above 0", "conductor")
    return RequestBudget(calls, None if usd is None else float(usd))


def _positive_amount(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value) and value > 0  # NaN and Infinity parse as JSON
    except OverflowError:  # an integer too large for a float
        return False


def answer_format_of(body: dict[str, Any]) -> AnswerFormat:
    """The :class:`AnswerFormat` of a chat body's ``tools``, ``tool_choice``,
    ``parallel_tool_calls`` and ``response_format`` (each in chat's shape), or a 400."""
    tools = _tools(body.get("tools"))
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls must be true or false", "parallel_tool_calls")
    return AnswerFormat(
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        response_format=_response_format(body.get("response_format")),
        parallel_tool_calls=parallel is not False,
    )


def _tools(raw: Any) -> tuple[ToolSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad("tools must be a list of function tools", "tools")
    if len(raw) > LIMITS.tools:
        raise _bad(
            f"tools has {len(raw):,} tools, over the limit of {LIMITS.tools}",
            "tools",
            "schema_over_limit",
        )
    out: list[ToolSpec] = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise _bad(f'{where} must be {{"type": "function", "function": {{...}}}}', "tools")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise _bad(f"{where}.function must be an object", "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise _bad(f"{where}.function.name must be 1 to 64 letters, digits, _ or -", "tools")
        if any(t.name == name for t in out):
            raise _bad(f"{where}: the tool {name} is given twice", "tools")
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise _bad(f"{where}.function.description must be a string", "tools")
        parameters = fn.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, dict):
                raise _bad(f"{where}.function.parameters must be a JSON Schema object", "tools")
            _check_size(parameters, f"{where}.function.parameters", where)
        strict = fn.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise _bad(f"{where}.function.strict must be true or false", "tools")
        out.append(ToolSpec(name, description, parameters, bool(strict)))
    return tuple(out)


def _tool_choice(raw: Any, tools: tuple[ToolSpec, ...]) -> ToolChoice | None:
    if raw is None:
        return None
    if raw in ("auto", "none", "required"):
        if raw == "required" and not tools:
            raise _bad("tool_choice required needs tools", "tool_choice")
        return raw  # type: ignore[no-any-return]
    fn = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise _bad(
            'tool_choice must be "auto", "none", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if all(t.name != name for t in tools):
        raise _bad(f"tool_choice names {name}, which is not one of the tools", "tool_choice")
    return ForcedTool(name)


def _response_format(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind in (None, "text") and isinstance(raw, dict):
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise _bad(
            'response_format must be {"type": "text"}, {"type": "json_object"} or '
            '{"type": "json_schema", "json_schema": {...}}',
            "response_format",
        )
    spec = raw.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise _bad("response_format.json_schema must be an object with a name", "response_format")
    schema = spec.get("schema")
    if schema is not None:
        if not isinstance(schema, dict):
            raise _bad("response_format.json_schema.schema must be an object", "response_format")
        _check_size(schema, "response_format.json_schema.schema", "response_format")
    return {"type": "json_schema", "json_schema": spec}


def _check_size(schema: dict[str, Any], where: str, param: str) -> None:
    """A 400 naming the size limit ``schema`` passes (see
    :data:`~conductor.llm.schema_limits.LIMITS`): one walk, stopped at the limit, so
    that it is cheap enough for the event loop.  Whether the schema is valid is asked
    of the request's checks afterwards (:func:`check_schemas`)."""
    over = size_problem(schema)
    if over is not None:
        raise _bad(f"{where} {over}", param, "schema_over_limit")


def _schema_sites(chat: ChatRequest) -> list[tuple[str, str, dict[str, Any]]]:
    """Each JSON Schema of ``chat``: the field holding it as its endpoint names it, the
    parameter an error names, and the schema."""
    responses = chat.format_param == "text.format"  # the Responses API's flat shapes
    sites: list[tuple[str, str, dict[str, Any]]] = []
    for i, tool in enumerate(chat.answer_format.tools):
        if tool.parameters is not None:
            field = f"tools[{i}].parameters" if responses else f"tools[{i}].function.parameters"
            sites.append((field, f"tools[{i}]", tool.parameters))
    fmt = chat.answer_format.response_format or {}
    spec = fmt.get("json_schema") if fmt.get("type") == "json_schema" else None
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if isinstance(schema, dict):
        field = "text.format.schema" if responses else "response_format.json_schema.schema"
        sites.append((field, chat.format_param, schema))
    return sites


async def check_schemas(chat: ChatRequest, checks: RequestChecks) -> None:
    """A 400 for the first JSON Schema of ``chat`` its validator cannot use, or whose
    check took over the request's budget; made by ``checks`` (off the event loop, on
    the request's budget, which its replies' checks then draw on)."""
    for field, param, schema in _schema_sites(chat):
        found = await checks.schema(schema)
        if found is None:
            continue
        if found.kind in ("unchecked", "timeout"):
            raise _bad(
                f"{field} could not be checked: {found.detail}", param, "schema_check_timeout"
            )
        raise _bad(f"{field} is not a valid JSON Schema: {found.detail}", param)


def _asks(value: Any) -> bool:
    """Whether a parameter's value asks for something (``null``, ``false``, ``[]`` and
    ``"none"`` do not: clients send those as defaults)."""
    if value is None or value is False or value == "none":
        return False
    return not (isinstance(value, list | dict) and not value)


def _messages(raw: Any) -> tuple[ChatMessage, ...]:
    if not isinstance(raw, list) or not raw:
        raise _bad("messages must be a non-empty list of chat messages", "messages")
    out: list[ChatMessage] = []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        message = chat_message(msg, where, roles=_CHAT_ROLES)
        if msg.get("function_call"):
            raise _bad(
                f"{where} holds a function_call, which is not supported: use tool_calls", where
            )
        if msg.get("tool_calls") and message.role != "assistant":
            raise _bad(f"{where}: only an assistant message may hold tool_calls", where)
        calls = _message_tool_calls(msg.get("tool_calls"), where)
        call_id = None
        if message.role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{where}.tool_call_id is required in a tool message", where)
        out.append(replace(message, tool_calls=calls, tool_call_id=call_id))
    return tuple(out)


def _message_tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad(f"{where}.tool_calls must be a list", where)
    out: list[ToolCall] = []
    for j, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        ident = call.get("id") if isinstance(call, dict) else None
        if (
            not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not isinstance(ident, str)
            or not isinstance(fn.get("arguments", ""), str)
        ):
            raise _bad(
                f'{where}.tool_calls[{j}] must be {{"id", "type": "function", '
                '"function": {"name", "arguments"}}',
                where,
            )
        out.append(ToolCall(ident, fn["name"], fn.get("arguments") or ""))
    return tuple(out)


def chat_message(
    msg: Any,
    where: str,
    part_types: tuple[str, ...] = ("text",),
    roles: tuple[str, ...] = _ROLES,
) -> ChatMessage:
    """One message (an object with ``role`` and ``content``) as a :class:`ChatMessage`;
    ``part_types`` are the content parts that hold text (chat's ``text``; the
    Responses API's ``input_text`` and ``output_text``), ``roles`` the roles allowed."""
    if not isinstance(msg, dict):
        raise _bad(f"{where} must be an object with role and content", where)
    role = msg.get("role")
    if role not in roles:
        raise _bad(
            f"{where}.role {role!r} is not supported: use {', '.join(roles)}",
            f"{where}.role",
        )
    text = content_text(msg.get("content"), f"{where}.content", part_types)
    return ChatMessage("system" if role == "developer" else role, text)


def content_text(content: Any, where: str, part_types: tuple[str, ...] = ("text",)) -> str:
    """A message's text: a string, or the text parts (of ``part_types``) of a list of
    content parts, joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") in part_types):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(
                    f"{where}[{j}] of type {kind!r} is not supported: only text parts are",
                    where,
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad(f"{where}[{j}].text must be a string", where)
            parts.append(text)
        return "\n".join(parts)
    raise _bad(f"{where} must be a string or a list of text parts", where)


# -- responses -------------------------------------------------------------------------


def usage_of(records: list[RunRecord]) -> dict[str, int]:
    """Token usage summed over every call of every run (the Conductor's and the workers',
    cached calls included, as each record's totals count them)."""
    prompt = sum(r.totals.input_tokens for r in records)
    completion = sum(r.totals.output_tokens for r in records)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _run_cost(record: RunRecord) -> float | None:
    """A run's cost in USD, or ``None`` when a call of it has no known price."""
    if record.totals.unknown_cost_calls:
        return None
    return record.totals.cost_usd


def cost_of(records: list[RunRecord]) -> float | None:
    """The request's cost in USD: its runs' costs summed, or ``None`` when a call's
    price is not known (a partial sum would look exact and be too low)."""
    costs = [_run_cost(r) for r in records]
    if any(c is None for c in costs):
        return None
    return round(sum(c for c in costs if c is not None), 8)


def _run_summary(record: RunRecord) -> dict[str, Any]:
    rounds = [
        {
            "steps": [
                {
                    "worker": s.worker_id,
                    "subtask": s.subtask,
                    "sees": list(s.visible_steps),
                    "status": s.status,
                }
                for s in rnd.steps
            ],
            "stop_reason": rnd.stop_reason,
        }
        for rnd in record.rounds
    ]
    return {
        "run_id": record.run_id,
        "status": record.status,
        "error": record.error,
        "cost_usd": _run_cost(record),
        "calls": record.totals.calls,
        "cached_calls": record.totals.cached_calls,
        "workflow": {"rounds": rounds},
        "budget": _budget(record.budget),
    }


def _budget(budget: BudgetRecord | None) -> dict[str, Any] | None:
    """A served run's request budget as a response shows it (see ``Service``): the
    limits, and the calls, spend and refusal of the whole request when the run ended."""
    return asdict(budget) if budget is not None else None


def conductor_field(records: list[RunRecord]) -> dict[str, Any]:
    """The ``conductor`` field of a response: run ids, cost and what each run did, and
    the request's ``budget`` (its limits, what was spent, and ``stopped``: why the
    budget refused a call, ``null`` when it refused none)."""
    budgets = [b for r in records if (b := _budget(r.budget)) is not None]
    budget = max(budgets, key=lambda b: int(b.get("calls") or 0), default=None)
    if budget is not None:
        stopped = next((b["stopped"] for b in budgets if b.get("stopped")), None)
        budget = {**budget, "stopped": stopped}
    return {
        "run_ids": [r.run_id for r in records],
        "cost_usd": cost_of(records),
        "budget": budget,
        "runs": [_run_summary(r) for r in records],
    }


def completion_body(
    completion_id: str, created: int, model: str, records: list[RunRecord]
) -> dict[str, Any]:
    """A ``chat.completion``: one choice per run, usage summed over all of them.  Every
    field OpenAI's schema marks required is present, ``null`` where it means nothing
    here (``refusal``, ``logprobs``): strict clients reject a body without them."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "message": _message(r),
                "logprobs": None,
                "finish_reason": finish_reason(r),
            }
            for i, r in enumerate(records)
        ],
        "usage": usage_of(records),
        "conductor": conductor_field(records),
    }


def _wire_call(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": call["name"], "arguments": call["arguments"]},
    }


def _message(record: RunRecord) -> dict[str, Any]:
    """A run's answer as an assistant message: its text, or its tool calls (the content
    then the text written beside them, or ``null``)."""
    if record.final_tool_calls:
        return {
            "role": "assistant",
            "content": record.final_answer or None,
            "refusal": None,
            "tool_calls": [_wire_call(c) for c in record.final_tool_calls],
        }
    return {"role": "assistant", "content": record.final_answer or "", "refusal": None}


def finish_reason(record: RunRecord) -> str:
    """``tool_calls`` for an answer that calls tools, else ``stop``."""
    return "tool_calls" if record.final_tool_calls else "stop"


def tool_call_deltas(record: RunRecord) -> list[dict[str, Any]]:
    """The ``delta.tool_calls`` of a streamed answer, one chunk's worth per call."""
    return [{"index": k, **_wire_call(c)} for k, c in enumerate(record.final_tool_calls or ())]


def chunk(
    completion_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with ``choices`` (``[]`` for usage and progress).
    Each choice gets ``finish_reason`` and ``logprobs`` (``null`` unless given), which
    OpenAI sends on every chunk and strict clients require."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"finish_reason": None, "logprobs": None, **c} for c in choices],
        **extra,
    }


def event_payload(event: Event, sample: int) -> dict[str, Any]:
    """A progress event as JSON: its kind, round, step, worker and outcome."""
    return {
        "kind": event.kind,
        "choice": sample,
        "round": event.round,
        "step": event.step,
        "worker": event.worker_id,
        "detail": event.detail,
        "cached": event.cached,
        "failed": event.failed,
        "latency_s": event.latency_s,
    }


def pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """``text`` cut into pieces of at most ``size`` characters (one empty piece for an
    empty text, so a choice always gets a content chunk)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event: ``data: JSON`` (after ``event: NAME`` where named) and a
    blank line, every secret value of the process masked."""
    text = mask_text(data) if isinstance(data, str) else masked_json(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def failure_message(record: RunRecord) -> str:
    """Why a failed run gave no answer, as the client is told."""
    return f"the orchestration failed: {record.error or 'no answer was produced'}"


def failure_body(records: list[RunRecord], failed: RunRecord) -> dict[str, Any]:
    """The error body of a request one of whose runs failed (``failed``), with the
    ``conductor`` field of all of them."""
    body = error_body(failure_message(failed), type="server_error", code="orchestration_failed")
    body["conductor"] = conductor_field(records)
    return body


def broken_body(message: str) -> dict[str, Any]:
    """The error a stream ends with when a run raised instead of recording a failure."""
    return error_body(message, type="server_error", code="server_error")


class ChunkStream:
    """What the two ``data:``-chunk formats (chat and text completions) stream alike:
    a progress event as a chunk without choices, the usage chunk when asked for and
    ``[DONE]``, and a failure as an error body.  A format gives ``request`` and how it
    makes one chunk (:meth:`_chunk`)."""

    request: ChatRequest

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        raise NotImplementedError

    def progress(self, payload: dict[str, Any]) -> list[bytes]:
        return [self._chunk([], conductor={"event": payload})]

    def closing(self, records: list[RunRecord]) -> list[bytes]:
        usage = [self._chunk([], usage=usage_of(records))] if self.request.include_usage else []
        return [*usage, sse("[DONE]")]

    def failed(self, records: list[RunRecord], failed: RunRecord) -> list[bytes]:
        return [sse(failure_body(records, failed)), sse("[DONE]")]

    def broken(self, message: str) -> list[bytes]:
        return [sse(broken_body(message))]


class ChatRenderer(ChunkStream):
    """A chat-completions request's answer: a ``chat.completion``, or its chunks."""

    def __init__(self, chat: ChatRequest, run_ids: list[str]) -> None:
        self.request = chat
        self.id = "chatcmpl-" + run_ids[0]
        self.created = int(time.time())

    async def keep(self, records: list[RunRecord]) -> None:
        """Nothing is stored of this format's answers."""

    def body(self, records: list[RunRecord]) -> dict[str, Any]:
        return completion_body(self.id, self.created, self.request.model, records)

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        if self.request.include_usage:  # OpenAI's ``usage: null`` on all chunks but the last
            extra.setdefault("usage", None)
        return sse(chunk(self.id, self.created, self.request.model, choices, **extra))

    def opening(self) -> list[bytes]:
        roles = [
            {"index": i, "delta": {"role": "assistant", "content": ""}}
            for i in range(self.request.n)
        ]
        return [self._chunk(roles)]

    def answer(self, index: int, record: RunRecord) -> list[bytes]:
        text = record.final_answer or ""
        # An answer that only calls tools has no content chunk (its content is null).
        shown = pieces(text) if text or not record.final_tool_calls else []
        out = [self._chunk([{"index": index, "delta": {"content": piece}}]) for piece in shown]
        out += [
            self._chunk([{"index": index, "delta": {"tool_calls": [call]}}])
            for call in tool_call_deltas(record)
        ]
        out.append(
            self._chunk(
                [{"index": index, "delta": {}, "finish_reason": finish_reason(record)}],
                conductor=conductor_field([record]),
            )
        )
        return out
