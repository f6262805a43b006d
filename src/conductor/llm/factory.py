"""Pick the client class for a worker, and say what its kind can do: one registry from
client kind to client class.

A kind's capabilities (:class:`~conductor.llm.capabilities.ClientCapabilities`) are
declared by its client class as ``capabilities`` and read here
(:func:`capabilities_of`), so that a new kind is one class and one line in
:data:`CLIENTS`.  No SDK is imported here: a client's module is imported when a worker
of its kind first needs one, or its capabilities are first asked for (the client
modules import no SDK at module level: each imports its own on first send).  The
helpers the clients share live below them (:mod:`conductor.llm.apikey`,
:mod:`conductor.llm.prefill_rules`, :mod:`conductor.llm.sdk`,
:mod:`conductor.llm.failures`), so no client imports this module; the modules that ask
about kinds (keys, prefill, cost, limits, the caller) import it from above.

Which batch protocol a worker's calls can go through is a kind's capability too
(:func:`batch_protocol`); the batch APIs that speak each protocol are built on the
clients, a floor up, and registered there (:data:`conductor.batches.BATCH_APIS`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, cast

from ..errors import UsageError, target_name
from ..targets import POOL_CLIENT_KINDS, ClientKind
from .capabilities import NO_CAPABILITIES, ClientCapabilities

if TYPE_CHECKING:
    from ..targets import Worker
    from .base import ModelClient

__all__ = [
    "CLIENTS",
    "BatchProtocol",
    "batch_protocol",
    "capabilities",
    "capabilities_of",
    "client_class",
    "make_client",
]

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


#: A provider batch API's wire protocol (:data:`~conductor.llm.capabilities.BatchSupport`
#: less its rules).
BatchProtocol = Literal["openai", "anthropic", "google"]

#: The batch protocol of a litellm model's provider prefix (``hosted_vllm/`` is a
#: server named by api_base, asked in OpenAI's protocol).
_PREFIX_BATCH: dict[str, BatchProtocol] = {
    "openai": "openai",
    "hosted_vllm": "openai",
    "anthropic": "anthropic",
    "gemini": "google",
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


def capabilities(kind: str) -> ClientCapabilities:
    """What clients of ``kind`` can do, as their class declares it (its module imported
    now, no SDK with it); :data:`~conductor.llm.capabilities.NO_CAPABILITIES` for a kind
    no client serves (making one is what says it is unknown)."""
    cls = client_class(kind)
    if cls is None:
        return NO_CAPABILITIES
    declared = getattr(cls, "capabilities", None)
    if not isinstance(declared, ClientCapabilities):
        raise TypeError(f"client class {cls!r} declares no ClientCapabilities as `capabilities`")
    return declared


def capabilities_of(target: Worker) -> ClientCapabilities:
    """What ``target``'s client kind can do (a worker naming none is litellm's)."""
    return capabilities(target.client or "litellm")


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


def batch_protocol(target: Worker) -> BatchProtocol | None:
    """The batch API ``target``'s calls can go through, by its kind's
    :attr:`~conductor.llm.capabilities.ClientCapabilities.batch` (for litellm, the
    model's provider prefix); ``None`` when it has none."""
    support = capabilities_of(target).batch
    if support == "none":
        return None
    if support == "model_prefix":
        prefix = target.model.split("/", 1)[0] if "/" in target.model else ""
        return _PREFIX_BATCH.get(prefix)
    return support
