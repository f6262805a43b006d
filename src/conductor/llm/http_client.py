"""A lean OpenAI-compatible client over aiohttp (``client: http``).

For OpenAI-compatible servers under heavy concurrency (vLLM, SGLang, Ollama, a trained
Conductor behind vLLM): it sends the Chat Completions request as plain JSON and reads
the JSON reply, with none of an SDK's per-call object building.  Measured here it costs
about a third of the CPU per call of the ``openai`` SDK, which is what lets a benchmark
keep 64 calls in flight on two cores.  Parameters pass through as they are (servers
ignore or reject what they do not know); ``request.grammar`` goes to an ``api_base``
server in the field that server reads (:mod:`conductor.llm.structured`) and
``response_format`` as is.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, ClassVar

from .apikey import resolve_api_key
from .capabilities import ClientCapabilities
from .failures import (
    connection_error,
    error_for_status,
    message_from_body,
    network_error,
    scrub,
    timeout_error,
)
from .prefill_rules import continue_fields
from .replies import bad_response, openai_reply
from .sdk import strip_prefix, with_backstop
from .structured import ServerGrammar
from .tools import openai_tool_fields
from .types import Message, ModelRequest, RawCompletion

if TYPE_CHECKING:
    import aiohttp

    from ..targets import Worker

__all__ = ["HttpClient"]

_DEFAULT_BASE = "https://api.openai.com/v1"
# How much longer than its connect limit a whole attempt may take.
_CONNECT_GRACE_S = 0.25


class HttpClient:
    """One attempt at ``POST {api_base}/chat/completions`` over a shared aiohttp session."""

    # The OpenAI protocol: OpenAI's key and quota when no api_base names a server.
    capabilities: ClassVar[ClientCapabilities] = ClientCapabilities(
        key_envs=("OPENAI_API_KEY",),
        quota="openai",
        prefill="api_base",
        no_prefill="OpenAI's own API cannot continue an assistant message (an api_base server can)",
        grammar="server",
        tools=True,
        json_reply=True,
    )

    def __init__(self, target: Worker) -> None:
        self.target = target
        self._model = strip_prefix(target.model, ("openai/", "hosted_vllm/"))
        self._url = (target.api_base or _DEFAULT_BASE).rstrip("/") + "/chat/completions"
        self._session: aiohttp.ClientSession | None = None
        self._key: str | None = None
        self._grammar = ServerGrammar(target, self.capabilities.grammar)

    def _open(self) -> aiohttp.ClientSession:
        import aiohttp

        self._key = resolve_api_key(self.target, self.capabilities.key_envs)
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers={
                "Authorization": f"Bearer {self._key}",
                "Content-Type": "application/json",
            },
            json_serialize=json.dumps,
        )
        return self._session

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body of the request (``params.extra_headers`` go as headers instead)."""
        messages: list[Message] = []
        if self.target.system_prompt:
            messages.append({"role": "system", "content": self.target.system_prompt})
        messages.extend(request.messages)
        body: dict[str, Any] = {
            "model": self._model,
            "messages": messages,
            # A final assistant message is a prefill for a vLLM-style server to continue.
            **continue_fields(self.capabilities.prefill, self.target, request.messages),
            **request.params,
        }
        body.pop("extra_headers", None)
        if request.response_format is not None:
            body["response_format"] = request.response_format
        body.update(openai_tool_fields(request))
        body.update(self._grammar.fields(request))
        return body

    async def prepare(self) -> None:
        """Nothing to import: aiohttp is loaded with this module."""

    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        """Send ``request`` once; raise a ``ModelCallError`` subclass on failure."""
        import aiohttp

        session = self._session or self._open()
        target = self.target.id
        extra_headers = request.params.get("extra_headers")
        await self._grammar.resolve(request, api_key=self._key)
        try:
            async with session.post(
                self._url,
                data=json.dumps(self.body(request)),
                headers=_header_dict(extra_headers) if extra_headers else None,
                # A connect that hangs ends a moment before the whole attempt does,
                # so that it is reported as one (ConnectionTimeoutError), with the host.
                timeout=aiohttp.ClientTimeout(
                    total=timeout_s + _CONNECT_GRACE_S, sock_connect=timeout_s
                ),
            ) as resp:
                payload = await with_backstop(resp.read(), timeout_s)
                status = resp.status
                headers = resp.headers
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            failed = network_error(
                exc, target=target, timeout_s=timeout_s, url=self._url, key=self._key
            )
            if failed is not None:
                raise failed from None
            if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
                raise timeout_error(target, timeout_s) from None
            raise connection_error(target, scrub(str(exc), self._key), self._url) from None
        try:
            data = json.loads(payload)
        except ValueError:
            data = None
        if status >= 400:
            reason = message_from_body(data if data is not None else payload) or f"HTTP {status}"
            raise error_for_status(
                status, scrub(reason, self._key)[:500], target=target, headers=headers
            )
        if data is None:
            # Scrubbed, then clipped: a secret cut in two would not be found.
            text = scrub(payload[:4096].decode("utf-8", "replace"), self._key)[:200]
            raise bad_response(target, f"the reply is not JSON: {text!r}")
        raw = openai_reply(data, target, headers)
        await self._grammar.check(raw, request, api_key=self._key)
        return raw

    async def aclose(self) -> None:
        """Close the session and its connections."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


def _header_dict(value: Any) -> dict[str, str]:
    """``params.extra_headers`` as HTTP headers (names and values as strings)."""
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}
