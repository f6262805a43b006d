"""The Conductor as a strategy: it writes a workflow per question, and the executor
(:class:`~conductor.execute.Orchestrator`) runs it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..conductors.spec import Conductor
from ..context import SharedStep
from ..events import EventSink
from ..execute import Orchestrator, RunSettings
from ..llm.answer_format import PLAIN, AnswerFormat
from ..llm.caller import CallerSet
from ..pool import Pool
from ..record import RunRecord
from ..steps import Budget
from ..targets import Worker
from .base import CONDUCTOR_ROLE, CallPlan, EarlierReplies, PlannedCall, PlannedShare

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
    def targets(self) -> tuple[Worker, ...]:
        return (*self.pool.workers, self._orchestrator.conductor.target)

    @property
    def call_demand(self) -> tuple[tuple[Worker, int], ...]:
        # A sample may call the Conductor and any worker, one call each at a time as far
        # as can be known before the Conductor plans.
        conductor = self._orchestrator.conductor.target
        return ((conductor, 1), *((w, 1) for w in self.pool.workers))

    @property
    def call_roles(self) -> tuple[tuple[str, Worker], ...]:
        # The Conductor's, then every worker of the pool: any may be given a step.
        conductor = self._orchestrator.conductor.target
        return ((CONDUCTOR_ROLE, conductor), *((w.id, w) for w in self.pool.workers))

    def planned_calls(self, question: str, *, workflow_steps: int) -> CallPlan:
        # The workflow is the Conductor's to write: each round is taken to plan
        # ``workflow_steps`` steps (within --max-steps), each step given to any worker
        # alike and seeing the steps before it; a revision round is shown the plan and
        # the answer before it.
        from ..conductors.prompt import PreviousRound

        orchestrator = self._orchestrator
        cond = orchestrator.conductor
        workers = self.pool.workers
        max_steps = self.settings.max_steps or cond.max_steps
        steps = max(1, min(workflow_steps, max_steps))
        planning = "assumed: {calls} (one a round), its request as built"
        n = len(workers)
        stepping = f"assumed: {{calls}} ({workflow_steps} steps a workflow, shared by {n} workers)"
        calls: list[PlannedCall] = []
        for rnd in range(max(1, self.settings.rounds)):
            if rnd == 0:
                messages = orchestrator.conductor_messages(question, max_steps)
                shown: tuple[EarlierReplies, ...] = ()
            else:
                previous = PreviousRound(workflow_text="", final_answer="")
                messages = orchestrator.conductor_messages(question, max_steps, previous)
                shown = (EarlierReplies(1, workers),)
            plan = PlannedShare(
                CONDUCTOR_ROLE, cond.target, 1.0, messages, planning,
                subtasks=steps if rnd else 0, replies=shown,
            )  # fmt: skip
            calls.append(PlannedCall((plan,)))
            for k in range(steps):
                seen = [SharedStep(f"{rnd}.{j}", 0, "", "") for j in range(k)]
                answers = (EarlierReplies(k, workers),) if k else ()
                shares = [
                    PlannedShare(
                        worker.id,
                        worker,
                        1 / n,
                        orchestrator.worker_messages(question, i, "", seen),
                        stepping,
                        subtasks=k + 1,
                        replies=answers,
                    )
                    for i, worker in enumerate(workers)
                ]
                calls.append(PlannedCall(tuple(shares)))
        return CallPlan(tuple(calls))

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
