"""Accuracy against cost per question, as a static chart (PNG or SVG) for papers and pages.

One point per run, with its 95% intervals on both axes (Wilson on accuracy, a bootstrap
over the run's questions on cost), the Pareto frontier (the runs no other run beats on
both cost and accuracy) and, when two or more single-worker runs are given, the
best-single-worker oracle marked.  Accuracies are fractions in [0, 1] (drawn as
percentages), costs USD per question.

The runs' labels stand in a column right of the plot, one line each in the order of
their points' heights, each joined to its point by a thin line: however many runs,
however long their names and however close their points (the same point, even), no
two labels overlap.  The figure grows taller to give every label its line, and a label
longer than :data:`LABEL_CHARS` loses its middle, which keeps the start and the end
that tell similar names apart.

matplotlib is imported only when a chart is drawn (it is the ``view`` extra), and only
through its object API with the Agg and SVG canvases: no pyplot, no global backend.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import MissingDependencyError, UsageError, install_hint
from ..runs.stats import mean_interval, pareto_front, wilson_interval
from ..text import printable

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..runs.summary import RunSummary

__all__ = [
    "PLOT_SUFFIXES",
    "RunPoint",
    "accuracy_cost_plot",
    "accuracy_cost_svg",
    "bench_run_points",
    "oracle_index",
    "require_matplotlib",
    "run_point",
    "short_label",
    "spread",
]

INSTALL_HINT = install_hint("view")
#: The files ``accuracy_cost_plot`` writes, by suffix.
PLOT_SUFFIXES = (".png", ".svg")
#: The labels' size, and the distance between two labels' middles (points): room for
#: one line of text and a gap, in any font a browser draws the SVG's text in.
LABEL_SIZE = 8.0
LABEL_PITCH = 1.75 * LABEL_SIZE
#: The most characters a label keeps.
LABEL_CHARS = 48
# The frame, in inches: room for the title, the axis labels and ticks, the leader lines.
_LEFT, _BOTTOM, _TOP, _GAP, _RIGHT = 0.8, 0.6, 0.45, 0.3, 0.15
_PLOT_W, _PLOT_H = 5.4, 3.6
_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.DOTALL)


@dataclass(frozen=True)
class RunPoint:
    """One run on the chart: accuracy and cost per question, each with its interval."""

    label: str
    accuracy: float
    acc_lo: float
    acc_hi: float
    cost: float
    cost_lo: float
    cost_hi: float
    #: A single worker alone (``single:W``): drawn as the baselines, and a candidate
    #: for the best-single-worker oracle.
    is_single: bool = False


def run_point(
    label: str, correct: int, total: int, costs: Sequence[float], *, is_single: bool = False
) -> RunPoint:
    """A :class:`RunPoint` from a run's counts: ``correct`` of ``total`` graded records,
    and each record's cost (Wilson and bootstrap 95% intervals)."""
    if total <= 0:
        raise ValueError(f"{label}: a run with no records has no accuracy")
    lo, hi = wilson_interval(correct, total)
    cost, cost_lo, cost_hi = mean_interval(costs)
    return RunPoint(label, correct / total, lo, hi, cost, cost_lo, cost_hi, is_single)


def oracle_index(points: Sequence[RunPoint]) -> int | None:
    """The best single-worker run (the most accurate; ties: the cheaper, then the first),
    as :func:`conductor.runs.summary.best_single` picks it; ``None`` unless at least
    two single-worker runs are given (one alone is no choice)."""
    singles = [i for i, p in enumerate(points) if p.is_single]
    if len(singles) < 2:
        return None
    return min(singles, key=lambda i: (-points[i].accuracy, points[i].cost, i))


# --------------------------------------------------------------------------- from bench runs


def _labels(summaries: Sequence[RunSummary], dirs: Sequence[Path]) -> list[str]:
    """Each run's strategy, with its pool and benchmark only where the runs differ in
    them, and its directory's name where that still leaves two runs alike."""
    pools = {s.pool_name for s in summaries}
    benches = {s.benchmark for s in summaries}
    labels = []
    for s in summaries:
        parts = [s.strategy]
        if len(pools) > 1:
            parts.append(s.pool_name)
        if len(benches) > 1:
            parts.append(s.benchmark)
        labels.append(" · ".join(parts))
    return [
        f"{label} ({d.name})" if labels.count(label) > 1 else label
        for label, d in zip(labels, dirs, strict=True)
    ]


def _record_costs(run_dir: Path) -> list[float]:
    """Each counted record's cost (a record of unknown cost counts as 0, as in the
    summary's cost per question)."""
    from ..runs.rundir import SAMPLES, SampleLines, latest_lines

    lines = SampleLines(run_dir / SAMPLES)
    keep = latest_lines(lines)
    costs = []
    # The raw lines, not records: the summary has already checked every one of them.
    for number, data in lines:
        if number in keep:
            cost = (data.get("totals") or {}).get("cost_usd")
            costs.append(float(cost) if isinstance(cost, int | float) else 0.0)
    return costs


def bench_run_points(runs: Sequence[Path]) -> tuple[list[RunPoint], list[tuple[Path, str]]]:
    """The points of bench run directories (a ``singles`` run stands for its
    ``single-*`` directories), and the runs left off with why (no graded record, or
    no call of known price)."""
    from ..runs.rundir import run_dirs
    from ..runs.summary import summarize_run

    dirs = [d for r in runs for d in (run_dirs(Path(r)) or [Path(r)])]
    summaries = [summarize_run(d) for d in dirs]
    labels = _labels(summaries, dirs)
    points: list[RunPoint] = []
    left_out: list[tuple[Path, str]] = []
    for d, s, label in zip(dirs, summaries, labels, strict=True):
        if not s.n_records:
            left_out.append((d, "it holds no records yet"))
            continue
        if s.cost_per_question is None:
            left_out.append((d, "no call of it has a known price"))
            continue
        if s.cost_is_lower_bound:
            label += " (some calls unpriced)"  # its cost is a lower bound
        correct = s.status_counts.get("correct", 0)
        single = s.strategy.startswith("single:")
        points.append(run_point(label, correct, s.n_records, _record_costs(d), is_single=single))
    return points, left_out


# --------------------------------------------------------------------------- drawing


def require_matplotlib() -> None:
    """Raise :class:`~conductor.errors.MissingDependencyError` (with the install line)
    unless matplotlib can be imported: a command checks before it does other work."""
    _figure_class()


def _figure_class() -> type[Figure]:
    try:
        import matplotlib  # noqa: F401  (a missing parent fails here, not half-way in)
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependencyError(f"drawing a chart needs matplotlib: {INSTALL_HINT}") from exc
    return Figure


def _plain(text: str) -> str:
    # matplotlib reads text between two "$" as TeX; a run's label is plain text.
    return text.replace("$", r"\$")


def short_label(label: str, limit: int = LABEL_CHARS) -> str:
    """``label`` on one line (a newline would make it two lines tall) and at most
    ``limit`` characters, cut in the middle: similar names differ at their ends."""
    flat = " ".join(printable(label).split())
    if len(flat) <= limit:
        return flat
    head = (limit - 1) // 2
    return flat[:head].rstrip() + "…" + flat[len(flat) - (limit - 1 - head) :].lstrip()


def spread(wanted: Sequence[float], low: float, high: float, pitch: float) -> list[float]:
    """Heights for labels that want to stand at ``wanted``, in the same order, each at
    least ``pitch`` above the one below and inside [``low``, ``high``] (which must hold
    them: ``high - low >= (len(wanted) - 1) * pitch``).

    Labels too close together form a block, centred on their wishes' mean and moved
    inside the bounds; a block that then reaches the one below joins it, and so on, so
    that each label stands as near its point's height as the others allow.
    """
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    blocks: list[tuple[float, list[int]]] = []  # (the lowest label's height, labels)
    for i in order:
        members = [i]
        while True:
            k = len(members)
            mean = sum(wanted[j] for j in members) / k
            bottom = min(max(mean - (k - 1) * pitch / 2, low), high - (k - 1) * pitch)
            below = blocks[-1] if blocks else None
            if below is None or below[0] + len(below[1]) * pitch <= bottom:
                blocks.append((bottom, members))
                break
            blocks.pop()
            members = below[1] + members
    at = [0.0] * len(wanted)
    for bottom, members in blocks:
        for n, i in enumerate(members):
            at[i] = bottom + n * pitch
    return at


def _label_column(ax: Any, points: Sequence[RunPoint], height_pt: float, width_pt: float) -> None:
    """Each run's label in the column right of the plot, joined to its point (an
    annotation with gid ``run-label-I``, I the point's place in ``points``)."""
    y0, y1 = ax.get_ylim()  # the limits autoscaling chose: the points' heights follow
    wanted = [(100 * p.accuracy - y0) / (y1 - y0) * height_pt for p in points]
    # Points of the same height: the first run's label on top.
    ties = [w - 1e-9 * i for i, w in enumerate(wanted)]
    half = LABEL_PITCH / 2
    heights = spread(ties, half, height_pt - half, LABEL_PITCH)
    for i, (p, y) in enumerate(zip(points, heights, strict=True)):
        label = ax.annotate(
            _plain(short_label(p.label)),
            (p.cost, 100 * p.accuracy),
            xytext=(width_pt + _GAP * 72, y),
            textcoords="axes points",
            ha="left",
            va="center",
            fontsize=LABEL_SIZE,
            color="#333333",
            annotation_clip=False,
            zorder=1,  # under the points, their bars and the legend
            arrowprops={
                "arrowstyle": "-",
                "relpos": (0.0, 0.5),  # from the label's left side, not through its text
                "color": "#b0b0b0",
                "linewidth": 0.6,
                "shrinkA": 2,
                "shrinkB": 3,
            },
            gid=f"run-label-{i}",
        )
        label.arrow_patch.set_gid(f"run-leader-{i}")


def _column_width(points: Sequence[RunPoint]) -> float:
    """The label column's width in inches: the widest label as matplotlib measures it
    in its own font, with a fifth more for a browser's."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    font = FontProperties(size=LABEL_SIZE)
    measure = TextToPath()
    widest = max(
        measure.get_text_width_height_descent(_plain(short_label(p.label)), font, ismath=False)[0]
        for p in points
    )
    return 1.2 * widest / 72 + 0.1


def _bars(values: Sequence[tuple[float, float, float]], scale: float) -> list[list[float]]:
    """Error-bar lengths below and above each (value, lo, hi).  An interval computed
    apart from its value (a bootstrap's ends beside a summary's mean) may miss it by a
    rounding error; a bar is never negative."""
    return [
        [scale * max(0.0, v - lo) for v, lo, _ in values],
        [scale * max(0.0, hi - v) for v, _, hi in values],
    ]


def _figure(
    points: Sequence[RunPoint], title: str | None = None, ceiling: float | None = None
) -> Figure:
    """The chart as a matplotlib figure (the frontier line has gid ``pareto``, the
    oracle marker ``oracle``, the per-question oracle ``ceiling``, a horizontal line at
    that accuracy, gid ``ceiling``)."""
    if not points:
        raise UsageError("there is no run to plot")
    # The plot is as tall as its labels need, one line each.
    plot_h = max(_PLOT_H, (len(points) + 1) * LABEL_PITCH / 72)
    width = _LEFT + _PLOT_W + _GAP + _column_width(points) + _RIGHT
    height = _BOTTOM + plot_h + _TOP
    fig = _figure_class()(figsize=(width, height))
    # Placed by hand, not by a layout engine: the labels' places are reckoned in the
    # plot's own size, which must not change once they are placed.
    ax = fig.add_axes((_LEFT / width, _BOTTOM / height, _PLOT_W / width, plot_h / height))
    costs = [p.cost for p in points]
    if min(costs) > 0 and max(costs) / min(costs) > 20:
        ax.set_xscale("log")  # single workers' prices span orders of magnitude
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.margins(x=0.08, y=0.1)
    for single, colour, marker, name in (
        (True, "#8c8c8c", "o", "single worker"),
        (False, "#1f5fa8", "D", "Conductor and other strategies"),
    ):
        group = [p for p in points if p.is_single == single]
        if not group:
            continue
        ax.errorbar(
            [p.cost for p in group],
            [100 * p.accuracy for p in group],
            xerr=_bars([(p.cost, p.cost_lo, p.cost_hi) for p in group], 1.0),
            yerr=_bars([(p.accuracy, p.acc_lo, p.acc_hi) for p in group], 100.0),
            fmt=marker,
            color=colour,
            ecolor=colour,
            elinewidth=1,
            capsize=3,
            markersize=6,
            label=name,
            zorder=3,
        )
    front = pareto_front([(p.cost, p.accuracy) for p in points])
    ax.plot(
        [points[i].cost for i in front],
        [100 * points[i].accuracy for i in front],
        linestyle="--",
        color="#d98c1f",
        linewidth=1.4,
        label="Pareto frontier",
        gid="pareto",
        zorder=2,
    )
    best = oracle_index(points)
    if best is not None:
        ax.plot(
            [points[best].cost],
            [100 * points[best].accuracy],
            marker="*",
            markersize=16,
            linestyle="none",
            markerfacecolor="none",
            markeredgecolor="#b8860b",
            markeredgewidth=1.5,
            label="best single worker (oracle)",
            gid="oracle",
            zorder=4,
        )
    if ceiling is not None:
        ax.axhline(
            100 * ceiling,
            linestyle=":",
            color="#6a3d9a",
            linewidth=1.2,
            label="per-question oracle (the best single on each question)",
            gid="ceiling",
            zorder=2,
        )
    ax.set_xlabel("cost per question (USD)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(_plain(title or "Accuracy against cost per question (95% intervals)"), fontsize=11)
    ax.grid(True, linewidth=0.4, alpha=0.5)
    # Opaque, and over the labels' leader lines (zorder 1), which may cross it.
    ax.legend(fontsize=8, loc="lower right", framealpha=1.0).set_zorder(5)
    _label_column(ax, points, plot_h * 72, _PLOT_W * 72)
    return fig


def _save(fig: Figure, target: Any, fmt: str, text_as_paths: bool) -> None:
    from matplotlib import rc_context

    # A fixed salt and no date: the same runs give the same file, byte for byte.
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    fonttype = "path" if text_as_paths else "none"
    with rc_context({"svg.hashsalt": "conductor", "svg.fonttype": fonttype}):
        fig.savefig(target, format=fmt, dpi=150, metadata=metadata)


def accuracy_cost_plot(
    runs: Sequence[RunPoint],
    path: Path,
    *,
    title: str | None = None,
    ceiling: float | None = None,
) -> None:
    """Write the chart to ``path``: PNG or SVG by its suffix (any other is a
    :class:`~conductor.errors.UsageError`); ``ceiling``, the per-question oracle's
    accuracy, is drawn as a line across it."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise UsageError(
            f"{path}: a chart is written as .png or .svg, not {suffix or 'a file without suffix'}"
        )
    fig = _figure(runs, title, ceiling)
    try:
        _save(fig, path, suffix[1:], text_as_paths=True)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write the chart ({exc.strerror or exc})") from None


def accuracy_cost_svg(
    runs: Sequence[RunPoint], *, title: str | None = None, ceiling: float | None = None
) -> str:
    """The chart as one ``<svg>`` element to put inside a page (no XML prolog; text as
    text, so a page's search finds the labels); ``ceiling`` as for
    :func:`accuracy_cost_plot`."""
    buffer = io.StringIO()
    _save(_figure(runs, title, ceiling), buffer, "svg", text_as_paths=False)
    text = buffer.getvalue()
    # The prolog cannot stand inside a page; the metadata is only matplotlib's credits.
    return _METADATA.sub("", text[text.index("<svg") :]).strip()
