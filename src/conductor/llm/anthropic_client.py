"""A :class:`ModelClient` over the native ``anthropic`` SDK (the Messages API).

System text (the worker's ``system_prompt`` and any ``system`` messages) goes in the
``system`` argument; ``max_tokens`` is required by the API and defaults to 4096.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .apikey import resolve_api_key
from .capabilities import ClientCapabilities
from .replies import anthropic_reply, body_of
from .sdk import SdkClient, keyword_names, strip_prefix, with_backstop
from .tools import anthropic_tool_fields
from .types import ModelRequest, RawCompletion

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = ["ANTHROPIC_KWARGS", "DEFAULT_MAX_TOKENS", "AnthropicClient"]

#: The Messages API refuses a request without ``max_tokens``.
DEFAULT_MAX_TOKENS = 4096

#: Parameters the Messages API knows.  Those the installed SDK takes as keyword
#: arguments go that way; every other parameter goes in ``extra_body`` (the user named
#: it for this provider on purpose).
ANTHROPIC_KWARGS = frozenset(
    {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "thinking",
        "metadata",
        "tools",
        "tool_choice",
        "service_tier",
    }
)

_PREFIXES = ("anthropic/",)
# Settings with no Messages API meaning that pools commonly carry for other providers.
_DROPPED = frozenset({"reasoning_effort", "presence_penalty", "frequency_penalty", "seed"})


class AnthropicClient(SdkClient):
    """One attempt at a message through ``anthropic.AsyncAnthropic``."""

    sdk = "anthropic"
    capabilities: ClassVar[ClientCapabilities] = ClientCapabilities(
        key_envs=("ANTHROPIC_API_KEY",), prefill="native", tools=True, batch="anthropic"
    )

    def __init__(self, target: Worker) -> None:
        self.target = target
        self._model = strip_prefix(target.model, _PREFIXES)
        self._client: Any = None
        self._key: str | None = None
        self._accepted: frozenset[str] = ANTHROPIC_KWARGS

    def _sdk(self) -> Any:
        key = resolve_api_key(self.target, self.capabilities.key_envs)
        if self._client is None or key != self._key:
            import anthropic

            self._client = anthropic.AsyncAnthropic(
                api_key=key,
                base_url=self.target.api_base or None,
                max_retries=0,
                timeout=self.target.timeout_s,
            )
            self._key = key
            # SDK releases differ in which sampling settings are keyword arguments
            # (2.x dropped temperature/top_p/top_k); the rest travel in extra_body.
            self._accepted = keyword_names(self._client.messages.create, ANTHROPIC_KWARGS)
        return self._client

    def build_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for ``request``."""
        system: list[str] = [self.target.system_prompt] if self.target.system_prompt else []
        messages: list[Any] = []
        for m in request.messages:
            if m["role"] == "system":
                system.append(m["content"])
            else:
                messages.append(m)
        kwargs: dict[str, Any] = {"model": self._model, "messages": messages}
        if system:
            kwargs["system"] = "\n\n".join(system)
        extra: dict[str, Any] = {}
        accepted = self._accepted
        for name, value in request.params.items():
            if name == "extra_headers":
                # HTTP headers, not part of the body.
                kwargs["extra_headers"] = value
                continue
            if name == "stop":
                name = "stop_sequences"
                value = [value] if isinstance(value, str) else value
            elif name == "thinking_budget":
                # A budget of 0 means thinking off, which is the API's default.
                if not value or "thinking" in request.params:
                    continue
                name = "thinking"
                value = {"type": "enabled", "budget_tokens": int(value)}
            elif name in _DROPPED:
                continue
            if name in accepted:
                kwargs[name] = value
            else:
                extra[name] = value
        kwargs.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        kwargs.update(anthropic_tool_fields(request))
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        """Send ``request`` once; raise a ``ModelCallError`` subclass on failure."""
        client = self._sdk()
        kwargs = self.build_kwargs(request)
        with self.errors(timeout_s):
            resp = await with_backstop(
                client.messages.create(timeout=timeout_s, **kwargs), timeout_s
            )
        target = self.target.id
        return anthropic_reply(body_of(resp, target), target)
