"""An OpenAI-compatible server on 127.0.0.1 that reads a grammar the way one real server
version does, for the structured-output tests (tests/test_structured_outputs.py).

What each emulation does was read from the servers' own source (the wheels and sdists
``pip download`` fetches):

- vLLM 0.10.1 (``vllm/entrypoints/openai/protocol.py``): ``ChatCompletionRequest`` has
  ``guided_grammar``; unknown fields (``structured_outputs`` among them) are kept by
  ``extra="allow"`` and logged as "present in the request but ignored".
- vLLM 0.11.0: ``structured_outputs`` (a ``StructuredOutputsParams``) and the deprecated
  ``guided_grammar``, forwarded into it only when ``structured_outputs`` is unset.
- vLLM 0.12.0: ``structured_outputs`` only; ``guided_grammar`` is an unknown field,
  logged and ignored.  ``structured_outputs`` must be an object (else HTTP 400), with
  at most one constraint.  ``GET /version`` answers ``{"version": "0.12.0"}`` (every
  vLLM here); ``/server_info`` exists only in its dev mode (off).
- SGLang 0.5.23 (``sglang/srt/entrypoints/openai/protocol.py``): ``ebnf``; a pydantic
  model without ``extra=``, so unknown fields are dropped without a word.
  ``GET /server_info`` (and the deprecated ``/get_server_info``) answers the server's
  arguments with ``version``; there is no ``/version``.
- llama-server (llama.cpp ``tools/server``, vendored by llama-cpp-python 0.3.36):
  ``grammar``; ``json_schema`` with ``grammar`` is an error; unknown fields are never
  read.  ``GET /props`` answers ``default_generation_settings``, ``build_info`` and more.
- ``other``: a compatible server none of the probes knows (Ollama, a proxy): it reads
  no grammar field.

A server that honours the grammar answers ``constrained`` (a reply the test wrote to
match the grammar); one that ignores it answers ``free``.  Every request body is kept
in ``bodies``, every ignored field in ``ignored``, every GET path in ``gets``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

from aiohttp import web

#: The emulations, by name.
EMULATIONS = ("vllm-0.10.1", "vllm-0.11.0", "vllm-0.12.0", "sglang-0.5.23", "llama.cpp", "other")

# The request fields each emulation knows (beyond these, what it does with others).
_COMMON = {"model", "messages", "max_tokens", "temperature", "top_p", "stop", "seed"}


class GrammarServer:
    """One emulated server (``emulation``, one of :data:`EMULATIONS`)."""

    def __init__(
        self,
        emulation: str,
        *,
        constrained: str = "",
        free: str = "Sure! Here is my plan: ask everyone.",
        finish_reason: str = "stop",
        reasoning: str | None = None,
    ) -> None:
        assert emulation in EMULATIONS, emulation
        self.emulation = emulation
        self.constrained = constrained
        self.free = free
        self.finish_reason = finish_reason
        self.reasoning = reasoning
        self.bodies: list[dict[str, Any]] = []
        self.ignored: list[set[str]] = []
        self.gets: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- what the emulated server reads ---------------------------------------------

    def _grammar_of(self, body: dict[str, Any]) -> tuple[str | None, set[str], str | None]:
        """(the grammar the server decodes with, the fields it ignores, an error)."""
        name = self.emulation
        so = body.get("structured_outputs")
        if name.startswith("vllm"):
            known = _COMMON | {"stream", "n", "top_k"}
            if name != "vllm-0.12.0":
                known |= {"guided_grammar", "guided_json", "guided_regex"}
            if name != "vllm-0.10.1":
                known |= {"structured_outputs"}
            ignored = set(body) - known
            if "structured_outputs" in known and so is not None:
                if not isinstance(so, dict):
                    return None, ignored, "structured_outputs: Input should be an object"
                kinds = [k for k in ("json", "regex", "choice", "grammar") if so.get(k)]
                if len(kinds) > 1:
                    return None, ignored, "You can only use one kind of structured outputs"
                grammar = so.get("grammar")
                return (grammar if isinstance(grammar, str) else None), ignored, None
            if "guided_grammar" in known:
                return body.get("guided_grammar"), ignored, None
            return None, ignored, None
        if name.startswith("sglang"):
            return body.get("ebnf"), set(), None  # unknown fields dropped silently
        if name == "llama.cpp":
            if body.get("json_schema") is not None and body.get("grammar"):
                return None, set(), "Cannot use both json_schema and grammar"
            return body.get("grammar"), set(), None
        return None, set(), None

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        grammar, ignored, error = self._grammar_of(body)
        self.ignored.append(ignored)
        if error is not None:
            return web.json_response(
                {"error": {"message": error, "type": "BadRequestError", "code": 400}},
                status=400,
            )
        text = self.constrained if grammar else self.free
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        return web.json_response(
            {
                "id": f"chatcmpl-{len(self.bodies)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "m"),
                "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30},
            }
        )

    async def _get(self, request: web.Request) -> web.Response:
        path = request.path
        self.gets.append(path)
        name = self.emulation
        if name.startswith("vllm") and path == "/version":
            return web.json_response({"version": name.split("-", 1)[1]})
        if name.startswith("sglang") and path in ("/server_info", "/get_server_info"):
            info = {
                "model_path": "Qwen/Qwen3-8B",
                "tp_size": 1,
                "grammar_backend": "xgrammar",
                "version": name.split("-", 1)[1],
            }
            return web.json_response(info)
        if name == "llama.cpp" and path == "/props":
            props = {
                "default_generation_settings": {"n_ctx": 4096},
                "total_slots": 1,
                "model_path": "model.gguf",
                "build_info": "b7100-0123abc",
            }
            return web.json_response(props)
        return web.json_response({"detail": "Not Found"}, status=404)

    # -- lifecycle ------------------------------------------------------------------

    def __enter__(self) -> GrammarServer:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="GrammarServer", daemon=True)
        self._thread.start()
        ready.wait()
        self._loop = loop
        asyncio.run_coroutine_threadsafe(self._start(), loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/{path:.*}", self._get)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(runner, sock)
        await site.start()
        self._runner = runner
        self.port = sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
        self._loop = self._thread = None


def sent_grammar_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The grammar fields of a request body, whichever were sent."""
    names = ("structured_outputs", "guided_grammar", "ebnf", "grammar")
    return {k: body[k] for k in names if k in body}
