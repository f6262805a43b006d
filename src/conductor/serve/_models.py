"""The models ``conductor serve`` offers, and the strategy that answers each.

``conductor`` is the pool's Conductor (or the one ``--conductor`` names); ``router``,
when the server was given ``--router DIR``, is that fitted router (its ``conductor``
arm, if it has one, is the server's Conductor); every
baseline of ``conductor bench --strategy`` is a virtual model beside it:
``single:WORKER`` for each worker, ``moa`` (and ``moa:AGGREGATOR``), and the patterns
``vote:K:W`` and ``reflect:K:W``, accepted for any worker and any K up to the
server's ``max_k`` (checked on the name, before anything is built) and listed as
patterns (the list body's ``conductor.patterns``), not as model ids a client would call
literally.  Every strategy is built on the one :class:`~conductor.llm.caller.CallerSet`
of the server, so all requests share clients, per-worker limits and the call cache.

Every id may be pinned to the pool's content, ``conductor@DIGEST``: the digest
(:func:`pool_digest`) covers what decides answers (the workers' models, parameters and
prompts, the Conductor's settings and template) and not how models are reached, paced
or paid for, so a client that pins an id is refused once the pool has changed.
``router``'s digest covers the router too (its head, arms, features and decision; not
where its directory lies): a router fitted again is another version.

A request restricted to some of the workers (an API key's ``allowed_workers``, or the
body's ``conductor.allowed_workers``) is answered on the sub-pool of those workers
(:func:`~conductor.train.pools.subpool_from_ids`, as randomised-pool training lists
them): the Conductor is shown only them, numbered from Model 0, and ``moa`` asks only
them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..conductors.spec import Conductor
from ..errors import UsageError
from ..execute import RunSettings
from ..llm.caller import CallerSet
from ..pool import RUNTIME_FIELDS, Pool, pool_to_public_dict
from ..router import load_router
from ..strategies import (
    ConductorStrategy,
    Strategy,
    parse_strategy,
    short_answer_key,
)
from ..train.pools import subpool_from_ids
from ._protocol import ApiError

__all__ = [
    "CONDUCTOR_MODEL",
    "ROUTER_MODEL",
    "Catalog",
    "WorkersOutside",
    "model_entry",
    "model_list",
    "pool_digest",
]

#: The model id of the pool's Conductor.
CONDUCTOR_MODEL = "conductor"
#: The model id of the server's router (``serve --router DIR``).
ROUTER_MODEL = "router"

#: How many strategies a server keeps built (``vote:K:W`` and the allowed sets can name
#: many).
_KEEP = 256

#: How many hex digits of the pool's SHA-256 a pinned id carries.
_DIGEST_CHARS = 12
_PINNED = re.compile(rf"^(?P<base>.+)@(?P<digest>[0-9a-f]{{{_DIGEST_CHARS}}})$")
_PATTERNS = ("vote:K:W", "reflect:K:W")


def _answer_fields(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _answer_fields(v) for k, v in tree.items() if k not in RUNTIME_FIELDS}
    if isinstance(tree, list):
        return [_answer_fields(v) for v in tree]
    return tree


def pool_digest(pool: Pool, conductor: dict[str, Any]) -> str:
    """A short digest of what decides ``pool``'s answers: its workers as a record
    describes them and the Conductor strategy's description, less the fields that say
    how models are reached, paced and paid for (:data:`~conductor.pool.RUNTIME_FIELDS`).
    The pool's name and file path are left out too: a renamed or moved pool answers
    as before."""
    identity = {
        "v": 1,
        "workers": pool_to_public_dict(pool)["workers"],
        "conductor": conductor,
    }
    return _short_digest(_answer_fields(identity))


def _extended(digest: str, identity: dict[str, Any]) -> str:
    """``digest`` combined with ``identity`` (what else decides a model's answers)."""
    return _short_digest({"pool": digest, "identity": identity})


def _short_digest(value: Any) -> str:
    """The first characters of the SHA-256 of ``value`` as canonical JSON."""
    blob = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:_DIGEST_CHARS]


class WorkersOutside(Exception):
    """A model names workers outside the request's allowed ones (``workers``)."""

    def __init__(self, model: str, workers: list[str]) -> None:
        super().__init__(f"{model}: {', '.join(workers)}")
        self.model = model
        self.workers = workers


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
        router: Path | None = None,
    ) -> None:
        self.pool = pool
        self.max_k = max_k
        self.callers = callers
        self.settings = settings
        self._conductor = conductor
        self.conductor: Strategy = ConductorStrategy(pool, conductor, settings, callers)
        self._router = router
        #: The router directory, read once (every allowed set of workers builds its
        #: model ``router`` from it).
        self._routed = load_router(router) if router is not None else None
        #: The model ``router`` on the whole pool, built (and its directory checked) at
        #: once, so that a server with a bad router does not start.
        self.router: Strategy | None = (
            self._router_on(pool, self.conductor) if router is not None else None
        )
        self.digest = pool_digest(pool, self.conductor.describe())
        self._router_digest = (
            _extended(self.digest, self.router.describe()["router"])
            if self.router is not None
            else None
        )
        # Keyed by the allowed workers (None: all) and the model: each allowed set's
        # strategies are built once.
        self._built: dict[tuple[tuple[str, ...] | None, str], Strategy] = {}

    def resolve(self, model: str, workers: tuple[str, ...] | None = None) -> Strategy:
        """The strategy for ``model`` on the sub-pool of ``workers`` (``None``: the whole
        pool), or :class:`ApiError` 400 ``model_not_found``, or :class:`WorkersOutside`
        for a model that names a worker outside ``workers``."""
        model = self.unpinned(model)
        if model == CONDUCTOR_MODEL and workers is None:
            return self.conductor
        if model == ROUTER_MODEL and workers is None and self.router is not None:
            return self.router
        known = self._built.get((workers, model))
        if known is not None:
            return known
        pool = self._pool(workers)
        strategy: Strategy
        if model == CONDUCTOR_MODEL:
            strategy = ConductorStrategy(pool, self._conductor, self.settings, self.callers)
        elif model == ROUTER_MODEL:
            strategy = self._restricted_router(pool, workers)
        else:
            if model == "singles" or model.startswith("conductor"):
                raise self._unknown(model, None)
            try:
                strategy = self._baseline(model, pool)
            except UsageError as exc:
                if workers is not None:
                    self._check_outside(model, workers)
                raise self._unknown(model, str(exc)) from None
        if len(self._built) >= _KEEP:
            self._built.pop(next(iter(self._built)))
        self._built[(workers, model)] = strategy
        return strategy

    def unpinned(self, model: str) -> str:
        """``model`` without its ``@DIGEST``, or 400 ``model_not_found`` when the digest
        is not this pool's."""
        pinned = _PINNED.match(model)
        if pinned is None:
            return model
        base, digest = pinned["base"], pinned["digest"]
        current = self.digest_of(base)
        if digest != current:
            what = "router" if base == ROUTER_MODEL else "pool"
            raise ApiError(
                400,
                f"the model {model!r} is pinned to {what} version {digest}, but this "
                f"server's {what} has changed: it is now {current} (use {base}@{current}, "
                f"or {base} for the {what} as it is)",
                param="model",
                code="model_not_found",
            )
        return base

    def digest_of(self, model: str) -> str:
        """The version ``model`` (unpinned) is pinned to: the pool's digest, extended by
        the router's identity for ``router``."""
        if model == ROUTER_MODEL and self._router_digest is not None:
            return self._router_digest
        return self.digest

    def _router_on(self, pool: Pool, conductor: Strategy) -> Strategy:
        from ..strategies.router import ROUTER_PREFIX, router_strategy

        assert self._router is not None
        return router_strategy(
            f"{ROUTER_PREFIX}{self._router}",
            pool,
            self.callers,
            conductor=lambda: conductor,
            vote_key=short_answer_key,
            settings=self.settings,
            name=ROUTER_MODEL,
            routed=self._routed,
        )

    def _restricted_router(self, pool: Pool, workers: tuple[str, ...] | None) -> Strategy:
        """The router on the sub-pool of ``workers``: 400 when the server has none,
        :class:`WorkersOutside` when an arm needs a worker outside them."""
        if self.router is None:
            raise self._unknown(ROUTER_MODEL, "this server was started without --router DIR")
        assert workers is not None
        outside = [
            t.id for t in self.router.targets if t in self.pool.workers and t.id not in workers
        ]
        if outside:
            raise WorkersOutside(ROUTER_MODEL, list(dict.fromkeys(outside)))
        conductor = ConductorStrategy(pool, self._conductor, self.settings, self.callers)
        return self._router_on(pool, conductor)

    def _pool(self, workers: tuple[str, ...] | None) -> Pool:
        return self.pool if workers is None else subpool_from_ids(self.pool, workers).pool

    def _baseline(self, model: str, pool: Pool) -> Strategy:
        return parse_strategy(
            model,
            pool,
            self.callers,
            vote_key=short_answer_key,
            settings=self.settings,
            max_k=self.max_k,
        )

    def _check_outside(self, model: str, workers: tuple[str, ...]) -> None:
        """Raise :class:`WorkersOutside` when ``model`` resolves once one of the workers
        left out is added back (``single:w2`` when w2 is not allowed)."""
        outside = []
        for w in self.pool.workers:
            if w.id in workers:
                continue
            wider = tuple(v.id for v in self.pool.workers if v.id in workers or v.id == w.id)
            try:
                self._baseline(model, self._pool(wider))
            except UsageError:
                continue
            outside.append(w.id)
        if outside:
            raise WorkersOutside(model, outside)

    def _unknown(self, model: str, why: str | None) -> ApiError:
        reason = why.removeprefix(f"--strategy {model}: ") if why else None
        detail = f" ({reason})" if reason and not reason.startswith("--strategy") else ""
        shown = model if len(model) <= 80 else f"{model[:40]}...({len(model):,} characters)"
        return ApiError(
            400,
            f"the model {shown!r} does not exist{detail}: use conductor, "
            f"{'router, ' if self.router is not None else ''}single:WORKER, "
            "moa, vote:K:WORKER or reflect:K:WORKER (GET /v1/models lists them)",
            param="model",
            code="model_not_found",
        )

    async def aclose(self) -> None:
        await self.callers.aclose()


def model_entry(catalog: Catalog, created: int, model_id: str) -> dict[str, Any]:
    """One model as ``GET /v1/models`` lists it (``model_id`` may be pinned or a
    pattern's instance such as ``vote:3:w0``)."""
    base = catalog.unpinned(model_id)
    kind, _, _rest = base.partition(":")
    pattern = next((p for p in _PATTERNS if p.startswith(f"{kind}:")), None)
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "conductor",
        "conductor": {
            "pool": catalog.pool.name,
            "kind": {CONDUCTOR_MODEL: "conductor", ROUTER_MODEL: "router"}.get(base, "baseline"),
            "pattern": pattern,
            "pinned": base != model_id,
            "pool_digest": catalog.digest,
            "digest": catalog.digest_of(base),
        },
    }


def model_list(
    catalog: Catalog, created: int, workers: Sequence[str] | None = None
) -> dict[str, Any]:
    """The body of ``GET /v1/models`` for a caller that may use ``workers`` (``None``:
    all): each model plain, then each pinned to the pool's digest; the patterns in
    ``conductor.patterns``."""
    ids = [w.id for w in catalog.pool.workers if workers is None or w.id in workers]
    routed = [ROUTER_MODEL] if catalog.router is not None else []
    plain = [CONDUCTOR_MODEL, *routed, *(f"single:{w}" for w in ids), "moa"]
    pinned = [f"{m}@{catalog.digest_of(m)}" for m in plain]
    return {
        "object": "list",
        "data": [model_entry(catalog, created, m) for m in (*plain, *pinned)],
        "conductor": {
            "pool": catalog.pool.name,
            "pool_digest": catalog.digest,
            "workers": ids,
            "patterns": [
                {
                    "pattern": p,
                    "k_min": 1,
                    "k_max": catalog.max_k,
                    "example": p.replace("K", "3").replace(":W", f":{ids[0]}"),
                }
                for p in _PATTERNS
            ],
        },
    }
