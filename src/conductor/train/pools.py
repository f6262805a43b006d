"""Randomised pools: show the Conductor a random subset of the workers per question.

The paper fine-tunes with each question restricted to a random k-of-n subset of the pool,
so one Conductor learns to work with whatever pool a user gives it.  The subset is
listed to the Conductor renumbered from "Model 0" (in a random order, so no worker owns
an ordinal), and the workflow it writes is executed on that sub-pool, whose workers keep
their ids, so records and metrics name the real workers.  :func:`map_back` turns a
workflow's sub-pool ordinals into full-pool ordinals where those are wanted.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..pool import Pool
from ..targets import Worker
from ..text import plural
from ..workflow import Step, Workflow

if TYPE_CHECKING:
    from ..conductors.spec import Conductor
    from .settings import TrainConfig

__all__ = [
    "SubPool",
    "load_train_pool",
    "map_back",
    "sample_subpool",
    "subpool_from_ids",
    "training_conductor",
]


@dataclass(frozen=True)
class SubPool:
    """The workers listed to the Conductor for one question.

    ``pool`` holds only the sampled workers, in the order the Conductor sees them;
    ``original_index[i]`` is the full-pool index of ``pool.workers[i]``.
    """

    pool: Pool
    original_index: tuple[int, ...]

    @property
    def worker_ids(self) -> list[str]:
        """The listed workers' ids, in order (what a dataset row stores)."""
        return [w.id for w in self.pool.workers]


def _subpool(pool: Pool, indices: Sequence[int]) -> SubPool:
    workers = tuple(pool.workers[i] for i in indices)
    sub = replace(pool, name=f"{pool.name}[{','.join(w.id for w in workers)}]", workers=workers)
    return SubPool(pool=sub, original_index=tuple(indices))


def sample_subpool(pool: Pool, rng: random.Random, k_min: int, k_max: int) -> SubPool:
    """A random subset of ``k`` workers, ``k`` uniform in ``k_min..min(k_max, n)``.

    The subset comes in random order.  Raises :class:`UsageError` when ``k_min`` is below
    1, above ``k_max``, or above the pool's size.
    """
    n = len(pool.workers)
    if k_min < 1 or k_min > k_max:
        raise UsageError(f"randomise_pool needs 1 <= k_min <= k_max, got {k_min}..{k_max}")
    if k_min > n:
        raise UsageError(
            f"randomise_pool.k_min is {k_min} but pool {pool.name!r} has only {plural(n, 'worker')}"
        )
    k = rng.randint(k_min, min(k_max, n))
    return _subpool(pool, rng.sample(range(n), k))


def subpool_from_ids(pool: Pool, worker_ids: Sequence[str]) -> SubPool:
    """The sub-pool listing ``worker_ids`` in that order (as stored in a dataset row).

    Raises :class:`UsageError` for an id the pool does not have.
    """
    index = {w.id: i for i, w in enumerate(pool.workers)}
    missing = [wid for wid in worker_ids if wid not in index]
    if missing:
        raise UsageError(
            f"pool {pool.name!r} has no worker {', '.join(map(repr, missing))} "
            f"(it has: {', '.join(index)})"
        )
    if not worker_ids:
        raise UsageError("a sub-pool needs at least one worker")
    return _subpool(pool, [index[wid] for wid in worker_ids])


def map_back(workflow: Workflow, sub: SubPool) -> Workflow:
    """``workflow`` with each step's worker ordinal turned from a sub-pool index into the
    full pool's index.  Raises :class:`UsageError` for an ordinal outside the sub-pool."""
    steps = []
    for i, step in enumerate(workflow.steps):
        if not 0 <= step.worker < len(sub.original_index):
            raise UsageError(
                f"step {i} names Model {step.worker}, but the sub-pool lists only "
                f"{plural(len(sub.original_index), 'worker')}"
            )
        steps.append(Step(sub.original_index[step.worker], step.subtask, step.access))
    return Workflow(tuple(steps))


def load_train_pool(config: TrainConfig) -> Pool:
    """The pool ``config`` trains over, with ``worker_max_tokens`` applied to every
    worker (the paper's workers had 4096 tokens during training)."""
    from ..pool import load_pool

    pool = load_pool(config.pool)
    if config.worker_max_tokens is None:
        return pool
    workers = tuple(
        replace(w, params={**w.params, "max_tokens": config.worker_max_tokens})
        for w in pool.workers
    )
    return replace(pool, workers=workers)


def training_conductor(config: TrainConfig, pool: Pool) -> Conductor:
    """The Conductor settings prompts and rewards are built with during training.

    Its model target is never called (the policy's replies are given to the executor
    as plans); what matters is the template, step limit, description setting and
    ``subtasks`` (the instructions a ``choose``-style Conductor picks from: listed in
    the prompt as ``${subtasks}``, and a rollout using another is unparsed, as the
    grammar would not have let it be written).  The pool's ``conductor:`` section is
    used where it resolves, with the config's template and ``max_steps`` on top; a
    pool without one (or with a checkpoint Conductor, which would be loaded to
    resolve, or one that does not resolve here) gets a stand-in target named
    ``policy`` with the section's ``show_descriptions`` and ``subtasks``.
    """
    from ..conductors.spec import Conductor, resolve_conductor

    cfg = pool.conductor
    if cfg is not None and cfg.backend != "checkpoint":
        try:
            return resolve_conductor(pool, max_steps=config.max_steps, template=config.template)
        except UsageError:
            pass
    return Conductor(
        backend="prompted",
        target=Worker(id="conductor", model="policy"),
        template=config.template,
        max_steps=config.max_steps,
        show_descriptions=cfg.show_descriptions if cfg is not None else False,
        subtasks=cfg.subtasks if cfg is not None else (),
    )
