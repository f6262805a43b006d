"""Where a worker's API key comes from, which values to mask, and which keys a run
lacks before it starts: the rules every client shares.

A key is read from its variable when a client is made or a call is checked, and never
stored anywhere else.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import AuthenticationError, MissingKeysError
from ..text import joined, targets_named
from .failures import make_error
from .sdk import import_litellm

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = [
    "DEFAULT_KEY_ENVS",
    "PLACEHOLDER_KEY",
    "key_env_names",
    "known_secrets",
    "missing_keys",
    "needed_key",
    "require_keys",
    "resolve_api_key",
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


def needed_key(target: Worker) -> tuple[str, ...]:
    """The variables of which one must be set before ``target`` can be called, or ()
    when its key is set or it needs none (an in-process model, or a local server named
    by ``api_base``, which gets the placeholder key).  The same rules as the clients'
    own look-up (:func:`resolve_api_key`, and litellm's for a litellm worker that names
    no variable), applied before any call."""
    kind = target.client or "litellm"
    if kind in ("local", "checkpoint"):
        return ()
    if target.api_key_env:
        names: tuple[str, ...] = (target.api_key_env,)
    elif kind == "litellm":
        # litellm finds its own key; a local server gets the placeholder.
        names = () if target.api_base else _litellm_key_names(target.model)
    else:
        names = DEFAULT_KEY_ENVS.get(kind, ())
    if not names or target.api_base or any(os.environ.get(name) for name in names):
        return ()
    return names


def _litellm_key_names(model: str) -> tuple[str, ...]:
    """The API-key variables litellm reads for ``model``'s provider, as litellm itself
    reports them.  Only ``*_API_KEY`` names count: other providers' credentials (AWS
    profiles, Vertex's application default credentials, Ollama's optional base URL) can
    come from elsewhere, and their failures are left to the call."""
    try:
        report = import_litellm().validate_environment(model)
    except Exception:  # litellm does not know the model: the call will say so
        return ()
    missing = (report.get("missing_keys") or []) if isinstance(report, dict) else []
    names = tuple(str(n) for n in missing if str(n).endswith("_API_KEY"))
    # Google's models take either of two variables; prefer the one the docs name first.
    return tuple(sorted(names, key=lambda n: n != "GEMINI_API_KEY"))


def missing_keys(targets: Iterable[Worker]) -> dict[str, list[str]]:
    """Each unset key variable (``A or B`` where either will do), with the targets
    (``worker 'ID'`` or ``the Conductor``) that need it, in the order first met."""
    out: dict[str, list[str]] = {}
    seen: set[str] = set()
    for target in targets:
        if target.id in seen:
            continue
        seen.add(target.id)
        names = needed_key(target)
        if names:
            out.setdefault(" or ".join(names), []).append(target.id)
    return out


def require_keys(targets: Iterable[Worker]) -> None:
    """Raise :class:`MissingKeysError` naming every unset key variable and who needs
    it, so that a run fails before its first call instead of at each target in turn."""
    missing = missing_keys(targets)
    if not missing:
        return
    parts = [f"{names} (for {targets_named(ids)})" for names, ids in missing.items()]
    listing = joined(parts)
    noun = "key is" if len(parts) == 1 else "keys are"
    raise MissingKeysError(
        f"{len(parts)} API {noun} not set, so nothing was sent: set {listing} in the "
        "environment (or point the worker's api_key_env at the variable that holds it)",
        missing,
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
