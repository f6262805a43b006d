"""Assistant prefill: a reply that begins with given text, which the model continues.

A prefill travels as the *final* message of a request, with role ``assistant``; there
is no separate field for it, so the cache key, the record and every client see the same
thing.  Providers differ in whether and how they continue such a message:

- Anthropic's Messages API continues a final assistant message by itself (``client:
  anthropic``, or litellm with an ``anthropic/`` model).  It refuses one that ends in
  whitespace, so that whitespace is dropped before sending.
- vLLM and servers that follow it (SGLang, a trained Conductor behind vLLM) continue it
  when the body says ``continue_final_message: true`` and ``add_generation_prompt:
  false``; without them the chat template opens a new assistant turn after it.  This is
  assumed of any OpenAI-compatible server named by ``api_base`` (``client: openai``,
  ``http``, or litellm with an ``openai/`` or ``hosted_vllm/`` model).
- OpenAI's own API, Gemini and the in-process llama.cpp client cannot: the first two
  have no way to ask for it, and llama.cpp's chat handler builds the prompt itself, so
  there is no prompt to append to.  Callers leave the prefill out for these.

The provider returns only the continuation; the reply as the model wrote it is the
prefill as sent followed by that continuation (:func:`join_prefill`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from .types import Message

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = [
    "CONTINUE_FIELDS",
    "Continuation",
    "continuation",
    "continue_fields",
    "ends_with_prefill",
    "join_prefill",
    "prefill_message",
    "prefill_of",
    "unsupported_reason",
]

#: The body fields that ask vLLM to continue the final assistant message.
CONTINUE_FIELDS: dict[str, Any] = {"continue_final_message": True, "add_generation_prompt": False}

#: How a target continues a final assistant message: natively (Anthropic), or when the
#: body asks with :data:`CONTINUE_FIELDS` (vLLM and compatible servers).
Continuation = Literal["anthropic", "vllm"]

_OPENAI_COMPATIBLE_PREFIXES = ("openai/", "hosted_vllm/")


def continuation(target: Worker) -> Continuation | None:
    """How ``target`` continues a prefill, or ``None`` when it cannot."""
    kind = target.client or "litellm"
    if kind == "anthropic":
        return "anthropic"
    if kind in ("openai", "http"):
        return "vllm" if target.api_base else None
    if kind == "litellm":
        if target.model.startswith("anthropic/"):
            return "anthropic"
        if target.model.startswith(_OPENAI_COMPATIBLE_PREFIXES) and target.api_base:
            return "vllm"
    return None


def unsupported_reason(target: Worker) -> str:
    """Why ``target`` cannot continue a prefill (for a warning or an error message)."""
    kind = target.client or "litellm"
    if kind == "local":
        return "llama.cpp's chat handler builds the prompt itself, so there is none to extend"
    if kind == "google":
        return "the Gemini API cannot continue an assistant message"
    if kind in ("openai", "http"):
        return "OpenAI's own API cannot continue an assistant message (an api_base server can)"
    return (
        f"litellm model {target.model!r} is neither anthropic/... nor an openai/ or "
        "hosted_vllm/ model with an api_base"
    )


def prefill_message(target: Worker, text: str | None) -> Message | None:
    """The final assistant message that makes ``target``'s reply begin with ``text``, as
    it will be sent; ``None`` when there is no prefill or ``target`` cannot continue one.
    """
    if not text:
        return None
    how = continuation(target)
    if how is None:
        return None
    if how == "anthropic":
        # The Messages API refuses a final assistant message ending in whitespace.
        text = text.rstrip()
        if not text:
            return None
    return {"role": "assistant", "content": text}


def ends_with_prefill(messages: Sequence[Message]) -> bool:
    """Whether the last message is an assistant message for the model to continue."""
    return bool(messages) and messages[-1]["role"] == "assistant"


def prefill_of(messages: Sequence[Message]) -> str:
    """The prefill the reply to ``messages`` begins with ("" when there is none)."""
    return messages[-1]["content"] if ends_with_prefill(messages) else ""


def continue_fields(target: Worker, messages: Sequence[Message]) -> dict[str, Any]:
    """Body fields an OpenAI-protocol client adds so that a vLLM-style server continues
    the final assistant message of ``messages`` (empty when there is none to continue)."""
    if ends_with_prefill(messages) and continuation(target) == "vllm":
        return dict(CONTINUE_FIELDS)
    return {}


def join_prefill(messages: Sequence[Message], completion: str) -> str:
    """The reply as the model wrote it: the prefill of ``messages``, then ``completion``."""
    return prefill_of(messages) + completion
