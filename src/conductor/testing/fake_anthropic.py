"""The fake server's Anthropic messages (streaming included)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .fake_base import ServerBase
from .fake_script import FakeRequest, Fault, Reply
from .fake_wire import finish_word, stream_pieces

__all__ = ["AnthropicRoutes", "anthropic_message"]


def anthropic_message(
    model: str, reply: Reply, ident: str, usage: tuple[int, int]
) -> dict[str, Any]:
    """The Message body that answers with ``reply``: its text block (none when it only
    calls tools) and a ``tool_use`` block per call.  A live reply and a batch's
    succeeded line (``fake_anthropic_batch``) carry the same body."""
    uses = [
        {
            "type": "tool_use",
            "id": c.id or f"toolu_{k}",
            "name": c.name,
            "input": json.loads(c.arguments_text),
        }
        for k, c in enumerate(reply.tool_calls)
    ]
    text = [{"type": "text", "text": reply.text}] if reply.text or not uses else []
    return {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": text + uses,
        "stop_reason": "tool_use" if uses else finish_word("anthropic", reply.finish_reason),
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


class AnthropicRoutes(ServerBase):
    """The fake server's Anthropic messages (streaming included) routes."""

    async def _handle_anthropic(self, request: web.Request) -> web.StreamResponse:
        fake, error = await self._receive(request, "anthropic", None)
        if fake is None:
            assert error is not None
            return error
        result = await self._respond(fake)
        if isinstance(result, Fault):
            return await self._fault(request, "anthropic", result, fake)
        prompt, completion = self._usage(fake, result)
        ident = self._new_id("msg_")
        if fake.body.get("stream"):
            return await self._anthropic_stream(
                request, fake, result.text, prompt, completion, ident, result.finish_reason
            )
        return web.json_response(anthropic_message(fake.model, result, ident, (prompt, completion)))

    async def _anthropic_stream(
        self,
        request: web.Request,
        fake: FakeRequest,
        text: str,
        prompt: int,
        completion: int,
        ident: str,
        finish_reason: str | None = None,
    ) -> web.StreamResponse:
        stop = finish_word("anthropic", finish_reason)

        def event(name: str, data: dict[str, Any]) -> bytes:
            data = {"type": name, **data}
            return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

        message: dict[str, Any] = {
            "id": ident,
            "type": "message",
            "role": "assistant",
            "model": fake.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": 1},
        }
        events = [
            event("message_start", {"message": message}),
            event(
                "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
            ),
            event("ping", {}),
        ]
        events += [
            event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": p}})
            for p in stream_pieces(text)
        ]
        events += [
            event("content_block_stop", {"index": 0}),
            event(
                "message_delta",
                {
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": completion},
                },
            ),
            event("message_stop", {}),
        ]
        return await self._sse(request, events)
