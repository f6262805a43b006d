"""How many samples of a strategy to run at once: as many as the pool's models can
serve, and the warnings for a ``--concurrency`` above that, or above what one of them
serves alone."""

from __future__ import annotations

from ..errors import target_name
from ..llm.limiter import SampleCapacity, SampleShare, sample_capacity
from ..shipped import is_shipped
from ..text import plural, targets_named
from .base import Strategy

__all__ = [
    "DEFAULT_CONCURRENCY",
    "capped_warning",
    "concurrency_warning",
    "default_concurrency",
    "sample_capacity_of",
]

#: Samples in flight when ``--concurrency`` is not given, at most: fewer where the
#: pool's models cannot serve as many at once (:func:`default_concurrency`).
DEFAULT_CONCURRENCY = 16


def sample_capacity_of(strategy: Strategy) -> SampleCapacity:
    """How many samples of ``strategy`` the pool's models can all serve at once: the
    :func:`~conductor.llm.limiter.sample_capacity` of its
    :attr:`~conductor.strategies.Strategy.call_demand`."""
    return sample_capacity(list(strategy.call_demand))


def default_concurrency(strategy: Strategy) -> int:
    """Samples in flight when ``--concurrency`` is not given: as many as the pool's
    models can serve at once, at most :data:`DEFAULT_CONCURRENCY` (one, for a pool on
    one in-process model)."""
    capacity = sample_capacity_of(strategy)
    return max(1, min(DEFAULT_CONCURRENCY, capacity.samples))


def concurrency_warning(strategy: Strategy, concurrency: int) -> str | None:
    """The sentence to show once when more than ``concurrency`` samples in flight are
    more than the pool's models can serve at once (the extra ones would only wait),
    saying what to change: ``--concurrency``, or ``max_concurrency`` in the user's own
    pool file (a copy of a shipped pool, never the shipped file); ``None`` otherwise."""
    pool = strategy.pool
    capacity = sample_capacity_of(strategy)
    if concurrency <= capacity.samples:
        return None
    n = capacity.samples
    shares = ", ".join(_share_text(share) for share in capacity.shares)
    fix = f"give --concurrency {n}"
    if any(not share.in_process for share in capacity.shares):
        fix += f" or less, or raise max_concurrency in {_pool_file(strategy)}"
    return (
        f"--concurrency {concurrency} is more than the models of pool {pool.name!r} can "
        f"serve: at most {plural(n, 'sample')} can be calling a model at once ({shares}), "
        f"so {plural(concurrency - n, 'sample')} would only wait; {fix}"
    )


def capped_warning(strategy: Strategy, concurrency: int) -> str | None:
    """The sentence to show once when ``concurrency`` samples in flight are no more than
    the pool's models serve together, but more than one of them (a worker, the
    Conductor) serves alone: the samples beyond its ``max_concurrency`` wait for it in
    turn.  ``None`` when every model can serve them all at once.  (Above what they
    serve together, :func:`concurrency_warning` says so instead.)"""
    capped = [s for s in sample_capacity_of(strategy).shares if s.samples < concurrency]
    if not capped:
        return None
    ids = [i for share in capped for i in share.ids]
    shares = ", ".join(_share_text(share) for share in capped)
    one = len(ids) == 1
    text = (
        f"--concurrency {concurrency} is more than {targets_named(ids)} of pool "
        f"{strategy.pool.name!r} can {'serve' if one else 'each serve'} at once ({shares}): "
        f"the samples beyond that wait for {'it' if one else 'them'} in turn"
    )
    if any(not share.in_process for share in capped):
        text += (
            "; to serve more at once, raise max_concurrency (a worker's own, the "
            f"conductor: section's, or defaults: for every model) in {_pool_file(strategy)}"
        )
    return text


def _pool_file(strategy: Strategy) -> str:
    """Where a warning tells the user to change the pool: the user's own pool file, or a
    copy of a shipped one (never the shipped file itself)."""
    pool = strategy.pool
    if pool.path is None:
        return "the pool"
    if is_shipped("pool", pool.path):
        return (
            f"a copy of the shipped pool {pool.name!r} given with --pool "
            "(conductor pools list shows where the shipped pools are)"
        )
    return str(pool.path)


def _share_text(share: SampleShare) -> str:
    """One model's share of the samples, as the warning lists it."""
    if share.in_process:
        return (
            f"the in-process model {share.model!r} of {targets_named(share.ids)} takes one "
            "call at a time"
        )
    who = target_name(share.ids[0])
    if share.per_sample == 1:
        return f"{who} {share.samples}"
    return (
        f"{who} {share.samples} (max_concurrency {share.max_concurrency}, "
        f"{share.per_sample} calls per sample)"
    )
