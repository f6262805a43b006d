"""``bench --max-usd``: the whole run's spend cap, against the fake server (live calls;
the batched run's cap is in test_bench_batch.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kit.benchkit import make_math_file, read_samples, script_math
from kit.poolkit import invoke_cli, pool_dict, worker, write_pool

from conductor.testing import FakeLLMServer

#: A dollar a thousand tokens, in and out: the fake server counts words as tokens.
PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}


def priced_pool(tmp_path: Path, server: FakeLLMServer, *, conductor_price: bool = True) -> Path:
    workers = [worker(server, "w0", price=PRICE), worker(server, "w1", price=PRICE)]
    extra = {"price": PRICE} if conductor_price else {}
    return write_pool(tmp_path / "pool.yaml", pool_dict(server, workers, **extra))


def bench(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    res = invoke_cli("bench", *args, env=env)
    return res.returncode, res.stdout, res.stderr


def spent(run: Path) -> float:
    return sum(r["totals"]["cost_usd"] for r in read_samples(run))


def test_the_cap_stops_new_samples_and_a_resume_with_a_higher_one_finishes(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_math(fake_server)
    data = make_math_file(tmp_path / "math.jsonl", 12)
    pool = priced_pool(tmp_path, fake_server)
    run = tmp_path / "run"
    common = ("--pool", str(pool), "--data", str(data), "--concurrency", "1")
    code, out, err = bench(tmp_path, "math500", *common, "--out", str(run), "--max-usd", "0.2")
    stopped = len(read_samples(run))
    per_sample = spent(run) / stopped
    assert code == 1, out + err
    message = " ".join(err.split())
    assert "reaching its --max-usd $0.2000" in message
    assert f"conductor bench --resume {run} --max-usd X" in message
    # One sample at a time: the cap is passed by at most the sample that crossed it.
    assert 0.2 <= spent(run) < 0.2 + per_sample + 1e-9
    assert 0 < stopped < 12
    assert json.loads((run / "config.json").read_text())["invocation"]["max_usd"] == 0.2

    # The cap kept in the run counts what its records cost: a resume without a new one
    # starts nothing.
    requests = len(fake_server.requests)
    code, _, err = bench(tmp_path, "--resume", str(run))
    assert code == 1 and "reaching its --max-usd" in " ".join(err.split())
    assert len(fake_server.requests) == requests and len(read_samples(run)) == stopped

    code, out, err = bench(tmp_path, "--resume", str(run), "--max-usd", "100")
    assert code == 0, out + err
    records = read_samples(run)
    assert len(records) == 12 and len({r["sample_id"] for r in records}) == 12


def test_a_cap_refuses_a_model_whose_price_is_unknown(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    script_math(fake_server)
    data = make_math_file(tmp_path / "math.jsonl", 2)
    pool = priced_pool(tmp_path, fake_server, conductor_price=False)
    run = tmp_path / "run"
    code, _, err = bench(
        tmp_path, "math500", "--pool", str(pool), "--data", str(data), "--out", str(run),
        "--max-usd", "1",
    )  # fmt: skip
    assert code == 2
    assert "--max-usd cannot see what 'conductor' cost" in " ".join(err.split())
    assert fake_server.requests == [] and not (run / "samples.jsonl").exists()


@pytest.mark.parametrize("cap", ["-1", "nan"])
def test_a_cap_must_be_a_number_of_dollars(
    tmp_path: Path, fake_server: FakeLLMServer, cap: str
) -> None:
    code, _, _ = bench(tmp_path, "math500", "--max-usd", cap)
    assert code == 2
