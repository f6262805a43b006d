"""Benchmark samples: the sample heading and grade panel of one record, and the listing of
a bench run's samples (:class:`SampleListing`).

The pieces of one sample's view (:func:`is_bench_sample`, :func:`sample_heading`,
:func:`grade_lines`, :func:`verdict_style`) are shared with the traces of
:mod:`conductor.render.trace`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from ..record import RunRecord
from ..text import plural, printable
from .format import clip, format_tokens, format_usd, shown


def is_bench_sample(record: RunRecord) -> bool:
    """Whether ``record`` is a benchmark sample (``conductor ask`` records have no id)."""
    return record.sample_id is not None or record.grade is not None


def verdict_style(verdict: str) -> str:
    """The rich style a verdict is shown in (green for ``correct``, red for
    ``incorrect``, ...); magenta for a verdict this view does not know."""
    styles = {"correct": "green", "incorrect": "red", "no_answer": "yellow", "ungraded": "dim"}
    return styles.get(verdict, "magenta")


def sample_heading(record: RunRecord) -> Text:
    """``sample <id> · epoch <n>``: the line that heads a bench sample's views."""
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
        return clip(gold)
    return clip(json.dumps(gold, ensure_ascii=False, default=str))


def grade_lines(record: RunRecord) -> list[Text]:
    """The lines of a bench sample's grade: its gold answer, the answer the grader
    extracted, and the verdict with its reason (shared by :func:`grade_panel` and the
    tree trace)."""
    lines = [Text(f"gold: {_gold_text(record.gold)}")]
    grade = record.grade
    if grade is None:
        lines.append(Text("extracted: (not graded: the run failed)"))
        lines.append(Text(f"verdict: {record.verdict}", style=verdict_style(record.verdict)))
        return lines
    extracted = grade.get("extracted")
    lines.append(Text(f"extracted: {clip(str(extracted)) if extracted is not None else '(none)'}"))
    verdict = Text("verdict: ")
    verdict.append(record.verdict, style=verdict_style(record.verdict) + " bold")
    reason = grade.get("reason")
    if reason:
        verdict.append(f" — {clip(str(reason))}")
    lines.append(verdict)
    return lines


def grade_panel(record: RunRecord) -> Panel | None:
    """A bench sample's gold answer, the answer the grader extracted and its verdict with
    the reason; ``None`` for a record that is not a bench sample."""
    record = shown(record)
    if not is_bench_sample(record) or record.verdict == "ungraded":
        return None  # a served run has an id but nothing to grade against
    style = verdict_style(record.verdict)
    body = Text("\n").join(grade_lines(record))
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


def _sample_row(record: RunRecord, steps: int) -> _SampleRow:
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
        return f">={format_usd(row.cost_usd)}" if row.cost_usd else "?"
    return format_usd(row.cost_usd)


def _natural_key(text: str) -> list[Any]:
    """Sort ``item/2`` before ``item/10``: digit runs compare as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in _DIGITS.split(text)]


_DIGITS = re.compile(r"(\d+)")
#: A cell of the list: its text and the name of its style (``None``: unstyled).
_Cell = tuple[str, str | None]
#: The spaces between two columns of the list of samples.
_GAP = 2


class SampleListing:
    """The samples of a bench run, one row per (sample, epoch), in natural id order.

    Reads ``records`` once (a stream: only a small row per record is kept): records, or
    (a record without its rounds, how many of its steps ran), as
    :func:`~conductor.runs.rundir.iter_heads` reads them for speed.  A later
    record of the same (sample, epoch) replaces an earlier one, as in the run's report.
    ``verdict`` shows only the samples with that verdict and ``limit`` the first N
    shown; the counts in the summary line are always over the whole run.  Ids are never
    cut: where the table does not fit the width, the token and time columns go first,
    then each sample takes two lines, its id alone on the first.
    """

    def __init__(
        self,
        records: Iterable[RunRecord | tuple[RunRecord, int]],
        *,
        verdict: str | None = None,
        limit: int | None = None,
    ) -> None:
        from ..runs.rundir import steps_run

        latest: dict[tuple[str, int | None], _SampleRow] = {}
        for item in records:
            record, steps = item if isinstance(item, tuple) else (item, steps_run(item))
            row = _sample_row(record, steps)
            latest[(row.sample_id, row.epoch)] = row
        # Each id's sort key made once (the rows and the ids are sorted by it).
        keys = {r.sample_id: _natural_key(r.sample_id) for r in latest.values()}
        self.rows = sorted(latest.values(), key=lambda r: (keys[r.sample_id], r.epoch or 0))
        self.counts: dict[str, int] = {}
        for row in self.rows:
            self.counts[row.verdict] = self.counts.get(row.verdict, 0) + 1
        self.sample_ids = sorted(keys, key=keys.__getitem__)
        self.epochs = len({r.epoch for r in self.rows})
        self.verdict = verdict
        matching = [r for r in self.rows if verdict is None or r.verdict == verdict]
        self.matching = len(matching)
        self.shown = matching[:limit] if limit is not None else matching
        self._cell_rows: dict[bool, list[list[_Cell]]] = {}
        self._col_widths: dict[bool, list[int]] = {}

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
            line.append(f"{count} {verdict}", style=verdict_style(verdict))
        known = [r.cost_usd for r in self.rows if r.cost_usd is not None]
        partial = len(known) < len(self.rows) or any(r.cost_partial for r in self.rows)
        if partial and not any(known):
            line.append(" · cost ? (unknown prices)")
        else:
            line.append(f" · cost {'>= ' if partial else ''}{format_usd(sum(known))}")
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

    def _cells(self, r: _SampleRow, full: bool) -> list[_Cell]:
        cells: list[_Cell] = [(r.sample_id, "cyan")]
        if self.epochs > 1:
            cells.append((str(r.epoch if r.epoch is not None else "-"), None))
        cells += [(r.verdict, verdict_style(r.verdict)), (str(r.steps), None)]
        cells.append((_row_cost(r), None))
        if full:
            cells.append(
                (f"{format_tokens(r.input_tokens)}/{format_tokens(r.output_tokens)}", None)
            )
            cells.append((f"{r.wall_s:.1f}", None))
        return cells

    def _columns(self, full: bool) -> list[tuple[str, str]]:
        """(header, justify) of each column: the token and time columns when ``full``."""
        cols = [("id", "left")]
        if self.epochs > 1:
            cols.append(("epoch", "right"))
        cols += [("verdict", "left"), ("steps", "right"), ("cost", "right")]
        if full:
            cols += [("tokens\nin/out", "right"), ("time\n(s)", "right")]
        return cols

    def _shown_cells(self, full: bool) -> list[list[_Cell]]:
        """The cells of every row shown, made once (the widths and the lines read them)."""
        if full not in self._cell_rows:
            self._cell_rows[full] = [self._cells(r, full) for r in self.shown]
        return self._cell_rows[full]

    def _widths(self, full: bool) -> list[int]:
        """Each column's width: its widest header line or cell (no cell wraps); worked
        out once (whether the table fits and its lines read it)."""
        if full not in self._col_widths:
            heads = [max(cell_len(line) for line in h.split("\n")) for h, _ in self._columns(full)]
            columns = zip(*self._shown_cells(full), strict=True) if self.shown else ()
            cells = [max(cell_len(text) for text, _style in column) for column in columns]
            self._col_widths[full] = [max(h, *cells[i : i + 1]) for i, h in enumerate(heads)]
        return self._col_widths[full]

    def _fits(self, console: Console, options: ConsoleOptions, full: bool) -> bool:
        """Whether the table fits the width whole."""
        widths = self._widths(full)
        return sum(widths) + _GAP * (len(widths) - 1) <= options.max_width

    def _table(self, console: Console, full: bool) -> list[Segment]:
        """The table as lines of styled segments, laid out as rich's ``box.SIMPLE_HEAD``
        table without edges would be (headers at the foot of their cells, a rule below
        them, two spaces between columns); drawn here, as rich's table took 35 s to lay
        out 100,000 rows.  Segments, not a text: a text of 100,000 lines (appended cell
        by cell, then wrapped and split again to be printed) took most of the time the
        list took."""
        columns = self._columns(full)
        widths = self._widths(full)
        gap = " " * _GAP
        out: list[Segment] = []
        last = len(columns) - 1

        def line(cells: Sequence[_Cell], style: Style | None = None) -> None:
            # Unstyled text (gaps, pads, plain cells) runs together into one segment:
            # a line is a few segments, not one per piece.
            plain: list[str] = []
            for i, (cell, (_h, justify), width) in enumerate(
                zip(cells, columns, widths, strict=True)
            ):
                if i:
                    plain.append(gap)
                text, name = cell
                cell_style = console.get_style(name) or None if name else style
                pad = " " * (width - cell_len(text))
                if justify == "right":
                    plain.append(pad)
                if cell_style is None:
                    plain.append(text)
                else:
                    if plain:
                        out.append(Segment("".join(plain)))
                        plain.clear()
                    out.append(Segment(text, cell_style))
                if justify != "right" and i != last:
                    plain.append(pad)
            plain.append("\n")
            out.append(Segment("".join(plain)))

        heads = [h.split("\n") for h, _ in columns]
        depth = max(len(h) for h in heads)
        header = console.get_style("table.header")
        for k in range(depth):
            # A header of fewer lines sits at the foot of its cell.
            line(
                [(h[k - depth + len(h)] if k >= depth - len(h) else "", None) for h in heads],
                header,
            )
        out.append(Segment("─" * (sum(widths) + _GAP * (len(widths) - 1)) + "\n"))
        for cells in self._shown_cells(full):
            line(cells)
        return out

    def _stacked(self) -> Group:
        lines: list[RenderableType] = []
        for r in self.shown:
            lines.append(Text(r.sample_id, style="cyan", no_wrap=True, overflow="ignore"))
            detail = Text("  ")
            if self.epochs > 1 and r.epoch is not None:
                detail.append(f"epoch {r.epoch} · ")
            detail.append(r.verdict, style=verdict_style(r.verdict))
            detail.append(f" · {plural(r.steps, 'step')} · cost {_row_cost(r)}")
            lines.append(detail)
        return Group(*lines)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.summary()
        if self.shown:
            for full in (True, False):
                if self._fits(console, options, full):
                    yield from self._table(console, full)
                    break
            else:
                yield self._stacked()
        footer = self._footer()
        if footer is not None:
            yield footer


# --------------------------------------------------------------------------- mermaid
