"""The scores of bench runs side by side: the one comparison ``conductor report`` shows,
in whichever layout the width allows, and the cells its Markdown summary shares.

- **Runs as columns** (the widest): every figure a row, the paper's figures last.
- **Runs as rows**, three sizes: fewer columns with shorter headers as the width
  shrinks; a caption names what was left out.
- **Runs numbered** (the narrowest): the numbers against a run number, then one line
  per run naming it, so that a long strategy or pool name keeps the whole width.

Never one table per run: the point of the report is to read the runs against each
other.  Which layout is shown is :class:`~conductor.render.fitted.Fitted`'s choice:
the first that keeps every id and every word whole at the width it is given.

The scores themselves are computed in :mod:`conductor.runs.summary`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..bench.paper import PaperFigure, paper_note, paper_reference
from ..runs.summary import RunSummary
from ..text import plural, printable
from .fitted import Fitted
from .format import format_usd, percent

__all__ = [
    "METRICS",
    "Metric",
    "RunEntry",
    "comparison_view",
    "paper_text",
    "run_entries",
    "run_paper",
    "summary_table",
]


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


def _spend(s: RunSummary) -> str:
    """The run's whole cost; with batch calls, beside what it would have cost live."""
    if s.cost_usd is None:
        return "?"
    text = ("≥ " if s.cost_is_lower_bound else "") + format_usd(s.cost_usd)
    if s.batch_calls:
        calls = plural(s.batch_calls, "batch call")
        if s.live_cost_usd:
            share = percent(s.cost_usd / s.live_cost_usd)
            text += f" ({calls}; {share} of {format_usd(s.live_cost_usd)} live)"
        else:
            text += f" ({calls}; live cost unknown)"
    return text


def _cost_brief(s: RunSummary) -> str:
    """The cost without the count of unpriced calls (the caption explains ``≥``)."""
    if s.cost_per_question is None:
        return "?"
    return ("≥ " if s.cost_is_lower_bound else "") + format_usd(s.cost_per_question)


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
        f"{tries} ({percent(s.parse_failure_rate)}); no plan {s.no_workflow_records} "
        f"({percent(s.no_workflow_rate)})"
    )


def _parse_brief(s: RunSummary) -> str:
    if not s.conductor_tries:
        return "-"
    return f"{s.conductor_parse_errors}/{s.conductor_tries}"


def _errors(s: RunSummary) -> str:
    c = s.status_counts
    return (
        f"run {c.get('run_failed', 0)} · grader {c.get('grader_error', 0)} · "
        f"time limit {c.get('time_limit', 0)}"
    )


def _trained_on(s: RunSummary) -> str:
    if s.trained_on_samples is None:
        return "-"
    unchecked = " (holdout unchecked)" if s.trained_unchecked else ""
    return f"{s.trained_on_samples}" + (" (excluded)" if s.trained_excluded else "") + unchecked


def _grading(s: RunSummary) -> str:
    """The grader and the options its benchmark set (``-`` for none recorded)."""
    options = ", ".join(
        f"{k}={v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
        for k, v in sorted(s.grader_options.items())
    )
    name = s.grader or "-"
    return f"{name} ({options})" if options else name


def _sandbox(s: RunSummary) -> str:
    if not s.sandbox_engines:
        return "-"
    if len(s.sandbox_engines) == 1:
        return printable(next(iter(s.sandbox_engines)))
    return " · ".join(f"{printable(k)} {v}" for k, v in s.sandbox_engines.items())


@dataclass(frozen=True)
class Metric:
    """One figure of the comparison.

    ``name`` heads its row when runs are columns (and its column in Markdown);
    ``header`` heads its column when runs are rows, with ``brief`` the shorter cell
    written there (``cell`` when None).  ``tier`` says down to which layout it stays:
    0 in every one, 1 and 2 in the wider rows layouts, 3 only with runs as columns.
    """

    name: str
    header: str
    cell: Callable[[RunSummary], str]
    tier: int
    brief: Callable[[RunSummary], str] | None = None

    def short(self, s: RunSummary) -> str:
        return (self.brief or self.cell)(s)


#: The figures, in the order every layout shows them.
METRICS: tuple[Metric, ...] = (
    Metric("accuracy % ± SE", "accuracy\n% ± SE", _accuracy, 0),
    Metric(
        "samples × epochs",
        "records",
        lambda s: f"{s.n_samples} × {s.epochs} ({plural(s.n_records, 'record')})",
        1,
        brief=lambda s: str(s.n_records),
    ),
    Metric("epoch spread", "epochs\nmin-max", _spread, 3),
    Metric("cost / question", "cost /\nquestion", _cost, 0, brief=_cost_brief),
    Metric("spend", "spend", _spend, 2, brief=lambda s: format_usd(s.cost_usd)),
    Metric(
        "tokens / question",
        "tokens /\nquestion",
        lambda s: (
            f"{_num(s.input_tokens_per_question, 0)} in / "
            f"{_num(s.output_tokens_per_question, 0)} out"
        ),
        2,
        brief=lambda s: _num(
            None
            if s.input_tokens_per_question is None or s.output_tokens_per_question is None
            else s.input_tokens_per_question + s.output_tokens_per_question,
            0,
        ),
    ),
    Metric("calls / question", "calls /\nquestion", lambda s: _num(s.calls_per_question), 1),
    Metric("steps / question", "steps /\nquestion", lambda s: _num(s.steps_per_question), 3),
    Metric("rounds / question", "rounds /\nquestion", lambda s: _num(s.rounds_per_question), 3),
    Metric(
        "latency p50 / p95",
        "latency\np50 (s)",
        lambda s: f"{_num(s.latency_p50)} s / {_num(s.latency_p95)} s",
        2,
        brief=lambda s: _num(s.latency_p50),
    ),
    Metric(
        "queued p50 / p95",
        "queued\np50 (s)",
        lambda s: f"{_num(s.queue_p50)} s / {_num(s.queue_p95)} s",
        3,
        brief=lambda s: _num(s.queue_p50),
    ),
    Metric("cached calls", "cached", lambda s: percent(s.cached_share), 3),
    Metric("truncated calls", "truncated", lambda s: str(s.truncated_calls), 3),
    Metric("parse failures", "parse\nfailures", _parse_failures, 2, brief=_parse_brief),
    Metric(
        "unreadable answers",
        "unreadable",
        lambda s: f"{s.status_counts.get('no_answer', 0)} ({percent(s.no_answer_rate)})",
        3,
    ),
    Metric("errors", "errors", _errors, 1, brief=lambda s: str(s.errors)),
)

#: Shown only when some run records samples its Conductor was trained on: their
#: scores are not held-out results.
TRAINED_ON = Metric("trained-on samples", "trained\non", _trained_on, 3)
#: Shown only when some run graded code: the sandbox engine(s) that ran it, so a run
#: graded without bubblewrap (the user's opt-in) is seen as such.
SANDBOX = Metric("code sandbox", "sandbox", _sandbox, 0)

#: Shown only when some run's benchmark gave its grader options: such a run may be
#: graded otherwise than by the benchmark's official checker (a tolerance, say).
GRADER_OPTIONS = Metric("grader options", "grader", _grading, 0)


@dataclass(frozen=True)
class RunEntry:
    """A run of the comparison: its summary, the strategy its paper figures are looked
    up under, and the parts of its name, printable: benchmark, strategy, pool, and the
    run directory's name when another run of the comparison has the same three.
    ``oracle`` marks the oracle-best entry, whose strategy is the single run it copies."""

    summary: RunSummary
    benchmark: str
    strategy: str
    pool: str
    where: str | None = None
    oracle: bool = False

    @property
    def paper_strategy(self) -> str:
        return "oracle-best" if self.oracle else self.summary.strategy

    @property
    def run(self) -> str:
        """The run's strategy as a row names it."""
        return f"oracle-best = {self.strategy}" if self.oracle else self.strategy

    @property
    def name(self) -> str:
        """The run's name in one line (``strategy · pool``, ``(dir)`` when needed)."""
        name = f"{self.run} · {self.pool}"
        return f"{name} ({self.where})" if self.where else name

    @property
    def ids(self) -> list[str]:
        """The names a layout must keep whole."""
        return [self.strategy, self.pool, self.where or ""]


def run_entries(summaries: list[RunSummary], oracle: RunSummary | None) -> list[RunEntry]:
    """The runs of one comparison, with ``oracle`` (see
    :func:`~conductor.runs.summary.best_single`) as an "oracle-best" entry last."""

    def entry(s: RunSummary, where: str | None = None, is_oracle: bool = False) -> RunEntry:
        names = (printable(s.benchmark), printable(s.strategy), printable(s.pool_name))
        return RunEntry(s, *names, where=where, oracle=is_oracle)

    # Two runs of one strategy and pool (two checkpoints, two dates) would read alike.
    alike = Counter(entry(s).name for s in summaries)
    entries = [
        entry(s, printable(Path(s.run_dir).name) if alike[entry(s).name] > 1 else None)
        for s in summaries
    ]
    if oracle is not None:
        entries.append(entry(oracle, is_oracle=True))
    return entries


def _ids(entries: list[RunEntry]) -> list[str]:
    return [i for e in entries for i in e.ids]


def paper_text(figures: list[PaperFigure]) -> list[tuple[str, str]]:
    """Each figure as (``value method``, ``table, setting``)."""
    out = []
    for f in figures:
        unit = {"tokens_per_question": " tokens/q", "cost_per_question_usd": "/q"}.get(f.metric, "")
        out.append((f"{f.text}{unit} {f.method}", f"{f.table}, {f.setting}"))
    return out


def run_paper(e: RunEntry) -> tuple[list[PaperFigure], str | None]:
    """The paper's figures comparable with ``e``'s run, and, where the paper measured
    them on another set than the run's, a note saying where (no figures then)."""
    s = e.summary
    return (
        paper_reference(s.paper_key, e.paper_strategy, paper_set=s.paper_set),
        paper_note(s.paper_key, e.paper_strategy, paper_set=s.paper_set),
    )


def _paper_cell(e: RunEntry) -> Text:
    """Each figure as ``value method`` over a dim ``(table, setting)`` line; or the
    note saying the paper's figures are on another set."""
    figures, note = run_paper(e)
    if not figures:
        return Text(note or "-", style="dim")
    cell = Text()
    for i, (what, where) in enumerate(paper_text(figures)):
        if i:
            cell.append("\n")
        cell.append(f"{what}\n")
        cell.append(f"({where})", style="dim")
    return cell


def _metrics(entries: list[RunEntry], tier: int) -> list[Metric]:
    trained = any(e.summary.trained_on_samples is not None for e in entries)
    optioned = any(e.summary.grader_options for e in entries)
    sandboxed = any(e.summary.sandbox_engines for e in entries)
    extra = (
        *((TRAINED_ON,) if trained else ()),
        *((GRADER_OPTIONS,) if optioned else ()),
        *((SANDBOX,) if sandboxed else ()),
    )
    return [m for m in (*METRICS, *extra) if m.tier <= tier]


def _skipped_caption(entries: list[RunEntry]) -> str | None:
    skipped = sum(e.summary.skipped_lines for e in entries)
    if not skipped:
        return None
    return f"{plural(skipped, 'unreadable line')} in samples.jsonl were skipped"


def _heading(e: RunEntry) -> Text:
    if e.oracle:
        lines = [e.benchmark, "oracle-best single worker", f"(= {e.strategy})"]
    else:
        lines = [e.benchmark, e.strategy, e.pool] + ([f"({e.where})"] if e.where else [])
    return Text("\n".join(lines))


def _columns_table(entries: list[RunEntry], title: str) -> Table:
    table = Table(title=Text(title), box=box.SIMPLE_HEAD, show_lines=False)
    table.add_column("", style="bold", no_wrap=True)
    for e in entries:
        table.add_column(_heading(e))
    for m in _metrics(entries, 3):
        table.add_row(m.name, *(Text(m.cell(e.summary)) for e in entries))
    papers = [_paper_cell(e) for e in entries]
    table.add_row("paper", *papers)
    table.caption = _skipped_caption(entries)
    return table


def summary_table(
    summaries: list[RunSummary], oracle: RunSummary | None = None, title: str = "Bench runs"
) -> Table:
    """Runs side by side, one column each, metrics as rows, the paper's figures last.

    ``oracle`` (see :func:`~conductor.runs.summary.best_single`) adds an "oracle-best
    single worker" column holding that run's numbers and the paper's
    best-single-worker figures.
    """
    return _columns_table(run_entries(summaries, oracle), title)


def _rows_title(entries: list[RunEntry], title: str) -> tuple[str, bool]:
    """The rows layouts' title, naming the benchmark (and the pool when every run
    shares it, which then leaves the run column); and whether rows name their pool."""
    benchmarks = {e.benchmark for e in entries}
    pools = {e.pool for e in entries}
    if len(benchmarks) == 1 and ":" not in title:
        title = f"{title}: {next(iter(benchmarks))}"
    if len(pools) == 1:
        return f"{title} · pool {next(iter(pools))}", False
    return title, True


def _run_cell(e: RunEntry, with_pool: bool) -> Text:
    name = e.run + (f" · {e.pool}" if with_pool else "")
    return Text(name + (f" ({e.where})" if e.where else ""))


def _caption(entries: list[RunEntry], shown: list[Metric]) -> str:
    """What the rows layouts leave out and how to see it; what ``≥`` means."""
    more = len(_metrics(entries, 3)) - len(shown)
    lines = [f"a wider terminal (or COLUMNS) shows {plural(more, 'more figure')} and the paper's"]
    if any(e.summary.cost_is_lower_bound for e in entries):
        lines.append("≥: a lower bound, some calls had no known price")
    skipped = _skipped_caption(entries)
    if skipped:
        lines.append(skipped)
    return "\n".join(lines)


def _rows_table(entries: list[RunEntry], title: str, tier: int) -> Table:
    """Runs as rows, with the figures of ``tier`` and below as columns."""
    heading, with_pool = _rows_title(entries, title)
    shown = _metrics(entries, tier)
    table = Table(title=Text(heading), box=box.SIMPLE_HEAD, caption_justify="left")
    table.add_column("run")
    for m in shown:
        table.add_column(m.header, justify="right", no_wrap=True)
    for e in entries:
        table.add_row(_run_cell(e, with_pool), *(Text(m.short(e.summary)) for m in shown))
    table.caption = Text(_caption(entries, shown))
    return table


def _numbered(entries: list[RunEntry], title: str) -> RenderableType:
    """The narrowest layout: the figures of every layout against a run number, then
    one line per run naming it (the whole width for a long name)."""
    heading, with_pool = _rows_title(entries, title)
    shown = _metrics(entries, 0)
    table = Table(title=Text(heading), box=box.SIMPLE_HEAD, caption_justify="left")
    table.add_column("run", justify="right", no_wrap=True)
    for m in shown:
        table.add_column(m.header, justify="right", no_wrap=True)
    for i, e in enumerate(entries, 1):
        table.add_row(str(i), *(Text(m.short(e.summary)) for m in shown))
    names = Text()
    for i, e in enumerate(entries, 1):
        names.append(f"\n{i}  " if i > 1 else f"{i}  ", style="bold")
        names.append(_run_cell(e, with_pool))
    return Group(table, names, Text(_caption(entries, shown)))


def comparison_view(
    summaries: list[RunSummary], oracle: RunSummary | None, title: str
) -> RenderableType:
    """The runs of one benchmark compared, laid out for the width it is printed at
    (see the module's docstring)."""
    entries = run_entries(summaries, oracle)
    layouts: list[RenderableType] = [
        _columns_table(entries, title),
        *(_rows_table(entries, title, tier) for tier in (2, 1, 0)),
        _numbered(entries, title),
    ]
    return Fitted(layouts, _ids(entries), whole_words=True)
