"""The fake server's Gemini ``generateContent`` and ``streamGenerateContent``."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .fake_base import ServerBase
from .fake_script import Fault
from .fake_wire import finish_word, stream_pieces

__all__ = ["GeminiRoutes"]


class GeminiRoutes(ServerBase):
    """The fake server's Gemini ``generateContent`` and ``streamGenerateContent`` routes."""

    async def _handle_gemini(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        model, _, method = name.rpartition(":")
        if method not in ("generateContent", "streamGenerateContent") or not model:
            return self._error("gemini", 404, f"Unknown method {name!r}", {})
        fake, error = await self._receive(request, "gemini", model)
        if fake is None:
            assert error is not None
            return error
        result = await self._respond(fake)
        if isinstance(result, Fault):
            return await self._fault(request, "gemini", result, fake)
        prompt, completion = self._usage(fake, result)
        response_id = self._new_id("")
        finish = finish_word("gemini", result.finish_reason)

        def payload(text: str, final: bool) -> dict[str, Any]:
            candidate: dict[str, Any] = {
                "content": {"role": "model", "parts": [{"text": text}]},
                "index": 0,
            }
            data: dict[str, Any] = {"candidates": [candidate]}
            if final:
                candidate["finishReason"] = finish
            data["usageMetadata"] = {
                "promptTokenCount": prompt,
                "candidatesTokenCount": completion if final else 0,
                "totalTokenCount": prompt + (completion if final else 0),
            }
            data["modelVersion"] = model
            data["responseId"] = response_id
            return data

        if method == "generateContent":
            return web.json_response(payload(result.text, True))
        pieces = stream_pieces(result.text) or [""]
        if request.query.get("alt") == "sse":
            events = [
                b"data: " + json.dumps(payload(p, i == len(pieces) - 1)).encode() + b"\r\n\r\n"
                for i, p in enumerate(pieces)
            ]
            return await self._sse(request, events)
        # Without alt=sse the REST API streams one JSON array of responses.
        return web.json_response([payload(p, i == len(pieces) - 1) for i, p in enumerate(pieces)])
