"""Provider batch APIs and the wave batcher that sends a bench's calls through them.

- :mod:`~conductor.batches.api`: the one interface a provider's batch API is reached
  through (:class:`~conductor.batches.api.BatchAPI`, and ``chunk_entries`` the three
  share);
- :mod:`~conductor.batches.openai`, :mod:`~conductor.batches.anthropic`,
  :mod:`~conductor.batches.google`: one per protocol, each building its lines with its
  live client's own builder and reading answers with that client's reader;
- :mod:`~conductor.batches.waves`: :class:`~conductor.batches.waves.WaveBatcher`,
  what is sent when (whole waves), through a journal the run directory provides.

It is a floor above the model calls, because the batch APIs are built on the clients;
the caller knows the batcher only as :class:`conductor.llm.batcher.Batcher`.  Which
protocol a worker's calls can go through is its client kind's capability
(:func:`conductor.llm.factory.batch_protocol`); which class speaks a protocol is the
registry here, :data:`BATCH_APIS`, beside the classes it names (in ``llm/factory.py``
it would be the model-call floor importing the floor above it).  Its modules are
imported only when first asked for: importing this package imports no SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from ..llm.factory import BatchProtocol, batch_protocol

if TYPE_CHECKING:
    from ..targets import Worker
    from .api import BatchAPI

__all__ = ["BATCH_APIS", "batch_api"]

#: Each batch protocol and the class that speaks it (module in this package, class
#: name), imported only when first asked for; the class is made with the worker.
BATCH_APIS: dict[BatchProtocol, tuple[str, str]] = {
    "openai": (".openai", "OpenAIBatchAPI"),
    "anthropic": (".anthropic", "AnthropicBatchAPI"),
    "google": (".google", "GoogleBatchAPI"),
}


def batch_api(target: Worker) -> BatchAPI | None:
    """A fresh :class:`~conductor.batches.api.BatchAPI` for ``target``'s provider key
    and model, or ``None`` when its calls have no batch API."""
    protocol = batch_protocol(target)
    if protocol is None:
        return None
    module_name, class_name = BATCH_APIS[protocol]
    module = importlib.import_module(module_name, __package__)
    return cast("BatchAPI", getattr(module, class_name)(target))
