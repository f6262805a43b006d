"""Rich views of run records: topology trees, step tables, traces, Mermaid, progress.

Everything here turns a :class:`~conductor.record.RunRecord` (or a stream of
:class:`~conductor.events.Event`) into a rich renderable or a string; nothing prints.
The CLI imports this module at start-up (``conductor trace`` must feel instant), so it
imports only rich and the standard library.

Numbering: rounds are shown 1-based by their position in ``record.rounds`` ("Round 1",
``S1.0``), steps 0-based as in the Conductor's access lists ("step 0", "sees: 0, 2").
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.panel import Panel
from rich.rule import Rule
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from .events import Event
from .record import CallRecord, RoundRecord, RunRecord, StepRecord, Totals, record_to_dict
from .text import plural, printable

__all__ = [
    "Fitted",
    "ProgressView",
    "SampleListing",
    "answer_panel",
    "grade_panel",
    "step_table",
    "to_json",
    "to_mermaid",
    "topology",
    "topology_kind",
    "trace_renderable",
]

#: How much of a long text the tree view keeps.
TREE_CLIP = 300
#: Short excerpts of subtasks in the topology and Mermaid views.
EXCERPT = 60


# --------------------------------------------------------------------------- text helpers

_T = TypeVar("_T")


def _shown(value: _T) -> _T:
    """A copy of ``value`` (a record, or part of one) whose every string is
    :func:`~conductor.text.printable`: answers, subtasks, worker names and errors come
    from models, providers and files, and must not drive the terminal.  Raw provider
    bodies are left out; no view shows them."""
    if isinstance(value, str):
        return printable(value)  # type: ignore[return-value]
    if isinstance(value, CallRecord):
        value = dataclasses.replace(value, raw=None)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _shown(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    if isinstance(value, list):
        return [_shown(v) for v in value]  # type: ignore[return-value]
    if isinstance(value, tuple):
        return tuple(_shown(v) for v in value)  # type: ignore[return-value]
    if isinstance(value, dict):
        return {_shown(k): _shown(v) for k, v in value.items()}  # type: ignore[return-value]
    return value


def _one_line(text: str | None, limit: int = EXCERPT) -> str:
    """``text`` squeezed onto one line and cut to ``limit`` characters."""
    flat = " ".join((text or "").split())
    if len(flat) <= limit:
        return flat
    return flat[: max(limit - 1, 1)].rstrip() + "…"


def _clip(text: str | None, limit: int = TREE_CLIP) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    text = (text or "").strip()
    if len(text) <= limit:
        return text
    return f"{text[:limit].rstrip()} … [+{len(text) - limit} chars]"


def _clip_middle(text: str | None, head: int = 200, tail: int = 400) -> str:
    """Keep both ends of ``text``: a Conductor reply reasons first and ends with the lists."""
    text = (text or "").strip()
    if len(text) <= head + tail + 40:
        return text
    omitted = len(text) - head - tail
    return f"{text[:head].rstrip()}\n… [{omitted} chars omitted] …\n{text[-tail:].lstrip()}"


def _fmt_cost(cost: float | None) -> str:
    if cost is None:
        return "?"
    if cost == 0:
        return "0"
    if cost >= 0.01:
        return f"{cost:.4f}"
    return f"{cost:.6f}"


def _fmt_tokens(n: int) -> str:
    return f"{n:,}"


def _round_label(pos: int) -> str:
    return f"Round {pos}"


# --------------------------------------------------------------------------- width

#: The width a layout is first rendered at to see its ids whole (wider than any line).
_UNBOUNDED = 10_000


def _plain_lines(console: Console, options: ConsoleOptions, renderable: RenderableType) -> str:
    lines = console.render_lines(renderable, options, pad=False)
    return "\n".join("".join(seg.text for seg in line) for line in lines)


class Fitted:
    """The first of ``layouts`` that shows every string of ``keep`` whole at the width
    it is given, else the last one (the layout for narrow widths).

    ``keep`` holds ids (worker ids, model names, run labels): a table cut to a narrow
    terminal, or to the 80 columns rich assumes for a pipe, would fold or ellipsise
    them ("anthropic…"), which no one can copy or grep for; rather than that, the view
    changes shape.  A layout passes when each id appears in it, at this width, as many
    times as it does with no width limit.
    """

    def __init__(self, layouts: Sequence[RenderableType], keep: Iterable[str]) -> None:
        if not layouts:
            raise ValueError("Fitted needs at least one layout")
        self.layouts = list(layouts)
        self.keep = sorted({k for k in keep if k}, key=len, reverse=True)

    def _whole(self, console: Console, options: ConsoleOptions, layout: RenderableType) -> bool:
        shown = _plain_lines(console, options, layout)
        free = _plain_lines(console, options.update_width(_UNBOUNDED), layout)
        # A number in a no-wrap column squeezed below its width is cut with an ellipsis.
        if shown.count("…") > free.count("…"):
            return False
        return all(shown.count(k) >= free.count(k) for k in self.keep)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for layout in self.layouts[:-1]:
            if self._whole(console, options, layout):
                yield layout
                return
        yield self.layouts[-1]

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.layouts[0])


# --------------------------------------------------------------------------- topology


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


# --------------------------------------------------------------------------- step table


def _conductor_statuses(rnd: RoundRecord) -> list[str]:
    """For each Conductor call of a round: ``parsed``, ``parse error`` or ``failed (kind)``.

    The record keeps parse errors as a separate list, so the accepted reply is taken to
    be the last call without a call error when the round has a workflow.
    """
    calls = rnd.conductor_calls
    accepted = -1
    if rnd.workflow is not None:
        for i in range(len(calls) - 1, -1, -1):
            if calls[i].error is None:
                accepted = i
                break
    out = []
    for i, c in enumerate(calls):
        if c.error is not None:
            out.append(f"failed ({c.error_kind or 'error'})")
        elif i == accepted:
            out.append("parsed")
        else:
            out.append("parse error")
    return out


def _conductor_tries(rnd: RoundRecord) -> list[tuple[int, CallRecord, str, str | None]]:
    """``(try number, call, status, parse error or None)`` for each Conductor call."""
    errors = iter(rnd.parse_errors)
    out = []
    statuses = _conductor_statuses(rnd)
    for k, (c, st) in enumerate(zip(rnd.conductor_calls, statuses, strict=True), 1):
        err = next(errors, None) if st == "parse error" else None
        out.append((k, c, st, err))
    return out


def _call_cells(c: CallRecord) -> list[str]:
    return [
        f"{c.latency_s:.2f}",
        f"{_fmt_tokens(c.input_tokens)}/{_fmt_tokens(c.output_tokens)}",
        _fmt_cost(c.cost_usd),
        "cached" if c.cached else "",
    ]


def _step_status(s: StepRecord) -> Text:
    if s.status == "failed":
        return Text(f"failed ({s.call.error_kind or 'error'})", style="red")
    if s.status == "skipped":
        return Text("skipped", style="yellow")
    return Text("ok", style="green")


def _totals_line(t: Totals) -> str:
    calls = f"{plural(t.calls, 'call')} ({t.cached_calls} cached"
    calls += f", {t.failed_calls} failed)" if t.failed_calls else ")"
    tokens = f"tokens {_fmt_tokens(t.input_tokens)} in / {_fmt_tokens(t.output_tokens)} out"
    if t.cost_usd is None:
        cost = "cost ? (unknown price)"
    elif t.unknown_cost_calls:
        unknown = plural(t.unknown_cost_calls, "call")
        cost = f"cost >= ${_fmt_cost(t.cost_usd)} ({unknown} of unknown price)"
    else:
        cost = f"cost ${_fmt_cost(t.cost_usd)}"
    return f"Totals: {calls} · {tokens} · {cost} · wall {t.wall_s:.2f} s"


@dataclass(frozen=True)
class _CallRow:
    """One line of the calls view: a Conductor try, a step, or a kept answer."""

    round: int
    label: str
    who: Text
    sees: str
    call: CallRecord | None
    status: Text


def _call_rows(record: RunRecord) -> list[_CallRow]:
    rows: list[_CallRow] = []
    for pos, rnd in enumerate(record.rounds, 1):
        for k, c, st, _ in _conductor_tries(rnd):
            style = "green" if st == "parsed" else ("yellow" if st == "parse error" else "red")
            who = Text("conductor", style="magenta")
            rows.append(_CallRow(pos, f"try {k}", who, "-", c, Text(st, style=style)))
        plan = {p.index: p for p in _plan(rnd)}
        for s in rnd.steps:
            sees = _sees_short(plan[s.index])
            rows.append(
                _CallRow(pos, str(s.index), Text(s.worker_id), sees, s.call, _step_status(s))
            )
        if _is_empty_workflow(rnd):
            rows.append(_CallRow(pos, "-", Text(), "", None, Text("kept previous answer")))
    return rows


def _calls_wide(rows: list[_CallRow], rounds: bool) -> Table:
    table = Table(title="Calls", box=box.SIMPLE_HEAD)
    # Numbers and worker ids never wrap; sees and status may (at spaces).  No vertical
    # rules, two-line headers and a round column only when there are several rounds
    # keep the table inside 80 columns for ids of up to about 25 characters.
    if rounds:
        table.add_column("round", justify="right", no_wrap=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("worker", no_wrap=True)
    table.add_column("sees", min_width=7)
    table.add_column("latency\n(s)", justify="right", no_wrap=True)
    table.add_column("tokens\nin/out", justify="right", no_wrap=True)
    table.add_column("cost\n(USD)", justify="right", no_wrap=True)
    table.add_column("cached", no_wrap=True)
    table.add_column("status", min_width=8)
    for r in rows:
        cells = _call_cells(r.call) if r.call is not None else ["", "", "", ""]
        table.add_row(
            *((str(r.round),) if rounds else ()), r.label, r.who, Text(r.sees), *cells, r.status
        )
    return table


def _calls_stacked(rows: list[_CallRow], rounds: bool) -> Table:
    """The calls for a terminal too narrow for the table: the worker id on a line of
    its own, what the call cost and how it went on the next (which may wrap)."""
    table = Table(title="Calls", box=None, show_header=False, padding=(0, 1))
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("call")
    current = 0
    for r in rows:
        if rounds and r.round != current:
            current = r.round
            table.add_row("", Text(_round_label(r.round), style="bold"))
        body = Text.assemble(r.who, "\n", r.status)
        details = []
        if r.sees and r.sees != "-":
            details.append(f"sees {r.sees}")
        if r.call is not None:
            latency, tokens, cost, cached = _call_cells(r.call)
            details += [f"{latency} s", f"{tokens} tokens", f"cost {cost}"]
            if cached:
                details.append(cached)
        for d in details:
            # Commas, not a bullet, between parts: a wrapped line never starts with one.
            body.append(f", {d}")
        label = "step " + r.label if r.label[0].isdigit() else r.label
        table.add_row(label, body)
    return table


def step_table(record: RunRecord) -> RenderableType:
    """One row per model call (Conductor tries and steps), then a line of totals.

    Where the table would cut a worker id or a number, the calls are stacked instead,
    one per pair of lines (see :class:`Fitted`)."""
    record = _shown(record)
    rows = _call_rows(record)
    rounds = len(record.rounds) > 1
    keep = [r.who.plain for r in rows]
    keep += [r.call.error_kind for r in rows if r.call is not None and r.call.error_kind]
    calls = Fitted([_calls_wide(rows, rounds), _calls_stacked(rows, rounds)], keep)
    # The totals are free text: a line of their own that wraps at spaces.
    return Group(calls, Text(_totals_line(record.totals)))


# --------------------------------------------------------------------------- answer


def _failed_steps(record: RunRecord) -> list[str]:
    out = []
    for pos, rnd in enumerate(record.rounds, 1):
        for s in rnd.steps:
            if s.status == "failed":
                why = s.call.error_kind or "error"
                msg = f": {_one_line(s.call.error, 120)}" if s.call.error else ""
                out.append(f"round {pos} step {s.index} ({s.worker_id}) failed, {why}{msg}")
    return out


def answer_panel(record: RunRecord) -> Panel:
    """The final answer; the error in red when the run failed; for a partial run, the
    answer followed by what failed."""
    record = _shown(record)
    if record.status == "failed":
        body = Text(record.error or "the run failed", style="red")
        if record.final_answer:
            body.append(f"\n\nlast answer: {record.final_answer}", style="default")
        return Panel(body, title="Run failed", title_align="left", border_style="red")
    answer = Text(record.final_answer or "(empty answer)")
    if record.status == "partial":
        notes = _failed_steps(record)
        if record.error:
            notes.insert(0, record.error)
        answer.append("\n\nPartial run:", style="yellow bold")
        for line in notes or ["some calls failed"]:
            answer.append(f"\n- {line}", style="yellow")
        return Panel(answer, title="Answer (partial)", title_align="left", border_style="yellow")
    return Panel(answer, title="Answer", title_align="left", border_style="green")


# --------------------------------------------------------------------------- traces


def _conductor_table(rnd: RoundRecord) -> Table:
    table = Table(title="Conductor", title_justify="left", expand=True, show_lines=True)
    table.add_column("try", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("output / parse error", ratio=1, overflow="fold")
    table.add_column("tokens", justify="right", no_wrap=True)
    table.add_column("s", justify="right", no_wrap=True)
    tries = _conductor_tries(rnd)
    for k, c, st, err in tries:
        body = Text(_clip_middle(c.reply))  # the prefill, if any, and the continuation
        if err:
            body.append(f"\nparse error: {err}", style="yellow")
        elif c.error:
            body.append(f"\nerror: {_clip(c.error)}", style="red")
        status = Text(st + (" (cached)" if c.cached else ""))
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
    plan = {p.index: p for p in _plan(rnd)}
    for s in rnd.steps:
        if s.status == "failed":
            out = Text(
                f"failed ({s.call.error_kind or 'error'}): {_clip(s.call.error)}", style="red"
            )
        elif s.status == "skipped":
            out = Text("skipped", style="yellow")
        else:
            out = Text(_clip(s.call.response if s.call.response is not None else s.answer))
        if s.call.cached:
            out.append("\n(cached)", style="dim")
        table.add_row(
            str(s.index),
            Text(f"{s.worker_id}\n(Model {s.worker_index})"),
            Text(_sees(plan[s.index], later).removeprefix("sees: ")),
            Text(_clip(s.subtask)),
            out,
        )
    return table


def _trace_table(record: RunRecord) -> Group:
    parts: list[RenderableType] = [_sample_heading(record)] if _is_bench_sample(record) else []
    parts += [
        Panel(
            Text(_clip(record.question, 1000)),
            title="Question",
            title_align="left",
            subtitle=f"run {record.run_id} · {record.status}",
        )
    ]
    for pos, rnd in enumerate(record.rounds, 1):
        parts.append(Rule(f"{_round_label(pos)}: {topology_kind(rnd)}"))
        if rnd.conductor_calls or rnd.parse_errors:
            parts.append(_conductor_table(rnd))
        if rnd.steps:
            parts.append(_steps_detail_table(rnd, pos > 1))
        elif _is_empty_workflow(rnd):
            parts.append(Text("The Conductor kept the previous answer.", style="green"))
        if rnd.stop_reason:
            parts.append(Text(f"stop: {rnd.stop_reason}", style="dim"))
    parts.append(answer_panel(record))
    grade = grade_panel(record)
    if grade is not None:
        parts.append(grade)
    parts.append(Text(_totals_line(record.totals)))
    return Group(*parts)


def _add_call(node: Tree, call: CallRecord) -> None:
    sent = node.add(Text(f"messages sent ({len(call.messages)})", style="dim"))
    for m in call.messages:
        sent.add(Text(f"{m.get('role', '?')}: {_clip(m.get('content', ''))}"))
    if call.error:
        node.add(Text(f"error ({call.error_kind or 'error'}): {_clip(call.error)}", "red"))
    if call.response is not None:
        node.add(Text(f"response: {_clip(call.response)}"))
    meta = (
        f"{call.latency_s:.2f} s · {call.input_tokens}/{call.output_tokens} tokens · "
        f"cost {_fmt_cost(call.cost_usd)}" + (" · cached" if call.cached else "")
    )
    node.add(Text(meta, style="dim"))


def _trace_tree(record: RunRecord) -> Tree:
    title = Text(f"Question: {_clip(record.question)}", style="bold")
    if _is_bench_sample(record):
        title = Text("\n").join([_sample_heading(record), title])
    tree = Tree(title)
    for pos, rnd in enumerate(record.rounds, 1):
        rnode = tree.add(Text(f"{_round_label(pos)}: {topology_kind(rnd)}", style="bold"))
        tries = plural(len(rnd.conductor_calls), "try", "tries")
        cnode = rnode.add(Text(f"Conductor ({tries})", style="magenta"))
        for k, c, st, err in _conductor_tries(rnd):
            label = f"try {k}: {st}"
            if err:
                label += f": {_one_line(err, 120)}"
            tnode = cnode.add(Text(label))
            _add_call(tnode, c)
        if _is_empty_workflow(rnd):
            rnode.add(Text("kept previous answer", style="green"))
        plan = {p.index: p for p in _plan(rnd)}
        if rnd.steps:
            snode = rnode.add(Text("Steps", style="bold"))
            for s in rnd.steps:
                p = plan[s.index]
                status = "" if s.status == "ok" else f" · {_step_status(s).plain}"
                label = f"step {s.index} · {s.worker_id} · {_sees(p, pos > 1)}{status}"
                stnode = snode.add(Text(label, style="red" if s.status == "failed" else ""))
                stnode.add(Text(f"subtask: {_clip(s.subtask)}", style="italic"))
                _add_call(stnode, s.call)
    tree.add(Text(f"Final answer: {_clip(record.final_answer)}", style="green bold"))
    if record.error:
        tree.add(Text(f"Error: {_clip(record.error)}", style="red"))
    if _is_bench_sample(record):
        gnode = tree.add(Text(f"Grade: {record.verdict}", style=_verdict_style(record.verdict)))
        for line in _grade_lines(record):
            gnode.add(line)
    return tree


def trace_renderable(record: RunRecord, fmt: Literal["table", "tree"]) -> RenderableType:
    """A detailed trace: ``"table"`` (tables per round) or ``"tree"`` (nested calls)."""
    record = _shown(record)
    if fmt == "table":
        return _trace_table(record)
    if fmt == "tree":
        return _trace_tree(record)
    raise ValueError(f"unknown trace format {fmt!r} (use 'table' or 'tree')")


# --------------------------------------------------------------------------- bench samples


def _is_bench_sample(record: RunRecord) -> bool:
    """Whether ``record`` is a benchmark sample (``conductor ask`` records have no id)."""
    return record.sample_id is not None or record.grade is not None


def _verdict_style(verdict: str) -> str:
    return {"correct": "green", "incorrect": "red", "no_answer": "yellow"}.get(verdict, "magenta")


def _sample_heading(record: RunRecord) -> Text:
    # On a line of its own, not in a panel's title: a title too wide is cut short, and
    # the id is what a reader copies into ``--sample``.
    heading = Text("sample ", style="bold", no_wrap=True, overflow="ignore")
    heading.append(record.sample_id or "?", style="bold cyan")
    if record.epoch is not None:
        heading.append(f" · epoch {record.epoch}")
    return heading


def _gold_text(gold: Any) -> str:
    if gold is None:
        return "(none recorded)"
    if isinstance(gold, str):
        return _clip(gold)
    return _clip(json.dumps(gold, ensure_ascii=False, default=str))


def _grade_lines(record: RunRecord) -> list[Text]:
    lines = [Text(f"gold: {_gold_text(record.gold)}")]
    grade = record.grade
    if grade is None:
        lines.append(Text("extracted: (not graded: the run failed)"))
        lines.append(Text(f"verdict: {record.verdict}", style=_verdict_style(record.verdict)))
        return lines
    extracted = grade.get("extracted")
    lines.append(Text(f"extracted: {_clip(str(extracted)) if extracted is not None else '(none)'}"))
    verdict = Text("verdict: ")
    verdict.append(record.verdict, style=_verdict_style(record.verdict) + " bold")
    reason = grade.get("reason")
    if reason:
        verdict.append(f" — {_clip(str(reason))}")
    lines.append(verdict)
    return lines


def grade_panel(record: RunRecord) -> Panel | None:
    """A bench sample's gold answer, the answer the grader extracted and its verdict with
    the reason; ``None`` for a record that is not a bench sample."""
    record = _shown(record)
    if not _is_bench_sample(record):
        return None
    style = _verdict_style(record.verdict)
    body = Text("\n").join(_grade_lines(record))
    return Panel(body, title=f"Grade: {record.verdict}", title_align="left", border_style=style)


@dataclass(frozen=True)
class _SampleRow:
    sample_id: str
    epoch: int | None
    verdict: str
    steps: int
    cost_usd: float | None
    #: Some of its calls have no known price: ``cost_usd`` is a lower bound.
    cost_partial: bool
    input_tokens: int
    output_tokens: int
    wall_s: float


def _sample_row(record: RunRecord) -> _SampleRow:
    steps = sum(1 for rnd in record.rounds for s in rnd.steps if s.status != "skipped")
    t = record.totals
    return _SampleRow(
        printable(record.sample_id or f"run {record.run_id}"),
        record.epoch,
        record.verdict,
        steps,
        t.cost_usd,
        t.cost_usd is not None and t.unknown_cost_calls > 0,
        t.input_tokens,
        t.output_tokens,
        t.wall_s,
    )


def _row_cost(row: _SampleRow) -> str:
    if row.cost_partial:
        return f">={_fmt_cost(row.cost_usd)}" if row.cost_usd else "?"
    return _fmt_cost(row.cost_usd)


def _natural_key(text: str) -> list[Any]:
    """Sort ``item/2`` before ``item/10``: digit runs compare as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in _DIGITS.split(text)]


_DIGITS = re.compile(r"(\d+)")


class SampleListing:
    """The samples of a bench run, one row per (sample, epoch), in natural id order.

    Reads ``records`` once (a stream: only a small row per record is kept).  A later
    record of the same (sample, epoch) replaces an earlier one, as in the run's report.
    ``verdict`` shows only the samples with that verdict and ``limit`` the first N
    shown; the counts in the summary line are always over the whole run.  Ids are never
    cut: where the table does not fit the width, the token and time columns go first,
    then each sample takes two lines, its id alone on the first.
    """

    def __init__(
        self,
        records: Iterable[RunRecord],
        *,
        verdict: str | None = None,
        limit: int | None = None,
    ) -> None:
        latest: dict[tuple[str, int | None], _SampleRow] = {}
        for record in records:
            row = _sample_row(record)
            latest[(row.sample_id, row.epoch)] = row
        self.rows = sorted(latest.values(), key=lambda r: (_natural_key(r.sample_id), r.epoch or 0))
        self.counts: dict[str, int] = {}
        for row in self.rows:
            self.counts[row.verdict] = self.counts.get(row.verdict, 0) + 1
        self.sample_ids = sorted({r.sample_id for r in self.rows}, key=_natural_key)
        self.epochs = len({r.epoch for r in self.rows})
        self.verdict = verdict
        matching = [r for r in self.rows if verdict is None or r.verdict == verdict]
        self.matching = len(matching)
        self.shown = matching[:limit] if limit is not None else matching

    def summary(self) -> Text:
        """One line: how many samples (and epochs), the count of each verdict, the cost."""
        n = len(self.sample_ids)
        if not self.rows:
            return Text("no samples recorded yet", style="bold")
        line = Text(plural(n, "sample"), style="bold")
        if self.epochs > 1:
            line.append(f" × {self.epochs} epochs = {plural(len(self.rows), 'record')}")
        for i, (verdict, count) in enumerate(
            sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ):
            line.append(": " if i == 0 else " · ")
            line.append(f"{count} {verdict}", style=_verdict_style(verdict))
        known = [r.cost_usd for r in self.rows if r.cost_usd is not None]
        partial = len(known) < len(self.rows) or any(r.cost_partial for r in self.rows)
        if partial and not any(known):
            line.append(" · cost ? (unknown prices)")
        else:
            line.append(f" · cost {'>= ' if partial else ''}${_fmt_cost(sum(known))}")
        return line

    def _footer(self) -> Text | None:
        what = f"{self.verdict} " if self.verdict else ""
        left = self.matching - len(self.shown)
        if left > 0:
            return Text(
                f"… {left} more {what}not shown (showing {len(self.shown)} of {self.matching}; "
                "raise --limit to see more)",
                style="dim",
            )
        if self.verdict is not None and self.rows and not self.shown:
            return Text(f"no {self.verdict} samples in this run", style="dim")
        return None

    def _cells(self, r: _SampleRow, full: bool) -> list[RenderableType]:
        cells: list[RenderableType] = [Text(r.sample_id, style="cyan")]
        if self.epochs > 1:
            cells.append(str(r.epoch if r.epoch is not None else "-"))
        cells += [Text(r.verdict, style=_verdict_style(r.verdict)), str(r.steps)]
        cells.append(_row_cost(r))
        if full:
            cells.append(f"{_fmt_tokens(r.input_tokens)}/{_fmt_tokens(r.output_tokens)}")
            cells.append(f"{r.wall_s:.1f}")
        return cells

    def _table(self, full: bool, rows: list[list[RenderableType]] | None = None) -> Table:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
        table.add_column("id", no_wrap=True, overflow="ignore")
        if self.epochs > 1:
            table.add_column("epoch", justify="right", no_wrap=True)
        table.add_column("verdict", no_wrap=True)
        table.add_column("steps", justify="right", no_wrap=True)
        table.add_column("cost\n(USD)", justify="right", no_wrap=True)
        if full:
            table.add_column("tokens\nin/out", justify="right", no_wrap=True)
            table.add_column("time\n(s)", justify="right", no_wrap=True)
        for cells in rows if rows is not None else (self._cells(r, full) for r in self.shown):
            table.add_row(*cells)
        return table

    def _fits(self, console: Console, options: ConsoleOptions, full: bool) -> bool:
        """Whether the table fits the width whole, measured on one row of the widest
        cells (measuring thousands of rows would cost more than printing them)."""
        columns = list(zip(*(self._cells(r, full) for r in self.shown), strict=True))
        widest = [max(col, key=lambda c: cell_len(str(c))) for col in columns]
        probe = self._table(full, [widest])
        # Measured as if the terminal were unbounded: the table's natural width.
        natural = Measurement.get(console, options.update_width(1 << 16), probe)
        return natural.maximum <= options.max_width

    def _stacked(self) -> Group:
        lines: list[RenderableType] = []
        for r in self.shown:
            lines.append(Text(r.sample_id, style="cyan", no_wrap=True, overflow="ignore"))
            detail = Text("  ")
            if self.epochs > 1 and r.epoch is not None:
                detail.append(f"epoch {r.epoch} · ")
            detail.append(r.verdict, style=_verdict_style(r.verdict))
            detail.append(f" · {plural(r.steps, 'step')} · cost {_row_cost(r)}")
            lines.append(detail)
        return Group(*lines)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.summary()
        if self.shown:
            body: RenderableType = self._stacked()
            for full in (True, False):
                if self._fits(console, options, full):
                    body = self._table(full)
                    break
            yield body
        footer = self._footer()
        if footer is not None:
            yield footer


# --------------------------------------------------------------------------- mermaid


_MERMAID_ENTITIES = {
    "#": "#35;",
    '"': "#quot;",
    "[": "#91;",
    "]": "#93;",
    "{": "#123;",
    "}": "#125;",
    "<": "#lt;",
    ">": "#gt;",
    "|": "#124;",
    "`": "#96;",
}
_MERMAID_RE = re.compile("|".join(re.escape(c) for c in _MERMAID_ENTITIES))


def _mermaid_text(text: str, limit: int = EXCERPT) -> str:
    """Text safe inside a quoted Mermaid label (one line, entity-escaped)."""
    flat = _one_line(text, limit)
    return _MERMAID_RE.sub(lambda m: _MERMAID_ENTITIES[m.group(0)], flat)


def to_mermaid(record: RunRecord) -> str:
    """A Mermaid ``flowchart TD`` of the run: rounds as subgraphs, steps as nodes."""
    record = _shown(record)
    lines = ["flowchart TD", f'  Q["Question: {_mermaid_text(record.question)}"]']
    prev_last: str | None = None  # the node holding the previous round's answer
    for pos, rnd in enumerate(record.rounds, 1):
        kind = topology_kind(rnd)
        plan = _plan(rnd, record.pool)
        lines.append(f'  subgraph R{pos}["Round {pos}: {_mermaid_text(kind)}"]')
        if not plan:
            lines.append(f'    K{pos}["{_mermaid_text(kind)}"]')
            lines.append("  end")
            if prev_last is not None:
                lines.append(f"  {prev_last} -.-> K{pos}")
            continue
        for p in plan:
            label = f"S{pos}.{p.index}: {p.worker_id}"
            lines.append(
                f'    S{pos}.{p.index}["{_mermaid_text(label)}<br/>{_mermaid_text(p.subtask)}"]'
            )
        lines.append("  end")
        for p in plan:
            if not p.visible:
                lines.append(f"  Q --> S{pos}.{p.index}")
            for j in p.visible:
                lines.append(f"  S{pos}.{j} --> S{pos}.{p.index}")
        if prev_last is not None:
            lines.append(f"  {prev_last} -.->|previous answer| R{pos}")
        # The answer of a round is its last step that produced something.
        ok = [p for p in plan if p.status == "ok"]
        prev_last = f"S{pos}.{(ok or plan)[-1].index}"
    answer = record.final_answer if record.status != "failed" else f"failed: {record.error}"
    lines.append(f'  A(["Answer: {_mermaid_text(answer or "(empty)", 80)}"])')
    if prev_last is not None:
        lines.append(f"  {prev_last} --> A")
    return "\n".join(lines) + "\n"


def to_json(record: RunRecord) -> str:
    """The record as indented JSON (the format ``--out`` writes).

    JSON already escapes the C0 controls; DEL, the C1 controls and the bidirectional
    overrides are escaped too (``\\u009b``), so printing it cannot drive a terminal.
    """
    text = json.dumps(record_to_dict(record), indent=2, ensure_ascii=False)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


_JSON_UNSAFE = re.compile(r"[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


# --------------------------------------------------------------------------- progress


@dataclass
class _StepRow:
    round: int
    step: int
    worker_id: str
    state: Literal["running", "done", "failed"] = "running"
    latency_s: float | None = None
    cached: bool = False
    detail: str | None = None


class ProgressView:
    """A live view of a running question, fed by :class:`~conductor.events.Event`.

    Pass it as the executor's event sink and render it with ``rich.live.Live(view)``.
    It assumes ``Event.round`` counts from 0 like ``RoundRecord.index``; round labels
    appear only once a second round shows up.
    """

    def __init__(self, title: str = "conductor") -> None:
        self.title = title
        self._conductor: dict[int, str] = {}
        self._conductor_running: dict[int, bool] = {}
        self._retries: dict[int, int] = {}
        self._steps: dict[tuple[int, int], _StepRow] = {}
        self._rounds: list[int] = []
        self._finished: str | None = None

    def _see_round(self, rnd: int) -> None:
        if rnd not in self._rounds:
            self._rounds.append(rnd)

    def __call__(self, event: Event) -> None:
        """Take in one event."""
        event = _shown(event)
        r = event.round
        self._see_round(r)
        kind = event.kind
        if kind == "conductor_started":
            n = self._retries.get(r, 0)
            self._conductor[r] = "planning" if n == 0 else f"parse retry {n}"
            self._conductor_running[r] = True
        elif kind == "conductor_parse_failed":
            n = self._retries.get(r, 0) + 1
            self._retries[r] = n
            self._conductor[r] = f"parse retry {n}"
            self._conductor_running[r] = True
        elif kind == "conductor_finished":
            self._conductor_running[r] = False
            word = "failed" if event.failed else "done"
            detail = _one_line(event.detail, 70)
            self._conductor[r] = word + (f" ({detail})" if detail else "")
        elif kind in ("step_started", "step_finished") and event.step is not None:
            key = (r, event.step)
            row = self._steps.get(key)
            if row is None:
                row = _StepRow(r, event.step, event.worker_id or "?")
                self._steps[key] = row
            if event.worker_id:
                row.worker_id = event.worker_id
            if kind == "step_finished":
                row.state = "failed" if event.failed else "done"
                row.latency_s = event.latency_s
                row.cached = event.cached
                # A failed step's detail is the whole error message: one short line here.
                row.detail = _one_line(event.detail, 70) or None
        elif kind == "run_finished":
            self._finished = "failed" if event.failed else "done"
            if event.detail:
                self._finished += f" ({event.detail})"

    def _round_prefix(self, r: int) -> str:
        return f"round {r + 1} " if len(self._rounds) > 1 else ""

    def __rich__(self) -> RenderableType:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_column()
        for r in self._rounds:
            if r in self._conductor:
                state = self._conductor[r]
                if self._conductor_running.get(r):
                    cell: RenderableType = Spinner("dots", text=Text(state + "…"))
                else:
                    style = "red" if state.startswith("failed") else "green"
                    cell = Text(state, style=style)
                grid.add_row(Text(f"{self._round_prefix(r)}Conductor", "magenta"), "", cell)
            for (rr, _), row in sorted(self._steps.items()):
                if rr != r:
                    continue
                name = Text(f"{self._round_prefix(r)}step {row.step}")
                if row.state == "running":
                    cell = Spinner("dots", text=Text("running…"))
                else:
                    parts: list[str] = [row.state]
                    if row.latency_s is not None:
                        parts.append(f"{row.latency_s:.2f} s")
                    if row.cached:
                        parts.append("cached")
                    if row.detail:
                        parts.append(row.detail)
                    cell = Text(" · ".join(parts), style="red" if row.state == "failed" else "")
                grid.add_row(name, Text(row.worker_id, style="cyan"), cell)
        if self._finished:
            style = "red" if self._finished.startswith("failed") else "green bold"
            grid.add_row(Text("run"), "", Text(self._finished, style=style))
        return Panel(grid, title=self.title, title_align="left")
