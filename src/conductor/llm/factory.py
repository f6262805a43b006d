"""Pick the client class for a worker: one registry from client kind to client class.

No SDK is imported here: a client's module is imported when a worker of its kind first
needs one, and each client imports its own SDK lazily, on first send.  The helpers the
clients share live below them (:mod:`conductor.llm.keys`, :mod:`conductor.llm.sdk`,
:mod:`conductor.llm.failures`), so no client imports this module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from ..errors import UsageError, target_name
from ..targets import POOL_CLIENT_KINDS, ClientKind

if TYPE_CHECKING:
    from ..targets import Worker
    from .base import ModelClient

__all__ = ["CLIENTS", "client_class", "make_client"]

#: Each client kind (a worker's ``client`` setting) and the class that serves it, as
#: (module in this package, class name): imported only when first asked for.
CLIENTS: dict[ClientKind, tuple[str, str]] = {
    "litellm": (".litellm_client", "LiteLLMClient"),
    "openai": (".openai_client", "OpenAIClient"),
    "http": (".http_client", "HttpClient"),
    "anthropic": (".anthropic_client", "AnthropicClient"),
    "google": (".google_client", "GoogleClient"),
    "local": (".local_client", "LocalClient"),
    # A trained checkpoint loaded in-process: only the Conductor uses this kind.
    "checkpoint": (".checkpoint_client", "CheckpointClient"),
}


def client_class(kind: str) -> Callable[[Worker], ModelClient] | None:
    """The client class for ``kind`` (called with the worker), imported now; None for
    an unknown kind."""
    entry = CLIENTS.get(kind)  # type: ignore[call-overload]  # any name may be asked for
    if entry is None:
        return None
    module_name, class_name = entry
    module = importlib.import_module(module_name, __package__)
    return cast("Callable[[Worker], ModelClient]", getattr(module, class_name))


def make_client(target: Worker) -> ModelClient:
    """A fresh :class:`ModelClient` for ``target``, chosen by ``target.client``."""
    kind = target.client or "litellm"
    cls = client_class(kind)
    if cls is None:
        offered = POOL_CLIENT_KINDS  # a pool may not name the Conductor-only kinds
        raise UsageError(
            f"{target_name(target.id)}: unknown client {kind!r} "
            f"(expected {', '.join(offered[:-1])} or {offered[-1]})"
        )
    return cls(target)
