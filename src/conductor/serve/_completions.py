"""OpenAI's legacy text completions (``POST /v1/completions``) as ``conductor serve``
speaks them.

The ``prompt`` (a string, or a list of one string) is the question, as one user
message of a :class:`~._protocol.ChatRequest`, so the chat route's service, records,
slots and limits apply.  The answer is a ``text_completion`` with one choice per run
(``n``); a stream sends ``text_completion`` chunks, then ``data: [DONE]``.  An
orchestration gives no token log-probabilities and does not continue a text in place,
so ``logprobs``, ``echo``, ``suffix`` and ``best_of`` are refused when they ask for
something.
"""

from __future__ import annotations

import time
from typing import Any

from ..record import RunRecord
from ._protocol import (
    ApiError,
    ChatMessage,
    ChatRequest,
    ChunkStream,
    allowed_workers_of,
    budget_of,
    conductor_field,
    json_object,
    model_of,
    pieces,
    progress_of,
    refuse_unsupported,
    samples_of,
    sse,
    stream_of,
    usage_of,
)

__all__ = ["CompletionRenderer", "parse_completion_request"]

_UNSUPPORTED = ("logprobs", "echo", "suffix", "logit_bias")


def parse_completion_request(raw: bytes) -> ChatRequest:
    """The request in ``raw`` as the conversation of one user message, or an
    :class:`ApiError` (400) naming what is wrong."""
    body = json_object(raw)
    refuse_unsupported(body, _UNSUPPORTED)
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise ApiError(
            400,
            "best_of is not supported: ask for n independent runs instead",
            param="best_of",
            code="unsupported_parameter",
        )
    model = model_of(body)
    n = samples_of(body)
    stream, include_usage = stream_of(body)
    return ChatRequest(
        model=model,
        messages=(ChatMessage("user", _prompt(body.get("prompt"))),),
        n=n,
        stream=stream,
        include_usage=include_usage,
        progress=progress_of(body, stream),
        allowed_workers=allowed_workers_of(body),
        budget=budget_of(body),
    )


def _prompt(raw: Any) -> str:
    if isinstance(raw, list) and len(raw) == 1:
        raw = raw[0]
    if not isinstance(raw, str):
        raise ApiError(
            400,
            "prompt must be a string or a list of one string (token ids and batches of "
            "prompts are not supported)",
            param="prompt",
        )
    return raw


class CompletionRenderer(ChunkStream):
    """A text-completions request's answer: a ``text_completion``, or its chunks."""

    def __init__(self, request: ChatRequest, run_ids: list[str]) -> None:
        self.request = request
        self.id = "cmpl-" + run_ids[0]
        self.created = int(time.time())

    def _object(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.request.model,
            "choices": choices,
            **extra,
        }

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(self._object(choices, **extra))

    async def keep(self, records: list[RunRecord]) -> None:
        """Nothing is stored of this format's answers."""

    def body(self, records: list[RunRecord]) -> dict[str, Any]:
        choices = [_choice(i, r.final_answer or "", "stop") for i, r in enumerate(records)]
        return self._object(choices, usage=usage_of(records), conductor=conductor_field(records))

    def opening(self) -> list[bytes]:
        return []

    def answer(self, index: int, record: RunRecord) -> list[bytes]:
        out = [self._chunk([_choice(index, p, None)]) for p in pieces(record.final_answer or "")]
        out.append(self._chunk([_choice(index, "", "stop")], conductor=conductor_field([record])))
        return out


def _choice(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
