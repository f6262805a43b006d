"""Request and completion types shared by every model client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

__all__ = [
    "TRUNCATED_REASONS",
    "Completion",
    "ForcedTool",
    "Message",
    "ModelRequest",
    "RawCompletion",
    "ReportedCost",
    "Retry",
    "ToolCall",
    "ToolChoice",
    "ToolSpec",
    "Usage",
    "is_truncated",
]

#: Finish reasons that mean the reply was cut off at the token limit: OpenAI and
#: compatible servers say ``length``, Anthropic ``max_tokens``, Gemini ``MAX_TOKENS``.
TRUNCATED_REASONS = frozenset({"length", "max_tokens", "MAX_TOKENS"})


def is_truncated(finish_reason: str | None) -> bool:
    """Whether ``finish_reason`` says the reply was cut off at the token limit."""
    return finish_reason in TRUNCATED_REASONS


class Message(TypedDict):
    """One chat message: ``{"role": "user", "content": "..."}``."""

    role: str
    content: str


@dataclass(frozen=True)
class Usage:
    """Token counts of one call, as the provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens
        )


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call: its name, what it does, and the JSON Schema of its
    arguments (``parameters``; ``None``: no arguments are described).  ``strict`` asks
    that the arguments match the schema exactly."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False


@dataclass(frozen=True)
class ToolCall:
    """A call of a function the reply asks for: the provider's call ``id``, the
    function's ``name`` and its ``arguments`` as the JSON text the model wrote."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ForcedTool:
    """A ``tool_choice`` that names the one function the reply must call."""

    name: str


#: How the model may use the tools: ``auto`` (it decides), ``none`` (no call),
#: ``required`` (at least one call), or :class:`ForcedTool` (that function's call).
ToolChoice = Literal["auto", "none", "required"] | ForcedTool


@dataclass(frozen=True)
class ModelRequest:
    """What to send: messages plus sampling settings.

    ``params`` holds the sampling parameters and provider pass-through parameters
    (``temperature``, ``max_tokens``, ``top_p``, ``reasoning_effort``, ...), already
    merged from the pool's defaults and the worker's own settings.  ``sample_index``
    is part of the cache key so that repeated samples of one prompt differ on purpose.
    ``grammar`` is a GBNF grammar that constrains decoding where the client supports
    it (local models), and ``response_format`` a structured-output request for
    OpenAI-compatible servers that support guided decoding.  ``tools`` are functions
    the reply may call instead of answering with text, and ``tool_choice`` how it may
    (:data:`ToolChoice`; ``None``: the provider's default).
    """

    messages: tuple[Message, ...]
    params: dict[str, Any] = field(default_factory=dict)
    sample_index: int = 0
    grammar: str | None = None
    response_format: dict[str, Any] | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None


@dataclass(frozen=True)
class ReportedCost:
    """A call's cost as the server that answered it reported it (``usd`` ``None``: it
    said the cost is unknown, as a nested ``conductor serve`` does for an unpriced run)."""

    usd: float | None


@dataclass(frozen=True)
class RawCompletion:
    """What one successful attempt returned, before caching and accounting."""

    text: str
    usage: Usage
    raw: dict[str, Any]
    model: str | None = None
    finish_reason: str | None = None
    #: Of the attempt's time, what it spent waiting for the model to be free (a local
    #: model answering other calls first), not being answered.
    queued_s: float = 0.0
    #: The cost the server reported for this call, which takes precedence over the
    #: price table; ``None`` when it reported none.
    reported_cost: ReportedCost | None = None
    #: The functions the reply calls (``text`` may then be empty).
    tool_calls: tuple[ToolCall, ...] = ()
    #: Answered through the provider's batch API (:mod:`conductor.batches.api`), so
    #: priced at its batch rate; kept in the cache, so a replay is priced the same.
    batch: bool = False

    @property
    def truncated(self) -> bool:
        """Cut off at the token limit: returned, recorded, but never cached."""
        return is_truncated(self.finish_reason)


class Retry(TypedDict):
    """A failed attempt of a call that was tried again: when it failed (UTC, ISO 8601),
    its number, the error's class and HTTP status, what it said, and the wait before
    the next attempt."""

    at: str
    attempt: int
    error_kind: str
    status: int | None
    error: str
    wait_s: float


@dataclass(frozen=True)
class Completion:
    """A finished call: the reply plus usage, cost, latency and provenance.

    ``cost_usd`` is ``None`` when the model's price is unknown; ``cost_reported`` says
    it is the cost the server reported (a nested ``conductor serve``, OpenRouter's
    ``usage.cost``), not tokens times the price table's price.  ``latency_s`` is the
    time the call was being answered, retries and their back-off included (near zero
    when ``cached``); ``queue_s`` the time it waited before that, for a concurrency slot
    or for a model busy with other calls.  Neither counts the client's set-up (an SDK
    imported, a local model loaded) before its first call.  ``raw`` is the
    provider's response body, kept as returned (with any API key masked).  ``truncated``
    says the reply was cut off at the token limit (``finish_reason`` ``length`` or a
    provider's equivalent): it is returned as the answer, but never cached.
    """

    text: str
    usage: Usage
    cost_usd: float | None
    latency_s: float
    cached: bool
    attempts: int
    raw: dict[str, Any]
    model: str | None = None
    finish_reason: str | None = None
    queue_s: float = 0.0
    cost_reported: bool = False
    tool_calls: tuple[ToolCall, ...] = ()
    #: Answered through the provider's batch API (and priced at its batch rate), and
    #: then what the same call would have cost live (``None`` for a live call).
    batch: bool = False
    live_cost_usd: float | None = None
    #: The attempts that failed and were tried again before this answer, in order.
    retries: tuple[Retry, ...] = ()

    @property
    def truncated(self) -> bool:
        return is_truncated(self.finish_reason)
