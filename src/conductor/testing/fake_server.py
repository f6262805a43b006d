"""A scriptable fake LLM provider server for tests and offline benchmarks.

`FakeLLMServer` runs an aiohttp server on 127.0.0.1 in a background thread (with its own
event loop) and speaks three real wire protocols, so the real SDKs and litellm can be pointed
at it unchanged:

- OpenAI chat completions: ``POST /v1/chat/completions`` (streaming included) and
  ``GET /v1/models``;
- Anthropic messages: ``POST /v1/messages`` (streaming included);
- Gemini: ``POST /v1beta/models/{model}:generateContent`` (and ``:streamGenerateContent``,
  also under ``/v1/``).

What each model answers is scripted per model name with `FakeLLMServer.script`; every request
is logged as a `FakeRequest` with its messages normalised to ``[{role, content}]``.
Errors use each provider's real error body and HTTP status, so the SDKs raise their proper
exception classes.

Example::

    with FakeLLMServer() as server:
        server.script("gpt-x", ["first answer", Fault(429, headers={"Retry-After": "1"})])
        client = openai.OpenAI(base_url=server.openai_base, api_key="k")
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import re
import socket
import struct
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from aiohttp import web

__all__ = [
    "SHAPES",
    "FakeLLMServer",
    "FakeRequest",
    "Fault",
    "Reply",
    "Responder",
    "ResponderResult",
    "Shape",
]

Protocol = Literal["openai", "anthropic", "gemini"]


@dataclass
class Reply:
    """A successful answer: `text`, with optional per-reply latency and token counts.

    Token counts left as None default to whitespace word counts (input: every message's
    content; output: `text`). `latency_s` None means the server's `latency_s`.
    `finish_reason` ``"length"`` marks the reply as cut off at the token limit, in each
    protocol's own words (OpenAI ``length``, Anthropic ``max_tokens``, Gemini
    ``MAX_TOKENS``); None is a normal stop.
    """

    text: str
    latency_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: Literal["stop", "length"] | None = None


#: Status-200 replies of a broken shape that `Fault.malformed` serves, in each protocol:
#: ``empty_choices`` (OpenAI ``choices: []``, Anthropic ``content: []``, Gemini
#: ``candidates: []``), ``no_choices`` (that key missing), ``null_content`` (OpenAI
#: ``message.content: null``, Anthropic ``content: null``, Gemini a candidate with no
#: ``content``), ``empty_text`` (the reply text is ``""``) and ``string_message`` (OpenAI
#: ``message`` a string, Anthropic ``content`` a string, Gemini ``content`` a string).
Shape = Literal["empty_choices", "no_choices", "null_content", "empty_text", "string_message"]
SHAPES: tuple[Shape, ...] = (
    "empty_choices",
    "no_choices",
    "null_content",
    "empty_text",
    "string_message",
)


@dataclass
class Fault:
    """An error answer with HTTP `status`, in the provider's own error format.

    `headers` are added to the response (e.g. ``{"Retry-After": "1"}``); `latency_s` None
    means the server's `latency_s`.  The constructors make the faults that are not an
    error body: `raw` (a verbatim body, e.g. broken JSON or an HTML page), `malformed` (a
    reply of a broken shape, see `SHAPES`), `reset` (the connection is reset, no reply)
    and `hang` (no reply for `hang_s` seconds).
    """

    status: int
    message: str = "Injected fault from the fake LLM server"
    headers: dict[str, str] = field(default_factory=dict)
    latency_s: float | None = None
    body: bytes | None = None
    content_type: str = "application/json"
    shape: Shape | None = None
    action: Literal["respond", "reset", "hang"] = "respond"
    hang_s: float = 3600.0

    @classmethod
    def raw(
        cls, body: str | bytes, status: int = 200, content_type: str = "application/json"
    ) -> Fault:
        """Serve `body` verbatim with `status` and `content_type`, in every protocol."""
        data = body.encode() if isinstance(body, str) else body
        return cls(status, body=data, content_type=content_type)

    @classmethod
    def malformed(cls, shape: Shape) -> Fault:
        """A status-200 reply of the broken `shape` in the request's protocol."""
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r}; expected one of {', '.join(SHAPES)}")
        return cls(200, shape=shape)

    @classmethod
    def reset(cls) -> Fault:
        """Reset the connection once the request has been read; nothing is answered."""
        return cls(0, action="reset")

    @classmethod
    def hang(cls, seconds: float = 3600.0) -> Fault:
        """Answer nothing for `seconds` (the client's time-out should fire first)."""
        return cls(0, action="hang", hang_s=seconds)


@dataclass
class FakeRequest:
    """One request as the fake server received it.

    `messages` is normalised across protocols to ``[{"role", "content"}]``: a system prompt
    (Anthropic ``system``, Gemini ``systemInstruction``, OpenAI ``developer``) becomes a
    leading ``system`` message, Gemini's ``model`` role becomes ``assistant`` and content parts
    are joined with newlines. `headers` has lower-case names. `received_at` is
    ``time.monotonic()`` at arrival.
    """

    protocol: Protocol
    path: str
    model: str
    headers: dict[str, str]
    body: dict[str, Any]
    messages: list[dict[str, str]]
    api_key: str | None
    received_at: float

    @property
    def last_user_message(self) -> str:
        """The content of the last ``user`` message, or "" if there is none."""
        for message in reversed(self.messages):
            if message["role"] == "user":
                return message["content"]
        return ""


ResponderResult: TypeAlias = str | Reply | Fault
"""What a responder yields for one request."""

Responder: TypeAlias = (
    ResponderResult
    | Sequence[ResponderResult]
    | Callable[[FakeRequest], ResponderResult | Awaitable[ResponderResult]]
)
"""A script: one item, a list (consumed in order, the last repeats) or a callable."""


async def _cancel_pending() -> None:
    """Cancel every other task of the running loop and wait for them to end."""
    current = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def _echo(request: FakeRequest) -> str:
    """The built-in default: echo the start of the last user message."""
    return f"Echo: {request.last_user_message[:80]}"


class _Script:
    """A responder with its position, so lists are consumed in order."""

    def __init__(self, responder: Responder) -> None:
        self.func: Callable[[FakeRequest], Any] | None = None
        self.items: list[ResponderResult] = []
        self.index = 0
        if callable(responder):
            self.func = responder
        elif isinstance(responder, (str, Reply, Fault)):
            self.items = [responder]
        else:
            self.items = list(responder)
            if not self.items:
                raise ValueError("a responder list needs at least one item")
            for item in self.items:
                if not isinstance(item, (str, Reply, Fault)):
                    raise TypeError(f"responder items must be str, Reply or Fault, not {item!r}")

    def next_item(self) -> ResponderResult:
        """The next list item (callers hold the server lock)."""
        item = self.items[min(self.index, len(self.items) - 1)]
        self.index += 1
        return item


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
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
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

# A Reply's finish_reason in each protocol's own words.
_FINISH: dict[Protocol, dict[str, str]] = {
    "openai": {"stop": "stop", "length": "length"},
    "anthropic": {"stop": "end_turn", "length": "max_tokens"},
    "gemini": {"stop": "STOP", "length": "MAX_TOKENS"},
}

_PIECES = re.compile(r"\s*\S+\s*|\s+")


def _pieces(text: str) -> list[str]:
    """Split `text` into word-sized stream chunks that join back to it exactly."""
    return _PIECES.findall(text) or ([text] if text else [])


def _words(text: str) -> int:
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


def _bearer(headers: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return None


class FakeLLMServer:
    """A fake OpenAI / Anthropic / Gemini server on 127.0.0.1, scripted per model name.

    Start it with `start()` or as a context manager. If `expected_api_key` is set, any request
    with a different key gets a 401 in the provider's format. `latency_s` (settable at any time)
    delays every answer that does not set its own; delays use ``asyncio.sleep`` so hundreds of
    requests can be in flight at once. Callable responders run on the server's event loop:
    they must not block (they may be ``async``).
    """

    def __init__(self, expected_api_key: str | None = None, latency_s: float = 0.0) -> None:
        self.expected_api_key = expected_api_key
        self.latency_s = latency_s
        self._lock = threading.Lock()
        self._scripts: dict[str, _Script] = {}
        self._default = _Script(_echo)
        self._log: list[FakeRequest] = []
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> FakeLLMServer:
        """Start serving in a background thread (no-op if already running); returns self."""
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        thread = threading.Thread(target=run, name="FakeLLMServer", daemon=True)
        thread.start()
        ready.wait()
        self._loop, self._thread = loop, thread
        try:
            asyncio.run_coroutine_threadsafe(self._astart(), loop).result(timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    async def _astart(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._handle_openai)
        app.router.add_post("/chat/completions", self._handle_openai)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_get("/models", self._handle_models)
        app.router.add_post("/v1/messages", self._handle_anthropic)
        app.router.add_post("/{version:v1beta|v1alpha|v1}/models/{name}", self._handle_gemini)
        # litellm's gemini provider posts to {api_base}/models/..., with no version segment.
        app.router.add_post("/models/{name}", self._handle_gemini)
        # No access log: the server is used in speed benchmarks; a short shutdown grace so
        # that stop() does not wait on requests still sleeping out their latency.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(runner, sock, backlog=2048)
        await site.start()
        self._runner = runner
        self._port = sock.getsockname()[1]

    def stop(self) -> None:
        """Stop serving and join the background thread (no-op if not running)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._runner is not None:
            # A failed cleanup must not hide the test's own outcome.
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(timeout=10)
        # Handlers still waiting (a hang fault) end here, not as "task destroyed" noise.
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
        self._loop = self._thread = self._runner = None
        self._port = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port (the server must be started)."""
        if self._port is None:
            raise RuntimeError("FakeLLMServer is not started; call start() first")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base(self) -> str:
        """Base URL for the openai SDK / litellm ``api_base`` (``{url}/v1``)."""
        return f"{self.url}/v1"

    @property
    def anthropic_base(self) -> str:
        """``base_url`` for the anthropic SDK (it posts to ``{base}/v1/messages``)."""
        return self.url

    @property
    def gemini_base(self) -> str:
        """``http_options.base_url`` for google-genai."""
        return self.url

    # -- scripting and log -----------------------------------------------------------------

    def script(self, model: str, responder: Responder) -> None:
        """Script what `model` answers: a str/Reply/Fault, a list of them or a callable.

        A list is consumed in order, one item per request, and its last item repeats once it
        is exhausted. A callable gets the `FakeRequest` and returns (or awaits to) one item.
        """
        compiled = _Script(responder)
        with self._lock:
            self._scripts[model] = compiled

    def set_default(self, responder: Responder | None) -> None:
        """Script every model without its own script; None restores the built-in echo."""
        compiled = _Script(_echo if responder is None else responder)
        with self._lock:
            self._default = compiled

    @property
    def requests(self) -> list[FakeRequest]:
        """A snapshot of every request received, in arrival order."""
        with self._lock:
            return list(self._log)

    def requests_for(self, model: str) -> list[FakeRequest]:
        """The requests received for `model`, in arrival order."""
        with self._lock:
            return [r for r in self._log if r.model == model]

    def reset(self) -> None:
        """Clear the request log, every script and the default responder (back to echo)."""
        with self._lock:
            self._log.clear()
            self._scripts.clear()
            self._default = _Script(_echo)

    # -- request handling ------------------------------------------------------------------

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
        if protocol == "openai":
            api_key = _bearer(headers)
            messages = _normalise_openai(body)
        elif protocol == "anthropic":
            api_key = headers.get("x-api-key") or _bearer(headers)
            messages = _normalise_anthropic(body)
        else:
            api_key = headers.get("x-goog-api-key") or request.query.get("key")
            messages = _normalise_gemini(body)
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

    async def _respond(self, fake: FakeRequest) -> Reply | Fault:
        """Run the model's responder, then wait out the latency."""
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
        delay = self.latency_s if outcome.latency_s is None else outcome.latency_s
        if delay > 0:
            await asyncio.sleep(delay)
        return outcome

    @staticmethod
    def _usage(fake: FakeRequest, reply: Reply) -> tuple[int, int]:
        prompt = (
            reply.input_tokens
            if reply.input_tokens is not None
            else sum(_words(m["content"]) for m in fake.messages)
        )
        completion = reply.output_tokens if reply.output_tokens is not None else _words(reply.text)
        return prompt, completion

    def _error(
        self, protocol: Protocol, status: int, message: str, headers: dict[str, str]
    ) -> web.Response:
        """An error response in `protocol`'s own body format."""
        payload: dict[str, Any]
        if protocol == "openai":
            etype, code = _OPENAI_ERRORS.get(
                status, ("server_error" if status >= 500 else "invalid_request_error", None)
            )
            payload = {"error": {"message": message, "type": etype, "param": None, "code": code}}
        elif protocol == "anthropic":
            etype = _ANTHROPIC_ERRORS.get(
                status, "api_error" if status >= 500 else "invalid_request_error"
            )
            payload = {"type": "error", "error": {"type": etype, "message": message}}
        else:
            gstatus = _GEMINI_ERRORS.get(status, "INTERNAL" if status >= 500 else "UNKNOWN")
            payload = {"error": {"code": status, "message": message, "status": gstatus}}
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
            body = _broken_reply(protocol, fault.shape, fake, self._new_id("broken-"))
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

    # OpenAI ---------------------------------------------------------------------------------

    async def _handle_openai(self, request: web.Request) -> web.StreamResponse:
        fake, error = await self._receive(request, "openai", None)
        if fake is None:
            assert error is not None
            return error
        result = await self._respond(fake)
        if isinstance(result, Fault):
            return await self._fault(request, "openai", result, fake)
        prompt, completion = self._usage(fake, result)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        ident, created = self._new_id("chatcmpl-"), int(time.time())
        if fake.body.get("stream"):
            return await self._openai_stream(
                request, fake, result.text, usage, ident, created, result.finish_reason
            )
        return web.json_response(
            {
                "id": ident,
                "object": "chat.completion",
                "created": created,
                "model": fake.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": result.text, "refusal": None},
                        "logprobs": None,
                        "finish_reason": _FINISH["openai"][result.finish_reason or "stop"],
                    }
                ],
                "usage": usage,
                "system_fingerprint": "fp_fake",
            }
        )

    async def _openai_stream(
        self,
        request: web.Request,
        fake: FakeRequest,
        text: str,
        usage: dict[str, int],
        ident: str,
        created: int,
        finish_reason: str | None = None,
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
        events += [chunk(choice({"content": piece})) for piece in _pieces(text)]
        events.append(chunk(choice({}, _FINISH["openai"][finish_reason or "stop"])))
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

    # Anthropic ------------------------------------------------------------------------------

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
        return web.json_response(
            {
                "id": ident,
                "type": "message",
                "role": "assistant",
                "model": fake.model,
                "content": [{"type": "text", "text": result.text}],
                "stop_reason": _FINISH["anthropic"][result.finish_reason or "stop"],
                "stop_sequence": None,
                "usage": {"input_tokens": prompt, "output_tokens": completion},
            }
        )

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
        stop = _FINISH["anthropic"][finish_reason or "stop"]

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
            for p in _pieces(text)
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

    # Gemini ---------------------------------------------------------------------------------

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
        finish = result.finish_reason or "stop"

        def payload(text: str, final: bool) -> dict[str, Any]:
            candidate: dict[str, Any] = {
                "content": {"role": "model", "parts": [{"text": text}]},
                "index": 0,
            }
            data: dict[str, Any] = {"candidates": [candidate]}
            if final:
                candidate["finishReason"] = _FINISH["gemini"][finish]
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
        pieces = _pieces(result.text) or [""]
        if request.query.get("alt") == "sse":
            events = [
                b"data: " + json.dumps(payload(p, i == len(pieces) - 1)).encode() + b"\r\n\r\n"
                for i, p in enumerate(pieces)
            ]
            return await self._sse(request, events)
        # Without alt=sse the REST API streams one JSON array of responses.
        return web.json_response([payload(p, i == len(pieces) - 1) for i, p in enumerate(pieces)])


def _broken_reply(
    protocol: Protocol, shape: Shape, fake: FakeRequest, ident: str
) -> dict[str, Any]:
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
