"""What every way of answering a question offers its callers (``bench``, ``ask``,
``serve``): the :class:`Strategy` protocol.

A caller uses a strategy through these members only, so that the Conductor and the
baselines are interchangeable wherever a question is answered: what a run calls (for
the key check before the first call, and for the capacity of the pool's models), the
calls it plans before any is made (:meth:`Strategy.planned_calls`, what a spend
estimate counts: the estimate never asks which class a strategy is), and one run of
one question with its events and its record as it fills in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..events import EventSink
from ..llm.answer_format import PLAIN, AnswerFormat
from ..llm.types import Message
from ..pool import Pool
from ..record import RunRecord
from ..steps import Budget
from ..targets import Worker

__all__ = [
    "CONDUCTOR_ROLE",
    "CallPlan",
    "EarlierReplies",
    "PlannedCall",
    "PlannedShare",
    "Strategy",
]

#: The role the Conductor's calls are counted under (a worker's steps are counted under
#: its id), in a plan as in a record's rounds.
CONDUCTOR_ROLE = "Conductor"


@dataclass(frozen=True)
class EarlierReplies:
    """Replies a planned call is shown that do not exist before the run: ``count`` of
    them, each written by any one of ``writers`` alike (an estimate takes each to be as
    long as its writer's ``max_tokens`` allows, the mean over ``writers``)."""

    count: int
    writers: tuple[Worker, ...]


@dataclass(frozen=True)
class PlannedShare:
    """One role's share of a planned call.

    ``weight`` is the chance the call is this role's (a step the Conductor may give any
    of ``n`` workers is each one's with weight ``1/n``).  ``messages`` is the request
    as the run builds it before anything is answered; what the run adds only as it
    goes is counted apart: ``subtasks`` instructions the Conductor writes, and
    ``replies``, the earlier answers the call sees.  ``basis`` says, in words, how the
    plan knows of the call, with ``{calls}`` where an estimate puts the calls a
    question (``the plan's {calls}, its requests as built``).
    """

    role: str
    target: Worker
    weight: float
    messages: list[Message]
    basis: str
    subtasks: int = 0
    replies: tuple[EarlierReplies, ...] = ()


@dataclass(frozen=True)
class PlannedCall:
    """One call a run is expected to make: the roles that may make it (weights adding
    up to one)."""

    shares: tuple[PlannedShare, ...]


@dataclass(frozen=True)
class CallPlan:
    """The calls one run of a question is expected to make, in order."""

    calls: tuple[PlannedCall, ...]


class Strategy(Protocol):
    """Something that answers one question and records how."""

    #: The strategy's name as ``--strategy`` and ``serve``'s model ids spell it.
    name: str

    @property
    def pool(self) -> Pool:
        """The pool whose workers answer."""
        ...

    @property
    def targets(self) -> tuple[Worker, ...]:
        """Every target a run may call, in the order a key check names them (a target
        may repeat): what must have its API key before the first call."""
        ...

    @property
    def call_demand(self) -> tuple[tuple[Worker, int], ...]:
        """Each target a run may call, with the most calls one run makes to it at once,
        as far as is known before it starts (see
        :func:`~conductor.llm.limiter.sample_capacity`)."""
        ...

    @property
    def call_roles(self) -> tuple[tuple[str, Worker], ...]:
        """Each role a run's calls are counted under, with the target it calls, in the
        order an estimate lists them: :data:`CONDUCTOR_ROLE` for the Conductor's calls,
        a worker's id for its steps."""
        ...

    def planned_calls(self, question: str, *, workflow_steps: int) -> CallPlan | None:
        """The calls one run of ``question`` is expected to make, known before any is
        made (no model is called, nothing is written), each request built as the run
        would build it; a workflow that is not known in advance is taken to have
        ``workflow_steps`` steps.  ``None``: the strategy cannot say (a spend estimate
        then refuses to assume one, rather than price the run at nothing)."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-ready description for the run's config (no secrets)."""
        ...

    def answer_refusal(self, answer: AnswerFormat) -> str | None:
        """Why a run cannot answer in the form ``answer`` asks (a worker that may answer
        has a client that cannot send it, or the strategy picks its answer in a way the
        format does not allow), or ``None`` when it can: asked before any call."""
        ...

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
        """Answer ``question`` in the form ``answer_format`` asks (the step that answers gets it,
        no other step does); ``events`` gets the run's progress events.  ``on_record``
        gets the record as soon as it exists, before the first step starts: it fills in
        as the run goes (each round's ``workflow`` before that round's steps start), and
        a cancelled run's record is finished as interrupted, so it is what an
        interrupted caller keeps.  ``budget``, when given, is what the run's calls
        draw on instead of a budget of the strategy's own settings: one budget given
        to several runs (a ``serve`` request's ``n``) bounds them together."""
        ...

    async def aclose(self) -> None:
        """Close the clients of the strategy's callers."""
        ...
