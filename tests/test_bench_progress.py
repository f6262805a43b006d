"""`conductor bench` with its output not a terminal: plain progress lines, as the run
goes (not all at the end), and a terminal run left as it was.

The policy is tested on a made-up clock; the CLI through a child process whose stdout
is a pipe read line by line while it runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kit.benchkit import boxed_number, make_math
from kit.clock import scaled
from kit.poolkit import pool_dict, run_cli, worker, write_pool

from conductor.bench.runner import BenchProgress
from conductor.render.bench_progress import ProgressLines, format_duration
from conductor.testing import FakeLLMServer

# --------------------------------------------------------------------------- policy


def progress(
    total: int, done: int, correct: int = 0, errors: int = 0, skipped: int = 0
) -> BenchProgress:
    return BenchProgress(
        total=total,
        skipped=skipped,
        done=done,
        correct=correct,
        errors=errors,
        cost_usd=0.000046 * done,
    )


def test_durations() -> None:
    assert [format_duration(s) for s in (0, 44.6, 60, 185, 3599, 3600, 7620)] == [
        "0 s", "45 s", "1 min 00 s", "3 min 05 s", "59 min 59 s", "1 h 00 min", "2 h 07 min",
    ]  # fmt: skip


def test_a_line_at_start_then_by_count_never_two_within_the_gap() -> None:
    lines = ProgressLines("math500 · conductor", start=0.0)
    first = lines.update(progress(100, 0), now=0.0)
    assert first == (
        "math500 · conductor: 0/100 done (0%) · accuracy - · 0 failures · cost $0 · 0 s · ETA ?"
    )
    # 5 of 100 is the twentieth that makes a line due, but not within 2 s of the last.
    assert lines.update(progress(100, 5, correct=4), now=1.0) is None
    line = lines.update(progress(100, 6, correct=4, errors=1), now=2.5)
    assert line == (
        "math500 · conductor: 6/100 done (6%) · accuracy 66.7% (n=6) · 1 failure · "
        "cost $0.000276 · 2 s · ETA 39 s"
    )
    # Fewer than a twentieth since: waits for the time rule (10 s).
    assert lines.update(progress(100, 7, correct=5, errors=1), now=6.0) is None
    assert lines.update(progress(100, 8, correct=5, errors=1), now=12.6) is not None


def test_a_fast_run_prints_at_most_one_line_per_gap() -> None:
    lines = ProgressLines("smoke · single:w", start=0.0)
    printed = []
    for i in range(1001):  # 1,000 samples in 5 s
        now = i * 0.005
        line = lines.update(progress(1000, i), now=now)
        if line is not None:
            printed.append(now)
    gaps = [b - a for a, b in zip(printed, printed[1:], strict=False)]
    assert len(printed) == 3 and all(g >= 2.0 for g in gaps), printed


def test_a_slow_run_gets_a_heartbeat() -> None:
    lines = ProgressLines("gpqa-diamond · conductor", start=0.0)
    assert lines.tick(5.0) is None  # nothing started yet
    lines.update(progress(200, 0), now=0.0)
    assert lines.tick(29.0) is None
    beat = lines.tick(30.5)
    assert beat is not None and "0/200 done" in beat and "30 s" in beat and "ETA ?" in beat
    # A sample finished in between (under the count rule): its line comes by time.
    lines.update(progress(200, 1, correct=1), now=33.0)
    assert lines.tick(35.0) is None
    late = lines.tick(40.6)
    assert late is not None and "1/200 done" in late and "accuracy 100.0% (n=1)" in late
    assert "ETA 2 h 14 min" in late  # 199 more at 40.6 s each: 8,079 s


def test_a_resumed_run_counts_what_was_done_before() -> None:
    lines = ProgressLines("mmlu · moa", start=0.0)
    line = lines.update(progress(10, 0, skipped=4), now=0.0)
    assert line is not None and "4/10 done (40%), 4 from before" in line
    lines.update(progress(10, 6, correct=3, skipped=4), now=3.0)
    final = lines.final(now=3.0)
    assert "10/10 done (100%), 4 from before · accuracy 50.0% (n=6)" in final
    assert final.endswith("· 3 s · finished")


# --------------------------------------------------------------------------- CLI

SAMPLES = 8


def boxed(request: object) -> str:
    """The right answer to "What is N + 0?" but for every fourth N."""
    right = boxed_number(request)
    n = int(right.removeprefix("\\boxed{").removesuffix("}"))
    return right if n % 4 else f"\\boxed{{{n + 1}}}"


def bench_args(tmp_path: Path, server: FakeLLMServer) -> list[str]:
    pool = write_pool(
        tmp_path / "pool.yaml",
        pool_dict(
            server,
            [worker(server, "solver", price={"input_per_mtok": 1.0, "output_per_mtok": 2.0})],
        ),
    )
    data = make_math(tmp_path / "math.jsonl", SAMPLES)
    return [
        "bench", "math500", "--pool", str(pool), "--data", str(data), "--strategy", "single:solver",
        "--concurrency", "1", "--no-cache", "--out", str(tmp_path / "run"),
    ]  # fmt: skip


@pytest.mark.process
def test_piped_bench_prints_progress_lines_while_it_runs(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("solver", boxed)
    fake_server.latency_s = 0.6  # 8 samples one at a time: about 5 s
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    child = subprocess.Popen(
        [sys.executable, "-m", "conductor", *bench_args(tmp_path, fake_server)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout is not None
    seen: list[tuple[str, bool]] = []  # each line, and whether the run was still going
    for line in child.stdout:
        records = tmp_path / "run" / "samples.jsonl"
        written = len(records.read_text().splitlines()) if records.exists() else 0
        seen.append((line.rstrip("\n"), written < SAMPLES))
    child.wait(timeout=scaled(120))
    err = child.stderr.read() if child.stderr else ""
    assert child.returncode == 0, err
    out = "\n".join(line for line, _ in seen)
    progress_lines = [
        (ln, going) for ln, going in seen if ln.startswith("math500 · single:solver: ")
    ]
    assert len(progress_lines) >= 3, out
    # Lines came out while samples were still to run, not all at the end.
    assert sum(going for _, going in progress_lines) >= 2, out
    first, *_, last = [ln for ln, _ in progress_lines]
    assert first.startswith("math500 · single:solver: 0/8 done (0%) · accuracy - · 0 failures")
    done = r"8/8 done \(100%\) · accuracy 75\.0% \(n=8\) · 0 failures"
    assert re.search(done + r" · cost \$0\.0\d+ · \d+ s · finished$", last), last
    middle = [ln for ln, _ in progress_lines[1:-1]]
    assert middle and all(re.search(r"ETA (\d+ s|\?)$", ln) for ln in middle), out
    # Then the summary, after every progress line; no escape codes, no live display.
    summary = next(i for i, (ln, _) in enumerate(seen) if "Bench runs" in ln)
    assert summary > max(i for i, (ln, _) in enumerate(seen) if ln.startswith("math500 · "))
    assert "\x1b" not in out and "\r" not in out and "\x1b" not in err
    assert "warning" not in err


@pytest.mark.process
def test_terminal_bench_is_unchanged(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    """With stdout a terminal there are no progress lines (the bar is on stderr)."""
    pytest.importorskip("pty")
    import pty

    fake_server.script("solver", boxed)
    env = {**{k: v for k, v in os.environ.items() if k != "COLUMNS"}, "COLUMNS": "120"}
    main, sub = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "conductor", *bench_args(tmp_path, fake_server)],
        stdout=sub,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    os.close(sub)
    chunks = []
    deadline = time.monotonic() + scaled(120)
    while time.monotonic() < deadline:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    child.wait(timeout=scaled(60))
    os.close(main)
    out = b"".join(chunks).decode("utf-8", "replace")
    assert child.returncode == 0, child.stderr.read() if child.stderr else ""
    assert "Bench runs" in out
    assert "done (" not in out and "ETA" not in out, out
    # And piped, the same run prints them (the test above, in short).
    (tmp_path / "again").mkdir()
    res = run_cli(*bench_args(tmp_path / "again", fake_server), columns=None)
    assert res.returncode == 0, res.stderr
    assert "math500 · single:solver: 8/8 done (100%)" in res.stdout


# --------------------------------------------------------------------------- batches


def test_a_batched_run_says_where_its_batches_stand_as_soon_as_they_move() -> None:
    from conductor.batches.api import BatchStatus
    from conductor.batches.waves import BatchBoard, BatchView
    from conductor.render.bench_progress import format_board

    lines = ProgressLines("math500 · conductor", start=0.0)
    p = progress(100, 0)
    assert lines.update(p, 0.0) is not None
    p.batches = BatchBoard(-1, 0, (), 100)
    assert format_board(p.batches) == "no wave sent yet · 100 calls held for the next wave"
    sent = BatchView("l1", "w0", 0, 60, None)
    running = BatchView("l2", "w1", 0, 40, BatchStatus("running"))
    p.batches = BatchBoard(0, 2, (sent, running), 0)
    # No sample finished, yet a line: the batches moved (hours may pass before more).
    line = lines.update(p, 3.0)
    assert line is not None and "wave 0 · 2 batches in flight (1 running, 1 sent)" in line
    assert lines.update(p, 9.0) is None  # nothing new
    ended = BatchView("l2", "w1", 0, 40, BatchStatus("ended"))
    p.batches = BatchBoard(0, 2, (ended,), 0, live=3)
    line = lines.update(p, 4.0)
    assert line is None  # within the two-second gap of the last line
    line = lines.update(p, 5.5)
    assert line is not None and "1 batch in flight (1 collecting) · 3 calls made live" in line
