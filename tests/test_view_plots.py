"""The accuracy-against-cost chart: valid PNG and SVG, the frontier and oracle drawn
where the statistics put them, and the points a bench run directory gives."""

from __future__ import annotations

import re
import struct
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from kit.records import record, round_of, single_dir, write_run

from conductor.errors import MissingDependencyError, UsageError
from conductor.runs.stats import pareto_front, wilson_interval
from conductor.view.plots import (
    RunPoint,
    _figure,
    accuracy_cost_plot,
    accuracy_cost_svg,
    bench_run_points,
    oracle_index,
    run_point,
    short_label,
    spread,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def point(label: str, acc: float, cost: float, single: bool = False) -> RunPoint:
    return RunPoint(label, acc, acc - 0.05, acc + 0.05, cost, cost * 0.9, cost * 1.1, single)


POINTS = [
    point("conductor", 0.70, 0.012),
    point("single:a", 0.60, 0.025, True),
    point("single:b <&> $x$", 0.65, 0.055, True),
    point("single:c", 0.40, 0.0015, True),
    point("moa", 0.72, 0.09),
    point("vote", 0.55, 0.2),
]


def test_png_is_a_png_of_a_sensible_size(tmp_path: Path) -> None:
    out = tmp_path / "chart.png"
    accuracy_cost_plot(POINTS, out)
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    # The IHDR chunk comes first: its width and height are big-endian 32-bit ints.
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert 600 <= width <= 3000 and 400 <= height <= 2000
    assert 10_000 < len(data) < 2_000_000


def test_svg_file_and_inline_svg_parse(tmp_path: Path) -> None:
    out = tmp_path / "chart.SVG"
    accuracy_cost_plot(POINTS, out)
    root = ET.parse(out).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    inline = accuracy_cost_svg(POINTS)
    assert inline.startswith("<svg") and inline.endswith("</svg>")
    assert "<?xml" not in inline and "<!DOCTYPE" not in inline
    assert ET.fromstring(inline).tag == "{http://www.w3.org/2000/svg}svg"
    assert inline == accuracy_cost_svg(POINTS)  # no dates, no random ids
    # Labels are text in the inline form, escaped, and "$" is not read as TeX.
    assert "single:b &lt;&amp;&gt; $x$" in inline
    # Self-contained: every reference points inside the picture.
    assert all(href.startswith("#") for href in re.findall(r'href="([^"]*)"', inline))
    assert "<metadata>" not in inline


def test_frontier_and_oracle_are_drawn_where_the_statistics_put_them() -> None:
    front = pareto_front([(p.cost, p.accuracy) for p in POINTS])
    # c (cheapest), conductor (beats a and b for less), moa (the most accurate).
    assert front == [3, 0, 4]
    fig = _figure(POINTS)
    (ax,) = fig.axes
    lines = {line.get_gid(): line for line in ax.get_lines() if line.get_gid()}
    assert list(lines["pareto"].get_xdata()) == [POINTS[i].cost for i in front]
    assert list(lines["pareto"].get_ydata()) == [100 * POINTS[i].accuracy for i in front]
    assert oracle_index(POINTS) == 2  # b: the most accurate single worker
    assert list(lines["oracle"].get_xdata()) == [POINTS[2].cost]
    # One single worker alone is no oracle.
    no_oracle = _figure([POINTS[0], POINTS[1]])
    assert "oracle" not in {line.get_gid() for line in no_oracle.axes[0].get_lines()}


def test_an_interval_beside_its_value_by_a_rounding_error_is_drawn() -> None:
    # A summary's mean and a bootstrap's ends differ in the last bits (sum vs fsum).
    cost = 0.1 + 0.2
    p = RunPoint("r", 0.5, 0.5 + 1e-12, 0.6, cost, 0.30000000000000004 + 1e-15, 0.31)
    svg = accuracy_cost_svg([p, POINTS[0]])
    assert ET.fromstring(svg).tag == "{http://www.w3.org/2000/svg}svg"


def test_oracle_ties_go_to_the_cheaper_run() -> None:
    tie = [point("x", 0.5, 0.3, True), point("y", 0.5, 0.1, True), point("z", 0.2, 0.01, True)]
    assert oracle_index(tie) == 1


def test_wrong_suffix_and_no_points(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"\.png or \.svg"):
        accuracy_cost_plot(POINTS, tmp_path / "chart.jpg")
    with pytest.raises(UsageError, match="no run to plot"):
        accuracy_cost_plot([], tmp_path / "chart.png")


def test_missing_matplotlib_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(
        MissingDependencyError, match=r"pip install 'conductor-orchestrate\[view\]'"
    ):
        accuracy_cost_plot(POINTS, tmp_path / "chart.png")
    assert not (tmp_path / "chart.png").exists()


def test_run_point_intervals() -> None:
    p = run_point("r", 8, 20, [0.01] * 10 + [0.03] * 10)
    assert p.accuracy == 0.4
    assert (p.acc_lo, p.acc_hi) == wilson_interval(8, 20)
    assert p.cost == pytest.approx(0.02)
    assert p.cost_lo < 0.02 < p.cost_hi
    with pytest.raises(ValueError):
        run_point("empty", 0, 0, [])


def test_points_of_bench_runs(tmp_path: Path) -> None:
    # single-gemini: 3 of 5 right at $0.001; single-claude: 4 of 5 at $0.002.
    single_dir(tmp_path / "singles", 0, 3)
    single_dir(tmp_path / "singles", 1, 4)
    costs = [0.01, 0.03, 0.02, None]
    cond = write_run(
        tmp_path / "cond",
        "conductor",
        [
            record(
                f"s{i}",
                0,
                "correct" if i < 2 else "incorrect",
                [round_of(0, [(0, [])])],
                wall=1.0,
                cost=c,
            )
            for i, c in enumerate(costs)
        ],
    )
    unpriced = write_run(
        tmp_path / "unpriced",
        "single:gpt",
        [record("s0", 0, "correct", [round_of(0, [(2, [])], tries=0)], wall=1.0, cost=None)],
    )
    points, left_out = bench_run_points([cond, tmp_path / "singles", unpriced])
    assert left_out == [(unpriced, "no call of it has a known price")]
    by_label = {p.label: p for p in points}
    # One record's cost is unknown: the run's cost is a lower bound, and its label says so.
    assert sorted(by_label) == ["conductor (some calls unpriced)", "single:claude", "single:gemini"]
    c = by_label["conductor (some calls unpriced)"]
    assert c.accuracy == 0.5 and (c.acc_lo, c.acc_hi) == wilson_interval(2, 4)
    # An unknown cost counts as 0, as in the summary's cost per question: 0.06 / 4.
    assert c.cost == pytest.approx(0.015) and not c.is_single
    assert by_label["single:claude"].accuracy == 0.8 and by_label["single:claude"].is_single
    assert by_label["single:gemini"].cost == pytest.approx(0.001)

    # A run with an unpriced call is drawn at its lower bound, and says so.
    partly = write_run(
        tmp_path / "partly",
        "moa",
        [record("s0", 0, "correct", [round_of(0, [(2, [])])], wall=1.0, unknown_calls=1)],
    )
    (p,), _ = bench_run_points([partly])
    assert p.label == "moa (some calls unpriced)" and p.cost == pytest.approx(0.01)


def test_spread_keeps_order_and_distance_and_stays_near_the_wishes() -> None:
    # Four labels that want one height stand round it, a pitch apart, in their order.
    assert spread([50.0] * 4, 0, 100, 10) == [35.0, 45.0, 55.0, 65.0]
    # Labels apart already stay where they want to be.
    assert spread([10.0, 60.0, 30.0], 0, 100, 10) == [10.0, 60.0, 30.0]
    # A block at an end is moved inside; a block that reaches another joins it.
    at = spread([0.0, 1.0, 2.0, 50.0, 100.0, 100.0], 0, 100, 10)
    assert at == [0.0, 10.0, 20.0, 50.0, 90.0, 100.0]
    at = spread([40.0, 41.0, 44.0, 46.0, 48.0], 0, 100, 10)
    assert sorted(at) == at and min(b - a for a, b in zip(at[:-1], at[1:], strict=True)) == 10.0
    assert sum(at) / len(at) == 43.8  # centred on the wishes' mean
    # As many labels as fit: all used, none outside.
    assert spread([100.0] * 11, 0, 100, 10) == [10.0 * i for i in range(11)]


def test_a_short_label_is_one_line_and_keeps_both_ends() -> None:
    assert short_label("single:a") == "single:a"
    assert short_label("two\nlines \x1b here") == "two lines \\x1b here"
    long = "math500 · conductor-checkpoint-of-the-grpo-training-run-17 · pool-alpha"
    cut = short_label(long, 30)
    assert len(cut) == 30 and cut.startswith("math500 · cond") and cut.endswith("pool-alpha")


def test_the_labels_of_many_runs_at_one_point_do_not_overlap_in_the_png() -> None:
    # What conductor report --plot draws: the labels as matplotlib itself lays them out.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    points = [point(f"conductor-run-with-a-long-similar-name-{i}", 0.5, 0.01) for i in range(30)]
    fig = _figure(points)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    labels = sorted(
        (t for t in fig.axes[0].texts if (t.get_gid() or "").startswith("run-label-")),
        key=lambda t: int(t.get_gid().rsplit("-", 1)[1]),
    )
    # The text's own box (an annotation's also holds its leader line).
    boxes = [Text.get_window_extent(t, renderer) for t in labels]
    assert len(boxes) == 30
    assert all(fig.bbox.contains(b.x0, b.y0) and fig.bbox.contains(b.x1, b.y1) for b in boxes)
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    # The first run's label on top, then the others in order.
    assert [b.y0 for b in boxes] == sorted((b.y0 for b in boxes), reverse=True)
