"""A provider batch API held in memory, at the seam :class:`~conductor.batches.api.
BatchAPI` draws, for the tests of the wave logic (:mod:`conductor.batches.waves`).

The wire protocols themselves are tested against the fake server's batch routes with the
real SDKs (``test_batch_openai``, ``test_batch_anthropic``, ``test_batch_google``); here
what matters is what the batcher sends when, and what it does with each kind of answer,
so every batch is scripted by hand: how many status reads it takes, how it ends, which
lines fail and how.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from conductor.batches.api import (
    BatchEntry,
    BatchLimits,
    BatchState,
    BatchStatus,
    LineOutcome,
)
from conductor.errors import ModelCallError
from conductor.llm.types import ModelRequest, RawCompletion, Usage

__all__ = ["MemoryBatch", "MemoryBatchAPI", "MemoryPlan", "answer_of"]

#: Roomy limits: a test of chunking sets its own.
ROOMY = BatchLimits(1000, 10**9)


def answer_of(request: ModelRequest) -> str:
    """What the memory provider answers: the last message, marked."""
    return f"A({request.messages[-1]['content']})"


@dataclass(frozen=True)
class MemoryPlan:
    """How one batch goes: ``polls`` status reads in flight, then ``outcome``;
    ``expired`` answers only the first ``answered`` lines; ``failing`` maps a custom
    id to the error its line ends with."""

    polls: int = 1
    outcome: Literal["ended", "expired", "failed", "cancelled"] = "ended"
    answered: int = 0
    failing: dict[str, ModelCallError] = field(default_factory=dict)


@dataclass
class MemoryBatch:
    id: str
    label: str
    entries: list[BatchEntry]
    plan: MemoryPlan
    reads: int = 0
    listed: bool = True


class MemoryBatchAPI:
    """One target's batch API in memory.  ``plans`` are given to batches in the order
    they are submitted (the last repeats); ``submit_errors`` fail the next submissions,
    one each; ``answer`` makes a line's reply text."""

    def __init__(
        self,
        plans: Sequence[MemoryPlan] = (MemoryPlan(),),
        *,
        limits: BatchLimits = ROOMY,
        submit_errors: Sequence[ModelCallError] = (),
        answer: Callable[[ModelRequest], str] = answer_of,
        listed: bool = True,
    ) -> None:
        self.limits = limits
        self.plans = list(plans)
        self.submit_errors = list(submit_errors)
        self.answer = answer
        self.listed = listed
        self.batches: dict[str, MemoryBatch] = {}
        self.submissions: list[MemoryBatch] = []
        self.status_errors: list[ModelCallError] = []
        self.closed = False
        self._ids = itertools.count(1)

    def chunks(self, entries: Sequence[BatchEntry]) -> list[list[BatchEntry]]:
        size = self.limits.max_requests
        return [list(entries[i : i + size]) for i in range(0, len(entries), size)]

    async def submit(self, entries: Sequence[BatchEntry], *, label: str) -> str:
        if self.submit_errors:
            raise self.submit_errors.pop(0)
        plan = self.plans[min(len(self.submissions), len(self.plans) - 1)]
        batch = MemoryBatch(f"mb_{next(self._ids)}", label, list(entries), plan, listed=self.listed)
        self.batches[batch.id] = batch
        self.submissions.append(batch)
        return batch.id

    def _state(self, batch: MemoryBatch) -> BatchState:
        if batch.reads <= batch.plan.polls:
            return "running"
        return batch.plan.outcome

    async def status(self, batch_id: str) -> BatchStatus:
        if self.status_errors:
            raise self.status_errors.pop(0)
        batch = self.batches[batch_id]
        batch.reads += 1
        return BatchStatus(self._state(batch), total=len(batch.entries))

    async def results(self, batch_id: str) -> list[LineOutcome]:
        batch = self.batches[batch_id]
        state = self._state(batch)
        if state in ("failed", "cancelled"):
            return []
        entries = batch.entries
        if state == "expired":
            entries = entries[: batch.plan.answered]
        out: list[LineOutcome] = []
        for entry in entries:
            error = batch.plan.failing.get(entry.custom_id)
            if error is not None:
                out.append(LineOutcome(entry.custom_id, error=error))
                continue
            text = self.answer(entry.request)
            raw = RawCompletion(text, Usage(10, 5), {"text": text}, finish_reason="stop")
            out.append(LineOutcome(entry.custom_id, completion=raw))
        return out

    async def find(self, label: str) -> str | None:
        for batch in self.batches.values():
            if batch.label == label and batch.listed:
                return batch.id
        return None

    async def cancel(self, batch_id: str) -> None:
        self.batches[batch_id].plan = MemoryPlan(polls=0, outcome="cancelled")

    async def aclose(self) -> None:
        self.closed = True

    def sent_custom_ids(self) -> list[str]:
        """Every custom id submitted, in order (repeats show a line paid twice)."""
        return [e.custom_id for b in self.submissions for e in b.entries]
