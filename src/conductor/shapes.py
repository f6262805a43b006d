"""The shape of a recorded round: its plan (the steps, who sees whom), each step's
depth in the dependency graph, the waves that can run at once, and the topology's name.

Read from a :class:`~conductor.record.RoundRecord` (the executed steps, else the parsed
workflow), with no rendering: the terminal views (:mod:`conductor.render`), the bench
summary's topology counts and the HTML view's graphs all take the shape from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .record import RoundRecord
from .workflow import workflow_from_dict

__all__ = [
    "PlanStep",
    "is_empty_workflow",
    "plan_depths",
    "plan_waves",
    "round_plan",
    "sees_all",
    "topology_kind",
]


@dataclass(frozen=True)
class PlanStep:
    index: int
    worker_index: int
    worker_id: str
    subtask: str
    access: list[Any]
    visible: tuple[int, ...]
    status: str
    error_kind: str | None


def _pool_worker_id(pool: dict[str, Any] | None, index: int) -> str:
    workers = (pool or {}).get("workers")
    if isinstance(workers, list) and 0 <= index < len(workers):
        w = workers[index]
        if isinstance(w, dict) and w.get("id"):
            return str(w["id"])
    return f"Model {index}"


def round_plan(rnd: RoundRecord, pool: dict[str, Any] | None = None) -> list[PlanStep]:
    """The round's steps; from the executed steps, else from the parsed workflow."""
    if rnd.steps:
        return [
            PlanStep(
                s.index,
                s.worker_index,
                s.worker_id,
                s.subtask,
                list(s.access),
                tuple(s.visible_steps),
                s.status,
                s.call.error_kind,
            )
            for s in rnd.steps
        ]
    if rnd.workflow is None:
        return []
    planned = workflow_from_dict(rnd.workflow, lenient=True)
    return [
        PlanStep(
            i,
            step.worker,
            _pool_worker_id(pool, step.worker),
            step.subtask,
            step.recorded_access(),
            step.visible(i),
            "planned",
            None,
        )
        for i, step in enumerate(planned.steps)
    ]


def plan_depths(plan: list[PlanStep]) -> dict[int, int]:
    """Longest-path depth of each step in the dependency graph: its wave."""
    depth: dict[int, int] = {}
    for p in sorted(plan, key=lambda p: p.index):
        deps = [depth[j] for j in p.visible if j in depth]
        depth[p.index] = 1 + max(deps) if deps else 0
    return depth


def plan_waves(plan: list[PlanStep]) -> list[list[int]]:
    """Step indices grouped by wave: each group can run at once."""
    depth = plan_depths(plan)
    groups: dict[int, list[int]] = {}
    for idx, d in depth.items():
        groups.setdefault(d, []).append(idx)
    return [sorted(groups[d]) for d in sorted(groups)]


def sees_all(p: PlanStep) -> bool:
    return p.index > 0 and p.visible == tuple(range(p.index))


def is_empty_workflow(rnd: RoundRecord) -> bool:
    return rnd.workflow is not None and workflow_from_dict(rnd.workflow, lenient=True).is_empty


def topology_kind(round: RoundRecord) -> str:
    """Name the shape of one round's workflow.

    One of ``"single call"``, ``"chain"``, ``"parallel attempts + judge"``,
    ``"parallel (independent)"``, ``"mixed DAG"``, ``"kept previous answer"`` (an
    empty recursive round) or ``"no workflow"`` (the Conductor's replies never parsed).
    """
    plan = round_plan(round)
    if not plan:
        return "kept previous answer" if is_empty_workflow(round) else "no workflow"
    n = len(plan)
    if n == 1:
        return "single call"
    if all(not p.visible for p in plan):
        return "parallel (independent)"
    depth = plan_depths(plan)
    if all(depth[p.index] == pos for pos, p in enumerate(plan)):
        return "chain"
    *first, last = plan
    attempts = {p.index for p in first}
    if len(first) >= 2 and all(not p.visible for p in first) and set(last.visible) == attempts:
        return "parallel attempts + judge"
    return "mixed DAG"
