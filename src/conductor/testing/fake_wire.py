"""Each provider's wire format as the fake server speaks it: request messages normalised
to ``[{role, content}]`` (:func:`request_messages`), bearer API keys
(:func:`bearer_token`), error bodies in each provider's vocabulary
(:func:`error_payload`), finish reasons (:func:`finish_word`), word-sized stream pieces
(:func:`stream_pieces`), token counts (:func:`word_count`) and reply bodies of a broken
shape (:func:`broken_reply`).  The request path of ``fake_base`` and the routes of
``fake_openai``, ``fake_anthropic`` and ``fake_gemini`` speak through these.
"""

from __future__ import annotations

import re
import time
from typing import Any

from .fake_script import FakeRequest, Protocol, Shape

__all__ = [
    "bearer_token",
    "broken_reply",
    "error_payload",
    "finish_word",
    "gemini_response",
    "gemini_status",
    "request_messages",
    "stream_pieces",
    "word_count",
]

# Error vocabularies of the three providers, by HTTP status.
_OPENAI_ERRORS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_denied", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    409: ("conflict", None),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
}
_ANTHROPIC_ERRORS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_GEMINI_ERRORS: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

# The number google.rpc.Code gives each of Gemini's status names: a google.rpc.Status (a
# batch's error line, a failed operation) carries the number, not the HTTP status.
_GRPC_CODES: dict[str, int] = {
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "ABORTED": 10,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "UNAUTHENTICATED": 16,
}

# A Reply's finish_reason in each protocol's own words.
_FINISH: dict[Protocol, dict[str, str]] = {
    "openai": {"stop": "stop", "length": "length"},
    "anthropic": {"stop": "end_turn", "length": "max_tokens"},
    "gemini": {"stop": "STOP", "length": "MAX_TOKENS"},
}


def finish_word(protocol: Protocol, finish_reason: str | None) -> str:
    """A :class:`~conductor.testing.Reply`'s `finish_reason` (``"stop"``, ``"length"``
    or None for a normal stop) in `protocol`'s own words."""
    return _FINISH[protocol][finish_reason or "stop"]


def error_payload(protocol: Protocol, status: int, message: str) -> dict[str, Any]:
    """The JSON body `protocol` answers an error of HTTP `status` with, in its own
    vocabulary (a status it has no word for gets the generic one of its class)."""
    if protocol == "openai":
        etype, code = _OPENAI_ERRORS.get(
            status, ("server_error" if status >= 500 else "invalid_request_error", None)
        )
        return {"error": {"message": message, "type": etype, "param": None, "code": code}}
    if protocol == "anthropic":
        etype = _ANTHROPIC_ERRORS.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        return {"type": "error", "error": {"type": etype, "message": message}}
    return {"error": {"code": status, "message": message, "status": _gemini_word(status)}}


def _gemini_word(status: int) -> str:
    """Gemini's status name for an HTTP ``status``."""
    return _GEMINI_ERRORS.get(status, "INTERNAL" if status >= 500 else "UNKNOWN")


def gemini_status(status: int, message: str) -> dict[str, Any]:
    """The ``google.rpc.Status`` Gemini reports an error of HTTP ``status`` with where
    it is not an HTTP answer (a batch's error line, a failed batch operation): the
    gRPC code of its status name, and the message."""
    return {"code": _GRPC_CODES[_gemini_word(status)], "message": message}


def gemini_response(
    model: str,
    response_id: str,
    text: str,
    *,
    finish: str | None,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """A ``generateContent`` reply body (or one piece of a stream: ``finish`` None, no
    completion tokens yet), as the live route and a batch's answered line send it."""
    candidate: dict[str, Any] = {
        "content": {"role": "model", "parts": [{"text": text}]},
        "index": 0,
    }
    if finish is not None:
        candidate["finishReason"] = finish
    return {
        "candidates": [candidate],
        "usageMetadata": {
            "promptTokenCount": prompt_tokens,
            "candidatesTokenCount": completion_tokens,
            "totalTokenCount": prompt_tokens + completion_tokens,
        },
        "modelVersion": model,
        "responseId": response_id,
    }


_PIECES = re.compile(r"\s*\S+\s*|\s+")


def stream_pieces(text: str) -> list[str]:
    """Split `text` into word-sized stream chunks that join back to it exactly."""
    return _PIECES.findall(text) or ([text] if text else [])


def word_count(text: str) -> int:
    """The whitespace word count of `text`: the fake server's token count."""
    return len(text.split())


def _part_text(content: Any, text_key: str = "text") -> str:
    """Flatten a content value (string, list of parts, None) into plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict):
                value = part.get(text_key)
                if isinstance(value, str):
                    texts.append(value)
                elif "content" in part:  # Anthropic tool_result blocks nest their content
                    texts.append(_part_text(part["content"]))
        return "\n".join(texts)
    return str(content)


def _normalise_openai(body: dict[str, Any]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for message in body.get("messages") or []:
        role = str(message.get("role", "user"))
        if role == "developer":
            role = "system"
        out.append({"role": role, "content": _part_text(message.get("content"))})
    return out


def _normalise_anthropic(body: dict[str, Any]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": _part_text(system)})
    for message in body.get("messages") or []:
        out.append(
            {
                "role": str(message.get("role", "user")),
                "content": _part_text(message.get("content")),
            }
        )
    return out


def _normalise_gemini(body: dict[str, Any]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    system = body.get("systemInstruction") or body.get("system_instruction")
    if system:
        parts = system.get("parts") if isinstance(system, dict) else system
        out.append({"role": "system", "content": _part_text(parts)})
    for content in body.get("contents") or []:
        if isinstance(content, str):
            out.append({"role": "user", "content": content})
            continue
        role = str(content.get("role") or "user")
        if role == "model":
            role = "assistant"
        out.append({"role": role, "content": _part_text(content.get("parts"))})
    return out


def request_messages(protocol: Protocol, body: dict[str, Any]) -> list[dict[str, str]]:
    """The messages of a `protocol` request `body` as ``[{role, content}]`` (see
    :class:`~conductor.testing.FakeRequest`)."""
    if protocol == "openai":
        return _normalise_openai(body)
    if protocol == "anthropic":
        return _normalise_anthropic(body)
    return _normalise_gemini(body)


def bearer_token(headers: dict[str, str]) -> str | None:
    """The API key of an ``Authorization: Bearer`` header (`headers` with lower-case
    names), or None without one."""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return None


def broken_reply(protocol: Protocol, shape: Shape, fake: FakeRequest, ident: str) -> dict[str, Any]:
    """A reply body of `protocol` whose answer is broken as `shape` says (see `SHAPES`)."""
    text = "" if shape == "empty_text" else "unused"
    broken = "a reply that is a string, not an object"
    if protocol == "openai":
        message: dict[str, Any] = {"role": "assistant", "content": text}
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "stop"}
        body: dict[str, Any] = {
            "id": ident,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": fake.model,
            "choices": [choice],
            "usage": {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1},
        }
        if shape == "null_content":
            message["content"] = None
        elif shape == "string_message":
            choice["message"] = broken
        key = "choices"
    elif protocol == "anthropic":
        body = {
            "id": ident,
            "type": "message",
            "role": "assistant",
            "model": fake.model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 0},
        }
        if shape == "null_content":
            body["content"] = None
        elif shape == "string_message":
            body["content"] = broken
        key = "content"
    else:
        candidate: dict[str, Any] = {
            "content": {"role": "model", "parts": [{"text": text}]},
            "finishReason": "STOP",
            "index": 0,
        }
        body = {
            "candidates": [candidate],
            "usageMetadata": {"promptTokenCount": 1, "totalTokenCount": 1},
            "modelVersion": fake.model,
        }
        if shape == "null_content":
            del candidate["content"]
        elif shape == "string_message":
            candidate["content"] = broken
        key = "candidates"
    if shape == "empty_choices":
        body[key] = []
    elif shape == "no_choices":
        del body[key]
    return body
