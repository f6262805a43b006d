"""The Conductor as a strategy: it writes a workflow per question, and the executor
(:class:`~conductor.execute.Orchestrator`) runs it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..conductors.spec import Conductor
from ..events import EventSink
from ..execute import Orchestrator, RunSettings
from ..llm.answer_format import PLAIN, AnswerFormat
from ..llm.caller import CallerSet
from ..pool import Pool
from ..record import RunRecord
from ..steps import Budget
from ..targets import Worker

__all__ = ["ConductorStrategy"]


class ConductorStrategy:
    """The Conductor writes a workflow for each question."""

    name = "conductor"

    def __init__(
        self, pool: Pool, conductor: Conductor, settings: RunSettings, callers: CallerSet
    ) -> None:
        self.settings = settings
        self._orchestrator = Orchestrator(pool, conductor, callers=callers)

    @property
    def pool(self) -> Pool:
        return self._orchestrator.pool

    @property
    def orchestrator(self) -> Orchestrator:
        """The executor that runs its questions: what builds the messages of its calls
        (which a spend estimate counts before any is made)."""
        return self._orchestrator

    @property
    def targets(self) -> tuple[Worker, ...]:
        return (*self.pool.workers, self._orchestrator.conductor.target)

    @property
    def call_demand(self) -> tuple[tuple[Worker, int], ...]:
        # A sample may call the Conductor and any worker, one call each at a time as far
        # as can be known before the Conductor plans.
        conductor = self._orchestrator.conductor.target
        return ((conductor, 1), *((w, 1) for w in self.pool.workers))

    def describe(self) -> dict[str, Any]:
        s = self.settings
        return {
            "strategy": self.name,
            "conductor": self._orchestrator.conductor.describe(),
            "settings": {
                "max_steps": s.max_steps,
                "rounds": s.rounds,
                "budget_usd": s.budget_usd,
                "max_calls": s.max_calls,
            },
        }

    def answer_refusal(self, answer: AnswerFormat) -> str | None:
        # The Conductor may give any worker the last step: each must be able to answer.
        if answer.plain:
            return None
        return next(filter(None, (answer.refusal(w) for w in self.pool.workers)), None)

    async def run(
        self,
        question: str,
        *,
        sample_index: int,
        sample_id: str | None = None,
        epoch: int | None = None,
        events: EventSink | None = None,
        on_record: Callable[[RunRecord], None] | None = None,
        budget: Budget | None = None,
        answer_format: AnswerFormat = PLAIN,
    ) -> RunRecord:
        settings = replace(self.settings, sample_index=sample_index)
        return await self._orchestrator.run(
            question,
            settings,
            events=events,
            sample_id=sample_id,
            epoch=epoch,
            on_record=on_record,
            budget=budget,
            answer_format=answer_format,
        )

    async def aclose(self) -> None:
        await self._orchestrator.aclose()
