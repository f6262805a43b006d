"""The core of :class:`~conductor.testing.FakeLLMServer`: its state and the request path
the OpenAI, Anthropic and Gemini routes share.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import socket
import struct
import threading
import time
import uuid
from typing import Any

from aiohttp import web

from .fake_script import FakeRequest, Fault, Protocol, Reply, Script, echo
from .fake_wire import bearer_token, broken_reply, error_payload, request_messages, word_count

__all__ = ["ServerBase"]


class ServerBase:
    """The state of a fake server and the request path every protocol shares: intake
    (parse, log, authenticate), the scripted answer and its latency, usage counts,
    error bodies, faults and server-sent events."""

    def __init__(self, expected_api_key: str | None = None, latency_s: float = 0.0) -> None:
        self.expected_api_key = expected_api_key
        self.latency_s = latency_s
        self._lock = threading.Lock()
        self._scripts: dict[str, Script] = {}
        self._default = Script(echo)
        self._log: list[FakeRequest] = []
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    async def _receive(
        self, request: web.Request, protocol: Protocol, model: str | None
    ) -> tuple[FakeRequest | None, web.StreamResponse | None]:
        """Parse, log and authenticate a request; returns (request, None) or (None, error)."""
        received_at = time.monotonic()
        headers = {k.lower(): v for k, v in request.headers.items()}
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
            if not isinstance(body, dict):
                raise ValueError("body is not a JSON object")
        except ValueError as exc:
            return None, self._error(protocol, 400, f"Invalid JSON body: {exc}", {})
        if model is None:
            model = str(body.get("model") or "")
        api_key = self._api_key_of(request, protocol)
        messages = request_messages(protocol, body)
        fake = FakeRequest(
            protocol=protocol,
            path=request.path,
            model=model,
            headers=headers,
            body=body,
            messages=messages,
            api_key=api_key,
            received_at=received_at,
        )
        with self._lock:
            self._log.append(fake)
        if self.expected_api_key is not None and api_key != self.expected_api_key:
            return None, self._error(protocol, 401, "Incorrect API key provided.", {})
        return fake, None

    @staticmethod
    def _api_key_of(request: web.Request, protocol: Protocol) -> str | None:
        """The API key ``request`` carries, where ``protocol`` puts it."""
        headers = {k.lower(): v for k, v in request.headers.items()}
        if protocol == "openai":
            return bearer_token(headers)
        if protocol == "anthropic":
            return headers.get("x-api-key") or bearer_token(headers)
        return headers.get("x-goog-api-key") or request.query.get("key")

    async def _respond(self, fake: FakeRequest) -> Reply | Fault:
        """Run the model's responder, then wait out the latency."""
        outcome = await self._answer(fake)
        delay = self.latency_s if outcome.latency_s is None else outcome.latency_s
        if delay > 0:
            await asyncio.sleep(delay)
        return outcome

    async def _answer(self, fake: FakeRequest) -> Reply | Fault:
        """What the model's responder answers ``fake`` (no latency waited)."""
        with self._lock:
            script = self._scripts.get(fake.model, self._default)
            result: Any = script.next_item() if script.func is None else None
        # Callables run outside the lock so that they may read the server's request log.
        if script.func is not None:
            result = script.func(fake)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, str):
            result = Reply(result)
        if not isinstance(result, (Reply, Fault)):
            result = Fault(500, f"responder returned {type(result).__name__}, not str/Reply/Fault")
        outcome: Reply | Fault = result
        return outcome

    @staticmethod
    def _usage(fake: FakeRequest, reply: Reply) -> tuple[int, int]:
        prompt = (
            reply.input_tokens
            if reply.input_tokens is not None
            else sum(word_count(m["content"]) for m in fake.messages)
        )
        completion = (
            reply.output_tokens if reply.output_tokens is not None else word_count(reply.text)
        )
        return prompt, completion

    def _error(
        self, protocol: Protocol, status: int, message: str, headers: dict[str, str]
    ) -> web.Response:
        """An error response in `protocol`'s own body format."""
        payload = error_payload(protocol, status, message)
        return web.json_response(payload, status=status, headers=headers)

    async def _fault(
        self, request: web.Request, protocol: Protocol, fault: Fault, fake: FakeRequest
    ) -> web.StreamResponse:
        """What `fault` answers: nothing (reset, hang), a verbatim body, a reply of a
        broken shape, or the provider's error body."""
        if fault.action == "hang":
            await asyncio.sleep(fault.hang_s)
            return self._error(protocol, 504, "the fake server hung", fault.headers)
        if fault.action == "reset":
            transport = request.transport
            if transport is not None:
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    # Linger 0: closing sends a TCP reset instead of an orderly FIN.
                    with contextlib.suppress(OSError):
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                transport.abort()
            return web.Response(status=500)
        if fault.body is not None:
            return web.Response(
                body=fault.body,
                status=fault.status,
                headers={"Content-Type": fault.content_type, **fault.headers},
            )
        if fault.shape is not None:
            body = broken_reply(protocol, fault.shape, fake, self._new_id("broken-"))
            return web.json_response(body, status=fault.status, headers=fault.headers)
        return self._error(protocol, fault.status, fault.message, fault.headers)

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):06d}{uuid.uuid4().hex[:12]}"

    async def _sse(self, request: web.Request, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        await response.write(b"".join(events))
        await response.write_eof()
        return response
