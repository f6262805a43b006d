"""The tables of ``conductor report``: scores, usage, topologies and rate limits of bench
runs, each in a wide layout and a stacked one for narrow terminals.

The scores themselves are computed in :mod:`conductor.bench.summary`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..bench.paper import PaperFigure, paper_reference
from ..bench.summary import (
    RunSummary,
    _ratio,
    best_single,
    summarize_run,
)
from ..text import plural
from .fitted import Fitted
from .format import format_usd

__all__ = [
    "rate_limit_table",
    "report_renderables",
    "summary_table",
    "topology_table",
    "usage_table",
]


def _pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _cost(s: RunSummary) -> str:
    if s.cost_per_question is None:
        return "?"
    text = format_usd(s.cost_per_question)
    if s.cost_is_lower_bound:
        unknown = s.unknown_cost_calls
        text = f"≥ {text}" + (f" ({plural(unknown, 'unpriced call')})" if unknown else "")
    return text


def _accuracy(s: RunSummary) -> str:
    if s.accuracy is None:
        return "-"
    se = f" ± {s.stderr:.2f}" if s.stderr is not None else ""
    return f"{s.accuracy:.2f}{se}"


def _spread(s: RunSummary) -> str:
    if len(s.epoch_accuracy) < 2:
        return "-"
    return f"{_num(s.epoch_min)}-{_num(s.epoch_max)} (sd {_num(s.epoch_sd)})"


def _parse_failures(s: RunSummary) -> str:
    if not s.conductor_tries:
        return "-"
    tries = plural(
        s.conductor_tries, "try", "tries", shown=f"{s.conductor_parse_errors}/{s.conductor_tries}"
    )
    return (
        f"{tries} ({_pct(s.parse_failure_rate)}); no plan {s.no_workflow_records} "
        f"({_pct(s.no_workflow_rate)})"
    )


def _errors(s: RunSummary) -> str:
    c = s.status_counts
    return (
        f"run {c.get('run_failed', 0)} · grader {c.get('grader_error', 0)} · "
        f"time limit {c.get('time_limit', 0)}"
    )


def _trained_on(s: RunSummary) -> str:
    if s.trained_on_samples is None:
        return "-"
    return f"{s.trained_on_samples}" + (" (excluded)" if s.trained_excluded else "")


def _paper_cell(figures: list[PaperFigure]) -> Text:
    """Each figure as ``value method`` over a dim ``(table, setting)`` line."""
    if not figures:
        return Text("-", style="dim")
    cell = Text()
    for i, f in enumerate(figures):
        unit = {"tokens_per_question": " tokens/q", "cost_per_question_usd": "/q"}.get(f.metric, "")
        if i:
            cell.append("\n")
        cell.append(f"{f.text}{unit} {f.method}\n")
        cell.append(f"({f.table}, {f.setting})", style="dim")
    return cell


_ROWS: list[tuple[str, Any]] = [
    ("accuracy % ± SE", _accuracy),
    (
        "samples × epochs",
        lambda s: f"{s.n_samples} × {s.epochs} ({plural(s.n_records, 'record')})",
    ),
    ("epoch spread", _spread),
    ("cost / question", _cost),
    (
        "tokens / question",
        lambda s: (
            f"{_num(s.input_tokens_per_question, 0)} in / "
            f"{_num(s.output_tokens_per_question, 0)} out"
        ),
    ),
    ("calls / question", lambda s: _num(s.calls_per_question)),
    ("steps / question", lambda s: _num(s.steps_per_question)),
    ("rounds / question", lambda s: _num(s.rounds_per_question)),
    (
        "latency p50 / p95",
        lambda s: f"{_num(s.latency_p50)} s / {_num(s.latency_p95)} s",
    ),
    ("cached calls", lambda s: _pct(s.cached_share)),
    ("truncated calls", lambda s: str(s.truncated_calls)),
    ("parse failures", _parse_failures),
    (
        "unreadable answers",
        lambda s: f"{s.status_counts.get('no_answer', 0)} ({_pct(s.no_answer_rate)})",
    ),
    ("errors", _errors),
]


def _summary_columns(
    summaries: list[RunSummary], oracle: RunSummary | None
) -> list[tuple[RunSummary, str, Text]]:
    """Each run with the strategy its paper figures are looked up under and its heading."""
    columns = [
        (s, s.strategy, Text(f"{s.benchmark}\n{s.strategy}\n{s.pool_name}")) for s in summaries
    ]
    if oracle is not None:
        heading = Text(f"{oracle.benchmark}\noracle-best single worker\n(= {oracle.strategy})")
        columns.append((oracle, "oracle-best", heading))
    return columns


def _summary_rows(columns: list[tuple[RunSummary, str, Text]]) -> list[tuple[str, list[Any]]]:
    rows: list[tuple[str, list[Any]]] = [
        (name, [fn(s) for s, _, _ in columns]) for name, fn in _ROWS
    ]
    if any(s.trained_on_samples is not None for s, _, _ in columns):
        # Samples the Conductor saw in training: their scores are not held-out results.
        rows.append(("trained-on samples", [_trained_on(s) for s, _, _ in columns]))
    rows.append(("paper", [_paper_cell(paper_reference(s.paper_key, st)) for s, st, _ in columns]))
    return rows


def _skipped_caption(columns: list[tuple[RunSummary, str, Text]]) -> str | None:
    skipped = sum(s.skipped_lines for s, _, _ in columns)
    if not skipped:
        return None
    return f"{plural(skipped, 'unreadable line')} in samples.jsonl were skipped"


def summary_table(
    summaries: list[RunSummary], oracle: RunSummary | None = None, title: str = "Bench runs"
) -> Table:
    """Runs side by side, one column each, metrics as rows, the paper's figures last.

    ``oracle`` (see :func:`best_single`) adds an "oracle-best single worker" column
    holding that run's numbers and the paper's best-single-worker figures.
    """
    columns = _summary_columns(summaries, oracle)
    table = Table(title=title, box=box.SIMPLE_HEAD, show_lines=False)
    table.add_column("", style="bold", no_wrap=True)
    for _, _, heading in columns:
        table.add_column(heading)
    for name, cells in _summary_rows(columns):
        table.add_row(name, *cells)
    table.caption = _skipped_caption(columns)
    return table


def _summary_stacked(
    summaries: list[RunSummary], oracle: RunSummary | None, title: str
) -> RenderableType:
    """The summary for a terminal too narrow to set the runs side by side: one table
    per run, headed by the run's label (which wraps between its parts, not inside)."""
    columns = _summary_columns(summaries, oracle)
    rows = _summary_rows(columns)
    parts: list[RenderableType] = [Text(title, style="bold")]
    for i, (_, _, heading) in enumerate(columns):
        table = Table(
            title=Text(" · ".join(heading.plain.split("\n"))),
            box=box.SIMPLE_HEAD,
            show_header=False,
        )
        table.add_column("", style="bold", no_wrap=True)
        table.add_column("")
        for name, cells in rows:
            table.add_row(name, cells[i])
        parts.append(table)
    caption = _skipped_caption(columns)
    if caption:
        parts.append(Text(caption))
    return Group(*parts)


def _summary_view(
    summaries: list[RunSummary], oracle: RunSummary | None, title: str
) -> RenderableType:
    keep = [name for s in [*summaries, oracle] if s for name in (s.strategy, s.pool_name)]
    return Fitted(
        [summary_table(summaries, oracle, title), _summary_stacked(summaries, oracle, title)],
        keep,
    )


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
            f"{counts.get(p, 0)} ({_pct(_ratio(counts.get(p, 0), per_pos[p]), 0)})"
            for p in positions
        ]
        n = sum(counts.values())
        rows.append((w, [*cells, f"{n} ({_pct(_ratio(n, total), 0)})"]))
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
        table.add_row(kind, str(count), _pct(_ratio(count, n)))
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


def report_renderables(run_dirs: list[Path]) -> list[RenderableType]:
    """What ``conductor report DIR [DIR...]`` shows: the summary table (with an
    oracle-best column per benchmark that has several ``single:*`` runs), then the
    usage and topology tables of each Conductor run."""
    summaries = [summarize_run(Path(d)) for d in run_dirs]
    by_bench: dict[str, list[RunSummary]] = {}
    for s in summaries:
        by_bench.setdefault(s.benchmark, []).append(s)
    out: list[RenderableType] = []
    for bench, runs in by_bench.items():
        singles = [s for s in runs if s.strategy.startswith("single:")]
        oracle = best_single(singles) if len(singles) >= 2 else None
        title = f"Bench runs: {bench}" if len(by_bench) > 1 else "Bench runs"
        out.append(_summary_view(runs, oracle, title))
    for s in summaries:
        if s.strategy == "conductor":
            if s.worker_usage:
                out.append(_usage_view(s))
            out.append(topology_table(s))
        limits = rate_limit_table(s)
        if limits is not None:
            out.append(limits)
    return out
