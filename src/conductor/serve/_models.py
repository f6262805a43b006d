"""The models ``conductor serve`` offers, and the strategy that answers each.

``conductor`` is the pool's Conductor (or the one ``--conductor`` names); every
baseline of ``conductor bench --strategy`` is a virtual model beside it:
``single:WORKER`` for each worker, ``moa`` (and ``moa:AGGREGATOR``), and the patterns
``vote:K:W`` and ``reflect:K:W``, listed literally and accepted for any worker and
any K up to the server's ``max_k`` (checked on the name, before anything is built).
Every strategy is built on the one :class:`~conductor.llm.caller.CallerSet` of the
server, so all requests share clients, per-worker limits and the call cache.
"""

from __future__ import annotations

from typing import Any

from ..conductors.spec import Conductor
from ..errors import UsageError
from ..execute import RunSettings
from ..llm.caller import CallerSet
from ..pool import Pool
from ..strategies import (
    ConductorStrategy,
    Strategy,
    parse_strategy,
    short_answer_key,
)
from ._protocol import ApiError

__all__ = ["CONDUCTOR_MODEL", "Catalog", "model_list"]

#: The model id of the pool's Conductor.
CONDUCTOR_MODEL = "conductor"

#: How many strategies a server keeps built (``vote:K:W`` can name many).
_KEEP = 256


def model_list(pool: Pool, created: int) -> dict[str, Any]:
    """The body of ``GET /v1/models``."""

    def entry(model_id: str, kind: str, pattern: bool = False) -> dict[str, Any]:
        return {
            "id": model_id,
            "object": "model",
            "created": created,
            "owned_by": "conductor",
            "conductor": {"pool": pool.name, "kind": kind, "pattern": pattern},
        }

    data = [entry(CONDUCTOR_MODEL, "conductor")]
    data += [entry(f"single:{w.id}", "baseline") for w in pool.workers]
    data.append(entry("moa", "baseline"))
    data += [entry(p, "baseline", pattern=True) for p in ("vote:K:W", "reflect:K:W")]
    return {"object": "list", "data": data}


class Catalog:
    """Resolves model names into strategies that share ``callers``."""

    def __init__(
        self,
        pool: Pool,
        conductor: Conductor,
        callers: CallerSet,
        settings: RunSettings,
        *,
        max_k: int | None = None,
    ) -> None:
        self.pool = pool
        self.max_k = max_k
        self.callers = callers
        self.settings = settings
        self.conductor: Strategy = ConductorStrategy(pool, conductor, settings, callers)
        self._fixed: dict[str, Strategy] = {}

    def resolve(self, model: str) -> Strategy:
        """The strategy for ``model``, or :class:`ApiError` 400 ``model_not_found``."""
        if model == CONDUCTOR_MODEL:
            return self.conductor
        known = self._fixed.get(model)
        if known is not None:
            return known
        if model == "singles" or model.startswith("conductor"):
            raise self._unknown(model, None)
        try:
            strategy = parse_strategy(
                model,
                self.pool,
                self.callers,
                vote_key=short_answer_key,
                settings=self.settings,
                max_k=self.max_k,
            )
        except UsageError as exc:
            raise self._unknown(model, str(exc)) from None
        if len(self._fixed) >= _KEEP:
            self._fixed.pop(next(iter(self._fixed)))
        self._fixed[model] = strategy
        return strategy

    def _unknown(self, model: str, why: str | None) -> ApiError:
        reason = why.removeprefix(f"--strategy {model}: ") if why else None
        detail = f" ({reason})" if reason and not reason.startswith("--strategy") else ""
        shown = model if len(model) <= 80 else f"{model[:40]}...({len(model):,} characters)"
        return ApiError(
            400,
            f"the model {shown!r} does not exist{detail}: use conductor, single:WORKER, "
            "moa, vote:K:WORKER or reflect:K:WORKER (GET /v1/models lists them)",
            param="model",
            code="model_not_found",
        )

    async def aclose(self) -> None:
        await self.callers.aclose()
