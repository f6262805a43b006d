"""Which model targets can continue a reply (an assistant prefill), and how each is asked.

A request whose messages end with an assistant message asks the model to continue it
(:func:`conductor.llm.types.final_prefill`).  The ways to ask differ:

- OpenAI-compatible servers (``client: openai`` / ``http`` with an ``api_base``, or
  litellm's ``openai/`` and ``hosted_vllm/`` models with one): the final message goes
  as it is, with vLLM's ``continue_final_message: true`` and
  ``add_generation_prompt: false`` in the body (vLLM refuses both flags on at once);
- Anthropic (``client: anthropic``, or litellm's ``anthropic/`` models): the Messages
  API continues a final assistant message itself, but refuses one that ends in
  whitespace, so that is trimmed;
- a trained checkpoint run in-process: the tokenizer's chat template continues it
  (``continue_final_message=True``).

Everything else (OpenAI's hosted API, Gemini, the embedded llama.cpp model, other
litellm providers) would answer with a new message instead, so
:func:`prefill_unsupported` says why, and the caller refuses or skips the prefill.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .types import Message, final_prefill

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..pool import Worker

__all__ = [
    "VLLM_CONTINUE_FIELDS",
    "anthropic_prefill_messages",
    "continue_fields",
    "prefill_unsupported",
]

#: The body fields that make vLLM (and servers that copy its API) continue the final
#: assistant message instead of starting a new one.
VLLM_CONTINUE_FIELDS: dict[str, Any] = {
    "continue_final_message": True,
    "add_generation_prompt": False,
}


def _litellm_provider(model: str) -> str:
    return model.split("/", 1)[0] if "/" in model else "openai"


def prefill_unsupported(target: Worker) -> str | None:
    """Why ``target`` cannot continue a reply, or ``None`` when it can."""
    # "checkpoint" is the Conductor-only client kind, outside the pool's ClientKind.
    kind: str = target.client or "litellm"
    if kind in ("checkpoint", "anthropic"):
        return None
    if kind in ("openai", "http"):
        if target.api_base:
            return None
        return "OpenAI's hosted API answers with a new message instead of continuing one"
    if kind == "litellm":
        provider = _litellm_provider(target.model)
        if provider == "anthropic":
            return None
        if provider in ("openai", "hosted_vllm"):
            if target.api_base:
                return None
            return "OpenAI's hosted API answers with a new message instead of continuing one"
        return f"litellm's {provider!r} provider has no way to continue a reply"
    if kind == "google":
        return "the Gemini API has no way to continue a reply"
    if kind == "local":
        return "the embedded llama.cpp model is driven through its chat API, which cannot"
    return f"client {kind!r} has no way to continue a reply"


def continue_fields(messages: Sequence[Message]) -> dict[str, Any]:
    """vLLM's continuation fields when ``messages`` end with a prefill, else nothing."""
    return dict(VLLM_CONTINUE_FIELDS) if final_prefill(messages) is not None else {}


def anthropic_prefill_messages(messages: list[Any]) -> list[Any]:
    """``messages`` with a final assistant message's trailing whitespace trimmed (the
    Messages API refuses it); the model's continuation then supplies any break."""
    if messages and messages[-1].get("role") == "assistant":
        last = messages[-1]
        content = last.get("content")
        if isinstance(content, str) and content != content.rstrip():
            return [*messages[:-1], {**last, "content": content.rstrip()}]
    return messages
