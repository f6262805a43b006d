"""The members of the `Strategy` protocol every strategy offers: its pool, the targets
a run calls (for the key check) and how many calls at once (for the capacity), and the
plan a baseline records, written by the one writer of the recorded workflow."""

from __future__ import annotations

import dataclasses

import pytest

from conductor.conductors.spec import resolve_conductor
from conductor.execute import RunSettings
from conductor.llm.caller import CallerSet
from conductor.llm.limiter import sample_capacity
from conductor.pool import Pool, load_pool, resolve_pool_path
from conductor.strategies import (
    MOA_INSTRUCTION,
    REFLECT_INSTRUCTION,
    ConductorStrategy,
    Strategy,
    parse_strategy,
    sample_capacity_of,
)
from conductor.workflow import ALL, Step, workflow_from_dict


@pytest.fixture
def pool() -> Pool:
    return load_pool(resolve_pool_path("frontier"))


def test_the_conductor_calls_its_target_and_every_worker(pool: Pool) -> None:
    conductor = resolve_conductor(pool)
    strategy: Strategy = ConductorStrategy(pool, conductor, RunSettings(), CallerSet(None))
    workers = tuple(pool.workers)
    assert strategy.pool is pool
    assert strategy.targets == (*workers, conductor.target)
    assert strategy.call_demand == ((conductor.target, 1), *((w, 1) for w in workers))
    assert sample_capacity_of(strategy) == sample_capacity(list(strategy.call_demand))


@pytest.mark.parametrize(
    ("name", "targets", "demand"),
    [
        ("single:{1}", [1], [(1, 1)]),
        ("vote:3:{0}", [0, 0, 0], [(0, 3)]),
        ("reflect:2:{1}", [1, 1, 1], [(1, 1)]),
        ("moa", [0, 1, 2, 0], [(0, 1), (1, 1), (2, 1)]),
        ("moa:{2}", [0, 1, 2, 2], [(0, 1), (1, 1), (2, 1)]),
    ],
)
def test_a_baseline_calls_the_workers_of_its_plan(
    pool: Pool, name: str, targets: list[int], demand: list[tuple[int, int]]
) -> None:
    workers = pool.workers[:3]
    pool = dataclasses.replace(pool, workers=workers)
    text = name.format(*(w.id for w in workers))
    strategy: Strategy = parse_strategy(text, pool, CallerSet(None), vote_key=lambda t: t)
    assert strategy.pool is pool
    assert strategy.targets == tuple(workers[i] for i in targets)
    assert strategy.call_demand == tuple((workers[i], n) for i, n in demand)


def test_a_baseline_records_its_plan_as_its_config_describes_it(pool: Pool) -> None:
    first = pool.workers[0].id
    n = len(pool.workers)
    moa = parse_strategy("moa", pool, CallerSet(None))
    planned = workflow_from_dict(moa.describe()["workflow"], n_workers=n)
    proposers = tuple(Step(i, "(the task as given)") for i in range(n))
    assert planned.steps == (*proposers, Step(0, MOA_INSTRUCTION, tuple(range(n))))
    reflect = parse_strategy(f"reflect:1:{first}", pool, CallerSet(None))
    planned = workflow_from_dict(reflect.describe()["workflow"], n_workers=n)
    assert planned.steps == (Step(0, "(the task as given)"), Step(0, REFLECT_INSTRUCTION, (0,)))
    assert planned.steps[1].access != ALL  # the earlier step by number, as recorded
