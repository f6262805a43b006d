"""A round's plan and its shape: the steps, who sees whom, parallel waves, the topology tree.

The plan comes from the executed steps, else from the parsed workflow; the step
table, the traces and the Mermaid export all read it through :func:`_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text
from rich.tree import Tree

from ..record import RoundRecord, RunRecord
from ..text import plural
from .format import _one_line, _round_label, _shown


@dataclass(frozen=True)
class _PlanStep:
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


def _plan(rnd: RoundRecord, pool: dict[str, Any] | None = None) -> list[_PlanStep]:
    """The round's steps; from the executed steps, else from the parsed workflow."""
    if rnd.steps:
        return [
            _PlanStep(
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
    out: list[_PlanStep] = []
    for i, mid in enumerate(ids):
        acc = list(access[i]) if i < len(access) and isinstance(access[i], list) else []
        if "all" in acc:
            vis: tuple[int, ...] = tuple(range(i))
        else:
            vis = tuple(j for j in acc if isinstance(j, int) and 0 <= j < i)
        wid = int(mid) if isinstance(mid, int) else -1
        sub = str(subtasks[i]) if i < len(subtasks) else ""
        out.append(_PlanStep(i, wid, _pool_worker_id(pool, wid), sub, acc, vis, "planned", None))
    return out


def _depths(plan: list[_PlanStep]) -> dict[int, int]:
    """Longest-path depth of each step in the dependency graph: its wave."""
    depth: dict[int, int] = {}
    for p in sorted(plan, key=lambda p: p.index):
        deps = [depth[j] for j in p.visible if j in depth]
        depth[p.index] = 1 + max(deps) if deps else 0
    return depth


def _waves(plan: list[_PlanStep]) -> list[list[int]]:
    """Step indices grouped by wave: each group can run at once."""
    depth = _depths(plan)
    groups: dict[int, list[int]] = {}
    for idx, d in depth.items():
        groups.setdefault(d, []).append(idx)
    return [sorted(groups[d]) for d in sorted(groups)]


def _sees_all(p: _PlanStep) -> bool:
    return p.index > 0 and p.visible == tuple(range(p.index))


def _sees_short(p: _PlanStep) -> str:
    """``"all earlier"``, ``"0, 2"`` or ``"nothing"``."""
    if not p.visible:
        return "nothing"
    if _sees_all(p):
        return "all earlier"
    return ", ".join(str(j) for j in p.visible)


def _sees(p: _PlanStep, later_round: bool = False) -> str:
    text = f"sees: {_sees_short(p)}"
    # Workers given "all" in a recursive round also see the earlier rounds' history.
    if later_round and "all" in p.access:
        text += " (+ earlier rounds)"
    return text


def _is_empty_workflow(rnd: RoundRecord) -> bool:
    wf = rnd.workflow
    return wf is not None and not (wf.get("model_id") or [])


def topology_kind(round: RoundRecord) -> str:
    """Name the shape of one round's workflow.

    One of ``"single call"``, ``"chain"``, ``"parallel attempts + judge"``,
    ``"parallel (independent)"``, ``"mixed DAG"``, ``"kept previous answer"`` (an
    empty recursive round) or ``"no workflow"`` (the Conductor's replies never parsed).
    """
    plan = _plan(round)
    if not plan:
        return "kept previous answer" if _is_empty_workflow(round) else "no workflow"
    n = len(plan)
    if n == 1:
        return "single call"
    if all(not p.visible for p in plan):
        return "parallel (independent)"
    depth = _depths(plan)
    if all(depth[p.index] == pos for pos, p in enumerate(plan)):
        return "chain"
    *first, last = plan
    attempts = {p.index for p in first}
    if len(first) >= 2 and all(not p.visible for p in first) and set(last.visible) == attempts:
        return "parallel attempts + judge"
    return "mixed DAG"


def _flow_summary(plan: list[_PlanStep]) -> str:
    """E.g. ``steps 0, 1, 2 run in parallel -> step 3 sees all``."""
    by_index = {p.index: p for p in plan}
    parts: list[str] = []
    for w, group in enumerate(_waves(plan)):
        if len(group) > 1:
            parts.append(f"steps {', '.join(map(str, group))} run in parallel")
            continue
        p = by_index[group[0]]
        if w == 0:
            parts.append(f"step {p.index}")
        else:
            sees = "all" if _sees_all(p) else ", ".join(map(str, p.visible))
            parts.append(f"step {p.index} sees {sees}")
    return " -> ".join(parts)


def _step_label(p: _PlanStep, later_round: bool) -> Text:
    label = Text()
    label.append(f"step {p.index}", style="bold")
    label.append(f"  {p.worker_id}", style="cyan")
    label.append(f" (Model {p.worker_index})", style="dim")
    label.append(f"  {_sees(p, later_round)}")
    if p.status == "failed":
        label.append(f"  failed ({p.error_kind or 'error'})", style="red")
    elif p.status == "skipped":
        label.append("  skipped", style="yellow")
    label.append(f'\n"{_one_line(p.subtask)}"', style="dim")
    return label


def topology(record: RunRecord) -> Tree:
    """Per round, the workflow as a topology tree with parallel waves marked."""
    record = _shown(record)
    tree = Tree(Text(f"Run {record.run_id} · {record.status}", style="bold"))
    if not record.rounds:
        tree.add(Text("no rounds ran", style="yellow"))
    for pos, rnd in enumerate(record.rounds, 1):
        kind = topology_kind(rnd)
        plan = _plan(rnd, record.pool)
        if not plan:
            if kind == "kept previous answer":
                tree.add(Text(f"{_round_label(pos)}: kept previous answer", style="green"))
            else:
                tries = plural(len(rnd.conductor_calls), "try", "tries")
                tree.add(
                    Text(
                        f"{_round_label(pos)}: no workflow "
                        f"(the Conductor gave no usable plan in {tries})",
                        style="red",
                    )
                )
            continue
        count = plural(len(plan), "step", "steps")
        node = tree.add(Text(f"{_round_label(pos)}: {kind} ({count})", style="bold"))
        if len(plan) > 1:
            node.add(Text(f"flow: {_flow_summary(plan)}", style="italic"))
        by_index = {p.index: p for p in plan}
        waves = _waves(plan)
        later = pos > 1
        if all(len(g) == 1 for g in waves):
            for p in plan:
                node.add(_step_label(p, later))
            continue
        for w, group in enumerate(waves, 1):
            if len(group) > 1:
                head = f"wave {w}: steps {', '.join(map(str, group))} run in parallel"
            else:
                head = f"wave {w}: step {group[0]}"
            wave_node = node.add(Text(head, style="magenta"))
            for idx in group:
                wave_node.add(_step_label(by_index[idx], later))
    return tree
