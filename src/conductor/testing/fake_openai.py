"""The fake server's OpenAI chat completions (streaming included) and the model list."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .fake_base import ServerBase
from .fake_script import FakeRequest, Fault, Reply
from .fake_wire import finish_word, stream_pieces

__all__ = ["ChatAnswer", "OpenAIRoutes"]


@dataclass(frozen=True)
class ChatAnswer:
    """A scripted :class:`Reply` in Chat Completions' words: what a live reply, its
    stream and a batch's result line (``fake_openai_batch``) are all built from, so
    that the three say the same thing."""

    text: str
    usage: dict[str, Any]
    calls: list[dict[str, Any]]
    finish: str

    @classmethod
    def of(cls, reply: Reply, prompt_tokens: int, completion_tokens: int) -> ChatAnswer:
        """``reply`` with its token counts (what the server counted for the request)."""
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if reply.cost_usd is not None:
            usage["cost"] = reply.cost_usd
        calls = [
            {
                "id": c.id or f"call_{k}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments_text},
            }
            for k, c in enumerate(reply.tool_calls)
        ]
        finish = "tool_calls" if calls else finish_word("openai", reply.finish_reason)
        return cls(reply.text, usage, calls, finish)

    def body(self, *, ident: str, created: int, model: str) -> dict[str, Any]:
        """The ``chat.completion`` object of a reply that is not streamed."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text, "refusal": None}
        if self.calls:
            message["content"] = self.text or None
            message["tool_calls"] = self.calls
        return {
            "id": ident,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish,
                }
            ],
            "usage": self.usage,
            "system_fingerprint": "fp_fake",
        }


class OpenAIRoutes(ServerBase):
    """The fake server's OpenAI chat completions (streaming included) and the model list routes."""

    async def _handle_openai(self, request: web.Request) -> web.StreamResponse:
        fake, error = await self._receive(request, "openai", None)
        if fake is None:
            assert error is not None
            return error
        result = await self._respond(fake)
        if isinstance(result, Fault):
            return await self._fault(request, "openai", result, fake)
        answer = ChatAnswer.of(result, *self._usage(fake, result))
        ident, created = self._new_id("chatcmpl-"), int(time.time())
        if fake.body.get("stream"):
            return await self._openai_stream(request, fake, answer, ident, created)
        return web.json_response(answer.body(ident=ident, created=created, model=fake.model))

    async def _openai_stream(
        self,
        request: web.Request,
        fake: FakeRequest,
        answer: ChatAnswer,
        ident: str,
        created: int,
    ) -> web.StreamResponse:
        text, usage, finish, calls = answer.text, answer.usage, answer.finish, answer.calls
        options = fake.body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        base = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": fake.model,
            "system_fingerprint": "fp_fake",
        }

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            data = {**base, "choices": choices, **extra}
            if include_usage and "usage" not in extra:
                data["usage"] = None
            return b"data: " + json.dumps(data).encode() + b"\n\n"

        def choice(delta: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
            return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

        events = [chunk(choice({"role": "assistant", "content": ""}))]
        if text or not calls:
            events += [chunk(choice({"content": piece})) for piece in stream_pieces(text)]
        for k, call in enumerate(calls):
            # The way OpenAI streams a call: its id and name first, then its arguments.
            head = {**call, "function": {"name": call["function"]["name"], "arguments": ""}}
            events.append(chunk(choice({"tool_calls": [{"index": k, **head}]})))
            for piece in stream_pieces(call["function"]["arguments"]):
                delta = {"index": k, "function": {"arguments": piece}}
                events.append(chunk(choice({"tool_calls": [delta]})))
        events.append(chunk(choice({}, finish)))
        if include_usage:
            events.append(chunk([], usage=usage))
        events.append(b"data: [DONE]\n\n")
        return await self._sse(request, events)

    async def _handle_models(self, request: web.Request) -> web.Response:
        with self._lock:
            names = sorted(self._scripts)
        created = int(time.time())
        if "anthropic-version" in request.headers:
            data: list[dict[str, Any]] = [
                {
                    "type": "model",
                    "id": n,
                    "display_name": n,
                    "created_at": "2025-01-01T00:00:00Z",
                }
                for n in names
            ]
            return web.json_response(
                {
                    "data": data,
                    "has_more": False,
                    "first_id": names[0] if names else None,
                    "last_id": names[-1] if names else None,
                }
            )
        data = [{"id": n, "object": "model", "created": created, "owned_by": "fake"} for n in names]
        return web.json_response({"object": "list", "data": data})
