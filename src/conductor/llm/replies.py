"""Read a provider's reply body into a :class:`RawCompletion`, trusting none of its shape.

Each client hands the body it got (a plain dict, or the SDK's object for it) to the
reader of its protocol: OpenAI chat completions (``openai``, ``http`` and ``litellm``
clients), Anthropic messages, or Gemini ``generateContent``.  A body that is not an
object, or lacks the fields a reply needs, raises :class:`BadResponseError` (retryable)
naming what was wrong; no reader lets an ``AttributeError`` or ``KeyError`` escape as
if it were a bug, and none turns a missing reply into ``""``.

:func:`check_reply` is the last check every client's reply passes (in
:class:`~conductor.llm.caller.ModelCaller`): an empty reply is a bad response too, and
API keys are masked in what is kept.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import BadResponseError
from ..redact import SECRETS
from .tools import read_anthropic_tool_calls, read_tool_calls
from .types import RawCompletion, ReportedCost, Usage

__all__ = [
    "COST_HEADER",
    "openai_content",
    "anthropic_reply",
    "bad_response",
    "body_of",
    "check_reply",
    "gemini_reply",
    "mask_secrets",
    "openai_reply",
    "reported_cost",
    "text_with_reasoning",
]

#: The response header in which ``conductor serve`` reports a request's cost in USD
#: (``unknown`` when a call of it has no known price).
COST_HEADER = "x-conductor-cost-usd"

#: How much of an unreadable body an error message quotes.
_QUOTE_CHARS = 200


def bad_response(target: str | None, detail: str) -> BadResponseError:
    """A :class:`BadResponseError` for ``target`` saying what was wrong with the reply."""
    err = BadResponseError(detail, target=target, provider_message=detail)
    err.args = (err.describe(),)
    return err


def _quote(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    if len(text) > _QUOTE_CHARS:
        text = text[:_QUOTE_CHARS] + "..."
    return json.dumps(text, ensure_ascii=True)


def body_of(resp: Any, target: str | None, **dump: Any) -> dict[str, Any]:
    """The reply body as a plain dict.

    SDKs return their response object, or (the ``openai`` and ``anthropic`` SDKs, for a
    body that is not JSON, such as an HTML error page with status 200) the body's text.
    ``dump`` is passed to the object's ``model_dump``.
    """
    if isinstance(resp, Mapping):
        return dict(resp)
    dumper = getattr(resp, "model_dump", None)
    if callable(dumper):
        # The SDKs build response objects without validation, so a field of the wrong
        # type is normal here; pydantic's warnings about it would only be noise.
        data = dumper(warnings=False, **dump)
        if isinstance(data, dict):
            return data
    if isinstance(resp, (str, bytes, bytearray)):
        if isinstance(resp, (bytes, bytearray)):
            resp = resp.decode("utf-8", "replace")
        raise bad_response(target, f"the reply is not a JSON object: {_quote(resp)}")
    raise bad_response(target, f"the reply is not a JSON object but {type(resp).__name__}")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def text_with_reasoning(content: str, message: Mapping[str, Any]) -> str:
    """The reply text, with reasoning that came back separately kept as a ``<think>`` block.

    litellm and vLLM's reasoning parsers move ``<think>...</think>`` out of the content
    into ``reasoning_content`` / ``reasoning``; the project keeps the block in the text
    (as open models write it) and strips it only where a final answer is taken.
    """
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning and "<think>" not in content:
        return f"<think>{reasoning}</think>{content}"
    return content


def _openai_content(content: Any, target: str | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    # Some compatible servers send content as a list of typed parts.
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return "".join(p["text"] for p in content if isinstance(p.get("text"), str))
    raise bad_response(
        target, f"choices[0].message.content is not text but {type(content).__name__}"
    )


def openai_content(body: Mapping[str, Any]) -> str:
    """The content of a Chat Completions body that :func:`openai_reply` read
    (``choices[0].message.content``): what the model wrote, without the reasoning a
    server's reasoning parser returned beside it."""
    message = body["choices"][0]["message"]
    return _openai_content(message.get("content"), None)


def openai_reply(
    body: Any, target: str | None, headers: Mapping[str, str] | None = None
) -> RawCompletion:
    """A Chat Completions body (``choices[0].message.content``) as a completion, with
    the cost the server reported in ``headers`` or the body (:func:`reported_cost`)."""
    if not isinstance(body, dict):
        raise bad_response(target, f"the reply is not a JSON object: {_quote(body)}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        what = "an empty choices list" if isinstance(choices, list) else "no choices"
        raise bad_response(target, f"the reply has {what}")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise bad_response(target, "choices[0] is not an object")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise bad_response(target, f"choices[0].message is not an object but {_quote(message)}")
    content = _openai_content(message.get("content"), target)
    calls = read_tool_calls(message.get("tool_calls"))
    if isinstance(calls, str):
        raise bad_response(target, f"choices[0].message.{calls}")
    usage = body.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return RawCompletion(
        text=text_with_reasoning(content, message),
        usage=Usage(_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))),
        raw=body,
        model=_str(body.get("model")),
        finish_reason=_str(choice.get("finish_reason")),
        reported_cost=reported_cost(body, headers),
        tool_calls=calls,
    )


def _usd(value: Any) -> float | None:
    """``value`` as a cost in USD, or None when it is not a finite number >= 0."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def reported_cost(
    body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> ReportedCost | None:
    """The cost the server reported for a Chat Completions reply, or None when it
    reported none: the ``x-conductor-cost-usd`` header (``unknown`` stays unknown), the
    body's ``conductor.cost_usd`` (``null``: unknown), or ``usage.cost``."""
    header = None
    if headers is not None:
        header = headers.get(COST_HEADER)
    if isinstance(header, str) and header.strip():
        return ReportedCost(_usd(header.strip()))
    ours = body.get("conductor")
    if isinstance(ours, Mapping) and "cost_usd" in ours:
        return ReportedCost(_usd(ours["cost_usd"]))
    usage = body.get("usage")
    if isinstance(usage, Mapping):
        cost = _usd(usage.get("cost"))
        if cost is not None:
            return ReportedCost(cost)
    return None


def anthropic_reply(body: Any, target: str | None) -> RawCompletion:
    """A Messages API body (text blocks of ``content``, its ``tool_use`` blocks the
    calls) as a completion."""
    if not isinstance(body, dict):
        raise bad_response(target, f"the reply is not a JSON object: {_quote(body)}")
    content = body.get("content")
    if not isinstance(content, list):
        raise bad_response(target, f"the reply's content is not a list but {_quote(content)}")
    text = "".join(
        block["text"]
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )
    u = body.get("usage")
    u = u if isinstance(u, dict) else {}
    input_tokens = (
        _int(u.get("input_tokens"))
        + _int(u.get("cache_creation_input_tokens"))
        + _int(u.get("cache_read_input_tokens"))
    )
    return RawCompletion(
        text=text,
        usage=Usage(input_tokens, _int(u.get("output_tokens"))),
        raw=body,
        model=_str(body.get("model")),
        finish_reason=_str(body.get("stop_reason")),
        tool_calls=read_anthropic_tool_calls(content),
    )


def gemini_reply(body: Any, target: str | None, model: str | None) -> RawCompletion:
    """A ``generateContent`` body, as google-genai dumps it (snake_case), as a completion.

    Thought parts (summaries) are not part of the answer.
    """
    if not isinstance(body, dict):
        raise bad_response(target, f"the reply is not a JSON object: {_quote(body)}")
    candidates = body.get("candidates")
    if not isinstance(candidates, list) or not candidates:
        feedback = body.get("prompt_feedback")
        why = f" (prompt feedback: {_quote(feedback)})" if feedback else ""
        raise bad_response(target, f"the reply has no candidates{why}")
    candidate = candidates[0]
    if not isinstance(candidate, dict):
        raise bad_response(target, "candidates[0] is not an object")
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    text = ""
    if isinstance(parts, list):
        text = "".join(
            p["text"]
            for p in parts
            if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")
        )
    elif content is not None and not isinstance(content, dict):
        raise bad_response(target, f"candidates[0].content is not an object: {_quote(content)}")
    finish = candidate.get("finish_reason")
    u = body.get("usage_metadata")
    u = u if isinstance(u, dict) else {}
    return RawCompletion(
        text=text,
        usage=Usage(
            _int(u.get("prompt_token_count")),
            _int(u.get("candidates_token_count")) + _int(u.get("thoughts_token_count")),
        ),
        raw=body,
        model=_str(body.get("model_version")) or model,
        finish_reason=_str(getattr(finish, "value", finish)),
    )


def mask_secrets(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (a string, or JSON-like data) with ``secrets`` and every secret value
    of this process (:data:`conductor.redact.SECRETS`) replaced by ``***``."""
    return SECRETS.masker(tuple(s for s in secrets if s)).data(value)


def check_reply(
    raw: RawCompletion,
    target: str | None,
    secrets: tuple[str, ...],
    *,
    deterministic: bool = False,
) -> RawCompletion:
    """``raw`` with API keys masked; an empty reply (no text and no tool call) raises
    :class:`BadResponseError`.

    An empty reply from a provider is a glitch: it is retried, and never cached.  An
    in-process model with a fixed seed (``deterministic``) would only repeat it, so its
    empty reply is returned (for the Conductor's parser to answer) but still not cached.
    """
    if not deterministic and not raw.text.strip() and not raw.tool_calls:
        why = f" (finish_reason {raw.finish_reason})" if raw.finish_reason else ""
        raise bad_response(target, f"the reply is empty{why}")
    masker = SECRETS.masker(secrets)
    if masker:
        text, body = masker.text(raw.text), masker.data(raw.raw)
        if text != raw.text or body != raw.raw:
            return dataclasses.replace(raw, text=text, raw=body)
    return raw
