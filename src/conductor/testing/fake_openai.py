"""The fake server's OpenAI chat completions (streaming included) and the model list."""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from .fake_base import ServerBase
from .fake_script import FakeRequest, Fault, Reply
from .fake_wire import finish_word, stream_pieces

__all__ = ["OpenAIRoutes"]


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
        if fake.body.get("stream"):
            usage = self._openai_usage(fake, result)
            calls = _openai_calls(result)
            finish = "tool_calls" if calls else finish_word("openai", result.finish_reason)
            ident, created = self._new_id("chatcmpl-"), int(time.time())
            return await self._openai_stream(
                request, fake, result.text, usage, ident, created, finish, calls
            )
        return web.json_response(self._chat_completion(fake, result))

    def _openai_usage(self, fake: FakeRequest, result: Reply) -> dict[str, Any]:
        prompt, completion = self._usage(fake, result)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if result.cost_usd is not None:
            usage["cost"] = result.cost_usd
        return usage

    def _chat_completion(self, fake: FakeRequest, result: Reply) -> dict[str, Any]:
        """The ``chat.completion`` body answering ``fake`` with ``result`` (a live reply,
        or a batch's result line)."""
        calls = _openai_calls(result)
        finish = "tool_calls" if calls else finish_word("openai", result.finish_reason)
        message: dict[str, Any] = {"role": "assistant", "content": result.text, "refusal": None}
        if calls:
            message["content"] = result.text or None
            message["tool_calls"] = calls
        return {
            "id": self._new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": fake.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": self._openai_usage(fake, result),
            "system_fingerprint": "fp_fake",
        }

    async def _openai_stream(
        self,
        request: web.Request,
        fake: FakeRequest,
        text: str,
        usage: dict[str, Any],
        ident: str,
        created: int,
        finish: str,
        calls: list[dict[str, Any]],
    ) -> web.StreamResponse:
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


def _openai_calls(result: Reply) -> list[dict[str, Any]]:
    return [
        {
            "id": c.id or f"call_{k}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments_text},
        }
        for k, c in enumerate(result.tool_calls)
    ]
