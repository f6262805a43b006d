"""The tables of ``conductor report``: the comparison of bench runs (laid out in
:mod:`conductor.render.comparison`), then the worker usage, topologies and rate limits
of each run, each usage view in a wide layout and a stacked one for narrow terminals.

The scores themselves are computed in :mod:`conductor.runs.summary`; the caller (the
CLI) summarises the runs and hands the summaries here, so that this module only lays
out what it is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..runs.summary import RunSummary, best_single, ratio
from ..text import printable
from .comparison import comparison_view, summary_table
from .fitted import Fitted
from .format import percent

if TYPE_CHECKING:
    from ..runs.oracle import QuestionOracle

__all__ = [
    "oracle_line",
    "rate_limit_table",
    "report_views",
    "summary_table",
    "topology_table",
    "usage_table",
]


def usage_table(summary: RunSummary) -> Table:
    """Workers as rows, step positions as columns: how often each worker was chosen
    at each position, with its share of that position's steps."""
    positions, rows, totals = _usage_rows(summary)
    table = Table(title=f"Worker usage by step position: {summary.label}", box=box.SIMPLE_HEAD)
    table.add_column("worker", no_wrap=True)
    for p in positions:
        table.add_column(f"step {p}", justify="right", no_wrap=True)
    table.add_column("all steps", justify="right", no_wrap=True)
    for w, cells in rows:
        table.add_row(w, *cells)
    table.add_row(Text("total", style="bold"), *totals)
    return table


def _usage_rows(summary: RunSummary) -> tuple[list[int], list[tuple[str, list[str]]], list[str]]:
    """The step positions, each worker's cells (one per position, then all steps) and
    the totals row."""
    positions = sorted({p for pos in summary.worker_usage.values() for p in pos})
    per_pos = {p: sum(pos.get(p, 0) for pos in summary.worker_usage.values()) for p in positions}
    total = sum(per_pos.values())
    rows = []
    for w in summary.worker_order or sorted(summary.worker_usage):
        counts = summary.worker_usage.get(w, {})
        cells = [
            f"{counts.get(p, 0)} ({percent(ratio(counts.get(p, 0), per_pos[p]), 0)})"
            for p in positions
        ]
        n = sum(counts.values())
        rows.append((w, [*cells, f"{n} ({percent(ratio(n, total), 0)})"]))
    return positions, rows, [*(str(per_pos[p]) for p in positions), str(total)]


def _usage_stacked(summary: RunSummary) -> RenderableType:
    """Worker usage for a narrow terminal: each worker id on its own line, its counts
    per position below (wrapping between positions)."""
    positions, rows, totals = _usage_rows(summary)
    names = [*(f"step {p}" for p in positions), "all steps"]
    parts: list[RenderableType] = [
        Text(f"Worker usage by step position: {summary.label}", style="bold")
    ]
    for w, cells in [*rows, ("total", totals)]:
        line = Text(w, style="bold")
        line.append("\n  " + ", ".join(f"{n}: {c}" for n, c in zip(names, cells, strict=True)))
        parts.append(line)
    return Group(*parts)


def _usage_view(summary: RunSummary) -> RenderableType:
    return Fitted([usage_table(summary), _usage_stacked(summary)], summary.worker_usage)


def topology_table(summary: RunSummary) -> Table:
    """How often each workflow shape appears (first round of each record)."""
    title = f"Workflow topologies: {summary.label}"
    # As wide as its title: a table of short columns must not fold the run's label.
    table = Table(title=title, box=box.SIMPLE_HEAD, min_width=len(title))
    table.add_column("topology")
    table.add_column("records", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    n = summary.n_records
    for kind, count in summary.topology_counts.items():
        table.add_row(kind, str(count), percent(ratio(count, n)))
    return table


def rate_limit_table(summary: RunSummary) -> Table | None:
    """Provider keys that were rate-limited, per invocation: how the adaptive limit
    moved (start, lowest, end), the 429s, the time paused and the latest changes.
    ``None`` when no invocation met a rate limit."""
    rows = [
        (i, key, p)
        for i, run in enumerate(summary.rate_limits)
        for key, p in run["providers"].items()
        if isinstance(p, dict) and (p.get("rate_limits") or p.get("paused_s"))
    ]
    if not rows:
        return None
    table = Table(title=f"Rate limits: {summary.label}", box=box.SIMPLE_HEAD)
    for name in ("run", "provider key", "targets", "limit", "429s", "paused"):
        table.add_column(name, no_wrap=name != "provider key")
    table.add_column("latest changes (s: limit, why)")
    for i, key, p in rows:
        events = [e for e in p.get("events") or [] if isinstance(e, list) and len(e) == 3]
        start = events[0][1] if events and events[0][2] == "start" else "?"
        recent = "; ".join(f"{e[0]:g}: {e[1]} {e[2]}" for e in events[-4:])
        table.add_row(
            str(i + 1),
            key,
            ", ".join(map(str, p.get("targets") or [])),
            f"{start} → {p.get('min_limit', '?')} → {p.get('limit', '?')}",
            str(p.get("rate_limits", 0)),
            f"{p.get('paused_s', 0):g} s",
            recent,
        )
    return table


def oracle_line(oracle: QuestionOracle) -> Text:
    """The per-question oracle under a comparison: what any router of these strategies
    could at most score, beside the best of them alone."""
    return Text(
        f"per-question oracle: {percent(oracle.accuracy)} of the {oracle.questions:,} "
        f"questions every one of {len(oracle.arms)} single runs answered has a right "
        f"answer among them (the best alone: {percent(oracle.best_single)}); no router "
        "choosing among them scores more"
    )


def report_views(
    summaries: list[RunSummary], oracles: dict[str, QuestionOracle] | None = None
) -> list[RenderableType]:
    """What ``conductor report DIR [DIR...]`` shows of the runs ``summaries`` describe:
    the comparison (with an oracle-best run per benchmark that has several ``single:*``
    runs, and under it the per-question oracle of ``oracles``, by benchmark), then the
    usage and topology tables of each Conductor run and the rate limits met."""
    by_bench: dict[str, list[RunSummary]] = {}
    for s in summaries:
        by_bench.setdefault(s.benchmark, []).append(s)
    out: list[RenderableType] = []
    for bench, runs in by_bench.items():
        singles = [s for s in runs if s.strategy.startswith("single:")]
        oracle = best_single(singles) if len(singles) >= 2 else None
        title = f"Bench runs: {printable(bench)}" if len(by_bench) > 1 else "Bench runs"
        out.append(comparison_view(runs, oracle, title))
        if oracles and bench in oracles:
            out.append(oracle_line(oracles[bench]))
    for s in summaries:
        if s.strategy == "conductor":
            if s.worker_usage:
                out.append(_usage_view(s))
            out.append(topology_table(s))
        limits = rate_limit_table(s)
        if limits is not None:
            out.append(limits)
    return out
