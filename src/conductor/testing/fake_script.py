"""The scripting vocabulary of the fake LLM server: what a model answers (:class:`Reply`,
:class:`Fault` and the broken shapes of :data:`SHAPES`), a request as the server received
it (:class:`FakeRequest`), and responders (:class:`Script`, with their position in a
script; :func:`echo`, the default).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

__all__ = [
    "SHAPES",
    "FakeRequest",
    "FakeToolCall",
    "Fault",
    "Protocol",
    "Reply",
    "Responder",
    "ResponderResult",
    "Script",
    "Shape",
    "echo",
]

Protocol = Literal["openai", "anthropic", "gemini"]


@dataclass
class Reply:
    """A successful answer: `text`, with optional per-reply latency and token counts.

    Token counts left as None default to whitespace word counts (input: every message's
    content; output: `text`). `latency_s` None means the server's `latency_s`.
    `finish_reason` ``"length"`` marks the reply as cut off at the token limit, in each
    protocol's own words (OpenAI ``length``, Anthropic ``max_tokens``, Gemini
    ``MAX_TOKENS``); None is a normal stop.  ``cost_usd`` is sent as OpenAI-protocol
    ``usage.cost`` (as OpenRouter reports a call's cost).  `tool_calls` makes the reply
    call functions (OpenAI's ``message.tool_calls``, finish reason ``tool_calls``),
    `text` then being the content beside them (``""``: ``null``).
    """

    text: str
    latency_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: Literal["stop", "length"] | None = None
    cost_usd: float | None = None
    tool_calls: list[FakeToolCall] = field(default_factory=list)


@dataclass
class FakeToolCall:
    """One function call of a scripted reply: the function's `name` and its `arguments`
    (a JSON text, sent verbatim, or an object, sent as its JSON); `id` None gives
    ``call_<n>``."""

    name: str
    arguments: str | dict[str, Any] = "{}"
    id: str | None = None

    @property
    def arguments_text(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


#: Status-200 replies of a broken shape that `Fault.malformed` serves, in each protocol:
#: ``empty_choices`` (OpenAI ``choices: []``, Anthropic ``content: []``, Gemini
#: ``candidates: []``), ``no_choices`` (that key missing), ``null_content`` (OpenAI
#: ``message.content: null``, Anthropic ``content: null``, Gemini a candidate with no
#: ``content``), ``empty_text`` (the reply text is ``""``) and ``string_message`` (OpenAI
#: ``message`` a string, Anthropic ``content`` a string, Gemini ``content`` a string).
Shape = Literal["empty_choices", "no_choices", "null_content", "empty_text", "string_message"]
SHAPES: tuple[Shape, ...] = (
    "empty_choices",
    "no_choices",
    "null_content",
    "empty_text",
    "string_message",
)


@dataclass
class Fault:
    """An error answer with HTTP `status`, in the provider's own error format.

    `headers` are added to the response (e.g. ``{"Retry-After": "1"}``); `latency_s` None
    means the server's `latency_s`.  The constructors make the faults that are not an
    error body: `raw` (a verbatim body, e.g. broken JSON or an HTML page), `malformed` (a
    reply of a broken shape, see `SHAPES`), `reset` (the connection is reset, no reply)
    and `hang` (no reply for `hang_s` seconds).
    """

    status: int
    message: str = "Injected fault from the fake LLM server"
    headers: dict[str, str] = field(default_factory=dict)
    latency_s: float | None = None
    body: bytes | None = None
    content_type: str = "application/json"
    shape: Shape | None = None
    action: Literal["respond", "reset", "hang"] = "respond"
    hang_s: float = 3600.0

    @classmethod
    def raw(
        cls, body: str | bytes, status: int = 200, content_type: str = "application/json"
    ) -> Fault:
        """Serve `body` verbatim with `status` and `content_type`, in every protocol."""
        data = body.encode() if isinstance(body, str) else body
        return cls(status, body=data, content_type=content_type)

    @classmethod
    def malformed(cls, shape: Shape) -> Fault:
        """A status-200 reply of the broken `shape` in the request's protocol."""
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r}; expected one of {', '.join(SHAPES)}")
        return cls(200, shape=shape)

    @classmethod
    def reset(cls) -> Fault:
        """Reset the connection once the request has been read; nothing is answered."""
        return cls(0, action="reset")

    @classmethod
    def hang(cls, seconds: float = 3600.0) -> Fault:
        """Answer nothing for `seconds` (the client's time-out should fire first)."""
        return cls(0, action="hang", hang_s=seconds)


@dataclass
class FakeRequest:
    """One request as the fake server received it.

    `messages` is normalised across protocols to ``[{"role", "content"}]``: a system prompt
    (Anthropic ``system``, Gemini ``systemInstruction``, OpenAI ``developer``) becomes a
    leading ``system`` message, Gemini's ``model`` role becomes ``assistant`` and content parts
    are joined with newlines. `headers` has lower-case names. `received_at` is
    ``time.monotonic()`` at arrival.  A line of a batch (answered when its batch ends)
    has its `batch_id` and `custom_id` set, its `path` ``batch:<batch id>`` and no
    headers.
    """

    protocol: Protocol
    path: str
    model: str
    headers: dict[str, str]
    body: dict[str, Any]
    messages: list[dict[str, str]]
    api_key: str | None
    received_at: float
    batch_id: str | None = None
    custom_id: str | None = None

    @property
    def tools(self) -> list[str]:
        """The names of the functions the request offered (OpenAI's or Anthropic's
        ``tools``)."""
        tools = self.body.get("tools") if self.protocol != "gemini" else None
        if not isinstance(tools, list):
            return []
        entries = [t.get("function", t) if isinstance(t, dict) else {} for t in tools]
        return [e["name"] for e in entries if isinstance(e, dict) and "name" in e]

    @property
    def last_user_message(self) -> str:
        """The content of the last ``user`` message, or "" if there is none."""
        for message in reversed(self.messages):
            if message["role"] == "user":
                return message["content"]
        return ""


ResponderResult: TypeAlias = str | Reply | Fault
"""What a responder yields for one request."""

Responder: TypeAlias = (
    ResponderResult
    | Sequence[ResponderResult]
    | Callable[[FakeRequest], ResponderResult | Awaitable[ResponderResult]]
)
"""A script: one item, a list (consumed in order, the last repeats) or a callable."""


def echo(request: FakeRequest) -> str:
    """The built-in default: echo the start of the last user message."""
    return f"Echo: {request.last_user_message[:80]}"


class Script:
    """A responder with its position, so lists are consumed in order: what the server
    keeps per scripted model (and for the default)."""

    def __init__(self, responder: Responder) -> None:
        self.func: Callable[[FakeRequest], Any] | None = None
        self.items: list[ResponderResult] = []
        self.index = 0
        if callable(responder):
            self.func = responder
        elif isinstance(responder, (str, Reply, Fault)):
            self.items = [responder]
        else:
            self.items = list(responder)
            if not self.items:
                raise ValueError("a responder list needs at least one item")
            for item in self.items:
                if not isinstance(item, (str, Reply, Fault)):
                    raise TypeError(f"responder items must be str, Reply or Fault, not {item!r}")

    def next_item(self) -> ResponderResult:
        """The next list item (callers hold the server lock)."""
        item = self.items[min(self.index, len(self.items) - 1)]
        self.index += 1
        return item
