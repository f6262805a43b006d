"""``grpo.async_rollouts``: GRPO whose worker calls overlap the next generation and the
update (``conductor.train.pipeline``).

Real TRL trainers on a tiny Llama built here (tests/kit/tinymodels.py); the reward is a
plain TRL reward function standing in for the workers, which records the batches it is
asked to score and can hold a batch until the trainer starts generating the next one.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from kit.tinymodels import tiny_llama, tiny_tokenizer

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("trl")
pytest.importorskip("datasets")

# torch runs in this process here: a crash fails one test, not the run.
pytestmark = pytest.mark.isolated

QUESTIONS = [f"Q{i}: what is {i} + {i}?" for i in range(8)]
STEPS = 3


class Workers:
    """A reward function: records each batch's sample ids; with ``hold``, batch k's
    scoring waits (a bounded while) until batch k+1's generation has started, and
    records whether it saw that; with ``fail_at``, that call raises."""

    __name__ = "workers"

    def __init__(self, *, hold: bool = False, fail_at: int | None = None) -> None:
        self.batches: list[list[str]] = []
        self.saw_next: list[bool] = []
        self.hold = hold
        self.fail_at = fail_at
        self.generating: dict[int, threading.Event] = {}

    def on_event(self, event: Any) -> None:
        if event.what == "generate_start":
            self.generating.setdefault(event.batch, threading.Event()).set()

    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
        number = len(self.batches)
        self.batches.append(list(columns["sample_id"]))
        if number == self.fail_at:
            raise ValueError("the worker pool is on fire")
        if self.hold and number + 1 < STEPS:
            seen = self.generating.setdefault(number + 1, threading.Event()).wait(timeout=10)
            self.saw_next.append(seen)
        # Rewards that differ within a group, so that every step has a gradient.
        return [float(len(c) % 3) for c in completions]


def _trainer(tmp_path: Path, workers: Workers, *, pipelined: bool) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig

    from conductor.train.grpo import grpo_trainer_class
    from conductor.train.pipeline import PipelineLog, PrestartedReward, async_trainer_class

    tok = tiny_tokenizer([*QUESTIONS, "0 1 2 3 4 5 6 7 8 9 + ? :"], chat_template=False)
    model = tiny_llama(tok, seed=0)
    rows = [{"prompt": q, "sample_id": f"s{i}"} for i, q in enumerate(QUESTIONS)]
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        num_generations=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        max_steps=STEPS,
        max_completion_length=4,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        seed=7,
        data_seed=7,
    )
    kwargs: dict[str, Any] = {
        "model": model,
        "args": args,
        "train_dataset": Dataset.from_list(rows),
        "processing_class": tok,
    }
    if not pipelined:
        return grpo_trainer_class()(reward_funcs=[workers], **kwargs)
    rollouts = PrestartedReward(workers, PipelineLog(on_event=workers.on_event))
    return async_trainer_class()(
        reward_funcs=[rollouts], rollouts=rollouts, max_staleness=1, **kwargs
    )


def test_every_batch_is_trained_once_in_order_and_staleness_is_bounded(tmp_path: Path) -> None:
    sync, pipelined = Workers(), Workers()
    _trainer(tmp_path / "sync", sync, pipelined=False).train()
    trainer = _trainer(tmp_path / "async", pipelined, pipelined=True)
    trainer.train()
    trainer._rollouts.close()

    # The same batches as synchronous GRPO draws, each scored once, in the same order.
    assert len(sync.batches) == STEPS
    assert pipelined.batches == sync.batches
    log = trainer._rollouts.log
    trained = [(e.batch, e.step) for e in log.events if e.what == "trained"]
    assert trained == [(0, 0), (1, 1), (2, 2)]  # the last batch too: none dropped
    generated = [(e.batch, e.step) for e in log.events if e.what == "generate_start"]
    # Batch 0 and 1 by the step-0 policy, batch 2 by step 1's: one step stale each.
    assert generated == [(0, 0), (1, 0), (2, 1)]
    assert trainer._rollouts.in_flight == 0


def test_worker_calls_of_a_batch_overlap_the_next_generation(tmp_path: Path) -> None:
    workers = Workers(hold=True)
    trainer = _trainer(tmp_path, workers, pipelined=True)
    trainer.train()
    trainer._rollouts.close()

    # Batch k's scoring was still running when batch k+1 started generating.
    assert workers.saw_next == [True] * (STEPS - 1)
    events = trainer._rollouts.log.events
    order = {(e.what, e.batch): i for i, e in enumerate(events)}
    for k in range(STEPS - 1):
        assert order[("rollouts_start", k)] < order[("generate_start", k + 1)]
        assert order[("generate_start", k + 1)] < order[("rollouts_end", k)]
        assert order[("rollouts_end", k)] < order[("trained", k)]


def test_a_background_rollout_error_stops_training_with_it(tmp_path: Path) -> None:
    workers = Workers(fail_at=1)
    trainer = _trainer(tmp_path, workers, pipelined=True)
    with pytest.raises(ValueError, match="on fire"):
        trainer.train()
    trainer._rollouts.close()
    # Batch 1 failed in the background; the step that trains it raised, none after.
    assert [e.batch for e in trainer._rollouts.log.events if e.what == "trained"] == [0]


def test_async_rollouts_are_refused_where_they_cannot_be_right(tmp_path: Path) -> None:
    from dataclasses import replace

    from conductor.errors import UsageError
    from conductor.train.config import load_train_config_text
    from conductor.train.pipeline import check_async_rollouts
    from conductor.train.settings import RecursionSettings

    (tmp_path / "q.jsonl").write_text('{"question": "What is 1 + 1?", "answer": "2"}\n')
    config = load_train_config_text(
        "base_model: gguf:smollm2\npool: local\n"
        f"data: [{{benchmark: math500, file: {tmp_path / 'q.jsonl'}}}]\n"
        "output_dir: out\ngrpo: {async_rollouts: true, max_staleness: 2}\n"
    )
    assert config.grpo.async_rollouts and config.grpo.max_staleness == 2
    check_async_rollouts(config, 1)  # one process, no recursion: fine
    with pytest.raises(UsageError, match="one process; this launch has 2"):
        check_async_rollouts(config, 2)
    with pytest.raises(UsageError, match="recursion"):
        check_async_rollouts(replace(config, recursion=RecursionSettings()), 1)
    with pytest.raises(UsageError, match="use_vllm"):
        check_async_rollouts(replace(config, grpo=replace(config.grpo, use_vllm=True)), 1)
    with pytest.raises(UsageError, match="credit: counterfactual"):
        check_async_rollouts(replace(config, credit="counterfactual"), 1)
    # The default stays the paper's synchronous GRPO.
    off = replace(
        config, grpo=replace(config.grpo, async_rollouts=False), recursion=RecursionSettings()
    )
    check_async_rollouts(off, 4)
