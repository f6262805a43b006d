"""Assistant prefill: a reply that begins with given text, which the model continues.

A prefill travels as the *final* message of a request, with role ``assistant``; there
is no separate field for it, so the cache key, the record and every client see the same
thing.  Providers differ in whether and how they continue such a message, and each
client class declares which way its kind follows (its capabilities' ``prefill``, a
:data:`~conductor.llm.capabilities.PrefillRule`):

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
prefill as sent followed by that continuation
(:func:`~conductor.llm.prefill_rules.join_prefill`).  The rules themselves, which the
clients use, are :mod:`conductor.llm.prefill_rules`; this module applies them to a
target, asking the registry which rule its kind follows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .factory import capabilities_of
from .prefill_rules import Continuation, continuation_by

if TYPE_CHECKING:
    from ..targets import Worker
    from .types import Message

__all__ = ["continuation", "continues_in_template", "prefill_message", "unsupported_reason"]


def continuation(target: Worker) -> Continuation | None:
    """How ``target`` continues a prefill, or ``None`` when it cannot."""
    return continuation_by(capabilities_of(target).prefill, target)


def continues_in_template(target: Worker) -> bool:
    """Whether ``target``'s model renders the prefill through its own tokenizer's chat
    template (an in-process checkpoint), so that any prefill is continued."""
    return capabilities_of(target).prefill == "chat_template"


def unsupported_reason(target: Worker) -> str:
    """Why ``target`` cannot continue a prefill (for a warning or an error message)."""
    declared = capabilities_of(target).no_prefill
    if declared is not None:
        return declared
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
