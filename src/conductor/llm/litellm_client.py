"""A :class:`ModelClient` over ``litellm.acompletion`` (the default client).

Every request parameter goes to litellm as a keyword argument with
``drop_params=True``, so that a parameter one provider lacks is dropped instead of
failing the call.  litellm's own retries are off: retries belong to ModelCaller.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import TYPE_CHECKING, Any, ClassVar

from .apikey import PLACEHOLDER_KEY, PROVIDER_KEY_ENVS, resolve_api_key
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
from .replies import bad_response, body_of, openai_reply
from .sdk import import_litellm, our_errors, with_backstop
from .structured import ServerGrammar
from .tools import openai_tool_fields
from .types import ModelRequest, RawCompletion

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = ["LiteLLMClient", "provider_message_of"]

# The variables litellm reads for each provider prefix; used only to decide whether a
# placeholder key is needed for a local server.
_PROVIDER_ENVS: dict[str, tuple[str, ...]] = {
    p: PROVIDER_KEY_ENVS[p] for p in ("openai", "anthropic", "gemini", "hosted_vllm")
}
_PREFIX_RE = re.compile(r"^(?:litellm\.\w+:\s*)?(?:\w+Error:\s*)?(?:\w+Exception\s*-\s*)?")


class LiteLLMClient:
    """One attempt at a chat completion through ``litellm.acompletion``."""

    # The model's provider prefix picks the provider: its key (litellm finds it),
    # its quota, whether it continues a prefill and sends a grammar to its server.
    capabilities: ClassVar[ClientCapabilities] = ClientCapabilities(
        routes_by_model=True,
        prefill="model_prefix",
        grammar="server_model_prefix",
        tools=True,
        json_reply=True,
        batch="model_prefix",
    )

    def __init__(self, target: Worker) -> None:
        self.target = target
        self._system: list[dict[str, str]] = (
            [{"role": "system", "content": target.system_prompt}] if target.system_prompt else []
        )
        self._key: str | None = None
        self._grammar = ServerGrammar(target, self.capabilities.grammar)

    def _api_key(self) -> str | None:
        """The key to pass, or None to let litellm find its own."""
        target = self.target
        if target.api_key_env:
            return resolve_api_key(target, ())
        if target.api_base:
            provider = target.model.split("/", 1)[0] if "/" in target.model else "openai"
            envs = _PROVIDER_ENVS.get(provider, ())
            if not any(os.environ.get(name) for name in envs):
                return PLACEHOLDER_KEY
        return None

    def build_kwargs(self, request: ModelRequest, timeout_s: float) -> dict[str, Any]:
        """The keyword arguments of ``litellm.acompletion`` for ``request``."""
        kwargs: dict[str, Any] = dict(request.params)
        kwargs["model"] = self.target.model
        kwargs["messages"] = self._system + list(request.messages)
        kwargs["timeout"] = timeout_s
        kwargs["num_retries"] = 0
        kwargs["max_retries"] = 0
        kwargs["drop_params"] = True
        if self.target.api_base:
            kwargs["api_base"] = self.target.api_base
        if request.response_format is not None:
            kwargs["response_format"] = request.response_format
        kwargs.update(openai_tool_fields(request))
        grammar = self._grammar.fields(request)
        if grammar:
            kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), **grammar}
        # A final assistant message is a prefill for a vLLM-style server to continue
        # (Anthropic continues one by itself).
        continuing = continue_fields(self.capabilities.prefill, self.target, request.messages)
        if continuing:
            kwargs["extra_body"] = {**continuing, **(kwargs.get("extra_body") or {})}
        return kwargs

    async def prepare(self) -> None:
        """Import litellm off the event loop (seconds, more on a busy machine)."""
        await asyncio.to_thread(import_litellm)

    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        """Send ``request`` once; raise a ``ModelCallError`` subclass on failure."""
        litellm = import_litellm()
        key = self._api_key()
        self._key = key
        await self._grammar.resolve(request, api_key=key)
        kwargs = self.build_kwargs(request, timeout_s)
        if key is not None:
            kwargs["api_key"] = key
        with our_errors(lambda exc: self._classify(exc, timeout_s)):
            resp = await with_backstop(litellm.acompletion(**kwargs), timeout_s)
        target = self.target.id
        raw = openai_reply(body_of(resp, target), target, _provider_headers(resp))
        await self._grammar.check(raw, request, api_key=key)
        return raw

    def _classify(self, exc: Exception, timeout_s: float) -> BaseException:
        litellm = import_litellm()
        target = self.target.id
        # A connection never made is named for what it is (litellm calls it a server
        # error with a made-up HTTP 500), whichever library below litellm failed.
        failed = network_error(
            exc, target=target, timeout_s=timeout_s, url=self.target.api_base, key=self._key
        )
        if failed is not None:
            return failed
        if isinstance(exc, (litellm.Timeout, asyncio.TimeoutError)):
            return timeout_error(target, timeout_s)
        message = scrub(provider_message_of(exc), self._key)
        # litellm wraps what went wrong below it (a reset connection, an error status,
        # a body its parsers could not read) in its own classes with made-up statuses
        # (500, or 422 for Gemini); the chained causes say what really happened.
        causes = _causes(exc)
        url = self.target.api_base
        if any(_is_connection_failure(c) for c in causes):
            return connection_error(target, message, url)
        http = next((c for c in causes if _http_status(c) is not None), None)
        if http is None and _CONNECTION_TEXT_RE.match(message):
            # The openai SDK's words for a failed connection, which litellm re-raises
            # as an HTTP 500, sometimes with the cause dropped: not a server's answer.
            return connection_error(target, message, url)
        if http is None and (
            any(isinstance(c, _UNREADABLE) for c in causes) or _UNREADABLE_RE.search(message)
        ):
            return bad_response(target, f"the reply could not be read: {message}")
        status = getattr(exc, "status_code", None)
        if http is not None and (isinstance(exc, litellm.APIConnectionError) or status is None):
            status = _http_status(http)
        elif isinstance(exc, litellm.APIConnectionError):
            return connection_error(target, message, url)
        if isinstance(status, int):
            headers = getattr(exc, "litellm_response_headers", None)
            for source in (exc, http):
                if headers is None:
                    headers = getattr(getattr(source, "response", None), "headers", None)
            return error_for_status(status, message, target=target, headers=headers)
        return exc

    async def aclose(self) -> None:
        """Nothing to release: litellm keeps its HTTP clients in a shared cache."""


# What litellm's own parsers raise on a body they cannot read: JSONDecodeError (a
# ValueError), or KeyError / IndexError / TypeError / AttributeError on a wrong shape.
_UNREADABLE = (ValueError, LookupError, TypeError, AttributeError)
# litellm's words for a reply it could not use, where it raises without a cause.
_UNREADABLE_RE = re.compile(
    r"Empty or invalid response|Invalid response object|no 'choices'|"
    r"Unable to get json response|Error converting to valid response"
)
_CONNECTION_TEXT_RE = re.compile(r"^Connection error\.?$")
# Transport failures below litellm, by class name (httpx, aiohttp, the openai SDK).
_CONNECTION_NAMES = frozenset(
    {
        "ReadError",
        "WriteError",
        "ConnectError",
        "RemoteProtocolError",
        "ClientOSError",
        "ClientConnectorError",
        "ServerDisconnectedError",
        "ClientPayloadError",
        "APIConnectionError",
    }
)


def _provider_headers(resp: Any) -> dict[str, str]:
    """The provider's response headers, which litellm keeps in the response's hidden
    params under ``llm_provider-`` names."""
    hidden = getattr(resp, "_hidden_params", None)
    headers = hidden.get("additional_headers") if isinstance(hidden, dict) else None
    if not isinstance(headers, dict):
        return {}
    prefix = "llm_provider-"
    return {
        k.lower().removeprefix(prefix): str(v)
        for k, v in headers.items()
        if isinstance(k, str) and k.lower().startswith(prefix)
    }


def _causes(exc: BaseException) -> list[BaseException]:
    """The exceptions chained below ``exc`` (causes and contexts), nearest first."""
    out: list[BaseException] = []
    seen = {id(exc)}
    current = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen and len(out) < 16:
        seen.add(id(current))
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def _is_connection_failure(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError) or type(exc).__name__ in _CONNECTION_NAMES


def _http_status(exc: BaseException) -> int | None:
    """The error status of the HTTP response behind ``exc``, if it is httpx's
    ``HTTPStatusError`` (litellm's own errors carry made-up statuses instead)."""
    if "HTTPStatusError" not in type(exc).__name__:
        return None
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) and status >= 400 else None


def provider_message_of(exc: BaseException) -> str:
    """The provider's own words from a litellm exception, without litellm's prefixes."""
    body = getattr(exc, "body", None)
    msg = message_from_body(body) if body else None
    if msg:
        return msg
    text = str(getattr(exc, "message", None) or exc)
    # Some litellm errors carry the traceback of their cause in their message.
    text = text.split("Traceback (most recent call last)", 1)[0]
    text = _PREFIX_RE.sub("", text, count=1).strip()
    # litellm often appends the provider's JSON body to its message.
    start = text.find("{")
    if start != -1:
        inner = message_from_body(text[start:])
        if inner and inner != text[start:].strip():
            return inner
    return text or type(exc).__name__
