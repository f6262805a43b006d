"""Provider batches as the caller sees them: which targets are batched, and what it asks
of the batcher their calls go to.

A ``bench --batch`` run hands its callers a batcher
(:class:`conductor.batches.waves.WaveBatcher` is the one).  The batcher lives a floor
up, beside the batch APIs it sends through, which build their lines with the clients
here; so :class:`~conductor.llm.caller.ModelCaller` knows it only as :class:`Batcher`:
a call answered from a batch (:class:`BatchAnswer`), or :class:`SendLive` when the call
is to be made live after all, and a block around each live call, so that a wave waits
for it.  Whether a target's calls are batched at all (:func:`batched`) is its ``batch:``
setting and its kind's batch capability, both known here.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .types import ModelRequest, RawCompletion

if TYPE_CHECKING:
    from ..targets import Worker

__all__ = ["BatchAnswer", "Batcher", "SendLive", "batched"]


def batched(target: Worker, flag: bool) -> bool:
    """Whether ``target``'s calls go through its provider's batch API in a bench: as its
    ``batch:`` setting says, else as ``--batch`` (``flag``) says for a client that has
    one."""
    from .factory import batch_protocol

    if target.batch is not None:
        return target.batch
    return flag and batch_protocol(target) is not None


class SendLive(Exception):
    """Not an error: the call is to be made live, for ``reason`` (its lines went
    unanswered too often, or its target's batch API refuses batches)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class BatchAnswer:
    """A call's answer from a batch (``raw.batch`` is set) and when its line was sent
    (``time.perf_counter()``; a line a resumed batch holds: when this run took it up)."""

    raw: RawCompletion
    sent_at: float


class Batcher(Protocol):
    """What a caller asks of the batcher its batched calls go to."""

    async def call(self, target: Worker, request: ModelRequest, key: str) -> BatchAnswer:
        """The answer to ``request`` (cache key ``key``) from a batch; raises the line's
        ``ModelCallError``, or :class:`SendLive` when it is to be made live."""
        ...

    def live(self) -> AbstractContextManager[None]:
        """Around a live call of the current sample, so that a wave waits for it."""
        ...
