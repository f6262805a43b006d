"""Two training processes take the step one process takes: ``conductor train`` under
``accelerate launch --multi_gpu --num_processes 2`` (gloo on this CPU machine) against a
plain one-process run of the same config, whose layout rule then gives twice the
gradient accumulation (8 completions a step: 2 processes x 1 micro-batch of 4, or 1
process x 2 micro-batches of 4).

Both runs see the same rows: TRL's sampler, seeded alike in every process, deals the
step's generation batch out in consecutive shares; the completions are sampled
row-seeded (:class:`conductor.train.grpo.RowSeededSampling`), so a row's completion does
not depend on which process drew it; the warm start deals its micro-batches out and sums
the gradients (:mod:`conductor.train.warmstart`).  The check: the warm start's first
batch and GRPO's first step have the same loss and gradient norm in both runs.

Tolerance: relative 1e-4.  Both runs compute in float32 (epsilon 1.2e-7); what differs
is the order of the sums (two micro-batches accumulated in one process against two
processes' gradients all-reduced, micro-batches of other rows after TRL's per-process
shuffle, prompts padded to another width), which moves a sum of a few thousand float32
terms by ~1e-6 relative at most.  A run that sampled or scored other completions,
or summed the processes' gradients as a mean, misses by percents or a factor of two.

The policy is a 2-layer Llama built here (tests/kit/tinymodels.py) taught to write one
of two workflows about equally often, so that rewards differ within a group and GRPO's
first step has a gradient; the workers are the fake LLM server's scripted models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.poolkit import pool_dict, worker, write_pool
from kit.tinymodels import overfit, tiny_llama, tiny_tokenizer

from conductor.testing import FakeLLMServer

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("accelerate")
pytest.importorskip("datasets")


TEMPLATE = "Models:\n${workers}\nAt most ${max_steps} steps.\nQ: ${question}\n"
GOOD = 'model_id = [0]\nsubtasks = ["Solve it"]\naccess_list = [[]]'
BAD = 'model_id = [1]\nsubtasks = ["Solve it"]\naccess_list = [[]]'
QUESTIONS = [("q1", "What is 2 + 2?", "4"), ("q2", "What is 3 + 4?", "7")]
RTOL = 1e-4


def _policy(directory: Path, prompts: list[list[dict[str, str]]]) -> None:
    """A tiny policy that writes GOOD or BAD about equally often after each prompt."""
    tok = tiny_tokenizer(
        [GOOD, BAD, TEMPLATE, "Models: - Model 0 - Model 1 At most steps. Q: What is 2 + 2? 3 + 4?"]
    )
    model = tiny_llama(tok, seed=0, max_positions=512)
    examples = []
    for messages in prompts:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        examples += [(text, GOOD), (text, BAD)]
    overfit(model, tok, examples, steps=200, stop_below=0.1)
    tok.save_pretrained(directory)
    model.save_pretrained(directory)


def _config(tmp_path: Path, server: FakeLLMServer) -> Path:
    from conductor.conductors.prompt import build_conductor_messages
    from conductor.pool import load_pool

    golds = dict((q, a) for _, q, a in QUESTIONS)
    server.script(
        "solver",
        lambda r: "ANSWER: " + next((a for q, a in golds.items() if q in r.last_user_message), "0"),
    )
    server.script("guesser", "ANSWER: 11")
    pool_file = write_pool(
        tmp_path / "pool.yaml",
        pool_dict(server, [worker(server, "solver"), worker(server, "guesser")]),
    )
    (tmp_path / "questions.jsonl").write_text(
        "".join(json.dumps({"id": i, "question": q, "answer": a}) + "\n" for i, q, a in QUESTIONS)
    )
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
    _policy(tmp_path / "policy", prompts)
    config = {
        "base_model": str(tmp_path / "policy"),
        "pool": "pool.yaml",
        "data": [{"benchmark": "arith.yaml"}],
        "output_dir": "run",  # each run gives its own --output
        "max_steps": 2,
        "template": "tiny.txt",
        "seed": 3,
        # 4 passes x 2 questions = one batch of 8: two micro-batches of 4.  A small rate:
        # the policy's coin flip between GOOD and BAD must survive it.
        "warm_start": {"passes": 4, "learning_rate": 1.0e-5, "batch_size": 8},
        "grpo": {
            "group_size": 4,
            "questions_per_step": 2,
            "learning_rate": 1e-4,
            "lr_scheduler": "constant",
            "warmup_ratio": 0.0,
            "temperature": 1.0,
            "max_completion_tokens": 24,
            "steps": 1,
        },
    }
    file = tmp_path / "train.yaml"
    file.write_text(yaml.safe_dump(config, sort_keys=False))
    return file


def _train(config: Path, output: Path, processes: int) -> dict[str, Any]:
    """Run ``conductor train`` on ``processes`` processes; its first warm-start batch and
    first GRPO step, with the launch's wall and CPU seconds."""
    train = ["-m", "conductor.cli", "train", str(config), "--output", str(output), "--no-live"]
    if processes == 1:
        command = [sys.executable, *train]
    else:
        # accelerate 1.16 starts several CPU processes only through mpirun
        # (``--cpu --num_processes 2`` without it starts one process, which then fails
        # "Default process group has not been initialized"); its torchrun launcher,
        # ``--multi_gpu``, on a machine without a GPU starts them with gloo.
        command = [
            str(Path(sys.executable).with_name("accelerate")),
            "launch",
            "--multi_gpu",
            "--num_processes",
            str(processes),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            "0",
            *train,
        ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    log = output.with_suffix(".log")
    started = time.monotonic()
    with log.open("w") as out:
        child = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        # wait4: this launch's CPU time and peak memory, its own processes included.
        _pid, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 0, log.read_text()[-4000:]
    warm = json.loads((output / "warm_start.json").read_text())
    assert warm["processes"] == processes
    line = json.loads((output / "metrics.jsonl").read_text().splitlines()[0])
    return {
        "warm_loss": warm["losses"][0],
        "warm_grad_norm": warm["grad_norms"][0],
        "loss": line["loss"],
        "grad_norm": line["grad_norm"],
        "reward_std": line["reward_std"],
        "wall_s": round(time.monotonic() - started, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mb": usage.ru_maxrss // 1024,
    }


@pytest.mark.slow
@pytest.mark.process
def test_two_processes_take_the_one_process_step(
    tmp_path: Path, fake_server: FakeLLMServer, cache_dir: Path
) -> None:
    config = _config(tmp_path, fake_server)
    one = _train(config, tmp_path / "one", 1)
    two = _train(config, tmp_path / "two", 2)
    print(json.dumps({"one_process": one, "two_processes": two}))
    # GRPO had something to learn from: rewards differed and the gradient is not zero.
    assert one["reward_std"] and one["grad_norm"] and one["warm_grad_norm"]
    for key in ("warm_loss", "warm_grad_norm", "loss", "grad_norm"):
        assert two[key] == pytest.approx(one[key], rel=RTOL, abs=1e-7), key


def test_row_seeded_sampling_draws_from_the_tempered_softmax_whatever_the_batch() -> None:
    """The sampler behind the equality: a row's pick depends on its seed alone (not on
    the rows beside it), and over many seeds follows softmax(scores / temperature)."""
    import torch

    from conductor.train.grpo import RowSeededSampling, row_seed

    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 0.0]])
    seeds = [row_seed(3, 0, 0, r) for r in range(2)]
    prompt = torch.zeros((2, 5), dtype=torch.long)
    both = RowSeededSampling(seeds, 0.5)(prompt, scores)
    alone = RowSeededSampling(seeds[1:], 0.5)(prompt[1:, :2], scores[1:])  # other padding
    assert torch.equal(both[1:], alone)
    assert (both == 0).sum(dim=-1).tolist() == [1, 1]  # one token left in each row

    draws = 4000
    picks = torch.stack(
        [
            RowSeededSampling([row_seed(3, 1, 0, r)], 0.5)(prompt[:1], scores[:1]).argmax(-1)
            for r in range(draws)
        ]
    ).flatten()
    observed = torch.bincount(picks, minlength=4).double() / draws
    expected = torch.softmax(scores[0].double() / 0.5, dim=-1)
    # Binomial spread at 4,000 draws is at most 0.008: 0.03 is 3.5 sigma of slack.
    assert torch.allclose(observed, expected, atol=0.03), (observed, expected)
