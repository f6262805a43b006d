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
    wf = rnd.workflow or {}
    ids = wf.get("model_id") or []
    subtasks = wf.get("subtasks") or []
    access = wf.get("access_list") or []
    out: list[PlanStep] = []
    for i, mid in enumerate(ids):
        acc = list(access[i]) if i < len(access) and isinstance(access[i], list) else []
        if "all" in acc:
            vis: tuple[int, ...] = tuple(range(i))
        else:
            vis = tuple(j for j in acc if isinstance(j, int) and 0 <= j < i)
        wid = int(mid) if isinstance(mid, int) else -1
        sub = str(subtasks[i]) if i < len(subtasks) else ""
        out.append(PlanStep(i, wid, _pool_worker_id(pool, wid), sub, acc, vis, "planned", None))
    return out


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
    wf = rnd.workflow
    return wf is not None and not (wf.get("model_id") or [])


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
