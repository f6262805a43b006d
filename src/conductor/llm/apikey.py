"""Reading a worker's API key: the one rule every client follows when it is made.

The pre-run checks (which keys a run lacks, which values to mask) need each kind's
capabilities and so sit above the clients, in :mod:`conductor.llm.keys`; what the
clients themselves share is here, below them.  A key is read from its variable when a
client is made or a call is checked, and never stored anywhere else.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import AuthenticationError
from .failures import make_error

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = ["PLACEHOLDER_KEY", "PROVIDER_KEY_ENVS", "resolve_api_key"]

#: Sent to local OpenAI-compatible servers (vLLM, Ollama) that want a key but check none.
PLACEHOLDER_KEY = "not-needed"

#: The variables each litellm provider prefix (``openai/``, ``gemini/``, ...) reads a key
#: from; a client kind's own are its capabilities' ``key_envs``.
PROVIDER_KEY_ENVS: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "vertex_ai": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "hosted_vllm": ("HOSTED_VLLM_API_KEY",),
}


def resolve_api_key(target: Worker, default_envs: tuple[str, ...]) -> str:
    """The API key for ``target``, read from the environment now.

    ``target.api_key_env`` names the variable; without it the provider's usual
    variables (``default_envs``) are tried in order.  With no key but an ``api_base``
    (a local server) a placeholder is returned; with neither,
    :class:`AuthenticationError` says which variable to set.
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
