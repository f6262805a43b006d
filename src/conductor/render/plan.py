"""The topology tree of a run and the words for who sees whom.

The plan itself (the steps, who sees whom, waves, the topology's name) is read from
the record by :mod:`conductor.shapes`, which the step table, the traces, the Mermaid
export and the HTML view share.
"""

from __future__ import annotations

from rich.text import Text
from rich.tree import Tree

from ..record import RunRecord
from ..shapes import PlanStep, plan_waves, round_plan, sees_all, topology_kind
from ..text import plural
from .format import one_line, round_label, shown


def sees_short(p: PlanStep) -> str:
    """Which earlier steps ``p`` sees: ``"all earlier"``, ``"0, 2"`` or ``"nothing"``."""
    if not p.visible:
        return "nothing"
    if sees_all(p):
        return "all earlier"
    return ", ".join(str(j) for j in p.visible)


def sees_label(p: PlanStep, later_round: bool = False) -> str:
    """``sees: 0, 2`` for step ``p``; in a ``later_round`` a step given ``all`` also says
    that it sees the earlier rounds' history (``sees: all earlier (+ earlier rounds)``)."""
    text = f"sees: {sees_short(p)}"
    # Workers given "all" in a recursive round also see the earlier rounds' history.
    if later_round and "all" in p.access:
        text += " (+ earlier rounds)"
    return text


def _flow_summary(plan: list[PlanStep]) -> str:
    """E.g. ``steps 0, 1, 2 run in parallel -> step 3 sees all``."""
    by_index = {p.index: p for p in plan}
    parts: list[str] = []
    for w, group in enumerate(plan_waves(plan)):
        if len(group) > 1:
            parts.append(f"steps {', '.join(map(str, group))} run in parallel")
            continue
        p = by_index[group[0]]
        if w == 0:
            parts.append(f"step {p.index}")
        else:
            sees = "all" if sees_all(p) else ", ".join(map(str, p.visible))
            parts.append(f"step {p.index} sees {sees}")
    return " -> ".join(parts)


def _step_label(p: PlanStep, later_round: bool) -> Text:
    label = Text()
    label.append(f"step {p.index}", style="bold")
    label.append(f"  {p.worker_id}", style="cyan")
    label.append(f" (Model {p.worker_index})", style="dim")
    label.append(f"  {sees_label(p, later_round)}")
    if p.status == "failed":
        label.append(f"  failed ({p.error_kind or 'error'})", style="red")
    elif p.status == "skipped":
        label.append("  skipped", style="yellow")
    label.append(f'\n"{one_line(p.subtask)}"', style="dim")
    return label


def topology(record: RunRecord) -> Tree:
    """Per round, the workflow as a topology tree with parallel waves marked."""
    record = shown(record)
    tree = Tree(Text(f"Run {record.run_id} · {record.status}", style="bold"))
    if not record.rounds:
        tree.add(Text("no rounds ran", style="yellow"))
    for pos, rnd in enumerate(record.rounds, 1):
        kind = topology_kind(rnd)
        plan = round_plan(rnd, record.pool)
        if not plan:
            if kind == "kept previous answer":
                tree.add(Text(f"{round_label(pos)}: kept previous answer", style="green"))
            else:
                tries = plural(len(rnd.conductor_calls), "try", "tries")
                tree.add(
                    Text(
                        f"{round_label(pos)}: no workflow "
                        f"(the Conductor gave no usable plan in {tries})",
                        style="red",
                    )
                )
            continue
        count = plural(len(plan), "step", "steps")
        node = tree.add(Text(f"{round_label(pos)}: {kind} ({count})", style="bold"))
        if len(plan) > 1:
            node.add(Text(f"flow: {_flow_summary(plan)}", style="italic"))
        by_index = {p.index: p for p in plan}
        waves = plan_waves(plan)
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
