"""Tests of bench run summaries and report tables, on hand-built run directories."""

from __future__ import annotations

import io
import json
import math
import re
import tracemalloc
from pathlib import Path

import pytest
from kit.records import (
    ALL,
    CHAIN3,
    JUDGE,
    SINGLE_G,
    TRIO_POOL,
    kept_round,
    record,
    round_of,
    single_dir,
    write_run,
)
from rich.console import Console, RenderableType

from conductor.bench.paper import PAPER_FIGURES, paper_reference
from conductor.errors import RecordError, UsageError
from conductor.record import (
    RunRecord,
    record_to_dict,
)
from conductor.render.report import report_views, summary_table, topology_table, usage_table
from conductor.runs.summary import (
    best_single,
    current_summary,
    read_summary,
    summarize_run,
    write_summary,
)


def report_renderables(run_dirs: list[Path]) -> list[RenderableType]:
    """What ``conductor report`` shows of ``run_dirs``: the CLI summarises, the renderer
    lays out."""
    return report_views([summarize_run(d) for d in run_dirs])


def render(obj: RenderableType, width: int = 160) -> str:
    console = Console(width=width, file=io.StringIO(), force_terminal=False, color_system=None)
    console.print(obj)
    return console.file.getvalue()  # type: ignore[attr-defined]


def flat(text: str) -> str:
    text = re.sub(r"[│┃├└─┌┐┘┬┴┼╭╮╯╰━┏┓┗┛┣┫┳┻╋]", " ", text)
    return " ".join(text.split())


def conductor_records() -> list[RunRecord]:
    """5 samples x 2 epochs; scores per epoch 40% and 60%; walls 1..10 s."""
    kept = kept_round()
    return [
        record("s1", 0, "correct", [round_of(0, SINGLE_G)], wall=1.0, cached=1),
        record(
            "s1",
            1,
            "correct",
            [round_of(0, [(1, []), (2, ALL)]), kept],
            wall=2.0,
        ),
        record("s2", 0, "correct", [round_of(0, JUDGE)], wall=3.0),
        # Rewritten below (last line wins): this chain must not count.
        record("s2", 1, "correct", [round_of(0, [(0, []), (1, ALL)])], wall=99.0),
        record(
            "s3",
            0,
            "no_answer",
            [round_of(0, CHAIN3, tries=3, parse_errors=2)],
            wall=5.0,
            cost=0.02,
            unknown_calls=1,
        ),
        record("s3", 1, "correct", [round_of(0, SINGLE_G)], wall=6.0),
        record("s4", 0, "incorrect", [round_of(0, None, tries=6, parse_errors=6)], wall=7.0),
        record("s4", 1, "grader_error", [round_of(0, [(1, [])])], wall=8.0),
        record("s5", 0, None, [round_of(0, None, conductor_error=True)], wall=9.0, cost=None),
        record("s5", 1, "correct", [round_of(0, JUDGE)], wall=10.0),
        record("s2", 1, "incorrect", [round_of(0, [(2, [])])], wall=4.0, cached=2),
    ]


@pytest.fixture
def conductor_dir(tmp_path: Path) -> Path:
    # A killed process leaves a cut-off last line.
    return write_run(
        tmp_path / "cond",
        "conductor",
        conductor_records(),
        epochs=2,
        tail='{"schema_version": 1, "sample_id": "s9", "rou',
    )


# --------------------------------------------------------------------------- summarize


def test_scores_and_spread(conductor_dir: Path) -> None:
    s = summarize_run(conductor_dir)
    assert s.n_records == 10
    assert s.n_samples == 5
    assert s.epochs == 2
    assert s.skipped_lines == 1
    assert s.accuracy == pytest.approx(50.0)
    # Per-sample means 1, .5, .5, 0, .5 -> sd sqrt(.125), SE = sd / sqrt(5).
    assert s.stderr == pytest.approx(100 * math.sqrt(0.125) / math.sqrt(5))
    assert s.stderr == pytest.approx(15.8114, abs=1e-4)
    assert s.epoch_accuracy == pytest.approx({0: 40.0, 1: 60.0})
    assert (s.epoch_min, s.epoch_max) == (pytest.approx(40.0), pytest.approx(60.0))
    assert s.epoch_sd == pytest.approx(math.sqrt(200))
    assert s.status_counts == {
        "correct": 5,
        "incorrect": 2,
        "no_answer": 1,
        "grader_error": 1,
        "time_limit": 0,
        "run_failed": 1,
    }
    assert s.errors == 2
    assert s.no_answer_rate == pytest.approx(0.1)
    assert s.label == "gpqa-diamond · conductor · trio"


def test_rates_costs_and_latency(conductor_dir: Path) -> None:
    s = summarize_run(conductor_dir)
    # Tries: 8 ordinary rounds x 1 + 3 + 6 + the kept round's 1 = 18; parse errors 2 + 6.
    assert (s.conductor_parse_errors, s.conductor_tries) == (8, 18)
    assert s.parse_failure_rate == pytest.approx(8 / 18)
    assert s.no_workflow_records == 2
    assert s.no_workflow_rate == pytest.approx(0.2)
    # 8 records at 0.01, one at 0.02 (one unpriced call), one unknown: a lower bound.
    assert s.cost_per_question == pytest.approx(0.01)
    assert s.cost_is_lower_bound
    assert (s.unknown_cost_calls, s.unknown_cost_records) == (1, 1)
    calls = 2 + 4 + 4 + 2 + 6 + 2 + 6 + 2 + 1 + 4
    assert s.calls_per_question == pytest.approx(calls / 10)
    assert s.input_tokens_per_question == pytest.approx(100 * calls / 10)
    assert s.output_tokens_per_question == pytest.approx(10 * calls / 10)
    assert s.cached_share == pytest.approx(3 / calls)
    assert s.steps_per_question == pytest.approx(1.5)
    assert s.rounds_per_question == pytest.approx(1.1)
    # Walls 1..10 (the superseded 99 s record is gone); linear interpolation.
    assert s.latency_p50 == pytest.approx(5.5)
    assert s.latency_p95 == pytest.approx(9.55)


def test_usage_and_topologies(conductor_dir: Path) -> None:
    s = summarize_run(conductor_dir)
    assert s.worker_usage == {
        "gemini": {0: 5},
        "claude": {0: 2, 1: 3},
        "gpt": {0: 1, 1: 1, 2: 3},
    }
    assert s.worker_order == ["gemini", "claude", "gpt"]
    assert s.topology_counts == {
        "single call": 4,
        "chain": 2,
        "no workflow": 2,
        "parallel attempts + judge": 2,
    }
    usage = flat(render(usage_table(s)))
    assert "step 0 step 1 step 2 all steps" in usage
    assert "gemini 5 (62%) 0 (0%) 0 (0%) 5 (33%)" in usage
    assert "gpt 1 (12%) 1 (25%) 3 (100%) 5 (33%)" in usage
    assert "total 8 4 3 15" in usage
    topo = flat(render(topology_table(s)))
    assert "single call 4 40.0%" in topo
    assert "parallel attempts + judge 2 20.0%" in topo


def test_last_line_wins(tmp_path: Path) -> None:
    first = record("a", 0, "correct", [round_of(0, SINGLE_G)], wall=1.0)
    again = record("a", 0, "incorrect", [round_of(0, SINGLE_G)], wall=3.0)
    other = record("b", 0, "correct", [round_of(0, SINGLE_G)], wall=2.0)
    s = summarize_run(write_run(tmp_path / "r", "conductor", [first, other, again]))
    assert (s.n_records, s.n_samples) == (2, 2)
    assert s.accuracy == pytest.approx(50.0)
    assert s.latency_p50 == pytest.approx(2.5)
    s2 = summarize_run(write_run(tmp_path / "r2", "conductor", [again, other, first]))
    assert s2.accuracy == pytest.approx(100.0)


def test_fixed_strategy_has_no_parse_figures(tmp_path: Path) -> None:
    s = summarize_run(single_dir(tmp_path, 1, 4))
    assert s.accuracy == pytest.approx(80.0)
    assert s.parse_failure_rate is None and s.no_workflow_rate is None
    assert s.stderr == pytest.approx(100 * math.sqrt(0.2) / math.sqrt(5))
    assert s.epoch_sd is None


def test_summary_round_trip(conductor_dir: Path) -> None:
    written = write_summary(conductor_dir)
    data = json.loads((conductor_dir / "summary.json").read_text())
    assert data["accuracy"] == pytest.approx(50.0)
    assert data["worker_usage"]["gpt"] == {"0": 1, "1": 1, "2": 3}
    assert read_summary(conductor_dir) == written
    assert read_summary(conductor_dir / "summary.json").epoch_accuracy == {0: 40.0, 1: 60.0}


def test_a_fresh_summary_json_is_read_and_one_older_than_a_source_is_not(
    conductor_dir: Path,
) -> None:
    import os

    write_summary(conductor_dir)
    saved = json.loads((conductor_dir / "summary.json").read_text())
    saved["latency_p95"] = 123.0  # a mark only the file carries
    (conductor_dir / "summary.json").write_text(json.dumps(saved))
    assert current_summary(conductor_dir).latency_p95 == 123.0
    # Any file the summary is made from, changed after it, makes it stale.
    for name in ("samples.jsonl", "config.json"):
        later = (conductor_dir / "summary.json").stat().st_mtime + 5
        os.utime(conductor_dir / name, (later, later))
        assert current_summary(conductor_dir) == summarize_run(conductor_dir)
        os.utime(conductor_dir / "summary.json", (later + 5, later + 5))
        assert current_summary(conductor_dir).latency_p95 == 123.0


def test_missing_pieces_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="nowhere"):
        summarize_run(tmp_path / "nowhere")
    d = tmp_path / "half"
    d.mkdir()
    (d / "config.json").write_text("{}")
    with pytest.raises(UsageError, match=r"half.*samples\.jsonl"):
        report_renderables([d])
    with pytest.raises(RecordError, match="summary.json"):
        read_summary(d)


def test_foreign_line_names_file_and_line(tmp_path: Path) -> None:
    d = write_run(tmp_path / "r", "conductor", [], tail='{"schema_version": 7, "rounds": []}\n')
    with pytest.raises(RecordError, match=r"samples\.jsonl:1: .*schema version 7"):
        summarize_run(d)


@pytest.mark.long
def test_large_run_streams_in_small_memory(tmp_path: Path) -> None:
    d = tmp_path / "big"
    base = record_to_dict(
        record("x", 0, "correct", [round_of(0, [(1, [])], tries=2, parse_errors=1)], wall=1.0)
    )
    # Held in memory, 10,000 such records would take far over 20 MB.
    write_run(d, "conductor", [])
    with (d / "samples.jsonl").open("w") as fh:
        for i in range(10_000):
            base["sample_id"] = f"s{i}"
            base["totals"]["wall_s"] = float(i % 100)
            base["grade"]["status"] = "correct" if i % 4 else "incorrect"
            base["grade"]["score"] = 1.0 if i % 4 else 0.0
            fh.write(json.dumps(base) + "\n")
    tracemalloc.start()
    try:
        s = summarize_run(d)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000
    assert s.n_records == 10_000
    assert s.accuracy == pytest.approx(75.0)
    assert s.parse_failure_rate == pytest.approx(0.5)
    assert s.worker_usage["claude"] == {0: 10_000}
    assert s.latency_p50 == pytest.approx(49.5)


# --------------------------------------------------------------------------- paper


def test_paper_reference_figures() -> None:
    gpqa = paper_reference("GPQA-D", "conductor", paper_set=True)
    assert [(f.table, f.method, f.text) for f in gpqa] == [
        ("Table 1", "Conductor", "87.5"),
        ("Table 8", "Conductor", "81.31"),
        ("Table 8", "recursive Conductor", "82.32"),
    ]
    assert gpqa[1].label == "Table 8 (constrained, out of domain): Conductor"
    moa = {(f.table, f.metric): f.value for f in paper_reference("MATH500", "moa", paper_set=True)}
    assert moa == {
        ("Table 7", "accuracy"): 83.10,
        ("Table 6", "tokens_per_question"): 11203,
        ("Table 6", "cost_per_question_usd"): 0.0486,
    }
    cond_lcb = {
        (f.table, f.metric): f.text for f in paper_reference("LCB", "conductor", paper_set=True)
    }
    assert cond_lcb[("Table 6", "tokens_per_question")] == "1,820"
    assert cond_lcb[("Table 6", "cost_per_question_usd")] == "$0.0238"
    assert cond_lcb[("Table 7", "accuracy")] == "64.29"
    gem = paper_reference("GPQA-D", "single:gemini-2.5-pro", paper_set=True)
    assert [(f.table, f.text) for f in gem] == [("Table 1", "84.8"), ("Table 8", "75.25")]
    local = paper_reference("MMLU", "single:smollm2", paper_set=True)
    assert [f.text for f in local] == ["91.4", "92.4", "93.5", "91.53"]
    oracle = paper_reference("BCB", "oracle-best", paper_set=True)
    assert [(f.method, f.text) for f in oracle] == [
        ("Gemini 2.5 Pro", "37.51"),
        ("best single worker (Gemini)", "35.1"),
    ]
    assert paper_reference("AIME24", "conductor", paper_set=True) == []
    assert paper_reference(None, "conductor", paper_set=True) == []
    assert paper_reference("GPQA-D", "vote:5:gpt", paper_set=True) == []
    # Every text reads back as its value (no slip between the two copies).
    for f in PAPER_FIGURES:
        assert float(f.text.replace(",", "").replace("$", "")) == f.value


# --------------------------------------------------------------------------- tables


def test_summary_table_with_paper_column(conductor_dir: Path) -> None:
    s = summarize_run(conductor_dir)
    out = flat(render(summary_table([s]), width=200))
    assert "accuracy % ± SE 50.00 ± 15.81" in out
    assert "5 × 2 (10 records)" in out
    assert "epoch spread 40.00-60.00 (sd 14.14)" in out
    assert "≥ $0.01 (1 unpriced call)" in out
    assert "latency p50 / p95 5.50 s / 9.55 s" in out
    assert "parse failures 8/18 tries (44.4%); no plan 2 (20.0%)" in out
    assert "unreadable answers 1 (10.0%)" in out
    assert "errors run 1 · grader 1 · time limit 0" in out
    assert "paper 87.5 Conductor (Table 1, unconstrained)" in out
    assert "81.31 Conductor (Table 8, constrained, out of domain)" in out
    assert "82.32 recursive Conductor (Table 8, constrained, out of domain)" in out
    assert "1 unreadable line in samples.jsonl" in out


def test_best_single_and_report(tmp_path: Path, conductor_dir: Path) -> None:
    dirs = [single_dir(tmp_path, 0, 3), single_dir(tmp_path, 1, 4), single_dir(tmp_path, 2, 2)]
    summaries = [summarize_run(d) for d in dirs]
    best = best_single([summarize_run(conductor_dir), *summaries])
    assert best is not None and best.strategy == "single:claude"
    assert best_single([summarize_run(conductor_dir)]) is None
    # A tie goes to the cheaper run (gemini costs less per question than gpt).
    tie = [summarize_run(single_dir(tmp_path / "t", 2, 3)), summaries[0]]
    assert best_single(tie) is summaries[0]

    parts = report_renderables([conductor_dir, *dirs])
    assert len(parts) == 3  # summary, usage, topology
    out = flat(render(parts[0], width=260))
    assert "oracle-best single worker" in out and "(= single:claude)" in out
    assert "80.00 ± 20.00" in out
    claude = flat(render(summary_table([summaries[1]]), width=200))
    assert "paper 77.7 Claude Sonnet 4 (Table 1, unconstrained)" in claude
    assert "Worker usage by step position" in render(parts[1])
    assert "Workflow topologies" in render(parts[2])
    # One single run alone gets no oracle column.
    one = flat(render(report_renderables([dirs[0]])[0], width=200))
    assert "oracle-best" not in one


# --------------------------------------------------------------------------- widths

#: Names longer than any column a narrow table could give them (but within 40 columns).
LONG_STRATEGIES = [
    "conductor",
    *(f"single:{w}-sonnet-4-5-reasoner-{i}" for i, w in enumerate(["claude", "gemini"] * 3)),
]
LONG_POOL = "a-pool-whose-name-runs-on-and-on"


def comparison_runs(tmp_path: Path, n: int, long: bool) -> list[tuple[Path, str, str]]:
    """``n`` runs of one benchmark and pool: (directory, strategy, accuracy cell).  Run
    ``i`` answers ``i + 2`` of ``n + 3`` samples right, so that no accuracy equals
    another, nor any standard error (which it would at 1 right, or 0)."""
    strategies = LONG_STRATEGIES if long else ["conductor", *(f"single:w{i}" for i in range(6))]
    pool = {**TRIO_POOL, "name": LONG_POOL if long else "trio"}
    out = []
    for i in range(n):
        recs = [
            record(f"s{k}", 0, "correct" if k < i + 2 else "incorrect", [round_of(0, SINGLE_G)],
                   wall=1.0, cost=0.000046)
            for k in range(n + 3)
        ]  # fmt: skip
        strategy = strategies[i]
        d = write_run(tmp_path / f"run{i}", strategy, recs, pool=pool)
        out.append((d, strategy, f"{100 * (i + 2) / (n + 3):.2f}"))
    return out


@pytest.mark.parametrize("long", [False, True], ids=["short-names", "long-names"])
@pytest.mark.parametrize("n", [1, 2, 6])
@pytest.mark.parametrize("width", [40, 60, 80, 120, 200])
def test_report_is_one_comparison_at_any_width(
    tmp_path: Path, width: int, n: int, long: bool
) -> None:
    runs = comparison_runs(tmp_path, n, long)
    out = render(report_renderables([d for d, _, _ in runs])[0], width=width)
    lines = out.splitlines()
    assert all(len(line) <= width for line in lines), out
    assert "…" not in out, out
    # One table: its title and its accuracy heading once, never once per run.
    assert out.count("Bench runs") == 1, out
    assert out.count("accuracy") == 1, out
    pool = LONG_POOL if long else "trio"
    assert any(pool in line for line in lines), out
    # From two single runs on, the best of them is shown again as the oracle-best.
    assert ("oracle-best" in out) == (n >= 3), out
    for i, (_d, strategy, acc) in enumerate(runs):
        # Each run named whole on a line, and its own accuracy shown once.
        times = 2 if n >= 3 and i == n - 1 else 1
        assert sum(strategy in line for line in lines) == times, (strategy, out)
        assert len(re.findall(rf"(?<![\d.]){re.escape(acc)}(?![\d])", out)) == times, (acc, out)
    assert "$0.000046" in out and "$0.0000 " not in out
    if n == 6 and width <= 80:
        # Too narrow for six columns: the runs are rows (or numbered rows).
        assert "a wider terminal (or COLUMNS) shows" in out, out
    if not long and (width == 200 or n == 1):
        # Wide enough: every figure, the paper's too.
        assert "latency p50 / p95" in out and "paper" in out, out


def test_narrow_rows_keep_each_run_on_its_line(tmp_path: Path) -> None:
    runs = comparison_runs(tmp_path, 6, long=False)
    out = render(report_renderables([d for d, _, _ in runs])[0], width=80)
    # (The oracle-best row's name may wrap onto a line of its own: not a row.)
    rows = {line.split()[0]: line.split() for line in out.splitlines() if len(line.split()) > 2}
    for _d, strategy, acc in runs:
        assert rows[strategy][1] == acc, out
        assert "$0.000046" in rows[strategy], out
    assert "Bench runs: gpqa-diamond · pool trio" in out
    # Numbered when even a row's name would fold: the numbers, then who is who.
    runs = comparison_runs(tmp_path / "long", 6, long=True)
    out = render(report_renderables([d for d, _, _ in runs])[0], width=40)
    lines = [line.strip() for line in out.splitlines()]
    for i, (_d, strategy, acc) in enumerate(runs, 1):
        assert f"{i}  {strategy}" in lines, out
        assert any(line.split()[:2] == [str(i), acc] for line in lines if line), out


def test_runs_alike_are_told_apart_by_directory(tmp_path: Path) -> None:
    """Two Conductor runs of one pool (two checkpoints, say) name their directories."""
    a = write_run(tmp_path / "ckpt-a", "conductor", conductor_records(), epochs=2)
    b = write_run(tmp_path / "ckpt-b", "conductor", conductor_records()[:4], epochs=2)
    for width in (60, 200):
        out = render(report_renderables([a, b])[0], width=width)
        assert "ckpt-a" in out and "ckpt-b" in out, out
    c = write_run(tmp_path / "other", "moa", conductor_records(), epochs=2)
    assert "other" not in flat(render(report_renderables([a, c])[0], width=200))


def test_hostile_names_are_shown_not_obeyed(tmp_path: Path) -> None:
    pool = {**TRIO_POOL, "name": "[bold]p\x1b[31m"}
    d = write_run(tmp_path / "r", "single:\x1b]0;title\x07w", conductor_records(), pool=pool)
    for width in (40, 200):
        out = render(report_renderables([d])[0], width=width)
        assert "\x1b" not in out and "\x07" not in out
        assert "[bold]p\\x1b[31m" in out and "\\x07w" in out, out


@pytest.mark.process
def test_piped_report_of_six_runs_is_one_table(tmp_path: Path) -> None:
    """What the user of issue 18 saw: `conductor report` of six runs, piped, no COLUMNS."""
    from kit.poolkit import run_cli

    runs = comparison_runs(tmp_path, 6, long=False)
    res = run_cli("report", *(str(d) for d, _, _ in runs), columns=None)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("accuracy") == 1, res.stdout
    assert all(len(line) <= 80 for line in res.stdout.splitlines()), res.stdout
    assert "\x1b[" not in res.stdout


def test_the_report_says_how_each_benchmark_was_graded(tmp_path: Path) -> None:
    official = single_dir(tmp_path, 0, 3)
    conductor = single_dir(tmp_path / "c", 1, 3)
    config = json.loads((conductor / "config.json").read_text())
    config["benchmark"].update(grader_version="2", grader_extraction="conductor")
    (conductor / "config.json").write_text(json.dumps(config))
    assert (summarize_run(official).grader, summarize_run(official).grader_options) == (
        "choice v1",
        {},
    )
    assert summarize_run(conductor).grader_options == {"extraction": "conductor"}
    out = flat(render(report_renderables([official, conductor])[0], width=200))
    # Runs read with other rules are named side by side, so a mixed comparison shows.
    assert "choice v1" in out and "choice v2 (extraction=conductor)" in out, out
