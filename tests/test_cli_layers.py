"""The library halves of the CLI's commands, called directly: the bench session's plan,
``pools check``'s pings, and the renderers ``conductor train`` feeds its metrics to."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import CONDUCTOR_MODEL, pool_dict, worker, write_pool
from rich.console import Console

from conductor.bench.session import BenchArgs, BenchRequest, plan_bench
from conductor.errors import UsageError
from conductor.execute import RunSettings
from conductor.pool import load_pool
from conductor.pool_check import PingResult, check_pool
from conductor.testing import FakeLLMServer, Fault


def _pool(tmp_path: Path, server: FakeLLMServer, *ids: str) -> Path:
    data = pool_dict(server, [worker(server, wid) for wid in ids])
    return write_pool(tmp_path / "pool.yaml", data)


def test_a_singles_plan_has_one_request_per_worker_in_its_own_directory(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    pool = _pool(tmp_path, fake_server, "w0", "w1")
    out = tmp_path / "run"
    requests = plan_bench(
        BenchArgs(
            benchmark="math500",
            pool=str(pool),
            strategy="singles",
            out=out,
            limit=3,
            max_calls=5,
            shard="1/2",
        )
    )
    assert [r.strategy for r in requests] == ["single:w0", "single:w1"]
    assert [r.run_dir for r in requests] == [out / "single-w0", out / "single-w1"]
    first = requests[0]
    assert isinstance(first, BenchRequest)
    assert first.spec.name == "math500" and [w.id for w in first.pool.workers] == ["w0", "w1"]
    given = first.invocation
    assert given.limit == 3 and given.seed == 0 and given.concurrency is None  # follows the pool
    assert first.shard == (1, 2) and first.resume is False
    assert first.settings == RunSettings(max_calls=5, rounds=1)
    # What --resume reads back: the pool file by absolute path, the strategy as given.
    assert first.invocation.strategy == "singles"
    assert first.invocation.pool == str(pool.resolve())
    assert first.invocation.shard == "1/2"
    assert fake_server.requests == []  # planning sends nothing


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (BenchArgs(benchmark="math500", retry_errors=True), "--retry-errors needs --resume"),
        (BenchArgs(), "name a benchmark"),
        (BenchArgs(benchmark="math500", shard="2/2"), "--shard '2/2' must be I/N"),
    ],
)
def test_a_plan_refuses_options_that_do_not_fit(args: BenchArgs, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        plan_bench(args)


def test_check_pool_names_each_model_with_its_result(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    fake_server.script("w0", ["ready"])
    fake_server.script("w1", [Fault(503, "overloaded, try later")])
    fake_server.script(CONDUCTOR_MODEL, ["ready"])
    results = check_pool(load_pool(_pool(tmp_path, fake_server, "w0", "w1")), timeout_s=10)
    assert [(r.label, r.worker_id) for r in results] == [
        ("Model 0", "w0"),
        ("Model 1", "w1"),
        ("Conductor", "conductor"),
    ]
    ok, refused, conductor = results
    assert ok.ok and ok.reply == "ready" and ok.latency_s > 0
    assert not refused.ok and refused.error is not None and "overloaded" in refused.error
    assert conductor.ok
    # One try: a check does not retry, even what a run would retry.
    assert len(fake_server.requests_for("w1")) == 1


def test_check_pool_reports_a_conductor_that_cannot_be_set_up(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    data = pool_dict(fake_server, [worker(fake_server, "w0")])
    data["conductor"] = {"backend": "checkpoint", "model": str(tmp_path / "no-such-checkpoint")}
    pool = load_pool(write_pool(tmp_path / "pool.yaml", data))
    *workers, conductor = check_pool(pool, timeout_s=10)
    assert [r.worker_id for r in workers] == ["w0"] and workers[0].ok
    assert isinstance(conductor, PingResult) and conductor.label == "Conductor"
    assert conductor.error is not None and "does not exist" in conductor.error


def _line(step: int, reward: float) -> dict[str, Any]:
    from conductor.train.metrics import METRIC_KEYS

    row: dict[str, Any] = dict.fromkeys(METRIC_KEYS)
    row.update(step=step, reward_mean=reward, reward_std=0.25, parse_rate=1.0, elapsed_s=3.0)
    return row


def test_train_shows_each_metrics_line_in_a_live_table_on_a_terminal() -> None:
    from conductor.cli.train import _LiveTable

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=160)
    table = _LiveTable(console)
    table.stop()  # stopping before any line is harmless
    assert screen.getvalue() == ""
    table.add(_line(1, 0.5))
    table.add(_line(2, 0.875))
    table.stop()
    shown = screen.getvalue()
    assert "GRPO training" in shown and "0.500" in shown and "0.875" in shown


def test_train_prints_one_line_per_step_without_a_terminal() -> None:
    from conductor.cli.train import _print_line

    screen = io.StringIO()
    _print_line(Console(file=screen, width=200), _line(7, 0.5))
    assert screen.getvalue().strip() == (
        "step 7: reward 0.500 ± 0.250  parsed 1.00  correct -  steps/workflow -  loss -  3s"
    )
