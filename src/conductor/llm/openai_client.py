"""A :class:`ModelClient` over the native ``openai`` SDK (OpenAI and compatible servers).

Used when a worker sets ``client: openai``: OpenAI itself, or any OpenAI-compatible
server (vLLM, Ollama, SGLang) named by ``api_base``.  Parameters the Chat Completions
API knows go as keyword arguments; everything else (``top_k``,
``chat_template_kwargs``, ...) goes in ``extra_body`` for the server to interpret.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .apikey import resolve_api_key
from .capabilities import ClientCapabilities
from .prefill_rules import continue_fields
from .replies import body_of, openai_reply
from .sdk import SdkClient, keyword_names, strip_prefix, with_backstop
from .structured import ServerGrammar
from .tools import openai_tool_fields
from .types import ModelRequest, RawCompletion

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = ["OPENAI_KWARGS", "OpenAIClient"]

#: Standard Chat Completions parameters, sent as keyword arguments of
#: ``chat.completions.create`` where the installed SDK takes them; every other
#: parameter goes in ``extra_body`` for the server to interpret.
OPENAI_KWARGS = frozenset(
    {
        "temperature",
        "max_tokens",
        "max_completion_tokens",
        "top_p",
        "stop",
        "seed",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "reasoning_effort",
        "verbosity",
        "service_tier",
        "user",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    }
)

_PREFIXES = ("openai/", "hosted_vllm/")


class OpenAIClient(SdkClient):
    """One attempt at a chat completion through ``openai.AsyncOpenAI``."""

    sdk = "openai"
    capabilities: ClassVar[ClientCapabilities] = ClientCapabilities(
        key_envs=("OPENAI_API_KEY",),
        prefill="api_base",
        no_prefill="OpenAI's own API cannot continue an assistant message (an api_base server can)",
        grammar="server",
        tools=True,
        json_reply=True,
        batch="openai",
    )

    def __init__(self, target: Worker) -> None:
        self.target = target
        self._model = strip_prefix(target.model, _PREFIXES)
        self._system: list[dict[str, str]] = (
            [{"role": "system", "content": target.system_prompt}] if target.system_prompt else []
        )
        # OpenAI's own API wants max_completion_tokens (reasoning models reject
        # max_tokens); compatible servers such as vLLM expect max_tokens.
        self._rename_max_tokens = target.api_base is None
        self._client: Any = None
        self._key: str | None = None
        self._accepted: frozenset[str] = OPENAI_KWARGS
        self._grammar = ServerGrammar(target, self.capabilities.grammar)

    @property
    def grammar(self) -> ServerGrammar:
        """How this client sends a request's grammar to its server: the batch API
        (:mod:`conductor.batches.openai`) builds its lines with :meth:`build_kwargs`
        and so settles the field with this first, as :meth:`send` does."""
        return self._grammar

    def _sdk(self) -> Any:
        key = resolve_api_key(self.target, self.capabilities.key_envs)
        if self._client is None or key != self._key:
            import openai

            self._client = openai.AsyncOpenAI(
                api_key=key,
                base_url=self.target.api_base or None,
                max_retries=0,
                timeout=self.target.timeout_s,
            )
            self._key = key
            self._accepted = OPENAI_KWARGS & keyword_names(
                self._client.chat.completions.create, OPENAI_KWARGS
            )
        return self._client

    def build_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for ``request``."""
        kwargs: dict[str, Any] = {
            "model": self._model,
            "messages": self._system + list(request.messages),
        }
        # A final assistant message is a prefill for a vLLM-style server to continue.
        extra: dict[str, Any] = continue_fields(
            self.capabilities.prefill, self.target, request.messages
        )
        accepted = self._accepted
        for name, value in request.params.items():
            if name == "extra_headers":
                # HTTP headers, not part of the body.
                kwargs["extra_headers"] = value
                continue
            if name == "max_tokens" and self._rename_max_tokens:
                name = "max_completion_tokens"
            if name in accepted:
                kwargs[name] = value
            else:
                extra[name] = value
        if request.response_format is not None:
            kwargs["response_format"] = request.response_format
        kwargs.update(openai_tool_fields(request))
        extra.update(self._grammar.fields(request))
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        """Send ``request`` once; raise a ``ModelCallError`` subclass on failure."""
        client = self._sdk()
        await self._grammar.resolve(request, api_key=self._key)
        kwargs = self.build_kwargs(request)
        with self.errors(timeout_s):
            # The raw response, for its headers: a server may report the call's cost there.
            resp = await with_backstop(
                client.chat.completions.with_raw_response.create(timeout=timeout_s, **kwargs),
                timeout_s,
            )
            parsed = resp.parse()
        target = self.target.id
        raw = openai_reply(body_of(parsed, target), target, resp.headers)
        await self._grammar.check(raw, request, api_key=self._key)
        return raw
