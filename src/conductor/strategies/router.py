"""``router:DIR``: a fitted router (:mod:`conductor.router`) picks, for each question,
the strategy that answers it: a worker alone, a fixed workflow, or the Conductor.

The router's arms are strategies by name (``single:W``, ``moa``, ``conductor``...); each
is built once, over the same callers, and run as it would run alone, so a routed
question's record is the chosen strategy's record with the route added: ``conductor``
says ``router:DIR`` and the arm, ``route`` every arm's chance and whether a cascade
fell back.  Routing happens before the first call of each question: well under
a millisecond with the hashed features, on the event loop; one forward pass of a small
model with ``gguf-mean-v1``, on a worker thread while the model's host process works.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..events import EventSink
from ..llm.answer_format import PLAIN, AnswerFormat
from ..llm.caller import CallerSet
from ..pool import Pool
from ..record import RouteRecord, RunRecord
from ..steps import Budget
from ..targets import Worker
from .answers import AnswerKey
from .base import CallPlan, PlannedCall, Strategy
from .baselines import parse_strategy

if TYPE_CHECKING:
    from ..execute import RunSettings
    from ..router import Route, RouterDir

__all__ = ["ROUTER_PREFIX", "RouterStrategy", "is_router_strategy", "router_strategy"]

log = logging.getLogger("conductor")

ROUTER_PREFIX = "router:"

# Routing that waits on a model's host runs here, not on the loop's default executor:
# a served burst of questions queued at the host would otherwise hold every thread that
# SDK imports and cache writes need.  The host reads one request at a time, so two
# threads keep it busy.
_ROUTING = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="route")


def is_router_strategy(text: str) -> bool:
    """Whether ``--strategy text`` names a router directory."""
    return text.strip().startswith(ROUTER_PREFIX)


class RouterStrategy:
    """Each question goes to the arm the router picks (see the module)."""

    def __init__(self, name: str, routed: RouterDir, arms: dict[str, Strategy]) -> None:
        self.name = name
        self.routed = routed
        self.arms = arms

    @property
    def pool(self) -> Pool:
        return next(iter(self.arms.values())).pool

    @property
    def targets(self) -> tuple[Worker, ...]:
        return tuple(t for arm in self.arms.values() for t in arm.targets)

    @property
    def call_demand(self) -> tuple[tuple[Worker, int], ...]:
        # A question runs one arm: each target as often at once as the arm that calls it
        # most at once.
        most: dict[str, tuple[Worker, int]] = {}
        for arm in self.arms.values():
            for target, count in arm.call_demand:
                seen = most.get(target.id)
                if seen is None or count > seen[1]:
                    most[target.id] = (target, count)
        return tuple(most.values())

    @property
    def call_roles(self) -> tuple[tuple[str, Worker], ...]:
        # Any arm may answer: each of their roles, in the order the arms list them.
        roles: dict[str, Worker] = {}
        for arm in self.arms.values():
            roles.update(arm.call_roles)
        return tuple(roles.items())

    def planned_calls(self, question: str, *, workflow_steps: int) -> CallPlan | None:
        # Routing calls no paid model (at most the local one gguf-mean-v1 reads with):
        # each question is planned as the arm it goes to.
        arm = self.arms[self.route(question).arm]
        plan = arm.planned_calls(question, workflow_steps=workflow_steps)
        if plan is None:
            return None
        basis = "routed: {calls}, each question priced as the arm it goes to"
        return CallPlan(
            tuple(
                PlannedCall(tuple(dataclasses.replace(s, basis=basis) for s in call.shares))
                for call in plan.calls
            )
        )

    def describe(self) -> dict[str, Any]:
        # What decides the routes, not where the files lie: a run's cached samples are
        # replayed for the same router moved, never for another one.
        router = self.routed.router
        return {
            "strategy": self.name,
            "router": {
                "head_sha256": self.routed.head_sha256,
                "arms": list(router.arms),
                "features": router.featurizer.name,
                # The features' settings decide the routes too (gguf-mean-v1's model
                # file and its centring); a digest, not the hundreds of numbers.
                "features_sha256": hashlib.sha256(
                    json.dumps(router.featurizer.settings(), sort_keys=True).encode()
                ).hexdigest(),
                "cost_weight": router.cost_weight,
                "fallback": router.fallback,
                "threshold": router.threshold,
            },
            "arms": {name: arm.describe() for name, arm in self.arms.items()},
        }

    def answer_refusal(self, answer: AnswerFormat) -> str | None:
        # Any arm may answer: each must be able to.
        return next(filter(None, (arm.answer_refusal(answer) for arm in self.arms.values())), None)

    def route(self, question: str) -> Route:
        """Where ``question`` goes (no model is called)."""
        return self.routed.router.route(question)

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
        if self.routed.router.featurizer.blocking:
            loop = asyncio.get_running_loop()
            route = await loop.run_in_executor(_ROUTING, self.route, question)
        else:
            route = self.route(question)
        arm = self.arms[route.arm]

        def mark(record: RunRecord) -> None:
            record.conductor = {**record.conductor, "strategy": self.name, "arm": route.arm}
            record.settings["strategy"] = self.name
            record.route = RouteRecord(route.arm, route.chances, route.fell_back)

        def forward(record: RunRecord) -> None:
            mark(record)
            if on_record is not None:
                on_record(record)

        record = await arm.run(
            question,
            sample_index=sample_index,
            sample_id=sample_id,
            epoch=epoch,
            events=events,
            on_record=forward,
            budget=budget,
            answer_format=answer_format,
        )
        mark(record)
        return record

    async def aclose(self) -> None:
        for arm in self.arms.values():
            await arm.aclose()


def router_strategy(
    text: str,
    pool: Pool,
    callers: CallerSet,
    *,
    conductor: Callable[[], Strategy] | None,
    vote_key: AnswerKey | None = None,
    settings: RunSettings | None = None,
    pool_sha256: str | None = None,
    name: str | None = None,
    routed: RouterDir | None = None,
) -> RouterStrategy:
    """The strategy ``router:DIR`` names, its arms built over ``callers`` from ``pool``
    (``conductor`` builds the Conductor's, for a router with a ``conductor`` arm).

    Raises :class:`~conductor.errors.UsageError` when DIR is not a router directory or
    an arm cannot run on ``pool`` (a worker it names is not there).  Warns when the
    router was fitted on runs of another pool file (``pool_sha256``).  ``name`` is the
    strategy's name in its records (default: the text, ``router:DIR``); ``routed``, the
    router already read from DIR (a server builds one per allowed set of workers)."""
    from ..router import load_router

    given = text.strip()[len(ROUTER_PREFIX) :]
    if not given:
        raise UsageError(
            "--strategy router:DIR needs the router's directory (conductor fit-router --out DIR)"
        )
    if routed is None:
        routed = load_router(Path(given))
    try:
        routed.router.featurizer.check()
    except UsageError as exc:
        raise UsageError(f"router {given}: {exc}") from None
    fitted_on = routed.pool_sha256
    if pool_sha256 is not None and fitted_on and pool_sha256 not in fitted_on:
        log.warning(
            "router %s was fitted on runs of another pool file: its arms' workers may not "
            "be the models it learned",
            given,
        )
    arms: dict[str, Strategy] = {}
    for arm in routed.router.arms:
        try:
            if arm == "conductor":
                if conductor is None:
                    raise UsageError("the Conductor cannot be run here")
                arms[arm] = conductor()
            else:
                arms[arm] = parse_strategy(arm, pool, callers, vote_key=vote_key, settings=settings)
        except UsageError as exc:
            raise UsageError(f"router {given}: its arm {arm} cannot run: {exc}") from None
    return RouterStrategy(name or f"{ROUTER_PREFIX}{given}", routed, arms)
