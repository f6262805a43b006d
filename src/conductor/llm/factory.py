"""Pick the client class for a worker, and the key-handling rules every client shares.

No SDK is imported here: each client imports its own SDK lazily, on first send.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import AuthenticationError, UsageError
from .retry import make_error

if TYPE_CHECKING:
    from ..pool import Worker
    from .base import ModelClient

__all__ = ["PLACEHOLDER_KEY", "make_client", "resolve_api_key", "strip_prefix"]

#: Sent to local OpenAI-compatible servers (vLLM, Ollama) that want a key but check none.
PLACEHOLDER_KEY = "not-needed"


def make_client(target: Worker) -> ModelClient:
    """A fresh :class:`ModelClient` for ``target``, chosen by ``target.client``."""
    kind = target.client or "litellm"
    if kind == "litellm":
        from .litellm_client import LiteLLMClient

        return LiteLLMClient(target)
    if kind == "openai":
        from .openai_client import OpenAIClient

        return OpenAIClient(target)
    if kind == "anthropic":
        from .anthropic_client import AnthropicClient

        return AnthropicClient(target)
    if kind == "google":
        from .google_client import GoogleClient

        return GoogleClient(target)
    if kind == "local":
        from .local_client import LocalClient

        client: ModelClient = LocalClient(target)
        return client
    if kind == "http":
        from .http_client import HttpClient

        return HttpClient(target)
    if kind == "checkpoint":
        # Only the Conductor uses this kind: a trained checkpoint loaded in-process.
        from .checkpoint_client import CheckpointClient

        return CheckpointClient(target)
    raise UsageError(
        f"worker {target.id!r}: unknown client {kind!r} "
        "(expected litellm, openai, http, anthropic, google or local)"
    )


def resolve_api_key(target: Worker, default_envs: tuple[str, ...]) -> str:
    """The API key for ``target``, read from the environment now.

    ``target.api_key_env`` names the variable; without it the provider's usual
    variables are tried in order.  With no key but an ``api_base`` (a local server)
    a placeholder is returned; with neither, :class:`AuthenticationError` says which
    variable to set.
    """
    names = (target.api_key_env,) if target.api_key_env else default_envs
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    if target.api_base:
        return PLACEHOLDER_KEY
    wanted = " or ".join(names)
    raise make_error(
        AuthenticationError,
        target=target.id,
        provider_message=f"no API key: set the environment variable {wanted}",
    )


def strip_prefix(model: str, prefixes: tuple[str, ...]) -> str:
    """``model`` without a leading litellm provider prefix such as ``openai/``."""
    for prefix in prefixes:
        if model.startswith(prefix):
            return model[len(prefix) :]
    return model
