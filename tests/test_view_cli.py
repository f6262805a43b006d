"""The static pictures through the real command line: ``conductor trace --format svg``
and ``conductor report --plot``."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from kit.clock import scaled
from kit.poolkit import invoke_cli, run_cli
from kit.records import ALL, JUDGE, record, round_of, single_dir, write_run

from conductor.record import RunRecord, write_record
from conductor.view.plots import bench_run_points

SVG = "{http://www.w3.org/2000/svg}"


def error_line(res: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused command prints (exit 2)."""
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    return lines[0]


def step_ids(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    return [g.get("data-step", "") for g in root.iter(f"{SVG}g") if g.get("data-step")]


def edge_ids(svg: str) -> set[tuple[str, str]]:
    root = ET.fromstring(svg)
    return {
        (p.get("data-from", ""), p.get("data-to", ""))
        for p in root.iter(f"{SVG}path")
        if p.get("class") == "edge"
    }


@pytest.fixture
def bench_runs(tmp_path: Path) -> dict[str, Path]:
    recs = [
        record("s0", 0, "correct", [round_of(0, JUDGE)], wall=1.0, cost=0.02),
        record("s1", 0, "incorrect", [round_of(0, [(0, []), (1, ALL)])], wall=2.0, cost=0.04),
        record("s2", 0, "correct", [round_of(0, [(2, [])])], wall=1.0, cost=0.01),
    ]
    cond = write_run(tmp_path / "cond", "conductor", recs)
    for worker, correct in ((0, 2), (1, 4), (2, 1)):
        single_dir(tmp_path / "singles", worker, correct)
    return {"cond": cond, "singles": tmp_path / "singles"}


def test_trace_svg_of_a_sample(bench_runs: dict[str, Path]) -> None:
    res = invoke_cli("trace", str(bench_runs["cond"]), "--sample", "s0", "--format", "svg")
    assert res.returncode == 0, res.stderr
    # JUDGE: steps 0 and 1 alone, step 2 sees all earlier.
    assert step_ids(res.stdout) == ["1.0", "1.1", "1.2"]
    assert edge_ids(res.stdout) == {("1.0", "1.2"), ("1.1", "1.2")}


def test_trace_svg_of_a_record_file(tmp_path: Path) -> None:
    rec: RunRecord = record("q", 0, None, [round_of(0, [(0, []), (1, ALL)])], wall=1.0)
    rec.rounds[0].steps[1].subtask = "<script>alert(1)</script>"
    path = tmp_path / "run.json"
    write_record(rec, path)
    res = invoke_cli("trace", str(path), "--format", "SVG")
    assert res.returncode == 0, res.stderr
    assert step_ids(res.stdout) == ["1.0", "1.1"]
    assert "<script>" not in res.stdout


def test_trace_svg_needs_a_sample(bench_runs: dict[str, Path]) -> None:
    res = invoke_cli("trace", str(bench_runs["cond"]), "--format", "svg")
    assert "--format svg shows one sample; give --sample ID" in error_line(res)


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_report_plot(bench_runs: dict[str, Path], tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"chart{suffix}"
    res = invoke_cli(
        "report", str(bench_runs["cond"]), str(bench_runs["singles"]), "--plot", str(out)
    )
    assert res.returncode == 0, res.stderr
    assert "Bench runs" in res.stdout  # the tables, as without --plot
    assert "single:claude" in res.stdout  # the singles directory stands for its runs
    assert "chart of 4 runs written to" in res.stdout and str(out) in res.stdout
    data = out.read_bytes()
    if suffix == ".png":
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
    else:
        root = ET.fromstring(data)
        assert root.tag == f"{SVG}svg"


def test_report_plot_refuses_other_suffixes_before_anything(
    bench_runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "chart.jpg"
    res = invoke_cli("report", str(bench_runs["cond"]), "--plot", str(out))
    assert "give a file ending in .png or .svg" in error_line(res)
    assert res.stdout == ""
    assert not out.exists()


def test_report_plot_leaves_off_a_run_without_a_cost(
    bench_runs: dict[str, Path], tmp_path: Path
) -> None:
    unpriced = write_run(
        tmp_path / "unpriced",
        "single:gpt",
        [record("s0", 0, "correct", [round_of(0, [(2, [])], tries=0)], wall=1.0, cost=None)],
    )
    out = tmp_path / "chart.png"
    res = invoke_cli("report", str(bench_runs["cond"]), str(unpriced), "--plot", str(out))
    assert res.returncode == 0, res.stderr
    assert f"warning: {unpriced} is not on the chart: no call of it has a known price" in (
        " ".join(res.stderr.split())
    )
    assert "chart of 1 run written to" in res.stdout
    alone = invoke_cli("report", str(unpriced), "--plot", str(tmp_path / "none.png"))
    assert "none of the runs has an accuracy and a cost to draw" in alone.stderr
    assert alone.returncode == 2
    assert not (tmp_path / "none.png").exists()


@pytest.mark.process  # a fresh interpreter, to see what it imports
def test_help_does_not_load_the_drawing_libraries() -> None:
    code = (
        "import sys\n"
        "from conductor.cli import main\n"
        "for args in (['--help'], ['report', '--help'], ['trace', '--help']):\n"
        "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
        "libs = ('matplotlib', 'jinja2', 'conductor.view')\n"
        "print('LOADED', [m for m in libs if m in sys.modules])\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(60)
    )
    assert "LOADED []" in res.stdout, res.stdout + res.stderr
    assert "--plot" in res.stdout and "svg" in res.stdout


@pytest.mark.process  # the bench grades with math-verify's children
def test_pictures_of_a_real_bench_run(tmp_path: Path) -> None:
    """A real ``conductor bench`` (fake models, priced): the SVG follows the recorded
    access lists, and the chart holds the Conductor run and each single worker."""
    from kit.benchkit import make_math_file, number_in
    from kit.poolkit import CONDUCTOR_MODEL, lists, pool_dict, worker, write_pool

    from conductor.testing import FakeLLMServer

    price = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
    with FakeLLMServer() as server:
        plan = lists([0, 1, 0], ["Try it.", "Try it too.", "Judge <both>."], [[], [], [0, 1]])
        server.script(CONDUCTOR_MODEL, [plan])
        server.script("w0", lambda r: f"\\boxed{{{number_in(r)}}}")
        server.script("w1", lambda r: "\\boxed{-1}")
        workers = [worker(server, w, price=price) for w in ("w0", "w1")]
        pool = write_pool(tmp_path / "pool.yaml", pool_dict(server, workers, price=price))
        data = make_math_file(tmp_path / "math.jsonl", 3)
        env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
        common = ("bench", "math500", "--pool", str(pool), "--data", str(data))
        for out, extra in (("run", ()), ("singles", ("--strategy", "singles"))):
            res = run_cli(*common, "--out", str(tmp_path / out), *extra, env=env)
            assert res.returncode == 0, res.stderr
    sample = "math500/test/synthetic/1.json"
    res = run_cli("trace", str(tmp_path / "run"), "--sample", sample, "--format", "svg")
    assert res.returncode == 0, res.stderr
    (line,) = [
        json.loads(x)
        for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
        if json.loads(x)["sample_id"] == sample
    ]
    steps = line["rounds"][0]["steps"]
    assert step_ids(res.stdout) == [f"1.{s['index']}" for s in steps] == ["1.0", "1.1", "1.2"]
    recorded = {(f"1.{j}", f"1.{s['index']}") for s in steps for j in s["visible_steps"]}
    assert edge_ids(res.stdout) == recorded == {("1.0", "1.2"), ("1.1", "1.2")}
    assert "Judge &lt;both&gt;." in res.stdout

    chart = tmp_path / "chart.svg"
    res = run_cli("report", str(tmp_path / "run"), str(tmp_path / "singles"), "--plot", str(chart))
    assert res.returncode == 0, res.stderr
    assert "chart of 3 runs written to" in res.stdout
    text = chart.read_text()
    assert ET.fromstring(text).tag == f"{SVG}svg"
    # The runs drawn: the judge (w0) is right on all three questions, w1 on none.
    points, left_out = bench_run_points([tmp_path / "run", tmp_path / "singles"])
    assert not left_out
    drawn = {p.label: (p.accuracy, p.is_single, p.cost > 0) for p in points}
    assert drawn == {
        "conductor": (1.0, False, True),
        "single:w0": (1.0, True, True),
        "single:w1": (0.0, True, True),
    }
