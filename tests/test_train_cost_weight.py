"""One checkpoint for every cost (issue 40): the cost weight drawn per question, stated
in the Conductor's prompt by one function in training rows and at inference
(``--cost-weight`` on ask, bench and serve), and charged by the reward per USD."""

from __future__ import annotations

import json
import string
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import CONDUCTOR_MODEL, invoke_cli, lists, pool_dict, worker, write_pool

from conductor.conductors.checkpoint import (
    CheckpointMeta,
    check_cost_weight_against_meta,
    read_checkpoint_meta,
    write_checkpoint_meta,
)
from conductor.conductors.prompt import (
    cost_weight_line,
    describe_workers,
    load_template,
)
from conductor.conductors.spec import Conductor, resolve_conductor
from conductor.errors import TrainConfigError, UsageError
from conductor.execute import Orchestrator
from conductor.pool import Pool, load_pool
from conductor.targets import Worker
from conductor.testing import FakeLLMServer
from conductor.train.config import load_train_config_text
from conductor.train.dataset import build_rows, draw_cost_weight
from conductor.train.reward import WorkflowReward
from conductor.train.settings import DataMix, RewardSettings, TrainConfig

GOLD = "42"
WEIGHTS = (0.0, 150.0, 400.0)


@pytest.fixture
def pool(tmp_path: Path, fake_server: FakeLLMServer) -> Pool:
    price = {"input_per_mtok": 1000.0, "output_per_mtok": 2000.0}
    workers = [worker(fake_server, f"w{i}", max_retries=0, price=price) for i in range(3)]
    for i in range(3):
        fake_server.script(f"w{i}", f"\\boxed{{{GOLD}}}")
    return load_pool(write_pool(tmp_path / "pool.yaml", pool_dict(fake_server, workers)))


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "items.jsonl"
    rows = [
        {"problem": f"What is 6 * 7? (variant {i})", "answer": GOLD, "unique_id": f"q{i}"}
        for i in range(8)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(pool: Pool, data_file: Path, template: str = "default", **reward: Any) -> TrainConfig:
    return TrainConfig(
        base_model="gguf:smollm2",
        pool=str(pool.path),
        data=(DataMix(benchmark="math500", file=str(data_file)),),
        output_dir="unused",
        max_steps=3,
        template=template,
        reward=RewardSettings(**reward),
    )


def policy(template: str = "default") -> Conductor:
    return Conductor(
        backend="prompted",
        target=Worker(id="conductor", model="policy"),
        max_steps=3,
        template=template,
    )


# --------------------------------------------------------------------------- the prompt


@pytest.mark.parametrize("template", ["default", "paper"])
def test_training_rows_and_inference_state_the_weight_in_the_same_words(
    pool: Pool, data_file: Path, template: str
) -> None:
    rows = build_rows(
        config(pool, data_file, template, cost_weights=WEIGHTS), pool, policy(template), rng_seed=0
    )
    assert {row["cost_weight"] for row in rows} <= set(WEIGHTS)
    for row in rows:
        # The executor's prompt for a Conductor run at this weight (what --cost-weight
        # resolves to) is the training row's prompt, message for message.
        at_inference = replace(policy(template), cost_weight=row["cost_weight"])
        sent = Orchestrator(pool, at_inference).conductor_messages(row["question"], 3)
        assert [dict(m) for m in sent] == row["prompt"]
        user = [m for m in row["prompt"] if m["role"] == "user"][-1]["content"]
        assert user.rstrip().endswith(cost_weight_line(row["cost_weight"]))
    # The number is written alike whatever type it came as.
    assert cost_weight_line(150) == cost_weight_line(150.0)
    assert "150 per US dollar" in cost_weight_line(150.0)


def test_without_a_weight_the_prompt_is_todays(pool: Pool, data_file: Path) -> None:
    rows = build_rows(config(pool, data_file), pool, policy(), rng_seed=0)
    assert all("cost_weight" not in row for row in rows)
    # Today's prompt, filled from the template file here rather than by the library.
    listing = describe_workers(pool.workers)
    for row in rows:
        expected = string.Template(load_template("default")).substitute(
            workers=listing,
            workers_by_id=describe_workers(pool.workers, form="workers_by_id"),
            question=row["question"].strip(),
            max_steps="3",
            subtasks="",
        )
        assert row["prompt"] == [{"role": "user", "content": expected}]
        sent = Orchestrator(pool, policy()).conductor_messages(row["question"], 3)
        assert [dict(m) for m in sent] == row["prompt"]
    # Nor does a run record (or a resume key) of a Conductor without a weight change.
    assert "cost_weight" not in policy().describe()
    assert replace(policy(), cost_weight=150.0).describe()["cost_weight"] == 150.0


def test_the_weight_is_drawn_per_question_reproducibly(pool: Pool, data_file: Path) -> None:
    cfg = config(pool, data_file, cost_weights=WEIGHTS)
    first = build_rows(cfg, pool, policy(), rng_seed=0)
    again = build_rows(cfg, pool, policy(), rng_seed=7)  # the pool-sampling stream apart
    assert [r["cost_weight"] for r in first] == [r["cost_weight"] for r in again]
    assert len({r["cost_weight"] for r in first}) > 1  # the weights are spread
    # By the question alone: not by its position, nor by the other questions drawn.
    for row in first:
        assert row["cost_weight"] == draw_cost_weight(WEIGHTS, 0, row["sample_id"])
    others = [draw_cost_weight(WEIGHTS, 1, r["sample_id"]) for r in first]
    assert others != [r["cost_weight"] for r in first]  # the run's seed matters


@pytest.mark.process
def test_the_reward_charges_each_rows_own_weight(pool: Pool, data_file: Path) -> None:
    rows = build_rows(config(pool, data_file, cost_weights=WEIGHTS), pool, policy(), rng_seed=0)
    by_weight = {row["cost_weight"]: row for row in rows}
    group = [by_weight[w] for w in sorted(by_weight)]
    # TRL repeats each row for its group: two completions per row here.
    batch = [row for row in group for _ in range(2)]
    reply = lists([0], ["Compute 6 * 7"], [[]])
    columns = {key: [row.get(key) for row in batch] for key in batch[0]}
    reward = WorkflowReward(pool, policy(), RewardSettings(cost_penalty_per_usd=999.0))
    try:
        scores = reward([r["prompt"] for r in batch], [reply] * len(batch), **columns)
        results = reward.last_batch
    finally:
        reward.close()
    for row, score, result in zip(batch, scores, results, strict=True):
        assert result.correct and result.cost_usd > 0
        # The row's weight replaces cost_penalty_per_usd (999 would dominate).
        assert score == pytest.approx(1.0 - row["cost_weight"] * result.cost_usd)
    assert scores[0] == pytest.approx(1.0)  # weight 0: cost is free


# --------------------------------------------------------------------------- the config


def test_the_config_reads_and_checks_cost_weights(pool: Pool) -> None:
    head = f"base_model: gguf:smollm2\npool: {pool.path}\ndata: [math500]\noutput_dir: o\n"
    cfg = load_train_config_text(head + "reward: {cost_weights: [0, 100, 200.5]}\n")
    assert cfg.reward.cost_weights == (0.0, 100.0, 200.5)
    for bad, said in [
        ("reward: {cost_weights: [0, -1]}\n", "reward.cost_weights[1] must be a number >= 0"),
        ("reward: {cost_weights: 100}\n", "must be a list of numbers"),
        (
            "reward: {cost_weights: [0, 100], cost_penalty_per_usd: 50}\n",
            "replaces reward.cost_penalty_per_usd",
        ),
        ("reward: {cost_weights: [0, 100]}\nrecursion: {}\n", "cannot be combined with recursion"),
    ]:
        with pytest.raises(TrainConfigError) as caught:
            load_train_config_text(head + bad)
        assert said in str(caught.value)


# --------------------------------------------------------------------------- checkpoints


def test_a_checkpoint_trained_without_weights_refuses_one(
    tmp_path: Path, pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    plain = tmp_path / "plain"
    write_checkpoint_meta(plain, CheckpointMeta(max_steps=3))
    with pytest.raises(UsageError, match="trained without cost weights"):
        resolve_conductor(pool, str(plain), cost_weight=100.0)
    # Without --cost-weight it runs as it always has, with no weight in its prompt.
    assert resolve_conductor(pool, str(plain)).cost_weight is None

    conditioned = tmp_path / "conditioned"
    write_checkpoint_meta(conditioned, CheckpointMeta(cost_weights=WEIGHTS))
    assert read_checkpoint_meta(conditioned) == CheckpointMeta(cost_weights=WEIGHTS)
    assert resolve_conductor(pool, str(conditioned), cost_weight=150).cost_weight == 150.0
    assert check_cost_weight_against_meta(150.0, read_checkpoint_meta(conditioned)) == []
    (far,) = check_cost_weight_against_meta(900.0, read_checkpoint_meta(conditioned))
    assert "outside the weights it was trained on (0 to 400)" in far
    (unknown,) = check_cost_weight_against_meta(150.0, None)
    assert "no conductor.json" in unknown
    with pytest.raises(UsageError, match="finite number >= 0"):
        resolve_conductor(pool, None, cost_weight=float("nan"))


# --------------------------------------------------------------------------- the commands


def conductor_user_message(server: FakeLLMServer) -> str:
    (request,) = server.requests_for(CONDUCTOR_MODEL)
    return request.last_user_message


@pytest.fixture
def cli_pool(tmp_path: Path, fake_server: FakeLLMServer) -> Path:
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Compute 6 * 7"], [[]]))
    fake_server.script("w0", f"\\boxed{{{GOLD}}}")
    data = pool_dict(fake_server, [worker(fake_server, "w0", max_retries=0)])
    return write_pool(tmp_path / "cli-pool.yaml", data)


def test_ask_states_the_weight_to_the_conductor(
    tmp_path: Path, cli_pool: Path, fake_server: FakeLLMServer
) -> None:
    env = {"CONDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    res = invoke_cli("ask", "What is 6 * 7?", "--pool", str(cli_pool), "--cost-weight", "150",
                     "--json", env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert conductor_user_message(fake_server).rstrip().endswith(cost_weight_line(150))
    assert json.loads(res.stdout)["conductor"]["cost_weight"] == 150.0

    fake_server.reset()
    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Compute 6 * 7"], [[]]))
    fake_server.script("w0", f"\\boxed{{{GOLD}}}")
    res = invoke_cli("ask", "What is 6 * 7?", "--pool", str(cli_pool), "--no-cache", env=env)
    assert res.returncode == 0, res.stderr
    assert "Cost weight" not in conductor_user_message(fake_server)

    res = invoke_cli("ask", "q", "--pool", str(cli_pool), "--strategy", "single:w0",
                     "--cost-weight", "1", env=env)  # fmt: skip
    assert (
        res.returncode == 2 and "--cost-weight applies to --strategy conductor only" in res.stderr
    )


def test_bench_states_the_weight_and_keeps_it_for_resume(
    tmp_path: Path, cli_pool: Path, fake_server: FakeLLMServer, data_file: Path
) -> None:
    one = tmp_path / "one.jsonl"
    one.write_text(data_file.read_text().splitlines()[0] + "\n")
    out = tmp_path / "run"
    res = invoke_cli("bench", "math500", "--pool", str(cli_pool), "--data", str(one),
                     "--out", str(out), "--cost-weight", "400", "--no-cache")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert conductor_user_message(fake_server).rstrip().endswith(cost_weight_line(400))
    (config_file,) = out.rglob("config.json")
    assert json.loads(config_file.read_text())["invocation"]["cost_weight"] == 400.0


def test_serve_states_the_weight_to_the_conductor(
    tmp_path: Path, fake_server: FakeLLMServer
) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import httpx
    from kit.servekit import make_pool, served

    fake_server.script(CONDUCTOR_MODEL, lists([0], ["Answer it"], [[]]))
    fake_server.script("w0", "Paris")
    with served(make_pool(tmp_path, fake_server, n=1), cost_weight=200.0) as url:
        reply = httpx.post(
            f"{url}/chat/completions",
            json={"model": "conductor", "messages": [{"role": "user", "content": "Capital?"}]},
            timeout=60,
        )
    assert reply.status_code == 200, reply.text
    assert conductor_user_message(fake_server).rstrip().endswith(cost_weight_line(200))
