"""The fake server's Gemini ``generateContent`` and ``streamGenerateContent``."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .fake_base import ServerBase
from .fake_script import Fault
from .fake_wire import finish_word, gemini_response, stream_pieces

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
            return gemini_response(
                model,
                response_id,
                text,
                finish=finish if final else None,
                prompt_tokens=prompt,
                completion_tokens=completion if final else 0,
            )

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
