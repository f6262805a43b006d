"""``pools check``'s library half: one tiny request to every model of a pool.

:func:`check_pool` sends each worker (and the pool's Conductor, when it is not one of
the workers' models) one short request without retries, and returns a
:class:`PingResult` per model: the reply and latency, or the one-sentence error.  A
Conductor that cannot even be set up is a failed result of its own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .errors import ConductorError

if TYPE_CHECKING:
    from .llm.caller import CallerSet
    from .pool import Pool
    from .targets import Worker

__all__ = ["PingResult", "check_pool"]


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


def check_pool(pool: Pool, timeout_s: float) -> list[PingResult]:
    """Ping every worker of ``pool`` (and its Conductor), waiting at most ``timeout_s``
    seconds for each; the workers' results first, in pool order."""
    return asyncio.run(_ping_all(pool, timeout_s))


async def _ping_all(pool: Pool, timeout_s: float) -> list[PingResult]:
    from .conductors.spec import resolve_conductor
    from .llm.caller import CallerSet

    targets: list[tuple[str, Worker]] = [(f"Model {i}", w) for i, w in enumerate(pool.workers)]
    # A Conductor that cannot even be set up is a failed row of its own, not a silence.
    unusable: list[PingResult] = []
    if pool.conductor is not None:
        try:
            cond = resolve_conductor(pool)
            if cond.target.model not in {w.model for w in pool.workers}:
                targets.append(("Conductor", cond.target))
        except ConductorError as exc:
            unusable.append(PingResult("Conductor", "conductor", str(exc)))
    callers = CallerSet(None)
    try:
        pings = (_ping(callers, label, w, timeout_s) for label, w in targets)
        return [*await asyncio.gather(*pings), *unusable]
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
