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

__all__ = [
    "PLACEHOLDER_KEY",
    "key_env_names",
    "known_secrets",
    "make_client",
    "resolve_api_key",
    "strip_prefix",
]

#: Sent to local OpenAI-compatible servers (vLLM, Ollama) that want a key but check none.
PLACEHOLDER_KEY = "not-needed"

#: The variables each client kind (or litellm provider prefix) reads a key from when
#: the worker names none.
DEFAULT_KEY_ENVS: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "http": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "google": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "vertex_ai": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "hosted_vllm": ("HOSTED_VLLM_API_KEY",),
}

#: Shorter values are not masked: they are not keys, and masking them would mangle text.
_MIN_SECRET_CHARS = 8


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


def key_env_names(target: Worker) -> tuple[str, ...]:
    """Every variable ``target``'s key may come from: its ``api_key_env``, the defaults
    of its client kind, and for litellm those of the model's provider prefix (litellm
    reads ``{PROVIDER}_API_KEY`` itself when the worker names no variable)."""
    names: list[str] = [target.api_key_env] if target.api_key_env else []
    kind = target.client or "litellm"
    names.extend(DEFAULT_KEY_ENVS.get(kind, ()))
    if kind == "litellm":
        provider = target.model.split("/", 1)[0] if "/" in target.model else "openai"
        names.extend(DEFAULT_KEY_ENVS.get(provider, ()))
        names.append(f"{provider.upper()}_API_KEY")
    return tuple(dict.fromkeys(names))


def known_secrets(target: Worker) -> tuple[str, ...]:
    """The values of ``target``'s key variables, to be masked wherever a reply or an
    error message could carry them (a provider may echo the key it was sent)."""
    values = (os.environ.get(name) for name in key_env_names(target))
    return tuple(
        dict.fromkeys(
            v for v in values if v and len(v) >= _MIN_SECRET_CHARS and v != PLACEHOLDER_KEY
        )
    )


def strip_prefix(model: str, prefixes: tuple[str, ...]) -> str:
    """``model`` without a leading litellm provider prefix such as ``openai/``."""
    for prefix in prefixes:
        if model.startswith(prefix):
            return model[len(prefix) :]
    return model
