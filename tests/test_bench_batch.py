"""``bench --batch`` end to end: the bench, the wave batcher and the batch clients
against the fake server's batch routes (real HTTP, the real SDKs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kit.benchkit import make_math_file, number_in, read_samples
from kit.clock import scaled
from kit.poolkit import CONDUCTOR_MODEL, invoke_cli, lists, pool_dict, worker, write_pool

from conductor.testing import BatchPlan, FakeLLMServer, Fault

PRICE = {"input_per_mtok": 2.0, "output_per_mtok": 8.0}
#: The batcher reads a batch's status this often in these tests (seconds).
POLL = "0.01"


def script_chain(server: FakeLLMServer, steps: int = 2) -> None:
    """The Conductor writes a chain over w0, w1, ...; every worker answers right."""
    ids = list(range(steps))
    access: list[Any] = [[]] + [["all"]] * (steps - 1)
    server.script(CONDUCTOR_MODEL, lists(ids, [f"Step {i}." for i in ids], access))
    for i in ids:
        server.script(f"w{i}", lambda r: f"So \\boxed{{{number_in(r)}}}")


def batch_pool(
    tmp_path: Path,
    server: FakeLLMServer,
    clients: tuple[str, ...] = ("openai", "openai"),
    **extra: Any,
) -> Path:
    workers = [
        worker(server, f"w{i}", client, price=PRICE, **extra.get(f"w{i}", {}))
        for i, client in enumerate(clients)
    ]
    return write_pool(tmp_path / "pool.yaml", pool_dict(server, workers, price=PRICE))


def env(tmp_path: Path) -> dict[str, str]:
    return {"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache"), "CONDUCTOR_BATCH_POLL_S": POLL}


def bench(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    res = invoke_cli("bench", *args, env=env(tmp_path))
    return res.returncode, res.stdout, res.stderr


def journal(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "batches.jsonl").read_text().splitlines()]


def waves_of(run: Path) -> dict[int, Counter[str]]:
    """Each wave's submissions, counted per target."""
    out: dict[int, Counter[str]] = {}
    for event in journal(run):
        if event["event"] == "intent":
            out.setdefault(event["wave"], Counter())[event["target"]] += 1
    return out


def test_a_batched_bench_sends_one_batch_per_wave_at_half_the_live_price(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_chain(fake_server)
    data = make_math_file(tmp_path / "math.jsonl", 8)
    run = tmp_path / "run"
    code, out, err = bench(
        tmp_path, "math500", "--pool", str(batch_pool(tmp_path, fake_server)),
        "--data", str(data), "--out", str(run), "--batch",
    )  # fmt: skip
    assert code == 0, out + err
    # The Conductor's plans, then one wave per step: three batches in all.
    assert waves_of(run) == {0: Counter(conductor=1), 1: Counter(w0=1), 2: Counter(w1=1)}
    assert [len(b.lines) for b in fake_server.batches] == [8, 8, 8]
    # Every call went in a batch: none was made live.
    assert all(r.batch_id is not None for r in fake_server.requests)
    records = read_samples(run)
    assert len(records) == 8 and all(r["grade"]["status"] == "correct" for r in records)
    calls = [c for r in records for rnd in r["rounds"] for c in [*rnd["conductor_calls"],
             *(s["call"] for s in rnd["steps"])]]  # fmt: skip
    assert len(calls) == 24 and all(c["batch"] and not c["cached"] for c in calls)
    assert all(c["cost_usd"] == pytest.approx(c["live_cost_usd"] / 2) for c in calls)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["batch_calls"] == 24
    assert summary["cost_usd"] == pytest.approx(summary["live_cost_usd"] / 2)
    report = invoke_cli("report", str(run), env=env(tmp_path), columns=200)
    assert "24 batch calls; 50.0% of" in " ".join(report.stdout.split())

    # A rerun replays from the sample cache: nothing is sent.
    before = len(fake_server.batches)
    again = tmp_path / "again"
    code, _, err = bench(tmp_path, "math500", "--pool", str(tmp_path / "pool.yaml"),
                         "--data", str(data), "--out", str(again), "--batch")  # fmt: skip
    assert code == 0, err
    assert len(fake_server.batches) == before


def test_live_workers_run_beside_batched_ones_without_splitting_a_wave(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    # w0 is told never to batch; w1 batches; the Conductor batches.
    script_chain(fake_server, steps=3)
    pool = batch_pool(tmp_path, fake_server, ("openai", "openai", "openai"), w0={"batch": False})
    data = make_math_file(tmp_path / "math.jsonl", 5)
    run = tmp_path / "run"
    code, out, err = bench(tmp_path, "math500", "--pool", str(pool), "--data", str(data),
                           "--out", str(run), "--batch")  # fmt: skip
    assert code == 0, out + err
    live = [r for r in fake_server.requests if r.batch_id is None]
    assert {r.model for r in live} == {"w0"} and len(live) == 5
    assert waves_of(run) == {0: Counter(conductor=1), 1: Counter(w1=1), 2: Counter(w2=1)}


def test_an_expired_batch_is_sent_again_in_the_next_wave(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_chain(fake_server, steps=1)
    fake_server.batch_script([BatchPlan(outcome="expired", answered=2), BatchPlan()])
    data = make_math_file(tmp_path / "math.jsonl", 5)
    run = tmp_path / "run"
    code, out, err = bench(tmp_path, "math500", "--pool", str(batch_pool(tmp_path, fake_server)),
                           "--data", str(data), "--out", str(run), "--batch")  # fmt: skip
    assert code == 0, out + err
    # Wave 0: five plans, two answered; wave 1: the other three again, beside the steps
    # of the two samples answered; wave 2: the steps of those three.
    batches = [(b.model, len(b.lines), b.state) for b in fake_server.batches]
    assert batches[0] == (CONDUCTOR_MODEL, 5, "expired")
    assert sorted(batches[1:]) == [(CONDUCTOR_MODEL, 3, "ended"), ("w0", 2, "ended"),
                                   ("w0", 3, "ended")]  # fmt: skip
    assert waves_of(run) == {0: Counter(conductor=1), 1: Counter(conductor=1, w0=1),
                             2: Counter(w0=1)}  # fmt: skip
    paid = Counter(r.custom_id for r in fake_server.requests)
    assert max(paid.values()) == 1  # no call answered twice
    assert len(read_samples(run)) == 5


def test_a_server_without_a_batch_api_is_called_live_after_one_warning(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_chain(fake_server, steps=1)
    fake_server.batch_fault("upload", *[Fault(404, "Not Found")] * 10)
    data = make_math_file(tmp_path / "math.jsonl", 4)
    run = tmp_path / "run"
    code, out, err = bench(tmp_path, "math500", "--pool", str(batch_pool(tmp_path, fake_server)),
                           "--data", str(data), "--out", str(run), "--batch")  # fmt: skip
    assert code == 0, out + err
    assert fake_server.batches == []
    assert len([r for r in fake_server.requests if r.batch_id is None]) == 8
    assert all(r["grade"]["status"] == "correct" for r in read_samples(run))


def test_the_cap_stops_the_waves_and_a_resume_pays_nothing_twice(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_chain(fake_server)
    data = make_math_file(tmp_path / "math.jsonl", 6)
    pool = batch_pool(tmp_path, fake_server)
    run = tmp_path / "run"
    code, _, err = bench(tmp_path, "math500", "--pool", str(pool), "--data", str(data),
                         "--out", str(run), "--batch", "--max-usd", "0.000001")  # fmt: skip
    assert code == 1
    message = " ".join(err.split())
    assert "reaching its --max-usd" in message and "left for the resume" in message
    assert len(fake_server.batches) == 1  # the Conductor's wave, then no more
    assert not (run / "samples.jsonl").exists() or read_samples(run) == []

    code, out, err = bench(tmp_path, "--resume", str(run), "--max-usd", "100")
    assert code == 0, out + err
    assert len(read_samples(run)) == 6
    paid = Counter(r.custom_id for r in fake_server.requests)
    assert max(paid.values()) == 1 and len(fake_server.batches) == 3


@pytest.mark.process
def test_a_run_killed_in_wave_one_resumes_without_paying_twice_or_losing_a_sample(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_chain(fake_server)
    # Each batch ends a second after it is made: the kill lands while wave 1 runs.
    fake_server.batch_script(BatchPlan(run_s=1.0))
    data = make_math_file(tmp_path / "math.jsonl", 10)
    run = tmp_path / "run"
    child_env = {**os.environ, **env(tmp_path)}
    args = [sys.executable, "-m", "conductor", "bench"]
    proc = subprocess.Popen(
        [*args, "math500", "--pool", str(batch_pool(tmp_path, fake_server)), "--data",
         str(data), "--out", str(run), "--batch"],
        env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + scaled(120)
    while time.monotonic() < deadline:
        if (run / "batches.jsonl").exists() and any(
            e["event"] == "submitted" and "-w1-" in e["label"] for e in journal(run)
        ):
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert len(fake_server.batches) == 2 and not fake_server.batches[1].terminal
    res = subprocess.run([*args, "--resume", str(run)], env=child_env, capture_output=True,
                         text=True, timeout=scaled(180))  # fmt: skip
    assert res.returncode == 0, res.stderr
    # Wave 1 was collected, not sent again; wave 2 followed.
    assert len(fake_server.batches) == 3
    sent = Counter(line.custom_id for b in fake_server.batches for line in b.lines)
    assert max(sent.values()) == 1
    records = read_samples(run)
    assert len({(r["sample_id"], r["epoch"]) for r in records}) == len(records) == 10
    assert all(r["grade"]["status"] == "correct" for r in records)


def test_batch_needs_the_cache_and_a_batch_api(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    data = make_math_file(tmp_path / "math.jsonl", 2)
    pool = batch_pool(tmp_path, fake_server)
    code, _, err = bench(tmp_path, "math500", "--pool", str(pool), "--data", str(data),
                         "--out", str(tmp_path / "a"), "--batch", "--no-cache")  # fmt: skip
    assert code == 2 and "need the call cache" in " ".join(err.split())
    local = write_pool(
        tmp_path / "local.yaml",
        pool_dict(fake_server, [{"id": "l", "model": "smollm2", "client": "local",
                                 "batch": True}]),
    )  # fmt: skip
    code, _, err = bench(tmp_path, "math500", "--pool", str(local), "--data", str(data),
                         "--out", str(tmp_path / "b"))  # fmt: skip
    assert code == 2 and "worker 'l' sets batch: true" in " ".join(err.split())
    assert fake_server.requests == []
