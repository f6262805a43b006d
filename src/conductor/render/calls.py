"""The summary of a run: one row per model call with totals (:func:`step_table`), and the
answer panel (:func:`answer_panel`).

How each call went is said here once (:func:`conductor_tries`, :func:`step_status`,
:func:`totals_line`); the detailed traces of :mod:`conductor.render.trace` say it the
same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..record import CallRecord, RoundRecord, RunRecord, StepRecord, Totals
from ..shapes import is_empty_workflow, round_plan
from ..text import plural
from .fitted import Fitted
from .format import format_tokens, format_usd, one_line, round_label, shown
from .plan import sees_short


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


def conductor_tries(rnd: RoundRecord) -> list[tuple[int, CallRecord, str, str | None]]:
    """``(try number, call, status, parse error or None)`` for each Conductor call of
    ``rnd``, numbered from 1; the status is ``parsed``, ``parse error`` or
    ``failed (kind)``, and the parse error is paired with the try it came from."""
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
        f"{format_tokens(c.input_tokens)}/{format_tokens(c.output_tokens)}",
        format_usd(c.cost_usd),
    ]


def step_status(s: StepRecord) -> Text:
    """How step ``s`` went, styled: ``ok``, ``skipped`` or ``failed (kind)``."""
    if s.status == "failed":
        return Text(f"failed ({s.call.error_kind or 'error'})", style="red")
    if s.status == "skipped":
        return Text("skipped", style="yellow")
    return Text("ok", style="green")


def totals_line(t: Totals) -> str:
    """The one line of a run's totals: calls (cached, failed), tokens, cost and wall time."""
    calls = f"{plural(t.calls, 'call')} ({t.cached_calls} cached"
    calls += f", {t.batch_calls} batch" if t.batch_calls else ""
    calls += f", {t.failed_calls} failed)" if t.failed_calls else ")"
    tokens = f"tokens {format_tokens(t.input_tokens)} in / {format_tokens(t.output_tokens)} out"
    if t.cost_usd is None:
        cost = "cost ? (unknown price)"
    elif t.unknown_cost_calls:
        unknown = plural(t.unknown_cost_calls, "call")
        cost = f"cost >= {format_usd(t.cost_usd)} ({unknown} of unknown price)"
    else:
        cost = f"cost {format_usd(t.cost_usd)}"
    if t.live_cost_usd is not None:
        cost += f" ({format_usd(t.live_cost_usd)} live)"
    # A question that waited for a busy model or a concurrency slot says how long.
    queued = f" ({t.queue_s:.2f} s of it queued)" if t.queue_s >= 0.005 else ""
    return f"Totals: {calls} · {tokens} · {cost} · wall {t.wall_s:.2f} s{queued}"


@dataclass(frozen=True)
class _CallRow:
    """One line of the calls view: a Conductor try, a step, or a kept answer."""

    round: int
    label: str
    who: Text
    sees: str
    call: CallRecord | None
    status: Text


def _marked_cached(status: Text, call: CallRecord) -> Text:
    """``status``, followed by ``(cached)`` for a call answered from the cache and
    ``(batch)`` for one a provider's batch answered."""
    if call.cached:
        status.append(" (cached)", style="dim")
    if call.batch:
        status.append(" (batch)", style="dim")
    return status


def _call_rows(record: RunRecord) -> list[_CallRow]:
    rows: list[_CallRow] = []
    for pos, rnd in enumerate(record.rounds, 1):
        for k, c, st, _ in conductor_tries(rnd):
            style = "green" if st == "parsed" else ("yellow" if st == "parse error" else "red")
            who = Text("conductor", style="magenta")
            status = _marked_cached(Text(st, style=style), c)
            rows.append(_CallRow(pos, f"try {k}", who, "-", c, status))
        plan = {p.index: p for p in round_plan(rnd)}
        for s in rnd.steps:
            sees = sees_short(plan[s.index])
            status = _marked_cached(step_status(s), s.call)
            rows.append(_CallRow(pos, str(s.index), Text(s.worker_id), sees, s.call, status))
        if is_empty_workflow(rnd):
            rows.append(_CallRow(pos, "-", Text(), "", None, Text("kept previous answer")))
    return rows


def _calls_wide(rows: list[_CallRow], rounds: bool) -> Table:
    """The calls as a table.  What would widen it past 80 columns gives way first: a
    cached call says so in its status (``ok (cached)``) rather than in a column of its
    own, mostly empty, and the rounds of a multi-round run are headed by a line each
    (``Round 2``) rather than a column.  Where it is still too wide, :func:`step_table`
    stacks the calls instead."""
    table = Table(title="Calls", box=box.SIMPLE_HEAD)
    # Numbers and worker ids never wrap; sees and status may (at spaces).  No vertical
    # rules and two-line headers keep the table inside 80 columns for ids of up to
    # about 25 characters.
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("worker", no_wrap=True)
    table.add_column("sees", min_width=7)
    table.add_column("latency\n(s)", justify="right", no_wrap=True)
    table.add_column("tokens\nin/out", justify="right", no_wrap=True)
    table.add_column("cost", justify="right", no_wrap=True)
    # Wrapped at spaces, never narrower than its longest word ("(ServerError)").
    longest = max((len(w) for r in rows for w in r.status.plain.split()), default=0)
    table.add_column("status", min_width=max(8, longest))
    current = 0
    for r in rows:
        if rounds and r.round != current:
            if current:
                table.add_section()
            current = r.round
            table.add_row("", Text(round_label(r.round), style="bold"))
        cells = _call_cells(r.call) if r.call is not None else ["", "", ""]
        table.add_row(r.label, r.who, Text(r.sees), *cells, r.status)
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
            table.add_row("", Text(round_label(r.round), style="bold"))
        body = Text.assemble(r.who, "\n", r.status)
        details = []
        if r.sees and r.sees != "-":
            details.append(f"sees {r.sees}")
        if r.call is not None:
            latency, tokens, cost = _call_cells(r.call)
            details += [f"{latency} s", f"{tokens} tokens", f"cost {cost}"]
        for d in details:
            # Commas, not a bullet, between parts: a wrapped line never starts with one.
            body.append(f", {d}")
        label = "step " + r.label if r.label[0].isdigit() else r.label
        table.add_row(label, body)
    return table


def step_table(record: RunRecord) -> RenderableType:
    """One row per model call (Conductor tries and steps), then a line of totals.

    Where the table would cut a worker id, a number or a status, the calls are stacked
    instead, one per pair of lines (see :class:`Fitted`)."""
    record = shown(record)
    rows = _call_rows(record)
    rounds = len(record.rounds) > 1
    keep = [r.who.plain for r in rows]
    keep += [r.call.error_kind for r in rows if r.call is not None and r.call.error_kind]
    # Every word of every status too: a table wider than the terminal is cut at its right
    # edge, where the statuses are ("pars" for "parsed").
    keep += [word for r in rows for word in r.status.plain.split()]
    calls = Fitted([_calls_wide(rows, rounds), _calls_stacked(rows, rounds)], keep)
    # The totals are free text: a line of their own that wraps at spaces.
    return Group(calls, Text(totals_line(record.totals)))


# --------------------------------------------------------------------------- answer


def _failed_steps(record: RunRecord) -> list[str]:
    out = []
    for pos, rnd in enumerate(record.rounds, 1):
        for s in rnd.steps:
            if s.status == "failed":
                why = s.call.error_kind or "error"
                msg = f": {one_line(s.call.error, 120)}" if s.call.error else ""
                out.append(f"round {pos} step {s.index} ({s.worker_id}) failed, {why}{msg}")
    return out


def answer_panel(record: RunRecord) -> Panel:
    """The final answer; the error in red when the run failed; for a partial run, the
    answer followed by what failed."""
    record = shown(record)
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
    return Panel(
        answer,
        title="Answer",
        title_align="left",
        border_style="green",
        subtitle=_demo_note(record),
        subtitle_align="left",
    )


def _demo_note(record: RunRecord) -> str | None:
    """A word under an answer that the embedded 135M model wrote, which reads like
    nonsense often enough ("1. The capital of France is Paris. 2. The answer is 3.")
    to be taken for a bug of the orchestration rather than of the model."""
    from ..localmodel.models import EMBEDDED_MODEL

    answered = [s for rnd in record.rounds for s in rnd.steps if s.status == "ok"]
    if not answered:
        return None
    # A record is a file anyone may have written: its pool may hold anything.
    listed = record.pool.get("workers") if isinstance(record.pool, dict) else None
    last: dict[str, Any] = next(
        (
            w
            for w in (listed if isinstance(listed, list) else [])
            if isinstance(w, dict) and w.get("id") == answered[-1].worker_id
        ),
        {},
    )
    if last.get("client") != "local" or last.get("model") != EMBEDDED_MODEL:
        return None
    if last.get("model_path"):
        return None
    return "by the embedded 135M demo model: expect mistakes (--pool for real ones)"
