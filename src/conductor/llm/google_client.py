"""A :class:`ModelClient` over the native ``google-genai`` SDK (the Gemini API).

System text goes in ``system_instruction``; ``assistant`` turns become ``model``
turns; ``max_tokens`` becomes ``max_output_tokens`` and ``thinking_budget`` a
``ThinkingConfig``.  Parameters Gemini has no field for are left out, since its
config type refuses unknown fields.
"""

from __future__ import annotations

import asyncio
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
    unreadable_body_error,
)
from .replies import body_of, gemini_reply
from .sdk import SdkClient, strip_prefix, with_backstop
from .types import ModelRequest, RawCompletion

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = ["GEMINI_CONFIG_FIELDS", "GoogleClient", "classify_google_error"]

#: Request parameter -> ``GenerateContentConfig`` field.
GEMINI_CONFIG_FIELDS: dict[str, str] = {
    "temperature": "temperature",
    "max_tokens": "max_output_tokens",
    "max_output_tokens": "max_output_tokens",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "stop": "stop_sequences",
    "stop_sequences": "stop_sequences",
    "candidate_count": "candidate_count",
    "response_mime_type": "response_mime_type",
}

_PREFIXES = ("gemini/", "google/", "vertex_ai/")
# Where the SDK sends requests when the worker names no api_base.
_DEFAULT_BASE = "https://generativelanguage.googleapis.com"


class GoogleClient(SdkClient):
    """One attempt at ``generate_content`` through ``google.genai.Client(...).aio``."""

    sdk = "google.genai"
    # response_format asks for a JSON reply (response_mime_type), nothing finer.
    capabilities: ClassVar[ClientCapabilities] = ClientCapabilities(
        key_envs=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
        no_prefill="the Gemini API cannot continue an assistant message",
        price_prefix="gemini/",
        json_reply=True,
        batch="google",
    )

    def __init__(self, target: Worker, *, api_version: str | None = None) -> None:
        self.target = target
        self._model = strip_prefix(target.model, _PREFIXES)
        # The API version the SDK client asks for (None: the SDK's default).
        self._api_version = api_version
        self._client: Any = None
        self._key: str | None = None
        self._client_timeout_ms = max(1, int(target.timeout_s * 1000))

    @property
    def model(self) -> str:
        """The model's name as the Gemini API knows it (no litellm prefix)."""
        return self._model

    def sdk_client(self) -> Any:
        """The ``google.genai.Client`` for the worker's key as it is now (made again
        when the key changes); the batch API (:mod:`conductor.batches.google`) sends
        through the same one."""
        key = resolve_api_key(self.target, self.capabilities.key_envs)
        if self._client is None or key != self._key:
            from google import genai
            from google.genai import types

            http_options = types.HttpOptions(
                base_url=self.target.api_base or None,
                api_version=self._api_version,
                timeout=self._client_timeout_ms,
                # One attempt: retries belong to ModelCaller.
                retry_options=types.HttpRetryOptions(attempts=1),
            )
            self._client = genai.Client(api_key=key, http_options=http_options)
            self._key = key
        return self._client

    def build_request(self, request: ModelRequest, timeout_s: float) -> dict[str, Any]:
        """The keyword arguments of ``models.generate_content`` for ``request`` (the
        batch API builds its lines with it too, with no SDK client made)."""
        from google.genai import types

        system: list[str] = [self.target.system_prompt] if self.target.system_prompt else []
        contents: list[dict[str, Any]] = []
        for m in request.messages:
            role = m["role"]
            if role == "system":
                system.append(m["content"])
                continue
            contents.append(
                {
                    "role": "model" if role == "assistant" else "user",
                    "parts": [{"text": m["content"]}],
                }
            )
        config: dict[str, Any] = {}
        if system:
            config["system_instruction"] = "\n\n".join(system)
        for name, value in request.params.items():
            field = GEMINI_CONFIG_FIELDS.get(name)
            if field is not None:
                if field == "stop_sequences" and isinstance(value, str):
                    value = [value]
                config[field] = value
            elif name == "thinking_budget":
                config["thinking_config"] = types.ThinkingConfig(thinking_budget=int(value))
            elif name == "thinking_config":
                config["thinking_config"] = value
        if request.response_format is not None:
            config.setdefault("response_mime_type", "application/json")
        timeout_ms = max(1, int(timeout_s * 1000))
        headers = request.params.get("extra_headers")
        if timeout_ms != self._client_timeout_ms or headers:
            config["http_options"] = types.HttpOptions(
                timeout=timeout_ms,
                headers={str(k): str(v) for k, v in headers.items()}
                if isinstance(headers, dict)
                else None,
            )
        return {
            "model": self._model,
            "contents": contents,
            "config": types.GenerateContentConfig(**config) if config else None,
        }

    async def send(self, request: ModelRequest, *, timeout_s: float) -> RawCompletion:
        """Send ``request`` once; raise a ``ModelCallError`` subclass on failure."""
        client = self.sdk_client()
        kwargs = self.build_request(request, timeout_s)
        with self.errors(timeout_s):
            resp = await with_backstop(client.aio.models.generate_content(**kwargs), timeout_s)
        target = self.target.id
        body = body_of(resp, target, mode="json", exclude_none=True, exclude={"sdk_http_response"})
        return gemini_reply(body, target, self._model)

    def classify(self, exc: Exception, timeout_s: float) -> BaseException:
        return classify_google_error(
            exc, target=self.target.id, timeout_s=timeout_s, url=self.target.api_base, key=self._key
        )

    async def close(self, client: Any) -> None:
        await client.aio.aclose()


def classify_google_error(
    exc: Exception, *, target: str, timeout_s: float, url: str | None, key: str | None
) -> BaseException:
    """Our error for an exception of a google-genai call (a live call's, or a batch
    API request's): a connection that could not be made, a time-out, an HTTP error
    (``APIError``, its status and message), a connection lost, or a body the SDK could
    not read; anything else is returned unchanged, to be re-raised as the bug it is.
    ``url`` is the worker's ``api_base`` (``None``: Google's own), ``key`` is masked
    in every message."""
    from google.genai import errors as gerrors

    url = url or _DEFAULT_BASE

    failed = network_error(exc, target=target, timeout_s=timeout_s, url=url, key=key)
    if failed is not None:
        return failed
    if isinstance(exc, asyncio.TimeoutError) or type(exc).__name__ in (
        "ReadTimeout",
        "WriteTimeout",
        "ConnectTimeout",
        "PoolTimeout",
        "TimeoutException",
        "ServerTimeoutError",
    ):
        return timeout_error(target, timeout_s)
    if isinstance(exc, gerrors.APIError):
        msg = exc.message or message_from_body(exc.details) or str(exc)
        response = exc.response
        headers = getattr(response, "headers", None)
        if headers is None:
            headers = getattr(getattr(response, "_response", None), "headers", None)
        return error_for_status(exc.code, scrub(str(msg), key), target=target, headers=headers)
    if isinstance(exc, OSError) or type(exc).__name__ in (
        "ConnectError",
        "ClientConnectionError",
        "ClientConnectorError",
        "ServerDisconnectedError",
        "ClientOSError",
        "RemoteProtocolError",
    ):
        return connection_error(target, scrub(str(exc), key), url)
    return unreadable_body_error(exc, target=target, key=key)
