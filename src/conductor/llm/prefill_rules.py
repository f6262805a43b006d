"""How a reply that begins with a prefill is sent and read back, by a client's rule.

The rules (:data:`~conductor.llm.capabilities.PrefillRule`) and what the clients build
from them live here, below the clients, which pass their own class's rule
(:func:`continue_fields`); which rule a *target* follows is asked of the registry, one
floor up, in :mod:`conductor.llm.prefill` (see there for the providers' ways).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from .types import Message

if TYPE_CHECKING:
    from ..targets import Worker
    from .capabilities import PrefillRule

__all__ = [
    "CONTINUE_FIELDS",
    "OPENAI_COMPATIBLE_PREFIXES",
    "Continuation",
    "continuation_by",
    "continue_fields",
    "ends_with_prefill",
    "join_prefill",
    "prefill_of",
]

#: The body fields that ask vLLM to continue the final assistant message.
CONTINUE_FIELDS: dict[str, Any] = {"continue_final_message": True, "add_generation_prompt": False}

#: How a target continues a final assistant message: natively (Anthropic), or when the
#: body asks with :data:`CONTINUE_FIELDS` (vLLM and compatible servers).
Continuation = Literal["anthropic", "vllm"]

#: The litellm provider prefixes of OpenAI-protocol servers (vLLM among them).
OPENAI_COMPATIBLE_PREFIXES = ("openai/", "hosted_vllm/")


def continuation_by(rule: PrefillRule, target: Worker) -> Continuation | None:
    """How ``target``, sent by a client that follows ``rule``, continues a prefill over
    the wire, or ``None`` when it cannot (or, ``chat_template``, needs no wire for it)."""
    if rule == "native":
        return "anthropic"
    if rule == "api_base":
        return "vllm" if target.api_base else None
    if rule == "model_prefix":
        if target.model.startswith("anthropic/"):
            return "anthropic"
        if target.model.startswith(OPENAI_COMPATIBLE_PREFIXES) and target.api_base:
            return "vllm"
    return None


def ends_with_prefill(messages: Sequence[Message]) -> bool:
    """Whether the last message is an assistant message for the model to continue."""
    return bool(messages) and messages[-1]["role"] == "assistant"


def prefill_of(messages: Sequence[Message]) -> str:
    """The prefill the reply to ``messages`` begins with ("" when there is none)."""
    return messages[-1]["content"] if ends_with_prefill(messages) else ""


def continue_fields(
    rule: PrefillRule, target: Worker, messages: Sequence[Message]
) -> dict[str, Any]:
    """Body fields an OpenAI-protocol client following ``rule`` adds so that a vLLM-style
    server continues the final assistant message of ``messages`` (empty when there is
    none to continue)."""
    if ends_with_prefill(messages) and continuation_by(rule, target) == "vllm":
        return dict(CONTINUE_FIELDS)
    return {}


def join_prefill(messages: Sequence[Message], completion: str) -> str:
    """The reply as the model wrote it: the prefill of ``messages``, then ``completion``."""
    return prefill_of(messages) + completion
