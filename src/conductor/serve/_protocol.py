"""The OpenAI chat-completions wire format as ``conductor serve`` speaks it.

One place knows the shapes: a request body read into a typed :class:`ChatRequest`
(every refusal an :class:`ApiError` naming the parameter), the error body OpenAI's
clients parse, and the builders of a ``chat.completion``, its stream chunks and the
``conductor`` field that tells what each run did.  Nothing here touches a run while it
goes; it only reads finished (or cancelled) run records.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..events import Event
from ..llm.answer_format import PLAIN, AnswerFormat, schema_problem
from ..llm.types import ForcedTool, ToolCall, ToolChoice, ToolSpec
from ..record import RunRecord

__all__ = [
    "ApiError",
    "ChatMessage",
    "ChatRequest",
    "MAX_N",
    "chunk",
    "completion_body",
    "conductor_field",
    "cost_of",
    "error_body",
    "event_payload",
    "finish_reason",
    "parse_chat_request",
    "pieces",
    "sse",
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
_ROLES = ("system", "developer", "user", "assistant", "tool")

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
class ChatRequest:
    """What a ``POST /v1/chat/completions`` body asks for, checked."""

    model: str
    messages: tuple[ChatMessage, ...]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    progress: bool = False
    #: The tools, tool choice and JSON response format the answer must keep to.
    answer_format: AnswerFormat = PLAIN


def _bad(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def parse_chat_request(raw: bytes) -> ChatRequest:
    """The request in ``raw`` (a JSON body), or an :class:`ApiError` (400) naming what is
    wrong.  Sampling parameters (``temperature``, ``max_tokens``, ...) are accepted and
    left out: each worker's own parameters come from the pool."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise _bad(f"the request body is not valid JSON ({exc})", None) from None
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None)
    for name in _UNSUPPORTED:
        if _asks(body.get(name)):
            raise _bad(
                f"{name} is not supported by an orchestration: use tools"
                if name in ("functions", "function_call")
                else f"{name} is not supported by an orchestration",
                name,
                "unsupported_parameter",
            )
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise _bad("model is required: a model id from GET /v1/models", "model")
    n = body.get("n", 1)
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise _bad(f"n must be an integer from 1 to {MAX_N}", "n")
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
    ours = body.get("conductor") or {}
    if not isinstance(ours, dict):
        raise _bad('conductor must be an object such as {"progress": true}', "conductor")
    progress = ours.get("progress", False)
    if not isinstance(progress, bool):
        raise _bad("conductor.progress must be true or false", "conductor")
    return ChatRequest(
        model=model.strip(),
        messages=_messages(body.get("messages")),
        n=n,
        stream=stream,
        include_usage=include_usage and stream,
        progress=progress and stream,
        answer_format=_answer_format(body),
    )


def _answer_format(body: dict[str, Any]) -> AnswerFormat:
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
            problem = schema_problem(parameters)
            if problem:
                raise _bad(
                    f"{where}.function.parameters is not a valid JSON Schema: {problem}", where
                )
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
        problem = schema_problem(schema)
        if problem:
            raise _bad(
                f"response_format.json_schema.schema is not a valid JSON Schema: {problem}",
                "response_format",
            )
    return {"type": "json_schema", "json_schema": spec}


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
        if not isinstance(msg, dict):
            raise _bad(f"{where} must be an object with role and content", where)
        role = msg.get("role")
        if role not in _ROLES:
            raise _bad(
                f"{where}.role {role!r} is not supported: use system, developer, user, "
                "assistant or tool",
                f"{where}.role",
            )
        if msg.get("function_call"):
            raise _bad(
                f"{where} holds a function_call, which is not supported: use tool_calls", where
            )
        calls = _message_tool_calls(msg.get("tool_calls"), where) if role == "assistant" else ()
        if msg.get("tool_calls") and role != "assistant":
            raise _bad(f"{where}: only an assistant message may hold tool_calls", where)
        call_id = None
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{where}.tool_call_id is required in a tool message", where)
        out.append(
            ChatMessage(
                "system" if role == "developer" else role, _text(msg, where), calls, call_id
            )
        )
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


def _text(msg: dict[str, Any], where: str) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    content = msg.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(
                    f"{where}.content[{j}] of type {kind!r} is not supported: only text parts are",
                    f"{where}.content",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad(f"{where}.content[{j}].text must be a string", f"{where}.content")
            parts.append(text)
        return "\n".join(parts)
    raise _bad(f"{where}.content must be a string or a list of text parts", f"{where}.content")


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
    }


def conductor_field(records: list[RunRecord]) -> dict[str, Any]:
    """The ``conductor`` field of a response: run ids, cost and what each run did."""
    return {
        "run_ids": [r.run_id for r in records],
        "cost_usd": cost_of(records),
        "runs": [_run_summary(r) for r in records],
    }


def completion_body(
    completion_id: str, created: int, model: str, records: list[RunRecord]
) -> dict[str, Any]:
    """A ``chat.completion``: one choice per run, usage summed over all of them."""
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
            "tool_calls": [_wire_call(c) for c in record.final_tool_calls],
        }
    return {"role": "assistant", "content": record.final_answer or ""}


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
    """A ``chat.completion.chunk`` with ``choices`` (``[]`` for usage and progress)."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
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


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: JSON`` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()
