"""Detailed traces of a run (``conductor trace``): tables per round, or a tree of calls
with the messages sent.
"""

from __future__ import annotations

from typing import Literal

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ..record import CallRecord, RoundRecord, RunRecord
from ..shapes import is_empty_workflow, round_plan, topology_kind
from ..text import plural
from .calls import answer_panel, conductor_tries, step_status, totals_line
from .format import clip, clip_middle, format_usd, one_line, round_label, shown
from .plan import sees_label
from .samples import grade_lines, grade_panel, is_bench_sample, sample_heading, verdict_style


def _conductor_table(rnd: RoundRecord) -> Table:
    table = Table(title="Conductor", title_justify="left", expand=True, show_lines=True)
    table.add_column("try", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("output / parse error", ratio=1, overflow="fold")
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("s", justify="right", no_wrap=True)
    tries = conductor_tries(rnd)
    for k, c, st, err in tries:
        body = Text(clip_middle(c.reply))  # the prefill, if any, and the continuation
        if err:
            body.append(f"\nparse error: {err}", style="yellow")
        elif c.error:
            body.append(f"\nerror: {clip(c.error)}", style="red")
        status = Text(st + (" (cached)" if c.cached else "") + (" (batch)" if c.batch else ""))
        table.add_row(
            str(k),
            status,
            body,
            f"{c.input_tokens}/{c.output_tokens}",
            f"{c.latency_s:.2f}",
        )
    # Parse errors the calls do not account for (the record keeps them apart) still show.
    used = sum(1 for t in tries if t[2] == "parse error")
    for err in rnd.parse_errors[used:]:
        table.add_row("-", "parse error", Text(err, style="yellow"), "", "")
    return table


def _steps_detail_table(rnd: RoundRecord, later: bool) -> Table:
    table = Table(title="Steps", title_justify="left", expand=True, show_lines=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("worker")
    table.add_column("sees")
    table.add_column("subtask", ratio=1, overflow="fold")
    table.add_column("response / error", ratio=1, overflow="fold")
    plan = {p.index: p for p in round_plan(rnd)}
    for s in rnd.steps:
        if s.status == "failed":
            out = Text(
                f"failed ({s.call.error_kind or 'error'}): {clip(s.call.error)}", style="red"
            )
        elif s.status == "skipped":
            out = Text("skipped", style="yellow")
        else:
            out = Text(clip(s.call.response if s.call.response is not None else s.answer))
        if s.call.cached:
            out.append("\n(cached)", style="dim")
        if s.call.batch:
            out.append("\n(batch)", style="dim")
        table.add_row(
            str(s.index),
            Text(f"{s.worker_id}\n(Model {s.worker_index})"),
            Text(sees_label(plan[s.index], later).removeprefix("sees: ")),
            Text(clip(s.subtask)),
            out,
        )
    return table


def _trace_table(record: RunRecord) -> Group:
    parts: list[RenderableType] = [sample_heading(record)] if is_bench_sample(record) else []
    parts += [
        Panel(
            Text(clip(record.question, 1000)),
            title="Question",
            title_align="left",
            subtitle=f"run {record.run_id} · {record.status}",
        )
    ]
    for pos, rnd in enumerate(record.rounds, 1):
        parts.append(Rule(f"{round_label(pos)}: {topology_kind(rnd)}"))
        if rnd.conductor_calls or rnd.parse_errors:
            parts.append(_conductor_table(rnd))
        if rnd.steps:
            parts.append(_steps_detail_table(rnd, pos > 1))
        elif is_empty_workflow(rnd):
            parts.append(Text("The Conductor kept the previous answer.", style="green"))
        if rnd.stop_reason:
            parts.append(Text(f"stop: {rnd.stop_reason}", style="dim"))
    parts.append(answer_panel(record))
    grade = grade_panel(record)
    if grade is not None:
        parts.append(grade)
    parts.append(Text(totals_line(record.totals)))
    return Group(*parts)


def _add_call(node: Tree, call: CallRecord) -> None:
    sent = node.add(Text(f"messages sent ({len(call.messages)})", style="dim"))
    for m in call.messages:
        sent.add(Text(f"{m.get('role', '?')}: {clip(m.get('content', ''))}"))
    if call.error:
        node.add(Text(f"error ({call.error_kind or 'error'}): {clip(call.error)}", "red"))
    if call.response is not None:
        node.add(Text(f"response: {clip(call.response)}"))
    queued = f" (after {call.queue_s:.2f} s queued)" if call.queue_s >= 0.005 else ""
    meta = (
        f"{call.latency_s:.2f} s{queued} · {call.input_tokens}/{call.output_tokens} tokens · "
        f"cost {format_usd(call.cost_usd)}"
        + (" · cached" if call.cached else "")
        + (f" · batch ({format_usd(call.live_cost_usd)} live)" if call.batch else "")
    )
    node.add(Text(meta, style="dim"))


def _trace_tree(record: RunRecord) -> Tree:
    title = Text(f"Question: {clip(record.question)}", style="bold")
    if is_bench_sample(record):
        title = Text("\n").join([sample_heading(record), title])
    tree = Tree(title)
    for pos, rnd in enumerate(record.rounds, 1):
        rnode = tree.add(Text(f"{round_label(pos)}: {topology_kind(rnd)}", style="bold"))
        tries = plural(len(rnd.conductor_calls), "try", "tries")
        cnode = rnode.add(Text(f"Conductor ({tries})", style="magenta"))
        for k, c, st, err in conductor_tries(rnd):
            label = f"try {k}: {st}"
            if err:
                label += f": {one_line(err, 120)}"
            tnode = cnode.add(Text(label))
            _add_call(tnode, c)
        if is_empty_workflow(rnd):
            rnode.add(Text("kept previous answer", style="green"))
        plan = {p.index: p for p in round_plan(rnd)}
        if rnd.steps:
            snode = rnode.add(Text("Steps", style="bold"))
            for s in rnd.steps:
                p = plan[s.index]
                status = "" if s.status == "ok" else f" · {step_status(s).plain}"
                label = f"step {s.index} · {s.worker_id} · {sees_label(p, pos > 1)}{status}"
                stnode = snode.add(Text(label, style="red" if s.status == "failed" else ""))
                stnode.add(Text(f"subtask: {clip(s.subtask)}", style="italic"))
                _add_call(stnode, s.call)
    tree.add(Text(f"Final answer: {clip(record.final_answer)}", style="green bold"))
    if record.error:
        tree.add(Text(f"Error: {clip(record.error)}", style="red"))
    if is_bench_sample(record):
        gnode = tree.add(Text(f"Grade: {record.verdict}", style=verdict_style(record.verdict)))
        for line in grade_lines(record):
            gnode.add(line)
    return tree


def trace_renderable(record: RunRecord, fmt: Literal["table", "tree"]) -> RenderableType:
    """A detailed trace: ``"table"`` (tables per round) or ``"tree"`` (nested calls)."""
    record = shown(record)
    if fmt == "table":
        return _trace_table(record)
    if fmt == "tree":
        return _trace_tree(record)
    raise ValueError(f"unknown trace format {fmt!r} (use 'table' or 'tree')")
