"""Recursion fine-tuning: prompts for a forced second round, and first rounds to revise.

In the paper's recursion fine-tune, half of each batch gets one extra round: the
Conductor sees its previous plan and that plan's final answer and writes a new
workflow (or three empty lists to keep the answer).  The round-2 prompt built here is
exactly the one :class:`~conductor.execute.Orchestrator` builds when it continues a
record, so what the policy is trained on is what it sees at inference.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..conductors.prompt import PreviousRound, build_conductor_messages
from ..conductors.spec import Conductor
from ..errors import UsageError
from ..execute import Orchestrator, RunSettings
from ..llm.types import Message
from ..pool import Worker
from ..record import RunRecord
from ..workflow import format_workflow, workflow_from_dict

__all__ = ["can_revise", "first_round", "previous_round", "revision_messages"]


def previous_round(record: RunRecord) -> PreviousRound | None:
    """What a revision round is shown of ``record``: its last workflow and its final
    answer, or None when it has no workflow or no answer to revise."""
    last = next((rnd.workflow for rnd in reversed(record.rounds) if rnd.workflow), None)
    if last is None or record.final_answer is None:
        return None
    return PreviousRound(format_workflow(workflow_from_dict(last)), record.final_answer)


def can_revise(record: RunRecord) -> bool:
    """Whether ``record`` can be continued by a revision round (it has a plan and an answer)."""
    return previous_round(record) is not None


def revision_messages(
    record: RunRecord, pool_workers: Sequence[Worker], conductor: Conductor
) -> list[Message]:
    """The round-2 prompt for ``record``: the question and pool listing as in round 1,
    then the previous plan and final answer with the instruction to revise or keep it.

    ``pool_workers`` must be the workers ``record`` ran on, in the same order.  Raises
    :class:`UsageError` when the record has nothing to revise (see :func:`can_revise`).
    """
    previous = previous_round(record)
    if previous is None:
        raise UsageError(
            f"run {record.run_id} has no workflow with a final answer, so it cannot be revised"
        )
    return build_conductor_messages(
        record.question,
        pool_workers,
        max_steps=conductor.max_steps,
        template=conductor.template,
        show_descriptions=conductor.show_descriptions,
        previous=previous,
    )


async def first_round(
    orchestrator: Orchestrator, question: str, plan: str | None = None
) -> RunRecord:
    """Run round 1 of ``question``: with ``plan`` (a reply already written) executed as
    given, or else with the orchestrator's Conductor asked for one."""
    settings = RunSettings(max_steps=orchestrator.conductor.max_steps, rounds=1)
    return await orchestrator.run(question, settings, plan=plan)
