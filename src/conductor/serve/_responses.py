"""The OpenAI Responses API (``POST /v1/responses``) as ``conductor serve`` speaks it.

A request's ``input`` (a string, or a list of ``message``, ``function_call`` and
``function_call_output`` items) and ``instructions`` are read into the
:class:`~._protocol.ChatRequest` the chat route answers, so the same service, records,
slots and limits apply: a ``function_call`` item is an assistant message's tool call, a
``function_call_output`` a ``tool`` message.  Function ``tools``, ``tool_choice``,
``parallel_tool_calls`` and ``text.format`` (``json_object``, ``json_schema``) are
rewritten in chat's shapes and read by chat's reader into the same
:class:`~conductor.llm.answer_format.AnswerFormat`; other tool types (``web_search``,
...) are refused.  :class:`ResponsesRenderer` makes the runs' record into a
``response`` object, or into the Responses stream's events::

    response.created, response.in_progress,
    then per output item, a message:
        response.output_item.added, response.content_part.added,
        response.output_text.delta (one per piece of the answer),
        response.output_text.done, response.content_part.done, response.output_item.done
    or a function_call (one per tool call the answer makes):
        response.output_item.added, response.function_call_arguments.delta (per piece),
        response.function_call_arguments.done, response.output_item.done
    response.completed (or response.failed, or an ``error`` event)

each with its ``sequence_number``, counted from 0.

``previous_response_id`` continues a conversation: the server keeps the conversation
of each response it answered (input items and answer, its function calls included, so
a follow-up may send just their ``function_call_output`` items; not ``instructions``,
which a follow-up gives afresh, as OpenAI's API does) with the response itself, in the
server's :class:`~._stores.ConversationStore` (in memory, or on the state server every
replica shares), for ``--keep-responses-s``; ``store: false`` keeps nothing.
:func:`input_items` lists a stored conversation's items as
``GET /v1/responses/ID/input_items`` answers them.  A conversation
belongs to the API key that made it: another key's ``previous_response_id`` gets the
answer an unknown id gets (OpenAI's 400 ``previous_response_not_found``), so it learns
nothing of it, not even that it exists.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import StateUnavailable
from ..llm.answer_format import AnswerFormat
from ..llm.types import ToolCall
from ..record import RunRecord
from ._protocol import (
    ApiError,
    ChatMessage,
    ChatRequest,
    allowed_workers_of,
    answer_format_of,
    budget_of,
    chat_message,
    conductor_field,
    content_text,
    failure_message,
    json_object,
    model_of,
    pieces,
    refuse_unsupported,
    sse,
    stream_of,
    usage_of,
)
from ._stores import ConversationStore

__all__ = [
    "ResponsesRenderer",
    "ResponsesRequest",
    "input_items",
    "parse_responses_request",
    "stored",
    "unreachable",
]

#: Parameters an orchestration cannot honour: each is refused when it asks for something.
_UNSUPPORTED = (
    "top_logprobs",
    "prompt",
    "conversation",
    "background",
)

#: Content parts that hold text: the user's (``input_text``) and an earlier answer's.
_TEXT_PARTS = ("input_text", "output_text", "text")


@dataclass(frozen=True)
class ResponsesRequest:
    """What a ``POST /v1/responses`` body asks for, checked.  ``chat`` is the whole
    conversation to answer: the instructions, the previous response's conversation and
    this input; ``turn`` is what a follow-up continues (all of it but the
    instructions); ``echoed`` holds the fields a response repeats from its request
    (metadata, sampling parameters)."""

    chat: ChatRequest
    turn: tuple[ChatMessage, ...]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    echoed: dict[str, Any] = field(default_factory=dict)


def _bad(message: str, param: str | None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


async def parse_responses_request(
    raw: bytes, kept: ConversationStore, owner: str
) -> ResponsesRequest:
    """The request in ``raw``, or an :class:`ApiError` (400) naming what is wrong;
    ``previous_response_id`` is looked up in ``kept`` among the conversations of the
    caller's key, ``owner`` (another key's is "not found", as an unknown id is; a store
    that cannot be reached is a 503)."""
    body = json_object(raw)
    refuse_unsupported(body, _UNSUPPORTED)
    answer_format = _answer_format(body)
    model = model_of(body)
    stream, _ = stream_of(body)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("instructions must be a string", "instructions")
    store = body.get("store", True)
    if store is None:
        store = True
    if not isinstance(store, bool):
        raise _bad("store must be true or false", "store")
    previous_id = body.get("previous_response_id")
    history: tuple[ChatMessage, ...] = ()
    if previous_id is not None:
        if not isinstance(previous_id, str):
            raise _bad("previous_response_id must be a string", "previous_response_id")
        found = _messages(await stored(kept, previous_id, owner))
        if found is None:
            raise ApiError(
                400,
                f"Previous response with id '{previous_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        history = found
    turn = (*history, *_input(body.get("input")))
    system = (ChatMessage("system", instructions),) if instructions else ()
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _bad("metadata must be an object of strings", "metadata")
    echoed = {
        "metadata": metadata or {},
        "temperature": _number(body, "temperature"),
        "top_p": _number(body, "top_p"),
        "max_output_tokens": _number(body, "max_output_tokens"),
    }
    echoed.update(_format_echo(body, answer_format))
    if isinstance(body.get("user"), str):
        # Left out otherwise: the spec types ``user`` as a string, not nullable.
        echoed["user"] = body["user"]
    return ResponsesRequest(
        chat=ChatRequest(
            model=model,
            messages=(*system, *turn),
            stream=stream,
            allowed_workers=allowed_workers_of(body),
            budget=budget_of(body),
            answer_format=answer_format,
            format_param="text.format",
        ),
        turn=turn,
        instructions=instructions,
        previous_response_id=previous_id,
        store=store,
        echoed=echoed,
    )


def _answer_format(body: dict[str, Any]) -> AnswerFormat:
    """``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``text.format`` in the
    Responses API's flat shapes, read as chat's (one reader checks both endpoints)."""
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise _bad('text must be an object such as {"format": {"type": "text"}}', "text")
    chat_body = {
        "tools": _chat_tools(body.get("tools")),
        "tool_choice": _chat_tool_choice(body.get("tool_choice")),
        "parallel_tool_calls": body.get("parallel_tool_calls"),
        "response_format": _chat_response_format((text or {}).get("format")),
    }
    try:
        return answer_format_of(chat_body)
    except ApiError as exc:
        # Said of this endpoint's fields, whose tools and schema are not nested.
        message = exc.message.replace(".function.", ".")
        message = message.replace("response_format.json_schema", "text.format")
        param = "text.format" if exc.param == "response_format" else exc.param
        raise _bad(message, param, exc.code) from None


def _format_echo(body: dict[str, Any], answer_format: AnswerFormat) -> dict[str, Any]:
    """The response's ``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``text``,
    as the request (already checked) gave them."""
    tools = [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": t.strict,
        }
        for t in answer_format.tools
    ]
    choice = body.get("tool_choice")
    fmt = (body.get("text") or {}).get("format")
    return {
        "tools": tools,
        "tool_choice": choice if choice is not None else ("auto" if tools else "none"),
        "parallel_tool_calls": bool(tools) and answer_format.parallel_tool_calls,
        "text": {"format": fmt if isinstance(fmt, dict) else {"type": "text"}},
    }


def _chat_tools(raw: Any) -> Any:
    """Function tools as chat's ``{"type": "function", "function": {...}}``; a tool of
    another type (``web_search``, ``file_search``, ...) is refused by name: an
    orchestration has none of the built-in tools."""
    if not isinstance(raw, list):
        return raw  # the chat reader says what is wrong with it
    out: list[Any] = []
    for i, tool in enumerate(raw):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise _bad(
                f"tools[{i}] of type {kind!r} is not supported: only function tools are",
                "tools",
                "unsupported_parameter",
            )
        fn = {k: v for k, v in tool.items() if k in ("name", "description", "parameters", "strict")}
        out.append({"type": "function", "function": fn})
    return out


def _chat_tool_choice(raw: Any) -> Any:
    if raw is None or raw in ("auto", "none", "required"):
        return raw
    if not (isinstance(raw, dict) and raw.get("type") == "function"):
        raise _bad(
            'tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}',
            "tool_choice",
        )
    return {"type": "function", "function": {"name": raw.get("name")}}


def _chat_response_format(raw: Any) -> Any:
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in (None, "text", "json_object", "json_schema"):
        raise _bad(
            'text.format must be {"type": "text"}, {"type": "json_object"} or '
            '{"type": "json_schema", "name": ..., "schema": {...}}',
            "text.format",
        )
    if kind != "json_schema":
        return raw
    spec = {k: v for k, v in raw.items() if k in ("name", "description", "schema", "strict")}
    return {"type": "json_schema", "json_schema": spec}


def _number(body: dict[str, Any], name: str) -> float | int | None:
    """A sampling parameter, echoed back as OpenAI does; each worker's own come from
    the pool."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"{name} must be a number", name)
    number: float | int = value
    return number


def _input(raw: Any) -> tuple[ChatMessage, ...]:
    if isinstance(raw, str):
        return (ChatMessage("user", raw),)
    if not isinstance(raw, list) or not raw:
        raise _bad("input must be a string or a non-empty list of message items", "input")
    out: list[ChatMessage] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            out.append(chat_message(item, where, _TEXT_PARTS))
        elif kind == "function_call":
            call = ToolCall(
                _call_id(item, where),
                _string(item, "name", where),
                _string(item, "arguments", where),
            )
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                # Calls after an answer's text are that answer's, as one chat message.
                out[-1] = replace(last, tool_calls=(*last.tool_calls, call))
            else:
                out.append(ChatMessage("assistant", "", tool_calls=(call,)))
        elif kind == "function_call_output":
            result = content_text(item.get("output"), f"{where}.output", _TEXT_PARTS)
            out.append(ChatMessage("tool", result, tool_call_id=_call_id(item, where)))
        else:
            raise _bad(
                f"{where} of type {kind!r} is not supported: use message, function_call "
                "or function_call_output items",
                where,
            )
    return tuple(out)


def _string(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise _bad(f"{where}.{name} must be a string", where)
    return value


def _call_id(item: dict[str, Any], where: str) -> str:
    value = _string(item, "call_id", where)
    if not value:
        raise _bad(f"{where}.call_id must not be empty", where)
    return value


# -- the answer -------------------------------------------------------------------------


def response_usage(records: list[RunRecord]) -> dict[str, Any]:
    """The Responses API's usage: every call of every run, as the chat route counts it."""
    usage = usage_of(records)
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def output_items(record: RunRecord) -> list[dict[str, Any]]:
    """A run's answer as output items: an assistant message of its text (left out when
    the answer only calls tools), then a ``function_call`` item per tool call."""
    calls = record.final_tool_calls or []
    items: list[dict[str, Any]] = []
    if record.final_answer or not calls:
        items.append(
            {
                "id": "msg_" + record.run_id,
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [_text_part(record.final_answer or "")],
            }
        )
    items += [
        {
            "id": f"fc_{record.run_id}_{k}",
            "type": "function_call",
            "call_id": c["id"],
            "name": c["name"],
            "arguments": c["arguments"],
            "status": "completed",
        }
        for k, c in enumerate(calls)
    ]
    return items


def _answer_message(record: RunRecord) -> ChatMessage:
    """A run's answer as the conversation a follow-up continues keeps it."""
    calls = tuple(
        ToolCall(c["id"], c["name"], c["arguments"]) for c in record.final_tool_calls or []
    )
    return ChatMessage("assistant", record.final_answer or "", tool_calls=calls)


class ResponsesRenderer:
    """A Responses request's answer: a ``response`` object, or its stream's events.
    A completed response's conversation is kept in ``kept`` for a follow-up, unless
    the request said ``store: false``."""

    def __init__(
        self,
        asked: ResponsesRequest,
        run_ids: list[str],
        kept: ConversationStore,
        owner: str,
        keep_s: float,
    ) -> None:
        self.asked = asked
        self.kept = kept
        self.owner = owner
        self.keep_s = keep_s
        self._completed: dict[str, Any] | None = None
        self.id = "resp_" + run_ids[0]
        self.created_at = int(time.time())
        self._sequence = 0

    def response(
        self,
        status: str,
        records: list[RunRecord] | None = None,
        output: list[dict[str, Any]] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The ``response`` object: ``in_progress`` (no output yet), ``completed`` or
        ``failed``."""
        asked = self.asked
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": None,
            "instructions": asked.instructions,
            "model": asked.chat.model,
            "output": output or [],
            "parallel_tool_calls": False,
            "previous_response_id": asked.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": asked.store,
            "text": {"format": {"type": "text"}},
            "tool_choice": "none",
            "tools": [],
            "truncation": "disabled",
            **asked.echoed,
        }
        if records:
            # Left out before the runs end: the spec types ``usage`` as an object.
            body["usage"] = response_usage(records)
            body["conductor"] = conductor_field(records)
        return body

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse(data, event=kind)

    def _done(self, records: list[RunRecord]) -> dict[str, Any]:
        """The completed response (the one :meth:`keep` stored, when it did)."""
        if self._completed is None:
            (record,) = records
            self._completed = self.response("completed", records, output_items(record))
        return self._completed

    async def keep(self, records: list[RunRecord]) -> None:
        """Store the completed response and its conversation before the client is sent
        it, so that a follow-up sent the moment the client has it finds it."""
        if not self.asked.store:
            return
        (record,) = records
        messages = (*self.asked.turn, _answer_message(record))
        body = {"response": self._done(records), "messages": [_dump(m) for m in messages]}
        await self.kept.keep(self.id, self.owner, body, self.keep_s)

    def body(self, records: list[RunRecord]) -> dict[str, Any]:
        return self._done(records)

    def opening(self) -> list[bytes]:
        return [
            self._event("response.created", response=self.response("in_progress")),
            self._event("response.in_progress", response=self.response("in_progress")),
        ]

    def progress(self, payload: dict[str, Any]) -> list[bytes]:
        return []  # the Responses stream has no event for it

    def answer(self, index: int, record: RunRecord) -> list[bytes]:
        out: list[bytes] = []
        for position, item in enumerate(output_items(record)):
            out += self._item_events(position, item)
        return out

    def _item_events(self, position: int, item: dict[str, Any]) -> list[bytes]:
        """One item's events: added (empty, in progress), its text parts or its
        arguments streamed, then the item done."""
        if item["type"] == "function_call":
            return self._call_events(position, item)
        item_id = item["id"]
        out = [
            self._event(
                "response.output_item.added",
                output_index=position,
                item={**item, "status": "in_progress", "content": []},
            )
        ]
        for c, part in enumerate(item["content"]):
            where = {"item_id": item_id, "output_index": position, "content_index": c}
            out.append(self._event("response.content_part.added", **where, part=_text_part("")))
            for piece in pieces(part["text"]):
                out.append(
                    self._event("response.output_text.delta", **where, delta=piece, logprobs=[])
                )
            out.append(
                self._event("response.output_text.done", **where, text=part["text"], logprobs=[])
            )
            out.append(self._event("response.content_part.done", **where, part=part))
        out.append(self._event("response.output_item.done", output_index=position, item=item))
        return out

    def _call_events(self, position: int, item: dict[str, Any]) -> list[bytes]:
        """A ``function_call`` item's events: added (no arguments yet), the arguments
        streamed and done, then the item done."""
        where = {"item_id": item["id"], "output_index": position}
        out = [
            self._event(
                "response.output_item.added",
                output_index=position,
                item={**item, "status": "in_progress", "arguments": ""},
            )
        ]
        for piece in pieces(item["arguments"]):
            out.append(self._event("response.function_call_arguments.delta", **where, delta=piece))
        out.append(
            self._event(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            )
        )
        out.append(self._event("response.output_item.done", output_index=position, item=item))
        return out

    def closing(self, records: list[RunRecord]) -> list[bytes]:
        return [self._event("response.completed", response=self._done(records))]

    def failed(self, records: list[RunRecord], failed: RunRecord) -> list[bytes]:
        error = {"code": "server_error", "message": failure_message(failed)}
        return [
            self._event("response.failed", response=self.response("failed", records, error=error))
        ]

    def broken(self, message: str) -> list[bytes]:
        return [self._event("error", code="server_error", message=message, param=None)]


# -- stored responses -------------------------------------------------------------------


def unreachable(exc: StateUnavailable) -> ApiError:
    """The 503 of a store that cannot be reached: "not found" would be untrue."""
    return ApiError(
        503,
        f"{exc}: stored responses cannot be read until it answers",
        type="server_error",
        code="state_unavailable",
    )


async def stored(kept: ConversationStore, response_id: str, owner: str) -> dict[str, Any] | None:
    """What ``kept`` holds of ``response_id`` for ``owner``, or ``None``; 503 when the
    store cannot be reached."""
    try:
        return await kept.get(response_id, owner)
    except StateUnavailable as exc:
        raise unreachable(exc) from None


def _dump(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [[c.id, c.name, c.arguments] for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _messages(body: dict[str, Any] | None) -> tuple[ChatMessage, ...] | None:
    """The conversation of a stored body, or ``None`` when it is not one (the state
    server is shared: what another writer left there is not trusted to be well formed)."""
    raw = (body or {}).get("messages")
    if not isinstance(raw, list):
        return None
    out: list[ChatMessage] = []
    for m in raw:
        if not isinstance(m, dict):
            return None
        role, content = m.get("role"), m.get("content")
        calls = m.get("tool_calls", [])
        call_id = m.get("tool_call_id")
        if not (
            role in ("system", "developer", "user", "assistant", "tool")
            and isinstance(content, str)
            and isinstance(calls, list)
            and all(
                isinstance(c, list) and len(c) == 3 and all(isinstance(x, str) for x in c)
                for c in calls
            )
            and (call_id is None or isinstance(call_id, str))
        ):
            return None
        tool_calls = tuple(ToolCall(c[0], c[1], c[2]) for c in calls)
        out.append(ChatMessage(role, content, tool_calls=tool_calls, tool_call_id=call_id))
    return tuple(out)


def input_items(response_id: str, body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The items a stored response answered, in order, in the shapes OpenAI lists them
    (its answer, the last message, left out), or ``None`` for a body that is not one."""
    messages = _messages(body)
    if messages is None:
        return None
    base = response_id.removeprefix("resp_")
    items: list[dict[str, Any]] = []
    for i, m in enumerate(messages[:-1]):
        if m.role == "tool":
            items.append(
                {
                    "id": f"fco_{base}_{i}",
                    "type": "function_call_output",
                    "call_id": m.tool_call_id or "",
                    "output": m.content,
                    "status": "completed",
                }
            )
            continue
        if m.role == "assistant":
            if m.content or not m.tool_calls:
                items.append(
                    {
                        "id": f"msg_{base}_{i}",
                        "type": "message",
                        "role": "assistant",
                        "status": "completed",
                        "content": [_text_part(m.content)],
                    }
                )
            items += [
                {
                    "id": f"fc_{base}_{i}_{k}",
                    "type": "function_call",
                    "call_id": c.id,
                    "name": c.name,
                    "arguments": c.arguments,
                    "status": "completed",
                }
                for k, c in enumerate(m.tool_calls)
            ]
            continue
        items.append(
            {
                "id": f"msg_{base}_{i}",
                "type": "message",
                "role": m.role,
                "status": "completed",
                "content": [{"type": "input_text", "text": m.content}],
            }
        )
    return items
