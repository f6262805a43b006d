"""A scriptable fake LLM provider server for tests and offline benchmarks.

`FakeLLMServer` runs an aiohttp server on 127.0.0.1 in a background thread (with its own
event loop) and speaks three real wire protocols, so the real SDKs and litellm can be pointed
at it unchanged:

- OpenAI chat completions: ``POST /v1/chat/completions`` (streaming included) and
  ``GET /v1/models``;
- Anthropic messages: ``POST /v1/messages`` (streaming included);
- Gemini: ``POST /v1beta/models/{model}:generateContent`` (and ``:streamGenerateContent``,
  also under ``/v1/``);
- each provider's batch API, the batches scripted with ``batch_script`` (``fake_batch``):
  OpenAI's Files and Batch APIs, ``POST /v1/files``, ``GET /v1/files/{id}`` (and
  ``/content``, ``DELETE``), ``POST /v1/batches``, ``GET /v1/batches`` (and
  ``/{id}``), ``POST /v1/batches/{id}/cancel`` (``fake_openai_batch``).
  Anthropic's Message Batches at ``POST``/``GET /v1/messages/batches``,
  ``GET /v1/messages/batches/{id}`` (and ``/results``), ``POST .../{id}/cancel``
  (``fake_anthropic_batch``).
  Gemini's batch mode is ``POST /v1/models/{model}:batchGenerateContent`` (inline
  requests) and ``GET /v1/batches[/{id}]``, ``POST /v1/batches/{id}:cancel``,
  ``DELETE /v1/batches/{id}`` (also under ``/v1beta/``; ``fake_gemini_batch``).

What each model answers is scripted per model name with `FakeLLMServer.script`; every request
is logged as a `FakeRequest` with its messages normalised to ``[{role, content}]``.
Errors use each provider's real error body and HTTP status, so the SDKs raise their proper
exception classes.

Example::

    with FakeLLMServer() as server:
        server.script("gpt-x", ["first answer", Fault(429, headers={"Retry-After": "1"})])
        client = openai.OpenAI(base_url=server.openai_base, api_key="k")

The server is put together from parts: the scripting vocabulary (``fake_script``), each
provider's wire format (``fake_wire``), the shared request path (``fake_base``) and one
module of routes per protocol (``fake_openai``, ``fake_anthropic``, ``fake_gemini``) and one
per batch API (``fake_openai_batch``, ``fake_anthropic_batch``, ``fake_gemini_batch``) over
their shared engine (``fake_batch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading

from aiohttp import web

from .fake_anthropic import AnthropicRoutes
from .fake_anthropic_batch import AnthropicBatchRoutes
from .fake_batch import BatchBase
from .fake_gemini import GeminiRoutes
from .fake_gemini_batch import GeminiBatchRoutes
from .fake_openai import OpenAIRoutes
from .fake_openai_batch import OpenAIBatchRoutes
from .fake_script import (
    FakeRequest,
    Responder,
    Script,
    echo,
)

__all__ = ["FakeLLMServer"]


class FakeLLMServer(
    OpenAIRoutes,
    AnthropicRoutes,
    GeminiRoutes,
    OpenAIBatchRoutes,
    AnthropicBatchRoutes,
    GeminiBatchRoutes,
    BatchBase,
):
    """A fake OpenAI / Anthropic / Gemini server on 127.0.0.1, scripted per model name.

    Start it with `start()` or as a context manager. If `expected_api_key` is set, any request
    with a different key gets a 401 in the provider's format. `latency_s` (settable at any time)
    delays every answer that does not set its own; delays use ``asyncio.sleep`` so hundreds of
    requests can be in flight at once. Callable responders run on the server's event loop:
    they must not block (they may be ``async``).

    Batches (``batch_script``, ``fake_batch``) arrive through each protocol's batch
    routes: OpenAI's Files and Batch APIs (``fake_openai_batch``), Anthropic's Message
    Batches under ``/v1/messages/batches`` (``fake_anthropic_batch``) and Gemini's batch
    mode (``fake_gemini_batch``).
    """

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
        # Each protocol's batch API (files, batches, their results), first: the live
        # Gemini route below would take ``models/{model}:batchGenerateContent`` too.
        self._batch_routes(app)
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
        compiled = Script(responder)
        with self._lock:
            self._scripts[model] = compiled

    def set_default(self, responder: Responder | None) -> None:
        """Script every model without its own script; None restores the built-in echo."""
        compiled = Script(echo if responder is None else responder)
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
            self._default = Script(echo)


async def _cancel_pending() -> None:
    """Cancel every other task of the running loop and wait for them to end."""
    current = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
