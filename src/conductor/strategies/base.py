"""What every way of answering a question offers its callers (``bench``, ``ask``,
``serve``): the :class:`Strategy` protocol.

A caller uses a strategy through these members only, so that the Conductor and the
baselines are interchangeable wherever a question is answered: what a run calls (for
the key check before the first call, and for the capacity of the pool's models), and
one run of one question with its events and its record as it fills in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..events import EventSink
from ..llm.answer_format import PLAIN, AnswerFormat
from ..pool import Pool
from ..record import RunRecord
from ..steps import Budget
from ..targets import Worker

__all__ = ["Strategy"]


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
