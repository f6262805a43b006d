"""Training core (no TRL): config files, randomised pools, dataset rows, the reward
(executed against the fake server) and recursion rows."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.poolkit import lists, pool_dict, worker, write_pool

from conductor.conductors.spec import Conductor
from conductor.errors import TrainConfigError, UsageError
from conductor.execute import Orchestrator
from conductor.pool import Pool, load_pool
from conductor.targets import Worker
from conductor.testing import FakeLLMServer, FakeRequest, Fault, Reply
from conductor.train.config import load_train_config, load_train_config_text
from conductor.train.dataset import build_rows
from conductor.train.pools import (
    map_back,
    sample_subpool,
    subpool_from_ids,
    training_conductor,
)
from conductor.train.recursion import first_round, revision_messages
from conductor.train.reward import WorkflowReward
from conductor.train.settings import (
    DataMix,
    PoolSampling,
    RecursionSettings,
    RewardSettings,
    TrainConfig,
)
from conductor.workflow import Step, Workflow

REPO = Path(__file__).resolve().parent.parent
GOLD = "42"


def answering(request: FakeRequest) -> str | Reply:
    """Workers answer right when their subtask says "right", else wrong."""
    task = request.last_user_message.rsplit("\n", 1)[-1]
    if "slow" in task:
        return Reply(f"\\boxed{{{GOLD}}}", latency_s=0.3)
    return f"\\boxed{{{GOLD}}}" if "right" in task else "\\boxed{7}"


@pytest.fixture
def pool(tmp_path: Path, fake_server: FakeLLMServer) -> Pool:
    workers = [
        worker(
            fake_server,
            f"w{i}",
            max_retries=0,
            price={"input_per_mtok": 1000.0, "output_per_mtok": 2000.0},
        )
        for i in range(4)
    ]
    for i in range(4):
        fake_server.script(f"w{i}", answering)
    data = pool_dict(fake_server, workers)
    del data["conductor"]  # training pools need no Conductor section
    return load_pool(write_pool(tmp_path / "pool.yaml", data))


@pytest.fixture
def conductor() -> Conductor:
    return Conductor(backend="prompted", target=Worker(id="conductor", model="policy"), max_steps=4)


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "items.jsonl"
    rows = [
        {"problem": f"What is 6 * 7? (variant {i})", "answer": GOLD, "unique_id": f"q{i}"}
        for i in range(6)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_config(pool: Pool, data_file: Path, **extra: Any) -> TrainConfig:
    return TrainConfig(
        base_model="gguf:smollm2",
        pool=str(pool.path),
        data=(DataMix(benchmark="math500", file=str(data_file)),),
        output_dir="unused",
        max_steps=4,
        **extra,
    )


@pytest.fixture
def reward_factory(pool: Pool, conductor: Conductor) -> Iterator[Any]:
    made: list[WorkflowReward] = []

    def make(settings: RewardSettings | None = None, **kwargs: Any) -> WorkflowReward:
        reward = WorkflowReward(pool, conductor, settings or RewardSettings(), **kwargs)
        made.append(reward)
        return reward

    yield make
    for reward in made:
        reward.close()


def columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Dataset rows as the column lists TRL passes to a reward function."""
    return {key: [row[key] for row in rows] for key in rows[0]}


# --------------------------------------------------------------------------- the reward


@pytest.mark.process
def test_reward_levels_and_conversational_completions(
    pool: Pool, conductor: Conductor, data_file: Path, reward_factory: Any
) -> None:
    rows = build_rows(make_config(pool, data_file), pool, conductor, rng_seed=0)[:1] * 4
    completions: list[Any] = [
        "I would ask Model 1, but I forgot the lists.",
        lists([1], ["Compute it; you will get it wrong"], [[]]),
        lists([0, 2], ["Compute it right", "Check the answer, say it right"], [[], ["all"]]),
        [{"role": "assistant", "content": lists([3], ["Compute it right"], [[]])}],
    ]
    reward = reward_factory()
    scores = reward(prompts=[r["prompt"] for r in rows], completions=completions, **columns(rows))
    assert scores == [0.0, 0.5, 1.0, 1.0]
    first, wrong, right, chat = reward.last_batch
    assert (first.parsed, first.correct, first.calls, first.steps) == (False, None, 0, 0)
    assert (wrong.parsed, wrong.correct, wrong.workers) == (True, False, ["w1"])
    assert (right.correct, right.steps, right.calls, right.workers) == (True, 2, 2, ["w0", "w2"])
    assert chat.workers == ["w3"] and chat.record is not None
    assert chat.record.final_answer == f"\\boxed{{{GOLD}}}"


@pytest.mark.process
def test_format_bonus_cost_penalties_and_failed_runs(
    pool: Pool,
    conductor: Conductor,
    data_file: Path,
    fake_server: FakeLLMServer,
    reward_factory: Any,
) -> None:
    settings = RewardSettings(
        format_bonus=0.25,
        cost_penalty_per_call=0.1,
        cost_penalty_per_usd=2.0,
        failed_run=-0.3,
    )
    fake_server.script("w3", Fault(400, "bad request"))
    rows = build_rows(make_config(pool, data_file), pool, conductor, rng_seed=0)[:1] * 4
    completions = [
        "no lists at all",
        lists([0, 1], ["Say it right", "Repeat it right"], [[], ["all"]]),
        lists([1], ["Get it wrong"], [[]]),
        lists([3], ["Say it right"], [[]]),  # the only worker fails: no answer
    ]
    reward = reward_factory(settings)
    scores = reward(prompts=[r["prompt"] for r in rows], completions=completions, **columns(rows))
    unparsed, right, wrong, failed = reward.last_batch
    assert scores[0] == 0.0 and unparsed.calls == 0
    assert right.calls == 2 and right.cost_usd > 0
    assert right.record is not None
    step_cost = sum(s.call.cost_usd or 0 for s in right.record.rounds[0].steps)
    assert right.cost_usd == pytest.approx(step_cost)
    assert scores[1] == pytest.approx(1.0 + 0.25 - 0.1 * 2 - 2.0 * right.cost_usd)
    assert scores[2] == pytest.approx(0.5 + 0.25 - 0.1 - 2.0 * wrong.cost_usd)
    # A parsed workflow that gave no answer scores failed_run, with no bonus or penalty.
    assert scores[3] == pytest.approx(-0.3)
    assert failed.parsed and failed.correct is None and failed.calls == 1


@pytest.mark.process
def test_rollouts_run_concurrently(
    pool: Pool,
    conductor: Conductor,
    data_file: Path,
    reward_factory: Any,
    fake_server: FakeLLMServer,
) -> None:
    rows = build_rows(make_config(pool, data_file), pool, conductor, rng_seed=0)
    rows = [rows[i % len(rows)] for i in range(16)]
    completions = [lists([i % 4], [f"Be slow {i}"], [[]]) for i in range(16)]
    reward = reward_factory(concurrency=16)
    t0 = time.perf_counter()
    scores = reward(prompts=[r["prompt"] for r in rows], completions=completions, **columns(rows))
    elapsed = time.perf_counter() - t0
    assert scores == [1.0] * 16
    # 16 workflows of one 0.3 s call each: at once, not one after another.  Overlap,
    # not speed: most requests reached the server before the first of them could have
    # been answered (one after another, only the first would have).
    arrivals = sorted(r.received_at for r in fake_server.requests)
    assert len(arrivals) == 16
    assert sum(a - arrivals[0] < 0.3 for a in arrivals) >= 8, arrivals
    assert elapsed >= 0.3
    # The loop persists: a second batch on the same reward object works too.
    again = reward(
        prompts=[r["prompt"] for r in rows[:2]], completions=completions[:2], **columns(rows[:2])
    )
    assert again == [1.0, 1.0]


def test_missing_columns_are_a_usage_error(reward_factory: Any) -> None:
    reward = reward_factory()
    with pytest.raises(UsageError, match="sample_id"):
        reward(prompts=["p"], completions=["c"], question=["q"])


# --------------------------------------------------------------------------- randomised pools


def test_sample_subpool_and_map_back(pool: Pool) -> None:
    rng = random.Random(3)
    sizes = set()
    for _ in range(50):
        sub = sample_subpool(pool, rng, 2, 3)
        k = len(sub.pool.workers)
        sizes.add(k)
        assert 2 <= k <= 3
        assert len(set(sub.original_index)) == k
        for i, w in enumerate(sub.pool.workers):
            assert pool.workers[sub.original_index[i]] is w
    assert sizes == {2, 3}
    sub = subpool_from_ids(pool, ["w2", "w0"])
    flow = Workflow((Step(0, "a"), Step(1, "b", "all")))
    assert map_back(flow, sub) == Workflow((Step(2, "a"), Step(0, "b", "all")))
    with pytest.raises(UsageError):
        map_back(Workflow((Step(2, "c"),)), sub)
    with pytest.raises(UsageError):
        sample_subpool(pool, rng, 5, 6)


@pytest.mark.process
def test_randomised_rows_list_only_sampled_workers_and_map_back(
    pool: Pool,
    conductor: Conductor,
    data_file: Path,
    fake_server: FakeLLMServer,
    reward_factory: Any,
) -> None:
    config = make_config(pool, data_file, randomise_pool=PoolSampling(1, 2))
    rows = build_rows(config, pool, conductor, rng_seed=11)
    assert rows == build_rows(config, pool, conductor, rng_seed=11)  # deterministic
    for row in rows:
        k = len(row["worker_ids"])
        text = row["prompt"][0]["content"]
        assert 1 <= k <= 2
        assert all(f"Model {i}" in text for i in range(k))
        assert f"Model {k}" not in text
    # Find a row whose "Model 0" is not the full pool's worker 0.
    row = next(r for r in rows if r["worker_ids"][0] != "w0")
    target = row["worker_ids"][0]
    reward = reward_factory()
    scores = reward(
        prompts=[row["prompt"]],
        completions=[lists([0], ["Say it right"], [[]])],
        **columns([row]),
    )
    assert scores == [1.0]
    assert reward.last_batch[0].workers == [target]
    called = {r.model for r in fake_server.requests}
    assert called == {target}
    # Model k (outside the sub-pool) does not parse: unparsed.
    k = len(row["worker_ids"])
    assert reward(
        prompts=[row["prompt"]], completions=[lists([k], ["x"], [[]])], **columns([row])
    ) == [0.0]


@pytest.mark.process
def test_training_honours_the_pools_subtask_choices(
    tmp_path: Path, fake_server: FakeLLMServer, data_file: Path
) -> None:
    """A pool whose Conductor chooses among `conductor.subtasks` (the `choose` template)
    trains as ask/bench run it: the prompts list the choices, and a rollout that writes
    another instruction is unparsed, as the grammar would not have let it be written."""
    import dataclasses

    choices = ["Compute it right", "Compute it; you will get it wrong"]
    workers = [worker(fake_server, f"w{i}", max_retries=0) for i in range(2)]
    for i in range(2):
        fake_server.script(f"w{i}", answering)
    data = pool_dict(fake_server, workers, template="choose", constrained=True, subtasks=choices)
    pool = load_pool(write_pool(tmp_path / "choose.yaml", data))
    config = make_config(pool, data_file, template="choose")
    conductor = training_conductor(config, pool)
    assert conductor.subtasks == tuple(choices)
    # The stand-in Conductor (a section that does not resolve here) keeps them too.
    assert pool.conductor is not None
    unresolved = dataclasses.replace(
        pool, conductor=dataclasses.replace(pool.conductor, backend="checkpoint")
    )
    assert training_conductor(config, unresolved).subtasks == tuple(choices)

    rows = build_rows(config, pool, conductor, rng_seed=0)[:1] * 3
    listed = '- "Compute it right"\n- "Compute it; you will get it wrong"'
    assert listed in rows[0]["prompt"][0]["content"]
    reward = WorkflowReward(pool, conductor, RewardSettings())
    try:
        scores = reward(
            prompts=[r["prompt"] for r in rows],
            completions=[
                lists([0], ["Compute it right"], [[]]),
                lists([1], [" Compute it; you will get it wrong "], [[]]),
                lists([0], ["Compute it right, then say it right"], [[]]),
            ],
            **columns(rows),
        )
        assert scores == [1.0, 0.5, 0.0]
        off = reward.last_batch[2]
        assert not off.parsed and off.record is not None
        assert "is not one of the instructions" in off.record.rounds[0].parse_errors[0]
        # The revision round lists the same choices.
        first = reward.last_batch[0].record
        assert first is not None
        revise = revision_messages(first, pool.workers, conductor)
        assert listed in revise[-1]["content"]
    finally:
        reward.close()


# --------------------------------------------------------------------------- recursion


@pytest.mark.process
def test_rows_with_a_given_first_round_score_the_revision_alone(
    pool: Pool,
    conductor: Conductor,
    data_file: Path,
    reward_factory: Any,
) -> None:
    """A row that carries a first round (build_rows(first_rounds=...)) is continued by its
    completion and scored on that revision alone: a first-round reward fixed across the
    group would be cancelled by GRPO's normalisation anyway.  (Recursion training itself
    samples both rounds on-policy: tests/test_train_recursion.py.)"""
    config = make_config(
        pool,
        data_file,
        randomise_pool=PoolSampling(2, 3),
        recursion=RecursionSettings(fraction=0.5, discount=0.25),
    )
    plain = build_rows(config, pool, conductor, rng_seed=5)

    async def first_rounds() -> dict[str, Any]:
        out = {}
        for row in plain:
            sub = subpool_from_ids(pool, row["worker_ids"])
            orch = Orchestrator(sub.pool, conductor)
            try:
                out[row["sample_id"]] = await first_round(
                    orch, row["question"], plan=lists([1], ["First try, get it wrong"], [[]])
                )
            finally:
                await orch.aclose()
        return out

    records = asyncio.run(first_rounds())
    rows = build_rows(config, pool, conductor, rng_seed=5, first_rounds=records)
    revised = [r for r in rows if r["round1"]]
    assert len(revised) == 3  # half of six
    row = revised[0]
    record = records[row["sample_id"]]
    # Round 1 ran on the sub-pool the row lists; its prompt shows the first plan and answer.
    assert row["worker_ids"] == [w["id"] for w in record.pool["workers"]]
    text = row["prompt"][0]["content"]
    assert "model_id = [1]" in text and "First try, get it wrong" in text
    assert "\\boxed{7}" in text
    assert row["round1_reward"] == 0.5
    assert row["prompt"] == revision_messages(
        record, subpool_from_ids(pool, row["worker_ids"]).pool.workers, conductor
    )

    reward = reward_factory()
    batch = [row, row, row]
    scores = reward(
        prompts=[r["prompt"] for r in batch],
        completions=[
            lists([0], ["Fix it, say it right"], [[]]),
            lists([], [], []),  # keep the (wrong) first answer
            "unparseable",
        ],
        **columns(batch),
    )
    assert scores == [1.0, 0.5, 0.0]
    fixed = reward.last_batch[0]
    assert (fixed.round, fixed.round_reward) == (2, 1.0)
    assert fixed.record is not None and len(fixed.record.rounds) == 2
    assert fixed.workers == [row["worker_ids"][0]] and fixed.calls == 1
    # The executor's round-2 prompt is exactly the row's prompt.
    assert fixed.record.rounds[1].conductor_calls[0].messages == row["prompt"]


# --------------------------------------------------------------------------- config files


def test_every_shipped_config_loads() -> None:
    paths = sorted((REPO / "configs" / "train").glob("*.yaml"))
    assert {p.stem for p in paths} >= {"paper", "recursion", "tiny-cpu"}
    configs = {p.stem: load_train_config(p) for p in paths}
    paper = configs["paper"]
    assert paper.base_model == "Qwen/Qwen2.5-7B-Instruct"
    assert (paper.grpo.group_size, paper.grpo.questions_per_step, paper.grpo.steps) == (64, 4, 200)
    assert paper.grpo.learning_rate == 1e-6 and paper.grpo.lr_scheduler == "cosine"
    assert (paper.grpo.kl_beta, paper.grpo.clip_epsilon, paper.grpo.temperature) == (0, 0.2, 1)
    assert paper.grpo.use_vllm and paper.grpo.vllm_mode == "colocate" and paper.grpo.bf16
    assert paper.reward == RewardSettings()
    assert {m.benchmark for m in paper.data} == {"math500", "mmlu", "rlpr-paper", "livecodebench"}
    assert sum(m.limit or 0 for m in paper.data) == 960
    rec = configs["recursion"]
    assert rec.recursion == RecursionSettings(fraction=1.0, discount=0.2)
    assert paper.template == rec.template == "paper"
    assert rec.grpo.steps == 20
    tiny = configs["tiny-cpu"]
    assert tiny.base_model == "gguf:smollm2" and tiny.pool.endswith("local.yaml")
    (mix,) = tiny.data
    assert mix.file is not None and Path(mix.file).is_file()
    # It runs with no network, where MATH-500's evaluation split is not cached.
    assert tiny.accept_unchecked_holdout and not paper.accept_unchecked_holdout
    # The raw 135M model writes no workflow: its first run warm-starts the format; the
    # paper's 7B policy does not need one (the authors gave none).
    assert tiny.warm_start is not None and paper.warm_start is None and rec.warm_start is None


@pytest.mark.process
def test_tiny_cpu_data_builds_rows() -> None:
    config = load_train_config(REPO / "configs" / "train" / "tiny-cpu.yaml")
    from conductor.train.pools import load_train_pool, training_conductor

    pool = load_train_pool(config)
    assert all(w.params["max_tokens"] == config.worker_max_tokens for w in pool.workers)
    rows = build_rows(config, pool, training_conductor(config, pool), rng_seed=0)
    assert len(rows) == 30
    assert all(json.loads(r["gold"]) for r in rows)


@pytest.mark.parametrize(
    ("body", "line", "needle"),
    [
        ("grpo:\n  group_sise: 8\n", 6, 'did you mean "group_size"'),
        ("grpo:\n  learning_rate: -1\n", 6, "grpo.learning_rate must be a number > 0"),
        ("randomise_pool: {k_min: 4, k_max: 2}\n", 5, "k_min (4) is larger"),
        ("recursion:\n  discount: 1.5\n", 6, "between 0 and 1"),
        ("reward:\n  corect: 1\n", 6, 'did you mean "correct"'),
        ("grpo:\n  vllm_mode: colocated\n", 6, 'did you mean "colocate"'),
        ("grpo:\n  max_staleness: 0\n", 6, "grpo.max_staleness must be"),
        ("grpo:\n  async_rollouts: often\n", 6, "grpo.async_rollouts"),
    ],
)
def test_bad_config_names_file_line_and_field(
    tmp_path: Path, data_file: Path, body: str, line: int, needle: str
) -> None:
    text = (
        "base_model: gguf:smollm2\n"
        "pool: local\n"
        f"data: [{{benchmark: math500, file: {data_file}}}]\n"
        "output_dir: out\n" + body
    )
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(TrainConfigError) as info:
        load_train_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert needle in message


def test_config_required_keys_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(TrainConfigError, match='missing required key "data"'):
        load_train_config_text("base_model: x/y\npool: local\noutput_dir: o\n", source="c.yaml")
    with pytest.raises(TrainConfigError, match=r"c.yaml:3: data\[0\].file: no such file"):
        load_train_config_text(
            "base_model: x/y\npool: local\ndata: [{benchmark: math500, file: nope.jsonl}]\n"
            "output_dir: o\n",
            source="c.yaml",
            path=tmp_path / "c.yaml",
        )
    with pytest.raises(TrainConfigError, match="c.yaml:2: pool"):
        load_train_config_text(
            "base_model: x/y\npool: no-such-pool\ndata: [math500]\noutput_dir: o\n",
            source="c.yaml",
        )


# ------------------------------------------------------------------ TRL versions


@pytest.mark.parametrize("version", ["1.14.1", "1.14.2", "1.15.0", "1.16.0"])
def test_supported_trl_versions_pass(version: str, caplog: pytest.LogCaptureFixture) -> None:
    from conductor.train.grpo import check_trl_version

    with caplog.at_level("WARNING", logger="conductor"):
        check_trl_version(version, recursion=True)
        check_trl_version(version, recursion=False)
    assert caplog.records == []


@pytest.mark.parametrize(
    "version", ["1.0.0", "1.8.0", "1.9.2", "1.10.0", "1.14.0", "1.17.0", "2.0"]
)
def test_other_trl_versions_stop_recursion_and_warn_plain_grpo(
    version: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Recursion wraps GRPOTrainer methods whose shape or meaning differs outside the
    range (1.10-1.14.0 would sample revisions from the wrong prompts under vLLM's
    server); plain GRPO's one hook does not, so it only warns."""
    from conductor.errors import MissingDependencyError
    from conductor.train.grpo import SUPPORTED_TRL, check_trl_version

    with pytest.raises(MissingDependencyError) as info:
        check_trl_version(version, recursion=True)
    assert f"trl {version} is installed" in str(info.value)
    assert f"trl{SUPPORTED_TRL}" in str(info.value) and "pip install" in str(info.value)
    with caplog.at_level("WARNING", logger="conductor"):
        check_trl_version(version, recursion=False)
    (warning,) = caplog.records
    assert f"trl {version}" in warning.getMessage() and SUPPORTED_TRL in warning.getMessage()


def test_the_train_extra_pins_the_supported_trl() -> None:
    tomllib = pytest.importorskip("tomllib")
    from conductor.train.grpo import SUPPORTED_TRL

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"trl{SUPPORTED_TRL}" in project["optional-dependencies"]["train"]
