"""``conductor train`` end to end on the CPU: GRPO steps, metrics, checkpoint, CLI.

The policy is built in the test (a 2-layer Llama with a byte-level BPE tokenizer, from
tests/kit/tinymodels.py), first taught by a few supervised steps to write one of two
workflows, so that sampled completions parse and earn different rewards: one routes
to the worker that knows the answer (reward 1), the other to one that does not (0.5).
Workers are served by the fake LLM server; nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.poolkit import CONDUCTOR_MODEL, pool_dict, worker, write_pool
from kit.tinymodels import overfit, tiny_llama, tiny_tokenizer

from conductor.testing import FakeLLMServer

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("trl")
pytest.importorskip("datasets")

# torch runs in this process here: a crash fails one test, not the run.
pytestmark = pytest.mark.isolated

TEMPLATE = "Models:\n${workers}\nAt most ${max_steps} steps.\nQ: ${question}\n"
GOOD = 'model_id = [0]\nsubtasks = ["Solve it"]\naccess_list = [[]]'
BAD = 'model_id = [1]\nsubtasks = ["Solve it"]\naccess_list = [[]]'
QUESTIONS = [("q1", "What is 2 + 2?", "4"), ("q2", "What is 3 + 4?", "7")]


def _tokenizer() -> Any:
    corpus = [
        GOOD,
        BAD,
        TEMPLATE,
        "Models: - Model 0 - Model 1 At most steps. Q: What is 2 + 2? 3 + 4? End with ANSWER:",
        "user assistant 0 1 2 3 4 5 6 7 8 9 [ ] \" ' , . : = + ?",
    ]
    return tiny_tokenizer(corpus)


def _policy_dir(directory: Path, prompts: list[list[dict[str, str]]]) -> Path:
    """A tiny model that, given any of ``prompts``, writes GOOD or BAD about equally often."""
    tok = _tokenizer()
    model = tiny_llama(tok, seed=0, max_positions=512)
    examples = []
    for messages in prompts:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        examples += [(text, GOOD), (text, BAD)]
    # Both replies learnt: what is left is the coin flip at the differing token.
    overfit(model, tok, examples, steps=300, stop_below=0.08)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(directory)
    model.save_pretrained(directory)
    return directory


def _setup(tmp_path: Path, server: FakeLLMServer, *, steps: int = 2) -> Path:
    """Pool, benchmark, template, policy and training config in ``tmp_path``; the config."""
    from conductor.conductors.prompt import build_conductor_messages
    from conductor.pool import load_pool

    golds = {q: a for _, q, a in QUESTIONS}

    def knows(request: Any) -> str:
        text = request.last_user_message
        gold = next((a for q, a in golds.items() if q in text), "0")
        return f"ANSWER: {gold}"

    server.script("solver", knows)
    server.script("guesser", "ANSWER: 11")
    pool_file = write_pool(
        tmp_path / "pool.yaml",
        pool_dict(server, [worker(server, "solver"), worker(server, "guesser")]),
    )
    data = tmp_path / "questions.jsonl"
    data.write_text(
        "".join(json.dumps({"id": i, "question": q, "answer": a}) + "\n" for i, q, a in QUESTIONS)
    )
    # Evaluation questions apart from the training ones: the contamination guard
    # refuses a training set that holds its own benchmark's evaluation questions.
    (tmp_path / "eval.jsonl").write_text(json.dumps({"question": "What is 5 + 5?", "answer": "10"}))
    (tmp_path / "arith.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "arith",
                "source": {"file": "eval.jsonl"},
                "train_source": {"file": "questions.jsonl"},
                "fields": {"loader": "math", "question": "question", "answer": "answer"},
                "prompt": "${question}",
                "answer_format": "math",
                "grader": "math",
            }
        )
    )
    (tmp_path / "tiny.txt").write_text(TEMPLATE)
    pool = load_pool(pool_file)
    prompts = [
        build_conductor_messages(q, pool.workers, max_steps=2, template=str(tmp_path / "tiny.txt"))
        for _, q, _ in QUESTIONS
    ]
    policy = _policy_dir(tmp_path / "policy", prompts)
    config = {
        "base_model": str(policy),
        "pool": "pool.yaml",
        "data": [{"benchmark": "arith.yaml"}],
        "output_dir": str(tmp_path / "run"),
        "max_steps": 2,
        "template": "tiny.txt",
        "seed": 3,
        "grpo": {
            "group_size": 4,
            "questions_per_step": 2,
            "learning_rate": 1e-4,
            "lr_scheduler": "constant",
            "warmup_ratio": 0.0,
            "temperature": 1.0,
            "max_completion_tokens": 24,
            "steps": steps,
        },
    }
    file = tmp_path / "train.yaml"
    file.write_text(yaml.safe_dump(config, sort_keys=False))
    return file


def _weights(directory: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_grpo_steps_train_log_and_save(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    from conductor.conductors.checkpoint import read_checkpoint_meta
    from conductor.conductors.spec import resolve_conductor
    from conductor.pool import load_pool
    from conductor.train.config import load_train_config
    from conductor.train.metrics import METRIC_KEYS, read_metrics
    from conductor.train.trainer import train

    config = load_train_config(_setup(tmp_path, fake_server))
    before = _weights(Path(config.base_model))
    seen: list[dict[str, Any]] = []
    checkpoint = train(config, on_metrics=seen.append)

    # The weights moved: the reward differed within groups, so GRPO had a gradient.
    after = _weights(checkpoint)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "no parameter changed after two GRPO steps"

    # One metrics line per step, with every key; rollouts really ran on the fake pool.
    rows = read_metrics(Path(config.output_dir) / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows == seen
    for row in rows:
        assert set(METRIC_KEYS) <= set(row)
        assert row["rollouts"] == 8  # 2 questions x group of 4
        assert 0.0 <= row["reward_mean"] <= 1.0
        assert row["parse_rate"] is not None and row["parse_rate"] > 0
        assert row["learning_rate"] is not None and row["elapsed_s"] >= 0
        assert set(row["worker_usage"]) <= {"solver", "guesser"}
    assert sum(sum(r["last_worker_usage"].values()) for r in rows) > 0
    assert fake_server.requests_for("solver") or fake_server.requests_for("guesser")

    # conductor.json records what the checkpoint was trained with.
    meta = read_checkpoint_meta(checkpoint)
    assert meta is not None and meta.format_version == 1
    assert meta.pool_order == ("solver", "guesser")
    assert meta.max_steps == 2
    assert meta.base_model == config.base_model
    assert meta.template == "prompt.txt"
    assert (checkpoint / "prompt.txt").read_text() == TEMPLATE

    # --conductor PATH resolves it with its own template and step limit, and it runs.
    pool = load_pool(tmp_path / "pool.yaml")
    cond = resolve_conductor(pool, str(checkpoint))
    assert cond.backend == "checkpoint"
    assert cond.max_steps == 2
    assert Path(cond.template).read_text() == TEMPLATE
    _generate_with_checkpoint_backend(cond.target, pool, cond.template)


def _generate_with_checkpoint_backend(target: Any, pool: Any, template: str) -> None:
    import asyncio

    from conductor.conductors.prompt import build_conductor_messages
    from conductor.llm import checkpoint_client as cc
    from conductor.llm.types import ModelRequest
    from conductor.workflow import parse_workflow

    messages = build_conductor_messages(
        QUESTIONS[0][1], pool.workers, max_steps=2, template=template
    )
    client = cc.CheckpointClient(target)
    try:
        out = asyncio.run(
            client.send(
                ModelRequest(
                    messages=tuple(messages),
                    params={"max_tokens": 24, "temperature": 0, "dtype": "float32"},
                ),
                timeout_s=120,
            )
        )
    finally:
        cc.unload_all()
    # Greedy decoding of the trained policy gives one of the two workflows it knows.
    workflow = parse_workflow(out.text, n_workers=2, max_steps=2)
    assert [s.worker for s in workflow.steps] in ([0], [1])


def test_cli_train_reports_bad_config(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from conductor.cli import app

    bad = tmp_path / "train.yaml"
    bad.write_text("base_model: x\npool: local\ndata: []\noutput_dir: out\ngrpo: {group_sise: 4}\n")
    result = CliRunner().invoke(app, ["train", str(bad)])
    assert result.exit_code != 0
    assert isinstance(result.exception, Exception)
    assert str(bad) in str(result.exception)


def test_grpo_config_batches(tmp_path: Path) -> None:
    """One optimizer step = questions_per_step x group_size completions, grouped by prompt."""
    import dataclasses

    from conductor.errors import UsageError
    from conductor.train.settings import DataMix, GRPOSettings, TrainConfig
    from conductor.train.trainer import build_grpo_config

    config = TrainConfig(
        base_model="x",
        pool="local",
        data=(DataMix(benchmark="math500"),),
        output_dir=str(tmp_path),
        grpo=GRPOSettings(
            group_size=8,
            questions_per_step=4,
            gradient_accumulation_steps=2,
            kl_beta=0.01,
            clip_epsilon=0.3,
            max_completion_tokens=96,
            steps=7,
            learning_rate=3e-5,
            warmup_ratio=0.1,
            use_vllm=True,
        ),
    )
    args = build_grpo_config(config, output_dir=tmp_path)
    assert args.num_generations == 8
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 32
    assert args.generation_batch_size == 32
    assert args.max_steps == 7 and args.max_completion_length == 96
    assert args.beta == 0.01 and args.epsilon == 0.3 and args.learning_rate == 3e-5
    assert args.use_vllm is False  # no GPU here: falls back to transformers generation
    assert args.report_to in ([], "none", ["none"])

    odd = dataclasses.replace(
        config, grpo=dataclasses.replace(config.grpo, questions_per_step=3, group_size=3)
    )
    with pytest.raises(UsageError, match="split evenly"):
        build_grpo_config(odd, output_dir=tmp_path)


def test_metrics_log_and_table(tmp_path: Path) -> None:
    from rich.console import Console

    from conductor.train.metrics import MetricsLog, metrics_table, read_metrics, summarise_rollouts
    from conductor.train.reward import RolloutResult

    results = [
        RolloutResult(1.0, True, True, 2, ["a", "b"], 2, 0.01, None),
        RolloutResult(0.5, True, False, 1, ["a"], 1, 0.005, None),
        RolloutResult(0.0, False, None, 0, [], 0, 0.0, None),
        RolloutResult(0.5, True, False, 1, ["b"], 1, 0.0, None),
    ]
    summary = summarise_rollouts(results)
    assert summary["reward_mean"] == pytest.approx(0.5)
    assert summary["parse_rate"] == pytest.approx(0.75)
    assert summary["correct_rate"] == pytest.approx(0.25)
    assert summary["steps_per_workflow"] == pytest.approx(4 / 3)
    assert summary["worker_usage"] == {"a": 2, "b": 2}
    assert summary["last_worker_usage"] == {"a": 1, "b": 2}
    assert summary["calls_per_rollout"] == pytest.approx(1.0)
    assert summary["cost_usd"] == pytest.approx(0.015)

    path = tmp_path / "m" / "metrics.jsonl"
    with MetricsLog(path) as log:
        log.append({"step": 1, **summary, "loss": float("nan")})
        log.append({"step": 2, "reward_mean": 0.75})
        # Each line is on disk as soon as it is appended.
        assert len(read_metrics(path)) == 2
    rows = read_metrics(path)
    assert rows[0]["loss"] is None and rows[1]["parse_rate"] is None
    console = Console(record=True, width=160)
    console.print(metrics_table(rows))
    text = console.export_text()
    assert "0.750" in text and "a:1 b:2" in text


def test_cli_train_overrides_steps_and_output(tmp_path: Path, fake_server: FakeLLMServer) -> None:
    from typer.testing import CliRunner

    from conductor.cli import app

    config = _setup(tmp_path, fake_server, steps=5)
    out = tmp_path / "elsewhere"
    result = CliRunner().invoke(
        app, ["train", str(config), "--steps", "1", "--output", str(out), "--no-live"]
    )
    assert result.exit_code == 0, result.output
    assert f"checkpoint written to {out / 'checkpoint'}" in result.stdout
    assert str(out / "metrics.jsonl") in result.stdout
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["step"] == 1
    assert (out / "checkpoint" / "conductor.json").is_file()
    assert not (tmp_path / "run").exists()  # the config's own output_dir was overridden
    # The checkpoint records which questions it was trained on, for bench to count.
    from conductor.conductors.checkpoint import read_training_questions
    from conductor.datasets.questions import NORMALISATION, question_key

    trained = {question_key(q).full for _, q, _ in QUESTIONS}
    assert read_training_questions(out / "checkpoint") == (NORMALISATION, trained)


def test_recursion_step_samples_revisions_from_the_policy_in_the_same_step(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``recursion``, one GRPO step samples round 1 from the policy, executes it,
    builds each pair's round-2 prompt from that very completion's record, samples the
    revision from the same policy, and trains the revision's prompt and completion in
    the second row of the pair; no first round is written before training."""
    from transformers import AutoTokenizer

    import conductor.train.recursion as rec
    import conductor.train.trainer as tr
    from conductor.conductors.checkpoint import read_checkpoint_meta
    from conductor.train.config import load_train_config
    from conductor.train.metrics import read_metrics

    file = _setup(tmp_path, fake_server, steps=1)
    data = yaml.safe_load(file.read_text())
    data["recursion"] = {"fraction": 1.0}
    file.write_text(yaml.safe_dump(data, sort_keys=False))
    config = load_train_config(file)
    assert config.recursion is not None and config.recursion.discount == 0.2

    seen: list[tuple[list[str], dict[str, list[Any]], Any, list[Any]]] = []
    generated: list[Any] = []
    real_rollouts, real_trainer = rec.recursion_rollouts, tr.recursion_trainer

    def spy_rollouts(reward: Any, columns: Any, firsts: Any, **kwargs: Any) -> Any:
        asked: list[Any] = []
        generate = kwargs.pop("generate")

        def ask(prompts: Any) -> Any:
            texts = generate(prompts)
            asked.append((prompts, texts))
            return texts

        batch = real_rollouts(reward, columns, firsts, generate=ask, **kwargs)
        seen.append((list(firsts), dict(columns), batch, asked))
        return batch

    def spy_trainer(*args: Any, **kwargs: Any) -> Any:
        trainer = real_trainer(*args, **kwargs)
        inner = trainer._generate

        def wrapped(prompts: Any) -> Any:
            out = inner(prompts)
            generated.append(out)
            return out

        trainer._generate = wrapped
        return trainer

    monkeypatch.setattr(rec, "recursion_rollouts", spy_rollouts)
    monkeypatch.setattr(tr, "recursion_trainer", spy_trainer)
    torch.manual_seed(0)
    checkpoint = tr.train(config)

    assert len(seen) == 1 and len(generated) == 1  # one step, one generation batch
    firsts, columns, batch, asked = seen[0]
    assert all(columns["recursion"]) and not any(columns["round1"])  # nothing pre-written
    assert len(asked) == 1
    prompts, texts = asked[0]
    assert batch.revised, "no round-1 completion of the policy could be revised"
    tok = AutoTokenizer.from_pretrained(config.base_model)
    prompt_ids, completion_ids, _mask, completions, _lp, extra = generated[0][:6]
    assert extra["conductor_rollout"] is batch.results
    for k, j in enumerate(batch.revised):
        record = batch.results[j].record
        # The revision continued the round-1 rollout the policy wrote in this step...
        assert record.rounds[0].conductor_calls[0].response == firsts[j - 1]
        assert batch.results[j - 1].record.rounds[0].conductor_calls[0].response == firsts[j - 1]
        # ...from the round-2 prompt the executor records, with the sampled revision.
        assert record.rounds[1].conductor_calls[0].messages == prompts[k]
        assert record.rounds[1].conductor_calls[0].response == texts[k]
        # The row GRPO trains on holds that round-2 prompt and that revision.
        want = tok.apply_chat_template(prompts[k], add_generation_prompt=True, tokenize=False)
        assert tok.decode(prompt_ids[j]) == want
        assert tok.decode(completion_ids[j], skip_special_tokens=True) == texts[k]
        assert completions[j][0]["content"] == texts[k]
        r1 = batch.results[j - 1].round_reward
        r2 = batch.results[j].round_reward
        assert batch.results[j - 1].reward == pytest.approx(0.8 * r1 + 0.2 * r2)
        assert batch.results[j].reward == r2
    # Round-1 rows keep the question's own prompt.
    first_prompt = tok.apply_chat_template(
        [{"role": m["role"], "content": m["content"]} for m in columns["prompt"][0]],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert tok.decode(prompt_ids[0]) == first_prompt
    assert fake_server.requests_for(CONDUCTOR_MODEL) == []

    (line,) = read_metrics(Path(config.output_dir) / "metrics.jsonl")
    assert line["revisions"] == len(batch.revised)
    assert line["rollouts"] == sum(r.reward is not None for r in batch.results)
    meta = read_checkpoint_meta(checkpoint)
    assert meta is not None and meta.extra["recursion"] == {"fraction": 1.0, "discount": 0.2}


def test_a_prefill_template_trains_on_prompts_left_open(
    tmp_path: Path, fake_server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One GRPO step with a chat template whose reply begins with a prefill: every prompt
    the policy samples from ends inside the assistant turn, and the checkpoint keeps the
    template (prefill included) as it was trained."""
    import conductor.train.trainer as trainer_module
    from conductor.conductors.checkpoint import read_checkpoint_meta
    from conductor.train.config import load_train_config

    file = _setup(tmp_path, fake_server, steps=1)
    (tmp_path / "tiny-chat.yaml").write_text(
        "user: |-\n"
        + "".join(f"  {line}\n" for line in TEMPLATE.splitlines())
        + "prefill: 'model_id = ['\n"
    )
    config_data = yaml.safe_load(file.read_text())
    file.write_text(yaml.safe_dump({**config_data, "template": "tiny-chat.yaml"}))
    rendered: list[Any] = []
    real = trainer_module.policy_prompt

    def recording(tokenizer: Any, messages: Any, *, render: bool) -> Any:
        out = real(tokenizer, messages, render=render)
        rendered.append(out)
        return out

    monkeypatch.setattr(trainer_module, "policy_prompt", recording)
    checkpoint = trainer_module.train(load_train_config(file))
    assert rendered and all(isinstance(p, str) for p in rendered)
    assert all(p.endswith("<|assistant|>model_id = [") for p in rendered)
    meta = read_checkpoint_meta(checkpoint)
    assert meta is not None
    stored = json.loads((checkpoint / "conductor.json").read_text())["template"]
    assert isinstance(stored, dict) and stored["prefill"] == "model_id = ["
