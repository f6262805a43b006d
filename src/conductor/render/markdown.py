"""Bench runs as a GitHub-flavoured Markdown summary (``--markdown FILE`` on ``bench``
and ``report``), fit for ``$GITHUB_STEP_SUMMARY`` or a pull-request comment.

One table per benchmark, a run per row (the oracle-best single worker last, as in the
report), with the report's figures (:data:`~conductor.render.comparison.METRICS`,
the same cells), the accuracy's 95% Wilson interval and the paper's figures; with
``--fail-under``, a column saying which runs pass and a line naming those that do not.

Names come from run directories and may hold anything: every cell is made inert here
(control characters written out, line breaks made spaces, and each character Markdown
or GitHub would act on, ``|`` included, escaped with a backslash), so a name cannot
end its cell, start a link, an image, HTML or math.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..runs.stats import wilson_interval
from ..runs.summary import RunSummary, best_single, falls_short
from ..text import printable
from .comparison import METRICS, RunEntry, paper_text, run_entries, run_paper

__all__ = ["markdown_cell", "markdown_summary"]

# Every ASCII punctuation character CommonMark lets a backslash escape that could
# start something in a table cell: emphasis, code, links and images, autolinks and
# HTML, entities, strikethrough, GitHub's math, and the cell's own end.
_ACTIVE = re.compile(r"([\\`*_\[\]<>|~&$!#])")


def markdown_cell(text: object) -> str:
    """``text`` as the inert content of one table cell."""
    flat = " ".join(printable(str(text)).split())
    return _ACTIVE.sub(r"\\\1", flat) or " "


def _interval(s: RunSummary) -> str:
    if not s.n_records:
        return "-"
    lo, hi = wilson_interval(s.status_counts.get("correct", 0), s.n_records)
    return f"{100 * lo:.1f}-{100 * hi:.1f}"


def _paper(e: RunEntry) -> str:
    figures, note = run_paper(e)
    return "; ".join(f"{what} ({where})" for what, where in paper_text(figures)) or note or "-"


def _status(e: RunEntry, fail_under: float) -> str:
    if e.oracle:
        return "-"
    return f"below {fail_under:g}%" if falls_short(e.summary, fail_under) else "pass"


def _table(entries: list[RunEntry], fail_under: float | None) -> list[str]:
    header = ["run", METRICS[0].name, "95% interval", *(m.name for m in METRICS[1:]), "paper"]
    if fail_under is not None:
        header.append(f"--fail-under {fail_under:g}%")
    align = ["---", *("---:" for _ in header[1:-1]), "---"]
    rows = []
    for e in entries:
        s = e.summary
        cells = [e.name, METRICS[0].cell(s), _interval(s), *(m.cell(s) for m in METRICS[1:])]
        cells.append(_paper(e))
        if fail_under is not None:
            cells.append(_status(e, fail_under))
        rows.append(cells)
    return [
        "| " + " | ".join(markdown_cell(c) for c in line) + " |" for line in [header, align, *rows]
    ]


def markdown_summary(summaries: Iterable[RunSummary], fail_under: float | None = None) -> str:
    """The Markdown document: a heading and a table per benchmark, then, with
    ``fail_under``, the runs below it."""
    by_bench: dict[str, list[RunSummary]] = {}
    for s in summaries:
        by_bench.setdefault(s.benchmark, []).append(s)
    out = ["## conductor bench", ""]
    short: list[RunEntry] = []
    for bench, runs in by_bench.items():
        singles = [s for s in runs if s.strategy.startswith("single:")]
        oracle = best_single(singles) if len(singles) >= 2 else None
        entries = run_entries(runs, oracle)
        out += [f"### {markdown_cell(bench)}", "", *_table(entries, fail_under), ""]
        if fail_under is not None:
            short += [e for e in entries if not e.oracle and falls_short(e.summary, fail_under)]
    if fail_under is not None:
        if short:
            names = ", ".join(markdown_cell(f"{e.benchmark} · {e.name}") for e in short)
            out.append(f"**Below --fail-under {fail_under:g}%:** {names}.")
        else:
            out.append(f"Every run reaches --fail-under {fail_under:g}%.")
        out.append("")
    # The figures' units, once, for a reader who has not seen the report.
    out.append(
        "Accuracy and its standard error in percent; interval: 95% Wilson; "
        "≥: a lower bound, some calls had no known price."
    )
    return "\n".join(out) + "\n"
