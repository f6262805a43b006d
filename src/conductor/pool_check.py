"""``pools check``'s library half: one tiny request to every model of a pool.

:func:`plan_pings` says which models a check pings; :func:`check_pool` checks their
keys (every unset one named at once, as ``ask`` does), then sends each worker (and the
pool's Conductor, when it is not one of the workers' models) one short request without
retries, handing over a :class:`PingResult` per model as it finishes: the reply and
latency, or the one-sentence error.  A Conductor that cannot even be set up is a
failed result of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .errors import ConductorError

if TYPE_CHECKING:
    from .llm.caller import CallerSet
    from .pool import Pool
    from .targets import Worker

__all__ = ["PingPlan", "PingResult", "check_keys", "check_pool", "plan_pings"]


@dataclass(frozen=True)
class PingResult:
    """How one model answered.

    ``label`` is how the Conductor sees it (``Model 0``, ...) or ``Conductor``;
    ``error`` is ``None`` when it replied, else why not; ``latency_s`` and ``reply``
    are meaningful only when it replied.
    """

    label: str
    worker_id: str
    error: str | None = None
    latency_s: float = 0.0
    reply: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class PingPlan:
    """What a check of a pool sends: ``targets`` are the models to ping, each with its
    label, in pool order; ``unusable`` the failed result of a Conductor that cannot
    even be set up; ``conductor`` the Conductor's target when it can (its key is
    checked even where it shares a worker's model and is not pinged on its own)."""

    targets: tuple[tuple[str, Worker], ...]
    unusable: tuple[PingResult, ...] = ()
    conductor: Worker | None = None

    @property
    def rows(self) -> list[tuple[str, str]]:
        """``(label, worker id)`` of every result, in the order :func:`check_pool`
        returns them."""
        pinged = [(label, w.id) for label, w in self.targets]
        return [*pinged, *((r.label, r.worker_id) for r in self.unusable)]


def plan_pings(pool: Pool) -> PingPlan:
    """The models a check of ``pool`` pings: every worker, and the Conductor when it is
    not one of the workers' models."""
    from .conductors.spec import resolve_conductor

    targets: list[tuple[str, Worker]] = [(f"Model {i}", w) for i, w in enumerate(pool.workers)]
    if pool.conductor is None:
        return PingPlan(tuple(targets))
    try:
        cond = resolve_conductor(pool)
    except ConductorError as exc:
        # A Conductor that cannot even be set up is a failed row of its own, not a silence.
        return PingPlan(tuple(targets), (PingResult("Conductor", "conductor", str(exc)),))
    if cond.target.model not in {w.model for w in pool.workers}:
        targets.append(("Conductor", cond.target))
    return PingPlan(tuple(targets), conductor=cond.target)


def check_keys(plan: PingPlan) -> None:
    """Raise :class:`~conductor.errors.MissingKeysError` naming every unset key variable
    the models of ``plan`` need (``ask``'s check and words), before any request."""
    from .llm.keys import require_keys

    conductor = [plan.conductor] if plan.conductor is not None else []
    require_keys([*(w for _, w in plan.targets), *conductor])


def check_pool(
    pool: Pool,
    timeout_s: float,
    *,
    plan: PingPlan | None = None,
    on_result: Callable[[PingResult], None] | None = None,
) -> list[PingResult]:
    """Ping every model of ``pool`` (``plan``, by default :func:`plan_pings`'s), waiting
    at most ``timeout_s`` seconds for each; the results in :attr:`PingPlan.rows` order.

    Every key the pinged models need is checked first, as ``ask`` checks them: a
    :class:`~conductor.errors.MissingKeysError` names each unset variable before any
    request.  ``on_result`` gets each result as it comes (a Conductor that cannot be
    set up first, then the pings as they finish)."""
    plan = plan or plan_pings(pool)
    check_keys(plan)
    for result in plan.unusable:
        if on_result is not None:
            on_result(result)
    pinged = asyncio.run(_ping_all(plan.targets, timeout_s, on_result))
    return [*pinged, *plan.unusable]


async def _ping_all(
    targets: tuple[tuple[str, Worker], ...],
    timeout_s: float,
    on_result: Callable[[PingResult], None] | None,
) -> list[PingResult]:
    from .llm.caller import CallerSet

    callers = CallerSet(None)

    async def one(label: str, worker: Worker) -> PingResult:
        result = await _ping(callers, label, worker, timeout_s)
        if on_result is not None:
            on_result(result)
        return result

    try:
        return list(await asyncio.gather(*(one(label, w) for label, w in targets)))
    finally:
        await callers.aclose()


async def _ping(callers: CallerSet, label: str, worker: Worker, timeout_s: float) -> PingResult:
    from .errors import ModelCallError
    from .llm.types import ModelRequest

    target = replace(worker, max_retries=0, timeout_s=min(worker.timeout_s, timeout_s))
    request = ModelRequest(
        messages=({"role": "user", "content": "Reply with the single word: ready"},),
        params={**worker.params, "max_tokens": 8},
    )
    t0 = time.perf_counter()
    try:
        done = await callers.get(target).complete(request)
    except ModelCallError as exc:
        return PingResult(label, worker.id, exc.describe())
    except ConductorError as exc:
        return PingResult(label, worker.id, str(exc))
    return PingResult(label, worker.id, None, time.perf_counter() - t0, done.text.strip())
